// The hand-written layer against a fetch the test plays: no network, no server.
import assert from "node:assert/strict";
import { test } from "node:test";

import { AtelierClient, AtelierError, ndjson, retryingFetch } from "../src/index.js";

type Answer = Response | Error;

/** A fetch that hands out `answers` in order and records each request it was sent. */
function scripted(answers: Answer[]) {
  const seen: Request[] = [];
  const bodies: string[] = [];
  const fake = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    seen.push(request);
    bodies.push(await request.clone().text());
    const next = answers.shift();
    if (next === undefined) throw new Error(`unexpected request ${request.method} ${request.url}`);
    if (next instanceof Error) throw next;
    return next;
  };
  return { fetch: fake as typeof fetch, seen, bodies };
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function status(code: number, reason: string, extra: Array<Record<string, unknown>> = []) {
  return {
    code,
    message: "said the server",
    details: [
      { "@type": "type.googleapis.com/google.rpc.ErrorInfo", reason, domain: "atelier.dev" },
      ...extra,
    ],
  };
}

function lines(...messages: unknown[]): Response {
  const text = messages.map((m) => JSON.stringify(m) + "\n").join("");
  return new Response(text, { status: 200, headers: { "content-type": "application/x-ndjson" } });
}

function fakeTime() {
  const sleeps: number[] = [];
  let now = 1_000_000;
  return {
    sleeps,
    now: () => now,
    sleep: async (seconds: number) => {
      sleeps.push(seconds);
      now += seconds * 1000;
    },
  };
}

const URL_ = "http://edge.test";

test("a keyed write is retried after retry-after, then RetryInfo, with the same key and body", async () => {
  const server = scripted([
    json(503, status(14, "DATABASE_UNAVAILABLE"), { "retry-after": "2" }),
    json(429, status(8, "USER_BUSY", [
      { "@type": "type.googleapis.com/google.rpc.RetryInfo", retryDelay: "1.500s" },
    ])),
    json(200, { job: { jobId: "j-1" } }),
  ]);
  const time = fakeTime();
  const fetch = retryingFetch({ fetch: server.fetch, ...time, random: () => 0.5 });
  const answer = await fetch(`${URL_}/v1/jobs`, {
    method: "POST",
    headers: { "idempotency-key": "k-1" },
    body: '{"modelId":"stub-fast"}',
  });
  assert.equal(answer.status, 200);
  assert.deepEqual(time.sleeps, [2, 1.5]);
  assert.deepEqual(server.seen.map((r) => r.headers.get("idempotency-key")), ["k-1", "k-1", "k-1"]);
  assert.deepEqual(new Set(server.bodies), new Set(['{"modelId":"stub-fast"}']));
});

test("a write without a key is never retried; a final 409 is not either", async () => {
  for (const [path, answer] of [
    ["/v1/uploads/a-1:complete", json(503, status(14, "MEDIA_UNAVAILABLE"))],
    ["/v1/jobs", json(409, status(6, "IDEMPOTENCY_KEY_REUSED"))],
  ] as const) {
    const server = scripted([answer]);
    const time = fakeTime();
    const headers: Record<string, string> = path === "/v1/jobs" ? { "idempotency-key": "k" } : {};
    const fetch = retryingFetch({ fetch: server.fetch, ...time });
    const got = await fetch(`${URL_}${path}`, { method: "POST", headers, body: "{}" });
    assert.equal(got.status, answer.status);
    assert.equal(server.seen.length, 1);
    assert.deepEqual(time.sleeps, []);
  }
});

test("a retry-me 409 (retry-after), a cancel and a reset connection are retried", async () => {
  const server = scripted([
    json(409, status(10, "USER_BUSY"), { "retry-after": "1" }),
    new TypeError("fetch failed"),
    json(200, { job: { jobId: "j-1", status: "JOB_STATUS_CANCELLED" } }),
  ]);
  const time = fakeTime();
  const fetch = retryingFetch({ fetch: server.fetch, ...time, random: () => 0 });
  const got = await fetch(`${URL_}/v1/jobs/j-1:cancel`, { method: "POST", body: "{}" });
  assert.equal(got.status, 200);
  assert.equal(time.sleeps[0], 1);
  assert.ok(time.sleeps[1]! >= 0.1 && time.sleeps[1]! <= 0.2); // a backoff: no answer
});

