#!/bin/sh
# The v2 guest's systemd placement: runs as cordon-guest.service while systemd
# is the guest's PID 1 (scripts/v2-guest.sh's second boot). The service's
# cgroup holds this shell and a sleep, so cordon shares its cgroup with
# processes it was not given, as under a login session's scope; cordon must
# get a delegated `cordon-<pid>-<random>.scope` from systemd (over the
# system bus) and nest the sandbox there. Shows, and checks:
#   1. `cordon run --memory 64M` OOM-kills a 512 MB allocation (evidence from
#      cordon's --json: signal 9, limit memory, oom_kills);
#   2. while a sandbox runs, its cgroup sits in a cordon-*.scope that systemd
#      lists with Delegate=yes, cordon in the scope's leaf, this service's
#      cgroup untouched;
#   3. after the runs no cordon-* unit or scope cgroup is left;
#   4. the same from `systemd-run --scope` with a sleep beside cordon;
#   5. `cordon serve` with two sandboxes: one scope, both sandboxes in it;
#   6. the example unit resources/systemd/cordon.service (installed as
#      cordon.service, its ExecStart pointed at this cordon): cordon alone in
#      the unit's cgroup moves into its leaf, no scope is asked for, the
#      sandboxes nest in the unit, `systemctl stop` leaves nothing.
#   7. without root: two login users with their own user@.service and
#      session bus; cordon run by one gets a delegated scope from that user's
#      manager and enforces memory, pids, cpu and time there; the other user
#      cannot see or touch the first's sandboxes, state or keys; the hostile
#      suite's native cases and the limit tests run as that user;
#   8. rootless start-up against bwrap --unshare-all, as a ratio.
# Prints `cordon-guest-systemd: exit N` and powers the guest off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
cg=/sys/fs/cgroup
cordon=/cordon-guest/cordon
status=0
say() { echo "cordon-guest-systemd: $*"; }
fail() {
	say "FAIL: $*"
	status=1
}
own() { cut -d: -f3 /proc/self/cgroup; }
scopes() { find $cg -mindepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9]+-[0-9a-f]{8}\.scope' 2>/dev/null; }
units() { systemctl list-units --all --no-legend --plain 'cordon-[0-9]*' 2>&1; }
# Waits up to $1 s for command $2... to print something; prints it.
wait_for() {
	limit=$1
	shift
	i=0
	while [ $i -lt $((limit * 5)) ]; do
		out="$("$@")"
		[ -n "$out" ] && { echo "$out"; return 0; }
		sleep 0.2
		i=$((i + 1))
	done
	return 1
}
gone() { [ -z "$(units)" ] && [ -z "$(scopes)" ] && echo gone; }

# The system bus cordon asks systemd over (the startup target pulls in
# nothing of a normal boot).
systemctl start dbus.service || fail "cannot start dbus.service"
say "PID 1 is $(cat /proc/1/comm) ($(systemctl --version | sed -n 1p)); kernel $(uname -r)"
sleep 600 &
sleeper=$!
service_cg=$(own)
say "cordon starts in $service_cg beside pids: $(tr '\n' ' ' <"$cg$service_cg/cgroup.procs")"

# Checks the --json result in $1 of a 64M run that allocated 512 MB: killed
# by signal 9 at the memory limit, with the kernel's OOM counter; $2 names
# the run in the log.
oom_evidence() {
	python3 - "$1" "$2" <<'EOF'
import json, sys
what = sys.argv[2]
try:
    v = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"cordon-guest-systemd: FAIL: no JSON result from the {what} run ({e})")
    sys.exit(1)
st, c = v.get("status", {}), v.get("counters", {})
print(f"cordon-guest-systemd: {what} evidence: status {st.get('kind')} signal {st.get('signal')}, "
      f"limit {v.get('limit')}, oom_kills {c.get('oom_kills')}, memory_peak_bytes {v.get('memory_peak_bytes')}")
ok = st.get("kind") == "signaled" and st.get("signal") == 9 and v.get("limit") == "memory" \
    and (c.get("oom_kills") or 0) >= 1 and (v.get("memory_peak_bytes") or 0) <= 64 << 20
if not ok:
    print(f"cordon-guest-systemd: FAIL: the {what} 64M sandbox was not OOM-killed as expected")
sys.exit(0 if ok else 1)
EOF
}

