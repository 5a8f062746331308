#!/bin/sh
# Runs the allreduce cases of src/sim/sim_check.h on a simulated cluster
# (tnt-sim under smpirun, 10 Gbit/s links) and, given a reference program,
# on the threads transport, and fails unless both succeed and print the same
# result hashes: the simulated run is libtnt's algorithm, bit for bit.
# Without a reference (layouts too large for threads in one process) the
# simulated run alone checks every exact sum on every rank and that all
# ranks hold the same bits.
#   check_sim.sh LAYOUT TNT_SIM_SO [TNT_SIM_REFERENCE]
# LAYOUT: HOSTSxRANKS_PER_HOST (4x2), or the ranks of each host joined by
# '+' (3+1+2: uneven hosts).
set -eu
layout=$1 sim=$2 ref=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(dirname "$0")
case $layout in
  *x*) hosts=${layout%x*} per=${layout#*x}
       counts=$(i=0; while [ "$i" -lt "$hosts" ]; do printf '%s ' "$per"; i=$((i + 1)); done) ;;
  *) counts=$(echo "$layout" | tr '+' ' ') ;;
esac
h=0
for k in $counts; do
  j=0
  while [ "$j" -lt "$k" ]; do echo "host$h"; j=$((j + 1)); done
  h=$((h + 1))
done >"$dir/hosts"
h=$(sort -u "$dir/hosts" | wc -l)
np=$(wc -l <"$dir/hosts")
"$here/../../src/sim/gen_platform.sh" --hosts "$h" --gbit 10 --lat-us 1 >"$dir/p.xml"
smpirun -np "$np" -platform "$dir/p.xml" -hostfile "$dir/hosts" \
  --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no --log=root.thresh:warning \
  "$sim" --check >"$dir/sim.txt"
if [ -z "$ref" ]; then
  echo "$layout: $(wc -l <"$dir/sim.txt") results, exact sums and identical bits on every rank"
  exit 0
fi
"$ref" "$layout" >"$dir/ref.txt"
if ! cmp -s "$dir/sim.txt" "$dir/ref.txt"; then
  echo "simulated and threads results differ ($layout):"
  diff "$dir/ref.txt" "$dir/sim.txt" | head -20
  exit 1
fi
echo "$layout: $(wc -l <"$dir/sim.txt") results identical on SimGrid and on threads"
