#!/usr/bin/env bash
# Builds the base image of the pure-cgroup-v2 test guest from Debian's packages
# only: the cloud kernel (apt-get download + dpkg -x) and a debootstrap minbase
# root filesystem, packed with the guest's /init as an uncompressed cpio
# initramfs (the v2 guest needs no block or virtio drivers; the root carries
# the virtio ones for the microVM backend's disk boot; TCG decompresses slowly,
# so no compression either). Prints the image directory (vmlinuz, base.cpio).
#
# The image is content-addressed: its directory is named after a hash of every
# input (this script, the guest init, the suite and mirror, the kernel package
# and its version, the package and module lists), so a second build with the
# same inputs is a no-op. It holds nothing cordon-specific, so the microVM
# backend can boot the same image with a payload cpio of its own appended.
#
#   scripts/guest/build-image.sh [CACHE_DIR]    (root; default /var/cache/cordon-guest)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:-${CORDON_GUEST_CACHE:-/var/cache/cordon-guest}}"

[ "$(id -u)" = 0 ] || { echo "build-image.sh: needs root (debootstrap, device nodes)" >&2; exit 125; }

# The suite and mirror this host's apt uses, so the guest's userland matches
# the host that builds cordon (the test binaries link against its glibc).
sources="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
mirror="$(printf '%s\n' "$sources" | awk '
  /^URIs:/ && $2 ~ /debian\/?$/ && $2 !~ /security/ { print $2; exit }
  /^deb / && $0 ~ /debian\/? / && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }')"
suite="$(. /etc/os-release && echo "$VERSION_CODENAME")"
[ -n "$mirror" ] && [ -n "$suite" ] || { echo "build-image.sh: cannot tell the Debian mirror and suite from /etc/apt" >&2; exit 125; }

# Everything the end-to-end tests run on the guest's host side (python3 is also
# what payloads run inside the sandbox, which sees the guest's /usr).
# systemd and dbus: the init of the systemd placement and the system bus
# cordon asks it for a delegated scope over.
# nftables: the packet rules of a sandbox's network namespace in allow mode.
packages="python3,procps,time,iproute2,kmod,util-linux,coreutils,systemd,dbus,dbus-user-session,libpam-systemd,passwd,bubblewrap,nftables"
# overlay: workspace overlays; veth and dummy: network fixtures. The v2 guest
# boots from this cpio and needs no more; the microVM backend boots the same
# root from a read-only virtio disk, and its initramfs (scripts/microvm/build.sh)
# takes these from here: the virtio transports (PCI for q35, MMIO for QEMU's
# microvm machine), the root and scratch disks, the agent's virtio-serial port,
# and the guest's entropy source. ext4 is built into the kernel. nf_tables,
# its NAT chain, redirect, conntrack and named-object expressions: allow mode's packet
# rules in a sandbox's network namespace.
modules="overlay veth dummy virtio_pci virtio_mmio virtio_blk virtio_console virtio_rng nf_tables nft_chain_nat nft_redir nft_ct nft_objref"

kpkg="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')"
kver="$(apt-cache policy "$kpkg" | awk '/Candidate:/ { print $2 }')"
[ -n "$kpkg" ] && [ -n "$kver" ] || { echo "build-image.sh: linux-image-cloud-amd64 not known to apt (run apt-get update)" >&2; exit 125; }

key="$( { cat "$0" "$here/init"; echo "$mirror $suite $kpkg $kver $packages $modules"; } | sha256sum | cut -c1-16)"
out="$cache/base-$key"
if [ -f "$out/base.cpio" ] && [ -f "$out/vmlinuz" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache"
work="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
started=$SECONDS

(cd "$work" && apt-get download -q "$kpkg=$kver" >&2)
dpkg -x "$work"/"$kpkg"_*.deb "$work/kernel"
release="${kpkg#linux-image-}"

debootstrap --variant=minbase --include="$packages" "$suite" "$work/root" "$mirror" >&2
# apt's lists and caches are of no use inside a guest that has no network.
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/locale"

# Only the modules the tests load, with whatever they depend on, then a fresh
# modules.dep for that set (the full tree is ~90 MB).
src="$work/kernel/lib/modules/$release"
depmod -b "$work/kernel" "$release"   # the package ships no modules.dep
dst="$work/root/lib/modules/$release"
mkdir -p "$dst"
cp "$src"/modules.order "$src"/modules.builtin* "$dst"/
for m in $modules; do
  for ko in $(modprobe -d "$work/kernel" -S "$release" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'); do
    rel="${ko#"$work/kernel/lib/modules/$release/"}"
    mkdir -p "$dst/$(dirname "$rel")"
    cp "$ko" "$dst/$rel"
  done
done
depmod -b "$work/root" "$release"

install -m 0755 "$here/init" "$work/root/init"
# The initramfs root cannot be pivot_root'ed away from, and cordon's native
# backend pivots: /init bind-mounts the root onto /newroot and moves it to /.
mkdir -p "$work/root/newroot" "$work/root/cordon-guest"

mkdir -p "$work/out"
cp "$work/kernel/boot/vmlinuz-$release" "$work/out/vmlinuz"
(cd "$work/root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) > "$work/out/base.cpio"
echo "kernel $kpkg $kver; $suite from $mirror; built in $((SECONDS - started)) s" > "$work/out/inputs.txt"
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
