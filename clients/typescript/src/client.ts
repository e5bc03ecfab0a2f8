// atelier's JSON edge for TypeScript: the generated, typed openapi-fetch client (`api`)
// and a thin layer over it for what a generated client cannot know: idempotency keys on
// writes, retries (src/retry.ts), typed errors (src/errors.ts), the NDJSON watch streams
// as async iterators that reconnect and resume, and the upload's three steps.

import createClient, { type Client } from "openapi-fetch";

import { AtelierError, durationSeconds, fromStatus, retryAfterHeader } from "./errors.js";
import type { paths } from "./generated/openapi.js";
import { ndjson } from "./ndjson.js";
import { randomKey, sha256Hex } from "./webcrypto.js";
import {
  backoff,
  DEFAULT_RETRY,
  retryingFetch,
  sleep,
  type RetryHook,
  type RetryPolicy,
} from "./retry.js";
import type {
  Asset,
  CreateUploadRequest,
  Job,
  Schemas,
  SubmitJobRequest,
  WatchedJob,
  WatchJobLine,
  WatchJobsLine,
} from "./types.js";

export type Token = string | (() => string);

export interface AtelierClientOptions {
  /** The edge, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** A bearer token, or a function asked before each request (for tokens refreshed
   * elsewhere). */
  token: Token;
  retry?: RetryPolicy;
  onRetry?: RetryHook;
  /** The fetch underneath (defaults to the global one). */
  fetch?: typeof fetch;
}

export interface WriteOptions {
  /** The write's idempotency key (sent as `Idempotency-Key`); a fresh UUID unless given.
   * Every retry sends the same one, so a retried write is the same write. */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface SubmitOptions extends WriteOptions {
  /** Seconds (at most 60) the answer may wait for the job to finish (`Prefer: wait=N`):
   * the job comes back settled, or as it is when the time ran out. */
  wait?: number;
}

export interface WaitOptions {
  /** How long the server waits at most, in seconds (0 to 60; the server's default 30). */
  timeoutSeconds?: number;
  signal?: AbortSignal;
}

/** The gRPC codes after which a watch reconnects; INTERNAL, CANCELLED and UNKNOWN only
 * without an ErrorInfo reason (a connection that died, not atelier's answer). */
export function reconnectable(error: AtelierError): boolean {
  if (error.code === "UNAVAILABLE" || error.code === "RESOURCE_EXHAUSTED") return true;
  return ["INTERNAL", "CANCELLED", "UNKNOWN"].includes(error.code) && error.reason === "";
}

function transportError(error: unknown): AtelierError {
  if (error instanceof AtelierError) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new AtelierError({ status: 0, code: "UNAVAILABLE", message });
}

function isAbort(error: unknown): boolean {
  return error instanceof Error && (error.name === "AbortError" || error.name === "TimeoutError");
}

function present<T>(value: T | undefined, what: string): T {
  if (value === undefined) {
    throw new AtelierError({ status: 200, code: "INTERNAL", message: `the answer has no ${what}` });
  }
  return value;
}

export class AtelierClient {
  /** The generated client: every route of gen/openapi.json, typed, with the token,
   * the retries and the base URL of this client. Use it for anything the helpers below
   * do not wrap; its errors are `{ error, response }`, not thrown. */
  readonly api: Client<paths>;
  private readonly policy: RetryPolicy;
  private readonly rawFetch: typeof fetch;

  constructor(options: AtelierClientOptions) {
    this.policy = options.retry ?? DEFAULT_RETRY;
    this.rawFetch = options.fetch ?? globalThis.fetch;
    const token = options.token;
    this.api = createClient<paths>({
      baseUrl: options.baseUrl.replace(/\/$/, ""),
      fetch: retryingFetch({
        policy: this.policy,
        fetch: this.rawFetch,
        ...(options.onRetry ? { onRetry: options.onRetry } : {}),
      }),
    });
    this.api.use({
      onRequest({ request }) {
        const value = typeof token === "function" ? token() : token;
        request.headers.set("authorization", `Bearer ${value}`);
        return request;
      },
    });
  }

  // -- jobs -----------------------------------------------------------------------------

