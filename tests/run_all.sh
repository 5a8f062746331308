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
# Usage: tests/run_all.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
jobs=$(nproc)
passed=0
failed=0
failed_suites=()

# Adds one ctest run's counts to the totals.
run_ctest() {
  local name=$1 dir=$2
  shift 2
  echo "=== $name ==="
  local log
  log=$(mktemp)
  (cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$log"
  local line
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1)
  if [[ -z $line ]]; then
    echo "tarantella: $name produced no ctest summary" >&2
    failed=$((failed + 1))
    failed_suites+=("$name")
  else
    local f t
    f=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    t=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
    passed=$((passed + t - f))
    failed=$((failed + f))
    ((f == 0)) || failed_suites+=("$name")
  fi
  rm -f "$log"
}

# Adds one pytest run's counts to the totals.
run_pytest() {
  local name=$1
  shift
  local log
  log=$(mktemp)
  TF_CPP_MIN_LOG_LEVEL=2 "${PYTHON:-python3}" -m pytest -q "$@" 2>&1 | tee "$log"
  local line p f=0 n
  line=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$log" | tail -1)
  p=$(grep -oE "[0-9]+ passed" <<<"$line" | grep -oE "[0-9]+" || true)
  for n in $(grep -oE "[0-9]+ (failed|errors?)" <<<"$line" | grep -oE "[0-9]+" || true); do
    f=$((f + n))
  done
  if [[ -z $line ]]; then
    echo "tarantella: the $name tests produced no pytest summary" >&2
    f=1
  fi
  passed=$((passed + ${p:-0}))
  failed=$((failed + f))
  ((f == 0)) || failed_suites+=("$name")
  rm -f "$log"
}

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
  failed=$((failed + 1)); failed_suites+=("asan+ubsan build")
fi

if configure_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DTNT_SANITIZE=thread; then
  TSAN_OPTIONS=halt_on_error=1 run_ctest "tsan" build-tsan -R "threads"
else
  echo "tarantella: the ThreadSanitizer build failed" >&2
  failed=$((failed + 1)); failed_suites+=("tsan build")
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
      passed=$((passed + 1))
    else
      tail -40 "$work.log"
      echo "tarantella: fuzz_$target found a problem; the input is in $work" >&2
      failed=$((failed + 1))
      failed_suites+=("fuzz_$target")
    fi
    rm -f "$work.log"
  done
else
  echo "tarantella: the fuzz targets did not build (they need clang and libclang-rt-14-dev)" >&2
  failed=$((failed + 1))
  failed_suites+=("fuzz build")
fi

echo "=== python ==="
run_pytest "python" tests/python

echo "=== packaging ==="
# A wheel built from this tree, installed with pip into a fresh virtual
# environment: the package, libtnt, the launcher in its bin/, the quick
# start on 2 ranks with that environment's Python.
run_pytest "packaging" tests/packaging

echo "=== reliability ==="
# The bad-input matrix: launcher, hostfile, environment and Python API cases,
# each in a subprocess with a deadline, against this build's launcher.
TNT_LAUNCHER=$launcher_bin run_pytest "reliability" tests/reliability

if ((${#failed_suites[@]})); then
  echo "failing suites: ${failed_suites[*]}"
fi
echo "${passed} passed, ${failed} failed"
((failed == 0))
