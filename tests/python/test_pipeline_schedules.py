"""Pipeline schedules chosen with tnt.Model's pipeline_schedule, on ranks.

Every schedule with one stage per rank (GPipe, ZB-H1, ZB-H2) trains the
weights of 1F1B bitwise, on 2 and 3 stages, a functional and a Sequential
model, and ZB-H1 on 2 replicas of 2 stages: each stage adds its
micro-batches' weight gradients in the same order, from the same ops; the
zero-bubble schedules compute them in W passes of their own, which the
timeline names. (Interleaved 1F1B against 1F1B:
test_pipeline_interleaved.py.)

The argument overrides TNT_PIPELINE_SCHEDULE and is checked when the model
is built: a name that is no schedule, a schedule the layout cannot run, and
the argument on a model that is not pipelined fail with what to change; the
master's log names the schedule and its bubble."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import mpirun_command, run
from test_pipeline import WORKER
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

CHOICE = """
import sys
sys.path.insert(0, HERE)
import tarantella as tnt
from pipeline_worker import build
tnt.init()
P, A, D = tnt.ParallelStrategy.PIPELINING, tnt.ParallelStrategy.ALL, tnt.ParallelStrategy.DATA
for case, stages, strategy, schedule in (("unknown", 2, P, "zigzag"),
                                         ("replicas", 4, A, "interleaved"),
                                         ("ranks", 3, P, "interleaved"),
                                         ("data", 2, D, "gpipe"),
                                         ("chosen", 2, P, "gpipe")):
    try:
        model = tnt.Model(build("mlp", stages), parallel_strategy=strategy,
                          num_micro_batches=None if strategy == D else 4,
                          pipeline_schedule=schedule)
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
        "one of '1f1b', 'gpipe', 'interleaved', 'zb-h1', 'zb-h2'" in out, out
    assert "or leave it out for TNT_PIPELINE_SCHEDULE's (interleaved here)" in out, out
    assert "CASE replicas: ERROR: the interleaved pipeline schedule runs with " \
        "ParallelStrategy.PIPELINING" in out, out
    assert "(the schedule is pipeline_schedule='interleaved')" in out, out
    assert "CASE ranks: ERROR: the interleaved schedule runs several chunks of the model on " \
        "each rank: num_stages=3 must be a multiple of the 2 ranks" in out, out
    assert "CASE data: ERROR: pipeline_schedule applies to pipelined models only" in out, out
    # The argument wins over TNT_PIPELINE_SCHEDULE; GPipe's bubble at K = 2,
    # M = 4 is (K - 1) / (M + K - 1) = 0.2.
    assert "CASE chosen: gpipe" in out, out
    assert "[tnt 0/2] INFO: pipeline: 2 stages x 1 replicas, 4 micro-batches per step, " \
        "schedule gpipe (stage 0 holds at most 4 micro-batches' activations; bubble 0.200 " \
        "of a step at best)" in proc.stderr, proc.stderr


def pipelined(tmp_path_factory, case, stages, schedules, replicas=1):
    """Each schedule's results on every rank, trained one after another in
    one job."""
    d = str(tmp_path_factory.mktemp(f"{case}-{stages}x{replicas}"))
    specs = [f"{case}-{stages}-{replicas}-adam-{s}" for s in schedules]
    run(mpirun_command(stages * replicas, sys.executable, WORKER, "--runs", ",".join(specs),
                       "--out", d, "--micro-batches", "4"),
        timeout=600)
    return {s: load(os.path.join(d, spec), stages * replicas)
            for s, spec in zip(schedules, specs)}


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("case", ["mlp", "seq"])
def test_every_schedule_trains_1f1b_weights_bitwise(case, stages, tmp_path_factory):
    runs = pipelined(tmp_path_factory, case, stages, ["1f1b", "gpipe", "zb-h1", "zb-h2"])
    one_f_one_b = runs["1f1b"][0]
    keys = [k for k in one_f_one_b if k.startswith("w")]
    assert len(keys) == 8  # 4 dense layers: kernel and bias
    for schedule in ("gpipe", "zb-h1", "zb-h2"):
        results = runs[schedule]
        assert_ranks_identical(results)
        for key in keys + ["loss", "metric", "val_loss", "evaluate", "predict"]:
            assert np.array_equal(results[0][key], one_f_one_b[key]), \
                f"{case}, {stages} stages: {key} differs between {schedule} and 1f1b"


def test_zero_bubble_with_replicas(tmp_path_factory):
    """2 replicas of 2 stages (ParallelStrategy.ALL, 4 ranks): each stage's
    gradients, summed in its W passes, average over its replicas as
    1F1B's do."""
    runs = pipelined(tmp_path_factory, "mlp", 2, ["1f1b", "zb-h1"], replicas=2)
    one_f_one_b, results = runs["1f1b"][0], runs["zb-h1"]
    assert_ranks_identical(results)
    for key in [k for k in one_f_one_b if k.startswith("w")] + ["loss", "predict"]:
        assert np.array_equal(results[0][key], one_f_one_b[key]), key


def test_timeline_names_the_weight_passes(tmp_path, python):
    """With TNT_TIMELINE, each rank's trace holds a span per F, B and W of
    its ZB-H1 list ("weight gradients i" for W), in the list's order."""
    from tarantella.pipeline import schedule as schedule_lib
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
    script.write_text(CHOICE.replace("HERE", repr(os.path.dirname(WORKER))).replace(
        '("chosen", 2, P, "gpipe")', '("recompute", 2, P, "zb-h2")'))
    out = run(mpirun_command(2, python, str(script)), timeout=300,
              env={"TNT_PIPELINE_WEIGHT_GRADIENTS": "recompute"}).stdout
    assert "CASE recompute: ERROR: TNT_PIPELINE_WEIGHT_GRADIENTS=recompute computes a stage's " \
        "weight gradients after its part of the schedule, but the zb-h2 schedule computes " \
        "them in passes of their own (pipeline_schedule='zb-h2'): unset " \
        "TNT_PIPELINE_WEIGHT_GRADIENTS" in out, out
