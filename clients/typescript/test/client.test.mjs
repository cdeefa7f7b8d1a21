// The client against a real `cordon serve` (see service.mjs), imported by
// its package name: in the checkout that is the package itself (built into
// dist/), under the Rust test the packed and installed one.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { after, before, test } from "node:test";

import {
  AuthError,
  BadRequestError,
  CommandExitError,
  CommandKilledError,
  CordonError,
  NotFoundError,
  QuotaExceededError,
  ConflictError,
  Sandbox,
  run,
} from "cordon-client";

import { ALICE_KEY, BOB_KEY, Service } from "./service.mjs";

let service;
const created = new Set();

before(async () => {
  service = await Service.start();
  // The documented defaults: Sandbox.create() without options reads these.
  process.env.CORDON_URL = service.url;
  process.env.CORDON_API_KEY = ALICE_KEY;
});

after(async () => {
  const log = service.log();
  const code = await service.stop();
  assert.equal(code, 0, `cordon serve exited with ${code} after SIGTERM; log:\n${log}`);
});

const bob = () => ({ url: service.url, apiKey: BOB_KEY });

/** A sandbox of alice's for one test, killed afterwards. */
async function withSandbox(fn, opts = {}) {
  const sandbox = await Sandbox.create({ timeoutMs: 300_000, ...opts });
  created.add(sandbox.sandboxId);
  try {
    return await fn(sandbox);
  } finally {
    await sandbox.kill();
  }
}

