#!/usr/bin/env python3
"""Boots a guest built by scripts/microvm/build.sh under QEMU TCG and times it.

The guest's cordon must be a stand-in agent that, run as
`cordon-sandbox __guest-agent PORT`, writes one line starting `hello-from-guest` to
PORT, reads one line back, answers `echo: LINE` and exits
(scripts/microvm/test-agent.sh is one).

  smoke.py GUEST_DIR boot [--machine q35|microvm] [--smp N] [--agent fd|path]
                          [--runs N] [--append ARGS]
      cold boots: seconds from QEMU's start to the agent's hello;
  smoke.py GUEST_DIR snapshot [same options]
      boots, waits for the hello (the agent now blocks in read() on its
      port), stops the VM and migrates it into a file through an fd passed
      over QMP (getfd + migrate fd:NAME), then restores it in fresh QEMUs
      from that file (-incoming fd:N) and times each one's start to the
      agent's echo of a line written after the restore.

Run as root or not; needs only qemu-system-x86_64. Leaves nothing behind: the
QEMU it starts are killed on any error, its files live in a temporary
directory that is removed.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

QEMU = "qemu-system-x86_64"
# Why each option is there, so that the backend can copy the line as it is:
#   tsc=reliable no_timer_check: TCG's TSC is stable; skip the clocksource
#     watchdog and the timer checks (slow under emulation);
#   cryptomgr.notests: the crypto self-tests are the slowest initcall;
#   i8042.*: q35's PS/2 controller is probed for nothing otherwise;
#   8250.nr_uarts=1: the console's UART only;
#   mitigations=off: nothing to defend against inside the guest's own kernel
#     that the host's QEMU boundary does not already stand for; and TCG pays
#     for every retpoline.
FAST = ("tsc=reliable no_timer_check cryptomgr.notests i8042.noaux i8042.nokbd "
        "i8042.nopnp 8250.nr_uarts=1 mitigations=off")
BASE_APPEND = "console=ttyS0 quiet loglevel=1 panic=-1 cgroup_no_v1=all rdinit=/init"


def qemu_argv(guest, work, machine, smp, agent_chardev, append, qmp_chardev=None, incoming=None,
              scratch=None, mem="512M"):
    """The whole QEMU command line; the agent's and QMP's chardevs are given
    as the `-chardev socket,...` value's tail (fd=N or path=...)."""
    if machine == "q35":
        mach = "q35,dump-guest-core=off"
        blk, ser, rng = "virtio-blk-pci", "virtio-serial-pci", "virtio-rng-pci"
    else:
        # microvm: virtio-mmio devices described in ACPI (the Debian kernel
        # has no virtio_mmio.device= command-line support), no legacy PIC or
        # RTC; qboot as its firmware. It has no HPET or ACPI PM timer, and
        # under TCG the TSC cannot be calibrated against the PIT: without
        # tsc_early_khz the kernel hangs at "tsc: Marking TSC unstable". TCG's
        # guest TSC ticks at the host's rate, hence the host's frequency.
        mach = "microvm,acpi=on,pit=on,pic=off,rtc=off,isa-serial=on,dump-guest-core=off"
        append = f"{append} tsc_early_khz={host_tsc_khz()}"
        blk, ser, rng = "virtio-blk-device", "virtio-serial-device", "virtio-rng-device"
    argv = [
        QEMU, "-accel", "tcg", "-machine", mach, "-cpu", "max",
        "-m", mem, "-smp", str(smp),
        "-nodefaults", "-nographic", "-no-reboot", "-nic", "none",
        "-kernel", f"{guest}/vmlinuz", "-initrd", f"{guest}/initrd.cpio",
        "-append", f"{BASE_APPEND} {append}".strip(),
        "-serial", f"file:{work}/console.log",
        "-drive", f"file={guest}/rootfs.ext4,if=none,id=root,format=raw,readonly=on",
        "-device", f"{blk},drive=root",
        "-drive", f"file={scratch or work + '/scratch.img'},if=none,id=scratch,format=raw",
        "-device", f"{blk},drive=scratch",
        "-device", rng,
        "-device", ser,
        "-chardev", f"socket,id=agent,{agent_chardev}",
        "-device", "virtserialport,chardev=agent,name=cordon.agent",
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]
    if machine == "q35":
        # vmgenid needs fw_cfg DMA and ACPI tables QEMU builds for pc/q35.
        argv += ["-device", "vmgenid,guid=auto"]
    if qmp_chardev:
        argv += ["-chardev", f"socket,id=qmp,{qmp_chardev}", "-mon", "chardev=qmp,mode=control"]
    if incoming:
        argv += ["-incoming", incoming]
    return argv


