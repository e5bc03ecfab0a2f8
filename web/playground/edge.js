// Talking to the atelier edge: JSON calls with a bearer token, errors turned into
// sentences a person understands, and the newline-delimited JSON of watch streams.

// google.rpc.Status codes the page treats specially.
const INVALID_ARGUMENT = 3;
const UNAUTHENTICATED = 16;
const RESOURCE_EXHAUSTED = 8;
const UNAVAILABLE = 14;

const BUSY_RETRIES = 3;

/** An answer of the edge that was not a success: its HTTP status and google.rpc.Status. */
export class EdgeError extends Error {
  constructor(httpStatus, status, retryAfterHeader) {
    super(status.message || `HTTP ${httpStatus}`);
    this.httpStatus = httpStatus;
    this.code = status.code ?? 0;
    const details = Array.isArray(status.details) ? status.details : [];
    const typed = (name) => details.find((d) => String(d["@type"]).endsWith(`/google.rpc.${name}`));
    this.reason = typed("ErrorInfo")?.reason ?? "";
    // [{field: "width", description: "…"}] from BadRequest.
    this.fieldViolations = typed("BadRequest")?.fieldViolations ?? [];
    this.retrySeconds = retrySeconds(retryAfterHeader, typed("RetryInfo")?.retryDelay);
  }

  get busy() {
    return this.httpStatus === 503 || this.code === UNAVAILABLE;
  }

  get tooMany() {
    return this.httpStatus === 429 || this.code === RESOURCE_EXHAUSTED;
  }

  /** One sentence for the notice line. */
  describe() {
    if (this.tooMany) {
      const wait = this.retrySeconds ?? 1;
      return `Too many requests (${this.message}): try again in ${wait} s.`;
    }
    // (While call() still retries, the page says "the service is busy, retrying…".)
    if (this.busy) return `The service is busy: try again in ${this.retrySeconds ?? 1} s.`;
    if (this.httpStatus === 401 || this.code === UNAUTHENTICATED) {
      return `Your token was refused (${this.reason || "UNAUTHENTICATED"}): paste a fresh one.`;
    }
    if (this.code === INVALID_ARGUMENT && this.fieldViolations.length) {
      return "Please correct the fields marked below.";
    }
    const reason = this.reason ? ` (${this.reason})` : "";
    return `${this.message}${reason}`;
  }
}

/** The edge could not be reached at all (network, CORS, a wrong origin). */
export class Unreachable extends Error {}

/** Seconds to wait: the retry-after header, else RetryInfo's "1.5s" duration. */
function retrySeconds(header, retryDelay) {
  const fromHeader = Number.parseInt(header ?? "", 10);
  if (Number.isFinite(fromHeader)) return fromHeader;
  const match = /^([0-9.]+)s$/.exec(retryDelay ?? "");
  return match ? Math.ceil(Number.parseFloat(match[1])) : undefined;
}

async function statusOf(response) {
  const text = await response.text();
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed === "object") return parsed;
  } catch {
    // Not JSON: a plain-text answer (a proxy in front of the edge, say).
  }
  return { code: 0, message: text.trim() || response.statusText };
}

const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/**
 * fetch() that throws EdgeError for a non-2xx answer and Unreachable when there was no
 * answer. UNAVAILABLE is retried (after retry-after) a few times, telling onBusy first:
 * every write the page sends is safe to repeat (SubmitJob carries a request_id). `body` is
 * sent as JSON, `rawBody` (a Blob) as it is.
 */
export async function call(url, { method = "GET", token, body, rawBody, headers = {}, signal, onBusy } = {}) {
  for (let attempt = 0; ; attempt += 1) {
    // Headers, not an object: names are case-insensitive ("Content-Type" given twice in
    // two spellings would be sent as one joined value).
    const init = { method, headers: new Headers(headers), signal };
    if (token) init.headers.set("authorization", `Bearer ${token}`);
    if (body !== undefined) {
      init.headers.set("content-type", "application/json");
      init.body = JSON.stringify(body);
    } else if (rawBody !== undefined) {
      init.body = rawBody; // a File or Blob: the bytes as they are
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new Unreachable(`Could not reach ${new URL(url, location.href).origin}: ${error.message}`);
    }
    if (response.ok) return response;
    const error = new EdgeError(response.status, await statusOf(response), response.headers.get("retry-after"));
    if (!error.busy || attempt >= BUSY_RETRIES) throw error;
    onBusy?.(error);
    await sleep(error.retrySeconds ?? 1);
  }
}

/** call() and parse the JSON answer. */
export async function callJson(url, options) {
  const response = await call(url, options);
  return response.json();
}

/**
 * The messages of a newline-delimited JSON stream (the edge's server streams: one JSON
 * object per line), parsed as each line completes. Ends when the body ends.
 */
export async function* jsonLines(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      let newline;
      while ((newline = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, newline).trim();
        pending = pending.slice(newline + 1);
        if (line) yield JSON.parse(line);
      }
    }
    if (pending.trim()) yield JSON.parse(pending);
  } finally {
    // Also when the caller stops early (a StreamEnd, a new job): close the connection.
    await reader.cancel().catch(() => {});
  }
}

/** A random UUID (v4) for request_id: crypto.randomUUID exists only on secure origins. */
export function newRequestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** The `sub` of a JWT, for display only (the services verify it, not the page). */
export function tokenSubject(token) {
  try {
    const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload)).sub ?? "";
  } catch {
    return "";
  }
}

export { sleep };
