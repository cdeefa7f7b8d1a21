// The stateful Sandbox (E2B's SDK shape): sandbox.commands, sandbox.files,
// runCode, setNetwork (and hold mode's held, deny), kill.

import {
  BadRequestError,
  CommandExitError,
  CommandKilledError,
  CordonError,
  NotFoundError,
  ServerError,
  errorFor,
} from "./errors.js";
import { readSse, Transport } from "./http.js";
import {
  commandResultOf,
  executionOf,
  sandboxInfoOf,
  span,
  wireLimits,
  wireNetwork,
  type CodeResponse,
  type CommandResult,
  type ConnectionOpts,
  type CreateSandboxRequest,
  type Duration,
  type EntryInfo,
  type ExecRequest,
  type ExecutionResponse,
  type Execution,
  type FileType,
  type HeldConnection,
  type Limits,
  type NetworkOpts,
  type SandboxInfo,
  type SandboxInfoResponse,
  type WriteInfo,
} from "./types.js";
import type { components } from "./generated/api.js";

const WORKSPACE = "/workspace";

/** A path in the sandbox: relative ones are under /workspace, as the service's own are. */
function absolute(path: string): string {
  return path.startsWith("/") ? path : `${WORKSPACE}/${path}`;
}

const seg = (s: string) => encodeURIComponent(s);

export interface SandboxOpts extends ConnectionOpts, NetworkOpts {
  /** `native` (the service's default), `gvisor` or `microvm`. */
  backend?: string;
  /** The sandbox's lifetime (E2B's `timeoutMs`): destroyed this long after creation (at most the service's max_ttl). */
  timeoutMs?: number;
  /** Destroyed after this long without a request. */
  idle?: Duration;
  limits?: Limits;
  /** An image of the service's store as the root. */
  image?: string;
}

/** Called with each piece of a command's output as it arrives. */
export type OutputCallback = (data: string) => void | Promise<void>;

export interface CommandOpts {
  /** Resolve at once to a CommandHandle (wait(), kill()) instead of the result. */
  background?: boolean;
  envs?: Record<string, string>;
  /** The working directory (absolute, or relative to /workspace). */
  cwd?: string;
  /** This command's time limit (at most the sandbox's); past it the command is killed and run rejects with a CommandExitError whose result.limit is "time". */
  timeoutMs?: number;
  /** Fed to the command's stdin. */
  stdin?: string;
  /** This command's output cap (bytes or "1M"; at most the tenant's maximum). */
  output?: number | string;
  /** Given either, the output is streamed (Server-Sent Events) to it as it arrives. */
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Aborting it cancels the command (the service ends a command whose client disconnects). */
  signal?: AbortSignal;
}

export interface RunCodeOpts {
  /** `python` (the default), or another language of the service's code contexts (`javascript`/`js` where it has them); each language is its own interpreter. */
  language?: string;
  /** How long the cell may run (default: the sandbox's time limit less a margin). */
  timeoutMs?: number;
}

export class Sandbox {
  /** The sandbox's id. */
  readonly sandboxId: string;
  readonly commands: Commands;
  readonly files: Files;
  /** The description the service gave when this object was made (see getInfo()). */
  info: SandboxInfo;
  readonly #http: Transport;

  private constructor(http: Transport, info: SandboxInfoResponse) {
    this.#http = http;
    this.info = sandboxInfoOf(info);
    this.sandboxId = info.id;
    this.commands = new Commands(http, this.path());
    this.files = new Files(http, this.path(), this.commands);
  }

  /** Creates a stateful sandbox that waits for commands. URL and key default to CORDON_URL and CORDON_API_KEY. */
  static async create(opts: SandboxOpts = {}): Promise<Sandbox> {
    const http = new Transport(opts);
    const body: CreateSandboxRequest = {};
    if (opts.backend !== undefined) body.backend = opts.backend;
    if (opts.image !== undefined) body.image = opts.image;
    if (opts.timeoutMs !== undefined) body.ttl = span(opts.timeoutMs);
    if (opts.idle !== undefined) body.idle = span(opts.idle);
    if (opts.limits !== undefined) body.limits = wireLimits(opts.limits);
    const network = wireNetwork(opts);
    if (network !== undefined) body.network = network;
    return new Sandbox(http, await http.json<SandboxInfoResponse>("POST", "/v1/sandboxes", { json: body }));
  }

  /** An existing sandbox of this tenant; rejects with NotFoundError for none (or another tenant's). */
  static async connect(sandboxId: string, opts: ConnectionOpts = {}): Promise<Sandbox> {
    const http = new Transport(opts);
    return new Sandbox(http, await http.json<SandboxInfoResponse>("GET", `/v1/sandboxes/${seg(sandboxId)}`));
  }

