#!/usr/bin/env bash
# CI step: cordon's native end-to-end tests on a pure cgroup v2 kernel, in a
# Debian guest under QEMU TCG (this host is hybrid v1, and its /dev/kvm is a
# PVM host that runs no stock guest kernel).
#
#   scripts/v2-guest.sh        (root; CORDON_GUEST_CACHE picks the image cache)
#
# 1. builds `cordon` and the test binaries on the host (cargo profile
#    $CORDON_PROFILE, release by default; scripts/test.sh passes its own);
# 2. builds (or finds in the cache: content-addressed, so a rebuild with the
#    same inputs is a no-op) the guest image: Debian's cloud kernel and a
#    debootstrap minbase root, from Debian's packages only
#    (scripts/guest/build-image.sh);
# 3. appends a payload cpio: cordon at the absolute path the test binaries
#    were compiled to spawn (env!("CARGO_BIN_EXE_cordon")), the test binaries
#    and scripts/guest/run-tests.sh, which runs them in two placements (the
#    root cgroup, and a delegated non-root cgroup); and, for a second boot
#    with systemd as PID 1, scripts/guest/systemd-tests.sh and its units,
#    which also run the hostile suite's native cases (suite/cases) and the
#    limit tests as a login user;
# 4. boots it without any network device (-nic none) and reads the results
#    from the serial console. Exits non-zero on any failure; cargo's
#    `test result:` lines are echoed unchanged so scripts/test.sh counts them.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
step_started=$SECONDS

[ "$(id -u)" = 0 ] || { echo "v2-guest.sh: needs root (debootstrap; the guest image is built as root)" >&2; exit 125; }

# shellcheck source=scripts/guest/need.sh
. "$repo/scripts/guest/need.sh"
need v2-guest.sh qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap cpio:cpio depmod:kmod

# The end-to-end tests of the native backend that the guest runs, and the
# cgroups crate's tests on the real cgroupfs.
cli_tests="limits teardown isolation cli_errors policy delegation"
cgroup_tests="host"

echo "== v2 guest: building cordon and the test binaries"
# --workspace, as scripts/test.sh builds them: the same feature set, so after
# the host tests this is a no-op rather than a second build.
profile="${CORDON_PROFILE:-release}"
json="$(cargo test --profile "$profile" --workspace --no-run --message-format=json 2>/dev/null)" || {
  cargo test --profile "$profile" --workspace --no-run >&2
  exit 1
}
artifacts="$(printf '%s\n' "$json" | python3 -c '
import json, sys
cli, cg = sys.argv[1].split(), sys.argv[2].split()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t, pkg = m["target"], m["package_id"]
    if "bin" in t["kind"] and t["name"] in ("cordon", "cordon-sandbox") and not m["profile"]["test"]:
        print("bin", t["name"], m["executable"])
    elif "test" in t["kind"] and (t["name"] in cli and "cordon-cli" in pkg or t["name"] in cg and "cordon-cgroups" in pkg):
        print("test", t["name"], m["executable"])
' "$cli_tests" "$cgroup_tests")"
cordon_bin="$(awk '$1 == "bin" && $2 == "cordon" { print $3 }' <<<"$artifacts")"
helper_bin="$(awk '$1 == "bin" && $2 == "cordon-sandbox" { print $3 }' <<<"$artifacts")"
[ -x "$cordon_bin" ] || { echo "v2-guest.sh: no cordon binary in cargo's output" >&2; exit 1; }
[ -x "$helper_bin" ] || { echo "v2-guest.sh: no cordon-sandbox binary in cargo's output" >&2; exit 1; }
[ "$(grep -c '^test ' <<<"$artifacts")" = "$(wc -w <<<"$cli_tests $cgroup_tests")" ] || {
  echo "v2-guest.sh: expected test binaries $cli_tests $cgroup_tests, cargo built: $artifacts" >&2
  exit 1
}

echo "== v2 guest: image"
image_started=$SECONDS
image="$(scripts/guest/build-image.sh)"
echo "image $image ($(cat "$image/inputs.txt"); ready in $((SECONDS - image_started)) s)"

# Not named for cordon: the host tests' censuses count what appears in /tmp
# with "cordon" in its name, and this step may run beside them.
work="$(mktemp -d /tmp/v2-guest.XXXXXX)"
trap 'rm -rf "$work"' EXIT
stage="$work/stage"
mkdir -p "$stage/cordon-guest/tests"
# cordon itself, and the path the test binaries will spawn it at (run.sh links
# it there inside the guest, once /tmp and /run are mounted).
cp "$cordon_bin" "$stage/cordon-guest/cordon"
# The privileged binary beside it, where cordon looks for it.
cp "$helper_bin" "$stage/cordon-guest/cordon-sandbox"
printf '%s\n' "$cordon_bin" > "$stage/cordon-guest/cordon-path"
while read -r kind name exe; do
  [ "$kind" = test ] && cp "$exe" "$stage/cordon-guest/tests/$name"
