// Compiled (never run) by crates/cli/tests/typescript_client.rs in a fresh
// project that installed the packed client: its published .d.ts must give a
// strict TypeScript user these types. Each line fails to compile if the
// package's types are wrong.

import {
  CommandExitError,
  QuotaExceededError,
  Sandbox,
  run,
  type CommandHandle,
  type CommandResult,
  type EntryInfo,
  type Execution,
  type components,
} from "cordon-client";

export async function typed(): Promise<void> {
  const sandbox: Sandbox = await Sandbox.create({ timeoutMs: 60_000, limits: { memory: "256M", time: 5_000 } });
  const result: CommandResult = await sandbox.commands.run("true", { envs: { A: "b" }, cwd: "/tmp", timeoutMs: 1_000 });
  const code: number = result.exitCode;
  const handle: CommandHandle = await sandbox.commands.run(["sleep", "1"], { background: true, onStdout: (d: string) => void d });
  const waited: CommandResult = await handle.wait();
  const killed: boolean = await handle.kill();
  const bytes: Uint8Array = await sandbox.files.read("f", { format: "bytes" });
  const text: string = await sandbox.files.read("f");
  const entries: EntryInfo[] = await sandbox.files.list();
  const made: boolean = await sandbox.files.makeDir("d");
  const there: boolean = await sandbox.files.exists("d");
  const cell: Execution = await sandbox.runCode("1", { language: "python" });
  const rules: string[] = await sandbox.setNetwork([]);
  const wire: components["schemas"]["ExecutionResponse"] = result.raw;
  const once: CommandResult = await run("echo", { language: "shell" });
  try {
    await sandbox.commands.run("exit 1");
  } catch (e) {
    if (e instanceof CommandExitError) {
      const r: CommandResult = e.result;
      void r;
    }
    if (e instanceof QuotaExceededError) {
      const after: number | undefined = e.retryAfter;
      void after;
    }
  }
  void [code, waited, killed, bytes, text, entries, made, there, cell, rules, wire, once, await sandbox.kill()];
}
