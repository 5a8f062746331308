"""Shared helpers of the Python tests: launching programs on several ranks."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mpirun_command(nranks, *argv):
    """Runs argv on `nranks` CPU ranks with Tarantella's own launcher, every
    rank's output shown, logs in a fresh run directory."""
    launcher = shutil.which("tarantella")
    if launcher is None:
        pytest.fail("the tarantella launcher is not on PATH: run `make install` first")
    run_dir = tempfile.mkdtemp(prefix="tnt-run-")
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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "long: left out of `make test` (run_all.sh), run by `make test-long`")


@pytest.fixture
def python():
    return sys.executable
