"""Jobs that survive a killed rank: the launcher restarts the job
(--max-restarts 1) and BackupAndRestore(save_freq=4) resumes fit at the
batch after its last backup, with the optimizer state, the data order and
position, the dropout seeds and the metrics of the epoch in progress. The
final weights must equal those of an uninterrupted run bitwise: with the
same number of ranks the resumed run performs the same operations on the
same values, so no tolerance applies.

resume_worker.py trains 4 epochs of 6 steps (global batch 16 of 96 NumPy
samples, shuffled every epoch) and backs up after every 4th step.

The kill matrix kills rank 0, the last rank or a middle one, on 2 and 3
ranks, at four moments: at a batch's end (after a backup, before the next),
inside a step (the forward pass of the traced train function), in the
gradient allreduce (the rank dies in its backward pass while the others
wait for it in the allreduce), and in the middle of writing a backup (the
master, the rank that writes it, dies with half of the weights file
written). `make test` runs a few of them; `make test-long` all."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run

WORKER = os.path.join(ROOT, "tests", "python", "resume_worker.py")


def final(out):
    with np.load(out) as w:
        weights = [w[k] for k in sorted(w.files, key=lambda k: int(k.split("_")[1]))]
    with open(out + ".json") as f:
        return weights, json.load(f)


def train(ranks, d, *args, restarts=0, env=None):
    """Runs the worker on `ranks` ranks in directory d; returns the launcher's
    process and the final weights and logs."""
    d.mkdir(parents=True, exist_ok=True)
    out = str(d / "w.npz")
    cmd = mpirun_command(ranks, sys.executable, WORKER, str(d / "backup"), "--out", out, *args)
    if restarts:
        cmd.insert(1, f"--max-restarts={restarts}")
    proc = run(cmd, env=env)
    proc.run_dir = cmd[cmd.index("--run-dir") + 1]
    return proc, final(out)


@pytest.fixture(scope="module")
def runs_of(tmp_path_factory):
    """The final weights and logs of an uninterrupted run on n ranks:
    runs_of(n), or of the kill matrix's model (with its hook layer, armed on
    no rank): runs_of(n, hooked=True)."""
    done = {}

    def runs_of(ranks, hooked=False):
        if (ranks, hooked) not in done:
            d = tmp_path_factory.mktemp(f"uninterrupted{ranks}")
            done[ranks, hooked] = train(ranks, d, *(["--kill-in", "step"] if hooked else []))[1]
        return done[ranks, hooked]
    return runs_of


@pytest.fixture(scope="module")
def uninterrupted(runs_of):
    return runs_of(2)


def assert_same_run(got, expected):
    (weights, summary), (expected_weights, expected_summary) = got, expected
    assert len(weights) == len(expected_weights)
    for w, want in zip(weights, expected_weights):
        assert w.dtype == want.dtype and np.array_equal(w, want), \
            f"largest difference {np.abs(w - want).max()}"
    # The last epoch's loss and accuracy, accumulated over all its batches,
    # match too (resumed in epoch 1 or 2, the last epoch runs in whole).
    assert summary["last"] == expected_summary["last"]


def assert_restarted_once(proc, rank, epoch, batch, how=None):
    how = how or f"at epoch {epoch} batch {batch}"
    assert f"rank {rank} kills itself {how}" in proc.stdout, proc.stdout[-4000:]
    assert f"attempt 1 failed: rank {rank} on host" in proc.stderr
    assert "was killed by signal 9" in proc.stderr
    assert "attempt 2 succeeded after 1 restart(s)" in proc.stderr


# (rank killed, epoch, batch): the last backup before the kill, and what the
# resumed fit has to skip of the epoch it starts in.
KILLS = [
    # backup after step 8 (epoch 1, batch 1): 2 batches of epoch 1 are skipped
    pytest.param(1, 1, 3, id="last-rank-mid-epoch", marks=pytest.mark.long),
    # backup after step 12, the last batch of epoch 1: all of epoch 1 is
    # skipped, and epoch 2 starts with the next data order (make test-long)
    pytest.param(0, 2, 1, id="rank0-after-an-epochs-last-batch", marks=pytest.mark.long),
]


@pytest.mark.parametrize("rank,epoch,batch", KILLS)
@pytest.mark.ranks
def test_killed_and_resumed_equals_uninterrupted(tmp_path, uninterrupted, rank, epoch, batch):
    proc, got = train(2, tmp_path, "--kill-rank", str(rank), "--kill-epoch", str(epoch),
                      "--kill-batch", str(batch), restarts=1)
    assert_restarted_once(proc, rank, epoch, batch)
    assert_same_run(got, uninterrupted)


@pytest.mark.parametrize("steps", [None, 6], ids=["without-steps", "with-the-epochs-steps"])
@pytest.mark.ranks
def test_a_backup_at_an_epochs_end_resumes_with_the_next_epochs_data_order(tmp_path,
                                                                          uninterrupted, steps):
    """BackupAndRestore(save_freq="epoch") backs up at the end of epoch 1;
    rank 1 dies in epoch 2. Keras makes the iterator that epoch 2 trains on
    at epoch 2's start, or, given steps_per_epoch equal to the data's
    batches, at the end of epoch 1, before the backup: either way the
    resumed fit must draw epoch 2's order, not the one after it."""
    given = [] if steps is None else ["--steps-per-epoch", str(steps)]
    expected = uninterrupted if steps is None else train(2, tmp_path / "whole", *given)[1]
    proc, got = train(2, tmp_path / "killed", "--save-freq", "epoch", "--kill-rank", "1",
                      "--kill-epoch", "2", "--kill-batch", "1", *given, restarts=1)
    assert_restarted_once(proc, 1, 2, 1)
    assert "resumes from the backup of epoch 2 batch 0" in proc.stdout
    assert_same_run(got, expected)