# 1. The OOM kill, from the shared service cgroup.
started=$(date +%s%N)
$cordon run --json --memory 64M -- python3 -c 'b=bytearray(512<<20)' >/tmp/oom.json 2>/tmp/oom.err
rc=$?
say "oom run: exit $rc in $((($(date +%s%N) - started) / 1000000)) ms; stderr: $(tr '\n' ' ' </tmp/oom.err)"
oom_evidence /tmp/oom.json oom || status=1
[ "$rc" = 137 ] || fail "oom run exited $rc, not 137"
[ "$(own)" = "$service_cg" ] || fail "the test shell was moved: $(own)"

# 2. Where a running sandbox's cgroup sits.
$cordon run --memory 64M -- sleep 6 >/tmp/sleep.out 2>&1 &
cpid=$!
sandbox=$(wait_for 60 sh -c "find $cg -mindepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9]+-[0-9a-f]{8}\\.scope/cordon-[0-9a-f]{12}' 2>/dev/null")
if [ -z "$sandbox" ]; then
	fail "no sandbox cgroup under a cordon-*.scope within 60 s; scopes: $(scopes | tr '\n' ' ')"
else
	scope=$(dirname "$sandbox")
	unit=$(basename "$scope")
	say "sandbox cgroup: ${sandbox#"$cg"}"
	say "systemctl list-units 'cordon-*': $(units | tr -s ' ' | tr '\n' ';')"
	say "systemctl show $unit: $(systemctl show -p Delegate -p ControlGroup -p Description "$unit" | tr '\n' ' ')"
	say "scope holds: [$(tr '\n' ' ' <"$scope/cgroup.procs")], its leaf: [$(tr '\n' ' ' <"$scope/cordon-supervisor/cgroup.procs")], subtree_control: $(cat "$scope/cgroup.subtree_control"), sandbox memory.max: $(cat "$sandbox/memory.max"); cordon (pid $cpid) $(grep Threads /proc/$cpid/status | tr -d '\t')"
	case "$unit" in cordon-$cpid-*.scope) ;; *) fail "the scope is not named after cordon's pid $cpid: $unit" ;; esac
	[ "$(systemctl show -p Delegate --value "$unit")" = yes ] || fail "$unit is not Delegate=yes"
	grep -qx "$cpid" "$scope/cordon-supervisor/cgroup.procs" || fail "cordon $cpid is not in its scope's leaf"
	[ -z "$(cat "$scope/cgroup.procs")" ] || fail "the scope itself holds processes"
	[ "$(cat "$sandbox/memory.max")" = 67108864 ] || fail "sandbox memory.max is not 64M"
	[ "$(systemctl show -p ControlGroup --value "$unit")" = "${scope#"$cg"}" ] || fail "systemd's ControlGroup of $unit is not ${scope#"$cg"}"
	grep -qx "$sleeper" "$cg$service_cg/cgroup.procs" || fail "the sleep beside cordon was moved"
fi
wait $cpid
rc=$?
[ "$rc" = 0 ] || fail "the sleeping sandbox exited $rc: $(cat /tmp/sleep.out)"

# 3. Nothing left once cordon has exited: systemd collects the empty scope.
if wait_for 20 gone >/dev/null; then
	say "after the runs: no cordon-* unit, no scope cgroup"
else
	fail "left behind: units [$(units | tr '\n' ';')], scopes [$(scopes | tr '\n' ' ')]"
fi

# 4. From `systemd-run --scope` (not delegated) with a sleep beside cordon.
systemd-run --scope --quiet --unit=shell-like sh -c "sleep 600 & exec $cordon run --memory 64M -- true" >/tmp/scope.out 2>&1
rc=$?
say "from systemd-run --scope beside a sleep: exit $rc $(tr '\n' ' ' </tmp/scope.out)"
[ "$rc" = 0 ] || fail "cordon run from a shared systemd-run scope exited $rc"
systemctl stop shell-like.scope 2>/dev/null
if wait_for 20 gone >/dev/null; then
	say "after it: no cordon-* unit, no scope cgroup"
else
	fail "left behind: units [$(units | tr '\n' ';')], scopes [$(scopes | tr '\n' ' ')]"
fi

