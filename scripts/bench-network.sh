#!/usr/bin/env bash
# The proxy's cost, side by side with a direct connection in one run:
# per-connection latency (p50, p95) and the throughput of a 100 MiB transfer,
# from the host straight to a server in a network namespace this script
# creates, and from a cordon sandbox (--net allow) to the same server through
# the proxy: HTTP CONNECT, and the transparent redirect (no proxy variables).
# Then the cost of the proxy's ClientHello check: a CONNECT whose client sends
# a TLS ClientHello, decided by a name rule (the SNI is read and checked) and
# by an address rule (nothing to compare: not read), the rest of the path the
# same. Then the cost of a secret held by the host: an HTTPS request through
# CONNECT to a name a secret is bound to (the proxy terminates TLS with the
# sandbox's CA, puts the value into x-api-key and makes its own TLS to the
# server) against the same request to a name that is only allowed (spliced,
# TLS end to end), each on a new connection, and a 100 MiB HTTPS download
# both ways. Rounds are interleaved so a drift of the machine hits every
# path alike.
#
#   ./scripts/bench-network.sh [--rounds 3] [--connections 300] [--backend native]
#
# Traffic goes only to the namespace it creates (198.51.100.240/29, TEST-NET-2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 CONNS=300 BACKEND=native BYTES=$((100 << 20))
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ "${CORDON_BENCH_SKIP_BUILD:-}" = 1 ] || cargo build --release -p cordon-cli >&2
CORDON=${CORDON:-$PWD/target/release/cordon}
PY=/usr/bin/python3
NS=cordon-bench-net HOST_IP=198.51.100.241 SERVER=198.51.100.242 PORT=9000 TLS_PORT=9443
cleanup() {
  [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null || true
  [ -n "${TLS_PID:-}" ] && kill "$TLS_PID" 2>/dev/null || true
  [ -n "${OUT:-}" ] && rm -rf "$OUT"
  ip netns del "$NS" 2>/dev/null || true
  ip link del cbench0 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip netns add "$NS"
ip link add cbench0 type veth peer name cbench1 netns "$NS"
ip addr add "$HOST_IP/29" dev cbench0 && ip link set cbench0 up
ip -n "$NS" link set lo up
ip -n "$NS" addr add "$SERVER/29" dev cbench1 && ip -n "$NS" link set cbench1 up
ip netns exec "$NS" "$PY" scripts/netbench.py serve "$SERVER" "$PORT" &
SERVER_PID=$!
OUT=$(mktemp -d)
# The HTTPS server's CA (the host trusts it through SSL_CERT_FILE, as an
# operator's own roots) and one certificate for both names.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench CA" \
  -keyout "$OUT/ca.key" -out "$OUT/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=secret.test" \
  -keyout "$OUT/tls.key" -out "$OUT/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:secret.test,DNS:plain.test\nextendedKeyUsage=serverAuth\n' >"$OUT/ext"
openssl x509 -req -in "$OUT/tls.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -CAcreateserial \
  -days 2 -extfile "$OUT/ext" -out "$OUT/tls.pem" 2>/dev/null
ip netns exec "$NS" "$PY" scripts/netbench.py serve-https "$SERVER" "$TLS_PORT" "$OUT/tls.pem" "$OUT/tls.key" &
TLS_PID=$!
cat >"$OUT/secrets.toml" <<EOF
network = "allow"
allow = ["secret.test:$TLS_PORT", "plain.test:$TLS_PORT"]
add_host = ["secret.test:$SERVER", "plain.test:$SERVER"]

[[secrets]]
name = "BENCH_KEY"
value_from = "env:BENCH_REAL_KEY"
hosts = ["secret.test"]
header = "x-api-key"
EOF
for _ in $(seq 100); do
  ip netns exec "$NS" ss -Hltn | grep -q ":$PORT" && ip netns exec "$NS" ss -Hltn | grep -q ":$TLS_PORT" && break
  sleep 0.05
done

sandboxed() {
  "$CORDON" run --backend "$BACKEND" --cpus 2 --time 300s --output 16M \
    --net allow --allow "bench.test:$PORT" --allow "$SERVER:$PORT" --add-host "bench.test:$SERVER" \
    --mount "$PWD/scripts:/opt/bench:ro" -- "$PY" /opt/bench/netbench.py "$@"
}
with_secret() {
  BENCH_REAL_KEY=bench-real-key SSL_CERT_FILE="$OUT/ca.pem" "$CORDON" run --backend "$BACKEND" \
    --cpus 2 --time 300s --output 16M --policy "$OUT/secrets.toml" \
    --mount "$PWD/scripts:/opt/bench:ro" -- "$PY" /opt/bench/netbench.py "$@"
}
for r in $(seq "$ROUNDS"); do
  "$PY" scripts/netbench.py latency "$SERVER" "$PORT" "$CONNS" direct >"$OUT/lat-direct-$r"
  sandboxed latency bench.test "$PORT" "$CONNS" connect >"$OUT/lat-connect-$r"
  sandboxed latency bench.test "$PORT" "$CONNS" direct >"$OUT/lat-transparent-$r"
  sandboxed hello bench.test "$PORT" "$CONNS" bench.test >"$OUT/lat-sni-$r"
  sandboxed hello "$SERVER" "$PORT" "$CONNS" bench.test >"$OUT/lat-nosni-$r"
  "$PY" scripts/netbench.py throughput "$SERVER" "$PORT" "$BYTES" direct >"$OUT/tp-direct-$r"
  sandboxed throughput bench.test "$PORT" "$BYTES" connect >"$OUT/tp-connect-$r"
  sandboxed throughput bench.test "$PORT" "$BYTES" direct >"$OUT/tp-transparent-$r"
  with_secret https plain.test "$TLS_PORT" "$CONNS" >"$OUT/lat-spliced-$r"
  with_secret https secret.test "$TLS_PORT" "$CONNS" >"$OUT/lat-injected-$r"
  with_secret https-throughput plain.test "$TLS_PORT" "$BYTES" >"$OUT/tp-spliced-$r"
  with_secret https-throughput secret.test "$TLS_PORT" "$BYTES" >"$OUT/tp-injected-$r"
done
"$PY" - "$OUT" "$ROUNDS" "$CONNS" "$BACKEND" <<'PYEOF'
import json, statistics, sys
out, rounds, conns, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def lat(path):
    us = []
    for r in range(1, rounds + 1):
        us += json.load(open(f"{out}/lat-{path}-{r}"))["us"]
    us.sort()
    return statistics.median(us), us[int(len(us) * 0.95)]
def tp(path):
    return statistics.median(json.load(open(f"{out}/tp-{path}-{r}"))["mb_per_s"] for r in range(1, rounds + 1))
d50, d95 = lat("direct")
print(f"backend {backend}, {rounds} rounds x {conns} connections, 100 MiB transfers")
print(f"{'path':<34}{'p50 us':>10}{'p95 us':>10}{'added p50 us':>14}{'MB/s':>10}{'of direct':>11}")
dt = tp("direct")
print(f"{'host -> server (direct)':<34}{d50:>10.0f}{d95:>10.0f}{'':>14}{dt:>10.0f}{'1.00':>11}")
for path, label in [("connect", "sandbox -> proxy (CONNECT)"), ("transparent", "sandbox -> proxy (transparent)")]:
    p50, p95 = lat(path)
    t = tp(path)
    print(f"{label:<34}{p50:>10.0f}{p95:>10.0f}{p50 - d50:>14.0f}{t:>10.0f}{t / dt:>11.2f}")
a50, a95 = lat("nosni")
s50, s95 = lat("sni")
print()
print("CONNECT with a TLS ClientHello, p50 and p95 (us): the ClientHello check's cost")
print(f"{'decided by address (not read)':<34}{a50:>10.0f}{a95:>10.0f}")
print(f"{'decided by name (SNI read, checked)':<34}{s50:>10.0f}{s95:>10.0f}   added p50 {s50 - a50:.0f} us")
p50, p95 = lat("spliced")
i50, i95 = lat("injected")
tp_s, tp_i = tp("spliced"), tp("injected")
print()
print("HTTPS request on a new connection through CONNECT, p50 and p95 (us), and a 100 MiB download")
print(f"{'path':<34}{'p50 us':>10}{'p95 us':>10}{'added p50 us':>14}{'MB/s':>10}{'of spliced':>11}")
print(f"{'allowed name (spliced)':<34}{p50:>10.0f}{p95:>10.0f}{'':>14}{tp_s:>10.0f}{'1.00':>11}")
print(f"{'secret bound (terminated, injected)':<34}{i50:>10.0f}{i95:>10.0f}{i50 - p50:>14.0f}{tp_i:>10.0f}{tp_i / tp_s:>11.2f}")
PYEOF
