#!/usr/bin/env bash
# Runs every test suite and ends with one summary line over all of them:
#   1. the release build: C unit tests, ranks-as-threads tests, MPI tests
#   2. an AddressSanitizer + UndefinedBehaviorSanitizer build of the same
#   3. a ThreadSanitizer build of the threaded engine tests
#   4. the launcher: its end-to-end tests (pytest) and its fuzz targets
#   5. the Python tests (pytest): the extension module, the TensorFlow ops,
#      and training on 1 to 4 ranks against serial Keras; then the wheel,
#      installed into a fresh virtual environment (tests/packaging)
#   6. the bad-input matrix (tests/reliability/test_bad_input.py)
# With --long (`make test-long`) it runs only the long tests instead: the
# Python tests marked `long` (the 60 random kill trials and two of the
# kills while saving in tests/python/test_faults.py, the soak test, and
# training on 4 ranks against serial Keras), which `make test` leaves out.
#
# The summary line is `N passed, M failed, K skipped`:
#   - ctest: a test ctest reports as "Skipped" (SKIP_RETURN_CODE) or
#     "Not Run (Disabled)" is skipped, not passed; "Not Run" for a missing
#     program or file is a failure (ctest counts it so).
#   - pytest: "K skipped" of its own summary (a module skipped by
#     pytest.importorskip or pytest.skip counts once, one skipped by a
#     skipif mark, e.g. test_tf_ops.py without the op library, once per
#     test); xfailed and xpassed count as passed, errors as failed; a suite
#     that ran no tests or printed no summary is a failure. Tests deselected with `-m "not long"`
#     are not counted; the python stage says how many there were.
#   The reason of every skip is printed above the summary line.
#
# In CI (CI=true) a skip is a failure, counted under "failed", unless the
# machine itself lacks what the test needs and no package can supply it:
#   - root, or the right to create network namespaces (the simulated
#     two-host cluster of tests/launcher/test_cluster.py, running the
#     launcher as another user in test_cli.py);
#   - NUMA nodes shown by the kernel (test_run.py's pinning test);
#   - a free link-local network for the simulated cluster.
# Everything `make deps` installs or the build produces must be there in CI:
# a test skipped for want of TensorFlow, the op library, mpirun, the
# Fashion-MNIST dataset or a Python that can create a virtual environment
# fails. No C test has a legitimate skip: in CI every ctest skip fails.
# (ENVIRONMENT_SKIPS below is that list; --self-test checks the parsers.)
#
# Usage: tests/run_all.sh [--long] [BUILD_DIR]
#        tests/run_all.sh --self-test
set -uo pipefail

# Skip reasons (extended regular expression) allowed in CI; see above.
ENVIRONMENT_SKIPS='needs root|cannot create network namespaces|shows no NUMA nodes|no free link-local network'

passed=0
failed=0
skipped=0
failed_suites=()
skip_notes=()
allowed_skips=0
refused_skips=0
deselected=0

# Whether CI=true (or 1/yes), as CI services set it.
in_ci() {
  [[ ${CI:-} =~ ^([Tt]rue|TRUE|1|[Yy]es)$ ]]
}

# ctest_counts LOG: "PASSED FAILED SKIPPED" of one ctest run, or nothing when
# its log has no summary. ctest counts a skipped test among those that ran
# ("out of N") and as passed, a disabled one in neither.
ctest_counts() {
  local log=$1 line total f s d
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1)
  [[ -n $line ]] || return 0
  f=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
  s=$(grep -cE '^[[:space:]]+[0-9]+ - .+ \(Skipped\)$' "$log")
  d=$(grep -cE '^[[:space:]]+[0-9]+ - .+ \(Disabled\)$' "$log")
  echo "$((total - f - s)) $f $((s + d))"
}

# ctest_skips LOG: one line per skipped or disabled test: "1<TAB>NAME (Skipped)".
ctest_skips() {
  sed -nE 's/^[[:space:]]+[0-9]+ - (.+ \((Skipped|Disabled)\))$/1\t\1/p' "$1"
}

