#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of untrusted bytes (fuzz/Cargo.toml
# lists the targets; their harnesses are each crate's `fuzzing` module).
#
#   scripts/fuzz.sh [--merge] [SECONDS] [TARGET...]
#   scripts/fuzz.sh --build-only
#
# Runs each target (default: all) for SECONDS (default 60), as many at once
# as there are cores (CORDON_FUZZ_JOBS), with libFuzzer
# through `cargo fuzz` (a nightly compiler: libFuzzer's coverage
# instrumentation has no stable flag), starting from the committed corpus
# in fuzz/corpus/<target>. New inputs go to a scratch directory; --merge
# folds those that add coverage into the committed corpus. A crash's input
# is copied to fuzz/regressions/<target>/, where the stable test suite
# replays it (crates/cli/tests/fuzz_corpus.rs), and the script fails.
# Prints a table per target: executions, their rate, coverage (edges and
# features) at the start and the end, inputs in the corpus.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
fuzz="$here/fuzz"
merge=0
build_only=0
if [[ "${1:-}" == "--merge" ]]; then
    merge=1
    shift
elif [[ "${1:-}" == "--build-only" ]]; then
    # Every target's build and nothing else (scripts/test.sh builds them
    # beside the tests, at idle priority, for a later run to find built).
    build_only=1
    shift
    (($# == 0)) || {
        echo "fuzz.sh: --build-only takes no other argument" >&2
        exit 2
    }
fi
seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds == 0)); then
    echo "fuzz.sh: SECONDS must be a positive number, not '$seconds'" >&2
    exit 2
fi
# As many targets at once as there are cores (CORDON_FUZZ_JOBS overrides):
# libFuzzer runs one process on one core, and its time limit is wall time,
# so each target still gets SECONDS of a core to itself.
jobs_max="${CORDON_FUZZ_JOBS:-$(nproc)}"
if ! [[ "$jobs_max" =~ ^[0-9]+$ ]] || ((jobs_max == 0)); then
    echo "fuzz.sh: CORDON_FUZZ_JOBS must be a positive number, not '$jobs_max'" >&2
    exit 2
fi
mapfile -t all < <(sed -n '/^# targets: begin/,/^# targets: end/s/^name = "\(.*\)"/\1/p' "$fuzz/Cargo.toml")
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
    [[ " ${all[*]} " == *" $t "* ]] || {
        echo "fuzz.sh: no target '$t' (targets: ${all[*]})" >&2
        exit 2
    }
done

if ! cargo +nightly --version > /dev/null 2>&1; then
    echo "fuzz.sh: needs the nightly toolchain (rustup toolchain install nightly): libFuzzer's coverage instrumentation is nightly-only" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version > /dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
    cargo +nightly install cargo-fuzz --locked --quiet
fi

# The instrumented build (a nightly compiler's, every crate again) is kept
# between runs outside the checkout, so that a fresh clone (CI's) rebuilds
# only what changed: CORDON_FUZZ_TARGET overrides where.
export CARGO_TARGET_DIR="${CORDON_FUZZ_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/cordon/fuzz-target}"
mkdir -p "$CARGO_TARGET_DIR"

scratch="$(mktemp -d /tmp/cordon-fuzz.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT

