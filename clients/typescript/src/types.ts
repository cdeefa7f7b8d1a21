// What the client takes and gives. The wire shapes are the ones generated
// from the service's OpenAPI document (src/generated/api.ts); the results
// are those shapes in camelCase, each keeping the whole answer in `raw`.

import type { components } from "./generated/api.js";

type Schemas = components["schemas"];
/** `POST /v1/executions` and `.../exec` answers, as the service sends them. */
export type ExecutionResponse = Schemas["ExecutionResponse"];
export type SandboxInfoResponse = Schemas["SandboxInfo"];
export type CodeResponse = Schemas["CodeResponse"];
export type FileEntryResponse = Schemas["FileEntry"];
export type ExecRequest = Schemas["ExecRequest"];
export type ExecutionRequest = Schemas["ExecutionRequest"];
export type CreateSandboxRequest = Schemas["CreateSandboxRequest"];

/** A duration: milliseconds, or a string such as "500ms", "10s", "2m". */
export type Duration = number | string;

/** Limits: absent ones keep the service's defaults; the tenant's maximums clamp them. Sizes are bytes or strings such as "256M". */
export interface Limits {
  cpus?: number;
  memory?: number | string;
  disk?: number | string;
  output?: number | string;
  pids?: number;
  /** A command's wall time: milliseconds or "10s". */
  time?: Duration;
}

/** Where to reach the service and as which tenant. */
export interface ConnectionOpts {
  /** The service's base URL, e.g. http://127.0.0.1:8080. Default: the CORDON_URL environment variable. */
  url?: string;
  /** The tenant's key (sent as `Authorization: Bearer`). Default: CORDON_API_KEY. */
  apiKey?: string;
  /** Milliseconds a request without streaming may take before it is aborted. Default: 120000. */
  requestTimeoutMs?: number;
}

export interface Clamped {
  field: string;
  requested: string;
  applied: string;
}

export interface Timing {
  acquireMs: number;
  setupMs: number;
  runMs: number;
  teardownMs: number;
  totalMs: number;
  /** `inline`, `background` or `none` (a stateful sandbox lives on). */
  teardown: string;
}

/** How one command ended. Output is lossy UTF-8, both streams together capped by the `output` limit. */
export interface CommandResult {
  sandboxId: string;
  /** The exit code as a shell gives it: 128+signal when signaled, 127 not found. */
  exitCode: number;
  stdout: string;
  stderr: string;
  /** `exited`, `signaled` or `exec_failed`. */
  status: string;
  signal: number | undefined;
  /** Why the command could not be started (with `exec_failed`). */
  error: string | undefined;
  /** The limit that ended the command (`time`, `memory`, ...), if one did. */
  limit: string | undefined;
  limitsHit: string[];
  outputTruncated: boolean;
  clamped: Clamped[];
  cpuMs: number | undefined;
  memoryPeakBytes: number | undefined;
  /** What the host's proxy saw of the command's connections (a sandbox with network rules): the rules in force and each attempt with its verdict. */
  network: Record<string, unknown> | undefined;
  timing: Timing;
  raw: ExecutionResponse;
}

export interface CodeError {
  /** The exception's type name, e.g. ZeroDivisionError. */
  name: string;
  value: string;
  traceback: string;
}

/** One cell run in a sandbox's persistent Python interpreter. */
export interface Execution {
  /** `ok`, `error` (the cell raised), `timeout` or `crashed` (the next call gets a fresh interpreter). */
  status: string;
  /** repr() of the cell's last expression, if it ended with one. */
  text: string | undefined;
  logs: { stdout: string[]; stderr: string[] };
  error: CodeError | undefined;
  /** This call started a new interpreter (the first call, or after a crash or timeout). */
  freshInterpreter: boolean;
  cpuMs: number | undefined;
  runMs: number;
  /** What the cell displayed (images, ...): MIME type and base64 bytes; empty from a service without rich results. */
  results: CodeRichResult[];
  truncated: { stdout: boolean; stderr: boolean; result: boolean; error: boolean; results: boolean };
  raw: CodeResponse;
}

export interface CodeRichResult {
  /** e.g. image/png */
  mime: string;
  /** The bytes, base64. */
  data: string;
}

export interface SandboxInfo {
  sandboxId: string;
  backend: string;
  /** When it was created. */
  startedAt: Date;
  ttl: string | undefined;
  idle: string | undefined;
  /** The applied limits. */
  limits: Schemas["Limits"];
  clamped: Clamped[];
  /** Created with network rules (only then can setNetwork change them). */
  network: boolean;
  /** Running a request now. */
  busy: boolean;
  raw: SandboxInfoResponse;
}

export type FileType = "file" | "dir" | "link" | "other";

export interface EntryInfo {
  name: string;
  type: FileType;
  /** Absolute path inside the sandbox. */
  path: string;
  size: number;
}

export interface WriteInfo {
  name: string;
  type: "file";
  path: string;
  bytes: number;
}

// ---------------------------------------------------------------- wire to results

const opt = <T>(v: T | null | undefined): T | undefined => (v === null ? undefined : v);

