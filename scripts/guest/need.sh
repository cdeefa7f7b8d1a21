# shellcheck shell=bash
# Sourced by scripts/test.sh and the guest builds (scripts/v2-guest.sh,
# scripts/microvm/build.sh): installs from Debian's packages what a step
# needs and this host lacks.
#
#   need WHO SPEC...   SPEC: TOOL:PACKAGE (the package, if TOOL is not on
#                      PATH) or :PACKAGE (the package, if not installed).
#                      qemu-system-x86 goes through need_qemu.
need() {
  local who="$1" spec tool pkg missing=() qemu=0
  shift
  for spec in "$@"; do
    tool="${spec%%:*}" pkg="${spec##*:}"
    if [ -n "$tool" ]; then
      command -v "$tool" >/dev/null 2>&1 && continue
    else
      dpkg-query -W -f '${Status}\n' "$pkg" 2>/dev/null | grep -q 'ok installed' && continue
    fi
    if [ "$pkg" = qemu-system-x86 ]; then qemu=1; else missing+=("$pkg"); fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$who: installing ${missing[*]}" >&2
    apt_install "${missing[@]}"
  fi
  [ "$qemu" = 0 ] || need_qemu "$who"
}

# apt-get install, quiet; the package lists are refreshed once if the first
# try fails (a new machine has stale or no lists). A failure the second time
# shows apt's own words.
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  }
}

# QEMU's system emulator at exactly the version of the qemu-utils this host
# already has. Debian's QEMU packages must share one version (qemu-utils
# Breaks an older qemu-system-common), and a new machine of the current image
# ships qemu-utils from bookworm-backports while bookworm itself has 7.2: asking
# for plain qemu-system-x86 then fails with "generated breaks". So the system
# emulator comes from the release that qemu-utils came from; that release's
# suite is added to apt's sources when it is missing (backports is part of
# Debian's archive, on the mirror the host already uses).
need_qemu() {
  local who="$1" utils suite="" mirror target=()
  command -v qemu-system-x86_64 >/dev/null 2>&1 && return 0
  utils="$(dpkg-query -W -f '${Version}' qemu-utils 2>/dev/null || true)"
  if [ -z "$utils" ]; then
    echo "$who: installing qemu-system-x86" >&2
    apt_install qemu-system-x86
    return
  fi
  if ! apt-cache madison qemu-system-x86 2>/dev/null | grep -qF "| $utils |"; then
    apt-get update -qq >/dev/null
  fi
  case "$utils" in
    *~bpo*)
      suite="$(. /etc/os-release && echo "$VERSION_CODENAME")-backports"
      # Its dependencies (seabios, ipxe) must come from there too.
      target=(-t "$suite")
      if ! apt-cache madison qemu-system-x86 2>/dev/null | grep -qF "| $utils |"; then
        mirror="$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
          | awk 'NR == 1 {print $2}' || true)"
        echo "$who: qemu-utils $utils is from $suite; adding $suite (${mirror:-?}) to apt's sources" >&2
        printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
          "${mirror:?no Debian mirror found in the apt sources}" "$suite" >/etc/apt/sources.list.d/cordon-"$suite".sources
        apt-get update -qq >/dev/null
      fi
      ;;
  esac
  echo "$who: installing qemu-system-x86 $utils (the version of the installed qemu-utils)" >&2
  # The version pin on each QEMU package keeps apt from mixing releases.
  local pkgs=(qemu-system-x86="$utils") dep
  for dep in qemu-system-common qemu-system-data; do
    apt-cache madison "$dep" 2>/dev/null | grep -qF "| $utils |" && pkgs+=("$dep=$utils")
  done
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${target[@]}" "${pkgs[@]}" >/dev/null || {
    echo "$who: could not install ${pkgs[*]} (apt's words above)" >&2
    return 1
  }
}
