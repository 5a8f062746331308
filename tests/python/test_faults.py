"""Faults during training: a dead rank, a stalled rank, ranks that disagree,
and a job killed while it saves. Nothing may hang, nothing may be lost, and
every message must name the rank at fault."""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import mpirun_command, run

pytestmark = pytest.mark.ranks

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fault_worker.py")
TIMEOUT_S = 30  # TNT_TIMEOUT_S, the documented default


def processes_with(marker):
    """Pids whose command line contains marker (other than this process)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read().decode(errors="replace") and int(pid) != os.getpid():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def launch(nranks, args, env=None, timeout=240):
    """Runs the worker through the launcher; returns (process, seconds)."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TNT_TIMEOUT_S=str(TIMEOUT_S))
    full_env.update(env or {})
    cmd = mpirun_command(nranks, sys.executable, WORKER, *args)
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s:\n{e.stdout}\n{e.stderr}")
    return proc, time.monotonic() - start


# ------------------------------------------------------------- dead rank

def kill_trial(nranks, victim, step, d, extra=()):
    """Rank `victim` SIGKILLs itself at step `step` of fit. The job must end
    within TNT_TIMEOUT_S of the kill, exit non-zero, name the dead rank, and
    leave no process behind. Returns the seconds from the kill to the end.
    `extra`: more arguments of the worker's kill mode."""
    d.mkdir()
    kill_file = str(d / "killed_at")
    proc, _ = launch(nranks, ["kill", "--victim", str(victim), "--step", str(step),
                              "--kill-file", kill_file, *extra])
    ended = time.time()
    what = f"{nranks} ranks: rank {victim} killed at step {step}"
    assert os.path.exists(kill_file), f"{what}: the rank never died\n{proc.stderr[-3000:]}"
    delay = ended - float(open(kill_file).read())
    assert proc.returncode == 128 + signal.SIGKILL, f"{what}: exit {proc.returncode}"
    assert (f"rank {victim} on host {socket.gethostname()} failed: it was killed by "
            "signal 9" in proc.stderr), f"{what}:\n{proc.stderr[-3000:]}"
    assert delay < TIMEOUT_S, f"{what}: the job ended {delay:.1f} s after the kill"
    left = processes_with(kill_file)
    assert not left, f"{what}: processes left behind: {left}"
    return delay


# One kill per rank count, the master and the last rank, in the first step
# of fit and well into it; the random trials below (make test-long) add many
# more ranks and steps.
@pytest.mark.parametrize("nranks,victim,step", [(2, 0, 1), (3, 2, 25), (4, 0, 40), (4, 3, 7)])
def test_rank_killed(nranks, victim, step, tmp_path):
    kill_trial(nranks, victim, step, tmp_path / "trial")


@pytest.mark.long
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_rank_killed_at_a_random_step(nranks, tmp_path):
    """20 times per rank count: a random rank SIGKILLs itself at a random
    step of fit (as test_rank_killed)."""
    rng = random.Random(f"dead rank at {nranks} ranks")
    delays = []
    for trial in range(20):
        victim, step = rng.randrange(nranks), rng.randint(1, 40)
        delays.append(kill_trial(nranks, victim, step, tmp_path / f"trial{trial}"))
    print(f"{nranks} ranks: the job ended {min(delays):.1f} to {max(delays):.1f} s "
          f"(mean {sum(delays) / len(delays):.1f} s) after the kill")


# ------------------------------------------------------------- stalled rank

STALL = r'''
import os, sys, time
sys.path.insert(0, {here!r})
import keras, tarantella as tnt
from train_worker import make_data, make_model
tnt.init()
x, y = make_data(96)
model = tnt.Model(make_model(3))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
class Stall(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 3:
            time.sleep(60)  # e.g. stuck reading data
model.fit(x, y, batch_size=12, epochs=1, verbose=0,
          callbacks=[Stall()] if tnt.get_rank() == 1 else [])
'''


def test_stalled_rank_is_named_then_times_out(tmp_path, python):
    """Rank 1 stops contributing at step 3. Rank 0 warns after
    TNT_STALL_WARNING_S naming rank 1 and the bucket it waits for, and
    fails after TNT_TIMEOUT_S; the job ends long before the stall would."""
    script = tmp_path / "stall.py"
    script.write_text(STALL.format(here=HERE))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TNT_TIMEOUT_S="6", TNT_STALL_WARNING_S="2")
    cmd = mpirun_command(2, python, str(script))
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - start
    err = proc.stderr
    # Rank 1 sleeps 60 s; rank 0 fails 6 s into the stall and its exit must
    # not wait for rank 1 (freeing MPI's shared windows would).
    assert took < 45, f"the job took {took:.0f} s: it waited for the stalled rank"
    assert proc.returncode != 0, err[-3000:]
    warn = err.find("still waiting for rank 1")
    fail = err.find("timed out after 6.0 s waiting for rank 1")
    assert warn >= 0 and fail > warn, err[-4000:]
    assert "fusion bucket" in err[max(0, warn - 300):warn], err[max(0, warn - 300):warn + 200]
    assert "rank 0 on host" in err and "failed" in err, err[-3000:]


