"""BackupAndRestore keeps Keras's safety features under Tarantella: with
double_checkpoint=True a damaged latest backup falls back to the previous one."""
import json
import os

import pytest

from conftest import ROOT, mpirun_command, run

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "backup_worker.py")


def test_double_checkpoint_falls_back_to_the_previous_backup(tmp_path, python):
    proc = run(mpirun_command(2, python, WORKER, str(tmp_path / "backup")), timeout=600)
    out = proc.stdout
    meta = json.loads(next(x for x in out.splitlines() if x.startswith("metadata "))[9:])
    assert meta["epoch"] == 3 and meta["tnt_previous_epoch"] == 2, meta
    assert "restoring the previous backup epoch2-batch0.weights.npz" in proc.stderr + out
    # Resumed from epoch 2 of 5, on every rank; the History holds the two
    # epochs of the previous backup too.
    for r in range(2):
        assert (f"rank {r}: resumed for epochs [2, 3, 4], History of epochs [0, 1, 2, 3, 4] "
                "with 5 losses") in out, out[-2000:]
        assert f"rank {r}: the subclass's on_epoch_end ran for epochs [2, 3, 4]" in out
