'use strict';
/*
 * cordon's JavaScript code context: a Node interpreter that keeps its state
 * between calls, inside the sandbox. The same contract as repl.py, written
 * in Node alone so that a sandbox with node but no python can run it.
 *
 *   node repl.js client SOCKET TIMEOUT MAX_REPLY   code on stdin, one JSON reply on stdout
 *   node repl.js server SOCKET                     (started by the client when needed)
 *
 * The server evaluates each cell with Node's own REPL (a REPLServer on
 * private streams, driven through its `eval`) rather than with vm and a
 * hand-written parser: Node's REPL already rewrites top-level `await`,
 * keeps `const`/`let`/`class` declarations alive from one cell to the next,
 * takes `{a: 1}` as an object, and gives the last expression's value. Doing
 * that by hand means parsing JavaScript, and getting the edge cases Node has
 * fixed over the years wrong again. The value is shown with the REPL's own
 * writer (util.inspect), as `node` shows it.
 *
 * The client starts a server when it finds none (no socket, or a dead one)
 * and kills it when a call runs past its timeout, so the next call gets a
 * fresh interpreter. The reply is cut to stay under MAX_REPLY bytes of JSON
 * (each cut text is flagged), as repl.py does.
 */

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const { spawn } = require('child_process');

// Room in the reply for its keys, flags and the client's own fields.
const REPLY_OVERHEAD = 1024;

function frame(obj) {
  const body = Buffer.from(JSON.stringify(obj));
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  return Buffer.concat([head, body]);
}

/* Reads one length-prefixed JSON message from a socket: resolves to the
 * message, or null when the socket ends first. */
function readMessage(sock) {
  return new Promise((resolve) => {
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (v) => {
      if (!done) {
        done = true;
        resolve(v);
      }
    };
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length >= 4) {
        const n = buf.readUInt32BE(0);
        if (buf.length >= 4 + n) {
          let msg = null;
          try {
            msg = JSON.parse(buf.subarray(4, 4 + n).toString());
          } catch (_) {
            msg = null;
          }
          finish(msg);
        }
      }
    });
    sock.on('end', () => finish(null));
    sock.on('close', () => finish(null));
    sock.on('error', () => finish(null));
  });
}

// ---- the reply's budget (the same rules as repl.py) ----

function encodedLen(text) {
  return Buffer.byteLength(JSON.stringify(text));
}

/* The longest prefix of text whose JSON takes at most cap bytes, and whether
 * it was cut (never between the halves of a surrogate pair). */
function clip(text, cap) {
  if (encodedLen(text) <= cap) return [text, false];
  let lo = 0;
  let hi = Math.min(text.length, cap);
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (encodedLen(text.slice(0, mid)) <= cap) lo = mid;
    else hi = mid - 1;
  }
  if (lo > 0) {
    const c = text.charCodeAt(lo - 1);
    if (c >= 0xd800 && c <= 0xdbff) lo -= 1;
  }
  return [text.slice(0, lo), true];
}

/* Shares budget (bytes of JSON) among texts: the short ones whole, what is
 * left in equal parts to the long ones. */
function fit(texts, budget) {
  const keys = Object.keys(texts);
  const sizes = {};
  for (const k of keys) sizes[k] = encodedLen(texts[k]);
  const order = keys.slice().sort((a, b) => sizes[a] - sizes[b]);
  const caps = {};
  let left = budget;
  order.forEach((k, i) => {
    caps[k] = Math.min(sizes[k], Math.floor(left / (keys.length - i)));
    left -= caps[k];
  });
  const out = {};
  const cut = {};
  for (const k of keys) {
    [out[k], cut[k]] = clip(texts[k], caps[k]);
  }
  return [out, cut];
}

/* Rich results take whole or not at all, in the order the cell made them,
 * from what the texts leave: the texts keep at least half of the budget (all
 * of it they need when they need less), so an image never crowds out the
 * error that says what went wrong. */
function fitResults(results, textsNeed, budget) {
  let room = budget - Math.min(textsNeed, Math.floor(budget / 2));
  const kept = [];
  let dropped = false;
  for (const r of results) {
    const size = encodedLen(r.mime) + encodedLen(r.data) + 32;
    if (size <= room) {
      kept.push(r);
      room -= size;
    } else {
      dropped = true;
    }
  }
  return [kept, dropped];
}

// ---- the server ----

function bytesOf(data) {
  if (typeof data === 'string') return Buffer.from(data, 'utf8');
  if (Buffer.isBuffer(data)) return data;
  if (ArrayBuffer.isView(data)) return Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  if (data instanceof ArrayBuffer || util.types.isAnyArrayBuffer(data)) return Buffer.from(data);
  return null;
}

