"""Pipeline schedules chosen with tnt.Model's pipeline_schedule, on ranks.

Every schedule with one stage per rank (GPipe, ZB-H1, ZB-H2) trains the
weights of 1F1B bitwise, on 2 and 3 stages, a functional and a Sequential
model, and on 2 replicas of 2 stages: each stage adds its
micro-batches' weight gradients in the same order, from the same ops; the
zero-bubble schedules compute them in W passes of their own, which the
timeline names.

ZBV and interleaved 1F1B run 4 stages on 2 ranks (v = 2 chunks per rank:
interleaved, rank 0 runs stages 0 and 2, rank 1 stages 1 and 3; ZBV, in a
V, stages 0 and 3 and stages 1 and 2): every stage computes what it
computes under 1F1B and sums its backward passes' gradients in the same
(micro-batch) order, so the weights are bitwise those of 1F1B with the same
4 stages on 4 ranks. So are the losses and metrics: the models have no
regularization, so only the last stage's metric state is not zero, and
adding zeros across ranks is exact. With the weight gradients recomputed
(TNT_PIPELINE_WEIGHT_GRADIENTS=recompute) the chunks of a rank recompute
theirs after the rank's schedule. Both equal serial Keras within
test_pipeline.py's tolerances.

The argument overrides TNT_PIPELINE_SCHEDULE and is checked when the model
is built: a name that is no schedule, a schedule the layout cannot run, and
the argument on a model that is not pipelined fail with what to change; the
master's log names the schedule and its bubble."""
import json
import os

import numpy as np
import pytest

from conftest import mpirun_command, run
from test_pipeline import (WORKER, assert_matches_serial, pipelined_runs, serial_run,
                           serial_runs)
from test_training import assert_ranks_identical

from tarantella.pipeline import schedule as schedule_lib

pytestmark = pytest.mark.ranks

CHOICE = """
import sys
sys.path.insert(0, HERE)
import tarantella as tnt
from pipeline_worker import build
tnt.init()
P, A, D = tnt.ParallelStrategy.PIPELINING, tnt.ParallelStrategy.ALL, tnt.ParallelStrategy.DATA
for case, stages, strategy, schedule, micro_batches in (
        ("unknown", 2, P, "zigzag", 4),
        ("replicas", 4, A, "interleaved", 4),
        ("ranks", 3, P, "interleaved", 4),
        ("rounds", 4, P, "interleaved", 3),
        ("data", 2, D, "gpipe", None),
        ("chosen", 2, P, "gpipe", 4)):
    try:
        model = tnt.Model(build("mlp", stages), parallel_strategy=strategy,
                          num_micro_batches=micro_batches, pipeline_schedule=schedule)
        model._tnt.pipeline.describe()
        print(f"CASE {case}: {model._tnt.pipeline.schedule_name}")
    except tnt.TarantellaError as e:
        print(f"CASE {case}: ERROR: {e}")
"""


def test_the_argument_chooses_the_schedule_and_is_checked(tmp_path, python):
    script = tmp_path / "choice.py"
    script.write_text(CHOICE.replace("HERE", repr(os.path.dirname(WORKER))))
    proc = run(mpirun_command(2, python, str(script)), timeout=300,
               env={"TNT_PIPELINE_SCHEDULE": "interleaved"})
    out = proc.stdout
    assert "CASE unknown: ERROR: pipeline_schedule='zigzag' is not a pipeline schedule: use " \
        "one of '1f1b', 'gpipe', 'interleaved', 'zb-h1', 'zb-h2', 'zbv'" in out, out
    assert "or leave it out for TNT_PIPELINE_SCHEDULE's (interleaved here)" in out, out
    assert "CASE replicas: ERROR: the interleaved pipeline schedule runs with " \
        "ParallelStrategy.PIPELINING" in out, out
    assert "(the schedule is pipeline_schedule='interleaved')" in out, out
    assert "CASE ranks: ERROR: the interleaved schedule runs several chunks of the model on " \
        "each rank: num_stages=3 must be a multiple of the 2 ranks" in out, out
    assert "CASE rounds: ERROR: the interleaved schedule runs micro-batches in rounds of " \
        "one per rank: num_micro_batches=3 must be a multiple of the 2 ranks" in out, out
    assert "CASE data: ERROR: pipeline_schedule applies to pipelined models only" in out, out
    # The argument wins over TNT_PIPELINE_SCHEDULE; GPipe's bubble at K = 2,
    # M = 4 is (K - 1) / (M + K - 1) = 0.2.
    assert "CASE chosen: gpipe" in out, out
    assert "[tnt 0/2] INFO: pipeline: 2 stages x 1 replicas, 4 micro-batches per step, " \
        "schedule gpipe (stage 0 holds at most 4 micro-batches' activations; bubble 0.200 " \
        "of a step at best)" in proc.stderr, proc.stderr