# pytest_counts LOG: "PASSED FAILED SKIPPED DESELECTED" from pytest's last
# summary line ("3 failed, 90 passed, 2 skipped, 1 warning in 9.1s", or
# "no tests ran in 0.1s"), or nothing when there is none.
pytest_counts() {
  local log=$1 line word n p=0 f=0 s=0 d=0
  line=$(grep -E "^(=+ )?(no tests ran|[0-9]+ [a-z]+(, [0-9]+ [a-z]+)*) in [0-9.]+s" "$log" |
         tail -1)
  [[ -n $line ]] || return 0
  line=${line%% in [0-9]*}
  while read -r n word; do
    case $word in
      passed | xpassed | xfailed) p=$((p + n)) ;;
      failed | error | errors) f=$((f + n)) ;;
      skipped) s=$((s + n)) ;;
      deselected) d=$((d + n)) ;;
    esac
  done < <(grep -oE "[0-9]+ [a-z]+" <<<"$line")
  echo "$p $f $s $d"
}

# pytest_skips LOG: one line per skip reason and file from `pytest -rs`
# (which has a line per test for a module skipped by a skipif mark):
# "COUNT<TAB>REASON (FILE)", in the order of the log.
pytest_skips() {
  sed -nE 's/^SKIPPED \[([0-9]+)\] ([^ ]+):[0-9]+: (.*)$/\1\t\3 (\2)/p' "$1" |
    awk -F'\t' '!($2 in n) { order[++k] = $2 } { n[$2] += $1 }
                 END { for (i = 1; i <= k; i++) print n[order[i]] "\t" order[i] }'
}

# judge_skips KIND NAME: reads skip lines (from ctest_skips or pytest_skips)
# on stdin; sets allowed_skips and refused_skips, the counts of skips that
# stay skips and of those that fail in CI (outside CI every skip stays a
# skip), and appends a note per reason to skip_notes.
judge_skips() {
  local kind=$1 name=$2 n reason
  allowed_skips=0
  refused_skips=0
  while IFS=$'\t' read -r n reason; do
    [[ -n $n ]] || continue
    if in_ci && { [[ $kind == ctest ]] || ! grep -qE "$ENVIRONMENT_SKIPS" <<<"$reason"; }; then
      refused_skips=$((refused_skips + n))
      skip_notes+=("$name: $n x $reason: a failure in CI")
    else
      allowed_skips=$((allowed_skips + n))
      skip_notes+=("$name: $n x $reason")
    fi
  done
}

# add_counts NAME PASSED FAILED ALLOWED_SKIPS REFUSED_SKIPS: into the totals.
add_counts() {
  local name=$1 p=$2 f=$3 s=$4 refused=$5
  passed=$((passed + p))
  failed=$((failed + f + refused))
  skipped=$((skipped + s))
  ((f + refused == 0)) || failed_suites+=("$name")
}