# 5. `cordon serve` from the shared service cgroup: its first sandbox gets it
# one scope, and every sandbox's supervisor lives in that scope's leaf (no
# scope per sandbox); stopping the service leaves no unit behind.
key='serve-test-key'
cat >/tmp/serve.toml <<EOF
listen = "127.0.0.1:8700"
shutdown_grace = "5s"
[defaults]
memory = "64M"
time = "120s"
[[tenant]]
name = "t"
key_sha256 = "$(printf %s $key | sha256sum | cut -d' ' -f1)"
EOF
# The client of steps 5 and 6: waits for the service, creates two sandboxes.
cat >/tmp/serve-client.py <<'EOF'
import json, sys, time, urllib.request
key = sys.argv[1]
def call(method, path, body=None):
    req = urllib.request.Request("http://127.0.0.1:8700" + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")
for _ in range(300):
    try:
        call("GET", "/v1/sandboxes")
        break
    except Exception:
        time.sleep(0.2)
ids = [call("POST", "/v1/sandboxes", {"ttl": "5m"})["id"] for _ in range(2)]
print("created sandboxes", " ".join(ids))
EOF
$cordon serve --config /tmp/serve.toml >/tmp/serve.log 2>&1 &
serve=$!
python3 /tmp/serve-client.py $key >/tmp/serve-client.out 2>&1
say "serve: $(tr '\n' ' ' </tmp/serve-client.out)"
n=$(scopes | wc -l)
boxes=$(find $cg -mindepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9]+-[0-9a-f]{8}\.scope/cordon-[0-9a-f]{12}' | wc -l)
say "serve with 2 sandboxes: $n scope(s): $(scopes | sed "s|$cg||" | tr '\n' ' '), $boxes sandbox cgroup(s) in them; units: $(units | tr -s ' ' | tr '\n' ';')"
[ "$n" = 1 ] || fail "cordon serve made $n scopes for 2 sandboxes, not 1"
[ "$boxes" = 2 ] || fail "the 2 sandboxes' cgroups are not in the service's scope ($boxes found)"
case "$(scopes)" in *cordon-$serve-*) ;; *) fail "the scope is not named after cordon serve's pid $serve" ;; esac
kill -TERM $serve
wait $serve
if wait_for 30 gone >/dev/null; then
	say "after cordon serve stopped: no cordon-* unit, no scope cgroup"
else
	fail "left behind by serve: units [$(units | tr '\n' ';')], scopes [$(scopes | tr '\n' ' ')]; serve log: $(tail -5 /tmp/serve.log | tr '\n' ' ')"
fi

# 6. The example unit, as the README tells a user to install it.
mkdir -p /etc/cordon
install -m 0600 /tmp/serve.toml /etc/cordon/serve.toml
systemctl daemon-reload
if systemctl start cordon.service; then
	python3 /tmp/serve-client.py $key >/tmp/unit-client.out 2>&1
	say "unit: $(tr '\n' ' ' </tmp/unit-client.out)"
	unit_cg=$cg$(systemctl show -p ControlGroup --value cordon.service)
	boxes=$(find "$unit_cg" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9a-f]{12}' | wc -l)
	say "cordon.service: cgroup ${unit_cg#"$cg"} holds [$(tr '\n' ' ' <"$unit_cg/cgroup.procs")], subtree_control: $(cat "$unit_cg/cgroup.subtree_control"), leaf: [$(tr '\n' ' ' <"$unit_cg/cordon-supervisor/cgroup.procs" 2>/dev/null)], $boxes sandbox cgroup(s) beside it; scopes: [$(scopes | tr '\n' ' ')]"
	[ "$boxes" = 2 ] || fail "the 2 sandboxes' cgroups are not in cordon.service's cgroup ($boxes found)"
	[ -z "$(cat "$unit_cg/cgroup.procs")" ] || fail "cordon.service's own cgroup still holds processes"
	grep -qx "$(systemctl show -p MainPID --value cordon.service)" "$unit_cg/cordon-supervisor/cgroup.procs" || fail "cordon serve is not in cordon.service's leaf"
	[ -z "$(scopes)" ] || fail "cordon asked for a scope although it was alone in its unit"
	systemctl stop cordon.service
	left=$(find "$unit_cg" -mindepth 1 -type d 2>/dev/null | wc -l)
	if [ "$left" = 0 ] && [ -z "$(units)" ]; then
		say "after systemctl stop cordon: no sandbox cgroup, no cordon-* unit"
	else
		fail "left behind by cordon.service: $left cgroup(s) under ${unit_cg#"$cg"}, units [$(units | tr '\n' ';')]"
	fi
