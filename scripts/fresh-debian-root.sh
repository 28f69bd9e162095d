#!/usr/bin/env bash
# Makes DIR a fresh Debian 12 root file system as a new machine of this project's kind has it,
# for `scripts/time-first-command.sh --fresh-root DIR` (the README's first command timed with
# apt included). debootstrap (minbase) from the host's Debian mirror, then the tools every
# machine of this kind starts with (.library env: g++ with cmake and CTest, GoogleTest,
# GoogleMock, Google Benchmark, git) and GNU time for the timing; nothing of distca's own list (scripts/install-deps.sh).
# Root only; installs debootstrap on the host if it is missing. About 10 minutes, mostly
# downloads (90 + 150 packages). DIR must not exist; on failure it is removed.
#
#   scripts/fresh-debian-root.sh /tmp/distca-fresh-base
set -euo pipefail
die() { echo "fresh-debian-root: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: scripts/fresh-debian-root.sh DIR"
dir=$1
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and chroot)"
[ ! -e "$dir" ] || die "$dir exists: give a new path"
mirror=http://deb.debian.org/debian
if [ ! -x /usr/sbin/debootstrap ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null || die "cannot install debootstrap"
fi

done_ok=0
cleanup() {
  for m in "$dir/dev" "$dir/proc"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -R "$m" || umount -lR "$m" || true; fi
  done
  if [ "$done_ok" -ne 1 ] && [ -d "$dir" ] && ! mountpoint -q "$dir/dev" && ! mountpoint -q "$dir/proc"; then
    rm -rf "$dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
  { tail -n 5 "$dir.debootstrap.log" >&2; rm -f "$dir.debootstrap.log"; die "debootstrap failed"; }
rm -f "$dir.debootstrap.log"
cp /etc/resolv.conf "$dir/etc/resolv.conf"
mount -t proc proc "$dir/proc"
mount --rbind /dev "$dir/dev"
mount --make-rslave "$dir/dev"
chroot "$dir" sh -c 'export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq &&
  apt-get install -y -qq --no-install-recommends build-essential cmake git ca-certificates time \
    libgtest-dev libgmock-dev libbenchmark-dev >/dev/null &&
  apt-get clean' || die "installing the machine's base tools failed"
done_ok=1
echo "fresh-debian-root: $dir ready ($(du -sh "$dir" | cut -f1))"
