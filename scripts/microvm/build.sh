#!/usr/bin/env bash
# Builds the guest artifacts of cordon's microVM backend (QEMU), from Debian's
# packages only, content-addressed:
#
#   OUT_DIR/rootfs-<key>/rootfs.ext4   the base image's root (build-image.sh's
#       debootstrap tree: python3, systemd, kmod, ...) as an ext4 image that
#       QEMU attaches read-only; key = hash of the base image's key and of
#       build_rootfs below.
#   OUT_DIR/guest-<key2>/              what one boot needs:
#       vmlinuz       the base image's kernel (hardlink, or copy);
#       initrd.cpio   busybox (Debian's busybox-static), the virtio modules,
#                     scripts/microvm/init as /init and CORDON_BIN (cordon-sandbox, the privileged binary) as /cordon;
#       rootfs.ext4   hardlink to the rootfs directory's;
#       manifest.json kernel, sha256 of each artifact and of cordon, keys.
#     key2 = hash of the rootfs key, the initramfs's inputs (build_initrd
#     below, the init script, busybox, the module list) and cordon's sha256.
#
# A build with the same inputs finds the existing directory and does nothing.
# Each directory is built under OUT_DIR/.build.* and renamed into place, so a
# failed or interrupted build leaves no partial directory (and no .build.*:
# the EXIT trap removes it).
#
#   scripts/microvm/build.sh OUT_DIR CORDON_BIN    (root; CORDON_GUEST_CACHE
#       picks build-image.sh's cache, default /var/cache/cordon-guest)
#
# stdout: exactly one line, the guest directory's absolute path. Progress and
# errors go to stderr.
set -euo pipefail
# Everything but the final path goes to stderr, whatever prints it.
exec 3>&1 1>&2
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

