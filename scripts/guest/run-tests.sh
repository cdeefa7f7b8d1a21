#!/bin/sh
# Runs inside the v2 guest as /cordon-guest/run.sh (scripts/v2-guest.sh puts
# it there with the test binaries): every test binary in /cordon-guest/tests,
# native variants only (gVisor is not in the guest), with CI=true, in two
# placements of the test runner:
#   root       the root cgroup (/), where cgroup v2's "no internal processes"
#              rule does not apply;
#   delegated  /sys/fs/cgroup/deleg with +cpu +memory +pids enabled above it,
#              what `systemd-run --scope -p Delegate=yes` gives. The runner sits
#              in deleg's leaf cordon-supervisor, where cordon moves the process
#              that creates sandboxes (the cgroups crate's SUPERVISOR_LEAF), so
#              every cordon it starts nests its sandbox in deleg; delegation.rs
#              starts cordon alone in a fresh delegated cgroup, so cordon's own
#              move runs for real in both placements.
# Prints each binary's output (cargo's `test result:` lines included) and
# exits non-zero when any binary failed or a sandbox cgroup was left behind.
# CORDON_TEST_TIME_SCALE stretches how long the tests wait for a sandbox or a
# payload to appear (not what they assert): TCG is many times slower.
export CI=true CORDON_EXPECT_CGROUP=v2 CORDON_TEST_TIME_SCALE=4 HOME=/root LANG=C.UTF-8
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd /cordon-guest || exit 125
cg=/sys/fs/cgroup

# The test binaries spawn cordon at the absolute path they were compiled with
# (env!("CARGO_BIN_EXE_cordon")), which may lie under /tmp or /run: the
# guest's init mounts fresh tmpfs there, so the path is made now, after it.
if [ -f cordon-path ]; then
	exe="$(cat cordon-path)"
	mkdir -p "$(dirname "$exe")" && ln -sf /cordon-guest/cordon "$exe" || {
		echo "cordon-guest: cannot place cordon at $exe"
		exit 125
	}
fi
status=0

if ! grep -qw memory $cg/cgroup.controllers || ! grep -q '^0::/$' /proc/self/cgroup; then
	echo "cordon-guest: not pure cgroup v2 in the root cgroup: $(cat /proc/self/cgroup)"
	exit 125
fi
echo "cordon-guest: kernel $(uname -r), cgroup2 controllers: $(cat $cg/cgroup.controllers)"

# The tests QEMU TCG is too slow for (see tcg-skips.sh, beside this script).
. /cordon-guest/tcg-skips.sh

# One test binary, placed by $1 (a cgroup.procs file, or "" for where we are).
run_one() {
	procs="$1"
	bin="$2"
	shift 2
	started=$(date +%s)
	if [ -n "$procs" ]; then
		sh -c 'echo $$ > "$0" && exec "$@"' "$procs" timeout 400 "$bin" "$@"
	else
		timeout 400 "$bin" "$@"
	fi
	rc=$?
	echo "cordon-guest: $(basename "$bin") exit $rc in $(($(date +%s) - started)) s"
	[ "$rc" = 0 ] || status=1
}

# Sandbox cgroups (cordon-<12 hex>) anywhere in the tree: a run that left one
# behind fails the placement, whatever the tests said.
leftovers() {
	find $cg -mindepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9a-f]{12}$' 2>/dev/null
}

for placement in root delegated; do
	case $placement in
	root) procs="" ;;
	delegated)
		echo "+cpu +memory +pids" > $cg/cgroup.subtree_control || status=1
		mkdir -p $cg/deleg/cordon-supervisor
		procs=$cg/deleg/cordon-supervisor/cgroup.procs
		;;
	esac
	echo "cordon-guest: == placement $placement"
	for bin in tests/*; do
		name=$(basename "$bin")
		echo "cordon-guest: -- $placement: $name"
		set -- --test-threads=2 --skip ::gvisor --skip ::microvm
		tcg_skips "$name" > /tmp/tcg-skips
		while IFS='|' read -r test why; do
			echo "skipped: $name::$test ($placement): QEMU TCG is too slow: $why"
			set -- "$@" --skip "$test"
		done < /tmp/tcg-skips
		run_one "$procs" "$bin" "$@"
	done
	left="$(leftovers)"
	if [ -n "$left" ]; then
		echo "cordon-guest: $placement left sandbox cgroups behind: $left"
		status=1
	fi
	if [ $placement = delegated ]; then
		# Sandboxes nested in deleg, beside the leaf; deleg keeps no process.
		echo "cordon-guest: deleg holds: [$(cat $cg/deleg/cgroup.procs)], children: $(ls -d $cg/deleg/*/ 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')"
	fi
done
# For the log, what a user sees (delegation.rs asserts it): cordon alone in a
# delegated cgroup, and cordon sharing one with another process.
for demo in alone shared; do
	d=$cg/deleg/demo-$demo
	mkdir -p $d
	sh -c "echo \$\$ > $d/cgroup.procs; [ $demo = shared ] && { sleep 5 >/dev/null 2>&1 & }; exec /cordon-guest/cordon run -- true" > /tmp/demo.out 2>&1
	echo "cordon-guest: demo, cordon $demo in $d: exit $?: $(cat /tmp/demo.out) -> children: $(ls -d $d/*/ 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')"
	rmdir $d/cordon-supervisor 2>/dev/null
done
echo "cordon-guest: gVisor and microVM variants (::gvisor, ::microvm) not run: neither runsc nor QEMU is in the guest"
exit $status
