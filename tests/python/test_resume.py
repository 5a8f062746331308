"""Jobs that survive a killed rank: the launcher restarts the job
(--max-restarts 1) and BackupAndRestore(save_freq=4) resumes fit at the
batch after its last backup, with the optimizer state, the data order and
position, the dropout seeds and the metrics of the epoch in progress. The
final weights must equal those of an uninterrupted run bitwise: with the
same number of ranks the resumed run performs the same operations on the
same values, so no tolerance applies.

resume_worker.py trains 4 epochs of 6 steps (global batch 16 of 96 NumPy
samples, shuffled every epoch) and backs up after every 4th step."""
import json
import os
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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("uninterrupted")
    run(mpirun_command(2, sys.executable, WORKER, str(d / "backup"), "--out", str(d / "w.npz")))
    return final(str(d / "w.npz"))


# (rank killed, epoch, batch): the last backup before the kill, and what the
# resumed fit has to skip of the epoch it starts in.
KILLS = [
    # backup after step 8 (epoch 1, batch 1): 2 batches of epoch 1 are skipped
    pytest.param(1, 1, 3, id="last-rank-mid-epoch"),
    # backup after step 12, the last batch of epoch 1: all of epoch 1 is
    # skipped, and epoch 2 starts with the next data order
    pytest.param(0, 2, 1, id="rank0-after-an-epochs-last-batch"),
]


@pytest.mark.parametrize("rank,epoch,batch", KILLS)
def test_killed_and_resumed_equals_uninterrupted(tmp_path, python, uninterrupted, rank, epoch,
                                                 batch):
    out = str(tmp_path / "w.npz")
    cmd = mpirun_command(2, python, WORKER, str(tmp_path / "backup"), "--out", out,
                         "--kill-rank", str(rank), "--kill-epoch", str(epoch),
                         "--kill-batch", str(batch))
    cmd.insert(1, "--max-restarts=1")
    proc = run(cmd)
    assert f"rank {rank} kills itself at epoch {epoch} batch {batch}" in proc.stdout
    assert "attempt 1 failed" in proc.stderr and "was killed by signal 9" in proc.stderr
    assert "attempt 2 succeeded after 1 restart(s)" in proc.stderr
    weights, summary = final(out)
    expected, expected_summary = uninterrupted
    assert len(weights) == len(expected)
    for got, want in zip(weights, expected):
        assert got.dtype == want.dtype and np.array_equal(got, want), \
            f"largest difference {np.abs(got - want).max()}"
    # The last epoch's loss and accuracy, accumulated over all its batches,
    # match too (resumed in epoch 1 or 2, the last epoch runs in whole).
    assert summary["last"] == expected_summary["last"]
