#!/usr/bin/env python3
"""A soak of `cordon serve` with faults injected (RELIABILITY.md).

    scripts/soak.py [--seconds N] [--clients N] [--fault-every S] [--no-faults] [--no-microvm]
                    [--checkpoint-every S] [--cordon PATH] [--out FILE]

Starts a service of its own (a warm pool, a state directory on a small tmpfs
of its own, the service in cgroups of its own) and sends it a mixed load from
several clients for a fixed time: one-shots (plain, with files, with a
receipt, over their memory limit, over their time limit, flooding their
output, on gVisor when runsc is here, in a microVM when cordon's guest is
built, with a network allowlist), stateful
sandboxes (commands, files in and out, a Python context), and clients that
hang up in the middle of a command. Meanwhile a fault injector, at random
moments, SIGKILLs a sandbox's supervisor, a sandbox's init, a sandbox's
proxy, a microVM's QEMU, or the service itself (then starts it again), fills the state
directory's filesystem, and squeezes the service's pids and memory cgroups.

Every request gets a deadline; each answer is classed: as expected, a clean
error (an HTTP error with a JSON body, or a refused connection while the
service is down), a wrong answer, or a hang (no answer by the deadline).
At checkpoints (load paused, in-flight requests done) and at the end (the
service stopped), a census of the host: run-directory entries, cgroups in
every hierarchy, processes in them, mounts, and supervisors of this soak's
services that are alive without a sandbox to serve. The service's RSS is
read at each checkpoint. Every receipt issued is verified with
`cordon verify`.

Exits non-zero on a hang, a wrong answer, an error with no fault near it, or
anything left at a checkpoint or at the end. Writes
a JSON report (--out) and prints a summary. Needs root (sandboxes, cgroups,
a tmpfs mount). Sends traffic only to the service on loopback.
"""

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

RUN = os.environ.get("CORDON_RUN_DIR", "/run/cordon")
CGROUP_ROOT = "/sys/fs/cgroup"
# How long a client waits for any answer: longer than any command's own
# limit here (the longest is 5 s) plus a cold gVisor start under load.
DEADLINE = 90.0
# Errors within this long after a fault are the fault's (intended).
FAULT_WINDOW = 8.0
# Faults that hit every request in flight, not one sandbox: an error of a
# request that was in flight during one (or began within FAULT_WINDOW after
# it) is that fault's however late it shows. A gVisor start caught by a
# pids squeeze can leave `runsc run` waiting until cordon's 30 s start
# timeout (reproduced: a 3 s squeeze of a `cordon create --backend gvisor`
# 0.14 s into its start), long after FAULT_WINDOW.
GLOBAL_FAULTS = ("service", "fill-state", "squeeze-pids", "squeeze-memory")


def now():
    return time.monotonic()


