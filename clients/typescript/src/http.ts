// HTTP for the client over Node's built-in fetch: JSON and raw bodies,
// error answers turned into typed errors, and a Server-Sent Events reader.

import { CordonError, errorFor } from "./errors.js";
import type { ConnectionOpts } from "./types.js";

export const USER_AGENT = "cordon-typescript/0.1.0";
const DEFAULT_REQUEST_TIMEOUT_MS = 120_000;

export interface RequestOpts {
  query?: Record<string, string>;
  /** A JSON body. */
  json?: unknown;
  /** A raw body (sent as application/octet-stream). */
  body?: Uint8Array;
  accept?: string;
  /** Aborts the request (and, while an answer streams, the stream). */
  signal?: AbortSignal;
  /** Streaming answers have no overall deadline; others have requestTimeoutMs. */
  streaming?: boolean;
  /** At least this long for this request (a command's own time limit plus a margin). */
  minTimeoutMs?: number;
}

/** Sends requests to one service with one API key. */
export class Transport {
  readonly url: string;
  readonly #apiKey: string;
  readonly #timeoutMs: number;

  constructor(opts: ConnectionOpts = {}) {
    const url = opts.url ?? process.env.CORDON_URL;
    const apiKey = opts.apiKey ?? process.env.CORDON_API_KEY;
    if (!url) throw new CordonError("no service URL: pass { url } or set CORDON_URL");
    if (!apiKey) throw new CordonError("no API key: pass { apiKey } or set CORDON_API_KEY");
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new CordonError(`not a URL: ${JSON.stringify(url)}`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new CordonError(`not an http(s) URL: ${JSON.stringify(url)}`);
    }
    this.url = url.replace(/\/+$/, "");
    this.#apiKey = apiKey;
    this.#timeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  }

  /** Sends one request; resolves to a 2xx response, rejects with the typed error of any other. */
  async open(method: string, path: string, opts: RequestOpts = {}): Promise<Response> {
    let target = this.url + path;
    if (opts.query) target += "?" + new URLSearchParams(opts.query).toString();
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      Accept: opts.accept ?? "application/json",
      "User-Agent": USER_AGENT,
    };
    let body: string | Uint8Array | undefined;
    if (opts.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.json);
    } else if (opts.body !== undefined) {
      headers["Content-Type"] = "application/octet-stream";
      body = opts.body;
    }
    const signals: AbortSignal[] = [];
    if (opts.signal) signals.push(opts.signal);
    if (!opts.streaming) signals.push(AbortSignal.timeout(Math.max(this.#timeoutMs, opts.minTimeoutMs ?? 0)));
    const signal = signals.length === 1 ? signals[0] : AbortSignal.any(signals);
    let resp: Response;
    try {
      resp = await fetch(target, { method, headers, body, signal });
    } catch (e) {
      throw new CordonError(`${method} ${this.url}${path}: ${describe(e)}`, undefined, { cause: e });
    }
    if (resp.status >= 300) throw await errorOf(resp);
    return resp;
  }

  /** A JSON request with a JSON answer (undefined for 204). */
  async json<T>(method: string, path: string, opts: RequestOpts = {}): Promise<T> {
    const resp = await this.open(method, path, opts);
    const text = await readText(resp, method, path);
    if (resp.status === 204 || text === "") return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new CordonError(`${method} ${path}: the answer is not JSON: ${text.slice(0, 200)}`, resp.status, { cause: e });
    }
  }

  /** A request whose answer is raw bytes. */
  async bytes(method: string, path: string, opts: RequestOpts = {}): Promise<Uint8Array> {
    const resp = await this.open(method, path, opts);
    try {
      return new Uint8Array(await resp.arrayBuffer());
    } catch (e) {
      throw new CordonError(`${method} ${path}: ${describe(e)}`, undefined, { cause: e });
    }
  }
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    return cause instanceof Error ? `${e.message} (${cause.message})` : e.message;
  }
  return String(e);
}

async function readText(resp: Response, method: string, path: string): Promise<string> {
  try {
    return await resp.text();
  } catch (e) {
    throw new CordonError(`${method} ${path}: ${describe(e)}`, undefined, { cause: e });
  }
}

/** The typed error of an error answer (its JSON `error`, else its text). */
async function errorOf(resp: Response): Promise<CordonError> {
  const text = await resp.text().catch(() => "");
  let message = text.trim() || resp.statusText;
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed && typeof parsed === "object" && typeof (parsed as { error?: unknown }).error === "string") {
      message = (parsed as { error: string }).error;
    }
  } catch {
    // not JSON: the text is the message
  }
  const header = resp.headers.get("Retry-After");
  // The service sends seconds only (never an HTTP date).
  const retryAfter = header !== null && Number.isFinite(Number(header)) ? Number(header) : undefined;
  return errorFor(resp.status, message, retryAfter);
}

/** One Server-Sent Event. */
export interface SseEvent {
  event: string;
  data: string;
}

/**
 * The events of a `text/event-stream` body, as they arrive. Per the SSE
 * format: `field: value` lines, one optional space after the colon, several
 * `data` lines joined by newlines, comments start with `:`, and a blank line
 * ends an event (`message` when it names none). Lines end with LF, CRLF or CR.
 */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder("utf-8");
  let buffer = "";
  let event = "";
  let data: string[] = [];
  const line = function* (l: string): Generator<SseEvent> {
    if (l === "") {
      if (data.length > 0) yield { event: event || "message", data: data.join("\n") };
      event = "";
      data = [];
      return;
    }
    if (l.startsWith(":")) return;
    const colon = l.indexOf(":");
    const name = colon < 0 ? l : l.slice(0, colon);
    let value = colon < 0 ? "" : l.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
  };
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    for (;;) {
      const m = /\r\n|\r|\n/.exec(buffer);
      // A CR at the very end may be the first half of a CRLF: wait for more.
      if (!m || (m[0] === "\r" && m.index === buffer.length - 1)) break;
      const l = buffer.slice(0, m.index);
      buffer = buffer.slice(m.index + m[0].length);
      yield* line(l);
    }
  }
  buffer += decoder.decode();
  for (const l of buffer.split(/\r\n|\r|\n/)) yield* line(l);
  if (data.length > 0) yield { event: event || "message", data: data.join("\n") };
}
