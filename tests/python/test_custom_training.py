"""Custom training equals serial Keras: an overridden train_step with two
optimizers, a VAE-style add_loss, and a hand-written loop with
tnt.DistributedGradientTape, at 1, 2 and 3 ranks (uneven micro-batches)."""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

WORKER = os.path.join(ROOT, "tests", "python", "custom_training_worker.py")
CASES = ["two_optimizers", "vae", "loop"]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = {}
    for case in CASES:
        d = str(tmp_path_factory.mktemp(f"serial-{case}"))
        run([sys.executable, WORKER, case, "--serial", "--out", d])
        out[case] = load(d, 1)[0]
    return out


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
def test_custom_training_equals_serial(case, nranks, serial, tmp_path, python):
    run(mpirun_command(nranks, python, WORKER, case, "--out", str(tmp_path)), timeout=600)
    results = load(str(tmp_path), nranks)
    assert_ranks_identical(results)
    got, want = results[0], serial[case]
    assert np.allclose(got["loss"], want["loss"], rtol=0, atol=1e-4), \
        f"{case}: per-epoch loss {got['loss']} differs from serial {want['loss']}"
    for key in (k for k in want if k.startswith("w")):
        diff = np.abs(got[key] - want[key]).max()
        assert diff < 1e-4, f"{case}: weight {key} differs from serial by {diff}"
