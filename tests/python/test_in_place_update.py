"""A pipeline stage's SGD updates its variables with TensorFlow's fused
kernels, and its Adam runs Keras's operations one part after the other
(pipeline/in_place.py); both compute Keras's update operation for
operation: training with them must give weights bitwise equal to Keras's
SGD (plain, momentum, Nesterov) and Adam (default and other betas and
epsilon), Sequential and Functional, and the traced update must be the
fused kernel or the parts in order, so that the equality is not that of
Keras against itself."""
import json
import os
import sys

from conftest import ROOT, run

WORKER = os.path.join(ROOT, "tests", "python", "in_place_update_worker.py")


def test_in_place_updates_equal_keras_bitwise():
    results = json.loads(run([sys.executable, WORKER]).stdout.strip().splitlines()[-1])
    assert len(results) == 10
    for r in results:
        assert r["bitwise_equal"] and r["changed"], r
        if r["optimizer"] == "Adam":
            # The second moment's update waits for the first's, the
            # variable's for the second's; Keras's own are not ordered.
            assert r["in_order"], r
            continue
        fused = ("ResourceApplyKerasMomentum" if r["config"]["momentum"]
                 else "ResourceApplyGradientDescent")
        # The weights' update is the fused kernel; Keras's own would assign
        # the momentum and add to (or subtract from) the variable.
        assert fused in r["ops"], r
        assert "AssignAddVariableOp" not in r["ops"] and "AssignSubVariableOp" not in r["ops"], r
