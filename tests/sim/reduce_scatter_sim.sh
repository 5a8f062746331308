#!/bin/sh
# tnt-sim's reduce-scatter: on uneven hosts (3+1+2 ranks: shared memory,
# the hierarchy and the algorithms across hosts), every rank's block of
# libtnt's reduce-scatter equals that block of the allreduce's result bit
# for bit, on every case of src/sim/sim_check.h (tnt-sim --check exits
# non-zero on a wrong block); and the timing mode runs libtnt's choice, each
# algorithm forced, and MPI_Reduce_scatter_block, one line per size each,
# also on 128 hosts.
#   reduce_scatter_sim.sh TNT_SIM_SO
set -eu
sim=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(dirname "$0")
"$here/../../src/sim/gen_platform.sh" --hosts 4 --gbit 10 --lat-us 1 >"$dir/p.xml"
printf 'host0\nhost0\nhost0\nhost1\nhost2\nhost2\n' >"$dir/uneven"
printf 'host0\nhost1\nhost2\nhost3\n' >"$dir/four"
run() { # HOSTFILE ARGS...
  hosts=$1
  shift
  smpirun -np "$(wc -l <"$hosts")" -platform "$dir/p.xml" -hostfile "$hosts" \
    --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no \
    --cfg=smpi/shared-malloc:global --log=root.thresh:warning "$sim" "$@"
}
run "$dir/uneven" --check --collective reduce_scatter >"$dir/check.txt"
echo "3+1+2: $(wc -l <"$dir/check.txt") reduce-scatters, every block the allreduce's"
run "$dir/four" --bench --collective reduce_scatter --algos auto,ring,rd,rabenseifner \
  --min 4K --max 64K >"$dir/tnt.txt"
run "$dir/four" --bench --collective reduce_scatter --mpi --min 4K --max 64K >"$dir/mpi.txt"
expect() { # FILE LINES PATTERN
  got=$(grep '"collective": "reduce_scatter"' "$1" | grep -c "$3" || true)
  if [ "$got" != "$2" ]; then
    echo "$1: $got timing lines match '$3', expected $2:"
    cat "$1"
    exit 1
  fi
}
expect "$dir/tnt.txt" 20 '"bytes": [0-9]*, "us": [0-9.]*, "busbw": 0*[1-9.][0-9.]*}'
expect "$dir/tnt.txt" 5 '"choice": "rabenseifner"'
expect "$dir/mpi.txt" 5 '"algorithm": "MPI_Reduce_scatter_block"'
echo "4 hosts: 25 reduce-scatters timed (libtnt's choice, 3 forced, MPI's)"
# 128 hosts: Rabenseifner's block starts (1 KiB of offsets) are control
# data, which a timing run must not skip as it skips copies of data.
i=0
while [ "$i" -lt 128 ]; do echo "host$i"; i=$((i + 1)); done >"$dir/many"
"$here/../../src/sim/gen_platform.sh" --hosts 256 --gbit 10 --lat-us 1 >"$dir/tree.xml"
smpirun -np 128 -platform "$dir/tree.xml" \
  -hostfile "$dir/many" --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no \
  --cfg=smpi/shared-malloc:global --log=root.thresh:warning "$sim" --bench \
  --collective reduce_scatter --algos rabenseifner --min 32K --max 32K >"$dir/many.txt"
expect "$dir/many.txt" 1 '"ranks": 128'
echo "128 hosts: Rabenseifner's reduce-scatter timed"
