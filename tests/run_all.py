#!/usr/bin/env python3
"""Runs test tiers and ends with one summary line over all of them.

The tiers (the Makefile's targets, which build or install first):
  check       C unit and threaded tests (ctest -L 'unit|threads') and the
              Python tests that start no ranks (-m "not ranks and not
              long"), the package imported from the build (BUILD/python)
  mpi         the C tests under mpirun and on SimGrid (ctest -L 'mpi|sim')
  sanitizers  an AddressSanitizer + UndefinedBehaviorSanitizer build of
              every C test (the largest MPI programs at 2 and 3 ranks), a
              ThreadSanitizer build of the threaded ones
  launcher    its end-to-end tests (tests/launcher), its fuzz targets for
              TNT_FUZZ_SECONDS (10) each, and the bad-input matrix
              (tests/reliability), against BUILD's launcher
  python      the Python tests that start ranks (-m "ranks and not long"),
              then the wheel in a fresh virtual environment (tests/packaging)
  long        the tests marked `long` (random kill trials, soak, 4 ranks)
With no tier named, all but `long` (`make test`).

Results are counted from the JUnit XML that ctest and pytest write
(BUILD/test-results/), and the summary line is `N passed, M failed, K
skipped`:
  - ctest: a test skipped by SKIP_RETURN_CODE or disabled is skipped; one
    not run for a missing program or file is a failure (as ctest counts it).
  - pytest: xfailed and xpassed count as passed, errors as failed; a module
    skipped whole counts once. Tests deselected by a marker are not counted.
  - a run that wrote no XML, ran no test, or exited non-zero with nothing
    failed counts one failure.
The reason of every skip is printed above the time of each tier and the
summary line.

In CI (CI=true) a skip is a failure, counted under "failed", unless the
machine itself lacks what the test needs and no package can supply it:
  - root, or the right to create network namespaces (the simulated
    two-host cluster of tests/launcher/test_cluster.py, running the
    launcher as another user in test_cli.py);
  - NUMA nodes shown by the kernel (test_run.py's pinning test);
  - a free link-local network for the simulated cluster.
Everything `make deps` installs or the build produces must be there in CI:
a test skipped for want of TensorFlow, the op library, mpirun, the
Fashion-MNIST dataset or a Python that can create a virtual environment
fails. No C test has a legitimate skip: in CI every ctest skip fails.
(ENVIRONMENT_SKIPS below is that list; --self-test checks the counting.)

Usage: tests/run_all.py [--build DIR] [TIER...]
       tests/run_all.py --self-test
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get("PYTHON", sys.executable)
JOBS = str(os.cpu_count() or 1)

# Skip reasons allowed in CI; see above.
ENVIRONMENT_SKIPS = re.compile(
    r"needs root|cannot create network namespaces|shows no NUMA nodes|no free link-local network")

Counts = collections.namedtuple("Counts", "passed failed skipped skips")  # skips: [(n, reason)]


def in_ci():
    return os.environ.get("CI", "") in ("true", "True", "TRUE", "1", "yes", "Yes")


def ctest_counts(path):
    """Counts of a ctest JUnit file (ctest --output-junit)."""
    passed = failed = skipped = 0
    skips = []
    for case in ET.parse(path).getroot().iter("testcase"):
        status, skip = case.get("status"), case.find("skipped")
        if status == "disabled" or (skip is not None and
                                    skip.get("message", "").startswith("SKIP_")):
            skipped += 1
            skips.append((1, f"{case.get('name')} ({status.replace('notrun', 'skipped')})"))
        elif status == "run":
            passed += 1
        else:  # failed, or not run for a missing program or file
            failed += 1
    return Counts(passed, failed, skipped, skips)


def pytest_skip_reason(case, skip):
    if skip.get("message") == "collection skipped":  # a module skipped whole
        found = re.search(r"Skipped: (.*?)['\"]\)$", skip.text or "")
        reason = found.group(1) if found else skip.text
    else:
        reason = skip.get("message", "")
    where = case.get("file") or case.get("classname") or case.get("name")
    return f"{reason} ({where})"


def pytest_counts(path):
    """Counts of a pytest JUnit file (pytest --junitxml)."""
    passed = failed = skipped = 0
    reasons = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        skip = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif skip is not None and skip.get("type") != "pytest.xfail":
            skipped += 1
            reasons[pytest_skip_reason(case, skip)] += 1
        else:
            passed += 1
    return Counts(passed, failed, skipped, [(n, r) for r, n in reasons.items()])


class Run:
    """The totals of a run, the skip notes and failing suites, the tiers' times."""

    def __init__(self, results, ci, scratch=None):
        self.results, self.ci, self.scratch = results, ci, scratch
        self.passed = self.failed = self.skipped = 0
        self.notes, self.failing, self.times = [], [], []

    def tmpdir(self):
        """The environment that sends a suite's temporary files to the
        run's scratch folder (TensorFlow's autograph sources, Open MPI's
        session folders): a rank that a test kills on purpose cannot remove
        its own. Not for the Slurm tests, whose daemons on simulated hosts
        fail with a TMPDIR of their own."""
        return {"TMPDIR": self.scratch}

    def add(self, name, counts, kind):
        """Adds one suite's counts; in CI, skips outside ENVIRONMENT_SKIPS
        (every ctest skip) fail."""
        refused = 0
        for n, reason in counts.skips:
            if self.ci and (kind == "ctest" or not ENVIRONMENT_SKIPS.search(reason)):
                refused += n
                self.notes.append(f"{name}: {n} x {reason}: a failure in CI")
            else:
                self.notes.append(f"{name}: {n} x {reason}")
        self.passed += counts.passed
        self.failed += counts.failed + refused
        self.skipped += counts.skipped - refused
        if counts.failed + refused:
            self.failing.append(name)

    def fail(self, name, why):
        print(f"tarantella: {name}: {why}", file=sys.stderr)
        self.add(name, Counts(0, 1, 0, []), "")

    def suite(self, name, kind, cmd, env=None, cwd=ROOT):
        """Runs one ctest or pytest command writing JUnit XML; adds its counts."""
        xml = os.path.join(self.results, f"{name}.xml")
        if os.path.exists(xml):
            os.remove(xml)
        cmd = cmd + (["--output-junit", xml] if kind == "ctest" else [f"--junitxml={xml}"])
        rc = subprocess.run(cmd, env=dict(os.environ, **(env or {})), cwd=cwd).returncode
        try:
            counts = (ctest_counts if kind == "ctest" else pytest_counts)(xml)
        except (OSError, ET.ParseError) as e:
            return self.fail(name, f"no test results ({e})")
        if counts.passed + counts.failed + counts.skipped == 0:
            return self.fail(name, "ran no tests")
        if counts.failed == 0 and rc != 0 and not (kind == "pytest" and rc == 5):
            counts = counts._replace(failed=1)  # 5: every module skipped, none collected
            print(f"tarantella: {name} exited with {rc}", file=sys.stderr)
        self.add(name, counts, kind)

    def summarize(self):
        if self.notes:
            print("skipped:\n" + "".join(f"  {note}\n" for note in self.notes), end="")
        if self.failing:
            print(f"failing suites: {' '.join(self.failing)}")
        print("time: " + ", ".join(f"{tier} {int(s) // 60}m{int(s) % 60:02d}s"
                                   for tier, s in self.times))
        print(f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped")
        return self.failed == 0


def ctest(run, name, build, *args, env=None):
    print(f"=== {name} ===", flush=True)
    run.suite(name, "ctest", ["ctest", "--test-dir", build, "--output-on-failure", *args], env)


def pytest(run, name, *args, env=None):
    print(f"=== {name} ===", flush=True)
    run.suite(name, "pytest", [PYTHON, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                               f"--basetemp={os.path.join(run.scratch, name)}", *args],
              dict(env or {}, TF_CPP_MIN_LOG_LEVEL="2"))


def configure(build, *options, targets=()):
    """Configures and builds a tree of its own; whether that worked."""
    ok = subprocess.run(["cmake", "-S", ROOT, "-B", build, *options],
                        stdout=subprocess.DEVNULL).returncode == 0
    return ok and subprocess.run(["cmake", "--build", build, "-j", JOBS, *targets],
                                 stdout=subprocess.DEVNULL).returncode == 0


def tier_check(run, build):
    ctest(run, "unit", build, "-L", "unit|threads")
    staged = os.path.abspath(os.path.join(build, "python"))  # tests change directory
    pytest(run, "python-unit", "-m", "not ranks and not long", "tests/python",
           env={"PYTHONPATH": os.pathsep.join(filter(None, [staged,
                                                            os.environ.get("PYTHONPATH")]))})


def tier_mpi(run, build):
    # Two at a time, but for the programs marked RUN_SERIAL (tests/CMakeLists.txt).
    ctest(run, "mpi", build, "-L", "mpi|sim", "-j", "2")


def tier_sanitizers(run, build):
    # Open MPI keeps memory until exit on purpose; leak reports would be noise.
    if configure("build-asan", "-DCMAKE_BUILD_TYPE=Debug", "-DTNT_SANITIZE=address,undefined"):
        # The algorithms run at 1 to 8 ranks in the threaded test; the MPI
        # programs add the MPI transport and the public calls, which 2 and 3
        # ranks exercise (the mpi tier runs them at 1 to 4).
        ctest(run, "asan+ubsan", "build-asan", "-j", "2",
              "-E", "^test_(collectives|fusion|progress_cpu)_mpi_np[14]$",
              env={"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
                   "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"})
    else:
        run.fail("asan+ubsan build", "the sanitizer build failed")
    if configure("build-tsan", "-DCMAKE_BUILD_TYPE=Debug", "-DTNT_SANITIZE=thread"):
        ctest(run, "tsan", "build-tsan", "-R", "threads", env={"TSAN_OPTIONS": "halt_on_error=1"})
    else:
        run.fail("tsan build", "the ThreadSanitizer build failed")


def tier_launcher(run, build):
    # The end-to-end tests (dry runs, bad input, real runs, a rank killed
    # mid-training, a simulated two-host cluster), then each libFuzzer target
    # for a bounded time (a finding is a failure), then the bad-input matrix:
    # launcher, hostfile, environment and Python API cases, each in a
    # subprocess with a deadline.
    launcher = {"TNT_LAUNCHER": os.path.abspath(os.path.join(build, "src/launcher/tarantella"))}
    # The Slurm tests keep the system's TMPDIR (run.tmpdir says why).
    pytest(run, "launcher", "tests/launcher", "--ignore=tests/launcher/test_slurm.py",
           env=dict(launcher, **run.tmpdir()))
    pytest(run, "slurm", "tests/launcher/test_slurm.py", env=launcher)
    if configure("build-fuzz", "-DCMAKE_BUILD_TYPE=Debug", "-DTNT_BUILD_TESTS=OFF",
                 "-DTNT_BUILD_FUZZERS=ON", "-DCMAKE_C_COMPILER=clang",
                 targets=["--target", "fuzz_options", "fuzz_hostfile"]):
        for target in ("options", "hostfile"):
            # 10 s reach the code that 30 s reach (options: 430 of 435 edges,
            # hostfile: 114 of 114, at 50-70k runs a second on 2 cores);
            # TNT_FUZZ_SECONDS=600 for a real search.
            fuzz(run, target, os.environ.get("TNT_FUZZ_SECONDS", "10"))
    else:
        run.fail("fuzz build", "the fuzz targets did not build (they need clang and "
                 "libclang-rt-14-dev)")
    pytest(run, "reliability", "tests/reliability", env=dict(launcher, **run.tmpdir()))


def fuzz(run, target, seconds):
    """Runs one libFuzzer target for `seconds`; a finding is a failure."""
    work = tempfile.mkdtemp(prefix=f"tnt-fuzz-{target}-")
    # New inputs go to a scratch corpus; the committed seeds stay as they are.
    proc = subprocess.run([f"build-fuzz/fuzz/fuzz_{target}", f"-max_total_time={seconds}",
                           f"-artifact_prefix={work}/", work, f"fuzz/corpus/{target}"],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0:
        done = [line for line in proc.stderr.splitlines() if re.match(r"#\d+.*DONE", line)]
        print(f"fuzz_{target}: {done[-1] if done else 'done'}")
        run.add(f"fuzz_{target}", Counts(1, 0, 0, []), "")
        shutil.rmtree(work)
    else:
        print("\n".join(proc.stderr.splitlines()[-40:]))
        run.fail(f"fuzz_{target}", f"found a problem; the input is in {work}")


def tier_python(run, build):
    # The Python tests that start ranks; then a wheel built from this tree,
    # installed with pip into a fresh virtual environment: the package,
    # libtnt, the launcher in its bin/, the quick start on 2 ranks.
    pytest(run, "python", "-m", "ranks and not long", "tests/python", env=run.tmpdir())
    print("(the tests marked long are left out: make test-long runs them)")
    pytest(run, "packaging", "tests/packaging", env=run.tmpdir())


def tier_long(run, build):
    pytest(run, "python-long", "-m", "long", "tests/python", env=run.tmpdir())


TIERS = {"check": tier_check, "mpi": tier_mpi, "sanitizers": tier_sanitizers,
         "launcher": tier_launcher, "python": tier_python, "long": tier_long}


def self_test():
    """Checks the counting on JUnit files as ctest and pytest write them."""
    ctest_xml = """<testsuite tests="6">
      <testcase name="ok" status="run"/>
      <testcase name="bad" status="fail"><failure message=""/></testcase>
      <testcase name="skipme" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/></testcase>
      <testcase name="dis" status="disabled"/>
      <testcase name="missing" status="notrun"><skipped message="Unable to find executable"/>
      </testcase>
      <testcase name="req" status="notrun"><skipped message="Required Files Missing"/></testcase>
    </testsuite>"""
    pytest_xml = """<testsuites><testsuite tests="8">
      <testcase classname="" name="tests/python/test_b"><skipped message="collection skipped"
        >('/x/tests/python/test_b.py', 2, "Skipped: could not import 'xyz'")</skipped></testcase>
      <testcase classname="tests.launcher.test_run" name="test_ok"/>
      <testcase classname="tests.launcher.test_run" name="test_bad"><failure message="x"/>
      </testcase>
      <testcase classname="tests.launcher.test_run" name="test_numa"><skipped
        type="pytest.skip" message="this kernel shows no NUMA nodes"/></testcase>
      <testcase classname="tests.launcher.test_run" name="test_numa2"><skipped
        type="pytest.skip" message="this kernel shows no NUMA nodes"/></testcase>
      <testcase classname="tests.launcher.test_run" name="test_xf"><skipped
        type="pytest.xfail" message="x"/></testcase>
      <testcase classname="tests.launcher.test_run" name="test_err"><error message="setup"/>
      </testcase>
      <testcase classname="tests.launcher.test_run" name="test_both"><failure message="x"/>
        <error message="teardown"/></testcase>
    </testsuite></testsuites>"""
    errors = []

    def expect(what, got, want):
        if got != want:
            errors.append(f"self-test: {what}: got {got!r}, want {want!r}")

    with tempfile.TemporaryDirectory() as d:
        for name, text in (("ctest", ctest_xml), ("pytest", pytest_xml)):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        c = ctest_counts(os.path.join(d, "ctest"))
        expect("ctest counts", c[:3], (1, 3, 2))
        expect("ctest skips", c.skips, [(1, "skipme (skipped)"), (1, "dis (disabled)")])
        p = pytest_counts(os.path.join(d, "pytest"))
        expect("pytest counts", p[:3], (2, 3, 3))
        expect("pytest skips", p.skips,
               [(1, "could not import 'xyz' (tests/python/test_b)"),
                (2, "this kernel shows no NUMA nodes (tests.launcher.test_run)")])
        for ci, python_want, ctest_want in ((True, (2, 4, 2), (5, 0)), (False, (2, 3, 3), (3, 2))):
            run = Run(d, ci)
            run.add("python", p, "pytest")
            expect(f"pytest skips, CI={ci}", (run.passed, run.failed, run.skipped), python_want)
            run = Run(d, ci)
            run.add("release", c, "ctest")
            expect(f"ctest skips, CI={ci}", (run.failed, run.skipped), ctest_want)
    for error in errors:
        print(error, file=sys.stderr)
    return not errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build", help="the release build tree (build)")
    parser.add_argument("--self-test", action="store_true", help="check the counting, run nothing")
    parser.add_argument("tiers", nargs="*", metavar="TIER",
                        help=f"any of {', '.join(TIERS)}; none: all but long")
    args = parser.parse_args()
    unknown = [t for t in args.tiers if t not in TIERS]
    if unknown:
        parser.error(f"no tier {', '.join(unknown)}: the tiers are {', '.join(TIERS)}")
    if not self_test():
        return 1
    if args.self_test:
        print("self-test: the counting is right")
        return 0
    os.chdir(ROOT)
    # Absolute: ctest takes a relative --output-junit from its test directory.
    results = os.path.abspath(os.path.join(args.build, "test-results"))
    os.makedirs(results, exist_ok=True)
    # The tests' temporary files go to one folder, removed when every suite
    # passed and named when one failed.
    run = Run(results, in_ci(), tempfile.mkdtemp(prefix="tnt-tests-"))
    for tier in args.tiers or [t for t in TIERS if t != "long"]:
        start = time.monotonic()
        TIERS[tier](run, args.build)
        run.times.append((tier, time.monotonic() - start))
    if run.failed:
        print(f"the tests' temporary files: {run.scratch}")
    else:
        shutil.rmtree(run.scratch, ignore_errors=True)
    return 0 if run.summarize() else 1


if __name__ == "__main__":
    sys.exit(main())
