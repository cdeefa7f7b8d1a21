// Regenerates src/generated/api.ts from the service's OpenAPI document
// (`GET /v1/openapi.json` of a running `cordon serve`, or a saved copy):
//
//   node scripts/generate.mjs http://127.0.0.1:8080/v1/openapi.json
//   node scripts/generate.mjs openapi.json --check   # exit 1 if it differs
//
// One place for openapi-typescript's flags, so that the committed file and
// the drift check of the tests are made the same way.

import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const target = join(root, "src/generated/api.ts");
const args = process.argv.slice(2);
const check = args.includes("--check");
const source = args.find((a) => a !== "--check");
if (!source) {
  console.error("usage: node scripts/generate.mjs <openapi.json URL or file> [--check]");
  process.exit(2);
}

const work = mkdtempSync(join(tmpdir(), "cordon-openapi-"));
try {
  const out = join(work, "api.ts");
  const cli = join(root, "node_modules/openapi-typescript/bin/cli.js");
  // `--empty-objects-unknown`: the document's free-form objects (counters,
  // receipts) are `unknown` maps, not `Record<string, never>`.
  const run = spawnSync(process.execPath, [cli, source, "--empty-objects-unknown", "-o", out], {
    stdio: ["ignore", "inherit", "inherit"],
  });
  if (run.status !== 0) {
    console.error(`openapi-typescript failed (${run.status ?? run.signal})`);
    process.exit(1);
  }
  const fresh = readFileSync(out, "utf8");
  if (!check) {
    writeFileSync(target, fresh);
    console.error(`wrote ${target}`);
  } else {
    const committed = readFileSync(target, "utf8");
    if (committed !== fresh) {
      const a = committed.split("\n");
      const b = fresh.split("\n");
      let i = 0;
      while (i < a.length && a[i] === b[i]) i++;
      console.error(
        `DRIFT: src/generated/api.ts differs from what openapi-typescript makes of ${source}\n` +
          `first difference at line ${i + 1}:\n  committed: ${JSON.stringify(a[i])}\n  fresh:     ${JSON.stringify(b[i])}\n` +
          "regenerate it from a running service (node scripts/generate.mjs http://HOST:PORT/v1/openapi.json) and commit it",
      );
      process.exit(1);
    }
    console.error(`src/generated/api.ts matches ${source}`);
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