test("a delay past the deadline answers at once; attempts stop at maxAttempts", async () => {
  const quota = json(429, status(8, "DAILY_QUOTA_EXCEEDED"), { "retry-after": "7200" });
  const server = scripted([quota]);
  const time = fakeTime();
  const got = await retryingFetch({ fetch: server.fetch, ...time })(`${URL_}/v1/balance`);
  assert.equal(got.status, 429);
  assert.deepEqual(time.sleeps, []);

  const down = () => json(503, status(14, "DATABASE_UNAVAILABLE"), { "retry-after": "1" });
  const again = scripted([down(), down(), down()]);
  const policy = { maxAttempts: 3, deadline: 60, initialBackoff: 0.1, maxBackoff: 2, multiplier: 2 };
  const last = await retryingFetch({ fetch: again.fetch, policy, ...fakeTime() })(`${URL_}/v1/balance`);
  assert.equal(last.status, 503);
  assert.equal(again.seen.length, 3);
});

test("a device missing after a retry is deleted; missing at first is a 404", async () => {
  const missing = () => json(404, status(5, "DEVICE_NOT_FOUND"));
  const server = scripted([json(503, status(14, "")), missing(), missing()]);
  const fetch = retryingFetch({ fetch: server.fetch, ...fakeTime() });
  assert.equal((await fetch(`${URL_}/v1/devices/d-1`, { method: "DELETE" })).status, 200);
  assert.equal((await fetch(`${URL_}/v1/devices/d-2`, { method: "DELETE" })).status, 404);
});

test("ndjson reads values split across chunks and lines split across values", async () => {
  const encoder = new TextEncoder();
  const chunks = ['{"a":', '1}\n{"b":"é', '"}\n\n{"c":3}'];
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
      controller.close();
    },
  });
  const got = [];
  for await (const value of ndjson(body)) got.push(value);
  assert.deepEqual(got, [{ a: 1 }, { b: "é" }, { c: 3 }]);
});

test("submitJob sends a fresh idempotency key, the same on a retry, and errors are typed", async () => {
  const server = scripted([
    json(503, status(14, "DATABASE_UNAVAILABLE"), { "retry-after": "0" }),
    json(200, { job: { jobId: "j-1", version: "1" } }),
    json(400, status(3, "MODEL_NOT_AVAILABLE", [
      {
        "@type": "type.googleapis.com/google.rpc.BadRequest",
        fieldViolations: [{ field: "model_id", description: "no such model" }],
      },
    ])),
  ]);
  const client = new AtelierClient({ baseUrl: URL_, token: () => "t0ken", fetch: server.fetch });
  const body = { modelId: "stub-fast", styleId: "watercolor", width: 512, height: 512 } as never;
  const job = await client.submitJob(body);
  assert.equal(job.jobId, "j-1");
  const keys = server.seen.map((r) => r.headers.get("idempotency-key"));
  assert.match(keys[0]!, /^[0-9a-f-]{36}$/);
  assert.equal(keys[0], keys[1]);
  assert.equal(server.seen[0]!.headers.get("authorization"), "Bearer t0ken");

  await assert.rejects(client.submitJob(body), (error: unknown) => {
    assert.ok(error instanceof AtelierError);
    assert.equal(error.status, 400);
    assert.equal(error.code, "INVALID_ARGUMENT");
    assert.equal(error.reason, "MODEL_NOT_AVAILABLE");
    assert.deepEqual(error.fieldViolations, [{ field: "model_id", description: "no such model" }]);
    return true;
  });
  assert.notEqual(server.seen[2]!.headers.get("idempotency-key"), keys[0]); // a new write
});