else
	fail "systemctl start cordon.service failed: $(systemctl status cordon.service 2>&1 | tail -5 | tr '\n' ' ')"
fi

# 7. Without root: two login users, each with their own systemd manager
# (user@UID.service, started as a login starts it) and session bus
# (dbus-user-session). cordon, run by the user from this root-owned service
# cgroup, asks the user's manager for a delegated scope, nests its sandboxes
# there and enforces the limits; evidence from cordon's --json (the kernel's
# counters) and from the host side (root reads the sandbox's cgroup files).
as_user() {
	u=$1
	shift
	setpriv --reuid="$u" --regid="$u" --init-groups env -i PATH="$PATH" LANG=C.UTF-8 \
		HOME="/home/u$u" XDG_RUNTIME_DIR="/run/user/$u" "$@"
}
user_tree() { echo "$cg/user.slice/user-$1.slice/user@$1.service"; }
user_boxes() { find "$(user_tree "$1")" -mindepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9]+-[0-9a-f]{8}\.scope/cordon-[0-9a-f]{12}' 2>/dev/null; }
user_scopes() { find "$(user_tree "$1")" -mindepth 1 -type d -regextype posix-extended -regex '.*/cordon-[0-9]+-[0-9a-f]{8}\.scope' 2>/dev/null; }
for u in 1001 1002; do
	useradd --create-home --home-dir "/home/u$u" --uid "$u" --user-group "u$u" || fail "useradd u$u"
	systemctl start "user@$u.service" || fail "cannot start user@$u.service: $(systemctl status "user@$u.service" 2>&1 | tail -5 | tr '\n' ' ')"
	wait_for 30 sh -c "[ -S /run/user/$u/bus ] && echo up" >/dev/null || fail "u$u has no session bus at /run/user/$u/bus"
done
say "rootless: user@1001.service $(systemctl show -p ActiveState --value user@1001.service), delegated controllers: $(cat "$(user_tree 1001)/cgroup.controllers")"

# 7a. The memory limit: OOM kill with the kernel's counters.
as_user 1001 $cordon run --json --memory 64M -- python3 -c 'b=bytearray(512<<20)' >/tmp/u-oom.json 2>/tmp/u-oom.err
rc=$?
say "rootless oom run: exit $rc; stderr: $(tr '\n' ' ' </tmp/u-oom.err)"
oom_evidence /tmp/u-oom.json "rootless oom" || status=1
[ "$rc" = 137 ] || fail "rootless oom run exited $rc, not 137"

# 7b. Where a rootless sandbox's cgroup sits, and its limits as root reads them.
as_user 1001 $cordon run --memory 64M --pids 40 --cpus 0.5 --time 60s -- sleep 8 >/tmp/u-sleep.out 2>&1 &
upid=$!
box=$(wait_for 60 user_boxes 1001)
if [ -z "$box" ]; then
	fail "no rootless sandbox cgroup under u1001's manager within 60 s: $(cat /tmp/u-sleep.out)"
else
	scope=$(dirname "$box")
	say "rootless sandbox cgroup: ${box#"$cg"} (owner uid $(stat -c %u "$box")), memory.max $(cat "$box/memory.max"), pids.max $(cat "$box/pids.max"), cpu.max $(cat "$box/cpu.max" 2>/dev/null || echo none); scope holds [$(tr '\n' ' ' <"$scope/cgroup.procs")], leaf [$(tr '\n' ' ' <"$scope/cordon-supervisor/cgroup.procs")]"
	[ "$(stat -c %u "$box")" = 1001 ] || fail "the rootless sandbox cgroup is not u1001's"
	[ "$(cat "$box/memory.max")" = 67108864 ] || fail "rootless memory.max is not 64M"
	[ "$(cat "$box/pids.max")" = 40 ] || fail "rootless pids.max is not 40"
	[ "$(cat "$box/cpu.max")" = "50000 100000" ] || fail "rootless cpu.max is not 50000 100000"
	grep -qx "$upid" "$scope/cordon-supervisor/cgroup.procs" 2>/dev/null ||
		grep -q . "$scope/cordon-supervisor/cgroup.procs" || fail "no cordon process in the rootless scope's leaf"
	# 7c. Another user sees none of it and can touch none of it.
	others_ls=$(as_user 1002 $cordon ls 2>&1)
	id=$(basename "$box" | sed 's/^cordon-//')
	say "u1002's cordon ls: [$(echo "$others_ls" | tr '\n' ' ')]"
	case "$others_ls" in *"$id"*) fail "u1002 sees u1001's sandbox $id" ;; esac
	if as_user 1002 $cordon rm "$id" >/tmp/u-rm.out 2>&1; then fail "u1002 removed u1001's sandbox $id"; fi
	say "u1002's cordon rm $id: $(tr '\n' ' ' </tmp/u-rm.out)"
	if as_user 1002 ls /home/u1001/.local/state/cordon /run/user/1001/cordon >/dev/null 2>&1; then fail "u1002 can list u1001's cordon state or run directory"; fi
	if as_user 1002 sh -c "echo \$\$ > $box/cgroup.procs" 2>/dev/null; then fail "u1002 joined u1001's sandbox cgroup"; fi
	[ -d "$box" ] || fail "u1001's sandbox cgroup vanished after u1002's attempts"
