#!/bin/sh
# tnt-sim's allgather timing mode: libtnt's choice, the ring and Bruck's
# algorithm forced, and MPI_Allgather, one line per size each, on 5 hosts
# (not a power of two); on 16 hosts Bruck's 4 steps take less than half
# the ring's 15 for a small total, and libtnt chooses it there (copies are
# free in a timing run, so it serves every size). The results' bits are
# checked by the threads and MPI tiers (a timing run moves no data).
#   allgather_sim.sh TNT_SIM_SO
set -eu
sim=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(dirname "$0")
"$here/../../src/sim/gen_platform.sh" --hosts 16 --gbit 100 --lat-us 1 >"$dir/p.xml"
hosts() { # N: a hostfile of N hosts, one rank each
  i=0
  while [ "$i" -lt "$1" ]; do echo "host$i"; i=$((i + 1)); done >"$dir/h$1"
}
run() { # N ARGS...
  n=$1
  shift
  hosts "$n"
  smpirun -np "$n" -platform "$dir/p.xml" -hostfile "$dir/h$n" \
    --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no \
    --cfg=smpi/shared-malloc:global --log=root.thresh:warning "$sim" --bench \
    --collective allgather --copy-gbps 0 "$@"
}
expect() { # FILE LINES PATTERN
  got=$(grep '"collective": "allgather"' "$1" | grep -c "$3" || true)
  if [ "$got" != "$2" ]; then
    echo "$1: $got timing lines match '$3', expected $2:"
    cat "$1"
    exit 1
  fi
}
run 5 --algos auto,ring,bruck --min 5K --max 80K >"$dir/tnt.txt"
run 5 --mpi --min 5K --max 80K >"$dir/mpi.txt"
expect "$dir/tnt.txt" 15 '"bytes": [0-9]*, "us": [0-9.]*, "busbw": 0*[1-9.][0-9.]*}'
expect "$dir/tnt.txt" 5 '"choice": "auto", "algorithm": "bruck"'
expect "$dir/tnt.txt" 5 '"choice": "ring", "algorithm": "ring"'
expect "$dir/mpi.txt" 5 '"algorithm": "MPI_Allgather"'
echo "5 hosts: 20 allgathers timed (libtnt's choice, 2 forced, MPI's)"
run 16 --algos ring,bruck --min 16K --max 16K >"$dir/16.txt"
us() { sed -n "s/.*\"choice\": \"$1\".*\"us\": \([0-9.]*\).*/\1/p" "$dir/16.txt"; }
ring=$(us ring)
bruck=$(us bruck)
if ! awk -v b="$bruck" -v r="$ring" 'BEGIN { exit !(b < r / 2) }'; then
  echo "16 hosts, 16 KiB: Bruck's allgather took $bruck us, the ring's $ring us"
  exit 1
fi
echo "16 hosts, 16 KiB: Bruck's allgather $bruck us, the ring's $ring us"