# Adds one ctest run's counts to the totals.
run_ctest() {
  local name=$1 dir=$2
  shift 2
  echo "=== $name ==="
  local log counts p f s
  log=$(mktemp)
  (cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$log"
  counts=$(ctest_counts "$log")
  if [[ -z $counts ]]; then
    echo "tarantella: $name produced no ctest summary" >&2
    add_counts "$name" 0 1 0 0
  else
    read -r p f s <<<"$counts"
    judge_skips ctest "$name" < <(ctest_skips "$log")
    add_counts "$name" "$p" "$f" "$allowed_skips" "$refused_skips"
  fi
  rm -f "$log"
}

# Adds one pytest run's counts to the totals.
run_pytest() {
  local name=$1
  shift
  local log rc counts p f s d
  deselected=0
  log=$(mktemp)
  TF_CPP_MIN_LOG_LEVEL=2 "${PYTHON:-python3}" -m pytest -q -rs "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  counts=$(pytest_counts "$log")
  if [[ -z $counts ]]; then
    echo "tarantella: the $name tests produced no pytest summary" >&2
    add_counts "$name" 0 1 0 0
  else
    read -r p f s d <<<"$counts"
    if ((p + f + s == 0)); then
      echo "tarantella: the $name suite ran no tests" >&2
      f=1
    elif ((f == 0 && rc != 0)) && ! ((rc == 5 && s > 0)); then  # 5: every test skipped
      echo "tarantella: pytest exited with $rc on the $name tests" >&2
      f=1
    fi
    deselected=$d
    judge_skips pytest "$name" < <(pytest_skips "$log")
    # A skip without a reason line (none is expected with -rs) stays a skip.
    add_counts "$name" "$p" "$f" "$((s - refused_skips))" "$refused_skips"
  fi
  rm -f "$log"
}

# Prints the skip reasons, the failing suites and the summary line; the
# status is that of the whole run.
summarize() {
  local note
  if ((${#skip_notes[@]})); then
    echo "skipped:"
    for note in "${skip_notes[@]}"; do
      echo "  $note"
    done
  fi
  if ((${#failed_suites[@]})); then
    echo "failing suites: ${failed_suites[*]}"
  fi
  echo "${passed} passed, ${failed} failed, ${skipped} skipped"
  ((failed == 0))
}

# Checks the parsers above on saved outputs of ctest and pytest.
self_test() {
  local dir errors=0 got
  dir=$(mktemp -d)
  expect() {  # WHAT GOT WANT
    if [[ $2 != "$3" ]]; then
      echo "self-test: $1: got '$2', want '$3'" >&2
      errors=$((errors + 1))
    fi
  }
  cat >"$dir/ctest" <<'EOF'
2/6 Test #2: skipme ...........................***Skipped   0.00 sec
5/6 Test #5: missing ..........................***Not Run   0.00 sec

40% tests passed, 3 tests failed out of 5

Total Test time (real) =   0.02 sec

The following tests did not run:
	  2 - skipme (Skipped)
	  3 - dis (Disabled)

The following tests FAILED:
	  4 - bad (Failed)
	  5 - missing (Not Run)
	  6 - req (Not Run)
EOF
  expect "ctest counts" "$(ctest_counts "$dir/ctest")" "1 3 2"
  expect "ctest skips" "$(ctest_skips "$dir/ctest" | tr '\t\n' '|;')" "1|skipme (Skipped);1|dis (Disabled);"
  printf '100%% tests passed, 0 tests failed out of 41\n' >"$dir/ctest"
  expect "ctest all passed" "$(ctest_counts "$dir/ctest")" "41 0 0"
  echo "No tests were found!!!" >"$dir/ctest"
  expect "ctest no summary" "$(ctest_counts "$dir/ctest")" ""

  cat >"$dir/pytest" <<'EOF'
=========================== short test summary info ============================
SKIPPED [1] test_mod.py:2: could not import 'no_such_module_xyz': No module named 'no_such_module_xyz'
SKIPPED [1] tests/launcher/test_run.py:119: this kernel shows no NUMA nodes
SKIPPED [3] test_fake.py:7: the op library is not built (x): install it
SKIPPED [1] tests/python/test_tf_ops.py:171: the op library is not built (y)
SKIPPED [1] tests/python/test_tf_ops.py:175: the op library is not built (y)
FAILED tests/python/test_core.py::test_fusion - Failed: DID NOT RAISE TntError
1 failed, 92 passed, 7 skipped, 3 deselected, 1 xfailed, 2 errors, 1 warning in 91.40s (0:01:31)
EOF
  expect "pytest counts" "$(pytest_counts "$dir/pytest")" "93 3 7 3"
  expect "pytest skips" "$(pytest_skips "$dir/pytest" | cut -f1 | tr '\n' ' ')" "1 1 3 2 "
  got=$(CI=true judge_skips pytest python < <(pytest_skips "$dir/pytest")
        echo "$allowed_skips $refused_skips")
  expect "skips in CI" "$got" "1 6"
  got=$(CI=false judge_skips pytest python < <(pytest_skips "$dir/pytest")
        echo "$allowed_skips $refused_skips")
  expect "skips outside CI" "$got" "7 0"
  got=$(CI=true judge_skips pytest launcher \
          <<<$'2\tthe simulated cluster needs root (network namespaces) (test_cluster.py:40)'
        echo "$allowed_skips $refused_skips")
  expect "cluster without root in CI" "$got" "2 0"
  got=$(CI=true judge_skips ctest release <<<$'1\tskipme (Skipped)'
        echo "$allowed_skips $refused_skips")
  expect "ctest skip in CI" "$got" "0 1"
  echo "177 passed in 843.76s (0:14:03)" >"$dir/pytest"
  expect "pytest all passed" "$(pytest_counts "$dir/pytest")" "177 0 0 0"
  echo "============ 2 passed, 1 skipped in 0.51s ============" >"$dir/pytest"
  expect "pytest with rules" "$(pytest_counts "$dir/pytest")" "2 0 1 0"
  echo "1 skipped, 7 deselected in 0.01s" >"$dir/pytest"
  expect "pytest only skips" "$(pytest_counts "$dir/pytest")" "0 0 1 7"
  echo "no tests ran in 0.01s" >"$dir/pytest"
  expect "pytest no tests" "$(pytest_counts "$dir/pytest")" "0 0 0 0"
  echo "ERROR: file or directory not found: tests/nothing" >"$dir/pytest"
  expect "pytest no summary" "$(pytest_counts "$dir/pytest")" ""
  rm -rf "$dir"
  ((errors == 0)) && echo "self-test: the summary parsers are right"
}

# Sourced (e.g. to try the functions above): define them and stop here.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

cd "$(dirname "$0")/.." || exit 1
long=0
case ${1:-} in
  --self-test) self_test; exit ;;
  --long) long=1; shift ;;
esac
build=${1:-build}
jobs=$(nproc)
self_test >/dev/null || exit 1

if ((long)); then
  echo "=== python (long) ==="
  run_pytest "python-long" -m long tests/python
  summarize
  exit
fi

configure_build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" "$@" >/dev/null && cmake --build "$dir" -j "$jobs" >/dev/null
}

run_ctest "release" "$build"

# Open MPI keeps memory until exit on purpose; leak reports would be noise.
if configure_build build-asan -DCMAKE_BUILD_TYPE=Debug -DTNT_SANITIZE=address,undefined; then
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_ctest "asan+ubsan" build-asan
else
  echo "tarantella: the sanitizer build failed" >&2
  add_counts "asan+ubsan build" 0 1 0 0
fi

if configure_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DTNT_SANITIZE=thread; then
  TSAN_OPTIONS=halt_on_error=1 run_ctest "tsan" build-tsan -R "threads"
else
  echo "tarantella: the ThreadSanitizer build failed" >&2
  add_counts "tsan build" 0 1 0 0
fi

echo "=== launcher ==="
# The launcher's end-to-end tests (dry runs, bad input, real runs, a rank
# killed mid-training, a simulated two-host cluster), then each libFuzzer
# target for a bounded time; a fuzzer's finding counts as a failure.
launcher_bin=$build/src/launcher/tarantella
[[ $launcher_bin == /* ]] || launcher_bin=$PWD/$launcher_bin
TNT_LAUNCHER=$launcher_bin run_pytest "launcher" tests/launcher

fuzz_seconds=${TNT_FUZZ_SECONDS:-30}
if CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DTNT_BUILD_TESTS=OFF \
     -DTNT_BUILD_FUZZERS=ON >/dev/null &&
   cmake --build build-fuzz -j "$jobs" --target fuzz_options fuzz_hostfile >/dev/null; then
  for target in options hostfile; do
    work=$(mktemp -d)
    # New inputs go to a scratch corpus; the committed seeds stay as they are.
    if build-fuzz/fuzz/fuzz_$target -max_total_time="$fuzz_seconds" -artifact_prefix="$work/" \
         "$work" "fuzz/corpus/$target" >"$work.log" 2>&1; then
      echo "fuzz_$target: $(grep -E "^#[0-9]+.*DONE" "$work.log" | tail -1)"
      add_counts "fuzz_$target" 1 0 0 0
    else
      tail -40 "$work.log"
      echo "tarantella: fuzz_$target found a problem; the input is in $work" >&2
      add_counts "fuzz_$target" 0 1 0 0
    fi
    rm -f "$work.log"
  done
else
  echo "tarantella: the fuzz targets did not build (they need clang and libclang-rt-14-dev)" >&2
  add_counts "fuzz build" 0 1 0 0
fi

echo "=== python ==="
# Without the tests marked long (make test-long).
run_pytest "python" -m "not long" tests/python
echo "(${deselected} tests marked long left out: make test-long runs them)"

echo "=== packaging ==="
# A wheel built from this tree, installed with pip into a fresh virtual
# environment: the package, libtnt, the launcher in its bin/, the quick
# start on 2 ranks with that environment's Python.
run_pytest "packaging" tests/packaging

echo "=== reliability ==="
# The bad-input matrix: launcher, hostfile, environment and Python API cases,
# each in a subprocess with a deadline, against this build's launcher.
TNT_LAUNCHER=$launcher_bin run_pytest "reliability" tests/reliability

summarize
