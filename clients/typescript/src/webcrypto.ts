// Web Crypto: the global one (browsers, Node 19+), else node:crypto's (Debian's Node 18,
// which has no global `crypto`).

let found: Promise<Crypto> | undefined;

export function webCrypto(): Promise<Crypto> {
  found ??= globalThis.crypto?.subtle
    ? Promise.resolve(globalThis.crypto)
    : import("node:crypto").then((module) => module.webcrypto as unknown as Crypto);
  return found;
}

/** A random (version 4) UUID: a fresh idempotency key. */
export async function randomKey(): Promise<string> {
  return (await webCrypto()).randomUUID();
}

export async function sha256Hex(data: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = await (await webCrypto()).subtle.digest("SHA-256", data);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
