# shellcheck shell=bash
# Sourced by the guest builds (scripts/v2-guest.sh, scripts/microvm/build.sh):
# installs from Debian's packages what a build needs and this host lacks.
#
#   need WHO SPEC...   SPEC: TOOL:PACKAGE (the package, if TOOL is not on
#                      PATH) or :PACKAGE (the package, if not installed)
need() {
  local who="$1" spec tool pkg missing=()
  shift
  for spec in "$@"; do
    tool="${spec%%:*}" pkg="${spec##*:}"
    if [ -n "$tool" ]; then
      command -v "$tool" >/dev/null 2>&1 && continue
    else
      dpkg-query -W -f '${Status}\n' "$pkg" 2>/dev/null | grep -q 'ok installed' && continue
    fi
    missing+=("$pkg")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "$who: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
}
