// When a failed request is sent again, and after how long: a fetch that wraps another.
//
// Only requests that are safe to repeat are retried: reads (GET), deletions (DELETE:
// deleting a deleted job succeeds again), writes that carry an Idempotency-Key (the
// server answers a replay with the first answer), a cancel (a repeated cancel answers
// the job as it is) and token registrations (re-registering a token is harmless). Only
// answers that ask for it are retried: 503 (UNAVAILABLE), 429 (RESOURCE_EXHAUSTED) and a
// 409 that carries `retry-after` (ABORTED: the user's other request holds a lock; an
// ALREADY_EXISTS 409 carries none and is final), and failures before any answer (a reset
// connection). The delay is the answer's `retry-after` header, else the RetryInfo in its
// body, else an exponential backoff with jitter; never past `maxAttempts` nor `deadline`
// (a delay that would end beyond it answers at once: a daily quota's "try tomorrow" is
// not slept through).

import { durationSeconds, retryAfterHeader } from "./errors.js";

export interface RetryPolicy {
  maxAttempts: number;
  /** Seconds for all attempts of one request, sleeps included. */
  deadline: number;
  initialBackoff: number;
  maxBackoff: number;
  multiplier: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  maxAttempts: 5,
  deadline: 30,
  initialBackoff: 0.1,
  maxBackoff: 2,
  multiplier: 2,
};

export const NO_RETRY: RetryPolicy = { ...DEFAULT_RETRY, maxAttempts: 1 };

/** Told of each retry before its sleep: the answer's status (0: no answer) and the delay. */
export type RetryHook = (status: number, delaySeconds: number, request: Request) => void;

export interface RetryOptions {
  policy?: RetryPolicy;
  fetch?: typeof fetch;
  onRetry?: RetryHook;
  /** For tests: the clock (ms), the sleep and the jitter. */
  now?: () => number;
  sleep?: (seconds: number, signal?: AbortSignal) => Promise<void>;
  random?: () => number;
}

/** The delay before retry number `retry` (1, 2, ...) when the server named none:
 * exponential, capped, drawn from its upper half so that clients spread out. */
export function backoff(policy: RetryPolicy, retry: number, random: () => number = Math.random) {
  const ceiling = Math.min(
    policy.maxBackoff,
    policy.initialBackoff * policy.multiplier ** (retry - 1),
  );
  return ceiling * (0.5 + random() / 2);
}

export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, seconds * 1000);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

const REPEATABLE_POSTS = [/:cancel$/, /^\/v1\/devices$/, /\/liveActivities$/];
// Removals whose repeat is 404 once an earlier attempt landed: a 404 after a retry is
// the thing gone, which is what was asked.
const GONE_WHEN_MISSING = [/^\/v1\/devices\/[^/]+$/, /\/liveActivities\/[^/]+$/];

export function safeToRetry(request: Request): boolean {
  if (["GET", "HEAD", "DELETE"].includes(request.method)) return true;
  if (request.headers.has("idempotency-key")) return true;
  const path = new URL(request.url).pathname;
  return request.method === "POST" && REPEATABLE_POSTS.some((p) => p.test(path));
}

export function retryableAnswer(response: Response): boolean {
  if (response.status === 503 || response.status === 429) return true;
  return response.status === 409 && response.headers.has("retry-after");
}

/** The delay an answer asks for: `retry-after`, else its body's RetryInfo. */
export async function askedDelay(response: Response): Promise<number | undefined> {
  const header = retryAfterHeader(response.headers.get("retry-after"));
  if (header !== undefined) return header;
  try {
    const body = (await response.clone().json()) as { details?: Array<Record<string, unknown>> };
    for (const detail of body.details ?? []) {
      if (detail["@type"] === "type.googleapis.com/google.rpc.RetryInfo") {
        return durationSeconds(detail.retryDelay);
      }
    }
  } catch {
    // Not a JSON google.rpc.Status: no RetryInfo.
  }
  return undefined;
}

function isAbort(error: unknown): boolean {
  return error instanceof Error && (error.name === "AbortError" || error.name === "TimeoutError");
}

/** A fetch that retries as this module says. */
export function retryingFetch(options: RetryOptions = {}): typeof fetch {
  const policy = options.policy ?? DEFAULT_RETRY;
  const base = options.fetch ?? globalThis.fetch;
  const now = options.now ?? Date.now;
  const pause = options.sleep ?? sleep;
  const random = options.random ?? Math.random;
  return async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    const safe = safeToRetry(request);
    const ends = now() + policy.deadline * 1000;
    const path = new URL(request.url).pathname;
    for (let attempt = 1; ; attempt++) {
      let response: Response | undefined;
      let failure: unknown;
      try {
        response = await base(request.clone());
      } catch (error) {
        if (isAbort(error)) throw error;
        failure = error;
      }
      if (
        response?.status === 404 &&
        attempt > 1 &&
        request.method === "DELETE" &&
        GONE_WHEN_MISSING.some((p) => p.test(path))
      ) {
        await response.body?.cancel();
        return new Response("{}", { status: 200, headers: { "content-type": "application/json" } });
      }
      if (response !== undefined && !retryableAnswer(response)) return response;
      const giveUp = () => {
        if (response !== undefined) return response;
        throw failure;
      };
      if (!safe || attempt >= policy.maxAttempts) return giveUp();
      const delay =
        (response !== undefined ? await askedDelay(response) : undefined) ??
        backoff(policy, attempt, random);
      if (now() + delay * 1000 >= ends) return giveUp();
      await response?.body?.cancel();
      options.onRetry?.(response?.status ?? 0, delay, request);
      await pause(delay, request.signal);
    }
  };
}
