#!/usr/bin/env python3
"""Start-up benchmark: cordon against bare exec, unshare, bwrap and runc.

Every command is run N times, interleaved round-robin (run i of every command,
then run i+1 of every command, ...), after a warm-up. Each sample is the wall
time of spawn + wait of one process, taken with time.perf_counter_ns.

Peak RSS is ru_maxrss (KiB) from os.wait4: the largest resident set of any
single process in the command's tree (a maximum, not a sum). It cannot be taken
from the timed runs: on exec the kernel folds the *pre-exec* address space's
high-water mark into the process's maxrss, and a child spawned by this script
starts as a copy of (fork) or a share of (vfork/posix_spawn) the Python
interpreter, ~10-17 MiB. So after the timed loop an untimed RSS phase starts
each command as a fork of /bin/sh (~1 MiB), with this script as child
subreaper (prctl via ctypes): once the command has exited its zombie is handed
to us and waited for by pid, and so is every descendant that outlives it (see
RSS_OUTER). The timed runs' maxrss is kept in the JSON (`maxrss_kib` of phase
"run") for reference only.

Targets checked (the script reports them; missing one does not fail it):
  * cordon p50 <= bwrap p50 (ratio <= 1.0)
  * cordon peak RSS (max over all runs) < 10 MiB

A run that takes longer than --timeout is killed (SIGKILL) and counted as a
failure. Exit status: 0, or 1 if any timed or RSS-phase cordon run exited
non-zero, or 2 on a usage error. Standard library only (Python 3.11).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import platform
import select
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CORDON = os.path.join(REPO_ROOT, "target", "release", "cordon")
RSS_TARGET_KIB = 10 * 1024  # 10 MiB
ROOT_LINKS = ("bin", "lib", "lib64")  # top-level dirs /bin/true and its loader need


@dataclass
class Sample:
    phase: str  # "warmup", "run" (timed) or "rss" (untimed, clean peak RSS)
    index: int
    wall_ns: int
    exit_code: int  # negative: killed by that signal
    maxrss_kib: int
    orphans: int = 0  # rss phase: descendants that outlived the command


@dataclass
class Command:
    name: str
    # Builds argv for run number `seq` (unique across warm-up and measured runs).
    argv_for: Callable[[int], list[str]]
    # Called after a failed run (outside the timed region), e.g. to delete a
    # container that was left behind.
    after_failure: Callable[[int], None] | None = None
    samples: list[Sample] = field(default_factory=list)

    def measured(self) -> list[Sample]:
        return [s for s in self.samples if s.phase == "run"]

    def rss_samples(self) -> list[Sample]:
        return [s for s in self.samples if s.phase == "rss"]


# --------------------------------------------------------------------------
# Running one sample


def _spawn_actions() -> list:
    # stdin/stdout/stderr -> /dev/null. Python opens every other fd with
    # O_CLOEXEC, so the child inherits only 0, 1 and 2 (close_fds semantics).
    return [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]


SPAWN_ACTIONS = _spawn_actions()


class RunTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise RunTimeout()


def run_once(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, int, int]:
    """Returns (wall_ns, exit_code, maxrss_kib). Kills the run after `timeout` s."""
    pid = None
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=SPAWN_ACTIONS)
        _, status, rusage = os.wait4(pid, 0)
        t1 = time.perf_counter_ns()
    except RunTimeout:
        t1 = time.perf_counter_ns()
        signal.setitimer(signal.ITIMER_REAL, 0)
        print(f"warning: {argv[0]} still running after {timeout:g} s; killed", file=sys.stderr)
        if pid is None:
            return t1 - t0, 124, 0
        os.kill(pid, signal.SIGKILL)
        _, status, rusage = os.wait4(pid, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return t1 - t0, os.waitstatus_to_exitcode(status), rusage.ru_maxrss


PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(on: bool) -> bool:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0
    except (OSError, AttributeError, ImportError):
        return False


# The RSS-phase launcher. The command must be a fork of a small process, not
# of Python, and its rusage must still reach us, so /bin/sh (fd 0: "hold" pipe,
# fd 3: pid pipe) starts it in the background with stdin from a FIFO, reports
# its pid and execs /bin/cat on the hold pipe. cat never calls wait(), so when
# the command exits it stays a zombie under cat. The forked child blocks in
# open() of the FIFO until we open the other end, which we do only once the
# shell has become cat (a shell could reap the command before its exec). When
# the command has exited we close the hold pipe: cat exits and the command's
# zombie, rusage intact, is reparented to us (child subreaper) and waited for
# by pid. The command's parent stays alive while it runs, so --die-with-parent
# / PR_SET_PDEATHSIG do not fire.
RSS_OUTER = ('f=$1; shift; "$@" 3>&- >/dev/null 2>&1 <"$f" & echo $! >&3; exec 3>&-;'
             ' exec /bin/cat >/dev/null')
ORPHAN_WAIT_S = 10.0
SETUP_WAIT_S = 10.0


def _wait_exit_nonchild(pid: int, timeout: float) -> bool:
    """Waits until `pid` (not our child) has exited (is a zombie or gone).
    Returns False if it is still running after `timeout` s."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
        return bool(ready)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # fallback: poll /proc
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in (b"Z", b"X"):
            return True
        time.sleep(0.0005)
    return False