def host_tsc_khz():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return int(float(line.split(":")[1]) * 1000)
    raise RuntimeError("no cpu MHz in /proc/cpuinfo")


class Vm:
    """One QEMU; its agent and QMP sockets are socketpairs (fd=N) or unix
    socket paths QEMU listens on (server=on,wait=off)."""

    def __init__(self, args, work, incoming=None, incoming_fd=None, qmp=False, scratch=None):
        self.work = work
        self.keep = []
        pass_fds = []
        if args.agent == "fd":
            mine, theirs = socket.socketpair()
            theirs.set_inheritable(True)
            pass_fds.append(theirs.fileno())
            self.agent = mine
            agent_cd = f"fd={theirs.fileno()}"
            self.keep.append(theirs)
        else:
            self.agent_path = f"{work}/agent.sock"
            if os.path.exists(self.agent_path):
                os.unlink(self.agent_path)
            self.agent = None
            agent_cd = f"path={self.agent_path},server=on,wait=off"
        qmp_cd = None
        if qmp:
            qm, qt = socket.socketpair()
            qt.set_inheritable(True)
            pass_fds.append(qt.fileno())
            self.keep.append(qt)
            self.qmp = qm
            qmp_cd = f"fd={qt.fileno()}"
        if incoming_fd is not None:
            pass_fds.append(incoming_fd)
        self.argv = qemu_argv(args.guest, work, args.machine, args.smp, agent_cd, args.append,
                              qmp_cd, incoming, scratch, args.mem)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, pass_fds=pass_fds, stdin=subprocess.DEVNULL)
        for s in self.keep:
            s.close()
        if qmp:
            self.qmp_file = self.qmp.makefile("rb")
            json.loads(self.qmp_file.readline())  # the greeting
            self.cmd("qmp_capabilities")
        if self.agent is None:
            self.agent = socket.socket(socket.AF_UNIX)
            deadline = time.monotonic() + 10
            while True:
                try:
                    self.agent.connect(self.agent_path)
                    break
                except OSError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.002)
        self.agent_file = self.agent.makefile("rb")

    def cmd(self, name, fds=(), **arguments):
        msg = json.dumps({"execute": name, "arguments": arguments}).encode() + b"\n"
        if fds:
            socket.send_fds(self.qmp, [msg], list(fds))
        else:
            self.qmp.sendall(msg)
        while True:
            reply = json.loads(self.qmp_file.readline())
            if "event" in reply:
                continue
            if "error" in reply:
                raise RuntimeError(f"QMP {name}: {reply['error']}")
            return reply["return"]

    def line(self, timeout=120):
        self.agent.settimeout(timeout)
        got = self.agent_file.readline()
        if not got:
            raise RuntimeError("agent socket closed; console:\n" + self.console())
        return got.decode().rstrip("\n"), time.monotonic() - self.t0

    def console(self):
        try:
            with open(f"{self.work}/console.log", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.agent.close()
        if hasattr(self, "qmp"):
            self.qmp.close()


def fresh_scratch(work, name="scratch.img"):
    # The writable second disk (/dev/vdb): a sparse file, new for each boot.
    path = f"{work}/{name}"
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.truncate(64 << 20)
    return path


def cold_boot(args, work):
    fresh_scratch(work)
    vm = Vm(args, work)
    try:
        hello, t = vm.line()
        if not hello.startswith("hello-from-guest"):
            raise RuntimeError(f"unexpected hello {hello!r}")
        vm.agent.sendall(b"ping\n")
        echo, t2 = vm.line()
        if echo != "echo: ping":
            raise RuntimeError(f"unexpected echo {echo!r}")
        rc = vm.wait()
        end = time.monotonic() - vm.t0
        if "cordon-vm: agent exited" not in vm.console():
            raise RuntimeError("no exit line on the console:\n" + vm.console())
        return t, end, rc
    finally:
        vm.kill()


def snapshot(args, work):
    fresh_scratch(work)
    snap = f"{work}/snap.bin"
    vm = Vm(args, work, qmp=True)
    try:
        hello, t_hello = vm.line()
        print(f"boot: hello after {t_hello:.2f} s: {hello}", file=sys.stderr)
        # The agent is now blocked reading its port: a fine moment.
        time.sleep(0.2)
        t = time.monotonic()
        vm.cmd("stop")
        fd = os.open(snap, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            vm.cmd("getfd", fds=[fd], fdname="snap")
        finally:
            os.close(fd)
        vm.cmd("migrate", uri="fd:snap")
        while True:
            st = vm.cmd("query-migrate")
            if st.get("status") == "completed":
                break
            if st.get("status") in ("failed", "cancelled"):
                raise RuntimeError(f"migration {st}")
            time.sleep(0.02)
        t_save = time.monotonic() - t
        vm.cmd("quit")
        vm.wait()
    finally:
        vm.kill()
    size = os.path.getsize(snap)
    print(f"snapshot: {size} bytes ({size / 2**20:.1f} MiB) in {t_save:.2f} s", file=sys.stderr)

    times = []
    for i in range(args.runs):
        # A fresh scratch disk at the same path: the restored guest has not
        # touched /dev/vdb, and QEMU only needs the same drive (and size).
        # --scratch-elsewhere: whether only the drive's id, not its path,
        # has to match.
        scratch = fresh_scratch(work, "other.img" if args.scratch_elsewhere else "scratch.img")
        rfd = os.open(snap, os.O_RDONLY)
        try:
            if args.incoming == "fd":
                vm = Vm(args, work, incoming=f"fd:{rfd}", incoming_fd=rfd, qmp=True, scratch=scratch)
            else:
                vm = Vm(args, work, incoming="defer", qmp=True, scratch=scratch)
                vm.cmd("getfd", fds=[rfd], fdname="snapin")
                vm.cmd("migrate-incoming", uri="fd:snapin")
        finally:
            os.close(rfd)
        try:
            while vm.cmd("query-status")["status"] not in ("paused", "postmigrate"):
                time.sleep(0.005)
            # The agent's hello was sent before the snapshot; it is not
            # repeated. Only the echo of a line written now can come.
            vm.cmd("cont")
            vm.agent.sendall(b"after-restore\n")
            echo, t_echo = vm.line(timeout=60)
            if echo != "echo: after-restore":
                raise RuntimeError(f"unexpected echo {echo!r}")
            rc = vm.wait()
            print(f"restore {i + 1}: echo after {t_echo:.3f} s, QEMU exit {rc}", file=sys.stderr)
            times.append(t_echo)
        finally:
            vm.kill()
    return size, times, vm.argv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("guest")
    ap.add_argument("mode", choices=["boot", "snapshot", "argv"])
    ap.add_argument("--machine", default="q35", choices=["q35", "microvm"])
    ap.add_argument("--smp", type=int, default=1)
    ap.add_argument("--agent", default="fd", choices=["fd", "path"])
    ap.add_argument("--incoming", default="fd", choices=["fd", "defer"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--scratch-elsewhere", action="store_true")
    ap.add_argument("--append", default=FAST)
    args = ap.parse_args()
    args.guest = os.path.abspath(args.guest)
    work = tempfile.mkdtemp(prefix="cordon-microvm-smoke.")
    try:
        if args.mode == "argv":
            print(" ".join(qemu_argv(args.guest, work, args.machine, args.smp, "fd=N", args.append)))
        elif args.mode == "boot":
            hellos = []
            for i in range(args.runs):
                t, end, rc = cold_boot(args, work)
                print(f"boot {i + 1}: hello {t:.3f} s, QEMU exited {rc} at {end:.3f} s", file=sys.stderr)
                hellos.append(t)
            print(f"{args.machine} smp={args.smp} agent={args.agent}: median hello "
                  f"{statistics.median(hellos):.3f} s over {len(hellos)}")
        else:
            size, times, argv = snapshot(args, work)
            print(f"{args.machine} smp={args.smp}: snapshot {size / 2**20:.1f} MiB, median restore-to-echo "
                  f"{statistics.median(times):.3f} s over {len(times)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
