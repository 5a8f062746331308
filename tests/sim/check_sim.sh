#!/bin/sh
# Runs the allreduce cases of tools/sim/sim_check.h on a simulated cluster
# of HOSTS x RANKS_PER_HOST ranks (tnt-sim under smpirun, 10 Gbit/s links)
# and on the threads transport, and fails unless both succeed and print the
# same result hashes: the simulated run is libtnt's algorithm, bit for bit.
#   check_sim.sh HOSTSxRANKS_PER_HOST TNT_SIM_SO TNT_SIM_REFERENCE
set -eu
layout=$1 sim=$2 ref=$3
hosts=${layout%x*} per=${layout#*x}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(dirname "$0")
"$here/../../tools/sim/gen_platform.sh" --hosts "$hosts" --gbit 10 --lat-us 1 >"$dir/p.xml"
i=0
while [ "$i" -lt "$hosts" ]; do
  j=0
  while [ "$j" -lt "$per" ]; do echo "host$i"; j=$((j + 1)); done
  i=$((i + 1))
done >"$dir/hosts"
smpirun -np $((hosts * per)) -platform "$dir/p.xml" -hostfile "$dir/hosts" \
  --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no --log=root.thresh:warning \
  "$sim" --check >"$dir/sim.txt"
"$ref" "$hosts" "$per" >"$dir/ref.txt"
if ! cmp -s "$dir/sim.txt" "$dir/ref.txt"; then
  echo "simulated and threads results differ ($layout):"
  diff "$dir/ref.txt" "$dir/sim.txt" | head -20
  exit 1
fi
echo "$layout: $(wc -l <"$dir/sim.txt") results identical on SimGrid and on threads"