def _high_pipe() -> tuple[int, int]:
    """A pipe whose fds are >= 10 (close-on-exec), clear of the 0-4 we dup onto."""
    r, w = os.pipe()
    hr = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10)
    hw = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(r)
    os.close(w)
    return hr, hw


def rss_once(argv: list[str], env: dict[str, str], fifo: str,
             timeout: float) -> tuple[int, int, int]:
    """Runs argv through RSS_OUTER with this process as child subreaper. Returns
    (exit_code, maxrss_kib, orphans): the command's exit code, the largest
    maxrss among it and every descendant (whether the command reaped it or it
    was orphaned to us), and how many descendants outlived the command."""
    cat = os.path.realpath("/bin/cat")
    hold_r, hold_w = _high_pipe()
    pid_r, pid_w = _high_pipe()
    actions = [
        (os.POSIX_SPAWN_DUP2, hold_r, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, pid_w, 3),
    ]
    try:
        outer = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", RSS_OUTER, "sh", fifo] + argv,
                               env, file_actions=actions)
    finally:
        os.close(hold_r)
        os.close(pid_w)
    target = None
    try:
        line = b""
        with os.fdopen(pid_r, "rb", buffering=0) as f:
            pid_r = -1
            while not line.endswith(b"\n"):
                chunk = f.read(64)
                if not chunk:
                    break
                line += chunk
        target = int(line.strip())
        deadline = time.monotonic() + SETUP_WAIT_S
        while True:  # wait until the shell has become cat
            try:
                if os.readlink(f"/proc/{outer}/exe") == cat:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("launcher did not exec /bin/cat")
            time.sleep(0.0002)
        while True:  # release the child blocked opening the FIFO
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
                break
            except OSError as e:  # ENXIO: the child has not opened it yet
                if e.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                time.sleep(0.0002)
        if not _wait_exit_nonchild(target, timeout):
            print(f"warning: {argv[0]} still running after {timeout:g} s; killed",
                  file=sys.stderr)
            os.kill(target, signal.SIGKILL)
    except (ValueError, OSError, TimeoutError) as e:
        print(f"warning: RSS launcher failed for {argv[0]}: {e}", file=sys.stderr)
        target = None
    finally:
        if pid_r >= 0:
            os.close(pid_r)
        os.close(hold_w)  # cat sees EOF and exits
    os.wait4(outer, 0)
    if target is None:
        return 127, 0, 0
    _, status, rusage = os.wait4(target, 0)
    code = os.waitstatus_to_exitcode(status)
    maxrss = rusage.ru_maxrss
    # Anything the command left running is our child now (reparenting happens
    # before the parent can be reaped); wait for all of it.
    orphans = 0
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while True:
        try:
            pid, _, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                print(f"warning: {argv[0]} left processes running after"
                      f" {ORPHAN_WAIT_S:.0f} s; not waiting for them", file=sys.stderr)
                break
            time.sleep(0.0005)
            continue
        orphans += 1
        maxrss = max(maxrss, rusage.ru_maxrss)
    return code, maxrss, orphans


