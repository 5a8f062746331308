#!/bin/sh
# Drives test_timeout_mpi: runs it under `timeout 60` with TNT_TIMEOUT_S=3
# and checks that
#  - the job ended with a non-zero status, but not by the outer timeout;
#  - every rank but the last printed "rank R: timed out after X s" with
#    2.5 <= X <= 8, and no rank printed a FAIL line;
#  - a call after the timeout returned TNT_ERR_FAILED;
#  - a stall warning ("still waiting for rank W") came before the timeout;
#  - the library log (stderr lines starting with "[tnt") names the missing
#    peer ("rank W", W the last rank), and in fusion mode the bucket;
#  - the whole job took less than 40 s.
# Exits 0 only if all of it holds.
#
# Usage: check_timeout.sh NP MODE ALGORITHM EXE MPIEXEC [MPIEXEC_FLAGS...]
#   MODE       allreduce, reduce_scatter or fusion
#   ALGORITHM  default, or an allreduce algorithm to force (shm, ring, rd, mpi,
#              or hier, which runs the ranks as 2 hosts: TNT_SPLIT_HOSTS=2)
set -u

if [ $# -lt 5 ]; then
  echo "usage: $0 NP MODE ALGORITHM EXE MPIEXEC [MPIEXEC_FLAGS...]" >&2
  exit 2
fi
np=$1
mode=$2
algo=$3
exe=$4
shift 4

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/stdout
err=$tmp/stderr

export TNT_TIMEOUT_S=3
if [ "$algo" = default ]; then
  unset TNT_ALLREDUCE_ALGORITHM
else
  export TNT_ALLREDUCE_ALGORITHM="$algo"
fi
if [ "$algo" = hier ]; then
  export TNT_SPLIT_HOSTS=2
fi

start=$(date +%s.%N)
timeout 60 "$@" -np "$np" "$exe" "$mode" >"$out" 2>"$err"
rc=$?
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')

fail=0
complain() {
  echo "check_timeout: FAIL: $*"
  fail=1
}

withholder=$((np - 1))

if [ "$rc" -eq 0 ]; then
  complain "the job exited 0; expected a non-zero status from tnt_context_abort"
elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  complain "the job was still running after 60 s (status $rc): something hung"
fi

r=0
while [ "$r" -lt "$withholder" ]; do
  line=$(grep -E "^rank $r: timed out after [0-9.]+ s" "$out" | head -n 1)
  if [ -z "$line" ]; then
    complain "rank $r: expected a line 'rank $r: timed out after X s', got none"
  else
    x=$(echo "$line" | sed -E 's/^rank [0-9]+: timed out after ([0-9.]+) s.*/\1/')
    if ! awk -v x="$x" 'BEGIN { exit !(x >= 2.5 && x <= 8.0) }'; then
      complain "rank $r: expected the timeout after 2.5 to 8 s (TNT_TIMEOUT_S=3), got $x s"
    fi
  fi
  if ! grep -qE "^rank $r: later call returned TNT_ERR_FAILED" "$out"; then
    got=$(grep -E "^rank $r: later call returned" "$out" | head -n 1)
    complain "rank $r: expected a later call to return TNT_ERR_FAILED, got '${got:-no line}'"
  fi
  r=$((r + 1))
done

if grep -q ": FAIL:" "$out"; then
  complain "a rank reported a failure: $(grep ": FAIL:" "$out" | head -n 3 | tr '\n' ' ')"
fi

if ! grep -E '^\[tnt' "$err" | grep -qE "rank $withholder([^0-9]|$)"; then
  complain "the library log does not name the missing peer: no '[tnt' line with 'rank $withholder'"
fi

# A stalled peer is reported as a warning before the wait gives up.
if ! grep -E '^\[tnt [0-9]+/[0-9]+\] WARNING: .*still waiting for rank '"$withholder"'([^0-9]|$)' \
    "$err" >/dev/null; then
  complain "no stall warning naming rank $withholder before the timeout"
fi

if [ "$mode" = fusion ]; then
  bucket=$(sed -nE 's/^rank 0: withheld tensor 5 is in bucket ([0-9]+)$/\1/p' "$out" | head -n 1)
  if [ -z "$bucket" ]; then
    complain "rank 0 did not say which bucket holds the withheld tensor"
  elif ! grep -E '^\[tnt' "$err" | grep -qE "bucket $bucket([^0-9]|$)"; then
    complain "the library log does not name the bucket: no '[tnt' line with 'bucket $bucket'"
  fi
fi

if ! awk -v x="$elapsed" 'BEGIN { exit !(x < 40.0) }'; then
  complain "the job took $elapsed s; expected less than 40 s"
fi

echo "check_timeout: np=$np mode=$mode algorithm=$algo: mpirun status $rc after $elapsed s"
if [ "$fail" -ne 0 ]; then
  echo "----- stdout -----"
  cat "$out"
  echo "----- stderr -----"
  cat "$err"
  exit 1
fi
echo "----- stdout -----"
cat "$out"
echo "----- library log naming the peer -----"
grep -E '^\[tnt' "$err" | grep -E "rank $withholder([^0-9]|$)|bucket" | head -n 8
echo "check_timeout: PASS"
exit 0