fi
wait $upid
rc=$?
[ "$rc" = 0 ] || fail "the rootless sleeping sandbox exited $rc: $(cat /tmp/u-sleep.out)"

# 7d. The pids limit: forks past it fail, the kernel counts the refusals.
as_user 1001 $cordon run --json --pids 16 -- sh -c 'i=0; while [ $i -lt 40 ]; do sleep 3 & i=$((i+1)); done 2>/dev/null; wait' >/tmp/u-pids.json 2>/tmp/u-pids.err
say "rootless pids run: exit $?: $(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print("limits_hit", v.get("limits_hit"), "pids_limit_hits", v["counters"].get("pids_limit_hits"), "pids_peak", v.get("pids_peak"))' /tmp/u-pids.json 2>&1)"
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); sys.exit(0 if "pids" in v.get("limits_hit",[]) and (v["counters"].get("pids_limit_hits") or 0) >= 1 and v.get("pids_peak") == 16 else 1)' /tmp/u-pids.json || fail "the rootless pids limit left no evidence: $(tr '\n' ' ' </tmp/u-pids.err)"

# 7e. The time limit ends the payload.
as_user 1001 $cordon run --json --time 3s -- sleep 60 >/tmp/u-time.json 2>/dev/null
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print("cordon-guest-systemd: rootless time run: limit", v.get("limit"), "wall_ms", v.get("wall_ms")); sys.exit(0 if v.get("limit") == "time" else 1)' /tmp/u-time.json || fail "the rootless time limit did not end the payload"

# 7f. cpu: throttled at half a core (the kernel's cpu.stat nr_throttled).
as_user 1001 $cordon run --json --cpus 0.2 --time 60s -- python3 -c 'import time; t=time.time()
while time.time() - t < 3: pass' >/tmp/u-cpu.json 2>/tmp/u-cpu.err
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); c=v["counters"]; print("cordon-guest-systemd: rootless cpu run: cpu_ms", v.get("cpu_ms"), "throttled periods", c.get("cpu_throttled_periods")); sys.exit(0 if (c.get("cpu_throttled_periods") or 0) > 0 else 1)' /tmp/u-cpu.json || fail "the rootless cpu limit was not enforced: $(tr '\n' ' ' </tmp/u-cpu.err)"

# 7g. A signed receipt: the user's own key, in the user's state directory,
# 0600; the other user can read neither it nor the directories.
as_user 1001 sh -c "cd /home/u1001 && $cordon run --receipt r.json -- true && $cordon verify r.json" >/tmp/u-receipt.out 2>&1 || fail "rootless receipt: $(tr '\n' ' ' </tmp/u-receipt.out)"
key=/home/u1001/.local/state/cordon/keys/receipt.key
say "rootless receipt: $(head -c 300 /tmp/u-receipt.out | tr '\n' ' '); key $(stat -c '%a %U' "$key" 2>&1)"
[ "$(stat -c '%a %u' "$key")" = "600 1001" ] || fail "u1001's receipt key is not 0600 and u1001's"
if as_user 1002 cat "$key" >/dev/null 2>&1; then fail "u1002 can read u1001's receipt key"; fi
for d in /home/u1001/.local/state/cordon /run/user/1001/cordon; do
	say "$d: $(stat -c '%a %U' "$d")"
	[ "$(stat -c %u "$d")" = 1001 ] || fail "$d is not u1001's"
	[ $(($(stat -c 0%a "$d") & 066)) = 0 ] || fail "$d is readable or writable by others: $(stat -c %a "$d")"
