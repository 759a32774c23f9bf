#!/bin/sh
# An Open MPI launch agent (`tessera launch --launch-agent`, i.e. --mca plm_rsh_agent) that
# "logs in" to a host that is a network namespace on this machine, for the multi-host test
# (tests/integration/test_multihost.py):
#
#   netns_agent.sh HOST=NETNS[,HOST=NETNS...] HOST WORD...
#
# Open MPI calls its agent like ssh: `agent HOST WORD...`, where the words are a command line
# for the remote login shell (quoted for it, with `;` between commands). This script enters
# the namespace that the map names for HOST (`ip netns exec`, which also puts
# /etc/netns/NETNS/hosts over /etc/hosts), gives it the host's name in a UTS namespace of its
# own (so the processes there report HOST, as on a real second machine) and has a shell run
# the words, as sshd would.
set -eu
if [ $# -lt 3 ]; then
  echo "usage: $0 HOST=NETNS[,HOST=NETNS...] HOST COMMAND..." >&2
  exit 2
fi
map=$1
host=$2
shift 2
netns=
old_ifs=$IFS
IFS=,
for pair in $map; do
  if [ "${pair%%=*}" = "$host" ]; then netns=${pair#*=}; fi
done
IFS=$old_ifs
if [ -z "$netns" ]; then
  echo "$0: no network namespace for host '$host' in '$map'" >&2
  exit 255  # what ssh returns when it cannot reach the host
fi
# "$*": the words joined by spaces, as ssh sends them; the inner shell parses them.
exec ip netns exec "$netns" unshare --uts sh -c 'hostname "$1" && shift && eval "$*"' sh "$host" "$*"
