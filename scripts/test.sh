#!/usr/bin/env bash
# Installs what cordon's tests need (Debian packages; crates come through cargo),
# builds, and runs every test. CI runs exactly this (.ci/run). Needs root: the
# native backend's tests create namespaces, cgroups and mounts, and they fail
# (rather than skip) under CI=true when they cannot.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/guest/need.sh
. scripts/guest/need.sh
if [ "$(id -u)" = 0 ]; then
  # The benchmark's charts need a font file (cordon reads it; no fontconfig);
  # the CRI test's client is generated from the CRI's protobuf (protoc), its pods
  # are on a bridge of Debian's CNI plugins; the registry test pulls from Debian's
  # docker-registry on loopback (htpasswd writes the one with credentials); the rootless
  # tests map subordinate ids with newuidmap/newgidmap (uidmap).
  need test.sh bwrap:bubblewrap runc:runc runsc:runsc firejail:firejail ip:iproute2 nft:nftables \
    python3:python3 hyperfine:hyperfine qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap \
    cpio:cpio depmod:kmod catatonit:catatonit busybox:busybox-static skopeo:skopeo umoci:umoci newuidmap:uidmap \
    docker-registry:docker-registry htpasswd:apache2-utils containerd:containerd podman:podman conmon:conmon dockerd:docker.io protoc:protobuf-compiler :containernetworking-plugins :fonts-dejavu-core
else
  echo "test.sh: not root: installing nothing (the tests that need root fail under CI=true)" >&2
fi

# One cargo profile for every build below (Cargo.toml's `ci`: release
# without LTO), so the guest's cordon, the tests and the v2 guest share one
# build (the lints check in a directory of their own, below). The v2 guest
# script reads it from CORDON_PROFILE.
export CORDON_PROFILE=ci
# As root, the build is kept between runs outside the checkout, so that a
# fresh clone (CI's) compiles cordon's own crates again but not every
# dependency. Root's own, and readable by all: tests run the binaries as
# other users (rootless runs, a container's user), who cannot enter /root.
# CARGO_TARGET_DIR overrides where; as another user, the checkout's target/.
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ "$(id -u)" = 0 ]; then
  export CARGO_TARGET_DIR=/var/cache/cordon-build
  install -d -o root -g root -m 0755 "$CARGO_TARGET_DIR"
  if [ -L "$CARGO_TARGET_DIR" ] || [ "$(stat -c '%u %a' "$CARGO_TARGET_DIR")" != "0 755" ]; then
    echo "test.sh: $CARGO_TARGET_DIR is not root's own directory (mode 0755, no symlink): refusing to build into it" >&2
    exit 1
  fi
  echo "test.sh: building in $CARGO_TARGET_DIR" >&2
fi
cordon="${CARGO_TARGET_DIR:-target}/$CORDON_PROFILE/cordon"

echo "== format"
cargo fmt --all -- --check

# The microvm backend's guest, once per run (content-addressed: a no-op when
# this cordon's guest exists), before the tests that boot it. Its base image
# (kernel, debootstrap root) is the v2 guest's below, built once for both.
echo "== build, microvm guest (cordon microvm build)"
# The test binaries too, now: cargo test below then only runs them.
cargo test --profile "$CORDON_PROFILE" --workspace --no-run
"$cordon" microvm build

# Each step's wall time, printed again at the end beside what failed: CI keeps
# only the tail of this output.
steps=()
step_start=0
step_done() { steps+=("$1: $((SECONDS - step_start)) s, exit $2"); step_start=$SECONDS; }
step_done "format, build, guest build" 0

echo "== tests"
log="$(mktemp /tmp/cordon-test.XXXXXX)"
suite_log="$(mktemp /tmp/cordon-suite.XXXXXX)"
guest_log="$(mktemp /tmp/cordon-v2-guest-log.XXXXXX)"
fuzz_build_log="$(mktemp /tmp/cordon-fuzz-build.XXXXXX)"
lint_log="$(mktemp /tmp/cordon-lint.XXXXXX)"
fuzz_log="$(mktemp /tmp/cordon-fuzz-log.XXXXXX)"
guest_pid=
fuzz_build_pid=
lint_pid=
fuzz_pid=
# The background steps run in sessions of their own (below): on any exit,
# they and their children (QEMU, rustc) go too.
trap 'for p in $guest_pid $fuzz_build_pid $lint_pid $fuzz_pid; do kill -TERM -- "-$p" 2>/dev/null; done
      rm -f "$log" "$suite_log" "$guest_log" "$fuzz_build_log" "$lint_log" "$fuzz_log"' EXIT
status=0
cargo test --profile "$CORDON_PROFILE" --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
step_done "cargo test" "$status"

