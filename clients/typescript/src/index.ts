export { AtelierClient, reconnectable } from "./client.js";
export type { AtelierClientOptions, SubmitOptions, Token, WaitOptions, WriteOptions } from "./client.js";
export { AtelierError, CODES, fromResponse, fromStatus } from "./errors.js";
export type { Code, FieldViolation } from "./errors.js";
export { ndjson } from "./ndjson.js";
export { DEFAULT_RETRY, NO_RETRY, retryingFetch } from "./retry.js";
export type { RetryHook, RetryOptions, RetryPolicy } from "./retry.js";
export type * from "./types.js";
export type { components, paths } from "./generated/openapi.js";