# The step in which a rank dies inside the train step or the allreduce: step
# 7, the first of epoch 1; the last backup is that of step 4 (epoch 0, batch
# 3), so the resumed fit trains the rest of epoch 0 and goes on.
KILL_STEP = 7
# The rank dying in its backward pass waits this long first, and the others
# log that they are still waiting in the allreduce after STALL_WARNING_S:
# their own backward pass and the way into the allreduce take milliseconds.
KILL_DELAY_S, STALL_WARNING_S = 4, 1


def matrix_case(where, ranks, rank, cheap=False):
    name = {0: "rank0", ranks - 1: "last-rank"}.get(rank, "middle-rank")
    return pytest.param(where, ranks, rank, id=f"{where}-{name}-of-{ranks}",
                        marks=() if cheap else pytest.mark.long)


KILL_MATRIX = [matrix_case(where, ranks, rank, cheap=(where, ranks, rank) == ("allreduce", 2, 0))
               for where in ("step", "allreduce") for ranks in (2, 3) for rank in range(ranks)]


@pytest.mark.parametrize("where,ranks,rank", KILL_MATRIX)
@pytest.mark.ranks
def test_killed_in_a_step_and_resumed_equals_uninterrupted(tmp_path, runs_of, where, ranks, rank):
    proc, got = train(ranks, tmp_path, "--kill-in", where, "--kill-rank", str(rank),
                      "--kill-step", str(KILL_STEP), "--kill-delay", str(KILL_DELAY_S),
                      restarts=1, env={"TNT_STALL_WARNING_S": str(STALL_WARNING_S)})
    pass_ = "forward" if where == "step" else "backward"
    assert_restarted_once(proc, rank, None, None, f"in the {pass_} pass of step {KILL_STEP}")
    assert "resumes from the backup of epoch 0 batch 3" in proc.stdout
    if where == "allreduce":
        # Every other rank was inside the gradient allreduce, waiting.
        for r in set(range(ranks)) - {rank}:
            with open(os.path.join(proc.run_dir, "attempt1", f"rank{r}.log")) as f:
                log = f.read()
            assert re.search(r"WARNING: allreduce of fusion bucket \d+ .*: still waiting for "
                             r"rank \d+ .*after", log), f"rank {r}: {log[-3000:]}"
    assert_same_run(got, runs_of(ranks, hooked=True))


@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.long)])
@pytest.mark.ranks
def test_killed_while_writing_a_backup_resumes_from_the_previous_one(tmp_path, runs_of, ranks):
    """The master dies with half of the backup of step 8 written to its
    temporary file: the metadata still names the backup of step 4 (epoch 0,
    batch 3), which the restarted job resumes from; its first backup
    removes the temporary file."""
    proc, got = train(ranks, tmp_path, "--kill-in", "backup", "--kill-step", "8", restarts=1)
    assert_restarted_once(proc, 0, None, None, "while writing .epoch1-batch1.weights.npz.tnt-tmp-")
    assert " of the backup after step 8" in proc.stdout
    assert "resumes from the backup of epoch 0 batch 3" in proc.stdout
    assert sorted(os.listdir(tmp_path / "backup")) == [
        "epoch3-batch5.state.npz", "epoch3-batch5.weights.npz", "training_metadata.json"]
    assert_same_run(got, runs_of(ranks, hooked=True))


