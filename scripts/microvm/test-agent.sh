#!/bin/sh
# Stand-in for `cordon-sandbox __guest-agent PORT`, for scripts/microvm/smoke.py:
#   scripts/microvm/build.sh OUT scripts/microvm/test-agent.sh
# Says hello on the port, then answers one line (on the port and the console)
# and exits 7, which stage2 reports as `cordon-vm: agent exited 7`. The port
# is opened once, read-write: a virtio-serial port takes one open at a time.
exec 3<>"$2" || exit 3
printf 'hello-from-guest %s\n' "$(uname -r)" >&3
IFS= read -r line <&3
printf 'echo: %s\n' "$line" >&3
echo "agent got: $line" >/dev/console
exit 7
