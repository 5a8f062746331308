"""Automatic cutting (tnt.Model(model, num_stages=K) on a model without
SplitLayers): the model cut by Tarantella into 2 and 3 stages, and into 2
stages of 2 replicas each (ParallelStrategy.ALL), trains like serial Keras
and every rank holds the same cuts; the cut points found in a
graph; the balancing of given costs; the measurement (a heavy layer gets a
stage of its own, the model's state is left untouched, a model built
without its weights is allocated one block at a time); the errors for a
model that cannot be cut into that many stages and for num_stages with
SplitLayers."""
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

from conftest import ROOT, mpirun_command, run  # noqa: E402
from test_training import assert_ranks_identical, load  # noqa: E402
from test_pipeline import assert_matches_serial  # noqa: E402
from tarantella.pipeline import autocut  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "python", "pipeline_worker.py")


# ------------------------------------------------------------ whole runs

# (stages, replicas): pipelines, and a hybrid of 2 replicas (ALL) on 4 ranks.
SHAPES = [(2, 1), (3, 1), (2, 2)]


@pytest.fixture(scope="module")
def auto_runs(tmp_path_factory):
    """The mlp (three hidden layers, no SplitLayer) cut automatically into
    K stages on K ranks (and on 2K ranks, 2 replicas), and trained
    serially (the model uncut, whatever K)."""
    s = str(tmp_path_factory.mktemp("auto-serial"))
    run([sys.executable, WORKER, "mlp", "--serial", "--out", s, "--num-stages", "2"])
    serial = load(s, 1)[0]
    out = {}
    for k, replicas in SHAPES:
        d = str(tmp_path_factory.mktemp(f"auto{k}x{replicas}"))
        proc = run(mpirun_command(k * replicas, sys.executable, WORKER, "mlp", "--out", d,
                                  "--num-stages", str(k), "--replicas", str(replicas)),
                   timeout=600)
        out[k, replicas] = (load(d, k * replicas), serial, proc.stdout + proc.stderr)
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{k}x{r}" for k, r in SHAPES])
@pytest.mark.ranks
def test_autocut_pipeline_equals_serial(shape, auto_runs):
    results, want, _ = auto_runs[shape]
    assert_matches_serial(results[0], want, "%d stages x %d replicas" % shape)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{k}x{r}" for k, r in SHAPES])
@pytest.mark.ranks
def test_every_rank_gets_the_same_cuts(shape, auto_runs):
    k = shape[0]
    results, _, log = auto_runs[shape]
    cuts = [str(c) for c in results[0]["cuts"]]
    assert len(cuts) == k - 1 and all(c in ("d0", "d1", "d2") for c in cuts), cuts
    assert len(set(cuts)) == k - 1
    for r, res in enumerate(results[1:], start=1):
        assert [str(c) for c in res["cuts"]] == cuts, f"rank {r} cut elsewhere than rank 0"
    assert_ranks_identical(results)
    # The master logs the choice and each stage's measured cost.
    assert "automatic cutting of model 'mlp'" in log, log[-3000:]
    assert log.count("ms per batch of 32") >= k, log[-3000:]


# ------------------------------------------------------------ cut points

def _residual():
    i = keras.Input((8,), name="in")
    h = keras.layers.Dense(8, name="stem")(i)
    for b in range(2):
        y = keras.layers.Dense(8, activation="relu", name=f"r{b}a")(h)
        y = keras.layers.Dense(8, name=f"r{b}b")(y)
        h = keras.layers.Add(name=f"add{b}")([h, y])
    return keras.Model(i, keras.layers.Dense(2, name="out")(h))


def test_candidates_of_a_residual_model():
    """Inside a residual block two tensors are live; after each Add only
    one is. The output layer is never a cut point."""
    assert autocut.candidates(_residual()) == ["stem", "add0", "add1"]


def test_candidates_of_a_sequential_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a"),
                              keras.layers.Dense(4, name="b"), keras.layers.Dense(1, name="c")])
    assert autocut.candidates(model) == ["a", "b"]


def test_candidates_exclude_a_tensor_used_after_the_cut():
    """The input feeds the last layer too: nothing can be cut until it has
    been used; a layer whose output is also a model output is no cut."""
    i = keras.Input((4,))
    a = keras.layers.Dense(4, name="a")(i)
    b = keras.layers.Dense(4, name="b")(a)
    c = keras.layers.Concatenate(name="c")([b, i])
    d = keras.layers.Dense(2, name="d")(c)
    e = keras.layers.Dense(2, name="e")(d)
    assert autocut.candidates(keras.Model(i, e)) == ["c", "d"]
    assert autocut.candidates(keras.Model(i, [d, e])) == ["c"]


