"""BatchNormalization on N ranks.

Synchronized: training equals serial Keras with the same global batch (150
samples in batches of 20: micro-batches of unequal size at 3 ranks and a
partial last batch). Unsynchronized: the moving statistics are averaged, so
every rank ends with the same weights and the checkpoint holds them.
"""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "batch_norm_worker.py")


@pytest.fixture(scope="module")
def serial_synchronized(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("serial"))
    run([sys.executable, WORKER, "--serial", "--synchronized", "--out", out])
    return load(out, 1)[0]


@pytest.mark.parametrize("nranks", [2, 3])
def test_synchronized_batch_norm_equals_serial(nranks, serial_synchronized, tmp_path, python):
    out = str(tmp_path)
    run(mpirun_command(nranks, python, WORKER, "--synchronized", "--out", out), timeout=600)
    results = load(out, nranks)
    assert_ranks_identical(results)
    got, want = results[0], serial_synchronized
    diff = np.abs(got["loss"] - want["loss"]).max()
    print(f"{nranks} ranks: per-epoch loss differs from serial by at most {diff:.2e}")
    assert diff < 1e-4, f"loss {got['loss']} differs from serial {want['loss']}"
    worst = 0.0
    for key in sorted(k for k in want if k.startswith("w")):
        worst = max(worst, float(np.abs(got[key] - want[key]).max()))
    print(f"{nranks} ranks: weights differ from serial by at most {worst:.2e}")
    assert worst < 1e-4, f"weights differ from serial by {worst}"
    assert np.allclose(got["evaluate"], want["evaluate"], rtol=0, atol=1e-4)


def test_unsynchronized_moving_statistics_agree(tmp_path, python):
    out = str(tmp_path)
    run(mpirun_command(3, python, WORKER, "--out", out), timeout=600)
    results = load(out, 3)
    # Every rank ends with the same weights, the moving statistics included,
    # and the checkpoint of the last epoch holds them.
    assert_ranks_identical(results)
    for key in (k for k in results[0] if k.startswith("w")):
        assert np.array_equal(results[0][key], results[0][f"checkpoint/{key}"]), key
