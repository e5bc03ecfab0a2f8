// The client against the real stack through Envoy (tests/acceptance/test_typescript_client.py
// starts it and runs this file with ATELIER_EDGE_URL, ATELIER_TOKEN and ATELIER_TEST_PNG):
// upload -> submit -> watch -> download -> cancel -> list, and WatchJobs resumed from a
// cursor.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { test } from "node:test";

import { AtelierClient, AtelierError, type WatchJobsLine } from "../src/index.js";

const edge = process.env.ATELIER_EDGE_URL;
const skip = edge ? false : "ATELIER_EDGE_URL is not set: run tests/acceptance/test_typescript_client.py";

function client(): AtelierClient {
  return new AtelierClient({ baseUrl: edge!, token: process.env.ATELIER_TOKEN! });
}

async function photo(): Promise<Uint8Array> {
  return new Uint8Array(await readFile(process.env.ATELIER_TEST_PNG!));
}

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

async function submitted(atelier: AtelierClient, inputAssetId: string, key?: string) {
  const body = {
    modelId: "stub-fast",
    styleId: "watercolor",
    inputAssetId,
    prompt: "a fox",
    width: 512,
    height: 512,
  } as Parameters<AtelierClient["submitJob"]>[0];
  return atelier.submitJob(body, key ? { idempotencyKey: key } : {});
}

test("upload, submit, watch, download, cancel, list", { skip, timeout: 120_000 }, async () => {
  const atelier = client();
  const asset = await atelier.upload(await photo(), "image/png");
  assert.equal(asset.status, "ASSET_STATUS_READY");

  const key = randomUUID();
  const job = await submitted(atelier, asset.assetId!, key);
  assert.equal(job.status, "JOB_STATUS_QUEUED");
  const replay = await submitted(atelier, asset.assetId!, key); // the same key: the same job
  assert.equal(replay.jobId, job.jobId);

  const seen = [];
  for await (const state of atelier.watchJob(job.jobId!, { signal: AbortSignal.timeout(60_000) })) {
    seen.push(state);
  }
  const final = seen.at(-1)!;
  assert.equal(final.status, "JOB_STATUS_SUCCEEDED");
  assert.ok(final.done);
  const versions = seen.map((s) => BigInt(s.version ?? 0));
  assert.deepEqual(versions, [...versions].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)));
  assert.equal((await atelier.getJob(job.jobId!)).version, final.version);

  const outputs = final.outputs ?? [];
  assert.ok(outputs.length >= 1);
  const picture = await atelier.download(outputs[0]!.url!);
  assert.deepEqual([...picture.subarray(0, 8)], PNG_SIGNATURE);

  // WaitJob: one request, answered at once for a finished job.
  const waited = await atelier.waitJob(job.jobId!, { timeoutSeconds: 5 });
  assert.equal(waited.status, "JOB_STATUS_SUCCEEDED");
  assert.equal(waited.version, final.version);

  const second = await submitted(atelier, asset.assetId!);
  const cancelled = await atelier.cancelJob(second.jobId!);
  assert.ok(cancelled.status === "JOB_STATUS_CANCELLED" || cancelled.cancelRequested);
  const again = await atelier.cancelJob(second.jobId!); // a repeated cancel is accepted
  assert.equal(again.jobId, second.jobId);
  let last;
  for await (const state of atelier.watchJob(second.jobId!, { signal: AbortSignal.timeout(60_000) })) {
    last = state;
  }
  assert.equal(last?.status, "JOB_STATUS_CANCELLED");

  const listed = await atelier.listJobs({ pageSize: 10 });
  assert.deepEqual(
    (listed.jobs ?? []).map((j) => [j.jobId, j.status]),
    [
      [second.jobId, "JOB_STATUS_CANCELLED"],
      [job.jobId, "JOB_STATUS_SUCCEEDED"],
    ],
  );
  const succeeded = await atelier.listJobs({ statuses: ["JOB_STATUS_SUCCEEDED"] });
  assert.deepEqual((succeeded.jobs ?? []).map((j) => j.jobId), [job.jobId]);

  await atelier.deleteJob(second.jobId!);
  await atelier.deleteJob(second.jobId!); // deleting it again succeeds
  await assert.rejects(atelier.getJob(second.jobId!), (error: unknown) => {
    assert.ok(error instanceof AtelierError);
    assert.equal(error.status, 404);
    assert.equal(error.reason, "JOB_NOT_FOUND");
    return true;
  });
});

