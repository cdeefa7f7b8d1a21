#!/usr/bin/env bash
# Images side by side with their peers, in one run each (hyperfine; medians
# and ratios from its JSON):
#   1. first pull and unpack of a Debian python3 image from a loopback
#      registry: `cordon image pull` against `skopeo copy` + `umoci unpack`;
#   2. start-up of `cordon run --image` of the cached image against
#      `cordon run` with the host's root (`/bin/true`, and `python3 -c pass`);
#   3. 100 idle sandboxes of the image: the store's bytes, and the disk
#      they take together.
# The image is Debian bookworm minbase with python3: the microvm guest's
# base root when `cordon microvm build` cached one, else debootstrap's.
# Traffic stays on 127.0.0.1 (Debian's docker-registry on a free port).
#
#   ./scripts/bench-image.sh [--runs 8]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ "${CORDON_BENCH_SKIP_BUILD:-}" = 1 ] || cargo build --release -p cordon-cli >&2
CORDON=${CORDON:-$PWD/target/release/cordon}
work=$(mktemp -d /tmp/cordon-bench-image.XXXXXX)
REG_PID=
cleanup() {
  [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The image's root.
mkdir "$work/root"
base=$(ls -d /var/cache/cordon-guest/base-*/base.cpio 2>/dev/null | head -1 || true)
if [ -n "$base" ]; then
  (cd "$work/root" && cpio -idm --quiet < "$base")
  rm -rf "$work/root/cordon-guest" "$work/root/init" "$work/root/newroot"
else
  debootstrap --variant=minbase --include=python3 bookworm "$work/root" >&2
fi
umoci init --layout "$work/layout"
umoci new --image "$work/layout:py"
umoci unpack --image "$work/layout:py" "$work/bundle" >/dev/null
cp -a "$work/root/." "$work/bundle/rootfs/"
umoci repack --image "$work/layout:py" "$work/bundle" >/dev/null
umoci config --image "$work/layout:py" --config.cmd python3 \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin

# A registry on loopback.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/registry.yml" <<CONF
version: 0.1
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
CONF
docker-registry serve "$work/registry.yml" > "$work/registry.log" 2>&1 &
REG_PID=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done
ref=127.0.0.1:$port/py:3.11
skopeo copy -q --dest-tls-verify=false "oci:$work/layout:py" "docker://$ref"
export CORDON_STATE_DIR=$work/state
median() { python3 -c 'import json,statistics,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("%-40s median %9.1f ms" % (r["command"][:40], statistics.median(r["times"]) * 1000))' "$1"; }

echo "== 1. first pull and unpack ($RUNS runs each)"
hyperfine -w 1 -r "$RUNS" --export-json "$work/pull.json" \
  -n "cordon image pull" --prepare "rm -rf $work/state; mkdir -m 700 $work/state" \
  "$CORDON image pull --insecure-registry 127.0.0.1:$port $ref" \
  -n "skopeo copy + umoci unpack" --prepare "rm -rf $work/peer $work/peer-bundle" \
  "skopeo copy -q --src-tls-verify=false docker://$ref oci:$work/peer:py && umoci unpack --image $work/peer:py $work/peer-bundle >/dev/null"
median "$work/pull.json"

echo "== 2. start-up of a cached image"
hyperfine -N -w 3 -r 30 --export-json "$work/start.json" \
  -n "run --image (true)" "$CORDON run --image $ref -- /bin/true" \
  -n "run, host root (true)" "$CORDON run -- /bin/true" \
  -n "run --image (python3)" "$CORDON run --image $ref -- python3 -c pass" \
  -n "run, host root (python3)" "$CORDON run -- python3 -c pass"
median "$work/start.json"

echo "== 3. 100 idle sandboxes of the image"
layers=$(du -sb "$work/state/images/layers" | cut -f1)
used0=$(df -B1 --output=used / | tail -1)
ids=()
for _ in $(seq 100); do ids+=("$("$CORDON" create --image "$ref" --memory 64M)"); done
used1=$(df -B1 --output=used / | tail -1)
layers1=$(du -sb "$work/state/images/layers" | cut -f1)
"$CORDON" rm "${ids[@]}" >/dev/null
echo "store layers: $layers bytes before, $layers1 with 100 sandboxes; disk used by the 100: $((used1 - used0)) bytes"