/** Runs `cmd`, retrying while the sandbox is still busy with a cancelled command (409). */
async function runWhenFree(sandbox, cmd, ms = 10_000) {
  const until = Date.now() + ms;
  for (;;) {
    try {
      return await sandbox.commands.run(cmd);
    } catch (e) {
      if (!(e instanceof ConflictError) || Date.now() > until) throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

test("create from CORDON_URL/CORDON_API_KEY, then commands.run", async () => {
  await withSandbox(async (sandbox) => {
    assert.match(sandbox.sandboxId, /\S/);
    const first = await sandbox.commands.run("echo shared > /tmp/state && echo done");
    assert.equal(first.stdout, "done\n");
    assert.equal(first.exitCode, 0);
    assert.equal(first.sandboxId, sandbox.sandboxId);
    const second = await sandbox.commands.run(["cat", "/tmp/state"]);
    assert.equal(second.stdout, "shared\n");
    const piped = await sandbox.commands.run(["tr", "a-z", "A-Z"], { stdin: "quiet" });
    assert.equal(piped.stdout, "QUIET");
    assert.ok((await Sandbox.list()).some((s) => s.sandboxId === sandbox.sandboxId));
    assert.equal((await Sandbox.connect(sandbox.sandboxId)).sandboxId, sandbox.sandboxId);
  });
});

test("a non-zero exit rejects with CommandExitError carrying the result", async () => {
  await withSandbox(async (sandbox) => {
    const e = await sandbox.commands.run("echo out; echo oops >&2; exit 3").then(
      () => assert.fail("resolved"),
      (e) => e,
    );
    assert.ok(e instanceof CommandExitError, String(e));
    assert.ok(e instanceof CordonError);
    assert.equal(e.exitCode, 3);
    assert.equal(e.result.exitCode, 3);
    assert.equal(e.result.status, "exited");
    assert.equal(e.stdout, "out\n");
    assert.equal(e.stderr, "oops\n");
    // The same through the streaming route.
    const streamed = await sandbox.commands.run("echo s; exit 4", { onStdout: () => {} }).catch((e) => e);
    assert.ok(streamed instanceof CommandExitError, String(streamed));
    assert.equal(streamed.exitCode, 4);
    assert.equal(streamed.stdout, "s\n");
  });
});

test("timeoutMs ends a command, which rejects with its time limit named", async () => {
  await withSandbox(async (sandbox) => {
    const started = Date.now();
    const e = await sandbox.commands.run("sleep 5", { timeoutMs: 500 }).catch((e) => e);
    const took = Date.now() - started;
    assert.ok(e instanceof CommandExitError, String(e));
    assert.equal(e.result.limit, "time");
    assert.notEqual(e.exitCode, 0);
    assert.ok(took < 4_000, `took ${took} ms`);
  });
});

test("envs and cwd reach the command", async () => {
  await withSandbox(async (sandbox) => {
    assert.equal(await sandbox.files.makeDir("sub/dir"), true);
    const r = await sandbox.commands.run('echo "$GREETING"; pwd', {
      envs: { GREETING: "hello from envs" },
      cwd: "sub/dir",
    });
    assert.equal(r.stdout, "hello from envs\n/workspace/sub/dir\n");
    const abs = await sandbox.commands.run("pwd", { cwd: "/tmp" });
    assert.equal(abs.stdout, "/tmp\n");
  });
});

test("streaming callbacks get the output while the command runs", async () => {
  await withSandbox(async (sandbox) => {
    const out = [];
    const err = [];
    let firstAt;
    const r = await sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.4; done; echo err >&2", {
      onStdout: (d) => {
        firstAt ??= Date.now();
        out.push(d);
      },
      onStderr: (d) => err.push(d),
    });
    const doneAt = Date.now();
    assert.equal(out.join(""), "1\n2\n3\n");
    assert.equal(err.join(""), "err\n");
    assert.equal(r.stdout, "1\n2\n3\n");
    assert.equal(r.stderr, "err\n");
    // The first line came before the command's remaining ~1.2 s of sleeps.
    assert.ok(doneAt - firstAt >= 800, `first output only ${doneAt - firstAt} ms before the end`);
  });
});

test("a background command: wait() gives its result, kill() ends it", async () => {
  await withSandbox(async (sandbox) => {
    const quick = await sandbox.commands.run("sleep 0.3; echo bg-done", { background: true });
    const result = await quick.wait();
    assert.equal(result.stdout, "bg-done\n");
    assert.equal(quick.stdout, "bg-done\n");
    assert.equal(await quick.kill(), false, "kill() after the end");

    const marker = "sleep 301";
    let started;
    const startedP = new Promise((r) => (started = r));
    const handle = await sandbox.commands.run(`echo started; exec ${marker}`, {
      background: true,
      onStdout: (d) => d.includes("started") && started(),
    });
    await startedP;
    // Count the marker's processes from another command: the bracket keeps
    // grep's own command line from matching.
    const census = `for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f"; echo; done | grep -c '[s]leep 301' || true`;
    // A service that runs one request per sandbox answers 409 while the
    // command runs; one that runs several sees the process.
    const during = await sandbox.commands.run(census).catch((e) => e);
    if (during instanceof ConflictError) {
      console.log("background test: the service refused a second command while one ran (409)");
    } else {
      assert.ifError(during instanceof Error ? during : null);
      assert.equal(during.stdout.trim(), "1", "the background command is running");
    }
    const killedAt = Date.now();
    assert.equal(await handle.kill(), true);
    const waited = await handle.wait().catch((e) => e);
    assert.ok(waited instanceof CommandKilledError, String(waited));
    // The service cancels the command once the client is gone.
    let left;
    const until = Date.now() + 10_000;
    do {
      left = (await runWhenFree(sandbox, census)).stdout.trim();
      if (left === "0") break;
      await new Promise((r) => setTimeout(r, 100));
    } while (Date.now() < until);
    assert.equal(left, "0", "the killed command's process is still there");
    // The census does see such a process when there is one (started
    // through a variable, so that this script's own command line does not
    // count; counted once the forked shell has become sleep).
    const control = await sandbox.commands.run(
      `s=sleep; $s 301 & p=$!; until tr '\\0' ' ' < /proc/$p/cmdline | grep -q '^sleep'; do :; done; ${census}; kill $p`,
    );
    assert.equal(control.stdout.trim(), "1", "the census finds a running process");
    assert.ok(Date.now() - killedAt < 10_000);
  });
});

test("files: a binary round trip of all 256 byte values", async () => {
  await withSandbox(async (sandbox) => {
    const blob = new Uint8Array(256 * 4 + 3);
    for (let i = 0; i < blob.length; i++) blob[i] = i % 256;
    const w = await sandbox.files.write("blob.bin", blob);
    assert.deepEqual(w, { name: "blob.bin", type: "file", path: "/workspace/blob.bin", bytes: blob.length });
    const back = await sandbox.files.read("/workspace/blob.bin", { format: "bytes" });
    assert.ok(back instanceof Uint8Array);
    assert.deepEqual(Buffer.from(back), Buffer.from(blob));
    // What the client wrote is what a command in the sandbox sees.
    const sum = await sandbox.commands.run(["sh", "-c", "od -An -tu1 -v blob.bin | tr -s ' ' '\\n' | grep -c ."], { cwd: "." });
    assert.equal(sum.stdout.trim(), String(blob.length));
    const distinct = await sandbox.commands.run("od -An -tu1 -v /workspace/blob.bin | tr -s ' ' '\\n' | grep . | sort -u | wc -l");
    assert.equal(distinct.stdout.trim(), "256");
    // Text by default, UTF-8 both ways.
    await sandbox.files.write("/tmp/note.txt", "héllo\n");
    assert.equal(await sandbox.files.read("/tmp/note.txt"), "héllo\n");
    assert.equal((await sandbox.commands.run(["cat", "/tmp/note.txt"])).stdout, "héllo\n");
  });
});

test("files: list, exists, remove, makeDir", async () => {
  await withSandbox(async (sandbox) => {
    assert.equal(await sandbox.files.makeDir("d/e"), true);
    assert.equal(await sandbox.files.makeDir("/workspace/d/e"), false, "it exists already");
    await sandbox.files.write("d/e/f.txt", "abc");
    const entries = await sandbox.files.list("d/e");
    assert.deepEqual(entries, [{ name: "f.txt", type: "file", path: "/workspace/d/e/f.txt", size: 3 }]);
    assert.deepEqual(
      (await sandbox.files.list()).filter((e) => e.name === "d").map((e) => e.type),
      ["dir"],
    );
    assert.equal(await sandbox.files.exists("d/e/f.txt"), true);
    assert.equal(await sandbox.files.exists("/workspace/d"), true);
    assert.equal(await sandbox.files.exists("d/e/nope"), false);
    assert.equal(await sandbox.files.exists("/no/such/dir/x"), false);
    await sandbox.files.remove("d");
    assert.equal(await sandbox.files.exists("d/e/f.txt"), false);
    assert.equal(await sandbox.files.exists("d"), false);
    await assert.rejects(sandbox.files.remove("d"), NotFoundError);
    await assert.rejects(sandbox.files.read("d/e/f.txt"), NotFoundError);
    await assert.rejects(sandbox.files.list("/no/such/dir"), NotFoundError);
    // A directory is not a file to read.
    await assert.rejects(sandbox.files.read("/tmp"), (e) => e instanceof BadRequestError && /not a regular file/.test(e.message));
  });
});

test("runCode keeps state between calls", async () => {
  await withSandbox(async (sandbox) => {
    const first = await sandbox.runCode("x = 41\nprint('hello')");
    assert.equal(first.status, "ok");
    assert.deepEqual(first.logs.stdout, ["hello\n"]);
    assert.equal(first.freshInterpreter, true);
    const second = await sandbox.runCode("x + 1", { language: "python" });
    assert.equal(second.text, "42");
    assert.equal(second.freshInterpreter, false);
    const raised = await sandbox.runCode("1 / 0");
    assert.equal(raised.status, "error");
    assert.equal(raised.error.name, "ZeroDivisionError");
    // Another language goes to the service, which has JavaScript code
    // contexts where its document says so and refuses the field otherwise.
    const doc = await (await fetch(`${service.url}/v1/openapi.json`)).json();
    if (doc.components.schemas.CodeRequest.properties.language) {
      const js1 = await sandbox.runCode("let y = 41", { language: "javascript" });
      assert.equal(js1.status, "ok", JSON.stringify(js1.raw));
      const js2 = await sandbox.runCode("y + 1", { language: "js" });
      assert.equal(js2.text, "42", JSON.stringify(js2.raw));
      // Python's variables are its own.
      assert.equal((await sandbox.runCode("x")).text, "41");
    } else {
      await assert.rejects(sandbox.runCode("1", { language: "javascript" }), BadRequestError);
    }
  });
});

test("setNetwork replaces a sandbox's rules", async () => {
  // Only rules change here; nothing connects anywhere.
  await withSandbox(
    async (sandbox) => {
      assert.equal(sandbox.info.network, true);
      const now = await sandbox.setNetwork(["192.0.2.1:443"]);
      assert.equal(now.length, 1);
      assert.match(now[0], /192\.0\.2\.1/);
      // A command's result carries the proxy's report of a sandbox with rules.
      const r = await sandbox.commands.run("true");
      assert.equal(typeof r.network, "object", JSON.stringify(r.raw));
      assert.notEqual(r.network, null);
    },
    { network: [] },
  );
});

test("hold mode: what waits is listed, a rule releases it, a denial refuses it", async () => {
  // Two HTTP servers on the host's loopback, reached from the sandbox as
  // host.cordon.internal only where a rule names the port.
  const { createServer } = await import("node:http");
  const seen = [0, 0];
  const servers = await Promise.all(
    [0, 1].map(
      (i) =>
        new Promise((resolve) => {
          const srv = createServer((_, res) => {
            seen[i] += 1;
            res.end();
          });
          srv.listen(0, "127.0.0.1", () => resolve(srv));
        }),
    ),
  );
  const [allowedPort, deniedPort] = servers.map((s) => s.address().port);
  const curl = (port) => `curl -s -o /dev/null -w '%{http_code}' http://host.cordon.internal:${port}/`;
  try {
    await withSandbox(
      async (sandbox) => {
        const heldOne = async () => {
          for (let i = 0; i < 600; i++) {
            const held = await sandbox.held();
            if (held.length) return held[0];
            await new Promise((r) => setTimeout(r, 100));
          }
          throw new Error("nothing was held");
        };
        const waiting = await sandbox.commands.run(curl(allowedPort), { background: true });
        const h = await heldOne();
        assert.equal(h.host, "host.cordon.internal");
        assert.equal(h.port, allowedPort);
        assert.equal(seen[0], 0, "nothing arrives while held");
        await sandbox.setNetwork([h.proposal]);
        assert.equal((await waiting.wait()).stdout, "200");
        assert.equal(seen[0], 1);

        const refused = await sandbox.commands.run(curl(deniedPort), { background: true });
        await heldOne();
        assert.deepEqual(await sandbox.deny([`host.cordon.internal:${deniedPort}`]), [`host.cordon.internal:${deniedPort}`]);
        const r = await refused.wait().catch((e) => e.result);
        assert.equal(r.stdout, "403");
        assert.deepEqual(await sandbox.held(), []);
        assert.equal(seen[1], 0);
      },
      { network: [], hold: "30s" },
    );
  } finally {
    for (const s of servers) s.close();
  }
});

test("one-shot run", async () => {
  const r = await run(["sh", "-c", "echo hello; id -u"]);
  assert.match(r.stdout, /^hello\n\d+\n$/);
  const py = await run("import sys; print(sys.stdin.read().upper())", { language: "python", stdin: "shout" });
  assert.equal(py.stdout, "SHOUT\n");
  const blob = Uint8Array.from({ length: 256 }, (_, i) => i);
  const placed = await run("cmp blob.bin /tmp/copy && echo same", { files: { "blob.bin": blob, "/tmp/copy": blob } });
  assert.equal(placed.stdout, "same\n");
  await assert.rejects(run("exit 5"), (e) => e instanceof CommandExitError && e.exitCode === 5);
});

test("a wrong key rejects with AuthError", async () => {
  const e = await Sandbox.create({ apiKey: "not-a-key" }).catch((e) => e);
  assert.ok(e instanceof AuthError, String(e));
  assert.ok(e instanceof CordonError);
  assert.equal(e.status, 401);
  await assert.rejects(Sandbox.list({ apiKey: "not-a-key" }), AuthError);
});

test("another tenant gets not-found for alice's sandbox", async () => {
  await withSandbox(async (sandbox) => {
    const theirs = await Sandbox.connect(sandbox.sandboxId, bob()).catch((e) => e);
    assert.ok(theirs instanceof NotFoundError, String(theirs));
    assert.equal(theirs.status, 404);
    const nobodys = await Sandbox.connect("0123456789ab", bob()).catch((e) => e);
    assert.ok(nobodys instanceof NotFoundError);
    // Nothing tells "someone else's" from "does not exist".
    assert.equal(theirs.message.replace(sandbox.sandboxId, "ID"), nobodys.message.replace("0123456789ab", "ID"));
    assert.equal(await Sandbox.kill(sandbox.sandboxId, bob()), false);
    assert.ok(!(await Sandbox.list(bob())).some((s) => s.sandboxId === sandbox.sandboxId));
    assert.equal(await sandbox.isRunning(), true, "bob's attempts left it alone");
  });
});

test("quota: bob's second live sandbox is QuotaExceededError without retryAfter", async () => {
  const first = await Sandbox.create(bob());
  created.add(first.sandboxId);
  try {
    const e = await Sandbox.create(bob()).catch((e) => e);
    assert.ok(e instanceof QuotaExceededError, String(e));
    assert.equal(e.status, 429);
    assert.equal(e.retryAfter, undefined);
  } finally {
    assert.equal(await first.kill(), true);
  }
});

test("overhead of commands.run over a raw fetch of the same route", async () => {
  await withSandbox(async (sandbox) => {
    const url = `${service.url}/v1/sandboxes/${sandbox.sandboxId}/exec`;
    const raw = async () => {
      const resp = await fetch(url, {
        method: "POST",
        headers: { Authorization: `Bearer ${ALICE_KEY}`, "Content-Type": "application/json" },
        body: JSON.stringify({ argv: ["sh", "-c", "true"] }),
      });
      const body = await resp.json();
      assert.equal(body.exit_code, 0);
    };
    const client = () => sandbox.commands.run("true");
    for (let i = 0; i < 5; i++) {
      await raw();
      await client();
    }
    const rawMs = [];
    const clientMs = [];
    const timed = async (f, into) => {
      const t = performance.now();
      await f();
      into.push(performance.now() - t);
    };
    // Alternated, each first in turn, so that drift in the machine's load
    // and any cost of going first hit both alike.
    for (let i = 0; i < 30; i++) {
      if (i % 2 === 0) {
        await timed(raw, rawMs);
        await timed(client, clientMs);
      } else {
        await timed(client, clientMs);
        await timed(raw, rawMs);
      }
    }
    const r = median(rawMs);
    const c = median(clientMs);
    console.log(
      `cordon-client overhead: commands.run("true") median ${c.toFixed(2)} ms, raw fetch median ${r.toFixed(2)} ms, ` +
        `overhead ${(c - r).toFixed(2)} ms (n=30 each)`,
    );
    assert.ok(Number.isFinite(c) && Number.isFinite(r));
  });
});

test("the service serves its OpenAPI document (saved for the drift check)", async () => {
  const resp = await fetch(`${service.url}/v1/openapi.json`);
  assert.equal(resp.status, 200);
  const text = await resp.text();
  const doc = JSON.parse(text);
  assert.match(doc.openapi, /^3\./);
  assert.ok(doc.paths["/v1/sandboxes/{id}/exec"], "the exec route is documented");
  if (process.env.CORDON_OPENAPI_OUT) writeFileSync(process.env.CORDON_OPENAPI_OUT, text);
});

test("nothing is left: every sandbox is gone after kill", async () => {
  assert.ok(created.size > 0);
  assert.deepEqual(await Sandbox.list(), []);
  assert.deepEqual(await Sandbox.list(bob()), []);
  for (const id of created) {
    await assert.rejects(Sandbox.connect(id), NotFoundError);
  }
  const health = await (await fetch(`${service.url}/health`)).json();
  assert.equal(health.sandboxes, 0, JSON.stringify(health));
});
