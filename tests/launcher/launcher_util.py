"""Helpers of the launcher tests: finding the launcher, running it with a
deadline, and looking for processes left behind."""
import os
import shutil
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICK_START = os.path.join(ROOT, "examples", "quick_start.py")


def launcher_path():
    """The launcher under test: $TNT_LAUNCHER, the build tree's, or PATH's."""
    path = os.environ.get("TNT_LAUNCHER")
    if path:
        return os.path.abspath(path)
    built = os.path.join(ROOT, "build", "src", "launcher", "tarantella")
    if os.path.exists(built):
        return built
    return shutil.which("tarantella")


def base_env(**extra):
    """A small, known environment, so that dry runs print the same every time."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "TF_CPP_MIN_LOG_LEVEL": "2", "TNT_TIMEOUT_S": "30"}
    for name in ("PYENV_VERSION", "PYENV_ROOT", "LANG"):
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra)
    return env


def run_launcher(args, env=None, timeout=60, cwd=None):
    """Runs the launcher to completion; a hang fails the test instead of the suite."""
    try:
        return subprocess.run([launcher_path()] + list(args), env=env or base_env(), cwd=cwd,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"tarantella {' '.join(args)} hung for {timeout} s:\n"
                             f"{e.stdout}\n{e.stderr}") from None


def start_launcher(args, env=None, cwd=None):
    """Starts the launcher in the background, in a session of its own so that
    the test can signal it like a terminal would."""
    return subprocess.Popen([launcher_path()] + list(args), env=env or base_env(), cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def processes_with(marker):
    """Pids (other than ours) whose command line contains marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append((int(pid), cmdline.strip()))
    return found


def wait_for(predicate, timeout, interval=0.2):
    """Polls predicate until it returns something true or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def read_status(run_dir, rank):
    """The key=value status file the wrapper of a rank writes, as a dict."""
    try:
        with open(os.path.join(run_dir, f"rank{rank}.status")) as f:
            return dict(line.split("=", 1) for line in f.read().split("\n") if "=" in line)
    except OSError:
        return None


def kill_leftovers(marker):
    """Cleans up after a failed test, so one failure does not spoil the rest."""
    for pid, _ in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
