"""Pipeline schedules chosen with tnt.Model's pipeline_schedule, on ranks.

The argument overrides TNT_PIPELINE_SCHEDULE and is checked when the model
is built: a name that is no schedule, a schedule the layout cannot run, and
the argument on a model that is not pipelined fail with what to change; the
master's log names the schedule and its bubble."""
import os

import pytest

from conftest import mpirun_command, run
from test_pipeline import WORKER

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
        "one of '1f1b', 'gpipe', 'interleaved'" in out, out
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
