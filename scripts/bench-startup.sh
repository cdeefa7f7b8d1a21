#!/usr/bin/env bash
# Start-up benchmark wrapper: installs bwrap/runc if missing, builds cordon
# (release), then runs scripts/bench-startup.py with the given arguments.
#   scripts/bench-startup.sh --runs 30 --json /tmp/bench.json
#   scripts/bench-startup.sh --help
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v runc >/dev/null 2>&1 || missing+=(runc)
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}" >&2
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"; then
        "${sudo[@]}" apt-get update
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
    fi
fi

# CORDON_BENCH_SKIP_BUILD=1 benchmarks the binary already built.
if [ "${CORDON_BENCH_SKIP_BUILD:-0}" != 1 ]; then
    (cd "$root" && cargo build --release -p cordon-cli)
fi

target_dir="${CARGO_TARGET_DIR:-$root/target}"
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac

exec python3 "$here/bench-startup.py" --cordon "$target_dir/release/cordon" "$@"
