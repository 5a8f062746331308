"""Helpers of the launcher tests: finding the launcher, running it with a
deadline, looking for processes left behind, and the simulated cluster
(tests/launcher/sim_cluster.sh)."""
import contextlib
import glob
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QUICK_START = os.path.join(ROOT, "examples", "quick_start.py")
SIM = os.path.join(HERE, "sim_cluster.sh")


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
    # TMPDIR: tests/run_all.py's folder for the run's temporary files.
    for name in ("PYENV_VERSION", "PYENV_ROOT", "LANG", "TMPDIR"):
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


def assert_nothing_left(marker, timeout=10):
    left = wait_for(lambda: not processes_with(marker), timeout)
    assert left, f"processes left behind: {processes_with(marker)}"


def wait_until_running(run_dir, nranks, timeout=60):
    ok = wait_for(lambda: all((read_status(run_dir, r) or {}).get("pid", "0") != "0"
                              for r in range(nranks)), timeout)
    assert ok, f"the ranks did not start within {timeout} s"


def kill_leftovers(marker):
    """Cleans up after a failed test, so one failure does not spoil the rest."""
    for pid, _ in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cluster_skip_reason():
    """Why the simulated cluster cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the simulated cluster needs root (network namespaces)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the simulated cluster needs {tool}"
    probe = f"tnt-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create network namespaces here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def free_octet():
    """A 169.254.X.0/24 network that no interface of this machine uses."""
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        octet = random.randint(16, 250)
        if f"169.254.{octet}." not in used:
            return octet
    pytest.skip("no free link-local network for the simulated cluster")


@contextlib.contextmanager
def sim_cluster(prefix, names):
    """Simulated hosts named PREFIX-ID-NAME, for NAME in names; yields (hosts,
    network, the address of this machine on it). Every process left in a
    host is killed and the hosts are removed at the end, whatever happens."""
    sim_id = uuid.uuid4().hex[:6]
    hosts = [f"{prefix}-{sim_id}-{name}" for name in names]
    octet = free_octet()
    up = subprocess.run([SIM, "up", sim_id, str(octet)] + hosts, capture_output=True, text=True)
    try:
        assert up.returncode == 0, f"cannot create the simulated cluster:\n{up.stderr}"
        yield hosts, f"169.254.{octet}.0/24", f"169.254.{octet}.1"
    finally:
        for host in hosts:
            pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        subprocess.run([SIM, "down", sim_id] + hosts, capture_output=True)
        # Open MPI's session folders of the processes killed above.
        for host in hosts:
            for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"ompi.{host}.*")):
                shutil.rmtree(folder, ignore_errors=True)


def cluster_env(net, **extra):
    """The launcher's environment on a simulated cluster whose network is
    `net`: Open MPI starts its daemon on each host through the agent, as it
    would through ssh, and talks to the hosts over their network only."""
    return base_env(OMPI_MCA_plm_rsh_agent=f"{SIM} agent", OMPI_MCA_plm_rsh_no_tree_spawn="1",
                    OMPI_MCA_oob_tcp_if_include=net, OMPI_MCA_btl_tcp_if_include=net,
                    OMPI_MCA_btl="self,vader,tcp", TF_CPP_MIN_LOG_LEVEL="3", **extra)


def write_hostfile(directory, hosts):
    """A hostfile in `directory` naming `hosts`, one per line; its path."""
    path = os.path.join(directory, "hostfile")
    with open(path, "w") as f:
        f.write("\n".join(hosts) + "\n")
    return path
