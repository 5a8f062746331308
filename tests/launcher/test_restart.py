"""Restarts (--max-restarts, --restart-delay, TNT_MAX_RESTARTS): a job whose
rank fails once finishes on the next attempt; a spent budget, a failure
before the first completed step, the same error twice in a row and an
interrupt end the job; every attempt logs in its own folder, learns its
restart count, and leaves no process behind."""
import os
import signal
import socket
import time

from launcher_util import (assert_nothing_left, base_env, run_launcher, start_launcher,
                           wait_until_running)


def attempts(run_dir):
    return sorted(n for n in os.listdir(run_dir) if n.startswith("attempt"))


def last_line(text):
    return text.rstrip("\n").rsplit("\n", 1)[-1]


def test_a_rank_that_fails_once_is_restarted(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    start = time.monotonic()
    # Rank 0 sleeps in the first attempt until the launcher ends it.
    proc = run_launcher(["-n", "2", "--max-restarts", "2", "--restart-delay", "1.5", "--run-dir",
                         run_dir, "--", os.path.join(d, "rank_program.py"), "--progress",
                         "--fail-rank", "1", "--sleep", "300", "--only-before-restart", "1"],
                        timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert attempts(run_dir) == ["attempt1", "attempt2"]
    host = socket.gethostname()
    assert (f"tarantella: attempt 1 failed: rank 1 on host {host} exited with code 3 "
            f"(log: {run_dir}/attempt1/rank1.log); restart 1 of 2 in 1.5 s") in proc.stderr
    assert last_line(proc.stderr) == "tarantella: attempt 2 succeeded after 1 restart(s)"
    assert elapsed >= 1.5, "the restart did not wait --restart-delay"
    for attempt, count in (("attempt1", 0), ("attempt2", 1)):
        for rank in (0, 1):
            with open(os.path.join(run_dir, attempt, f"rank{rank}.log")) as f:
                assert f"rank {rank} attempt with TNT_RESTART_COUNT={count}" in f.read()
    # Rank 0 of the first attempt was ended, not left to finish on its own.
    assert proc.stdout.count("rank 0 done") == 1, proc.stdout
    assert elapsed < 100, f"the job took {elapsed:.0f} s"
    assert_nothing_left(marker)


def test_spent_budget_ends_the_job(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    start = time.monotonic()
    proc = run_launcher(["-n", "2", "--max-restarts", "2", "--run-dir", run_dir, "--",
                         os.path.join(d, "rank_program.py"), "--progress", "--kill-rank", "1",
                         "--sleep", "300"], timeout=200)
    elapsed = time.monotonic() - start
    # The exit status is that of the last attempt's failed rank: SIGKILL.
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert attempts(run_dir) == ["attempt1", "attempt2", "attempt3"]
    assert proc.stderr.count("was killed by signal 9") == 3, proc.stderr
    assert last_line(proc.stderr) == ("tarantella: error: attempt 3 of at most 3 failed and is "
                                      "not restarted: the restart budget is spent")
    # Each attempt's surviving rank was ended, not waited for (it sleeps 300 s).
    assert elapsed < 150, f"three attempts took {elapsed:.0f} s"
    assert_nothing_left(marker)


def test_failure_before_the_first_step_is_not_restarted(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = run_launcher(["-n", "2", "--max-restarts", "3", "--run-dir", run_dir, "--",
                         os.path.join(d, "rank_program.py"), "--raise-rank", "1", "--sleep", "300"],
                        timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert attempts(run_dir) == ["attempt1"]
    assert "RuntimeError: rank 1 raised on purpose" in proc.stderr
    assert last_line(proc.stderr) == ("tarantella: error: attempt 1 of at most 4 failed and is not "
                                      "restarted: it failed before any rank completed a training "
                                      "step")
    assert_nothing_left(marker)


def test_the_same_error_twice_is_not_restarted_again(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    # The budget from the environment, as a job script would set it.
    proc = run_launcher(["-n", "2", "--run-dir", run_dir, "--", os.path.join(d, "rank_program.py"),
                         "--progress", "--fail-rank", "1", "--code", "5", "--sleep", "300"],
                        env=base_env(TNT_MAX_RESTARTS="5"), timeout=120)
    assert proc.returncode == 5, proc.stderr
    assert attempts(run_dir) == ["attempt1", "attempt2"]
    assert last_line(proc.stderr) == ("tarantella: error: attempt 2 of at most 6 failed and is not "
                                      "restarted: it failed with the same error as the attempt "
                                      "before it")
    assert_nothing_left(marker)


def test_an_interrupt_is_not_restarted(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = start_launcher(["-n", "2", "--max-restarts", "2", "--run-dir", run_dir, "--",
                           os.path.join(d, "rank_program.py"), "--progress", "--sleep", "300"])
    try:
        wait_until_running(os.path.join(run_dir, "attempt1"), 2)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert attempts(run_dir) == ["attempt1"]
    assert "not restarted: the launcher was interrupted" in last_line(err)
    assert_nothing_left(marker)


def test_without_restarts_the_logs_stay_in_the_run_directory(launcher, marked):
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = run_launcher(["-n", "2", "--run-dir", run_dir, "--", os.path.join(d, "rank_program.py"),
                         "--progress"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert attempts(run_dir) == []
    with open(os.path.join(run_dir, "rank1.log")) as f:
        assert "rank 1 attempt with TNT_RESTART_COUNT=0" in f.read()
    assert os.path.exists(os.path.join(run_dir, "rank1.progress"))
    assert_nothing_left(marker)


def test_dry_run_shows_the_first_attempt(launcher, tmp_path):
    run_dir = str(tmp_path / "run")
    proc = run_launcher(["--dry-run", "-n", "2", "--max-restarts", "2", "--run-dir", run_dir,
                         "--", "/bin/true"])
    assert proc.returncode == 0, proc.stderr
    assert f"# up to 2 restart(s), each logging in {run_dir}/attempt<K>" in proc.stdout
    assert f"--rank-exec --run-dir {run_dir}/attempt1 --restart-count 0 " in proc.stdout
    assert "export TNT_MAX_RESTARTS=2" in proc.stdout
    assert not os.path.exists(run_dir)