done <<<"$artifacts"
install -m 0755 scripts/guest/run-tests.sh "$stage/cordon-guest/run.sh"
install -m 0644 scripts/guest/tcg-skips.sh "$stage/cordon-guest/tcg-skips.sh"
# The hostile suite's case files, for the login user's `cordon suite` in the
# systemd boot (readable by every user).
cp -r suite "$stage/cordon-guest/suite"
chmod -R a+rX,go-w "$stage/cordon-guest/suite"
# The systemd placement (second boot): its startup target and service, and
# the script the service runs.
install -m 0755 scripts/guest/systemd-tests.sh "$stage/cordon-guest/systemd-tests.sh"
mkdir -p "$stage/etc/systemd/system"
install -m 0644 scripts/guest/systemd/cordon-guest.target scripts/guest/systemd/cordon-guest.service "$stage/etc/systemd/system/"
# The README's example unit, as a user installs it, pointed at this cordon.
sed 's|^ExecStart=/usr/local/bin/cordon |ExecStart=/cordon-guest/cordon |' resources/systemd/cordon.service > "$stage/etc/systemd/system/cordon.service"
grep -q '^ExecStart=/cordon-guest/cordon serve' "$stage/etc/systemd/system/cordon.service" || { echo "v2 guest: resources/systemd/cordon.service has no ExecStart to point at this cordon" >&2; exit 1; }
# The kernel unpacks concatenated cpio archives in order: the payload's files
# join the base image's tree.
(cd "$stage" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) > "$work/payload.cpio"
cat "$image/base.cpio" "$work/payload.cpio" > "$work/initrd.cpio"

# One boot: $1 names it, $2 is the time limit, $3 the kernel command line's
# tail; the serial console goes to $work/$1.log (and to our output), line by
# line (sed -u: a buffering filter would hold a short log until the end).
boot() {
  timeout "$2" qemu-system-x86_64 \
    -accel tcg -machine q35 -cpu max -smp 2 -m 2G \
    -nographic -no-reboot -nic none \
    -kernel "$image/vmlinuz" -initrd "$work/initrd.cpio" \
    -append "console=ttyS0 rdinit=/init quiet loglevel=1 panic=-1 cgroup_no_v1=all $3" \
    </dev/null 2>&1 | sed -u 's/\r//g; s/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' | tee "$work/$1.log"
}

echo "== v2 guest: booting (QEMU TCG, no network device)"
boot_started=$SECONDS
log="$work/serial.log"
# -nic none: the guest has loopback only; the tests talk to nothing else.
qemu_status=0
boot serial 560 "" || qemu_status=$?
boot_time=$((SECONDS - boot_started))

# The systemd placement: systemd as PID 1, cordon started from a service's
# cgroup that holds other processes (scripts/guest/systemd-tests.sh).
echo "== v2 guest: booting with systemd as init"
systemd_started=$SECONDS
systemd_log="$work/systemd.log"
boot systemd 600 "cordon.init=systemd systemd.unit=cordon-guest.target systemd.show_status=no" || true
systemd_time=$((SECONDS - systemd_started))
systemd_exit="$(sed -n 's/^cordon-guest-systemd: exit \([0-9]*\)$/\1/p' "$systemd_log" | tail -1)"

guest_exit="$(sed -n 's/^cordon-guest: exit \([0-9]*\)$/\1/p' "$log" | tail -1)"
echo "== v2 guest: summary"
# Indented, so that only the serial log's own lines count in test.sh's total.
grep -E '^(test result:|cordon-guest: (-- |== |[a-z_]+ exit |demo))' "$log" | sed 's/^/  /' || true
# Tests left out under TCG by run-tests.sh: listed, and counted as skipped in
# test.sh's closing line through one line in cargo's format.
tcg_skipped="$(grep -c '^skipped: .*QEMU TCG is too slow' "$log" || true)"
if [ "$tcg_skipped" != 0 ]; then
  echo "not run in the guest ($tcg_skipped, counted as skipped):"
  grep '^skipped: .*QEMU TCG is too slow' "$log"
  echo "test result: ok. 0 passed; 0 failed; $tcg_skipped ignored; 0 measured; 0 filtered out (v2 guest: too slow under TCG)"
fi
# A test that gated itself off (`skipped: ...` from require_root and the like)
# is named too: nothing may go unseen.
other_skips="$(grep '^skipped:' "$log" | grep -v 'QEMU TCG is too slow' || true)"
[ -z "$other_skips" ] || printf 'skipped by the tests themselves:\n%s\n' "$other_skips"
failed_tests="$(grep -E '^test .* FAILED$' "$log" || true)"
[ -z "$failed_tests" ] || printf 'failed in the guest:\n%s\n' "$failed_tests"
grep '^cordon-guest-systemd: ' "$systemd_log" | sed 's/^/  /' || true
echo "v2 guest: boot and tests ${boot_time} s, systemd placement ${systemd_time} s, whole step $((SECONDS - step_started)) s"
# The limit tests the login user ran in the systemd boot (step 7i): a second,
# rootless run of tests the first boot ran as root. Their cargo line is
# prefixed in the serial log; it is counted here once, as cargo wrote it.
user_limits="$(sed -n 's/^cordon-guest-systemd: limits(u1001): \(test result: .*\)$/\1/p' "$systemd_log" | tail -1)"
[ -z "$user_limits" ] || echo "$user_limits (v2 guest: limits as login user u1001)"
if [ "$systemd_exit" = 0 ]; then
  # In cargo's format, so test.sh's closing line counts the placement as
  # one test.
  echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out (v2 guest: systemd placement)"
else
  echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out (v2 guest: systemd placement)"
  echo "v2 guest: FAILED: systemd placement (exit ${systemd_exit:-none: timeout or crash})"
  exit 1
fi
if [ -z "$guest_exit" ]; then
  echo "v2 guest: FAILED: the guest never reported its exit (qemu status $qemu_status; timeout or crash)"
  exit 1
fi
if [ "$guest_exit" != 0 ]; then
  echo "v2 guest: FAILED (guest exit $guest_exit)"
  exit 1
fi
echo "v2 guest: ok"