@pytest.mark.ranks
def test_history_and_early_stopping_survive_a_restart(tmp_path):
    """EarlyStopping(patience=2) on a loss that never improves enough stops
    fit after epoch 2. Rank 1 is killed in epoch 2 after the backup of step
    16 (epoch 2, batch 3): the resumed fit must know the History of epochs 0
    and 1 and EarlyStopping's count of 1 epoch without improvement, or it
    would train a 4th epoch and return a History of epochs 2 and 3 only."""
    _, expected = train(2, tmp_path / "uninterrupted", "--early-stopping")
    proc, got = train(2, tmp_path / "killed", "--early-stopping", "--kill-rank", "1",
                      "--kill-epoch", "2", "--kill-batch", "4", restarts=1)
    assert_restarted_once(proc, 1, 2, 4)
    assert_same_run(got, expected)
    summary, expected_summary = got[1], expected[1]
    assert expected_summary["epochs"] == [0, 1, 2]
    assert expected_summary["early_stopping"]["stopped_epoch"] == 2
    assert summary["epochs"] == expected_summary["epochs"]
    assert summary["history"] == expected_summary["history"]
    assert summary["early_stopping"] == expected_summary["early_stopping"]


@pytest.mark.ranks
@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
def test_a_pipeline_backs_up_and_resumes_each_stage_on_its_own(tmp_path, schedule):
    """A model cut into 2 pipeline stages (2 ranks, 2 micro-batches; the
    dropout in stage 1): each stage's rank writes the weights and the
    optimizer state of its stage to a file of its own, and restores that
    file only. Rank 1 is killed in epoch 1 after the backup of step 8
    (epoch 1, batch 1): the resumed pipeline ends with bitwise the weights
    of the uninterrupted pipelined run. The killed run's schedule is ZB-H1
    or ZB-H2, the uninterrupted one's 1F1B: a zero-bubble step computes
    1F1B's weights, across a restart too."""
    _, expected = train(2, tmp_path / "uninterrupted", "--pipeline")
    proc, got = train(2, tmp_path / "killed", "--pipeline", "--kill-rank", "1",
                      "--kill-epoch", "1", "--kill-batch", "3", restarts=1,
                      env={"TNT_PIPELINE_SCHEDULE": schedule})
    assert_restarted_once(proc, 1, 1, 3)
    assert "resumes from the backup of epoch 1 batch 1" in proc.stdout
    # The last backup (step 24: epoch 3, batch 5), kept (delete_checkpoint=False).
    assert sorted(os.listdir(tmp_path / "killed" / "backup")) == [
        "epoch3-batch5.stage0.weights.npz", "epoch3-batch5.stage1.weights.npz",
        "epoch3-batch5.state.npz", "training_metadata.json"]
    assert_same_run(got, expected)
    # The backup of 2 stages does not resume a model that is not pipelined.
    cmd = mpirun_command(2, sys.executable, WORKER, str(tmp_path / "killed" / "backup"),
                         "--out", str(tmp_path / "w.npz"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TNT_TIMEOUT_S="60"))
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert ("TarantellaError: BackupAndRestore: the backup was taken of a pipeline of 2 stages, "
            "and this is a model that is not pipelined: resume with the model, stages and "
            "schedule of the run that took the backup") in proc.stdout + proc.stderr, \
        proc.stderr[-4000:]


@pytest.mark.ranks
@pytest.mark.parametrize("schedule,stages", [("interleaved", ("0-2", "1-3")),
                                             ("zbv", ("0-3", "1-2"))])