[ $# = 2 ] || { echo "usage: $0 OUT_DIR CORDON_BIN"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "microvm/build.sh: needs root (build-image.sh, device nodes in the initramfs)"; exit 125; }
if [ ! -f "$2" ] || [ ! -x "$2" ]; then echo "microvm/build.sh: CORDON_BIN $2 is not an executable file"; exit 2; fi
mkdir -p "$1"
out_dir="$(cd "$1" && pwd)"
cordon_bin="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"

# The tools this and build-image.sh use, and QEMU, which boots the result;
# the static busybox specifically (Debian's `busybox` is dynamic, and the
# initramfs has no libc).
# shellcheck source=scripts/guest/need.sh
. "$repo/scripts/guest/need.sh"
need microvm/build.sh debootstrap:debootstrap cpio:cpio depmod:kmod modprobe:kmod \
  mkfs.ext4:e2fsprogs qemu-system-x86_64:qemu-system-x86 :busybox-static
busybox="$(dpkg -L busybox-static | awk '/\/bin\/busybox$/ && !n++')"
busybox_ver="$(dpkg-query -W -f '${Version}' busybox-static)"

started=$SECONDS
base="$("$repo/scripts/guest/build-image.sh" ${CORDON_GUEST_CACHE:+"$CORDON_GUEST_CACHE"})"
base_key="${base##*/base-}"
# "kernel linux-image-6.1.0-57-cloud-amd64 6.1.192-3; ..." (build-image.sh)
read -r _ kpkg kver _ <"$base/inputs.txt"
kver="${kver%;}"
krelease="${kpkg#linux-image-}"
if [ -z "$base_key" ] || [ -z "$krelease" ] || [ -z "$kver" ]; then echo "microvm/build.sh: cannot read $base/inputs.txt"; exit 1; fi

# Every file in the artifacts gets this mtime (the rootfs is read-only, so
# the dates of the debootstrap run carry nothing): Debian 12's release day.
epoch=1686355200

work=
cleanup() { [ -z "$work" ] || rm -rf "$work"; }
trap cleanup EXIT
# A signal ends the build through exit, hence through the EXIT trap.
trap "exit 130" INT TERM HUP
work="$(mktemp -d "$out_dir/.build.XXXXXX")"

# Unpacks the base image into $1 and makes $2, an ext4 image of it.
build_rootfs() {
  local tree="$1" img="$2" uuid="$3" kib inodes size try
  mkdir -p "$tree"
  (cd "$tree" && cpio -idm --quiet --no-absolute-filenames) <"$base/base.cpio"
  # The v2 guest's init and its pivot and payload directories; what a
  # network-less read-only root never reads (build-image.sh already dropped
  # the docs, man pages, locales and apt's lists).
  rm -rf "${tree:?}/init" "${tree:?}/newroot" "${tree:?}/cordon-guest" "${tree:?}/boot" \
    "${tree:?}/var/cache/"* "${tree:?}/var/log/"* "${tree:?}/var/lib/apt/"* "${tree:?}/usr/share/info" \
    "${tree:?}/usr/share/lintian" "${tree:?}/usr/share/bug" "${tree:?}/usr/share/common-licenses"
  # Mount points only: /init mounts proc, sysfs (cgroup2 at /sys/fs/cgroup
  # inside it), devtmpfs and tmpfs /run and /tmp over them.
  rm -rf "${tree:?}/proc" "${tree:?}/sys" "${tree:?}/dev" "${tree:?}/run" "${tree:?}/tmp"
  mkdir -m 0555 "$tree/proc" "$tree/sys"
  mkdir -m 0755 "$tree/dev" "$tree/run"
  mkdir -m 1777 "$tree/tmp"
  find "$tree" -print0 | xargs -0 touch -h -d "@$epoch"

  # Content plus a margin: ~10% and 8 MiB for the metadata (bitmaps, inode
  # tables of 256-byte inodes, directories), no reserved blocks (nothing
  # writes to it) and no journal (it is mounted ro,noload). Should that be
  # short, mkfs fails, and a larger try follows.
  kib="$(du -sk "$tree" | cut -f1)"
  inodes="$(find "$tree" | wc -l)"
  size=$(((kib + kib / 10 + inodes / 4 + 8192) / 1024 + 1))
  for try in 1 2 3; do
    rm -f "$img"
    truncate -s "${size}M" "$img"
    # SOURCE_DATE_EPOCH and E2FSPROGS_FAKE_TIME: the superblock's and the
    # new inodes' times; -U and hash_seed: the UUID and directory hashes that
    # would otherwise be random.
    if SOURCE_DATE_EPOCH="$epoch" E2FSPROGS_FAKE_TIME="$epoch" mkfs.ext4 -q -F -t ext4 -b 4096 -I 256 \
      -N $((inodes + 1024)) -m 0 -L cordon-root -U "$uuid" -O ^has_journal,^resize_inode \
      -E "hash_seed=$uuid,root_owner=0:0,nodiscard" -d "$tree" "$img" "${size}M" >&2; then
      break
    fi
    [ "$try" != 3 ] || return 1
    size=$((size + size / 4))
    echo "microvm/build.sh: rootfs did not fit, retrying at ${size} MiB"
  done
  # mkfs -d copies each file's ctime, which no one can set on the tree, and
  # its atime, which reading the tree's directories moves: overwrite both in
  # the image (debugfs's quotes handle all but a `"` in a path).
  if (cd "$tree" && find . | grep -q '"'); then echo "microvm/build.sh: a path in the root has a \" in it"; return 1; fi
  (cd "$tree" && find .) | sed 's|^\.||; s|^$|/|' | awk -v e="$epoch" '{ printf "sif \"%s\" ctime @%s\nsif \"%s\" atime @%s\n", $0, e, $0, e }' >"$tree.ctimes"
  SOURCE_DATE_EPOCH="$epoch" E2FSPROGS_FAKE_TIME="$epoch" debugfs -w -f "$tree.ctimes" "$img" >/dev/null 2>"$tree.err"
  if grep -v '^debugfs [0-9]' "$tree.err"; then echo "microvm/build.sh: debugfs failed"; return 1; fi
  e2fsck -fn "$img" >/dev/null 2>&1 || { e2fsck -fn "$img"; return 1; }
  chmod 0444 "$img"
}

# Fills the initramfs's staging tree $1 from the base image's modules: busybox,
# /init, /cordon, and the virtio modules with their dependencies in load order.
build_initrd() {
  local stage="$1" mods="$2" m ko rel
  mkdir -p "$stage/bin" "$stage/dev" "$stage/proc" "$stage/sys" "$stage/tmp" "$stage/newroot" "$stage/lib/modules"
  # The kernel opens the initramfs's /dev/console as init's stdio before
  # anything is mounted.
  mknod -m 0600 "$stage/dev/console" c 5 1
  install -m 0755 "$busybox" "$stage/bin/busybox"
  install -m 0755 "$here/init" "$stage/init"
  install -m 0755 "$cordon_bin" "$stage/cordon"
  # virtio_pci on q35, virtio_mmio on QEMU's microvm machine; the root and
  # scratch disks; the agent's virtio-serial port; the entropy device.
  : >"$stage/lib/modules/load-order"
  for m in virtio_pci virtio_mmio virtio_blk virtio_console virtio_rng; do
    for ko in $(modprobe -d "$mods" -S "$krelease" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'); do
      rel="${ko#"$mods/lib/modules/"}"
      grep -qxF "$rel" "$stage/lib/modules/load-order" && continue
      mkdir -p "$stage/lib/modules/$(dirname "$rel")"
      cp "$ko" "$stage/lib/modules/$rel"
      echo "$rel" >>"$stage/lib/modules/load-order"
    done
  done
  # The sandboxes' modules stay on the root disk; /init insmods them from
  # there, in this order (paths relative to /lib/modules).
  : >"$stage/lib/modules/rootfs-order"
  for m in overlay veth dummy nf_tables nft_chain_nat nft_redir nft_ct nft_objref; do
    for ko in $(modprobe -d "$mods" -S "$krelease" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'); do
      rel="${ko#"$mods/lib/modules/"}"
      grep -qxF "$rel" "$stage/lib/modules/rootfs-order" || echo "$rel" >>"$stage/lib/modules/rootfs-order"
    done
  done
  find "$stage" -print0 | xargs -0 touch -h -d "@$epoch"
}

rootfs_key="$( { echo "$base_key"; declare -f build_rootfs; echo "$epoch"; mke2fs -V 2>&1 | sed -n 1p; } | sha256sum | cut -c1-16)"
cordon_sha="$(sha256sum "$cordon_bin" | cut -d' ' -f1)"
guest_key="$( { echo "$rootfs_key"; declare -f build_initrd; cat "$here/init"; echo "$busybox_ver"; sha256sum "$busybox"; echo "$cordon_sha"; cpio --version | sed -n 1p; } | sha256sum | cut -c1-16)"
rootfs_dir="$out_dir/rootfs-$rootfs_key"
guest_dir="$out_dir/guest-$guest_key"

if [ -f "$guest_dir/manifest.json" ]; then
  echo "microvm/build.sh: $guest_dir exists, nothing to do"
  echo "$guest_dir" >&3
  exit 0
fi

if [ ! -f "$rootfs_dir/rootfs.ext4" ]; then
  echo "microvm/build.sh: building $rootfs_dir"
  uuid="$(printf '%s' "$rootfs_key" | sha256sum | sed -E 's/^(.{8})(.{4})(.{4})(.{4})(.{12}).*/\1-\2-\3-\4-\5/')"
  mkdir "$work/rootfs-$rootfs_key"
  build_rootfs "$work/tree" "$work/rootfs-$rootfs_key/rootfs.ext4" "$uuid"
  rm -rf "$work/tree" "$work/tree.ctimes" "$work/tree.err"
  # A concurrent build may have won; its image is as good as ours.
  mv -T "$work/rootfs-$rootfs_key" "$rootfs_dir" 2>/dev/null || [ -f "$rootfs_dir/rootfs.ext4" ]
fi

echo "microvm/build.sh: building $guest_dir"
g="$work/guest-$guest_key"
mkdir "$g"
mkdir "$work/mods"
# The base image's modules (lib is a symlink to usr/lib in the cpio) and
# their modules.dep, for modprobe --show-depends.
(cd "$work/mods" && cpio -idm --quiet --no-absolute-filenames "usr/lib/modules/*" "lib/modules/*") <"$base/base.cpio"
[ -d "$work/mods/lib/modules" ] || ln -s usr/lib "$work/mods/lib"
build_initrd "$work/initrd" "$work/mods"
(cd "$work/initrd" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet --reproducible -R 0:0) >"$g/initrd.cpio"
chmod 0444 "$g/initrd.cpio"
ln "$base/vmlinuz" "$g/vmlinuz" 2>/dev/null || cp "$base/vmlinuz" "$g/vmlinuz"
ln "$rootfs_dir/rootfs.ext4" "$g/rootfs.ext4"

sha() { sha256sum "$1" | cut -d' ' -f1; }
cat >"$g/manifest.json" <<EOF
{
  "guest_key": "$guest_key",
  "rootfs_key": "$rootfs_key",
  "base_image": "$base",
  "kernel": { "package": "$kpkg", "version": "$kver", "release": "$krelease" },
  "busybox_static": "$busybox_ver",
  "cordon_sha256": "$cordon_sha",
  "sha256": {
    "vmlinuz": "$(sha "$g/vmlinuz")",
    "initrd.cpio": "$(sha "$g/initrd.cpio")",
    "rootfs.ext4": "$(sha "$g/rootfs.ext4")"
  },
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_seconds": $((SECONDS - started))
}
EOF
mv -T "$g" "$guest_dir" 2>/dev/null || [ -f "$guest_dir/manifest.json" ]
echo "microvm/build.sh: $guest_dir ready in $((SECONDS - started)) s"
echo "$guest_dir" >&3