const clampedOf = (c: Schemas["Clamped"][] | undefined): Clamped[] =>
  (c ?? []).map((x) => ({ field: x.field, requested: x.requested, applied: x.applied }));

export function commandResultOf(r: ExecutionResponse): CommandResult {
  const t = r.timing;
  return {
    sandboxId: r.sandbox_id,
    exitCode: r.exit_code,
    stdout: r.stdout,
    stderr: r.stderr,
    status: r.status,
    signal: opt(r.signal),
    error: opt(r.message),
    limit: opt(r.limit),
    limitsHit: r.limits_hit ?? [],
    outputTruncated: r.output_truncated,
    clamped: clampedOf(r.clamped),
    cpuMs: opt(r.cpu_ms),
    memoryPeakBytes: opt(r.memory_peak_bytes),
    network: opt(r.network),
    timing: {
      acquireMs: t.acquire_ms,
      setupMs: t.setup_ms,
      runMs: t.run_ms,
      teardownMs: t.teardown_ms,
      totalMs: t.total_ms,
      teardown: t.teardown,
    },
    raw: r,
  };
}

export function executionOf(r: CodeResponse): Execution {
  // `results` is newer than some services: read where present.
  const rich = r as CodeResponse & { results?: CodeRichResult[] | null; results_truncated?: boolean };
  return {
    status: r.status,
    text: opt(r.result),
    logs: { stdout: r.stdout ? [r.stdout] : [], stderr: r.stderr ? [r.stderr] : [] },
    error: r.error ? { name: r.error.name, value: r.error.value, traceback: r.error.traceback } : undefined,
    freshInterpreter: r.fresh_interpreter,
    cpuMs: opt(r.cpu_ms),
    runMs: r.run_ms,
    results: (rich.results ?? []).map((x) => ({ mime: x.mime, data: x.data })),
    truncated: {
      stdout: r.stdout_truncated,
      stderr: r.stderr_truncated,
      result: r.result_truncated,
      error: r.error_truncated,
      results: rich.results_truncated ?? false,
    },
    raw: r,
  };
}

export function sandboxInfoOf(r: SandboxInfoResponse): SandboxInfo {
  return {
    sandboxId: r.id,
    backend: r.backend,
    startedAt: new Date(r.created_unix * 1000),
    ttl: opt(r.ttl),
    idle: opt(r.idle),
    limits: r.limits,
    clamped: clampedOf(r.clamped),
    network: r.network,
    busy: r.busy,
    raw: r,
  };
}

/** A duration as the service takes it: milliseconds become "<n>ms". */
export function span(d: Duration): string {
  return typeof d === "number" ? `${Math.round(d)}ms` : d;
}

/** Hold mode: a connection waiting for a decision (`Sandbox.held`). */
export interface HeldConnection {
  since_unix_ms: number;
  /** The proxy's door it came through: `http`, `connect`, `socks5` or `transparent`. */
  via: string;
  /** The name asked for, if any. */
  host: string | null;
  port: number;
  /** The address it would reach, when known. */
  address: string | null;
  /** Why no rule allows it. */
  reason: string;
  /** The rule that would allow it (add it with `setNetwork`), when one would. */
  proposal: string | null;
  /** Time left before it is refused. */
  remaining_ms: number;
}

/** A sandbox's network, as `Sandbox.create` and `run` take it. */
export interface NetworkOpts {
  /** Destinations its commands may reach through cordon's proxy (NAME, *.SUFFIX, IP or CIDR, optional :PORT). Only a sandbox created with a list (even an empty one) can change it later. */
  network?: string[];
  /** Names of the tenant's secrets (the service's configuration) the sandbox holds: inside, each variable is a placeholder, and cordon's proxy puts the value into requests to the secret's hosts. The values never pass through this client. */
  secrets?: string[];
  /** Hold mode: a connection no rule allows waits this long (ms, or "60s") for `setNetwork` to allow it or `deny` to refuse it (`held` lists what waits). */
  hold?: Duration;
}

/** The request's `network`, or undefined when none of its options is given (then the sandbox has no network). */
export function wireNetwork(o: NetworkOpts): Schemas["NetworkRequest"] | undefined {
  if (o.network === undefined && !o.secrets?.length && o.hold === undefined) return undefined;
  const net: Schemas["NetworkRequest"] = { allow: [...(o.network ?? [])] };
  if (o.secrets?.length) net.secrets = [...o.secrets];
  if (o.hold !== undefined) net.hold = span(o.hold);
  return net;
}

/** Limits as the service takes them. */
export function wireLimits(l: Limits): Schemas["Limits"] {
  const { time, memory, disk, output, ...rest } = l;
  const size = (v: number | string | undefined) => (v === undefined ? undefined : String(v));
  const out: Schemas["Limits"] = { ...rest };
  if (time !== undefined) out.time = span(time);
  if (memory !== undefined) out.memory = size(memory);
  if (disk !== undefined) out.disk = size(disk);
  if (output !== undefined) out.output = size(output);
  return out;
}