  /** SubmitJob with an idempotency key (the body's `requestId` when it has one). */
  async submitJob(body: SubmitJobRequest, options: SubmitOptions = {}): Promise<Job> {
    const key = options.idempotencyKey ?? body.requestId ?? (await randomKey());
    const headers: Record<string, string> = { "Idempotency-Key": key };
    if (options.wait !== undefined) headers["Prefer"] = `wait=${Math.round(options.wait)}`;
    const answer = await this.api.POST("/v1/jobs", {
      body,
      headers,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    return present(AtelierClient.data(answer).job, "job");
  }

  async getJob(jobId: string): Promise<Job> {
    const answer = await this.api.GET("/v1/jobs/{jobId}", { params: { path: { jobId } } });
    return present(AtelierClient.data(answer).job, "job");
  }

  /** WaitJob: one request that answers once the job settled (SUCCEEDED, FAILED,
   * CANCELLED or NEEDS_ATTENTION) or after `timeoutSeconds` with the job as it is then:
   * check its status, and call again to wait longer. Retried like any GET. */
  async waitJob(jobId: string, options: WaitOptions = {}): Promise<Job> {
    const query = options.timeoutSeconds === undefined ? {} : { timeout: `${options.timeoutSeconds}s` };
    const answer = await this.api.GET("/v1/jobs/{jobId}:wait", {
      params: { path: { jobId }, query },
      ...(options.signal ? { signal: options.signal } : {}),
    });
    return present(AtelierClient.data(answer).job, "job");
  }

  async listJobs(
    query: NonNullable<paths["/v1/jobs"]["get"]["parameters"]["query"]> = {},
  ): Promise<Schemas["ListJobsResponse"]> {
    return AtelierClient.data(await this.api.GET("/v1/jobs", { params: { query } }));
  }

  /** CancelJob: the job CANCELLED, or RUNNING with `cancelRequested`. Retried: a
   * repeated cancel answers the job as it is. */
  async cancelJob(jobId: string): Promise<Job> {
    const answer = await this.api.POST("/v1/jobs/{jobId}:cancel", {
      params: { path: { jobId } },
      body: {},
    });
    return present(AtelierClient.data(answer).job, "job");
  }

  /** DeleteJob of a finished job, its photos too unless `keepAssets`. */
  async deleteJob(jobId: string, options: { keepAssets?: boolean } = {}): Promise<void> {
    const query = options.keepAssets ? { keepAssets: true } : {};
    AtelierClient.data(
      await this.api.DELETE("/v1/jobs/{jobId}", { params: { path: { jobId }, query } }),
    );
  }

  async getBalance(): Promise<Schemas["GetBalanceResponse"]> {
    return AtelierClient.data(await this.api.GET("/v1/balance"));
  }

  async listCatalog(): Promise<Schemas["ListCatalogResponse"]> {
    return AtelierClient.data(await this.api.GET("/v1/catalog"));
  }

  // -- uploads and downloads --------------------------------------------------------------

  /** An input photo stored and ready: CreateUpload (with an idempotency key and the
   * bytes' SHA-256, checked on completion), the bytes PUT to the signed URL with exactly
   * the headers it demands, CompleteUpload. */
  async upload(
    photo: Uint8Array,
    contentType: CreateUploadRequest["contentType"],
    options: WriteOptions = {},
  ): Promise<Asset> {
    const data = new Uint8Array(photo); // one on an ArrayBuffer of its own, as fetch wants
    const key = options.idempotencyKey ?? (await randomKey());
    const request: CreateUploadRequest = {
      purpose: "ASSET_PURPOSE_AI_INPUT",
      contentType,
      sizeBytes: data.byteLength, // int32: a JSON number
      sha256: await sha256Hex(data),
      requestId: key,
    };
    const created = AtelierClient.data(
      await this.api.POST("/v1/uploads", { body: request, headers: { "Idempotency-Key": key } }),
    );
    const uploadUrl = present(created.uploadUrl, "uploadUrl");
    const put = await this.rawFetch(uploadUrl, {
      method: created.uploadMethod || "PUT",
      headers: created.uploadHeaders ?? {},
      body: data,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    if (!put.ok) {
      throw new AtelierError({
        status: put.status,
        code: "UNKNOWN",
        message: `the upload answered HTTP ${put.status}`,
      });
    }
    await put.body?.cancel();
    const assetId = present(created.asset?.assetId, "asset.assetId");
    const completed = await this.api.POST("/v1/uploads/{assetId}:complete", {
      params: { path: { assetId } },
      body: {},
    });
    return present(AtelierClient.data(completed).asset, "asset");
  }

  /** The bytes at a signed download URL (an output's `url` or `thumbnailUrl`). */
  async download(url: string, signal?: AbortSignal): Promise<Uint8Array> {
    const response = await this.rawFetch(url, signal ? { signal } : {});
    if (!response.ok) {
      throw new AtelierError({
        status: response.status,
        code: "UNKNOWN",
        message: `the download answered HTTP ${response.status}`,
      });
    }
    return new Uint8Array(await response.arrayBuffer());
  }

  // -- streams ----------------------------------------------------------------------------

  /** One job's newer states over WatchJob (NDJSON), until its terminal state (which is
   * yielded last). Reconnects after a StreamEnd's `retryDelay`, an UNAVAILABLE or
   * RESOURCE_EXHAUSTED (status or `error` line, after RetryInfo or a backoff) or a dead
   * connection, asking for versions after the last one seen (compared as integers: a
   * version is an int64, a JSON string); any other error is thrown. Abort with `signal`
   * (e.g. `AbortSignal.timeout(60_000)`). */
  async *watchJob(
    jobId: string,
    options: { afterVersion?: string | bigint; signal?: AbortSignal } = {},
  ): AsyncGenerator<WatchedJob> {
    let last = BigInt(options.afterVersion ?? 0);
    const signal = options.signal;
    const open = () =>
      this.api.GET("/v1/jobs/{jobId}:watch", {
        params: { path: { jobId }, query: { afterVersion: last.toString() } },
        parseAs: "stream",
        ...(signal ? { signal } : {}),
      });
    for await (const line of this.follow<WatchJobLine>(open, signal)) {
      const job = (line as { job: WatchedJob & { version?: string; done?: boolean } }).job;
      const version = BigInt(job.version ?? 0);
      if (version > last) {
        last = version;
        yield job;
      }
      if (job.done) return;
    }
  }

  /** The caller's jobs as they change, over WatchJobs (NDJSON), for as long as it is
   * read: each `job` line (a newer state; drop a job with `deleted` set) and each
   * `snapshotEnd` line, both carrying the `cursor` to resume from. Reconnects as
   * `watchJob` does, from the last cursor (each new stream starts with a snapshot of the
   * unfinished jobs and those changed since, then its own `snapshotEnd`). A cursor too
   * old is FAILED_PRECONDITION CURSOR_EXPIRED (thrown: start without one and list the
   * jobs). */
  async *watchJobs(
    options: { cursor?: string; signal?: AbortSignal } = {},
  ): AsyncGenerator<WatchJobsLine> {
    let cursor = options.cursor ?? "";
    const signal = options.signal;
    const open = () =>
      this.api.GET("/v1/jobs:watch", {
        params: { query: cursor ? { cursor } : {} },
        parseAs: "stream",
        ...(signal ? { signal } : {}),
      });
    for await (const line of this.follow<WatchJobsLine>(open, signal)) {
      const news = line as { cursor?: string };
      if (news.cursor) cursor = news.cursor;
      yield line;
    }
  }

  // -- inside -----------------------------------------------------------------------------

  /** The data of an openapi-fetch answer, or its error thrown as an AtelierError. */
  static data<T>(answer: { data?: T; error?: unknown; response: Response }): T {
    const { response } = answer;
    if (!response.ok || answer.data === undefined) {
      throw fromStatus(
        answer.error,
        response.status,
        retryAfterHeader(response.headers.get("retry-after")),
      );
    }
    return answer.data;
  }

  /** The job and snapshot-end lines of a watch stream, across reconnects: `open` opens
   * the stream anew (it reads the caller's resume point each time). */
  private async *follow<Line>(
    open: () => Promise<{ data?: unknown; error?: unknown; response: Response }>,
    signal: AbortSignal | undefined,
  ): AsyncGenerator<Line> {
    let failures = 0;
    for (;;) {
      let delay: number | undefined;
      try {
        const body = AtelierClient.data(await open()) as ReadableStream<Uint8Array> | null;
        if (body === null) throw transportError("the stream has no body");
        for await (const line of ndjson(body)) {
          const message = line as {
            job?: unknown;
            snapshotEnd?: unknown;
            end?: { retryDelay?: string };
            error?: unknown;
          };
          if (message.job !== undefined || message.snapshotEnd !== undefined) {
            failures = 0;
            yield line as Line;
          } else if (message.end !== undefined) {
            delay = durationSeconds(message.end.retryDelay) ?? 0;
            break;
          } else if (message.error !== undefined) {
            delay = this.afterFailure(fromStatus(message.error), ++failures);
            break;
          } // else a keep-alive, or a line this client does not know yet
        }
      } catch (error) {
        if (isAbort(error) || signal?.aborted) throw error;
        delay = this.afterFailure(error, ++failures);
      }
      // A stream that closed without a StreamEnd: reconnect after a backoff.
      await sleep(delay ?? backoff(this.policy, ++failures), signal);
    }
  }

  private afterFailure(error: unknown, failures: number): number {
    const typed = transportError(error);
    if (!reconnectable(typed)) throw typed;
    return typed.retryAfter ?? backoff(this.policy, failures);
  }
}
