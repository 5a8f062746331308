"""Soak: 4 ranks x 2000 steps keep memory and file descriptors flat and
end with identical weights (make test-long)."""
import os

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import load

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "soak_worker.py")


@pytest.mark.long
def test_long_training_does_not_grow(tmp_path, python):
    run(mpirun_command(4, python, WORKER, "--out", str(tmp_path)), timeout=600)
    results = load(str(tmp_path), 4)
    for r, res in enumerate(results):
        steps, rss, fds = res["probe"].T
        assert list(steps) == [100, 500, 1000, 1500, 2000], f"rank {r} probed {steps}"
        growth = rss[-1] - rss[0]
        assert growth < 20.0, f"rank {r}: resident memory grew {growth:.1f} MB over 1900 steps"
        assert fds[-1] <= fds[0], f"rank {r}: open files grew from {fds[0]} to {fds[-1]}"
        assert np.array_equal(res["weights"], results[0]["weights"]), \
            f"rank {r} ends with weights different from rank 0's"
