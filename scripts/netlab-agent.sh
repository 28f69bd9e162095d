#!/usr/bin/env bash
# Open MPI's remote-shell agent for scripts/netlab.sh (`--mca plm_rsh_agent`): mpirun calls it
# as it would call ssh, `netlab-agent.sh HOST WORD...`, where HOST is a lab host (a network
# namespace named PREFIX-hN) and the words are orted's command line, quoted for a remote shell.
# It runs that command line with sh inside the host's network namespace and in a UTS namespace
# of its own whose hostname is HOST: Open MPI names session directories and tells nodes apart
# by hostname, and the lab's hosts share one kernel.
set -euo pipefail
host=${1:?usage: netlab-agent.sh HOST COMMAND...}
shift
if [[ ! $host =~ ^[A-Za-z0-9][A-Za-z0-9_-]*-h[0-9]+$ ]] || [ ! -e "/run/netns/$host" ]; then
  echo "netlab-agent: $host is not a host of an up lab (scripts/netlab.sh up)" >&2
  exit 1
fi
# The words are joined and parsed by sh, as a remote shell parses what ssh sends; "$0" is the
# host name (not part of the parsed text).
# shellcheck disable=SC2016
exec ip netns exec "$host" unshare --uts -- /bin/sh -c \
  'printf "%s\n" "$0" >/proc/sys/kernel/hostname || exit 1
'"$*" "$host"