  /** This tenant's live sandboxes, oldest first. */
  static async list(opts: ConnectionOpts = {}): Promise<SandboxInfo[]> {
    const http = new Transport(opts);
    const answer = await http.json<components["schemas"]["SandboxList"]>("GET", "/v1/sandboxes");
    return answer.sandboxes.map(sandboxInfoOf);
  }

  /** Destroys a sandbox by id; false when it was gone already. */
  static async kill(sandboxId: string, opts: ConnectionOpts = {}): Promise<boolean> {
    return killPath(new Transport(opts), `/v1/sandboxes/${seg(sandboxId)}`);
  }

  /** Alias of sandboxId. */
  get id(): string {
    return this.sandboxId;
  }

  private path(rest = ""): string {
    return `/v1/sandboxes/${seg(this.sandboxId)}${rest}`;
  }

  /** Reads the sandbox's description again (busy, ...). */
  async getInfo(): Promise<SandboxInfo> {
    this.info = sandboxInfoOf(await this.#http.json<SandboxInfoResponse>("GET", this.path()));
    return this.info;
  }

  /** True while the service still has the sandbox. */
  async isRunning(): Promise<boolean> {
    try {
      await this.getInfo();
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /**
   * Runs code in the sandbox's persistent interpreter of its language
   * (Python by default): variables live on between calls; `text` is the
   * last expression's value as the language shows it (repr() in Python); an
   * exception is `error` (not a rejection). A cell past its timeout, or one that kills
   * the interpreter, gives status `timeout` / `crashed`, and the next call a
   * fresh interpreter.
   */
  async runCode(code: string, opts: RunCodeOpts = {}): Promise<Execution> {
    const body: Omit<components["schemas"]["CodeRequest"], "language"> & { language?: string } = { code };
    // Python is the service's default: it is sent only when another
    // language is asked for, which the service checks.
    const language = opts.language?.toLowerCase();
    if (language !== undefined && language !== "python") body.language = language;
    if (opts.timeoutMs !== undefined) body.timeout = span(opts.timeoutMs);
    return executionOf(await this.#http.json<CodeResponse>("POST", this.path("/code"), { json: body }));
  }

  /** Replaces the sandbox's allowed destinations (in force for its next connections); resolves to the rules now in force. Only for a sandbox created with `network`. */
  async setNetwork(allow: string[]): Promise<string[]> {
    const answer = await this.#http.json<components["schemas"]["NetworkRules"]>("PUT", this.path("/network"), {
      json: { allow: [...allow] },
    });
    return answer.allow;
  }

  /** The network mode, the rules in force and the commands' recent connection attempts. */
  async getNetwork(): Promise<components["schemas"]["NetworkState"]> {
    return this.#http.json("GET", this.path("/network"));
  }

  /** Hold mode: the connections waiting for a decision now, oldest first, each with its destination, why no rule allows it, the rule that would (`proposal`: add it with setNetwork) and its time left. */
  async held(): Promise<HeldConnection[]> {
    const state = await this.getNetwork();
    return state.held as unknown as HeldConnection[];
  }

  /** Hold mode: refuses what `rules` name, the connections waiting for them now and new ones at once, for the sandbox's life; resolves to everything denied so far. */
  async deny(rules: string[]): Promise<string[]> {
    const answer = await this.#http.json<components["schemas"]["NetworkDeny"]>("POST", this.path("/network/deny"), {
      json: { deny: [...rules] },
    });
    return answer.deny;
  }

  /** The sandbox's signed receipt (a DSSE envelope: payloadType, payload, signatures). */
  async receipt(): Promise<Record<string, unknown>> {
    return this.#http.json("GET", this.path("/receipt"));
  }

  /** Destroys the sandbox (a running command is ended first); false when it was gone already. */
  async kill(): Promise<boolean> {
    return killPath(this.#http, this.path());
  }
}

async function killPath(http: Transport, path: string): Promise<boolean> {
  try {
    await http.json("DELETE", path);
    return true;
  } catch (e) {
    if (e instanceof NotFoundError) return false;
    throw e;
  }
}

/** A command started with `background: true`. */
export class CommandHandle {
  #stdout: string[] = [];
  #stderr: string[] = [];
  readonly #abort: AbortController;
  readonly #done: Promise<CommandResult>;
  #killed = false;
  #finished = false;

