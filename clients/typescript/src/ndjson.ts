// Newline-delimited JSON: one JSON value per line, as the edge sends server streams.

/** The JSON values of an NDJSON body, one per line, as they arrive; lines may be split
 * across chunks. Stopping early (break, return) cancels the body. */
export async function* ndjson(body: ReadableStream<Uint8Array>): AsyncGenerator<unknown> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline).trim();
        buffered = buffered.slice(newline + 1);
        if (line) yield JSON.parse(line);
      }
    }
    buffered += decoder.decode();
    finished = true;
    if (buffered.trim()) yield JSON.parse(buffered);
  } finally {
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}
