"""A pipeline stage's SGD updates its variables with TensorFlow's fused
kernels (optimizers.update_in_place), which compute Keras's update
operation for operation: training with it must give weights bitwise equal
to Keras's SGD (plain, momentum, Nesterov; Sequential and Functional), and
the traced update must be the fused kernel, so that the equality is not
that of Keras against itself."""
import json
import os
import sys

from conftest import ROOT, run

WORKER = os.path.join(ROOT, "tests", "python", "in_place_update_worker.py")


def test_fused_sgd_updates_equal_keras_bitwise():
    results = json.loads(run([sys.executable, WORKER]).stdout.strip().splitlines()[-1])
    assert len(results) == 6
    for r in results:
        assert r["bitwise_equal"] and r["changed"], r
        fused = ("ResourceApplyKerasMomentum" if r["config"]["momentum"]
                 else "ResourceApplyGradientDescent")
        # The weights' update is the fused kernel; Keras's own would assign
        # the momentum and add to (or subtract from) the variable.
        assert fused in r["ops"], r
        assert "AssignAddVariableOp" not in r["ops"] and "AssignSubVariableOp" not in r["ops"], r
