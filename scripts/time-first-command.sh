#!/usr/bin/env bash
# Times the README's first command as a new user meets it: a fresh clone of this checkout's
# committed HEAD in a temporary directory, `scripts/run.sh` there with no compiler cache, then
# prints the wall time and the CPU time (user + sys of every process it ran) of the whole
# command, and of the build alone (configure + `first_command`), and the ten slowest build
# steps (.ninja_log, wall seconds; ninja runs nproc + 2 jobs, so a step's wall time is roughly
# its CPU time times the jobs per core). The clone is removed afterwards. Extra arguments go to
# `distca train`. Uncommitted changes are not in the clone: commit first.
#
#   scripts/time-first-command.sh      # about 5-6 min on a quiet 2-core machine
#
# With `--fresh-root BASE` (root only) it measures the command with apt included: BASE is a
# Debian root as a new machine of this kind has it (scripts/fresh-debian-root.sh BASE); a copy
# of it gets the clone, and this script runs again inside the copy (chroot, with /proc and
# /dev mounted), so scripts/install-deps.sh downloads and installs every package the first
# command needs, timed within the build. The copy is unmounted and removed afterwards; BASE is
# left as it was.
#
#   scripts/time-first-command.sh --fresh-root /tmp/distca-fresh-base   # about 9-10 min here
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && git rev-parse --show-toplevel)"
if [ "${1:-}" = --fresh-root ]; then
  base=${2:?"time-first-command: --fresh-root needs the base root's path"}
  shift 2
  [ "$(id -u)" -eq 0 ] || { echo "time-first-command: --fresh-root needs root (chroot)" >&2; exit 2; }
  [ -x "$base/bin/sh" ] && [ -d "$base/var/lib/dpkg" ] ||
    { echo "time-first-command: $base is not a Debian root (scripts/fresh-debian-root.sh makes one)" >&2; exit 2; }
  root="$(mktemp -d "${TMPDIR:-/tmp}/distca-fresh-root.XXXXXX")"
  unmount_and_remove() {
    for m in "$root/dev" "$root/proc"; do
      if mountpoint -q "$m"; then umount -R "$m" || umount -lR "$m" || true; fi
    done
    # Never remove a tree that still has the host's /dev bound into it.
    if ! mountpoint -q "$root/dev" && ! mountpoint -q "$root/proc"; then rm -rf "$root"; fi
  }
  trap unmount_and_remove EXIT
  trap 'exit 130' INT TERM
  cp -a "$base/." "$root/"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  git clone -q --no-local "$src" "$root/root/distca"
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount --make-rslave "$root/dev"
  echo "time-first-command: in a fresh Debian root (apt included)" >&2
  chroot "$root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash /root/distca/scripts/time-first-command.sh "$@"
  exit $?
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/distca-first-command.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
git clone -q --no-local "$src" "$tmp/distca"
cd "$tmp/distca"
echo "time-first-command: $(git log -1 --format='%h %s') on $(nproc) cores" >&2

# No cache of any kind: a fresh machine has none (the lead's and the helpers' shells export
# ccache as the compiler launcher).
unset CMAKE_CXX_COMPILER_LAUNCHER CMAKE_C_COMPILER_LAUNCHER
export CCACHE_DISABLE=1

# The build alone first (what scripts/run.sh does before `distca train`), then run.sh itself,
# which finds the build up to date and adds the check of the packages and the training run.
fmt='%e %U %S'
/usr/bin/time -f "$fmt" -o "$tmp/build.time" \
  bash -c 'scripts/install-deps.sh --run && cmake --preset release >/dev/null &&
           cmake --build --preset release --target first_command >/dev/null'
/usr/bin/time -f "$fmt" -o "$tmp/run.time" scripts/run.sh "$@" >"$tmp/train.log"
tail -n 1 "$tmp/train.log"

read -r bw bu bs <"$tmp/build.time"
read -r rw ru rs <"$tmp/run.time"
awk -v bw="$bw" -v bu="$bu" -v bs="$bs" -v rw="$rw" -v ru="$ru" -v rs="$rs" 'BEGIN {
  printf "build (configure + first_command): wall %.1f s, cpu %.1f s (user %.1f, sys %.1f)\n", bw, bu + bs, bu, bs
  printf "train (run.sh on the built tree):  wall %.1f s, cpu %.1f s\n", rw, ru + rs
  printf "first command in all:              wall %.1f s (%.1f min), cpu %.1f s\n", bw + rw, (bw + rw) / 60, bu + bs + ru + rs
}'
echo "slowest build steps (wall s):"
awk 'NR > 1 { printf "%7.1f  %s\n", ($2 - $1) / 1000, $4 }' build/release/.ninja_log | sort -rn | head -n 10
# A long step alone at the end leaves a core idle: the last steps to finish, with their start
# and end (s from the start of the build).
echo "last build steps to finish (start s, end s):"
awk 'NR > 1 { printf "%7.1f %7.1f  %s\n", $1 / 1000, $2 / 1000, $4 }' build/release/.ninja_log | sort -k2 -n | tail -n 6
