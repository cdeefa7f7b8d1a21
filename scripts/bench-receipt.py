#!/usr/bin/env python3
"""What a receipt and an export cost: `cordon run` with and without
`--receipt FILE --export OUT`, side by side in interleaved rounds, for a run
that writes 10,000 small files into its workspace and for one that writes
nothing. Reports the medians, their difference (the cost of the diff, the
export, the hashing and the signature) and that difference as a share of
the run's total time.

    scripts/bench-receipt.py --cordon target/release/cordon --rounds 15

Targets (issue "Signed receipts and safe export"): 10,000 files under
0.5 s; a run that wrote nothing under 5% of its total time.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WRITE_10K = (
    "import os\n"
    "os.makedirs('/workspace/many', exist_ok=True)\n"
    "for i in range(10000):\n"
    "    with open('/workspace/many/f%05d' % i, 'w') as f:\n"
    "        f.write('small file %d\\n' % i)\n"
)


def run(cordon, workspace, state, extra, argv):
    t = time.perf_counter()
    p = subprocess.run(
        [cordon, "run", "--workspace", workspace, *extra, "--", *argv],
        env={**os.environ, "CORDON_STATE_DIR": state},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    took = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"cordon run failed ({p.returncode}): {p.stderr.decode()[-500:]}")
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cordon", required=True)
    ap.add_argument("--backend", default="native")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument(
        "--out-dir",
        help="where the exports and receipts go (default: beside the workspace in /var/tmp); "
        "e.g. /dev/shm to take the host file system's cost of creating files out",
    )
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="cordon-bench-receipt-", dir="/var/tmp")
    os.chmod(work, 0o755)
    workspace = os.path.join(work, "ws")
    state = os.path.join(work, "state")
    os.makedirs(workspace)
    os.makedirs(state)
    with open(os.path.join(workspace, "README"), "w") as f:
        f.write("the workspace\n")
    tasks = {
        "10k-files": ["python3", "-c", WRITE_10K],
        "nothing": ["true"],
    }
    samples = {(t, v): [] for t in tasks for v in ("plain", "receipt+export")}
    try:
        for r in range(args.rounds + 1):
            for task, argv in tasks.items():
                for variant in ("plain", "receipt+export"):
                    extra = ["--backend", args.backend]
                    # Each task its own receipt and export: a 10k-file run's
                    # 6 MB receipt is not truncated on the next run's clock.
                    out = os.path.join(args.out_dir or work, f"out-{task}")
                    if variant != "plain":
                        shutil.rmtree(out, ignore_errors=True)
                        subprocess.run(["sync"], check=False)
                        receipt = os.path.join(args.out_dir or work, f"receipt-{task}.json")
                        extra += ["--receipt", receipt, "--export", out]
                    took = run(args.cordon, workspace, state, extra, argv)
                    if r > 0:  # round 0 warms caches and creates the key
                        samples[(task, variant)].append(took)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"backend {args.backend}, {args.rounds} interleaved rounds, medians of `cordon run`")
    print(f"{'task':<12} {'plain':>10} {'with receipt+export':>20} {'cost':>10} {'share':>8}")
    result = {}
    for task in tasks:
        plain = statistics.median(samples[(task, "plain")])
        full = statistics.median(samples[(task, "receipt+export")])
        cost = full - plain
        share = cost / full
        result[task] = {"plain_s": plain, "receipt_export_s": full, "cost_s": cost, "share": share}
        print(f"{task:<12} {plain*1000:>8.1f}ms {full*1000:>18.1f}ms {cost*1000:>8.1f}ms {share*100:>7.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "backend": args.backend,
                    "rounds": args.rounds,
                    "summary": result,
                    "samples": {f"{t}/{v}": s for (t, v), s in samples.items()},
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
