"""Interleaved 1F1B (TNT_PIPELINE_SCHEDULE=interleaved) on ranks: 4 stages
on 2 ranks (v = 2 chunks per rank: rank 0 runs stages 0 and 2, rank 1
stages 1 and 3), 4 micro-batches, a functional and a Sequential model.

Every stage computes what it computes under 1F1B, and sums its backward
passes' gradients in the same (micro-batch) order, so the weights are
bitwise those of 1F1B with the same 4 stages on 4 ranks. So are the losses
and metrics: the models have no regularization, so only the last stage's
metric state is not zero, and adding zeros across ranks is exact. Both
equal serial Keras within test_pipeline.py's tolerances. With the weight
gradients recomputed (TNT_PIPELINE_WEIGHT_GRADIENTS=recompute) the chunks of
a rank recompute theirs after the rank's schedule."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import mpirun_command, run
from test_pipeline import WORKER, assert_matches_serial, serial_run
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

CASES = ["mlp", "seq"]


def pipelined(tmp_path_factory, case, ranks, schedule, weight_gradients="accumulate"):
    d = str(tmp_path_factory.mktemp(f"{case}-{schedule}-{ranks}-{weight_gradients}"))
    run(mpirun_command(ranks, sys.executable, WORKER, case, "--out", d, "--stages", "4",
                       "--micro-batches", "4", "--optimizer", "adam"),
        timeout=600, env={"TNT_PIPELINE_SCHEDULE": schedule,
                          "TNT_PIPELINE_WEIGHT_GRADIENTS": weight_gradients})
    return load(d, ranks)


@pytest.mark.parametrize("case", CASES)
def test_interleaved_equals_1f1b_bitwise_and_serial(case, tmp_path_factory):
    interleaved = pipelined(tmp_path_factory, case, 2, "interleaved")
    assert_ranks_identical(interleaved)
    one_f_one_b = pipelined(tmp_path_factory, case, 4, "1f1b")
    keys = [k for k in one_f_one_b[0] if k.startswith("w")]
    assert len(keys) == 8  # 4 dense layers: kernel and bias
    for key in keys + ["loss", "metric", "val_loss", "evaluate", "predict"]:
        assert np.array_equal(interleaved[0][key], one_f_one_b[0][key]), \
            f"{case}: {key} differs between interleaved (2 ranks) and 1F1B (4 ranks)"
    assert_matches_serial(interleaved[0], serial_run(tmp_path_factory, case, 4, "adam"),
                          (case, "interleaved"))


def test_interleaved_with_recomputed_weight_gradients(tmp_path_factory):
    """TNT_PIPELINE_WEIGHT_GRADIENTS=recompute with two chunks per rank:
    each chunk recomputes its weight gradients after the rank's schedule,
    as the same stage does alone on its rank under 1F1B (bitwise), and
    training equals serial Keras."""
    interleaved = pipelined(tmp_path_factory, "mlp", 2, "interleaved", "recompute")
    assert_ranks_identical(interleaved)
    one_f_one_b = pipelined(tmp_path_factory, "mlp", 4, "1f1b", "recompute")
    for key in [k for k in one_f_one_b[0] if k.startswith("w")] + ["loss", "predict"]:
        assert np.array_equal(interleaved[0][key], one_f_one_b[0][key]), key
    assert_matches_serial(interleaved[0], serial_run(tmp_path_factory, "mlp", 4, "adam"),
                          ("mlp", "interleaved, recomputed"))


BAD = """
import sys
sys.path.insert(0, HERE)
import tarantella as tnt
from pipeline_worker import build
tnt.init()
for strategy, micro_batches in (("PIPELINING", 3), ("ALL", 4)):
    try:
        tnt.Model(build("mlp", 4), parallel_strategy=getattr(tnt.ParallelStrategy, strategy),
                  num_micro_batches=micro_batches)
        print(f"CASE {strategy}: no error")
    except tnt.TarantellaError as e:
        print(f"CASE {strategy}: ERROR: {e}")
"""


def test_interleaved_refuses_what_it_cannot_run(tmp_path, python):
    """When the model is built, with what to change: micro-batches that do
    not come in rounds of one per rank, and replicas of the pipeline."""
    script = tmp_path / "bad.py"
    script.write_text(BAD.replace("HERE", repr(os.path.dirname(WORKER))))
    out = run(mpirun_command(2, python, str(script)), timeout=300,
              env={"TNT_PIPELINE_SCHEDULE": "interleaved"}).stdout
    assert "CASE PIPELINING: ERROR: the interleaved schedule runs micro-batches in rounds of " \
        "one per rank: num_micro_batches=3 must be a multiple of the 2 ranks" in out, out
    assert "CASE ALL: ERROR: the interleaved pipeline schedule runs with " \
        "ParallelStrategy.PIPELINING" in out, out


def test_timeline_shows_the_interleaved_schedule(tmp_path, python):
    """With TNT_TIMELINE, each rank's trace holds a span per forward and
    backward action of its list, named with the micro-batch and the stage,
    in the list's order."""
    from tarantella.pipeline import schedule as schedule_lib
    trace = str(tmp_path / "trace.json")
    run(mpirun_command(2, python, WORKER, "mlp", "--out", str(tmp_path / "out"),
                       "--stages", "4", "--micro-batches", "4"),
        timeout=600, env={"TNT_TIMELINE": trace, "TNT_PIPELINE_SCHEDULE": "interleaved"})
    schedule = schedule_lib.training("interleaved", 4, 2, 4)
    for rank in (0, 1):
        want = [f"{'forward' if a.kind == 'F' else 'backward'} {a.micro_batch} of stage "
                f"{a.stage}" for a in schedule.actions[rank] if a.kind in ("F", "B")]
        with open(str(tmp_path / f"trace.rank{rank}.json")) as f:
            events = [e for e in json.load(f) if e.get("cat") == "pipeline"]
        spans = [e["name"] for e in sorted(events, key=lambda e: e["ts"])
                 if e["ph"] == "X" and e["name"].split()[0] in ("forward", "backward")]
        assert spans[:len(want)] == want, f"rank {rank}: {spans[:len(want)]}"
