"""Shared helpers of the Python tests: launching programs on several ranks.

A test that starts ranks (through mpirun_command, or mpirun or the launcher
directly) is marked `ranks`, per module (`pytestmark = pytest.mark.ranks`)
or per test; `make check` runs the others (-m "not ranks"), `make
test-python` these. mpirun_command fails a test that starts ranks without
the mark, so that a forgotten mark shows in `make check`."""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_module(path):
    """The Python module at `path` under the source tree (a helper of tools/
    that no package installs)."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# The test being run (for require_ranks_mark) and the folder of the run
# directories, under pytest's temporary directory: removed at the end of a
# session in which every test passed (tmp_path_retention_policy in
# pyproject.toml), kept with the logs otherwise.
_current_test = None
_run_dirs = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    global _current_test
    _current_test = item
    yield
    _current_test = None


@pytest.fixture(scope="session", autouse=True)
def _run_dir_root(tmp_path_factory):
    global _run_dirs
    _run_dirs = tmp_path_factory.mktemp("tnt-run")


def require_ranks_mark():
    """Fails the running test unless it is marked `ranks`."""
    if _current_test is not None and _current_test.get_closest_marker("ranks") is None:
        pytest.fail(f"{_current_test.nodeid} starts ranks: mark it `ranks` "
                    "(tests/python/conftest.py)")


def mpirun_command(nranks, *argv):
    """Runs argv on `nranks` CPU ranks with Tarantella's own launcher, every
    rank's output shown, logs in a fresh run directory."""
    require_ranks_mark()
    launcher = shutil.which("tarantella")
    if launcher is None:
        pytest.fail("the tarantella launcher is not on PATH: run `make install` first")
    run_dir = tempfile.mkdtemp(prefix="run-", dir=_run_dirs)
    return [launcher, "--no-gpu", "-n", str(nranks), "--output-on-all-devices",
            "--run-dir", run_dir, "--"] + list(argv)


def run(cmd, timeout=600, env=None):
    """Runs cmd; fails the test with its output when it fails or hangs."""
    full_env = dict(os.environ)
    full_env.setdefault("TNT_TIMEOUT_S", "60")
    full_env.update(env or {})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s:\n{e.stdout}\n{e.stderr}")
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited with {proc.returncode}:\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


@pytest.fixture
def python():
    return sys.executable
