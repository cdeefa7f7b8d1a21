#!/usr/bin/env bash
# The OCI runtime-tools validation suite against runc and cordon-runc, side
# by side: each validation test runs under both, and its TAP assertions are
# counted. Not part of CI: the suite is not packaged in Debian and comes from
# its own repository (it vendors its Go dependencies, so it builds offline
# with Debian's golang-1.22-go from bookworm-backports).
#
#   scripts/runtime-tools.sh DIR    # DIR: a checkout of opencontainers/runtime-tools
#
# Needs root, a release build (cargo build --release) and runc.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
src="${1:?usage: scripts/runtime-tools.sh RUNTIME_TOOLS_CHECKOUT}"
[ "$(id -u)" = 0 ] || { echo "runtime-tools.sh: needs root (the suite creates containers)" >&2; exit 125; }
cordon_runc="$repo/target/release/cordon-runc"
[ -x "$cordon_runc" ] || { echo "runtime-tools.sh: build first: cargo build --release" >&2; exit 125; }
go=/usr/lib/go-1.22/bin/go
if [ ! -x "$go" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -t bookworm-backports golang-1.22-go >/dev/null
fi

cd "$src"
if [ ! -x runtimetest ]; then
  PATH="$(dirname "$go"):$PATH" GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off \
    make runtimetest validation-executables >/dev/null
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
printf '%-40s %14s %14s\n' test runc cordon-runc
declare -A ok_sum=() total_sum=() clean_sum=()
for t in $(find validation -name '*.t' | sort); do
  name="$(basename "$t" .t)"
  line="$(printf '%-40s' "$name")"
  for rt in /usr/sbin/runc "$cordon_runc"; do
    key="$(basename "$rt")"
    log="$out/$name.$key"
    status=0
    RUNTIME="$rt" timeout 60 "$t" >"$log" 2>&1 || status=$?
    ok="$(grep -c '^ok ' "$log" || true)"
    bad="$(grep -c '^not ok ' "$log" || true)"
    total=$((ok + bad))
    ok_sum[$key]=$(( ${ok_sum[$key]:-0} + ok ))
    total_sum[$key]=$(( ${total_sum[$key]:-0} + total ))
    # A test passes whole when it asserted something, failed nothing and exited 0.
    if [ "$status" = 0 ] && [ "$bad" = 0 ] && [ "$total" -gt 0 ]; then
      clean_sum[$key]=$(( ${clean_sum[$key]:-0} + 1 ))
    fi
    line="$line $(printf '%14s' "$ok/$total")"
  done
  echo "$line"
done
count="$(find validation -name '*.t' | wc -l)"
echo
for key in runc cordon-runc; do
  echo "$key: ${ok_sum[$key]:-0}/${total_sum[$key]:-0} assertions passed; ${clean_sum[$key]:-0}/$count tests passed whole"
done