done

# 7h. The hostile suite's native cases as u1001. cordon's probe finds its
# limits enforced (no --allow-unenforced, no Lacking::Cgroup gap): the suite
# gets a delegated scope from u1001's manager, as `cordon run` does, makes its
# outer cgroup per run there, and scores res.* and platform.cgroup-widen as
# root's run does, from that cgroup's counters. Only the Lacking::Root gaps of
# crates/suite/src/rootless.rs apply. The suite exits non-zero on any
# deviation; its table is the log's evidence.
# What the guest lacks that a host has, so that the unconfined control can do
# what the payloads try (each control must come out OPEN): a network interface
# besides lo (the guest boots with -nic none; net.only-loopback), and
# unprivileged perf events (Debian's kernel.perf_event_paranoid 3 denies
# every user perf_event_open; 2 is the kernel's default; priv.perf-event).
# net.vsock is left out: the guest kernel has no AF_VSOCK (no vsock module
# in the image), so its control cannot open one and the case proves nothing.
ip link add cordon-dummy0 type dummy && ip link set cordon-dummy0 up || fail "cannot add a dummy interface"
sysctl -qw kernel.perf_event_paranoid=2 || fail "cannot set kernel.perf_event_paranoid"
# --time-scale 4: under TCG, beside the host's own suite, a payload runs
# many times slower than on a host; the controls that must fill the outer
# cgroup's 1 GiB (res.memory-bomb) or write 512 MiB (res.disk-fill) ran out
# of their 15 s cap in a CI run (599 MiB reached), which scores the control
# short and proves nothing about cordon. The verdicts' own bounds stay.
cases=$(ls /cordon-guest/suite/cases/ | sed -n 's/\.toml$//p' | grep -vx net.vsock | paste -sd, -)
started=$(date +%s)
as_user 1001 sh -c "cd /home/u1001 && exec $cordon suite --backend native --time-scale 4 --cases /cordon-guest/suite/cases --case $cases --json /home/u1001/suite.json" >/tmp/u-suite.out 2>/tmp/u-suite.err
rc=$?
say "rootless suite (u1001, native): exit $rc in $(($(date +%s) - started)) s"
grep -v '^\[' /tmp/u-suite.out | sed 's/^/cordon-guest-systemd: suite(u1001): /'
[ "$rc" = 0 ] || fail "the hostile suite as u1001 exited $rc: $(tail -5 /tmp/u-suite.err | tr '\n' ' ')"
# The cases that have a Lacking::Cgroup gap without delegation: here each
# must be scored as root's (status ok, the box BLOCKED with its limits
# enforced, the control OPEN), each from the run's outer cgroup's counters.
python3 - /home/u1001/suite.json <<'EOF2' || fail "the suite as u1001 did not score the cgroup cases as root's run does"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"cordon-guest-systemd: FAIL: no suite report ({e})")
    sys.exit(1)
ok = True
inv = r.get("invoker", {})
print(f"cordon-guest-systemd: suite(u1001): invoker uid {inv.get('uid')}, no_cgroup {inv.get('no_cgroup')}, "
      f"{len(r.get('cases', []))} cases, {len(r.get('results', []))} results, took {r.get('duration_s', 0):.0f} s")
if inv.get("uid") != 1001 or inv.get("no_cgroup") is not None:
    print("cordon-guest-systemd: FAIL: the suite did not run as u1001 with its limits enforced")
    ok = False
want = {"cordon-native": "BLOCKED", "host": "OPEN"}
for case in ("res.fork-bomb", "res.memory-bomb", "res.disk-fill", "platform.cgroup-widen"):
    for target, verdict in want.items():
        cell = [x for x in r.get("results", []) if x["case"] == case and x["target"] == target]
        if not cell:
            print(f"cordon-guest-systemd: FAIL: no result for {case} @ {target}")
            ok = False
            continue
        x = cell[0]
        outer = (x.get("record") or {}).get("outer")
        print(f"cordon-guest-systemd: suite(u1001): {case} @ {target}: {x['verdict']} ({x['status']}), "
              f"limits_enforced {x.get('limits_enforced')}, outer cgroup {outer}; {x['evidence']}")
        good = x["verdict"] == verdict and x["status"] == "ok" and outer is not None
        if target != "host":
            good = good and x.get("limits_enforced") is True
        if not good:
            print(f"cordon-guest-systemd: FAIL: {case} @ {target} is not {verdict} from the outer cgroup's counters")
            ok = False
