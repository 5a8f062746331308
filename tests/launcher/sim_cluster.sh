#!/bin/sh
# A simulated cluster on one machine, for the launcher tests: every host is
# a network namespace of its own, with its own host name (a UTS namespace)
# and its own /dev/shm (a mount namespace), joined to this machine by a
# bridge with link-local addresses that exist only on the links created
# here. Needs root and iproute2.
#
#   sim_cluster.sh up ID OCTET HOST...   create the hosts; 169.254.OCTET.0/24 is their network
#   sim_cluster.sh down ID HOST...       remove them again
#   sim_cluster.sh agent HOST CMD...     run CMD on HOST (Open MPI's plm_rsh_agent)
#   sim_cluster.sh daemon HOST PROG ARG... run a daemon of HOST (a Slurm slurmd)
#
# ID is a short unique word (up to 6 characters) that names this run's
# links, so that runs never touch each other's.
set -eu

cmd=$1
shift
case $cmd in
  up)
    id=$1 octet=$2
    shift 2
    bridge="tntbr$id"
    ip link add "$bridge" type bridge
    ip addr add "169.254.$octet.1/24" dev "$bridge"
    ip link set "$bridge" up
    n=2
    for host in "$@"; do
      ip netns add "$host"
      ip netns exec "$host" ip link set lo up
      ip link add "tntv$id$n" type veth peer name eth0 netns "$host"
      ip link set "tntv$id$n" master "$bridge" up
      ip netns exec "$host" ip addr add "169.254.$octet.$n/24" dev eth0
      ip netns exec "$host" ip link set eth0 up
      n=$((n + 1))
    done
    ;;
  down)
    id=$1
    shift
    for host in "$@"; do
      ip netns del "$host" 2>/dev/null || true
    done
    ip link del "tntbr$id" 2>/dev/null || true
    ;;
  agent)
    # Open MPI calls the agent like ssh: the host, then the words of the
    # command, which a remote shell would join and run.
    host=$1
    shift
    exec ip netns exec "$host" unshare --uts --mount sh -c \
      'hostname "$1" && mount -t tmpfs tmpfs /dev/shm && exec sh -c "$2"' agent "$host" "$*"
    ;;
  daemon)
    # Like agent, but the program and its arguments are given as words, and
    # it enters only the host's network: `ip netns exec` would mount a /sys
    # of its own, hiding the cgroup file systems that slurmd looks for.
    host=$1
    shift
    exec nsenter --net="/var/run/netns/$host" unshare --uts --mount sh -c \
      'hostname "$1" && mount -t tmpfs tmpfs /dev/shm && shift && exec "$@"' daemon "$host" "$@"
    ;;
  *)
    echo "sim_cluster.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac
