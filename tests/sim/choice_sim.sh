#!/bin/sh
# tnt-sim tells libtnt's choice across hosts how fast the simulated machine
# reduces (TNT_REDUCE_GBPS, from --copy-gbps): on 8 simulated hosts, a
# 64 MiB allreduce runs Rabenseifner's algorithm when reductions are free
# (the ring has nothing to hide) and the pipelined ring when they cost what
# a CPU's do (15 GB/s copies: 10 GB/s reductions, libtnt's default rate);
# a rate set in the environment wins over the one tnt-sim tells.
#   choice_sim.sh TNT_SIM_SO
set -eu
sim=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
here=$(dirname "$0")
"$here/../../src/sim/gen_platform.sh" --hosts 8 --gbit 100 --lat-us 0.5 >"$dir/p.xml"
for h in 0 1 2 3 4 5 6 7; do echo "host$h"; done >"$dir/hosts"
chosen() { # COPY_GBPS: the algorithm of libtnt's choice at 64 MiB
  smpirun -np 8 -platform "$dir/p.xml" -hostfile "$dir/hosts" \
    --cfg=smpi/privatization:no --cfg=smpi/simulate-computation:no \
    --cfg=smpi/shared-malloc:global --log=root.thresh:warning \
    "$sim" --bench --min 64M --max 64M --copy-gbps "$1" |
    sed -n 's/.*"algorithm": "\([a-z]*\)".*/\1/p'
}
expect() { # WANT GOT WHAT
  if [ "$1" != "$2" ]; then
    echo "$3: libtnt chose '$2', expected '$1'"
    exit 1
  fi
}
expect rabenseifner "$(chosen 0)" "free reductions"
expect ring "$(chosen 15)" "reductions at 10 GB/s"
expect ring "$(TNT_REDUCE_GBPS=10 chosen 0)" "TNT_REDUCE_GBPS=10 in the environment"
echo "8 hosts, 64 MiB: rabenseifner with free reductions, the ring at 10 GB/s"
