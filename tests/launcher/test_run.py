"""Real runs of the launcher on this host: output only from rank 0, a log
per rank, GPU visibility per rank, exit status and message of a failed
rank, interrupts, a rank killed in the middle of training, and no process
left behind in any of these cases."""
import os
import re
import signal
import socket
import sys
import time

import pytest

from launcher_util import (assert_nothing_left, base_env, read_status, run_launcher,
                           start_launcher, wait_for, wait_until_running)


def test_output_from_rank_0_and_a_log_per_rank(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = run_launcher(["-n", "3", "--run-dir", run_dir, "-x", "FOO=bar", "--log-level",
                         "INFO", "--", os.path.join(d, "rank_program.py")])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("rank ") == 2, proc.stdout  # the report line and "done"
    assert "rank 0 of 3: CUDA_VISIBLE_DEVICES='' FOO='bar' TNT_LOG_LEVEL='INFO'" in proc.stdout
    assert "rank 1" not in proc.stdout and "rank 2" not in proc.stdout
    # Library messages of every rank reach the terminal, other stderr only rank 0's.
    for r in range(3):
        assert f"[tnt {r}/3] WARNING: library message from rank {r}" in proc.stderr
    assert "plain stderr from rank 0" in proc.stderr
    assert "plain stderr from rank 1" not in proc.stderr
    assert f"logs in {run_dir}" in proc.stderr
    for r in range(3):
        log = open(os.path.join(run_dir, f"rank{r}.log")).read()
        assert f"rank {r} of 3" in log and f"plain stderr from rank {r}" in log
        assert f"rank {r} done" in log
        status = read_status(run_dir, r)
        assert status["finished"] == "1" and status["exit_code"] == "0"
        assert status["host"] == socket.gethostname()
    assert_nothing_left(marker)


def test_output_on_all_devices(launcher, marked):
    marker, d = marked
    proc = run_launcher(["-n", "3", "--output-on-all-devices", "--run-dir",
                         os.path.join(d, "run"), "--", os.path.join(d, "rank_program.py")])
    assert proc.returncode == 0, proc.stderr
    for r in range(3):
        assert f"rank {r} of 3" in proc.stdout and f"rank {r} done" in proc.stdout
        assert f"plain stderr from rank {r}" in proc.stderr
    # Lines of different ranks never run into each other.
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, proc.stdout
    assert all(re.fullmatch(r"rank \d (of 3: .*|done)", line) for line in lines), proc.stdout


def test_each_rank_sees_its_own_gpu(launcher, marked, fake_sys):
    marker, d = marked
    env = base_env(TNT_SYS_ROOT=fake_sys(gpus=2))
    proc = run_launcher(["--output-on-all-devices", "--run-dir", os.path.join(d, "run"), "--",
                         os.path.join(d, "rank_program.py")], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 of 2: CUDA_VISIBLE_DEVICES='0'" in proc.stdout
    assert "rank 1 of 2: CUDA_VISIBLE_DEVICES='1'" in proc.stdout


@pytest.mark.parametrize("name", ["localhost", socket.gethostname()])
def test_hostfile_naming_this_host(launcher, marked, name):
    marker, d = marked
    hostfile = os.path.join(d, "hosts")
    with open(hostfile, "w") as f:
        f.write(f"# this machine\n{name}\n")
    proc = run_launcher(["--hostfile", hostfile, "--n-per-node", "2", "--output-on-all-devices",
                         "--run-dir", os.path.join(d, "run"), "--", "sh", "-c",
                         "echo rank $OMPI_COMM_WORLD_RANK local $OMPI_COMM_WORLD_LOCAL_RANK"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0 local 0", "rank 1 local 1"]


def test_executable_program(launcher, marked):
    marker, d = marked
    proc = run_launcher(["-n", "2", "--run-dir", os.path.join(d, "run"), "--", "sh", "-c",
                         "echo rank $OMPI_COMM_WORLD_RANK"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "rank 0\n"
    assert open(os.path.join(d, "run", "rank1.log")).read() == "rank 1\n"


def test_pinning_to_a_numa_node(launcher, marked):
    marker, d = marked
    nodes = [n for n in os.listdir("/sys/devices/system/node") if n.startswith("node")]
    if not nodes:
        pytest.skip("this kernel shows no NUMA nodes")
    cpus = open("/sys/devices/system/node/node0/cpulist").read().strip()
    proc = run_launcher(["-n", "1", "--pin-memory-to-socket", "--run-dir",
                         os.path.join(d, "run"), "--", os.path.join(d, "rank_program.py"),
                         "--pin"])
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "cpus" in x)
    first, _, last = cpus.partition("-")
    expected = list(range(int(first), int(last or first) + 1)) if "," not in cpus else None
    if expected is not None:
        assert f"cpus {expected}" in line
    assert "bind:0" in line


def test_failed_rank_is_named_with_host_and_log(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    start = time.monotonic()
    proc = run_launcher(["-n", "3", "--run-dir", run_dir, "--",
                         os.path.join(d, "rank_program.py"), "--fail-rank", "1", "--code", "7",
                         "--sleep", "120"], timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 7, proc.stderr
    assert elapsed < 30, f"the other ranks were ended only after {elapsed:.0f} s"
    assert (f"rank 1 on host {socket.gethostname()} failed: it exited with code 7; "
            f"its log: {run_dir}/rank1.log") in proc.stderr
    # The end of the failed rank's log is shown, so the cause is on screen.
    assert "| rank 1 is failing on purpose" in proc.stderr
    for r in (0, 2):
        status = read_status(run_dir, r)
        assert status is None or status["ended_by_request"] == "1" or status["finished"] == "0"
    assert_nothing_left(marker)


def test_exception_on_a_rank(launcher, marked):
    marker, d = marked
    proc = run_launcher(["-n", "2", "--run-dir", os.path.join(d, "run"), "--",
                         os.path.join(d, "rank_program.py"), "--raise-rank", "1",
                         "--sleep", "120"], timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 on host" in proc.stderr and "exited with code 1" in proc.stderr
    assert "RuntimeError: rank 1 raised on purpose" in proc.stderr
    assert_nothing_left(marker)


def test_ctrl_c_ends_every_rank(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = start_launcher(["-n", "2", "--run-dir", run_dir, "--",
                           os.path.join(d, "rank_program.py"), "--sleep", "300"])
    try:
        wait_until_running(run_dir, 2)
        start = time.monotonic()
        # What a terminal does on Ctrl-C: SIGINT to the foreground process group.
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert elapsed < 20, f"ending the ranks took {elapsed:.0f} s"
    assert_nothing_left(marker)


def test_killed_launcher_leaves_nothing(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = start_launcher(["-n", "2", "--run-dir", run_dir, "--",
                           os.path.join(d, "rank_program.py"), "--sleep", "300"])
    wait_until_running(run_dir, 2)
    proc.kill()
    proc.communicate(timeout=10)
    assert_nothing_left(marker, timeout=20)


def test_killed_wrapper_is_reported(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = start_launcher(["-n", "2", "--run-dir", run_dir, "--",
                           os.path.join(d, "rank_program.py"), "--sleep", "300"])
    try:
        wait_until_running(run_dir, 2)
        wait_for(lambda: read_status(run_dir, 1)["pid"] != "0", 10)
        os.kill(int(read_status(run_dir, 1)["wrapper_pid"]), signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "rank 1" in err, err
    assert_nothing_left(marker)


def test_killing_a_rank_mid_training(launcher, marked):
    """Evidence 3: SIGKILL one rank of a 3-rank training; the launcher exits
    non-zero within 30 s, names the rank, and leaves no process behind."""
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = start_launcher(["-n", "3", "--run-dir", run_dir, "--",
                           os.path.join(d, "quick_start.py"), "--train_size", "3000",
                           "--epochs", "50", "--batch_size", "60"])
    try:
        # Training has begun once the master logs the batch sizes of fit.
        started = wait_for(lambda: "training: global batch size" in
                           open(os.path.join(run_dir, "rank0.log")).read()
                           if os.path.exists(os.path.join(run_dir, "rank0.log")) else False,
                           timeout=180, interval=0.5)
        assert started, f"training did not start:\n{proc.stderr.read() if proc.poll() else ''}"
        time.sleep(2)
        victim = int(read_status(run_dir, 1)["pid"])
        assert "quick_start.py" in open(f"/proc/{victim}/cmdline").read()
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"launcher exited {elapsed:.1f} s after the kill")
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert elapsed < 30, f"the launcher took {elapsed:.0f} s to exit"
    assert (f"rank 1 on host {socket.gethostname()} failed: it was killed by signal 9"
            in err), err
    assert f"{run_dir}/rank1.log" in err
    assert_nothing_left(marker)


def test_quick_start_on_two_ranks(launcher, marked):
    marker, d = marked
    proc = run_launcher(["-n", "2", "--log-level", "WARNING", "--run-dir",
                         os.path.join(d, "run"), "--", os.path.join(d, "quick_start.py"),
                         "--train_size", "1000", "--epochs", "1"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("test accuracy") == 1
    assert "(2 ranks, global batch 64)" in proc.stdout
    assert "INFO" not in proc.stderr


TF_EARLY_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795438113.837322    4261 port.cc:153] oneDNN custom operations are on.\n"
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.\n"
    "E0000 00:00:1795438113.837322    4261 some.cc:1] an error TensorFlow logged early\n"
    "plain stderr\n")


@pytest.mark.parametrize("level", ["0", "1", "2", "3"])
def test_tensorflow_early_lines_follow_its_log_level(launcher, marked, level):
    """TensorFlow's lines from before its logging is set up ignore
    TF_CPP_MIN_LOG_LEVEL; the terminal copy applies it, the log keeps all."""
    marker, d = marked
    run_dir = os.path.join(d, "run")
    code = f"import sys; sys.stderr.write({TF_EARLY_LINES!r})"
    proc = run_launcher(["-n", "1", "--run-dir", run_dir, "-x", f"TF_CPP_MIN_LOG_LEVEL={level}",
                         "--", sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    shown = proc.stderr
    assert ("All log messages before absl" in shown) == (level in ("0", "1"))
    assert ("oneDNN custom operations" in shown) == (level == "0")
    assert ("To enable the following instructions" in shown) == (level == "0")
    assert "an error TensorFlow logged early" in shown and "plain stderr" in shown
    assert open(os.path.join(run_dir, "rank0.log")).read() == TF_EARLY_LINES