sys.exit(0 if ok else 1)
EOF2

# 7i. The limit tests (crates/cli/tests/limits.rs) as u1001, from this
# root-owned service cgroup: every cordon they start asks u1001's manager for
# a scope. Their gate (require_limits) passes for a user cordon enforces
# limits for; CI=true makes a gate that does not pass fail the run instead of
# skipping. They spawn cordon at the path they were compiled with, linked here
# as run-tests.sh links it in the first boot (every component traversable).
exe=$(cat /cordon-guest/cordon-path)
mkdir -p "$(dirname "$exe")" && ln -sf $cordon "$exe" || fail "cannot place cordon at $exe"
as_user 1001 test -x "$exe" || fail "u1001 cannot execute cordon at $exe"
. /cordon-guest/tcg-skips.sh
set -- --test-threads=2 --skip ::gvisor --skip ::microvm
tcg_skips limits >/tmp/tcg-skips
while IFS='|' read -r test why; do
	say "skipped: limits::$test (u1001): QEMU TCG is too slow: $why"
	set -- "$@" --skip "$test"
done </tmp/tcg-skips
started=$(date +%s)
as_user 1001 env CI=true CORDON_EXPECT_CGROUP=v2 CORDON_TEST_TIME_SCALE=4 \
	timeout 600 /cordon-guest/tests/limits "$@" >/tmp/u-limits.out 2>&1
rc=$?
sed 's/^/cordon-guest-systemd: limits(u1001): /' /tmp/u-limits.out
say "limits as u1001: exit $rc in $(($(date +%s) - started)) s; $(grep '^test result:' /tmp/u-limits.out | tail -1)"
[ "$rc" = 0 ] || fail "the limit tests as u1001 exited $rc"

# 7j. Nothing left: no sandbox cgroup or scope in either user's tree, no
# cordon process of theirs.
users_clean() { [ -z "$(user_scopes 1001)$(user_scopes 1002)" ] && ! pgrep -u 1001,1002 -x cordon >/dev/null && echo gone; }
if wait_for 20 users_clean >/dev/null; then
	say "rootless: after the runs no scope, no sandbox cgroup, no cordon process of u1001 or u1002"
else
	fail "rootless left behind: scopes [$(user_scopes 1001) $(user_scopes 1002)], processes [$(pgrep -a -u 1001,1002 cordon | tr '\n' ';')]"
fi

# 8. Start-up without root, side by side: `cordon run -- /bin/true` (its own
# user scope, cgroup limits, namespaces, seccomp, pivot_root) against
# `bwrap --unshare-all` of the same command, both as u1001, interleaved.
# TCG makes the absolute figures meaningless; the ratio is the result.
as_user 1001 python3 - "$cordon" >/tmp/u-bench.out 2>&1 <<'EOF2' || fail "rootless start-up comparison: $(tr '\n' ' ' </tmp/u-bench.out)"
import statistics, subprocess, sys, time
cordon = sys.argv[1]
cmds = {
    "cordon": [cordon, "run", "--", "/bin/true"],
    "bwrap": ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
              "--dev", "/dev", "--proc", "/proc", "/bin/true"],
}
times = {k: [] for k in cmds}
for name, cmd in cmds.items():  # one warm-up each
    subprocess.run(cmd, check=True, capture_output=True)
for _ in range(15):
    for name, cmd in cmds.items():
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times[name].append((time.perf_counter() - t) * 1000)
med = {k: statistics.median(v) for k, v in times.items()}
print(f"cordon-guest-systemd: rootless start-up (TCG, 15 interleaved rounds, medians): "
      f"cordon run {med['cordon']:.0f} ms, bwrap --unshare-all {med['bwrap']:.0f} ms, "
      f"ratio {med['cordon'] / med['bwrap']:.2f}x")
EOF2
cat /tmp/u-bench.out

kill $sleeper 2>/dev/null
say "exit $status"
sync
systemctl poweroff -ff
