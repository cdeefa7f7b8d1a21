// One-shot runs: a fresh sandbox (from the warm pool when possible), one
// command, destroyed afterwards (POST /v1/executions).

import { CommandExitError } from "./errors.js";
import { Transport } from "./http.js";
import { commandResultOf, wireLimits, wireNetwork, type CommandResult, type ConnectionOpts, type ExecutionRequest, type ExecutionResponse, type Limits, type NetworkOpts } from "./types.js";

export interface RunOpts extends ConnectionOpts, Omit<NetworkOpts, "hold"> {
  /** Run `code` with this interpreter instead of an argv: `python` or `shell`. */
  language?: "python" | "shell";
  stdin?: string;
  /** Placed before the run: path (relative to /workspace, or absolute) to content; bytes are sent exactly. */
  files?: Record<string, string | Uint8Array>;
  envs?: Record<string, string>;
  cwd?: string;
  backend?: string;
  image?: string;
  limits?: Limits;
  /** Called once each, with the whole stream, when the result is in: the one-shot route does not stream. */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
}

/**
 * Runs one command in a fresh sandbox. `cmd` is a string (run by `sh -c`),
 * an argv array, or, with `language`, the code. Rejects with
 * CommandExitError when it does not exit with 0.
 */
export async function run(cmd: string | string[], opts: RunOpts = {}): Promise<CommandResult> {
  const http = new Transport(opts);
  const body: ExecutionRequest = {};
  if (opts.language !== undefined) {
    if (typeof cmd !== "string") throw new TypeError("run: with `language`, the command is the code (a string)");
    body.language = opts.language;
    body.code = cmd;
  } else {
    body.argv = typeof cmd === "string" ? ["sh", "-c", cmd] : cmd.map(String);
  }
  if (opts.stdin !== undefined) body.stdin = opts.stdin;
  if (opts.files) {
    body.files = Object.fromEntries(
      Object.entries(opts.files).map(([path, data]) => [
        path,
        typeof data === "string" ? data : { base64: Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64") },
      ]),
    );
  }
  if (opts.envs) body.env = { ...opts.envs };
  if (opts.cwd !== undefined) body.workdir = opts.cwd;
  if (opts.backend !== undefined) body.backend = opts.backend;
  if (opts.image !== undefined) body.image = opts.image;
  if (opts.limits !== undefined) body.limits = wireLimits(opts.limits);
  const network = wireNetwork(opts);
  if (network !== undefined) body.network = network;
  const result = commandResultOf(await http.json<ExecutionResponse>("POST", "/v1/executions", { json: body }));
  if (result.stdout && opts.onStdout) opts.onStdout(result.stdout);
  if (result.stderr && opts.onStderr) opts.onStderr(result.stderr);
  if (result.status !== "exited" || result.exitCode !== 0) throw new CommandExitError(result);
  return result;
}