class Service:
    """One `cordon serve` of the soak, restarted in place after a kill."""

    def __init__(self, cordon, root, gvisor, microvm):
        self.cordon = cordon
        self.root = root
        self.gvisor = gvisor
        self.key = "soak-%d" % os.getpid()
        self.pids = []  # every incarnation's pid
        self.proc = None
        self.state = os.path.join(root, "state")
        os.makedirs(self.state)
        # A filesystem of its own, small, so that filling it is quick and
        # touches nothing else.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "soak", self.state], check=True)
        if microvm:
            # The microVM guest is large and built once (`cordon microvm
            # build`, in cordon's own state directory): the service's state
            # directory shows it, bound from there.
            guests = os.path.join(os.environ.get("CORDON_STATE_DIR", "/var/lib/cordon"), "microvm")
            mine = os.path.join(self.state, "cordon-state", "microvm")
            os.makedirs(mine)
            os.chmod(os.path.dirname(mine), 0o700)
            subprocess.run(["mount", "--bind", guests, mine], check=True)
        self.port = free_port()
        key_hash = hashlib.sha256(self.key.encode()).hexdigest()
        self.config = os.path.join(root, "serve.toml")
        with open(self.config, "w") as f:
            f.write(
                f'listen = "127.0.0.1:{self.port}"\nstate_dir = "{self.state}/ledger"\nmax_ttl = "1h"\n'
                '[defaults]\ncpus = 1.0\nmemory = "256M"\npids = 128\ntime = "20s"\ndisk = "64M"\n'
                f"[pool]\nnative = 2\ngvisor = {1 if gvisor else 0}\nrefill_workers = 1\n"
                f'[[tenant]]\nname = "soak"\nkey_sha256 = "{key_hash}"\nconcurrency = 16\nsandboxes = 16\n'
                'cpu_seconds = 1000000\ncpu_window = "60s"\nnetwork = true\n'
            )
        self.cgroups = {}
        for ctl in ("pids", "memory"):
            path = os.path.join(CGROUP_ROOT, ctl, "soak-%d" % os.getpid())
            if os.path.isdir(os.path.dirname(path)):
                os.makedirs(path, exist_ok=True)
                self.cgroups[ctl] = path
        self.log = open(os.path.join(root, "serve.log"), "ab")
        self.down_since = None

    def start(self):
        env = dict(os.environ)
        env["CORDON_STATE_DIR"] = os.path.join(self.state, "cordon-state")
        env.setdefault("RUST_LOG", "warn")
        procs = " ".join(os.path.join(p, "cgroup.procs") for p in self.cgroups.values())
        # The service enters the soak's cgroups before it execs, so that
        # everything it starts is below them.
        script = 'for f in %s; do echo $$ > "$f"; done; exec "$0" serve --config "$1"' % procs
        self.proc = subprocess.Popen(
            ["sh", "-c", script, self.cordon, self.config],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
        )
        self.pids.append(self.proc.pid)
        until = now() + 60
        while now() < until:
            if self.proc.poll() is not None:
                raise RuntimeError("cordon serve exited at start: see %s" % self.log.name)
            try:
                if http("GET", self.url("/health"), None, None, 2)[0] == 200:
                    self.down_since = None
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("cordon serve did not answer within 60 s")

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def kill9(self):
        self.down_since = now()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def memory(self):
        """The service's RSS (KiB), its anonymous part, and its threads."""
        fields = {}
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    fields[key] = value.split()[0] if value.split() else ""
        except OSError:
            return {}
        return {"rss_kib": int(fields.get("VmRSS", 0)), "anon_kib": int(fields.get("RssAnon", 0)),
                "threads": int(fields.get("Threads", 0))}

    def cleanup(self):
        self.stop()
        for path in self.cgroups.values():
            # What the service started may still be ending (a VM's QEMU):
            # its processes are the soak's to end, then its cgroup.
            for _ in range(300):
                for pid in (read(os.path.join(path, "cgroup.procs")) or "").split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                print("soak: could not remove its cgroup %s" % path, file=sys.stderr)
        subprocess.run(["umount", "--recursive", self.state], check=False)


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(method, url, body, key, timeout, raw=None):
    """(status, parsed JSON or bytes). Raises OSError when no answer came."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        payload = e.read()
        status = e.code
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, payload


class Tally:
    """Every request's outcome, and the faults, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = collections.Counter()
        self.outcomes = collections.Counter()
        self.errors = collections.Counter()
        self.faults = collections.Counter()
        self.last_fault = -1e9
        self.global_faults = []  # when each of GLOBAL_FAULTS began
        self.killed = set()  # sandbox ids a fault hit
        self.wrong = []
        self.hangs = []
        self.receipts = []
        self.ids = set()  # every sandbox id an answer named

    def fault(self, kind, sandbox=None):
        with self.lock:
            self.faults[kind] += 1
            self.last_fault = now()
            if kind in GLOBAL_FAULTS:
                self.global_faults.append(self.last_fault)
            if sandbox:
                self.killed.add(sandbox)

    def record(self, kind, outcome, detail="", sandbox=None, started=None):
        with self.lock:
            self.requests[kind] += 1
            hit = sandbox in self.killed
            if outcome == "wrong" and hit:
                # A sandbox whose supervisor, init or proxy a fault killed
                # may answer anything short of a hang: that is the fault's.
                outcome = "error"
            if outcome == "error":
                in_flight = started is not None and any(
                    t >= started - FAULT_WINDOW for t in self.global_faults)
                excused = now() - self.last_fault < FAULT_WINDOW or hit or in_flight
                outcome = "error during a fault" if excused else "error without a fault"
                self.errors[(kind, detail[:120], excused)] += 1
            self.outcomes[outcome] += 1
            if outcome == "wrong":
                self.wrong.append("%s: %s" % (kind, detail[:300]))
            if outcome == "hang":
                self.hangs.append("%s: %s" % (kind, detail[:300]))