# ------------------------------------------------------------- disagreement

MISMATCH = r'''
import os, sys
sys.path.insert(0, {here!r})
import tarantella as tnt
from train_worker import make_data, make_model
tnt.init()
rank = tnt.get_rank()
model = tnt.Model(make_model(3))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
def expect(fragment, fn):
    try:
        fn()
    except tnt.TarantellaError as e:
        assert fragment in str(e), f"{{fragment!r}} not in {{e}}"
        print("ok:", e)
        return
    raise AssertionError(f"no error for {{fragment}}")
x, y = make_data(40 if rank == 0 else 48)
expect("the number of steps per epoch is 5 on the master rank but 6 on rank 1",
       lambda: model.fit(x, y, batch_size=8, verbose=0))
x, y = make_data(40)
expect("the number of epochs is 2 on the master rank but 3 on rank 1",
       lambda: model.fit(x, y, batch_size=8, epochs=2 + rank, verbose=0))
expect("the number of steps is 5 on the master rank but 4 on rank 1",
       lambda: model.evaluate(x[:40 - 8 * rank], y[:40 - 8 * rank], batch_size=8, verbose=0))
model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # agreeing ranks still train
print("ok: trained")
'''


def test_ranks_that_disagree_get_an_error_naming_them(tmp_path, python):
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH.format(here=HERE))
    proc = run(mpirun_command(2, python, str(script)), timeout=300)
    assert proc.stdout.count("ok:") == 2 * 4, proc.stdout + proc.stderr[-3000:]


# ------------------------------------------------------------- checkpoints

def weights(out, nranks):
    per_rank = [np.load(os.path.join(out, f"rank{r}.npz")) for r in range(nranks)]
    return [[f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
            for f in per_rank]


def assert_bitwise(got, want, what):
    for r, ws in enumerate(got):
        assert len(ws) == len(want[0])
        for i, (a, b) in enumerate(zip(ws, want[0])):
            assert np.array_equal(a, b), (
                f"{what}: rank {r}, weight {i} differs by {np.abs(a - b).max()}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("uninterrupted")
    proc, _ = launch(2, ["checkpoint", "--dir", str(d), "--out", str(d / "out")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return weights(str(d / "out"), 2)


# The master renames four files per epoch: the epoch's checkpoint, then
# the backup's weights, the backup's state (seeds and metrics) and the
# backup's metadata (BackupAndRestore runs after the other callbacks).
# Renames 9 to 12 are those of epoch 3.
# Rename 9 in make test; 10, 11 and 12 (the same resume from the other files
# of the epoch) in make test-long.
@pytest.mark.parametrize("rename", [9, pytest.param(10, marks=pytest.mark.long),
                                    pytest.param(11, marks=pytest.mark.long),
                                    pytest.param(12, marks=pytest.mark.long)])
def test_killed_while_saving_then_resumed(rename, uninterrupted, tmp_path):
    """The job dies halfway through a save of epoch 3: the previous backup
    and checkpoints stay intact, and resuming with BackupAndRestore ends
    with the uninterrupted run's weights, bit for bit."""
    d = tmp_path
    proc, _ = launch(2, ["checkpoint", "--dir", str(d), "--out", str(d / "out"),
                         "--kill-at-rename", str(rename)])
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr[-3000:]
    saved = sorted(f for f in os.listdir(d) if f.startswith("ckpt-"))
    assert saved == ["ckpt-1.keras", "ckpt-2.keras"] + (["ckpt-3.keras"] if rename > 9 else []), \
        saved
    meta = json.load(open(d / "backup" / "training_metadata.json"))
    assert meta["epoch"] == 2, meta
    assert os.path.exists(d / "backup" / meta["tnt_weights"])
    assert os.path.exists(d / "backup" / meta["tnt_state"])

    proc, _ = launch(2, ["checkpoint", "--dir", str(d), "--out", str(d / "resumed")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_bitwise(weights(str(d / "resumed"), 2), uninterrupted,
                   f"resumed after a kill at rename {rename}")


def test_resumed_from_a_checkpoint_file(uninterrupted, tmp_path):
    """A checkpoint of epoch 2 (full model with optimizer state), loaded with
    tnt.models.load_model and trained from initial_epoch=2, ends with the
    uninterrupted run's weights, bit for bit."""
    first = tmp_path / "first"
    proc, _ = launch(2, ["checkpoint", "--dir", str(first), "--out", str(first / "out"),
                         "--epochs", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = tmp_path / "second"
    proc, _ = launch(2, ["checkpoint", "--dir", str(second), "--out", str(second / "out"),
                         "--resume", str(first / "ckpt-2.keras"), "--initial-epoch", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_bitwise(weights(str(second / "out"), 2), uninterrupted, "resumed from ckpt-2.keras")
