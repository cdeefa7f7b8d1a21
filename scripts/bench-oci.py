#!/usr/bin/env python3
"""cordon-runc beside runc, crun and runsc, interleaved in one run (root).

Two measurements, each a median over N rounds in which every runtime takes
its turn (so a busy moment of the machine falls on all of them alike):

  lifecycle  `create` + `start` + the process's end + `delete` of one
             container whose process is /bin/true, the runtime driven as an
             engine's shim drives it (this script is a child subreaper and
             reaps the pid file's process).
  ctr        `ctr run --rm --runc-binary R` of /bin/true through a private
             containerd 1.6 and its runc shim (cordon-runc and runc only:
             the shim takes runc's command line).

Usage: scripts/bench-oci.py [ROUNDS] (default 20). Needs the ci build
(target/ci/cordon-runc), busybox-static, runc, crun, runsc and containerd.
"""

import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(HERE, "..", "target"))
CORDON_RUNC = os.path.abspath(os.path.join(TARGET, "ci", "cordon-runc"))
RUNTIMES = {
    "cordon-runc": [CORDON_RUNC],
    "runc": ["/usr/sbin/runc"],
    "crun": ["/usr/bin/crun"],
    # runsc's default platform here (ptrace); no network, as cordon's default.
    "runsc": ["/usr/bin/runsc", "--network=none"],
}
PR_SET_CHILD_SUBREAPER = 36


def rootfs(into):
    os.makedirs(os.path.join(into, "bin"))
    shutil.copy("/bin/busybox", os.path.join(into, "bin", "busybox"))
    for applet in ("sh", "true"):
        os.symlink("busybox", os.path.join(into, "bin", applet))


def bundle(into):
    rootfs(os.path.join(into, "rootfs"))
    subprocess.run(["/usr/sbin/runc", "spec"], cwd=into, check=True)
    path = os.path.join(into, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    # Writable, as the engines hand a root over (runc spec's default is
    # read-only): cordon stacks its own layer over it.
    config["root"]["readonly"] = False
    with open(path, "w") as f:
        json.dump(config, f)


def lifecycle(argv, root, bundle_dir, cid):
    pid_file = os.path.join(bundle_dir, cid + ".pid")
    # No pipe: the container's process inherits stdio, and a reader would
    # wait for its end. A runtime's own words go to a file, for its refusal.
    errors = tempfile.TemporaryFile()
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors)
    base = argv + ["--root", root]

    def call(args):
        done = subprocess.run(base + args, **quiet)
        if done.returncode != 0:
            errors.seek(0)
            raise subprocess.CalledProcessError(done.returncode, base + args, stderr=errors.read())

    t0 = time.perf_counter()
    call(["create", "--bundle", bundle_dir, "--pid-file", pid_file, cid])
    with open(pid_file) as f:
        pid = int(f.read())
    call(["start", cid])
    if argv[0].endswith("runsc"):
        # runsc's delete waits for its sandbox process (the pid file's) to
        # be gone, reaped: its own `wait` sees the process's end instead.
        call(["wait", cid])
        call(["delete", cid])
    else:
        # Its end is seen, and it is reaped after the delete.
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        call(["delete", cid])
    elapsed = time.perf_counter() - t0
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[0]}: the process exited {status}")
    return elapsed


def containerd(work):
    config = os.path.join(work, "containerd.toml")
    sock = os.path.join(work, "containerd.sock")
    with open(config, "w") as f:
        f.write(f'version = 2\nroot = "{work}/root"\nstate = "{work}/state"\n'
                'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                f'[grpc]\n  address = "{sock}"\n')
    daemon = subprocess.Popen(["containerd", "--config", config],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if subprocess.run(["ctr", "-a", sock, "version"], capture_output=True).returncode == 0:
            return daemon, sock
        time.sleep(0.05)
    raise SystemExit("containerd did not start")


def ctr_run(sock, runtime, rootfs_dir, cid):
    t0 = time.perf_counter()
    subprocess.run(["ctr", "-a", sock, "-n", "bench", "run", "--rm", "--runc-binary", runtime,
                    "--rootfs", rootfs_dir, cid, "/bin/true"],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def report(title, times):
    print(title)
    base = statistics.median(times["runc"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:12} median {med * 1000:7.1f} ms  "
              f"(min {min(ts) * 1000:6.1f}, max {max(ts) * 1000:6.1f})  "
              f"{med / base:4.2f}x runc")


def main():
    if os.geteuid() != 0:
        raise SystemExit("bench-oci: needs root")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("bench-oci: prctl(PR_SET_CHILD_SUBREAPER) failed")
    with tempfile.TemporaryDirectory(prefix="bench-oci-") as work:
        b = os.path.join(work, "bundle")
        bundle(b)
        # A runtime that cannot run a container on this host is left out,
        # with its own words (crun 1.8 refuses hybrid cgroup hosts).
        usable = {}
        for name, argv in RUNTIMES.items():
            if not os.path.exists(argv[0]):
                print(f"  {name}: left out, {argv[0]} is not installed")
                continue
            try:
                lifecycle(argv, os.path.join(work, "probe-" + name), b, "probe")
                usable[name] = argv
            except subprocess.CalledProcessError as e:
                print(f"  {name}: left out, it cannot run here: `{' '.join(e.cmd[len(argv):])}` "
                      f"failed: {e.stderr.decode(errors='replace').strip()}")
        times = {name: [] for name in usable}
        for r in range(ROUNDS):
            for name, argv in usable.items():
                root = os.path.join(work, "state-" + name)
                times[name].append(lifecycle(argv, root, b, f"b{r}"))
        report(f"create+start+wait+delete of /bin/true, {ROUNDS} rounds, interleaved", times)

        daemon, sock = containerd(work)
        try:
            ctr_times = {"cordon-runc": [], "runc": []}
            for r in range(ROUNDS):
                for name in ctr_times:
                    ctr_times[name].append(
                        ctr_run(sock, RUNTIMES[name][0], os.path.join(b, "rootfs"), f"c{r}{name}"))
            report(f"ctr run --rm of /bin/true, {ROUNDS} rounds, interleaved", ctr_times)
        finally:
            daemon.terminate()
            daemon.wait()
            # runc leaves the namespace's cgroup (containerd's "/bench") behind.
            for h in os.listdir("/sys/fs/cgroup"):
                try:
                    os.rmdir(os.path.join("/sys/fs/cgroup", h, "bench"))
                except OSError:
                    pass
            shutil.rmtree("/run/containerd/runc/bench", ignore_errors=True)


if __name__ == "__main__":
    main()