# ------------------------------------------------------------ balancing

def test_balance_minimizes_the_largest_stage():
    assert autocut.balance([1, 1, 1, 1], 2) == [1]
    assert autocut.balance([1, 1, 1, 1, 1, 1], 3) == [1, 3]
    assert autocut.balance([5, 1, 1, 1, 1, 1], 2) == [0]
    assert autocut.balance([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [4, 6]  # 15 | 13 | 17
    assert autocut.balance([1, 1, 9, 1, 1], 3) == [1, 2]               # 2 | 9 | 2
    assert autocut.balance([0.5, 3.0, 0.25, 0.25, 2.0], 5) == [0, 1, 2, 3]
    costs = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    for k in range(1, len(costs) + 1):
        cuts = autocut.balance(costs, k)
        bounds = [-1] + cuts + [len(costs) - 1]
        worst = max(sum(costs[a + 1:b + 1]) for a, b in zip(bounds, bounds[1:]))
        assert len(cuts) == k - 1 and cuts == sorted(set(cuts))
        assert worst == _brute_force(costs, k), (k, cuts)


def _brute_force(costs, k):
    from itertools import combinations
    best = None
    for cuts in combinations(range(len(costs) - 1), k - 1):
        bounds = [-1, *cuts, len(costs) - 1]
        worst = max(sum(costs[a + 1:b + 1]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_balance_breaks_ties_by_even_stages_then_the_earliest_cuts():
    assert autocut.balance([1, 1, 1], 2) == [0]
    assert autocut.balance([2, 2, 2, 2, 2], 3) == [0, 2]  # 2 | 4 | 4: the first of three
    assert autocut.balance([4, 1, 1, 1, 1], 3) == [0, 2]  # 4 | 2 | 2, not 4 | 1 | 3
    assert all(autocut.balance([1.0] * 7, 3) == [1, 3] for _ in range(5))


def test_balance_refuses_more_stages_than_blocks():
    with pytest.raises(ValueError):
        autocut.balance([1, 2], 3)


# ------------------------------------------------------------ measurement

def test_a_heavy_layer_gets_a_stage_of_its_own():
    """One wide layer costs far more than the narrow ones around it: the
    measured costs say so, and the 3-stage cut gives it a stage alone."""
    i = keras.Input((512,))
    h = keras.layers.Dense(16, name="n0")(i)
    h = keras.layers.Dense(16, name="n1")(h)
    h = keras.layers.Dense(2048, name="wide_in")(h)
    h = keras.layers.Dense(2048, name="wide")(h)
    h = keras.layers.Dense(16, name="n2")(h)
    h = keras.layers.Dense(16, name="n3")(h)
    model = keras.Model(i, keras.layers.Dense(2, name="out")(h))
    found = autocut.candidates(model)
    assert found == ["n0", "n1", "wide_in", "wide", "n2", "n3"]
    blocks, whole, call = autocut.measure(model, found)
    assert len(blocks) == 7 and whole > 0 and call > 0
    assert blocks[3] > 5 * max(blocks[:3] + blocks[4:]), blocks
    # 'wide' alone in the middle stage (the narrow blocks around it may
    # measure as nothing, so the first cut may come before 'wide_in')
    first, second = [found[j] for j in autocut.balance(blocks, 3)]
    assert second == "wide" and first in ("n0", "n1", "wide_in"), (first, second, blocks)
    # the blocks add up to about the whole model (each less the cost of a call)
    assert 0.5 * whole < sum(blocks) < 2 * whole, (blocks, whole)


def test_measuring_leaves_the_model_as_it_was():
    """BatchNormalization statistics and dropout seeds move when a layer
    runs in training mode; measuring puts them back."""
    i = keras.Input((6,))
    h = keras.layers.Dense(6, name="a")(i)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    model = keras.Model(i, keras.layers.Dense(1, name="out")(h))
    before = [v.numpy().copy() for v in model.variables]
    found = autocut.candidates(model)
    assert found == ["a", "bn", "drop"]
    autocut.measure(model, found)
    for v, b in zip(model.variables, before):
        assert np.array_equal(v.numpy(), b), f"{v.path} changed"


def test_a_model_built_without_its_weights_is_timed_one_block_at_a_time():
    """Given a model built from a function (nothing allocated), measuring
    allocates each block's weights while it times it and frees them after:
    at no tick does the model hold more than its largest block's weights,
    and at the end it holds none (checked through Keras's variables)."""
    from tarantella.pipeline import weights

    def build():
        i = keras.Input((8,))
        h = keras.layers.Dense(64, name="a")(i)
        h = keras.layers.Dense(256, name="b")(h)
        h = keras.layers.Dense(64, name="c")(h)
        return keras.Model(i, keras.layers.Dense(1, name="d")(h))

    model, made = weights.build_deferred(build)
    assert made and weights.allocated_bytes(model.variables) == 0
    found = autocut.candidates(model)
    assert found == ["a", "b", "c"]
    held = []
    blocks, whole, _ = autocut.measure(
        model, found, lambda: held.append(weights.allocated_bytes(model.variables)),
        hold=weights.allocated_meanwhile)
    largest = max(sum(int(np.prod(w.shape)) * 4 for w in model.get_layer(n).weights)
                  for n in ("a", "b", "c", "d"))
    assert len(blocks) == 4 and whole is None
    assert held and max(held) == largest, (held, largest)
    assert weights.allocated_bytes(model.variables) == 0


# ------------------------------------------------------------ errors

ERROR_SCRIPT = r"""
import sys
import keras
import tarantella as tnt
tnt.init()
case = sys.argv[1]
i = keras.Input((4,))
a = keras.layers.Dense(3, name="a")(i)
if case == "uncuttable":
    # every layer feeds the final Concatenate: only after 'a' is one tensor live
    b = keras.layers.Dense(3, name="b")(a)
    c = keras.layers.Dense(3, name="c")(b)
    model, k = keras.Model(i, keras.layers.Concatenate()([a, b, c])), 3
elif case == "branches":
    # two branches from the input: no point at all where one tensor is live
    b = keras.layers.Dense(3, name="b")(i)
    model, k = keras.Model(i, keras.layers.Concatenate()([a, b])), 2
else:
    out = keras.layers.Dense(2)(tnt.keras.layers.SplitLayer()(a))
    model, k = keras.Model(i, out), 2
try:
    tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_stages=k)
except tnt.TarantellaError as e:
    print("ERROR:", e)
    sys.exit(3)
print("no error")
"""

ERRORS = {
    "uncuttable": "at most 2 stages are possible: pass num_stages=2 or less",
    "branches": "it cannot be cut automatically at all",
    "with_split_layers": "either place the cuts (SplitLayers) or let Tarantella choose them",
}


@pytest.mark.parametrize("case", sorted(ERRORS))
@pytest.mark.ranks
def test_autocut_errors(case, tmp_path, python):
    script = tmp_path / "bad.py"
    script.write_text(ERROR_SCRIPT)
    nranks = 3 if case == "uncuttable" else 2
    proc = subprocess.run(mpirun_command(nranks, python, str(script), case),
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{case}: no error\n{out[-2000:]}"
    assert ERRORS[case] in out, f"{case}: the error does not say {ERRORS[case]!r}\n{out[-3000:]}"
    if case != "with_split_layers":
        assert "SplitLayer" in out


LONG_SCRIPT = r"""
import sys, time
import keras
import numpy as np
import tarantella as tnt
from tarantella.pipeline import autocut
tnt.init()
# the master measures for 8 s, more than twice TNT_TIMEOUT_S (3 s)
autocut.BUDGET_S, autocut.MAX_REPEATS = 8.0, 10 ** 9
i = keras.Input((6,))
h = keras.layers.Dense(8, name="a")(i)
h = keras.layers.Dense(8, name="b")(h)
model = keras.Model(i, keras.layers.Dense(1, name="c")(h))
t0 = time.monotonic()
m = tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_stages=2)
took = time.monotonic() - t0
cuts = m._tnt.pipeline.partition.cut_names
np.save(sys.argv[1] + f"/rank{tnt.get_rank()}.npy", np.array([took]))
print("cuts", cuts, "took", took)
"""


@pytest.mark.ranks
def test_a_long_measurement_does_not_time_out_the_other_ranks(tmp_path, python):
    """While the master measures (here 8 s), the other ranks wait in a
    broadcast bounded by TNT_TIMEOUT_S (here 3 s): the master's heartbeats
    keep them waiting."""
    script = tmp_path / "long.py"
    script.write_text(LONG_SCRIPT)
    run(mpirun_command(2, python, str(script), str(tmp_path)), timeout=300,
        env={"TNT_TIMEOUT_S": "3"})
    for r in range(2):
        assert np.load(str(tmp_path / f"rank{r}.npy"))[0] > 8.0
