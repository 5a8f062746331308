"""Custom training equals serial Keras: an overridden train_step with two
optimizers, a VAE-style add_loss, and a hand-written loop with
tnt.DistributedGradientTape, at 1, 2 and 3 ranks (uneven micro-batches)."""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "custom_training_worker.py")
CASES = ["two_optimizers", "vae", "loop"]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("serial"))
    run([sys.executable, WORKER, ",".join(CASES), "--serial", "--out", d])
    return {case: load(os.path.join(d, case), 1)[0] for case in CASES}


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_custom_training_equals_serial(nranks, serial, tmp_path, python):
    run(mpirun_command(nranks, python, WORKER, ",".join(CASES), "--out", str(tmp_path)),
        timeout=600)
    for case in CASES:
        results = load(str(tmp_path / case), nranks)
        assert_ranks_identical(results)
        got, want = results[0], serial[case]
        assert np.allclose(got["loss"], want["loss"], rtol=0, atol=1e-4), \
            f"{case}: per-epoch loss {got['loss']} differs from serial {want['loss']}"
        for key in (k for k in want if k.startswith("w")):
            diff = np.abs(got[key] - want[key]).max()
            assert diff < 1e-4, f"{case}: weight {key} differs from serial by {diff}"


DATA = "/usr/share/datasets/fashion-mnist"
needs_data = pytest.mark.skipif(not os.path.isdir(DATA),
                                reason="dataset-fashion-mnist is not installed")


@needs_data
def test_gan_example_keeps_replicas_identical(tmp_path, python):
    prefix = str(tmp_path / "gan")
    run(mpirun_command(2, python, os.path.join(ROOT, "examples", "gan.py"), "--train_size", "1024",
                       "--save_weights", prefix), timeout=600)
    ranks = [np.load(f"{prefix}.rank{r}.npz") for r in range(2)]
    assert len(ranks[0].files) > 0
    for key in ranks[0].files:
        assert np.array_equal(ranks[0][key], ranks[1][key]), f"weight {key} differs between ranks"


@needs_data
def test_custom_loop_example_runs(python):
    proc = run(mpirun_command(2, python, os.path.join(ROOT, "examples", "custom_loop.py"),
                              "--train_size", "1024"), timeout=600)
    assert "(1024 samples on 2 ranks)" in proc.stdout, proc.stdout[-2000:]