test("submit with Prefer: wait, then waitJob, run a job without a stream", { skip, timeout: 120_000 }, async () => {
  const atelier = client();
  const asset = await atelier.upload(await photo(), "image/png");
  const body = {
    modelId: "stub-fast",
    styleId: "watercolor",
    inputAssetId: asset.assetId,
    prompt: "a fox",
    width: 512,
    height: 512,
  } as Parameters<AtelierClient["submitJob"]>[0];
  let job = await atelier.submitJob(body, { wait: 30 });
  for (let round = 0; round < 5 && !["JOB_STATUS_SUCCEEDED", "JOB_STATUS_FAILED"].includes(job.status!); round++) {
    job = await atelier.waitJob(job.jobId!, { timeoutSeconds: 30 });
  }
  assert.equal(job.status, "JOB_STATUS_SUCCEEDED");
  assert.ok((job.outputs ?? [])[0]?.url);
  await assert.rejects(atelier.waitJob(job.jobId!, { timeoutSeconds: 61 }), (error: unknown) => {
    assert.ok(error instanceof AtelierError);
    assert.equal(error.status, 400);
    assert.equal(error.reason, "INVALID_WAIT_TIMEOUT");
    assert.deepEqual(error.fieldViolations.map((v) => v.field), ["timeout"]);
    return true;
  });
});

test("a bad request is a typed error naming its field", { skip }, async () => {
  const atelier = client();
  const asset = await atelier.upload(await photo(), "image/png");
  const body = {
    modelId: "no-such-model",
    styleId: "watercolor",
    inputAssetId: asset.assetId,
    width: 512,
    height: 512,
  } as Parameters<AtelierClient["submitJob"]>[0];
  await assert.rejects(atelier.submitJob(body), (error: unknown) => {
    assert.ok(error instanceof AtelierError);
    assert.equal(error.status, 400);
    assert.equal(error.code, "INVALID_ARGUMENT");
    assert.equal(error.reason, "MODEL_NOT_AVAILABLE");
    assert.deepEqual(error.fieldViolations.map((v) => v.field), ["model_id"]);
    return true;
  });
});

async function until(
  lines: AsyncGenerator<WatchJobsLine>,
  wanted: (line: WatchJobsLine) => boolean,
): Promise<WatchJobsLine> {
  for (;;) {
    const next = await lines.next();
    assert.ok(!next.done, "the watch ended");
    if (wanted(next.value)) return next.value;
  }
}

const isSnapshotEnd = (line: WatchJobsLine) => (line as { snapshotEnd?: unknown }).snapshotEnd !== undefined;
const jobIdOf = (line: WatchJobsLine) => (line as { job?: { jobId?: string } }).job?.jobId;

test("watchJobs resumes from its cursor with what changed meanwhile", { skip, timeout: 120_000 }, async () => {
  const atelier = client();
  const asset = await atelier.upload(await photo(), "image/png");
  const signal = AbortSignal.timeout(90_000);

  const first = atelier.watchJobs({ signal });
  assert.ok((await until(first, isSnapshotEnd)).cursor);
  const job = await submitted(atelier, asset.assetId!);
  const seen = await until(first, (line) => jobIdOf(line) === job.jobId);
  await first.return(undefined); // the app goes away with its cursor
  const saved = seen.cursor!;

  await atelier.cancelJob(job.jobId!); // changes while nobody watches
  let final;
  for await (const state of atelier.watchJob(job.jobId!, { signal })) final = state;
  assert.equal(final?.status, "JOB_STATUS_CANCELLED");

  const resumed = atelier.watchJobs({ cursor: saved, signal });
  const snapshot = [];
  for (;;) {
    const line = await until(resumed, () => true);
    if (isSnapshotEnd(line)) break;
    snapshot.push(line);
  }
  const mine = snapshot.filter((line) => jobIdOf(line) === job.jobId);
  assert.deepEqual(
    mine.map((line) => (line as { job: { version?: string } }).job.version),
    [final!.version],
  );

  await atelier.deleteJob(job.jobId!);
  const gone = await until(resumed, (line) => jobIdOf(line) === job.jobId);
  assert.equal((gone as { job: { deleted?: boolean } }).job.deleted, true); // drop the job
  await resumed.return(undefined);
});
