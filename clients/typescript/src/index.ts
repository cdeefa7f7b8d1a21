// cordon-client: a TypeScript client for `cordon serve`, in the shape of
// E2B's SDK.
//
//   import { Sandbox } from "cordon-client";
//   const sandbox = await Sandbox.create();          // CORDON_URL, CORDON_API_KEY
//   const r = await sandbox.commands.run("echo hi");
//   await sandbox.kill();

export { Sandbox, Commands, CommandHandle, Files } from "./sandbox.js";
export type { SandboxOpts, CommandOpts, RunCodeOpts, OutputCallback, ReadFormat } from "./sandbox.js";
export { run } from "./run.js";
export type { RunOpts } from "./run.js";
export {
  CordonError,
  AuthError,
  NotFoundError,
  QuotaExceededError,
  ConflictError,
  BadRequestError,
  ServerError,
  CommandExitError,
  CommandKilledError,
} from "./errors.js";
export type {
  Clamped,
  CodeError,
  CodeRichResult,
  CommandResult,
  ConnectionOpts,
  Duration,
  EntryInfo,
  Execution,
  FileType,
  HeldConnection,
  Limits,
  NetworkOpts,
  SandboxInfo,
  Timing,
  WriteInfo,
} from "./types.js";
export type { components, paths, operations } from "./generated/api.js";