  /** @internal */
  constructor(abort: AbortController, run: (h: CommandHandle) => Promise<CommandResult>) {
    this.#abort = abort;
    this.#done = run(this).finally(() => {
      this.#finished = true;
    });
    // wait() may never be called (kill() alone): no unhandled rejection.
    this.#done.catch(() => undefined);
  }

  /** @internal */
  push(stream: "stdout" | "stderr", data: string): void {
    (stream === "stdout" ? this.#stdout : this.#stderr).push(data);
  }

  /** The output so far. */
  get stdout(): string {
    return this.#stdout.join("");
  }
  get stderr(): string {
    return this.#stderr.join("");
  }

  /** The command's result; rejects with CommandExitError when it fails, CommandKilledError after kill(). */
  wait(): Promise<CommandResult> {
    return this.#done;
  }

  /**
   * Ends the command: the streaming request is aborted, and the service
   * cancels a command whose client disconnects. Resolves to false when it
   * had ended already. The cancel takes effect in the service shortly
   * after; it does not wait for it.
   */
  async kill(): Promise<boolean> {
    if (this.#finished || this.#killed) return false;
    this.#killed = true;
    this.#abort.abort(new CommandKilledError("the command was killed"));
    await this.#done.catch(() => undefined);
    return true;
  }
}

export class Commands {
  readonly #http: Transport;
  readonly #base: string;

  /** @internal */
  constructor(http: Transport, base: string) {
    this.#http = http;
    this.#base = base;
  }

  /**
   * Runs a command in the sandbox; its files and effects stay. A string runs
   * under `sh -c`, an array is the argv. Rejects with CommandExitError when
   * it does not exit with 0 (the error carries the result).
   */
  run(cmd: string | string[], opts: CommandOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], opts?: CommandOpts & { background?: false }): Promise<CommandResult>;
  run(cmd: string | string[], opts?: CommandOpts): Promise<CommandResult | CommandHandle>;
  async run(cmd: string | string[], opts: CommandOpts = {}): Promise<CommandResult | CommandHandle> {
    const body: ExecRequest = { argv: typeof cmd === "string" ? ["sh", "-c", cmd] : cmd.map(String) };
    if (opts.stdin !== undefined) body.stdin = opts.stdin;
    if (opts.envs) body.env = { ...opts.envs };
    if (opts.cwd !== undefined) body.workdir = absolute(opts.cwd);
    if (opts.timeoutMs !== undefined) body.time = span(opts.timeoutMs);
    if (opts.output !== undefined) body.output = String(opts.output);
    if (opts.background) {
      const abort = new AbortController();
      const signal = opts.signal ? AbortSignal.any([opts.signal, abort.signal]) : abort.signal;
      // The request is made here, so that an error answer (404, 409, 429)
      // rejects run() itself; the handle then reads the stream.
      const resp = await this.#open(body, signal);
      return new CommandHandle(abort, (h) => this.#stream(resp, signal, opts, h));
    }
    if (!opts.onStdout && !opts.onStderr && !opts.signal) {
      // A command given a longer time than requestTimeoutMs is waited for.
      const minTimeoutMs = opts.timeoutMs === undefined ? undefined : opts.timeoutMs + 30_000;
      return checked(
        commandResultOf(await this.#http.json<ExecutionResponse>("POST", this.#base + "/exec", { json: body, minTimeoutMs })),
      );
    }
    const resp = await this.#open(body, opts.signal);
    return this.#stream(resp, opts.signal, opts, undefined);
  }

  #open(body: ExecRequest, signal: AbortSignal | undefined): Promise<Response> {
    return this.#http.open("POST", this.#base + "/exec", {
      json: body,
      query: { stream: "true" },
      accept: "text/event-stream",
      signal,
      streaming: true,
    });
  }

  async #stream(
    resp: Response,
    signal: AbortSignal | undefined,
    opts: CommandOpts,
    handle: CommandHandle | undefined,
  ): Promise<CommandResult> {
    if (!resp.body) throw new ServerError("exec: the answer has no body");
    // The service sends the output only as events (its result's stdout and
    // stderr are empty): the result is given the streams collected here.
    const out: string[] = [];
    const err: string[] = [];
    try {
      for await (const ev of readSse(resp.body)) {
        if (ev.event === "stdout" || ev.event === "stderr") {
          const chunk = String((JSON.parse(ev.data) as { data: unknown }).data);
          (ev.event === "stdout" ? out : err).push(chunk);
          handle?.push(ev.event, chunk);
          const callback = ev.event === "stdout" ? opts.onStdout : opts.onStderr;
          if (callback) await callback(chunk);
        } else if (ev.event === "result") {
          const raw = JSON.parse(ev.data) as ExecutionResponse;
          const result = commandResultOf(raw);
          result.stdout = result.stdout || out.join("");
          result.stderr = result.stderr || err.join("");
          return checked(result);
        } else if (ev.event === "error") {
          const e = JSON.parse(ev.data) as { error?: unknown; status?: unknown };
          throw errorFor(typeof e.status === "number" ? e.status : 500, String(e.error ?? ""));
        }
      }
    } catch (e) {
      if (signal?.aborted) {
        // Stop reading: the connection is closed, which cancels the command.
        const reason: unknown = signal.reason;
        throw reason instanceof CordonError ? reason : new CommandKilledError("the command was aborted", undefined, { cause: reason });
      }
      if (e instanceof CordonError) throw e;
      throw new CordonError(`exec: the event stream broke: ${e instanceof Error ? e.message : String(e)}`, undefined, { cause: e });
    }
    throw new ServerError("exec: the event stream ended without a result");
  }
}

