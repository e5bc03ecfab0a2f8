// Names for the shapes the hand-written layer handles, all taken from the generated
// document (src/generated/openapi.ts, made from gen/openapi.json): nothing here restates a
// field. The watch lines are read off the watch operations' 200 answers, so they follow
// whatever schema the document gives those routes.
import type { components, paths } from "./generated/openapi.js";

export type Schemas = components["schemas"];
export type Job = Schemas["Job"];
export type SubmitJobRequest = Schemas["SubmitJobRequest"];
export type CreateUploadRequest = Schemas["CreateUploadRequest"];
export type CreateUploadResponse = Schemas["CreateUploadResponse"];
export type Asset = Schemas["Asset"];

type OkContent<P extends keyof paths> = paths[P] extends {
  get: { responses: { 200: { content: infer C } } };
}
  ? C[keyof C]
  : never;

/** One line of `GET /v1/jobs/{jobId}:watch` (NDJSON). */
export type WatchJobLine = OkContent<"/v1/jobs/{jobId}:watch">;
/** One line of `GET /v1/jobs:watch` (NDJSON). */
export type WatchJobsLine = OkContent<"/v1/jobs:watch">;

type JobOf<L> = L extends { job?: infer J } ? NonNullable<J> : never;
/** The job a watch line carries (a job's state as the streams send it). */
export type WatchedJob = JobOf<WatchJobLine>;
/** The job and snapshot-end lines of WatchJobs that `watchJobs` hands on. */
export type WatchJobsNews = WatchJobsLine;