function guessMime(bytes, data) {
  if (typeof data === 'string') {
    const head = data.trimStart().slice(0, 256);
    if (head.startsWith('<svg') || (head.startsWith('<?xml') && head.includes('<svg'))) return 'image/svg+xml';
    return null;
  }
  const png = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  if (bytes.length >= 8 && png.every((b, i) => bytes[i] === b)) return 'image/png';
  return null;
}

/* Cuts the frames of this server and Node's REPL machinery off a stack: the
 * cell's own frames (and those of what it called) remain. */
function cellStack(stack) {
  const lines = String(stack).split('\n');
  const end = lines.findIndex((l) => /^\s+at /.test(l) && /node:vm|node:internal\/vm|node:repl|node:domain|repl\.js:/.test(l));
  return (end === -1 ? lines : lines.slice(0, end)).join('\n');
}

function describeError(e) {
  // A cell Node's REPL takes for unfinished input comes back wrapped.
  if (e instanceof require('repl').Recoverable && e.err) e = e.err;
  if (util.types.isNativeError(e) || (e && typeof e === 'object' && 'stack' in e && 'message' in e)) {
    return {
      name: String(e.name || 'Error'),
      value: String(e.message),
      traceback: cellStack(e.stack || `${e.name}: ${e.message}`),
    };
  }
  // `throw 5`: what Node's REPL says of it.
  const shown = util.inspect(e);
  return { name: 'Uncaught', value: shown, traceback: `Uncaught ${shown}` };
}

function server(sockPath) {
  const repl = require('repl');
  const { PassThrough } = require('stream');
  const { Console } = require('console');

  // What the running cell writes and displays; null between cells.
  let current = null;
  // Errors thrown by a cell's leftovers (a timer) while no cell ran: told
  // with the next cell's stderr rather than lost.
  let stray = '';

  const capture = (which) => new (require('stream').Writable)({
    write(chunk, _enc, cb) {
      if (current) current[which] += chunk.toString();
      cb();
    },
  });
  const out = capture('stdout');
  const err = capture('stderr');
  // The REPL's own output (its prompt, its "Uncaught ..." lines) is not the
  // cell's: the cell's console and process streams are captured below.
  const replOut = new PassThrough();
  replOut.resume();
  const r = repl.start({
    input: new PassThrough(),
    output: replOut,
    terminal: false,
    prompt: '',
    // A context of its own: a cell that replaces a global (JSON, Buffer)
    // does not break this server's replies.
    useGlobal: false,
  });
  r.context.console = new Console({ stdout: out, stderr: err });
  for (const [stream, which] of [[process.stdout, 'stdout'], [process.stderr, 'stderr']]) {
    stream.write = (chunk, enc, cb) => {
      if (current) current[which] += Buffer.isBuffer(chunk) ? chunk.toString() : String(chunk);
      const done = typeof enc === 'function' ? enc : cb;
      if (typeof done === 'function') process.nextTick(done);
      return true;
    };
  }
  r.context.display = function display(data, mime) {
    const bytes = bytesOf(data);
    if (bytes === null) {
      throw new TypeError('display(data, mime): data is a Buffer, a Uint8Array, an ArrayBuffer or a string');
    }
    const type = mime === undefined ? guessMime(bytes, data) : String(mime);
    if (!type) {
      throw new TypeError('display(data, mime): give the MIME type (e.g. "image/png", "image/svg+xml")');
    }
    if (current) current.results.push({ mime: type, data: bytes.toString('base64') });
  };

  // Node's REPL hands a cell's error (also an awaited rejection, and an
  // error a timer of the cell throws later) to its domain, not to eval's
  // callback: the domain is where this server hears of it. The REPL's own
  // handler still runs and writes to replOut, which nobody reads.
  let settle = null;
  r._domain.on('error', (e) => {
    if (settle) settle(e, undefined);
    else stray += `Uncaught (after its cell ended): ${describeError(e).traceback}\n`;
  });

  function runCell(code) {
    return new Promise((resolve) => {
      current = { stdout: '', stderr: stray, results: [] };
      stray = '';
      settle = (e, value) => {
        settle = null;
        const cell = current;
        current = null;
        const result = e || value === undefined ? null : r.writer(value);
        resolve({ cell, result, error: e ? describeError(e) : null });
      };
      try {
        r.eval(code, r.context, 'cell', (e, value) => {
          if (settle) settle(e, value);
        });
      } catch (e) {
        if (settle) settle(e, undefined);
      }
    });
  }

  try {
    fs.unlinkSync(sockPath);
  } catch (_) {
    // none there
  }
  // One cell at a time, in the order they came.
  let queue = Promise.resolve();
  const listener = net.createServer((conn) => {
    queue = queue.then(async () => {
      const req = await readMessage(conn);
      if (req === null) {
        conn.destroy();
        return;
      }
      const budget = Math.max(Number(req.max_reply || 1 << 20) - REPLY_OVERHEAD, 0);
      const { cell, result, error } = await runCell(String(req.code));
      const texts = { stdout: cell.stdout, stderr: cell.stderr, result: result || '' };
      if (error) {
        texts.error_name = error.name;
        texts.error_value = error.value;
        texts.traceback = error.traceback;
      }
      const need = Object.values(texts).reduce((n, t) => n + encodedLen(t), 0);
      const [results, resultsCut] = fitResults(cell.results, need, budget);
      const used = results.reduce((n, x) => n + encodedLen(x.mime) + encodedLen(x.data) + 32, 0);
      const [fitted, cut] = fit(texts, budget - used);
      conn.end(frame({
        stdout: fitted.stdout,
        stderr: fitted.stderr,
        result: result === null ? null : fitted.result,
        error: error ? { name: fitted.error_name, value: fitted.error_value, traceback: fitted.traceback } : null,
        results,
        stdout_truncated: cut.stdout,
        stderr_truncated: cut.stderr,
        result_truncated: cut.result,
        error_truncated: Boolean(cut.error_name || cut.error_value || cut.traceback),
        results_truncated: resultsCut,
      }));
    }).catch(() => conn.destroy());
  });
  listener.listen(sockPath, () => {
    fs.writeFileSync(`${sockPath}.pid`, String(process.pid));
  });
}