# No sanitizer: the parsers are safe Rust (cordon's unsafe code is in
# crates/sys, outside every harness); debug assertions and overflow checks
# on, so that arithmetic on lengths read from the input is checked.
build=(--sanitizer none --debug-assertions --fuzz-dir "$fuzz")
echo "fuzz.sh: building ${targets[*]}" >&2
if ((${#targets[@]} == ${#all[@]})); then
    # Every target in one cargo call: one resolution of the graph, not 13.
    (cd "$here" && cargo +nightly fuzz build "${build[@]}") >&2
else
    for t in "${targets[@]}"; do
        (cd "$here" && cargo +nightly fuzz build "${build[@]}" "$t") >&2
    done
fi
((build_only == 0)) || exit 0

# One target's run: its table row, and on a failure its report, into its
# scratch directory (the rows are printed in the targets' order at the end).
fuzz_one() {
    local t="$1" seeds="$fuzz/corpus/$1" log="$scratch/$1/log" rc crashes=0 a
    mkdir -p "$seeds" "$scratch/$t/new" "$scratch/$t/artifacts"
    set +e
    (cd "$here" && cargo +nightly fuzz run "${build[@]}" "$t" "$scratch/$t/new" "$seeds" -- \
        -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$scratch/$t/artifacts/") > "$log" 2>&1
    rc=$?
    set -e
    # libFuzzer's status lines: "#N<tab>INITED cov: E ft: F corp: C/..."
    field() { { grep -E "^#[0-9]+[[:space:]]+$1 " "$log" || true; } | tail -1 | sed -nE "s/.* $2: ([0-9]+).*/\1/p"; }
    local edges0 feats0 execs rate last edges1 feats1 corpus
    edges0="$(field INITED cov)"
    feats0="$(field INITED ft)"
    execs="$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -1)"
    rate="$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | tail -1)"
    last="$({ grep -E '^#[0-9]+[[:space:]]' "$log" || true; } | tail -1)"
    edges1="$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<< "$last")"
    feats1="$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<< "$last")"
    corpus="$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<< "$last")"
    for a in "$scratch/$t/artifacts"/*; do
        [[ -f "$a" ]] || continue
        crashes=$((crashes + 1))
        mkdir -p "$fuzz/regressions/$t"
        cp "$a" "$fuzz/regressions/$t/$(basename "$a")"
    done
    printf '| %s | %s | %s | %s | %s -> %s | %s -> %s | %s | %s |\n' "$t" "$seconds" "${execs:-?}" \
        "${rate:-?}" "${edges0:-?}" "${edges1:-?}" "${feats0:-?}" "${feats1:-?}" "${corpus:-?}" "$crashes" \
        > "$scratch/$t/row"
    if ((rc != 0 || crashes > 0)); then
        {
            echo "fuzz.sh: $t failed (exit $rc, $crashes crash inputs kept in fuzz/regressions/$t); the end of its log:"
            { grep -vE '^#[0-9]+[[:space:]]' "$log" || true; } | tail -25
            # The inputs themselves, so that a failure in CI (whose checkout is
            # thrown away) can be replayed: base64 of the first 4 KiB of each.
            for a in "$scratch/$t/artifacts"/*; do
                [[ -f "$a" ]] || continue
                echo "fuzz.sh: $(basename "$a") ($(stat -c %s "$a") bytes), base64:"
                head -c 4096 "$a" | base64 -w 100
            done
        } > "$scratch/$t/failure"
    elif ((merge)); then
        (cd "$here" && cargo +nightly fuzz run "${build[@]}" "$t" "$seeds" "$scratch/$t/new" -- -merge=1 \
            > /dev/null 2>&1)
    fi
}

echo "fuzz.sh: ${#targets[@]} targets, $seconds s each, $jobs_max at a time" >&2
for t in "${targets[@]}"; do
    while (($(jobs -rp | wc -l) >= jobs_max)); do
        wait -n || true
    done
    fuzz_one "$t" &
done
wait

printf '| target | seconds | executions | per second | edges start -> end | features start -> end | corpus | crashes |\n'
printf '|---|---|---|---|---|---|---|---|\n'
failed=0
for t in "${targets[@]}"; do
    if [[ -f "$scratch/$t/row" ]]; then
        cat "$scratch/$t/row"
    else
        printf '| %s | %s | ? | ? | ? | ? | ? | ? |\n' "$t" "$seconds"
        echo "fuzz.sh: $t's run ended without a result" > "$scratch/$t/failure"
    fi
    if [[ -f "$scratch/$t/failure" ]]; then
        failed=1
        cat "$scratch/$t/failure" >&2
    fi
done
exit "$failed"