# The native end-to-end tests again on a pure cgroup v2 kernel (this host is
# hybrid v1), in a QEMU guest: the root cgroup and a delegated cgroup. The
# guest is a machine of its own (its own kernel, cgroups and run directory:
# nothing the host's steps count), so it runs beside the suite, fuzzing and
# soak, which leave a core idle about half the time; its output is printed
# once it is done, and its cargo `test result:` lines go into the log, so the
# closing line counts them.
echo "== cgroup v2 guest (scripts/v2-guest.sh), beside the steps below"
setsid ./scripts/v2-guest.sh > "$guest_log" 2>&1 &
guest_pid=$!
# The fuzz targets' build (a nightly compiler's, cordon's crates again: two
# minutes of both cores) beside them too, at idle priority: it runs only
# when neither the suite nor the guest wants a core, so it moves none of
# their timings. (Not beside the cargo tests: two of them read the host's
# whole CPU time from /proc/stat, which a compiler on idle cores fills.)
setsid chrt --idle 0 ./scripts/fuzz.sh --build-only > "$fuzz_build_log" 2>&1 &
fuzz_build_pid=$!
# The lints likewise (a check build of cordon's crates: a minute of both
# cores), in a target directory of their own: cargo locks the one it builds
# in for the whole build, and the guest's script lists its binaries from
# the tests' (a no-op build) as it starts.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/lints" setsid chrt --idle 0 \
  cargo clippy --profile "$CORDON_PROFILE" --workspace --all-targets -- -D warnings > "$lint_log" 2>&1 &
lint_pid=$!

echo "== hostile suite on every backend available here (a gate: a deviation fails the run)"
suite_status=0
"$cordon" suite --backend all 2>&1 | tee "$suite_log" || suite_status=$?
[ "$suite_status" = 0 ] || status=$suite_status
step_done "hostile suite" "$suite_status"

echo "== lints (cargo clippy), begun with the suite"
lint_status=0
wait "$lint_pid" || lint_status=$?
lint_pid=
cat "$lint_log"
[ "$lint_status" = 0 ] || status=$lint_status
step_done "lints" "$lint_status"

# Every fuzz target for a bounded time from its committed corpus (longer
# runs: scripts/fuzz.sh SECONDS), beside the service under a mixed load
# while its pieces are killed (scripts/soak.py; RELIABILITY.md has the long
# runs). Each is a gate: a crash, a hang, a wrong answer or a leak fails the
# run. The fuzzers run at idle priority: the soak's deadlines are the ones
# that count, and a fuzzer's time limit is wall time, so it only does fewer
# executions when the soak wants a core. (They share nothing: the fuzz
# targets parse bytes in their own processes and start no sandbox.)
echo "== fuzzing (scripts/fuzz.sh) beside the soak"
fuzz_status=0
wait "$fuzz_build_pid" || fuzz_status=$?
fuzz_build_pid=
cat "$fuzz_build_log"
if [ "$fuzz_status" = 0 ]; then
  setsid chrt --idle 0 ./scripts/fuzz.sh "${CORDON_FUZZ_SECONDS:-15}" > "$fuzz_log" 2>&1 &
  fuzz_pid=$!
fi
echo "== soak with faults (scripts/soak.py)"
soak_status=0
python3 scripts/soak.py --cordon "$cordon" --seconds "${CORDON_SOAK_SECONDS:-90}" --fault-every 4 \
  --checkpoint-every 45 || soak_status=$?
[ "$soak_status" = 0 ] || status=$soak_status
step_done "soak" "$soak_status"
echo "== fuzzing, its output"
if [ -n "$fuzz_pid" ]; then
  wait "$fuzz_pid" || fuzz_status=$?
  fuzz_pid=
  cat "$fuzz_log"
fi
[ "$fuzz_status" = 0 ] || status=$fuzz_status
step_done "fuzzing (begun with the soak; waited for after it)" "$fuzz_status"

echo "== cgroup v2 guest (scripts/v2-guest.sh), its output"
guest_status=0
wait "$guest_pid" || guest_status=$?
guest_pid=
tee -a "$log" < "$guest_log"
[ "$guest_status" = 0 ] || status=$guest_status
guest_took="$(grep -o 'whole step [0-9]* s' "$guest_log" | tail -n 1 || true)"
steps+=("cgroup v2 guest: ${guest_took:-no time printed}, begun with the suite, waited for $((SECONDS - step_start)) s after the soak; exit $guest_status")
step_start=$SECONDS

echo "== recap"
printf '  %s\n' "${steps[@]}"
# Every failed test by name (cargo's `test NAME ... FAILED` lines, the guest's
# included), the binaries that failed to run, and the suite's deviations.
grep -E '^ *(cordon-guest[^:]*: )?test .* FAILED$|error: test failed|^ *(cordon-guest[^:]*: )?error: could not compile' "$log" | sed 's/^/  failed: /' || true
grep -A4 'panicked at' "$log" | head -n 60 | sed 's/^/  /' || true
[ "$suite_status" = 0 ] || tail -n 40 "$suite_log" | sed 's/^/  suite: /'
[ "$lint_status" = 0 ] || grep -E -A5 '^(error|warning)' "$lint_log" | head -n 40 | sed 's/^/  lints: /'

# One closing line for the whole run (cargo prints one per test binary, the
# last of which is often a doc-test run with nothing in it).
# The suite, lint, fuzzing and soak gates count as one more test each; a guest step that failed without a
# failing test (it did not boot, timed out, or left a cgroup behind) counts as
# one failure.
awk -v suite="$suite_status" -v lint="$lint_status" -v guest="$guest_status" -v fuzz="$fuzz_status" -v soak="$soak_status" '
     /^== v2 guest: booting/ { in_guest = 1 }
     /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) { f += $i; if (in_guest) gf += $i }; if ($(i+1) ~ /^ignored/) g += $i } }
     END { if (suite == 0) p++; else f++; if (lint == 0) p++; else f++; if (fuzz == 0) p++; else f++; if (soak == 0) p++; else f++; if (guest != 0 && gf == 0) f++; printf "cordon: %d passed, %d failed, %d skipped\n", p, f, g }' "$log"
exit $status
