"""The size of a pipelined model's traced step against its micro-batches.

The mlp of pipeline_worker.py, 2 stages on 2 ranks, 1F1B: after a step
that builds its state, each rank traces the model's train step once more,
on the same global batch split into 4 and into 16 micro-batches, and
counts the ops of the step's graph and of every function it calls. A step
whose graph holds every micro-batch's passes grows with M: that is the
step as it is traced today (each micro-batch's passes unrolled), marked
as expected to fail until the step's graph no longer depends on M (in
make test-long: it guards nothing yet)."""
import os
import re

import pytest

from conftest import mpirun_command, run
from test_pipeline import WORKER

pytestmark = [pytest.mark.ranks, pytest.mark.long]

COUNT = """
import sys
sys.path.insert(0, HERE)
import tensorflow as tf
import tarantella as tnt
from pipeline_worker import build, compile_model, data
tnt.init()
x, y = data("mlp")
batch = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(32)
for m in (4, 16):
    model = tnt.Model(build("mlp", 2), parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                      num_micro_batches=m, pipeline_schedule="1f1b")
    compile_model(model, "mlp", "sgd")
    model.fit(batch, verbose=0)  # builds the optimizer and the metrics
    step = tf.function(model.train_step, autograph=False).get_concrete_function(
        batch.element_spec)
    graph = step.graph.as_graph_def()
    ops = len(graph.node) + sum(len(f.node_def) for f in graph.library.function)
    print(f"RANK {tnt.get_rank()} M={m}: {ops} ops")
"""


def op_counts(out):
    """{(rank, M): ops} from the ranks' lines."""
    return {(int(rank), int(m)): int(ops)
            for rank, m, ops in re.findall(r"RANK (\d+) M=(\d+): (\d+) ops", out)}


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="the traced step holds every micro-batch's passes")
def test_the_traced_step_does_not_grow_with_the_micro_batches(tmp_path, python):
    script = tmp_path / "count.py"
    script.write_text(COUNT.replace("HERE", repr(os.path.dirname(WORKER))))
    out = run(mpirun_command(2, python, str(script)), timeout=300).stdout
    counts = op_counts(out)
    assert set(counts) == {(r, m) for r in (0, 1) for m in (4, 16)}, out
    for rank in (0, 1):
        assert counts[(rank, 16)] <= counts[(rank, 4)], counts