def test_a_pipeline_of_two_stages_a_rank_backs_up_and_resumes_them(tmp_path, schedule, stages):
    """4 stages on 2 ranks (TNT_PIPELINE_SCHEDULE=interleaved, or zbv's V):
    each rank writes the weights and the optimizer state of its two stages
    to a file of its own and restores it; killed in epoch 1, the resumed
    pipeline ends with bitwise the weights of the uninterrupted one. Its
    backup does not resume 1F1B on the same 2 ranks (2 stages there)."""
    env = {"TNT_PIPELINE_SCHEDULE": schedule}
    _, expected = train(2, tmp_path / "uninterrupted", "--pipeline", "4", env=env)
    proc, got = train(2, tmp_path / "killed", "--pipeline", "4", "--kill-rank", "1",
                      "--kill-epoch", "1", "--kill-batch", "3", restarts=1, env=env)
    assert_restarted_once(proc, 1, 1, 3)
    assert sorted(os.listdir(tmp_path / "killed" / "backup")) == [
        f"epoch3-batch5.stage{stages[0]}.weights.npz",
        f"epoch3-batch5.stage{stages[1]}.weights.npz",
        "epoch3-batch5.state.npz", "training_metadata.json"]
    assert_same_run(got, expected)
    cmd = mpirun_command(2, sys.executable, WORKER, str(tmp_path / "killed" / "backup"),
                         "--out", str(tmp_path / "w.npz"), "--pipeline")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TNT_TIMEOUT_S="60"))
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert (f"the backup was taken of a pipeline of 4 stages on 2 ranks (stages {stages[0]}, "
            f"{stages[1]}), and this is a pipeline of 2 stages") in proc.stdout + proc.stderr, \
        proc.stderr[-4000:]


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: room for the worker's first backup (a few KiB of
    weights and state), and for a file that fills it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.ranks
def test_a_full_disk_keeps_the_previous_backup(tmp_path, small_disk, uninterrupted):
    """The backup disk fills up after step 5 (the backup of step 4 is on
    it): the backup of step 8 cannot be written. Every rank stops with an
    error that names the file and says that the previous backup is kept;
    the previous backup is intact, and a job started again once there is
    room resumes from it and ends with the uninterrupted run's weights."""
    backup, filler = small_disk / "backup", small_disk / "filler"
    cmd = mpirun_command(2, sys.executable, WORKER, str(backup), "--out", str(tmp_path / "w.npz"),
                         "--fill-disk", str(filler))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TNT_TIMEOUT_S="60"))
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "the disk is full: No space left on device" in proc.stdout
    message = (f"TarantellaError: BackupAndRestore could not write "
               f"{backup}/epoch1-batch1.weights.npz: "
               "No space left on device (errno 28); the previous backup (epoch 0, batch 3) is "
               "kept, and a fit started again resumes from it")
    run_dir = cmd[cmd.index("--run-dir") + 1]
    for r in range(2):
        with open(os.path.join(run_dir, f"rank{r}.log")) as f:
            assert message in f.read(), f"rank {r}: {proc.stderr[-4000:]}"
    with open(backup / "training_metadata.json") as f:
        meta = json.load(f)
    assert (meta["epoch"], meta["batch"]) == (0, 3), meta
    # Nothing of the failed backup is left behind.
    assert sorted(os.listdir(backup)) == ["epoch0-batch3.state.npz", "epoch0-batch3.weights.npz",
                                          "training_metadata.json"]
    filler.unlink()
    out = str(tmp_path / "resumed.npz")
    run(mpirun_command(2, sys.executable, WORKER, str(backup), "--out", out))
    assert_same_run(final(out), uninterrupted)


@pytest.mark.long
@pytest.mark.ranks
def test_middle_rank_of_three_killed_and_resumed(tmp_path, runs_of):
    proc, got = train(3, tmp_path / "killed", "--kill-rank", "1", "--kill-epoch", "2",
                      "--kill-batch", "4", restarts=1)
    assert_restarted_once(proc, 1, 2, 4)
    assert_same_run(got, runs_of(3))


def test_progress_is_recorded_once_and_never_stops_training(tmp_path):
    """tarantella.progress.step_completed() creates TNT_PROGRESS_FILE (the
    launcher's sign that an attempt got somewhere) on its first call only;
    a file that cannot be written costs a warning, not the training."""
    code = ("from tarantella import progress\n"
            "progress.step_completed()\n"
            "progress.step_completed()\n"
            "print('went on')\n")
    path = tmp_path / "rank0.progress"
    for target, recorded in ((path, True), (tmp_path / "missing" / "rank0.progress", False)):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, TNT_PROGRESS_FILE=str(target),
                                       TF_CPP_MIN_LOG_LEVEL="3"), timeout=120)
        assert proc.returncode == 0 and "went on" in proc.stdout, proc.stderr
        assert target.exists() == recorded
        warned = proc.stderr.count("cannot record the first completed step")
        assert warned == (0 if recorded else 1), proc.stderr