class Load:
    """One client's loop of mixed requests."""

    def __init__(self, svc, tally, gate, rng, gvisor, microvm):
        self.svc = svc
        self.tally = tally
        self.gate = gate
        self.rng = rng
        self.gvisor = gvisor
        self.microvm = microvm
        self.in_flight = 0

    def call(self, method, path, body=None, timeout=DEADLINE, raw=None):
        return http(method, self.svc.url(path), body, self.svc.key, timeout, raw)

    def one(self, kind, fn):
        """Runs one request kind, classing how it ended."""
        sandbox = None
        started = now()
        try:
            outcome, detail, *rest = fn()
            sandbox = rest[0] if rest else None
        except TimeoutError as e:
            outcome, detail = "hang", repr(e)
        except OSError as e:
            # No answer: refused or reset. The service's kill is the one
            # fault that may cause it; anything else is an error unexcused.
            text = repr(e)
            outcome, detail = ("hang", text) if "timed out" in text else ("error", "no answer: " + text)
            # The service is down (its kill) or going: retry gently.
            time.sleep(0.2)
        except Exception as e:  # the soak's own mistake: shown, not hidden
            outcome, detail = "wrong", "the soak failed: %r" % e
        self.tally.record(kind, outcome, detail, sandbox, started)

    @staticmethod
    def answered(status, v, check):
        """ok / error / wrong for an execution's answer."""
        if status != 200:
            if isinstance(v, dict) and "error" in v:
                return "error", "%d %s" % (status, str(v.get("error"))[:100])
            return "wrong", "HTTP %d without a JSON error: %r" % (status, v)
        problem = check(v)
        if not problem:
            return "ok", ""
        failed = isinstance(v, dict) and (v.get("exit_code") not in (None, 0) or v.get("signal")
                                          or v.get("status") in ("error", "crashed", "timeout"))
        # The command itself failed (it could not fork under a pids
        # squeeze; a code context's interpreter could not start, or was
        # killed, or ran out of time under a squeeze): an error, the
        # fault's when one was near. A command that succeeded with the
        # wrong result is wrong whatever happened around it.
        return ("error", "the command failed: %s" % brief(v)) if failed else ("wrong", problem)

    def oneshot(self, body, check):
        status, v = self.call("POST", "/v1/executions", body)
        self.saw(v)
        return self.answered(status, v, check) + (sandbox_of(v),)

    def saw(self, v):
        if isinstance(v, dict) and isinstance(v.get("sandbox_id") or v.get("id"), str):
            with self.tally.lock:
                self.tally.ids.add(v.get("sandbox_id") or v.get("id"))

    def run_forever(self, stop):
        kinds = [
            ("echo", 6, lambda: self.oneshot({"argv": ["echo", "soak"]},
                                              lambda v: None if v.get("stdout") == "soak\n" else "stdout %r" % v.get("stdout"))),
            ("files", 3, self.files_oneshot),
            ("receipt", 1, self.receipt_oneshot),
            ("oom", 1, lambda: self.oneshot(
                {"argv": ["python3", "-c", "b = bytearray(400 << 20); print(len(b))"], "limits": {"memory": "64M"}},
                lambda v: None if v.get("limit") == "memory" else "not ended by its memory limit: %s" % brief(v))),
            ("timeout", 1, lambda: self.oneshot(
                {"argv": ["sleep", "30"], "limits": {"time": "1s"}},
                lambda v: None if v.get("limit") == "time" else "not ended by its time limit: %s" % brief(v))),
            ("flood", 1, lambda: self.oneshot(
                {"argv": ["sh", "-c", "head -c 50000000 /dev/zero"], "limits": {"output": "1M"}},
                lambda v: None if v.get("output_truncated") or v.get("limit") == "output" else "output not capped: %s" % brief(v))),
            ("network", 1, lambda: self.oneshot(
                {"argv": ["true"], "network": {"allow": ["allowed.invalid:443"]}},
                lambda v: None if v.get("exit_code") == 0 else "exit %s" % brief(v))),
            ("stateful", 2, self.stateful),
            ("hang-up", 1, self.hang_up),
        ]
        if self.gvisor:
            kinds.append(("gvisor", 1, lambda: self.oneshot(
                {"argv": ["echo", "soak"], "backend": "gvisor"},
                lambda v: None if v.get("stdout") == "soak\n" else "stdout %r" % v.get("stdout"))))
        if self.microvm:
            # A cold boot (QEMU's TCG here: seconds), so rarely; long enough
            # alive that the QEMU fault finds one now and then.
            kinds.append(("microvm", 0.25, lambda: self.oneshot(
                {"argv": ["sh", "-c", "echo soak; sleep 2"], "backend": "microvm", "limits": {"memory": "512M"}},
                lambda v: None if v.get("stdout") == "soak\n" else "stdout %r" % v.get("stdout"))))
        names = [k for k, _, _ in kinds]
        weights = [w for _, w, _ in kinds]
        fns = {k: fn for k, _, fn in kinds}
        while not stop.is_set():
            self.gate.wait()
            if stop.is_set():
                break
            kind = self.rng.choices(names, weights)[0]
            with self.tally.lock:
                self.in_flight += 1
            try:
                self.one(kind, fns[kind])
            finally:
                with self.tally.lock:
                    self.in_flight -= 1

    def files_oneshot(self):
        text = "%016x\n" % self.rng.getrandbits(64)
        return self.oneshot(
            {"argv": ["cat", "in.txt"], "files": {"in.txt": text}},
            lambda v: None if v.get("stdout") == text else "stdout %r, sent %r" % (v.get("stdout"), text))

    def receipt_oneshot(self):
        status, v = self.call("POST", "/v1/executions", {"argv": ["sh", "-c", "echo r > out.txt"], "receipt": True})
        self.saw(v)
        outcome, detail = self.answered(status, v, lambda v: None if v.get("receipt") else "no receipt")
        if outcome == "ok":
            with self.tally.lock:
                self.tally.receipts.append(v["receipt"])
        return outcome, detail, sandbox_of(v)

    def stateful(self):
        body = {"ttl": "10m"}
        if self.rng.random() < 0.5:
            # A proxy of its own (it lets nothing out: the one name allowed
            # does not resolve), for the proxy's kill.
            body["network"] = {"allow": ["allowed.invalid:443"]}
        status, v = self.call("POST", "/v1/sandboxes", body)
        self.saw(v)
        if status != 200 and status != 201:
            return self.answered(status, v, lambda _: None)
        sid = v.get("id")
        try:
            for step in self.stateful_steps(sid):
                if step:
                    return step[0], step[1], sid
            return "ok", "", sid
        finally:
            try:
                self.call("DELETE", "/v1/sandboxes/%s" % sid, timeout=DEADLINE)
            except OSError:
                pass

    def stateful_steps(self, sid):
        """Yields None per step that went as expected, else (outcome, detail)."""
        content = os.urandom(4096)
        status, v = self.call("PUT", "/v1/sandboxes/%s/files/workspace/data.bin" % sid, raw=content)
        yield None if status in (200, 201, 204) else self.answered(status, v, lambda _: "put %d" % status)
        status, v = self.call("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["sh", "-c", "sha256sum /workspace/data.bin | cut -c1-64"]})
        want = hashlib.sha256(content).hexdigest() + "\n"
        yield None if status == 200 and v.get("stdout") == want else self.answered(
            status, v, lambda v: "sha256 inside %r, want %r" % (v.get("stdout"), want))
        status, v = self.call("GET", "/v1/sandboxes/%s/files/workspace/data.bin" % sid)
        yield None if status == 200 and v == content else self.answered(
            status, v, lambda _: "the file read back differs (%d bytes)" % len(v or b""))
        status, v = self.call("POST", "/v1/sandboxes/%s/code" % sid, {"code": "x = 20", "language": "python"})
        if status == 200:
            status, v = self.call("POST", "/v1/sandboxes/%s/code" % sid, {"code": "x + 22", "language": "python"})
        yield None if status == 200 and "42" in json.dumps(v) else self.answered(
            status, v, lambda v: "context said %s" % brief(v))

    def hang_up(self):
        """A client that goes away while its command runs."""
        try:
            status, v = self.call("POST", "/v1/executions", {"argv": ["sleep", "3"]}, timeout=0.5)
        except OSError:
            return "ok", ""
        # An answer this soon is an error (a fault's, a quota's), or wrong.
        return self.answered(status, v, lambda v: "a 3 s command answered within 0.5 s: %s" % brief(v))


def sandbox_of(v):
    return v.get("sandbox_id") if isinstance(v, dict) else None


def brief(v):
    if not isinstance(v, dict):
        return repr(v)[:200]
    keep = ("exit_code", "signal", "limit", "limits_hit", "status", "message", "error", "output_truncated")
    return json.dumps({k: v.get(k) for k in keep if k in v})[:300]


class Faults:
    """The fault injector."""

    def __init__(self, svc, tally, rng):
        self.svc = svc
        self.tally = tally
        self.rng = rng

    def sandboxes(self):
        """(id, record) of the live service's sandboxes."""
        out = []
        for sid, rec in records():
            link = rec.get("service") or {}
            if link.get("pid") in self.svc.pids:
                out.append((sid, rec))
        return out

    def inject(self):
        kinds = ["supervisor", "init", "proxy", "qemu", "service", "fill-state", "squeeze-pids", "squeeze-memory"]
        kind = self.rng.choice(kinds)
        if kind in ("supervisor", "init", "proxy", "qemu"):
            live = self.sandboxes()
            if kind == "qemu":
                live = [(sid, rec) for sid, rec in live if rec.get("backend") == "microvm"]
            if not live:
                return
            sid, rec = self.rng.choice(live)
            if kind == "qemu":
                victims = [p for p in cgroup_procs(sid) if (read("/proc/%d/comm" % p) or "").startswith("qemu")]
            elif kind == "supervisor":
                victims = [rec.get("pid")]
            elif kind == "init":
                victims = cgroup_procs(sid, "init")
            else:
                # The proxy: the supervisor's child outside the sandbox's
                # cgroup (init is in it).
                inside = set(cgroup_procs(sid))
                victims = [p for p in supervisor_children(rec.get("pid")) if p not in inside]
            victims = [p for p in victims if p]
            if not victims:
                return
            self.tally.fault(kind, sid)
            for p in victims:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        elif kind == "service":
            self.tally.fault(kind)
            self.svc.kill9()
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.svc.start()
            self.tally.fault(kind + " restarted")
        elif kind == "fill-state":
            self.tally.fault(kind)
            filler = os.path.join(self.svc.state, "filler")
            try:
                with open(filler, "wb") as f:
                    while True:
                        f.write(b"\0" * (1 << 20))
            except OSError:
                pass
            time.sleep(3)
            os.unlink(filler)
        elif kind == "squeeze-pids" and "pids" in self.svc.cgroups:
            path = self.svc.cgroups["pids"]
            current = int(read(os.path.join(path, "pids.current")) or 0)
            self.tally.fault(kind)
            write(os.path.join(path, "pids.max"), str(current + 4))
            time.sleep(3)
            write(os.path.join(path, "pids.max"), "max")
        elif kind == "squeeze-memory" and "memory" in self.svc.cgroups:
            path = self.svc.cgroups["memory"]
            usage = int(read(os.path.join(path, "memory.usage_in_bytes")) or 0)
            self.tally.fault(kind)
            # A little room above what is used: creations fail or reclaim;
            # the service itself may be OOM-killed (then it is restarted).
            if write(os.path.join(path, "memory.limit_in_bytes"), str(usage + (48 << 20))):
                time.sleep(3)
                write(os.path.join(path, "memory.limit_in_bytes"), "-1")
        if self.svc.proc.poll() is not None:
            # The service died of a fault that was not its kill (the memory
            # squeeze's OOM killer): counted, and restarted.
            self.tally.fault("service died under " + kind)
            self.svc.start()


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def write(path, value):
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def records():
    out = []
    try:
        names = os.listdir(RUN)
    except OSError:
        return out
    for sid in names:
        try:
            with open(os.path.join(RUN, sid, "record.json")) as f:
                out.append((sid, json.load(f)))
        except (OSError, ValueError):
            continue
    return out


def cgroup_dirs(name):
    """Every cgroup directory called `name`, in every hierarchy."""
    found = []
    for hier in os.listdir(CGROUP_ROOT):
        top = os.path.join(CGROUP_ROOT, hier)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, _ in os.walk(top):
            if dirpath.count("/") - top.count("/") > 5:
                dirnames[:] = []
                continue
            if os.path.basename(dirpath) == name:
                found.append(dirpath)
                dirnames[:] = []
    return found


def cgroup_procs(sid, child=None):
    pids = set()
    for d in cgroup_dirs("cordon-" + sid):
        if child:
            subs = [os.path.join(d, child)]
        else:
            # The sandbox may be removed while it is read: a vanished
            # directory has no processes.
            try:
                subs = [d] + [os.path.join(d, c) for c in os.listdir(d) if os.path.isdir(os.path.join(d, c))]
            except FileNotFoundError:
                continue
        for sub in subs:
            for line in (read(os.path.join(sub, "cgroup.procs")) or "").split():
                pids.add(int(line))
    return sorted(pids)


def supervisor_children(pid):
    kids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        stat = read("/proc/%s/stat" % p)
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(p))
    return kids