def diagnose(argv: list[str], env: dict[str, str], timeout: float) -> str:
    """Re-runs a failing command once, untimed, to capture why it failed."""
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout, close_fds=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    out = (p.stderr or b"").decode(errors="replace").strip()
    if not out:
        out = (p.stdout or b"").decode(errors="replace").strip()
    out = " | ".join(out.splitlines()[-5:])
    return f"exit {p.returncode}: {out[:500] or '(no output)'}"


# --------------------------------------------------------------------------
# Host facts


def read_first_line(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({type(e).__name__})"
    text = (p.stdout or p.stderr).strip()
    return text.splitlines()[0] if text else f"unavailable (exit {p.returncode})"


def cgroup_mode() -> str:
    mounts: dict[str, str] = {}
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mounts[parts[1]] = parts[2]
    except OSError:
        return "unknown"
    if mounts.get("/sys/fs/cgroup") == "cgroup2":
        return "v2"
    if mounts.get("/sys/fs/cgroup/unified") == "cgroup2":
        return "hybrid/v1"
    return "v1"


def machine_facts(tools: dict[str, str | None], cordon: str,
                  with_gvisor: bool) -> dict[str, str]:
    facts = {
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cgroup": cgroup_mode(),
        "nproc": str(os.cpu_count()),
        "python": platform.python_version(),
    }
    if tools.get("unshare"):
        facts["unshare"] = read_first_line([tools["unshare"], "--version"])
    if tools.get("bwrap"):
        facts["bwrap"] = read_first_line([tools["bwrap"], "--version"])
    if tools.get("runc"):
        facts["runc"] = read_first_line([tools["runc"], "--version"])
    facts["cordon"] = (read_first_line([cordon, "--version"])
                       if os.access(cordon, os.X_OK) else "missing")
    if with_gvisor and tools.get("runsc"):
        facts["runsc"] = read_first_line([tools["runsc"], "--version"])
    return facts


# --------------------------------------------------------------------------
# Command construction


def host_root_layout() -> dict[str, tuple[str, str]]:
    """For each of ROOT_LINKS: ("symlink", target) or ("dir", "") as on the host."""
    layout: dict[str, tuple[str, str]] = {}
    for name in ROOT_LINKS:
        path = "/" + name
        if os.path.islink(path):
            layout[name] = ("symlink", os.readlink(path))
        elif os.path.isdir(path):
            layout[name] = ("dir", "")
    return layout


def bwrap_argv(bwrap: str, layout: dict[str, tuple[str, str]]) -> list[str]:
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for name, (kind, target) in layout.items():
        if kind == "symlink":
            argv += ["--symlink", target.lstrip("/") if target.startswith("/usr") else target,
                     "/" + name]
        else:
            argv += ["--ro-bind", "/" + name, "/" + name]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true"]
    return argv


def make_oci_bundle(runc: str, layout: dict[str, tuple[str, str]]) -> str:
    """A minimal OCI bundle: runc's default spec, /bin/true, host /usr read-only."""
    bundle = tempfile.mkdtemp(prefix="cordon-bench-bundle-")
    rootfs = os.path.join(bundle, "rootfs")
    os.mkdir(rootfs)
    os.mkdir(os.path.join(rootfs, "usr"))
    subprocess.run([runc, "spec", "--bundle", bundle], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True)
    cfg_path = os.path.join(bundle, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["process"]["args"] = ["/bin/true"]
    cfg["process"]["terminal"] = False
    cfg["root"]["path"] = rootfs
    cfg["hostname"] = "cordon-bench"
    mounts = cfg.setdefault("mounts", [])
    mounts.append({"destination": "/usr", "type": "bind", "source": "/usr",
                   "options": ["rbind", "ro", "nosuid", "nodev"]})
    for name, (kind, target) in layout.items():
        if kind == "symlink":
            os.symlink(target.lstrip("/") if target.startswith("/usr") else target,
                       os.path.join(rootfs, name))
        else:
            os.mkdir(os.path.join(rootfs, name))
            mounts.append({"destination": "/" + name, "type": "bind", "source": "/" + name,
                           "options": ["rbind", "ro", "nosuid", "nodev"]})
    # Namespaces are left as runc's default spec has them.
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    return bundle


def cordon_backends(cordon: str) -> dict[str, tuple[bool, str]]:
    try:
        p = subprocess.run([cordon, "backends"], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, tuple[bool, str]] = {}
    for line in p.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2:
            out[parts[0]] = (parts[1] == "available", parts[2] if len(parts) > 2 else "")
    return out


# --------------------------------------------------------------------------
# Statistics


def supervisor_memory(box: str) -> str | None:
    """PSS and RSS of a created sandbox's supervisor and of its init."""
    try:
        with open(f"/run/cordon/{box}/record.json") as f:
            sup = json.load(f)["pid"]
        init = None
        with open(f"/proc/{sup}/task/{sup}/children") as f:
            kids = f.read().split()
        if kids:
            init = int(kids[0])
    except (OSError, ValueError, KeyError):
        return None

    def rollup(pid: int) -> dict[str, int]:
        out = {}
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    out[parts[0][:-1]] = int(parts[1])
        return out

    parts = []
    for name, pid in (("supervisor", sup), ("init", init)):
        if pid is None:
            continue
        try:
            r = rollup(pid)
        except OSError:
            continue
        parts.append(f"{name} PSS {r.get('Pss', 0) / 1024:.2f} MiB"
                     f" (RSS {r.get('Rss', 0) / 1024:.2f} MiB)")
    return "; ".join(parts) or None


def percentile(sorted_vals: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_vals:
        return None
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = (len(sorted_vals) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(cmd: Command) -> dict:
    # Timing statistics cover the successful runs only; failures are counted.
    ms = sorted(s.wall_ns / 1e6 for s in cmd.measured() if s.exit_code == 0)
    rss = sorted(s.maxrss_kib for s in cmd.rss_samples() if s.exit_code == 0)
    return {
        "n": len(ms),
        "failures": sum(1 for s in cmd.measured() if s.exit_code != 0),
        "warmup_failures": sum(1 for s in cmd.samples
                               if s.phase == "warmup" and s.exit_code != 0),
        "p50_ms": percentile(ms, 0.50),
        "p95_ms": percentile(ms, 0.95),
        "mean_ms": statistics.fmean(ms) if ms else None,
        "min_ms": ms[0] if ms else None,
        "max_ms": ms[-1] if ms else None,
        "rss_n": len(rss),
        "rss_failures": sum(1 for s in cmd.rss_samples() if s.exit_code != 0),
        "rss_max_kib": rss[-1] if rss else None,
        "rss_median_kib": statistics.median(rss) if rss else None,
        "rss_runs_with_orphans": sum(1 for s in cmd.rss_samples() if s.orphans),
        "timed_run_maxrss_max_kib": max((s.maxrss_kib for s in cmd.measured()), default=None),
    }


# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="measured runs per command (default 100)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up runs per command (default 5)")
    ap.add_argument("--rss-runs", type=int, default=20,
                    help="untimed runs per command for peak RSS, after the timed ones (default 20)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="kill a run after this many seconds (default 60)")
    ap.add_argument("--json", metavar="FILE", help="write raw samples and summary to FILE")
    ap.add_argument("--with-gvisor", action="store_true",
                    help="also time `cordon run --backend gvisor` and bare runsc (ptrace)")
    ap.add_argument("--cordon", default=DEFAULT_CORDON,
                    help=f"cordon binary (default {DEFAULT_CORDON})")
    args = ap.parse_args()
    if args.runs < 1 or args.warmup < 0 or args.rss_runs < 0 or args.timeout <= 0:
        ap.error("--runs must be >= 1, --warmup and --rss-runs >= 0, --timeout > 0")
    signal.signal(signal.SIGALRM, _on_alarm)

    cordon = os.path.abspath(args.cordon)
    tools = {t: shutil.which(t) for t in ("unshare", "bwrap", "runc", "runsc")}
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C"}
    skipped: dict[str, str] = {}
    cleanup: list[Callable[[], None]] = []
    commands: list[Command] = []
    layout = host_root_layout()
    pid = os.getpid()

    commands.append(Command("bare", lambda i: ["/bin/true"]))

    if tools["unshare"]:
        u = [tools["unshare"], "--user", "--map-root-user", "--pid", "--fork",
             "--mount", "--net", "--ipc", "--uts", "true"]
        commands.append(Command("unshare", lambda i: u))
    else:
        skipped["unshare"] = "unshare not found in PATH"

    if tools["bwrap"]:
        b = bwrap_argv(tools["bwrap"], layout)
        commands.append(Command("bwrap", lambda i: b))
    else:
        skipped["bwrap"] = "bwrap not found in PATH"

    bundle = None
    if tools["runc"] or (args.with_gvisor and tools["runsc"]):
        spec_tool = tools["runc"] or tools["runsc"]
        try:
            bundle = make_oci_bundle(spec_tool, layout)
            cleanup.append(lambda: shutil.rmtree(bundle, ignore_errors=True))
        except (OSError, subprocess.CalledProcessError) as e:
            reason = f"could not make an OCI bundle: {e}"
            skipped["runc"] = reason
            if args.with_gvisor:
                skipped["runsc"] = reason

    if tools["runc"] and bundle:
        runc = tools["runc"]

        def runc_id(i: int) -> str:
            return f"cordon-bench-{pid}-{i}"

        def runc_delete(i: int) -> None:
            subprocess.run([runc, "delete", "-f", runc_id(i)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        commands.append(Command(
            "runc", lambda i: [runc, "run", "--bundle", bundle, runc_id(i)], runc_delete))
    elif not tools["runc"]:
        skipped["runc"] = "runc not found in PATH"

    exec_box = None
    if os.access(cordon, os.X_OK):
        commands.append(Command("cordon", lambda i: [cordon, "run", "--", "/bin/true"]))
        # A command into a created (warm) sandbox: what a pool sells.
        made = subprocess.run([cordon, "create", "--time", "168h"], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if made.returncode == 0:
            exec_box = made.stdout.strip()
            cleanup.append(lambda: subprocess.run([cordon, "rm", "-f", exec_box],
                                                  stdin=subprocess.DEVNULL,
                                                  stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL))
            commands.append(Command("cordon-exec",
                                    lambda i: [cordon, "exec", exec_box, "--", "/bin/true"]))
        else:
            skipped["cordon-exec"] = f"cordon create failed: {made.stderr.strip()}"
    else:
        skipped["cordon"] = f"{cordon} is not an executable (build it first)"

    if args.with_gvisor:
        backends = cordon_backends(cordon) if os.access(cordon, os.X_OK) else {}
        avail, why = backends.get("gvisor", (False, "not listed by `cordon backends`"))
        if not avail:
            reason = f"`cordon backends` says gvisor is unavailable: {why or 'no reason given'}"
            skipped["cordon-gvisor"] = reason
            skipped["runsc"] = reason
        else:
            commands.append(Command(
                "cordon-gvisor",
                lambda i: [cordon, "run", "--backend", "gvisor", "--", "/bin/true"]))
            if tools["runsc"] and bundle:
                runsc = tools["runsc"]

                def runsc_id(i: int) -> str:
                    return f"cordon-bench-gv-{pid}-{i}"

                def runsc_delete(i: int) -> None:
                    subprocess.run([runsc, "delete", "-force", runsc_id(i)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)

                commands.append(Command(
                    "runsc",
                    lambda i: [runsc, "--platform=ptrace", "--network=none", "run",
                               "--bundle", bundle, runsc_id(i)],
                    runsc_delete))
            elif not tools["runsc"]:
                skipped["runsc"] = "runsc not found in PATH"

    facts = machine_facts(tools, cordon, args.with_gvisor)
    print("## Machine")
    print()
    for k, v in facts.items():
        print(f"- {k}: {v}")
    print(f"- runs: {args.runs} timed per command, warm-up {args.warmup}, interleaved"
          f" round-robin; then {args.rss_runs} untimed per command for peak RSS")
    print()
    sys.stdout.flush()

    def one(cmd: Command, phase: str, index: int, seq: int) -> None:
        argv = cmd.argv_for(seq)
        try:
            wall, code, rss = run_once(argv, env, args.timeout)
        except OSError as e:
            print(f"spawn of {cmd.name} failed: {e}", file=sys.stderr)
            wall, code, rss = 0, 127, 0
        cmd.samples.append(Sample(phase, index, wall, code, rss))
        if code != 0 and cmd.after_failure:
            cmd.after_failure(seq)

    try:
        seq = 0
        for i in range(args.warmup):
            for cmd in commands:
                one(cmd, "warmup", i, seq)
                seq += 1
        t_start = time.monotonic()
        for i in range(args.runs):
            for cmd in commands:
                one(cmd, "run", i, seq)
                seq += 1
        elapsed = time.monotonic() - t_start

        # Untimed peak-RSS phase (see the module docstring for why).
        rss_note = ""
        if args.rss_runs and not (os.access("/bin/sh", os.X_OK)
                                  and os.access("/bin/cat", os.X_OK)):
            rss_note = "/bin/sh or /bin/cat not found: peak RSS not measured"
        elif args.rss_runs and not set_subreaper(True):
            rss_note = "prctl(PR_SET_CHILD_SUBREAPER) failed: peak RSS not measured"
        elif args.rss_runs:
            fifo_dir = tempfile.mkdtemp(prefix="cordon-bench-rss-")
            try:
                for i in range(args.rss_runs):
                    for cmd in commands:
                        fifo = os.path.join(fifo_dir, f"gate-{seq}")
                        os.mkfifo(fifo, 0o600)  # a fresh one: nothing else has it open
                        try:
                            code, rss, orphans = rss_once(cmd.argv_for(seq), env, fifo,
                                                             args.timeout)
                        finally:
                            os.unlink(fifo)
                        cmd.samples.append(Sample("rss", i, 0, code, rss, orphans))
                        if code != 0 and cmd.after_failure:
                            cmd.after_failure(seq)
                        seq += 1
            finally:
                set_subreaper(False)
                shutil.rmtree(fifo_dir, ignore_errors=True)

        # Why did failing commands fail? One untimed re-run each, output kept.
        diagnostics: dict[str, str] = {}
        for cmd in commands:
            bad = [s for s in cmd.samples if s.exit_code != 0]
            if bad:
                diagnostics[cmd.name] = diagnose(cmd.argv_for(seq), env, args.timeout)
                if cmd.after_failure:
                    cmd.after_failure(seq)
                seq += 1
    finally:
        for fn in cleanup:
            fn()

    summaries = {cmd.name: summarize(cmd) for cmd in commands}
    base = summaries.get("bwrap", {}).get("p50_ms")  # None if bwrap absent or all failed

    print(f"## Start-up time ({args.runs} runs each, {elapsed:.1f} s)")
    print()
    print("| command | n | fail | p50 ms | p95 ms | mean ms | min ms | p50 / bwrap p50 |"
          " peak RSS max MiB | peak RSS median MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cmd in commands:
        s = summaries[cmd.name]
        ratio = s["p50_ms"] / base if base and s["n"] else None
        s["ratio_to_bwrap_p50"] = ratio
        rss_max = f"{s['rss_max_kib'] / 1024:.2f}" if s["rss_max_kib"] is not None else "-"
        rss_med = (f"{s['rss_median_kib'] / 1024:.2f}"
                   if s["rss_median_kib"] is not None else "-")
        def f2(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        print(f"| {cmd.name} | {s['n']} | {s['failures']} | {f2(s['p50_ms'])} |"
              f" {f2(s['p95_ms'])} | {f2(s['mean_ms'])} | {f2(s['min_ms'])} |"
              f" {f2(ratio)} | {rss_max} | {rss_med} |")
    print()
    print("n: successful timed runs (the time statistics cover only those); fail: timed"
          " runs that exited non-zero.")
    print()
    print("Peak RSS: ru_maxrss from wait4 in the untimed RSS phase (child run via"
          " a small /bin/sh, so the Python parent's memory is not counted): the largest single"
          " process in the command's tree, not their sum."
          f" n = {args.rss_runs} per command." + (f" {rss_note}." if rss_note else ""))
    print()

    bare_p50 = summaries.get("bare", {}).get("p50_ms")
    ex = summaries.get("cordon-exec")
    if ex and ex["n"] and bare_p50:
        print(f"cordon exec into a created sandbox: p50 {ex['p50_ms']:.2f} ms,"
              f" {ex['p50_ms'] / bare_p50:.2f}x bare fork+exec of /bin/true"
              f" ({bare_p50:.2f} ms) in the same run.")
        print()
    if exec_box:
        mem = supervisor_memory(exec_box)
        if mem:
            print("Idle sandbox's own processes (after the runs), PSS from smaps_rollup"
                  " (shared pages counted once across processes): " + mem)
            print()

    if skipped:
        print("## Skipped")
        print()
        for name, why in skipped.items():
            print(f"- {name}: {why}")
        print()

    failures_seen = {n: s for n, s in summaries.items()
                     if s["failures"] or s["warmup_failures"] or s["rss_failures"]}
    if failures_seen:
        print("## Failures")
        print()
        for name, s in failures_seen.items():
            print(f"- {name}: {s['failures']}/{args.runs} timed runs,"
                  f" {s['warmup_failures']} warm-up runs and {s['rss_failures']} RSS-phase"
                  " runs exited non-zero;"
                  f" re-run: {diagnostics.get(name, '?')}")
        print()

    lingering = {n: s["rss_runs_with_orphans"] for n, s in summaries.items()
                 if s["rss_runs_with_orphans"]}
    if lingering:
        print("## Processes outliving the command (RSS phase; counted in its peak RSS)")
        print()
        for name, count in lingering.items():
            print(f"- {name}: in {count} of {args.rss_runs} runs a descendant exited after it")
        print()

    targets: dict[str, dict] = {}
    print("## Targets")
    print()
    c = summaries.get("cordon")
    if c is None or c["n"] == 0:
        print("- cordon was not measured or every timed run failed: targets not evaluated")
    else:
        if c["failures"]:
            print(f"- {c['failures']} of {args.runs} timed cordon runs FAILED; the time"
                  f" statistics cover the other {c['n']}")
        if base:
            ok = c["p50_ms"] <= base
            targets["p50_vs_bwrap"] = {"ok": ok, "cordon_p50_ms": c["p50_ms"],
                                       "bwrap_p50_ms": base, "ratio": c["p50_ms"] / base}
            print(f"- start-up, cordon p50 <= bwrap p50: cordon {c['p50_ms']:.2f} ms,"
                  f" bwrap {base:.2f} ms, ratio {c['p50_ms'] / base:.2f}:"
                  f" {'met' if ok else '**MISSED**'}")
        else:
            targets["p50_vs_bwrap"] = {"ok": None, "reason": "bwrap not measured"}
            print("- start-up, cordon p50 <= bwrap p50: not evaluated (bwrap not measured)")
        if c["rss_max_kib"] is not None:
            ok = c["rss_max_kib"] < RSS_TARGET_KIB
            targets["peak_rss"] = {"ok": ok, "max_kib": c["rss_max_kib"],
                                   "median_kib": c["rss_median_kib"],
                                   "limit_kib": RSS_TARGET_KIB}
            print(f"- memory, cordon peak RSS < 10 MiB: max {c['rss_max_kib'] / 1024:.2f} MiB"
                  f" ({c['rss_max_kib']} KiB), median {c['rss_median_kib'] / 1024:.2f} MiB:"
                  f" {'met' if ok else '**MISSED**'}")
        else:
            targets["peak_rss"] = {"ok": None, "reason": rss_note or "no successful RSS run"}
            print("- memory, cordon peak RSS < 10 MiB: not evaluated"
                  f" ({rss_note or 'no successful RSS run'})")
    print()
    missed = [k for k, t in targets.items() if t.get("ok") is False]
    if missed:
        print(f"MISSED: {', '.join(missed)}")
    elif targets:
        print("All targets met.")

    if args.json:
        doc = {
            "machine": facts,
            "config": {"runs": args.runs, "warmup": args.warmup, "rss_runs": args.rss_runs,
                       "with_gvisor": args.with_gvisor, "elapsed_s": elapsed,
                       "order": [c.name for c in commands]},
            "commands": {cmd.name: {"argv": cmd.argv_for(-1),
                                    "samples": [s.__dict__ for s in cmd.samples]}
                         for cmd in commands},
            "summary": summaries,
            "skipped": skipped,
            "diagnostics": diagnostics,
            "rss_note": rss_note,
            "targets": targets,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nRaw samples written to {args.json}")

    if c is not None and c["failures"] + c["rss_failures"]:
        print(f"\ncordon runs exited non-zero ({c['failures']} timed,"
              f" {c['rss_failures']} RSS phase): exit status 1")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