ONE_PER_RANK = ["1f1b", "gpipe", "zb-h1", "zb-h2"]
CASES = ["mlp", "seq"]
# Interleaved against 1F1B: the 4 stages on 2 ranks, and on 4.
INTERLEAVED = [f"{case}-4-1-adam-interleaved" for case in CASES] + [
    "mlp-4-1-adam-interleaved+recompute"]
ONE_STAGE_A_RANK = [f"{case}-4-1-adam-1f1b" for case in CASES] + ["mlp-4-1-adam-recompute"]
# ZBV: the 4 stages on 2 ranks in a V, against 1F1B on 4.
ZBV = [f"{case}-4-1-adam-zbv" for case in CASES]
# (ranks, runs): every run of this module, one job per number of ranks.
JOBS = [(2, [f"{case}-2-1-adam-{s}" for case in CASES for s in ONE_PER_RANK] + INTERLEAVED
         + ZBV),
        (3, [f"{case}-3-1-adam-{s}" for case in CASES for s in ONE_PER_RANK]),
        (4, [f"mlp-2-2-adam-{s}" for s in ONE_PER_RANK] + ONE_STAGE_A_RANK)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each run's results on every rank (4 micro-batches), by its name; and
    serial Keras's of the interleaved cases."""
    out = {}
    for ranks, specs in JOBS:
        out.update(pipelined_runs(tmp_path_factory, ranks, specs, "--micro-batches", "4",
                                  timeout=900))
    serial_runs(tmp_path_factory, [(case, 4, "adam") for case in CASES])  # in one process
    return out


def assert_bitwise(results, reference, keys, what):
    assert_ranks_identical(results)
    for key in keys:
        assert np.array_equal(results[0][key], reference[key]), f"{what}: {key} differs"


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_every_schedule_trains_1f1b_weights_bitwise(case, stages, runs):
    one_f_one_b = runs[f"{case}-{stages}-1-adam-1f1b"][0]
    keys = [k for k in one_f_one_b if k.startswith("w")]
    assert len(keys) == 8  # 4 dense layers: kernel and bias
    for schedule in ONE_PER_RANK[1:]:
        assert_bitwise(runs[f"{case}-{stages}-1-adam-{schedule}"], one_f_one_b,
                       keys + ["loss", "metric", "val_loss", "evaluate", "predict"],
                       f"{case}, {stages} stages, {schedule} against 1f1b")


def test_every_schedule_with_replicas(runs):
    """2 replicas of 2 stages (ParallelStrategy.ALL, 4 ranks): each stage's
    gradients, summed in its B or W passes, average over its replicas as
    1F1B's do, under every schedule of one stage per rank."""
    one_f_one_b = runs["mlp-2-2-adam-1f1b"][0]
    for schedule in ONE_PER_RANK[1:]:
        assert_bitwise(runs[f"mlp-2-2-adam-{schedule}"], one_f_one_b,
                       [k for k in one_f_one_b if k.startswith("w")] + ["loss", "predict"],
                       f"{schedule} on 2 replicas")


@pytest.mark.parametrize("interleaved,reference", list(zip(INTERLEAVED, ONE_STAGE_A_RANK)),
                         ids=["mlp", "seq", "mlp-recomputed"])
def test_interleaved_equals_1f1b_bitwise_and_serial(interleaved, reference, runs,
                                                    tmp_path_factory):
    one_f_one_b = runs[reference][0]
    keys = [k for k in one_f_one_b if k.startswith("w")]
    assert len(keys) == 8  # 4 dense layers: kernel and bias
    assert_bitwise(runs[interleaved], one_f_one_b,
                   keys + ["loss", "metric", "val_loss", "evaluate", "predict"],
                   f"{interleaved} (2 ranks) against {reference} (4 ranks)")
    case = interleaved.split("-")[0]
    assert_matches_serial(runs[interleaved][0], serial_run(tmp_path_factory, case, 4, "adam"),
                          interleaved)


@pytest.mark.parametrize("case", CASES)
def test_zbv_equals_1f1b_bitwise(case, runs):
    """ZBV runs the 4 stages on 2 ranks in a V (rank 0: stages 0 and 3,
    rank 1: stages 1 and 2, which hands the activations and gradients
    between them to itself); every stage sums its W passes in micro-batch
    order, as 1F1B's B passes on 4 ranks."""
    one_f_one_b = runs[f"{case}-4-1-adam-1f1b"][0]
    keys = [k for k in one_f_one_b if k.startswith("w")]
    assert len(keys) == 8  # 4 dense layers: kernel and bias
    assert_bitwise(runs[f"{case}-4-1-adam-zbv"], one_f_one_b,
                   keys + ["loss", "metric", "val_loss", "evaluate", "predict"],
                   f"{case}: zbv (2 ranks) against 1f1b (4 ranks)")


def test_timeline_shows_the_interleaved_schedule(tmp_path, python):
    """With TNT_TIMELINE, each rank's trace holds a span per forward and
    backward action of its list, named with the micro-batch and the stage,
    in the list's order."""
    trace = str(tmp_path / "trace.json")
    run(mpirun_command(2, python, WORKER, "mlp", "--out", str(tmp_path / "out"),
                       "--stages", "4", "--micro-batches", "4", "--schedule", "interleaved"),
        timeout=600, env={"TNT_TIMELINE": trace})
    schedule = schedule_lib.training("interleaved", 4, 2, 4)
    for rank in (0, 1):
        want = [f"{'forward' if a.kind == 'F' else 'backward'} {a.micro_batch} of stage "
                f"{a.stage}" for a in schedule.actions[rank] if a.kind in ("F", "B")]
        with open(str(tmp_path / f"trace.rank{rank}.json")) as f:
            events = [e for e in json.load(f) if e.get("cat") == "pipeline"]
        spans = [e["name"] for e in sorted(events, key=lambda e: e["ts"])
                 if e["ph"] == "X" and e["name"].split()[0] in ("forward", "backward")]
        assert spans[:len(want)] == want, f"rank {rank}: {spans[:len(want)]}"


def test_timeline_names_the_weight_passes(tmp_path, python):
    """With TNT_TIMELINE, each rank's trace holds a span per F, B and W of
    its ZB-H1 list ("weight gradients i" for W), in the list's order."""
    trace = str(tmp_path / "trace.json")
    run(mpirun_command(2, python, WORKER, "mlp", "--out", str(tmp_path / "out"),
                       "--stages", "2", "--micro-batches", "4", "--schedule", "zb-h1"),
        timeout=600, env={"TNT_TIMELINE": trace})
    schedule = schedule_lib.training("zb-h1", 2, 2, 4)
    names = {"F": "forward", "B": "backward", "W": "weight gradients"}
    for rank in (0, 1):
        want = [f"{names[a.kind]} {a.micro_batch}" for a in schedule.actions[rank]
                if a.kind in names]
        with open(str(tmp_path / f"trace.rank{rank}.json")) as f:
            events = [e for e in json.load(f) if e.get("cat") == "pipeline"]
        spans = [e["name"] for e in sorted(events, key=lambda e: e["ts"])
                 if e["ph"] == "X" and not e["name"].startswith("recv")]
        assert spans[:len(want)] == want, f"rank {rank}: {spans[:len(want)]}"


def test_zero_bubble_refuses_recomputed_weight_gradients(tmp_path, python):
    script = tmp_path / "recompute.py"
    chosen, recompute = '("chosen", 2, P, "gpipe", 4)', '("recompute", 2, P, "zb-h2", 4)'
    assert chosen in CHOICE
    script.write_text(CHOICE.replace("HERE", repr(os.path.dirname(WORKER))).replace(
        chosen, recompute))
    out = run(mpirun_command(2, python, str(script)), timeout=300,
              env={"TNT_PIPELINE_WEIGHT_GRADIENTS": "recompute"}).stdout
    assert "CASE recompute: ERROR: TNT_PIPELINE_WEIGHT_GRADIENTS=recompute computes a stage's " \
        "weight gradients after its part of the schedule, but the zb-h2 schedule computes " \
        "them in passes of their own (pipeline_schedule='zb-h2'): unset " \
        "TNT_PIPELINE_WEIGHT_GRADIENTS" in out, out