test("waitJob sends its timeout as a duration; submitJob's wait is a Prefer header", async () => {
  const server = scripted([
    json(200, { job: { jobId: "j-1", version: "4", status: "JOB_STATUS_SUCCEEDED" } }),
    json(200, { job: { jobId: "j-2", version: "1" } }, { "preference-applied": "wait=20" }),
    json(200, { job: { jobId: "j-3", version: "1" } }),
  ]);
  const client = new AtelierClient({ baseUrl: URL_, token: "t0ken", fetch: server.fetch });
  const done = await client.waitJob("j-1", { timeoutSeconds: 20 });
  assert.equal(done.status, "JOB_STATUS_SUCCEEDED");
  const url = new URL(server.seen[0]!.url);
  assert.equal(url.pathname, "/v1/jobs/j-1:wait");
  assert.equal(url.searchParams.get("timeout"), "20s");
  const body = { modelId: "stub-fast", styleId: "watercolor", width: 512, height: 512 } as never;
  await client.submitJob(body, { wait: 20 });
  assert.equal(server.seen[1]!.headers.get("prefer"), "wait=20");
  await client.submitJob(body);
  assert.equal(server.seen[2]!.headers.get("prefer"), null);
});

test("watchJob reconnects from the last version until the terminal state", async () => {
  const server = scripted([
    lines(
      { job: { jobId: "j-1", version: "1", status: "JOB_STATUS_QUEUED" } },
      { keepAlive: { sendTime: "2026-01-01T00:00:00Z" } },
      { job: { jobId: "j-1", version: "10", status: "JOB_STATUS_RUNNING" } },
      { end: { reason: "STREAM_END_REASON_DRAINING", retryDelay: "0.010s" } },
    ),
    lines({
      error: status(14, "PROJECTION_UNAVAILABLE", [
        { "@type": "type.googleapis.com/google.rpc.RetryInfo", retryDelay: "0.010s" },
      ]),
    }),
    new TypeError("terminated"), // the connection died
    lines(
      { job: { jobId: "j-1", version: "9", status: "JOB_STATUS_RUNNING" } }, // older: dropped
      { job: { jobId: "j-1", version: "11", status: "JOB_STATUS_SUCCEEDED", done: true } },
    ),
  ]);
  const client = new AtelierClient({ baseUrl: URL_, token: "t", fetch: server.fetch });
  const versions = [];
  for await (const job of client.watchJob("j-1")) versions.push(job.version);
  assert.deepEqual(versions, ["1", "10", "11"]); // "10" > "9" as numbers, not as text
  const asked = server.seen.map((r) => new URL(r.url).searchParams.get("afterVersion"));
  assert.deepEqual(asked, ["0", "10", "10", "10"]);
});

test("watchJob throws a final error; watchJobs resumes from its last cursor", async () => {
  const missing = scripted([json(404, status(5, "JOB_NOT_FOUND"))]);
  const client = new AtelierClient({ baseUrl: URL_, token: "t", fetch: missing.fetch });
  await assert.rejects(
    (async () => {
      for await (const _ of client.watchJob("nope")) void _;
    })(),
    (error: unknown) => error instanceof AtelierError && error.reason === "JOB_NOT_FOUND",
  );

  const server = scripted([
    lines(
      { job: { jobId: "j-1", version: "1" }, cursor: "c1" },
      { snapshotEnd: {}, cursor: "c2" },
      { end: { reason: "STREAM_END_REASON_MAX_DURATION", retryDelay: "0s" } },
    ),
    lines({ job: { jobId: "j-2", version: "1" }, cursor: "c3" }),
    json(400, status(9, "CURSOR_EXPIRED")),
  ]);
  const watcher = new AtelierClient({ baseUrl: URL_, token: "t", fetch: server.fetch });
  const got: string[] = [];
  await assert.rejects(
    (async () => {
      for await (const line of watcher.watchJobs({ cursor: "saved" })) got.push(line.cursor ?? "");
    })(),
    (error: unknown) => error instanceof AtelierError && error.reason === "CURSOR_EXPIRED",
  );
  assert.deepEqual(got, ["c1", "c2", "c3"]);
  const asked = server.seen.map((r) => new URL(r.url).searchParams.get("cursor"));
  assert.deepEqual(asked, ["saved", "c2", "c3"]);
});
