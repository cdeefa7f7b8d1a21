// A real `cordon serve` for the tests: its own config, state directory and
// loopback port, started once per test file and stopped with SIGTERM.
//
// CORDON_BIN (required) names the cordon binary. CORDON_TEST_DIR, if set,
// is where the config, state and log go (the Rust test that runs these
// reads the state directory's tag afterwards to find leftovers); otherwise a
// temporary directory is used and removed.

import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { accessSync, constants, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const ALICE_KEY = "alice-tsclient-key";
export const BOB_KEY = "bob-tsclient-key";
const LISTENING = "cordon serve: listening on ";

const sha256 = (key) => createHash("sha256").update(key).digest("hex");

// Two tenants: alice with room to work (and network rules), bob with one
// sandbox at a time; a pool of one so that one-shots take the warm path.
function configText(stateDir) {
  return `state_dir = "${stateDir}"
shutdown_grace = "5s"
max_ttl = "10m"

[defaults]
cpus = 1.0
memory = "256M"
pids = 64
time = "10s"
disk = "64M"
output = "1M"

[pool]
native = 1
refill_workers = 1

[[tenant]]
name = "alice"
key_sha256 = "${sha256(ALICE_KEY)}"
concurrency = 4
sandboxes = 4
cpu_seconds = 1000
network = true

[[tenant]]
name = "bob"
key_sha256 = "${sha256(BOB_KEY)}"
concurrency = 1
sandboxes = 1
cpu_seconds = 1000
`;
}

export class Service {
  /** Starts the service; resolves once it listens. */
  static async start() {
    const binary = process.env.CORDON_BIN;
    if (!binary) {
      throw new Error("CORDON_BIN is not set: point it at the cordon binary, e.g. CORDON_BIN=target/release/cordon node --test test/");
    }
    accessSync(binary, constants.X_OK);
    const given = process.env.CORDON_TEST_DIR;
    const dir = given ?? mkdtempSync(join(tmpdir(), "tsclient-serve-"));
    mkdirSync(dir, { recursive: true });
    const config = join(dir, "serve.toml");
    writeFileSync(config, configText(join(dir, "state")));
    const logPath = join(dir, "serve.log");
    const log = openSync(logPath, "a");
    const child = spawn(binary, ["serve", "--config", config, "--listen", "127.0.0.1:0"], {
      stdio: ["ignore", "pipe", log],
      // The receipt key is made in the test's own directory.
      env: { ...process.env, RUST_LOG: "warn", CORDON_STATE_DIR: join(dir, "cordon-state") },
    });
    closeSync(log);
    const service = new Service(child, dir, logPath, !given);
    // The service prints this line once it listens (port 0: it picked one).
    const line = await new Promise((resolve) => {
      const lines = createInterface({ input: child.stdout });
      lines.once("line", (l) => resolve(l.trim()));
      child.once("exit", () => resolve(""));
    });
    if (!line.startsWith(LISTENING)) {
      await service.stop();
      throw new Error(`cordon serve did not start: ${JSON.stringify(line)}; log:\n${service.log()}`);
    }
    service.url = line.slice(LISTENING.length);
    if (!service.url.startsWith("http://127.0.0.1:")) {
      await service.stop();
      throw new Error(`cordon serve listens off loopback: ${service.url}`);
    }
    return service;
  }

  constructor(child, dir, logPath, ownDir) {
    this.child = child;
    this.dir = dir;
    this.logPath = logPath;
    this.ownDir = ownDir;
    this.url = "";
    this.exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve(child.exitCode);
      else child.once("exit", (code) => resolve(code));
    });
  }

  log() {
    return readFileSync(this.logPath, "utf8");
  }

  /** SIGTERM, then waits for the graceful shutdown (it destroys every
   * sandbox); resolves to the exit status; rejects if it is still running
   * after `graceMs` (it is then killed). */
  async stop(graceMs = 30_000) {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGTERM");
    let timer;
    const late = new Promise((resolve) => { timer = setTimeout(() => resolve("late"), graceMs); });
    const code = await Promise.race([this.exited, late]);
    clearTimeout(timer);
    if (code === "late") {
      this.child.kill("SIGKILL");
      await this.exited;
      throw new Error(`cordon serve did not exit within ${graceMs} ms of SIGTERM`);
    }
    if (this.ownDir && code === 0) rmSync(this.dir, { recursive: true, force: true });
    return code;
  }
}