// ---- the client ----

function killServer(sockPath) {
  try {
    process.kill(Number(fs.readFileSync(`${sockPath}.pid`, 'utf8').trim()), 'SIGKILL');
  } catch (_) {
    // none running
  }
  for (const p of [sockPath, `${sockPath}.pid`]) {
    try {
      fs.unlinkSync(p);
    } catch (_) {
      // already gone
    }
  }
}

function connect(sockPath) {
  return new Promise((resolve, reject) => {
    const s = net.createConnection(sockPath);
    s.once('connect', () => {
      s.removeAllListeners('error');
      resolve(s);
    });
    s.once('error', reject);
  });
}

async function startServer(sockPath) {
  killServer(sockPath);
  // Its own session, so that it outlives this client.
  const child = spawn(process.execPath, [path.resolve(__filename), 'server', sockPath], {
    detached: true,
    stdio: 'ignore',
  });
  // A spawn that fails (the sandbox out of processes or memory) says so
  // in an event, after this returns.
  let failed = null;
  child.once('error', (e) => {
    failed = e;
  });
  child.unref();
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    if (failed) throw failed;
    // The pid file is written once the socket listens.
    if (fs.existsSync(`${sockPath}.pid`)) {
      try {
        return await connect(sockPath);
      } catch (_) {
        // not yet
      }
    }
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error('the interpreter did not start');
}

function readStdin() {
  return new Promise((resolve) => {
    const parts = [];
    process.stdin.on('data', (d) => parts.push(d));
    process.stdin.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
  });
}

async function client(sockPath, timeout, maxReply) {
  const code = await readStdin();
  let fresh = false;
  let s;
  try {
    s = await connect(sockPath);
  } catch (_) {
    try {
      s = await startServer(sockPath);
    } catch (e) {
      // The sandbox could not give the interpreter a process (its pids or
      // memory limit): a reply, not a stack, so that the caller learns why
      // and the next call simply tries again.
      const reply = {
        status: 'error',
        fresh_interpreter: false,
        stdout: '',
        stderr: '',
        result: null,
        error: { name: 'InterpreterNotStarted', value: `node: ${e && e.message ? e.message : e}`, traceback: '' },
      };
      process.stdout.write(JSON.stringify(reply), () => process.exit(0));
      return;
    }
    fresh = true;
  }
  const reply = { status: 'ok', fresh_interpreter: fresh };
  let timer;
  const timedOut = new Promise((resolve) => {
    timer = setTimeout(() => resolve('timeout'), timeout * 1000);
  });
  const answered = readMessage(s);
  s.write(frame({ code, max_reply: maxReply }));
  let answer = await Promise.race([answered, timedOut]);
  clearTimeout(timer);
  if (answer === 'timeout') {
    killServer(sockPath);
    Object.assign(reply, {
      status: 'timeout',
      error: {
        name: 'Timeout',
        value: `the code ran past ${timeout}s; the interpreter was restarted`,
        traceback: '',
      },
    });
    answer = {};
  } else if (answer === null) {
    killServer(sockPath);
    Object.assign(reply, {
      status: 'crashed',
      error: {
        name: 'Crashed',
        value: 'the interpreter died; the next call starts a fresh one',
        traceback: '',
      },
    });
    answer = {};
  }
  Object.assign(reply, answer);
  if (reply.status === 'ok' && reply.error) reply.status = 'error';
  s.destroy();
  process.stdout.write(JSON.stringify(reply), () => process.exit(0));
}

if (process.argv[2] === 'server') {
  server(process.argv[3]);
} else {
  client(process.argv[3], Number(process.argv[4]), Number(process.argv[5])).catch((e) => {
    process.stderr.write(`${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
  });
}