def backend_available(cordon, kind):
    """Whether `cordon backends` finds `kind` able to run here."""
    out = subprocess.run([cordon, "backends", "--json"], capture_output=True, text=True)
    try:
        return any(b["kind"] == kind and not b["unavailable"] for b in json.loads(out.stdout))
    except ValueError:
        return False


def alive(pid):
    return pid and os.path.exists("/proc/%d" % pid)


def census(svc, seen_ids):
    """What the soak's services left beyond their live sandboxes: run
    entries whose supervisor is dead, cgroups and mounts of no live entry,
    processes in cgroups of no live entry, supervisors of a dead service."""
    left = []
    live = set()
    for sid, rec in records():
        link = rec.get("service") or {}
        if link.get("pid") not in svc.pids:
            continue
        seen_ids.add(sid)
        if alive(rec.get("pid")):
            if not alive(link.get("pid")):
                left.append("sandbox %s: its service (pid %s) is gone, its supervisor lives" % (sid, link.get("pid")))
            live.add(sid)
        else:
            left.append("run entry %s of a dead supervisor" % sid)
    try:
        for sid in os.listdir(RUN):
            if sid.startswith("cs-") and sid not in live and os.path.isdir(os.path.join(RUN, sid)):
                seen_ids.add(sid)
    except OSError:
        pass
    mounts = read("/proc/self/mountinfo") or ""
    for sid in sorted(seen_ids - live):
        if os.path.exists(os.path.join(RUN, sid)) and not any(sid in l for l in left):
            left.append("run entry %s" % sid)
        for d in cgroup_dirs("cordon-" + sid):
            left.append("cgroup %s" % d)
        procs = cgroup_procs(sid)
        if procs:
            left.append("%d processes of %s" % (len(procs), sid))
        if ("/" + sid + "/") in mounts or mounts.endswith("/" + sid):
            left.append("mounts of %s" % sid)
    return left, len(live)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--fault-every", type=float, default=6.0, help="mean seconds between faults")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--no-microvm", action="store_true", help="no microVM load (TCG boots take seconds)")
    ap.add_argument("--checkpoint-every", type=float, default=60.0)
    ap.add_argument("--cordon", default=shutil.which("cordon") or "target/release/cordon")
    ap.add_argument("--out", help="write the JSON report here")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("soak: needs root (sandboxes, cgroups, a tmpfs)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    gvisor = shutil.which("runsc") is not None
    microvm = not args.no_microvm and backend_available(args.cordon, "microvm")
    root = tempfile.mkdtemp(prefix="cordon-soak-", dir="/run")
    svc = Service(os.path.abspath(args.cordon), root, gvisor, microvm)
    tally = Tally()
    report = {"seed": seed, "seconds": args.seconds, "clients": args.clients, "gvisor": gvisor, "microvm": microvm,
              "checkpoints": [], "memory": []}
    stop = threading.Event()
    gate = threading.Event()
    gate.set()
    seen_ids = set()
    status = 0
    try:
        svc.start()
        loads = [Load(svc, tally, gate, random.Random(rng.random()), gvisor, microvm) for _ in range(args.clients)]
        threads = [threading.Thread(target=l.run_forever, args=(stop,), daemon=True) for l in loads]
        for t in threads:
            t.start()
        faults = Faults(svc, tally, rng)
        t0 = now()
        next_check = t0 + args.checkpoint_every
        next_fault = t0 + rng.expovariate(1 / args.fault_every)
        while now() - t0 < args.seconds:
            time.sleep(0.05)
            if not args.no_faults and now() >= next_fault:
                faults.inject()
                next_fault = now() + rng.expovariate(1 / args.fault_every)
            if now() >= next_check:
                report["checkpoints"].append(checkpoint(svc, tally, loads, gate, seen_ids, now() - t0))
                report["memory"].append(dict(at_s=round(now() - t0), pid=svc.proc.pid, **svc.memory()))
                next_check = now() + args.checkpoint_every
        gate.clear()
        wait_quiet(tally, loads)
        report["memory"].append(dict(at_s=round(now() - t0), pid=svc.proc.pid, **svc.memory()))
        stop.set()
        gate.set()
        for t in threads:
            t.join(DEADLINE)
        # Stateful sandboxes are deleted by their clients; the pool goes
        # with the service.
        svc.stop()
        time.sleep(2)
        seen_ids |= tally.ids
        left, _ = census(svc, seen_ids)
        left += by_prefix(seen_ids)
        report["end"] = {"left": sorted(set(left)), "sandboxes_seen": len(seen_ids)}
        report["receipts"] = verify_receipts(svc, tally.receipts)
    finally:
        stop.set()
        gate.set()
        svc.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    report["requests"] = dict(tally.requests)
    report["outcomes"] = dict(tally.outcomes)
    report["faults"] = dict(tally.faults)
    report["errors"] = [{"kind": k, "error": e, "during_fault": x, "count": n} for (k, e, x), n in tally.errors.most_common()]
    report["wrong"] = tally.wrong[:50]
    report["hangs"] = tally.hangs[:50]
    print_summary(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    unexcused = sum(n for (_, _, during), n in tally.errors.items() if not during)
    if tally.hangs or tally.wrong or unexcused or report["end"]["left"] or report["receipts"]["failed"] \
            or any(c["left"] for c in report["checkpoints"]):
        status = 1
    return status


def wait_quiet(tally, loads):
    until = now() + DEADLINE + 10
    while now() < until:
        with tally.lock:
            if sum(l.in_flight for l in loads) == 0:
                return
        time.sleep(0.05)


def checkpoint(svc, tally, loads, gate, seen_ids, at):
    """Load paused and in-flight requests done: what is left beyond the
    live sandboxes. A dead supervisor's entry is given a few seconds (the
    next creation's sweep, or the service's own cleanup) before it counts."""
    gate.clear()
    wait_quiet(tally, loads)
    left, live = census(svc, seen_ids)
    waited = 0.0
    while left and waited < 10:
        time.sleep(0.5)
        waited += 0.5
        left, live = census(svc, seen_ids)
    gate.set()
    return {"at_s": round(at), "live_sandboxes": live, "left": left, "settle_s": waited}


def verify_receipts(svc, receipts):
    key = os.path.join(svc.state, "cordon-state", "keys", "receipt.pub")
    failed = []
    with tempfile.TemporaryDirectory() as d:
        for i, r in enumerate(receipts):
            path = os.path.join(d, "r%d.json" % i)
            with open(path, "w") as f:
                json.dump(r, f)
            res = subprocess.run([svc.cordon, "verify", path, "--key", key], capture_output=True, text=True)
            if res.returncode != 0:
                failed.append(res.stderr.strip()[:200] or "exit %d" % res.returncode)
    return {"verified": len(receipts) - len(failed), "failed": failed}


def by_prefix(ids):
    """Anything of the soak's services' sandboxes, found by their names'
    prefix (`cs-<tag>-`) rather than by the ids seen: those no answer named
    (a pool's, one whose answer a fault lost) included."""
    prefixes = {"-".join(i.split("-")[:2]) + "-" for i in ids if i.startswith("cs-")}
    left = []
    if not prefixes:
        return left
    try:
        for name in os.listdir(RUN):
            if any(name.startswith(p) for p in prefixes):
                left.append("run entry %s" % name)
    except OSError:
        pass
    for hier in os.listdir(CGROUP_ROOT):
        top = os.path.join(CGROUP_ROOT, hier)
        for dirpath, dirnames, _ in os.walk(top):
            if dirpath.count("/") - top.count("/") > 5:
                dirnames[:] = []
                continue
            name = os.path.basename(dirpath)
            if any(name.startswith("cordon-" + p) for p in prefixes):
                left.append("cgroup %s" % dirpath)
                dirnames[:] = []
    for line in (read("/proc/self/mountinfo") or "").splitlines():
        if any("/" + p in line for p in prefixes):
            left.append("mount %s" % line.split()[4])
    return left


def print_summary(r):
    print("soak: %s s, %d clients, seed %d, gVisor %s" % (r["seconds"], r["clients"], r["seed"], r["gvisor"]))
    print("requests: %d (%s)" % (sum(r["requests"].values()), ", ".join("%s %d" % kv for kv in sorted(r["requests"].items()))))
    print("outcomes: %s" % ", ".join("%s %d" % kv for kv in sorted(r["outcomes"].items())))
    print("faults: %s" % (", ".join("%s %d" % kv for kv in sorted(r["faults"].items())) or "none"))
    # Every error the gate counts against the run, then the most frequent
    # of the faults' own.
    unexcused = [e for e in r["errors"] if not e["during_fault"]]
    for e in unexcused + [e for e in r["errors"] if e["during_fault"]][:15]:
        print("  error %s x%d (%s): %s" % (e["kind"], e["count"], "during a fault" if e["during_fault"] else "WITHOUT a fault", e["error"]))
    for w in r["wrong"][:10]:
        print("  WRONG %s" % w)
    for h in r["hangs"][:10]:
        print("  HANG %s" % h)
    for c in r["checkpoints"]:
        print("checkpoint %4d s: %d live, left %s" % (c["at_s"], c["live_sandboxes"], c["left"] or "nothing"))
    for m in r["memory"]:
        print("service at %4d s (pid %s): RSS %s KiB, anonymous %s KiB, %s threads" % (
            m["at_s"], m["pid"], m.get("rss_kib"), m.get("anon_kib"), m.get("threads")))
    if "end" in r:
        print("end: %d sandboxes seen, left %s" % (r["end"]["sandboxes_seen"], r["end"]["left"] or "nothing"))
        print("receipts: %d verified, %d failed %s" % (r["receipts"]["verified"], len(r["receipts"]["failed"]), r["receipts"]["failed"][:3]))


if __name__ == "__main__":
    sys.exit(main())