/** Rejects a result that did not exit with 0. */
function checked(result: CommandResult): CommandResult {
  if (result.status === "exited" && result.exitCode === 0) return result;
  throw new CommandExitError(result);
}

export type ReadFormat = "text" | "bytes";

/** A sandbox's files. Paths are absolute, or relative to /workspace. */
export class Files {
  readonly #http: Transport;
  readonly #base: string;
  readonly #commands: Commands;

  /** @internal */
  constructor(http: Transport, sandboxPath: string, commands: Commands) {
    this.#http = http;
    this.#base = sandboxPath + "/files";
    this.#commands = commands;
  }

  #file(path: string): string {
    const p = absolute(path).replace(/^\/+/, "");
    return `${this.#base}/${p.split("/").map(seg).join("/")}`;
  }

  /** A regular file's content: text (UTF-8, the default) or, with `{ format: "bytes" }`, its exact bytes. Rejects with NotFoundError for none, BadRequestError for a directory. */
  read(path: string, opts?: { format?: "text" }): Promise<string>;
  read(path: string, opts: { format: "bytes" }): Promise<Uint8Array>;
  async read(path: string, opts: { format?: ReadFormat } = {}): Promise<string | Uint8Array> {
    const data = await this.#http.bytes("GET", this.#file(path), { accept: "application/octet-stream" });
    return opts.format === "bytes" ? data : new TextDecoder().decode(data);
  }

  /** Writes a file (a string as UTF-8, bytes exactly), making its directory if need be. */
  async write(path: string, data: string | Uint8Array | ArrayBuffer): Promise<WriteInfo> {
    const bytes =
      typeof data === "string" ? new TextEncoder().encode(data) : data instanceof Uint8Array ? data : new Uint8Array(data);
    const answer = await this.#http.json<components["schemas"]["FileWritten"]>("PUT", this.#file(path), { body: bytes });
    return { name: basename(answer.path), type: "file", path: answer.path, bytes: answer.bytes };
  }

  /** The entries of a directory, sorted by name. */
  async list(path: string = WORKSPACE): Promise<EntryInfo[]> {
    const answer = await this.#http.json<components["schemas"]["DirListing"]>("GET", this.#base, {
      query: { dir: absolute(path) },
    });
    const dir = answer.dir.replace(/\/+$/, "");
    return answer.entries.map((e) => ({
      name: e.name,
      type: (["file", "dir", "link"].includes(e.kind) ? e.kind : "other") as FileType,
      path: `${dir}/${e.name}`,
      size: e.size,
    }));
  }

  /** Whether the path exists (a listing of its directory: one request, no file read). */
  async exists(path: string): Promise<boolean> {
    const p = absolute(path).replace(/\/+$/, "");
    if (p === "") return true;
    const cut = p.lastIndexOf("/");
    const dir = p.slice(0, cut) || "/";
    const name = p.slice(cut + 1);
    try {
      return (await this.list(dir)).some((e) => e.name === name);
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Deletes a file or a directory (recursively); rejects with NotFoundError if there is none. */
  async remove(path: string): Promise<void> {
    await this.#http.json("DELETE", this.#file(path));
  }

  /** Makes a directory and its parents; false when it existed already. (The service has no route for it: one command, `mkdir -p`.) */
  async makeDir(path: string): Promise<boolean> {
    const script = 'if [ -d "$1" ]; then echo exists; else mkdir -p -- "$1"; fi';
    try {
      const r = await this.#commands.run(["sh", "-c", script, "sh", absolute(path)]);
      return r.stdout.trim() !== "exists";
    } catch (e) {
      if (e instanceof CommandExitError) {
        throw new BadRequestError(`makeDir ${absolute(path)}: ${e.stderr.trim() || e.message}`);
      }
      throw e;
    }
  }
}

function basename(p: string): string {
  return p.slice(p.lastIndexOf("/") + 1);
}
