"""Every way of feeding data gives serial Keras's results."""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "data_worker.py")


@pytest.mark.parametrize("nranks", [2, 3])
def test_inputs_equal_serial(nranks, tmp_path, python):
    serial_out = str(tmp_path / "serial")
    run([sys.executable, WORKER, "--serial", "--ranks", str(nranks), "--out", serial_out])
    serial = load(serial_out, 1)[0]
    out = str(tmp_path / "dist")
    run(mpirun_command(nranks, python, WORKER, "--out", out), timeout=600)
    results = load(out, nranks)
    assert_ranks_identical(results)
    got = results[0]
    assert set(got) == set(serial)
    for key in serial:
        if "/w" in key:
            assert np.allclose(got[key], serial[key], rtol=0, atol=1e-5), key
        else:
            assert np.allclose(got[key], serial[key], rtol=0, atol=1e-4), \
                f"{key}: {got[key]} != serial {serial[key]}"


# Misuse (fit before compile, datasets batched twice or not at all, batch sizes
# against micro-batch sizes and ranks, models that differ across ranks, custom
# training loops) is in the matrix of tests/reliability/test_bad_input.py.
