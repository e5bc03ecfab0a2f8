// A failed answer as a typed error: the HTTP status, and what the JSON google.rpc.Status
// body says (the gRPC code, the stable ErrorInfo.reason, field violations, RetryInfo).

/** gRPC status codes by number, as the JSON google.rpc.Status `code` carries them. */
export const CODES = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
] as const;
export type Code = (typeof CODES)[number];

export interface FieldViolation {
  field: string;
  description: string;
}

interface StatusBody {
  code?: number;
  message?: string;
  details?: Array<Record<string, unknown>>;
}

const ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo";
const BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest";
const RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo";

export class AtelierError extends Error {
  /** The HTTP status (0 for a stream's error line or a failure before any answer). */
  readonly status: number;
  readonly code: Code;
  /** ErrorInfo.reason: the stable contract; empty when atelier did not answer. */
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Record<string, string>;
  readonly fieldViolations: FieldViolation[];
  /** Seconds to wait before trying again (RetryInfo, else `retry-after`), when given. */
  readonly retryAfter: number | undefined;

  constructor(fields: {
    status: number;
    code: Code;
    message: string;
    reason?: string;
    domain?: string;
    metadata?: Record<string, string>;
    fieldViolations?: FieldViolation[];
    retryAfter?: number | undefined;
  }) {
    super(`${fields.code} ${fields.reason || "-"}: ${fields.message}`);
    this.name = "AtelierError";
    this.status = fields.status;
    this.code = fields.code;
    this.reason = fields.reason ?? "";
    this.domain = fields.domain ?? "";
    this.metadata = fields.metadata ?? {};
    this.fieldViolations = fields.fieldViolations ?? [];
    this.retryAfter = fields.retryAfter;
  }
}

/** Seconds in a protobuf JSON Duration ("1.500s"). */
export function durationSeconds(value: unknown): number | undefined {
  if (typeof value !== "string" || !value.endsWith("s")) return undefined;
  const seconds = Number(value.slice(0, -1));
  return Number.isFinite(seconds) && seconds >= 0 ? seconds : undefined;
}

/** Seconds a `retry-after` header asks for (delta-seconds or an HTTP date). */
export function retryAfterHeader(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim());
  const when = Date.parse(value);
  return Number.isNaN(when) ? undefined : Math.max(0, (when - now) / 1000);
}

function codeFromHttp(status: number): Code {
  const table: Record<number, Code> = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
  };
  return table[status] ?? (status >= 500 ? "INTERNAL" : "UNKNOWN");
}

/** The error a google.rpc.Status (an answer's body, or a stream's `error` line) says. */
export function fromStatus(
  body: unknown,
  status = 0,
  headerRetryAfter?: number,
): AtelierError {
  const parsed: StatusBody = typeof body === "object" && body !== null ? (body as StatusBody) : {};
  const code: Code =
    typeof parsed.code === "number" && CODES[parsed.code] !== undefined
      ? CODES[parsed.code]!
      : codeFromHttp(status);
  let reason = "";
  let domain = "";
  let metadata: Record<string, string> = {};
  const fieldViolations: FieldViolation[] = [];
  let retryAfter: number | undefined;
  for (const detail of parsed.details ?? []) {
    const kind = detail["@type"];
    if (kind === ERROR_INFO) {
      reason = String(detail.reason ?? "");
      domain = String(detail.domain ?? "");
      metadata = (detail.metadata as Record<string, string> | undefined) ?? {};
    } else if (kind === BAD_REQUEST) {
      for (const v of (detail.fieldViolations as FieldViolation[] | undefined) ?? []) {
        fieldViolations.push({ field: v.field ?? "", description: v.description ?? "" });
      }
    } else if (kind === RETRY_INFO) {
      retryAfter = durationSeconds(detail.retryDelay);
    }
  }
  return new AtelierError({
    status,
    code,
    message: parsed.message ?? (typeof body === "string" ? body : `HTTP ${status}`),
    reason,
    domain,
    metadata,
    fieldViolations,
    retryAfter: retryAfter ?? headerRetryAfter,
  });
}

/** The error a failed HTTP answer carries; reads (a clone of) its body. */
export async function fromResponse(response: Response): Promise<AtelierError> {
  const text = await response.clone().text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // Envoy's own answers (a malformed body, a missing route) may be plain text.
  }
  return fromStatus(body, response.status, retryAfterHeader(response.headers.get("retry-after")));
}
