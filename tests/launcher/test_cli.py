"""The launcher's command line: --dry-run output over the option
combinations. Nothing here starts a rank, so every test takes well under a
second. Bad input (a clear message and exit 2) is in the matrix of
tests/reliability/test_bad_input.py."""
import os
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

from launcher_util import base_env, run_launcher

PY = sys.executable


def dry(args, env=None, **kw):
    """Runs a dry run; returns (command words, exported variables, stdout, stderr)."""
    proc = run_launcher(["--dry-run"] + args, env=env, **kw)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    exports = {}
    for line in lines[:-1]:
        assert line.startswith("export "), line
        name, value = shlex.split(line[len("export "):])[0].split("=", 1)
        exports[name] = value
    return shlex.split(lines[-1]), exports, proc.stdout, proc.stderr


def rank_part(words):
    """The words from the rank wrapper on."""
    return words[next(i for i, w in enumerate(words) if w == "--rank-exec") - 1:]


@pytest.fixture
def prog(script):
    return script("print('hello')\n")


# ---------------------------------------------------------------- dry runs

def test_default_is_one_cpu_rank_with_a_warning(launcher, prog):
    words, exports, out, err = dry(["--", prog, "--epochs", "2"])
    assert words[0] == shutil.which("mpirun")
    assert words[words.index("-np") + 1] == "1"
    assert "--host" not in words
    assert "--oversubscribe" not in words
    assert words[words.index("--bind-to") + 1] == "none"
    if os.geteuid() == 0:
        assert "--allow-run-as-root" in words
    assert rank_part(words)[-3:] == [prog, "--epochs", "2"]
    assert "--cpu" in words
    assert "warning: no GPU found" in err
    assert "# 1 rank on this host, on the CPU" in out
    # Every exported variable is named with -x, so that it reaches remote hosts.
    for name in exports:
        assert words[words.index(name) - 1] == "-x"
    assert exports["PATH"] == os.environ["PATH"]
    assert exports["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert "HOME" not in exports


def test_python_script_runs_with_the_python_that_has_tarantella(launcher, prog):
    words, *_ = dry(["--", prog])
    tail = rank_part(words)
    interpreter = tail[tail.index("--") + 1]
    assert os.path.realpath(interpreter) == os.path.realpath(sys.executable)


def test_python_interpreter_option(launcher, prog, script):
    words, *_ = dry(["--python-interpreter", PY, "--", prog])
    assert rank_part(words)[-2:] == [PY, prog]
    # A script without .py is still Python when its #! line says so.
    shebang = script("#!/usr/bin/env python3\nprint(1)\n", name="tool")
    os.chmod(shebang, 0o755)
    words, *_ = dry(["--python-interpreter", PY, "--", shebang, "x"])
    assert rank_part(words)[-3:] == [PY, shebang, "x"]


def test_executable_program_runs_as_it_is(launcher):
    words, *_ = dry(["--no-gpu", "--", "hostname", "-s"])
    assert rank_part(words)[-3:] == ["--", shutil.which("hostname"), "-s"]
    words, *_ = dry(["--no-gpu", "--", "/bin/echo", "a b"])
    assert rank_part(words)[-3:] == ["--", "/bin/echo", "a b"]


def test_no_gpu_gives_no_warning(launcher, prog):
    _, _, _, err = dry(["--no-gpu", "--", prog])
    assert "warning" not in err


def test_more_ranks_than_cores_oversubscribe(launcher, prog):
    n = os.cpu_count() + 2
    words, _, out, err = dry(["-n", str(n), "--", prog])
    assert words[words.index("-np") + 1] == str(n)
    assert "--oversubscribe" in words
    # No GPUs at all: -n gives CPU ranks without a warning.
    assert "warning" not in err
    assert f"# {n} ranks on this host, on the CPU" in out
    words, *_ = dry(["-np", "1", "--", prog])
    assert "--oversubscribe" not in words


def test_gpus_one_per_rank(launcher, prog, fake_sys):
    env = base_env(TNT_SYS_ROOT=fake_sys(gpus=2))
    words, _, out, err = dry(["--", prog], env=env)
    assert words[words.index("-np") + 1] == "2"
    assert words[words.index("--gpus") + 1] == "0,1"
    assert "warning" not in err
    assert "on GPUs 0,1" in out
    words, _, _, err = dry(["-n", "1", "--", prog], env=env)
    assert words[words.index("--gpus") + 1] == "0,1"


def test_more_ranks_than_gpus_warns_and_uses_cpus(launcher, prog, fake_sys):
    env = base_env(TNT_SYS_ROOT=fake_sys(gpus=2))
    words, _, _, err = dry(["-n", "3", "--", prog], env=env)
    assert "--cpu" in words and "--gpus" not in words
    assert "warning: 3 ranks on this host but only 2 GPU(s)" in err
    words, _, _, err = dry(["--no-gpu", "-n", "3", "--", prog], env=env)
    assert "--cpu" in words and "warning" not in err


def test_cuda_visible_devices_is_honoured(launcher, prog, fake_sys):
    env = base_env(TNT_SYS_ROOT=fake_sys(gpus=4), CUDA_VISIBLE_DEVICES="3,1")
    words, *_ = dry(["--", prog], env=env)
    assert words[words.index("-np") + 1] == "2"
    assert words[words.index("--gpus") + 1] == "3,1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    words, _, _, err = dry(["--", prog], env=env)
    assert "--cpu" in words and "no GPU found" in err


def test_hostfile(launcher, prog, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nnode-a\n\nnode-b   # the second\n")
    words, _, out, err = dry(["--hostfile", str(hosts), "--", prog])
    assert words[words.index("--host") + 1] == "node-a:1,node-b:1"
    assert words[words.index("-np") + 1] == "2"
    assert "warning: no GPU found: starting 1 CPU rank per host" in err
    words, _, out, _ = dry(["--hostfile", str(hosts), "--n-per-node", "2", "--no-gpu",
                            "--", prog])
    assert words[words.index("--host") + 1] == "node-a:2,node-b:2"
    assert words[words.index("-np") + 1] == "4"
    assert "# 4 ranks on 2 hosts (2 per host), on the CPU" in out
    for alias in ("--npernode=3", "--devices-per-node=3"):
        words, *_ = dry(["--hostfile", str(hosts), alias, "--", prog])
        assert words[words.index("--host") + 1] == "node-a:3,node-b:3"
    words, *_ = dry(["--hostfile", str(hosts), "-n", "4", "--", prog])
    assert words[words.index("--host") + 1] == "node-a:2,node-b:2"


def test_hostfile_with_gpus(launcher, prog, tmp_path, fake_sys):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    env = base_env(TNT_SYS_ROOT=fake_sys(gpus=4))
    words, *_ = dry(["--hostfile", str(hosts), "--", prog], env=env)
    assert words[words.index("--host") + 1] == "a:4,b:4"
    assert words[words.index("--gpus") + 1] == "0,1,2,3"


def test_local_host_works_as_a_name(launcher, prog, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{socket.gethostname()}\n")
    words, _, out, _ = dry(["--hostfile", str(hosts), "--n-per-node", "2", "--", prog])
    assert words[words.index("--host") + 1] == f"{socket.gethostname()}:2"
    hosts.write_text("localhost\n")
    words, *_ = dry(["--hostfile", str(hosts), "--", prog])
    assert words[words.index("--host") + 1] == "localhost:1"


# ------------------------------------------------------ Slurm allocations
# The variables as Slurm sets them in an `salloc` shell or an `sbatch`
# script; test_slurm.py runs the launcher inside a real allocation.

def slurm_env(**extra):
    env = base_env(SLURM_JOB_ID="42", SLURM_JOB_NODELIST="node[01-02],gpu5",
                   SLURM_NODELIST="node[01-02],gpu5", SLURM_TASKS_PER_NODE="2(x3)")
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_allocation_gives_hosts_and_ranks_per_node(launcher, prog):
    words, _, out, err = dry(["--", prog], env=slurm_env())
    assert words[words.index("--host") + 1] == "node01:2,node02:2,gpu5:2"
    assert words[words.index("-np") + 1] == "6"
    assert ("--oversubscribe" in words) == (os.cpu_count() < 2)
    assert "# 6 ranks on 3 hosts (2 per host), on the CPU" in out
    assert ("# hosts from the Slurm allocation, job 42: SLURM_JOB_NODELIST=node[01-02],gpu5; "
            "2 rank(s) per node from SLURM_TASKS_PER_NODE=2(x3)\n") in out
    assert "warning" not in err
    # What --ntasks-per-node asked for decides when Slurm tells it.
    words, _, out, _ = dry(["--", prog], env=slurm_env(SLURM_NTASKS_PER_NODE="1"))
    assert words[words.index("--host") + 1] == "node01:1,node02:1,gpu5:1"
    assert "1 rank(s) per node from SLURM_NTASKS_PER_NODE=1" in out
    # The options win over the allocation's tasks; more ranks on a node than
    # the allocation gives it need --oversubscribe, as Open MPI counts slots
    # from the allocation.
    words, _, out, _ = dry(["--n-per-node", "3", "--", prog], env=slurm_env())
    assert words[words.index("--host") + 1] == "node01:3,node02:3,gpu5:3"
    assert "--oversubscribe" in words
    assert "# hosts from the Slurm allocation, job 42: SLURM_JOB_NODELIST=node[01-02],gpu5\n" in out
    words, *_ = dry(["-n", "3", "--", prog], env=slurm_env())
    assert words[words.index("--host") + 1] == "node01:1,node02:1,gpu5:1"
    proc = run_launcher(["--dry-run", "-n", "4", "--", prog], env=slurm_env())
    assert proc.returncode == 2
    assert ("-n 4 does not split evenly over the 3 hosts of the Slurm allocation; give a "
            "multiple of 3, or --n-per-node") in proc.stderr
    # Uneven tasks are fine when the options give the ranks per node.
    words, *_ = dry(["--n-per-node", "1", "--", prog], env=slurm_env(SLURM_TASKS_PER_NODE="2,1,2"))
    assert words[words.index("--host") + 1] == "node01:1,node02:1,gpu5:1"
    assert "--oversubscribe" not in words
    # The older name of the node list; a single node is still the
    # allocation's (the launcher may run on a login node outside it).
    words, _, out, _ = dry(["--", prog], env=slurm_env(SLURM_JOB_NODELIST=None,
                                                       SLURM_NODELIST="cn7",
                                                       SLURM_TASKS_PER_NODE="4"))
    assert words[words.index("--host") + 1] == "cn7:4"
    assert "# 4 ranks on cn7, on the CPU" in out
    assert "SLURM_NODELIST=cn7; 4 rank(s) per node from SLURM_TASKS_PER_NODE=4" in out


def test_slurm_allocation_of_many_nodes(launcher, prog):
    """A node list longer than the log line holds (1023 characters): the line is cut."""
    nodes = ",".join(f"node{i}" for i in range(400))
    words, _, out, _ = dry(["--", prog], env=slurm_env(SLURM_JOB_NODELIST=nodes,
                                                       SLURM_TASKS_PER_NODE="1(x400)"))
    assert words[words.index("-np") + 1] == "400"
    assert words[words.index("--host") + 1] == ",".join(f"node{i}:1" for i in range(400))
    assert "# 400 ranks on 400 hosts (1 per host), on the CPU" in out
    line = next(x for x in out.splitlines() if x.startswith("# hosts from the Slurm allocation"))
    assert len(line) == len("# hosts from ") + 1023
    assert nodes.startswith(line.split("SLURM_JOB_NODELIST=")[1])


def test_hostfile_wins_over_slurm(launcher, prog, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    # Not even read: a broken allocation does not matter.
    env = slurm_env(SLURM_JOB_NODELIST="node[1-", SLURM_TASKS_PER_NODE="x")
    words, _, out, _ = dry(["--hostfile", str(hosts), "--", prog], env=env)
    assert words[words.index("--host") + 1] == "a:1,b:1"
    assert (f"# hosts from the hostfile {hosts} (not the nodes of the Slurm allocation: "
            "--hostfile wins)") in out


@pytest.mark.parametrize("env, message", [
    ({"SLURM_JOB_NODELIST": "node[1-3"},
     "SLURM_JOB_NODELIST=node[1-3: 'node[1-3': '[' without its ']' (inside a Slurm allocation "
     "tarantella runs on its nodes; give --hostfile to choose the hosts yourself)"),
    ({"SLURM_JOB_NODELIST": "n[3-1]"}, "'n[3-1]': the range 3-1 runs backwards"),
    ({"SLURM_JOB_NODELIST": "n[1-2],n2"}, "host 'n2' is listed twice"),
    ({"SLURM_TASKS_PER_NODE": "2(x"}, "SLURM_TASKS_PER_NODE=2(x: '2(x' is not a task count"),
    ({"SLURM_TASKS_PER_NODE": "2(x2)"},
     "SLURM_TASKS_PER_NODE=2(x2) gives the tasks of 2 node(s), but "
     "SLURM_JOB_NODELIST=node[01-02],gpu5 names 3"),
    ({"SLURM_TASKS_PER_NODE": "2(x2),1"},
     "the nodes of the Slurm allocation hold different numbers of tasks "
     "(SLURM_TASKS_PER_NODE=2(x2),1), but tarantella places the same number of ranks on every "
     "node: give it with --n-per-node, or allocate with --ntasks-per-node"),
    ({"SLURM_TASKS_PER_NODE": None},
     "SLURM_JOB_NODELIST is set but neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE is: "
     "give the ranks per node with --n-per-node"),
    ({"SLURM_NTASKS_PER_NODE": "2,2"}, "SLURM_NTASKS_PER_NODE=2,2: expected one number"),
    ({"SLURM_NTASKS_PER_NODE": "0"}, "SLURM_NTASKS_PER_NODE=0: '0' is not a task count"),
    ({"SLURM_STEP_ID": "0"}, "tarantella runs in a Slurm job step (SLURM_STEP_ID=0: under srun)"),
], ids=["unclosed", "backwards", "twice", "tasks", "tasks-count", "uneven", "no-tasks",
        "ntasks-list", "ntasks-zero", "step"])
def test_slurm_variables_that_cannot_work(launcher, prog, env, message):
    proc = run_launcher(["--", prog], env=slurm_env(**env))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("tarantella: error: ") and message in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_logging_output_and_fusion_options(launcher, prog):
    words, exports, _, _ = dry(["--log-level", "debug", "--log-on-all-devices",
                                "--output-on-all-devices", "--fusion-threshold", "64",
                                "--", prog])
    assert exports["TNT_LOG_LEVEL"] == "debug"  # as given; every rank reads it as DEBUG
    assert exports["TNT_LOG_ON_ALL_DEVICES"] == "true"
    assert exports["TNT_OUTPUT_ON_ALL_DEVICES"] == "true"
    assert exports["TNT_FUSION_THRESHOLD_KB"] == "64"
    for name in ("TNT_LOG_LEVEL", "TNT_LOG_ON_ALL_DEVICES", "TNT_OUTPUT_ON_ALL_DEVICES",
                 "TNT_FUSION_THRESHOLD_KB"):
        assert words[words.index(name) - 1] == "-x"
    assert "--output-on-all-devices" in rank_part(words)
    _, exports, _, _ = dry(["--fusion-threshold=0.5", "--", prog])
    assert exports["TNT_FUSION_THRESHOLD_KB"] == "0.5"
    assert "TNT_LOG_LEVEL" not in exports


def test_x_variables(launcher, prog):
    env = base_env(MY_SETTING="from here", TNT_LOG_LEVEL="ERROR")
    words, exports, out, _ = dry(["-x", "A=1", "-xB=two words", "-x", "MY_SETTING",
                                  "-x", "TNT_LOG_LEVEL=INFO", "--log-level", "WARNING",
                                  "--", prog], env=env)
    assert exports["A"] == "1"
    assert exports["B"] == "two words"
    assert exports["MY_SETTING"] == "from here"
    # -x wins over the options, which win over the environment.
    assert exports["TNT_LOG_LEVEL"] == "INFO"
    assert "export B='two words'" in out
    for name in ("A", "B", "MY_SETTING"):
        assert words[words.index(name) - 1] == "-x"


def test_several_assignments_after_one_x(launcher, prog):
    """The original's documented form: several NAME=VALUE after one -x."""
    words, exports, _, _ = dry(["-x", "DATASET=/scratch/data", "TF_CPP_MIN_LOG_LEVEL=1",
                                "--", prog], env=base_env())
    assert exports["DATASET"] == "/scratch/data"
    assert exports["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert words[words.index(prog):] == [prog]


def test_pinning(launcher, prog, fake_sys):
    env = base_env(TNT_SYS_ROOT=fake_sys(numa_nodes=2))
    words, *_ = dry(["--pin-to-socket", "-n", "2", "--", prog], env=env)
    assert "--pin-to-socket" in rank_part(words)
    words, *_ = dry(["--pin-memory-to-socket", "-n", "2", "--", prog], env=env)
    assert {"--pin-to-socket", "--pin-memory-to-socket"} <= set(rank_part(words))


def test_run_dir(launcher, prog, tmp_path):
    words, _, out, _ = dry(["--run-dir", "runs/a", "--", prog], cwd=str(tmp_path))
    assert words[words.index("--run-dir") + 1] == str(tmp_path / "runs" / "a")
    assert words[words.index("--wdir") + 1] == str(tmp_path)
    assert not (tmp_path / "runs").exists(), "a dry run creates nothing"
    env = base_env(TNT_RUN_DIR="/tmp/elsewhere")
    words, *_ = dry(["--", prog], env=env)
    assert words[words.index("--run-dir") + 1] == "/tmp/elsewhere"
    words, *_ = dry(["--", prog], cwd=str(tmp_path))
    default = words[words.index("--run-dir") + 1]
    assert os.path.dirname(default) == str(tmp_path)
    assert os.path.basename(default).startswith("tarantella-run-")


def test_mpich(launcher, prog, fake_mpich, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    env = base_env(TNT_MPIRUN=fake_mpich)
    words, exports, _, _ = dry(["--hostfile", str(hosts), "--n-per-node", "2",
                                "--log-level", "INFO", "--", prog], env=env)
    assert words[:7] == [fake_mpich, "-n", "4", "-hosts", "a:2,b:2", "-ppn", "2"]
    assert "--allow-run-as-root" not in words
    i = next(i for i, w in enumerate(words) if w == "TNT_LOG_LEVEL" and words[i - 1] == "-genv")
    assert words[i + 1] == "INFO"
    assert words[words.index("-wdir") + 1] == os.getcwd()


def test_not_root(launcher):
    """Only root needs Open MPI's --allow-run-as-root."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the launcher as another user")
    out = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                          launcher, "--dry-run", "--no-gpu", "--run-dir", "/tmp/x", "--",
                          "/bin/echo"], env=base_env(), capture_output=True, text=True,
                         timeout=60, cwd="/", stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "--allow-run-as-root" not in out.stdout
    assert "-np 1 --bind-to none" in out.stdout


def test_dry_run_script_runs(launcher, tmp_path):
    """The printed script is exactly what a run executes: running it works."""
    proc = run_launcher(["--dry-run", "-n", "2", "--run-dir", str(tmp_path / "run"), "--",
                         "/bin/echo", "from the script"])
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "run.sh"
    script.write_text(proc.stdout)
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "from the script"
    for r in range(2):
        assert (tmp_path / "run" / f"rank{r}.log").read_text() == "from the script\n"


def test_version_and_help(launcher):
    proc = run_launcher(["--version"])
    assert proc.returncode == 0 and proc.stdout.startswith("tarantella ")
    proc = run_launcher(["--help"])
    assert proc.returncode == 0
    for option in ("-n", "--hostfile", "--n-per-node", "--npernode", "--devices-per-node",
                   "--no-gpu", "--log-level", "--log-on-all-devices",
                   "--output-on-all-devices", "-x NAME=VALUE", "--fusion-threshold",
                   "--pin-to-socket", "--pin-memory-to-socket", "--python-interpreter",
                   "--dry-run", "--version", "--help", "--run-dir"):
        assert option in proc.stdout, option


# --------------------------------------------------------------- bad input
# Bad options, -x values, fusion thresholds, programs, hostfiles and tools:
# the cases of tests/reliability/test_bad_input.py (the launcher, hostfile,
# program and environment rows of its table).


# ---------------------------------------------------------------- settings

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "README.md")
SETTINGS_BEGIN = "<!-- settings table: generated by `tarantella --settings=markdown`"
SETTINGS_END = "<!-- end of settings table -->"


def settings_table():
    """The README's settings table as the launcher generates it."""
    proc = run_launcher(["--settings=markdown"], env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def readme_settings(text):
    start = text.index(SETTINGS_BEGIN)
    start = text.index("\n", start) + 1
    return start, text.index(SETTINGS_END, start)


def test_readme_settings_table_is_generated_from_the_registry(launcher):
    with open(README) as f:
        text = f.read()
    start, stop = readme_settings(text)
    assert text[start:stop] == settings_table(), (
        "README.md's settings table differs from the registry: run "
        "python3 tests/launcher/test_cli.py")


def test_settings_show_each_value_and_its_source(launcher):
    env = base_env(TNT_TIMEOUT_S="60", TNT_DATA_SHARE="0")
    proc = run_launcher(["--log-level", "debug", "-x", "TNT_OVERLAP=off", "--settings"], env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in proc.stdout.splitlines()}
    assert rows["TNT_TIMEOUT_S"] == ["60", "environment"]
    assert rows["TNT_DATA_SHARE"] == ["off", "environment"]
    assert rows["TNT_LOG_LEVEL"] == ["DEBUG", "command line"]
    assert rows["TNT_OVERLAP"] == ["off", "command line"]
    assert rows["TNT_COMPRESSION"] == ["none", "default"]
    assert rows["TNT_TIMELINE"] == ["(unset)", "default"]
    # One row per setting of the README's table.
    assert len(rows) == settings_table().count("\n| `TNT_")


def test_ranks_learn_which_settings_came_from_the_command_line(launcher, prog):
    _, exports, _, _ = dry(["--fusion-threshold", "64", "-x", "TNT_TIMEOUT_S=5", "-x", "A=1",
                            "--", prog])
    assert exports["TNT_COMMAND_LINE_SETTINGS"] == "TNT_FUSION_THRESHOLD_KB,TNT_TIMEOUT_S,A"


def test_a_bad_setting_stops_the_launcher_before_anything_starts(launcher, prog):
    proc = run_launcher(["--dry-run", "--", prog], env=base_env(TNT_OVERLAP="sometimes"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert ("TNT_OVERLAP=sometimes is not a value TNT_OVERLAP takes: use auto, on or off "
            "(default auto); fix or unset it") in proc.stderr


if __name__ == "__main__":
    # Rewrites the README's settings table from the registry.
    with open(README) as f:
        text = f.read()
    start, stop = readme_settings(text)
    with open(README, "w") as f:
        f.write(text[:start] + settings_table() + text[stop:])
    print(f"wrote the settings table into {README}")
