"""Pipeline stages that hold only their own weights.

A model given to tnt.Model as the function that builds it is built without
allocating a weight; each rank allocates its stage's. 2 stages on 2 ranks
(functional), 3 stages on 3 ranks (Sequential), 2 stages x 2 replicas on 4
ranks (functional, ALL): each stage starts bitwise equal to the same
weights of a normal build with the same seed, and training, evaluation,
prediction and the weights at the end are bitwise equal to those of the
same model passed built (both run the same steps on the same initial
values, so there is nothing to round differently). Reading a weight of
another stage raises an error that names the weight and its stage, after
the build and after fit, evaluate, predict and save. Cut by Tarantella
(num_stages), a model given as a function also trains as serial Keras. A
layer that cannot be built without allocating gets an error that names it.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_pipeline import assert_matches_serial
from test_training import assert_ranks_identical, load

WORKER = os.path.join(ROOT, "tests", "python", "pipeline_worker.py")

# (case, stages, replicas, optimizer)
CONFIGS = [
    ("mlp", 2, 1, "sgd"),
    ("seq", 3, 1, "adam"),
    ("cls", 2, 2, "rmsprop"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per configuration: (built by a function, passed built, serial), the
    two pipelined runs in one job, the serial ones in one process."""
    serial = str(tmp_path_factory.mktemp("serial"))
    specs = {config: "-".join(map(str, config)) + "-1f1b" for config in CONFIGS}
    run([sys.executable, WORKER, "--serial", "--build-fn", "--runs", ",".join(specs.values()),
         "--out", serial])
    out = {}
    for config, spec in specs.items():
        d = str(tmp_path_factory.mktemp(spec))
        run(mpirun_command(config[1] * config[2], sys.executable, WORKER, "--runs",
                           f"{spec}+fn,{spec}", "--out", d, "--save", "m.keras"), timeout=600)
        out[config] = tuple(os.path.join(d, s) for s in (f"{spec}+fn", spec)) + (
            os.path.join(serial, spec),)
    return out


IDS = ["-".join(map(str, c)) for c in CONFIGS]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.ranks
def test_built_by_a_function_trains_as_the_model_built_whole(config, runs):
    by_fn, built, serial = runs[config]
    ranks = config[1] * config[2]
    got, want = load(by_fn, ranks), load(built, ranks)
    assert_ranks_identical(got)
    for r in range(ranks):
        assert sorted(got[r]) == sorted(want[r])
        for key in want[r]:
            assert np.array_equal(got[r][key], want[r][key]), f"rank {r}: {key} differs"
    assert_matches_serial(got[0], load(serial, 1)[0], config)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.ranks
def test_each_stage_starts_as_a_normal_build(config, runs):
    by_fn, _, serial = runs[config]
    normal = dict(np.load(os.path.join(serial, "rank0-stage.npz")))
    stages, replicas = config[1], config[2]
    held = set()
    for r in range(stages * replicas):
        mine = {k: v for k, v in np.load(os.path.join(by_fn, f"rank{r}-stage.npz")).items()
                if k.startswith("init/")}
        assert mine, f"rank {r} holds no weight"
        for key, value in mine.items():
            assert np.array_equal(value, normal[key]), f"rank {r}: {key} starts differently"
        if r < stages:
            assert not held & set(mine), f"rank {r} holds weights of another stage"
            held |= set(mine)
    assert held == set(normal), "the stages together do not hold the whole model"


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.ranks
def test_reading_a_weight_of_another_stage_names_it(config, runs):
    by_fn = runs[config][0]
    stages = config[1]
    for r in range(stages):
        said = dict(np.load(os.path.join(by_fn, f"rank{r}-stage.npz")))
        for when in ("build", "fit", "evaluate and predict", "save"):
            message = str(said[f"guard/{when}"])
            assert "belongs to pipeline stage" in message, f"rank {r} after {when}: {message}"
            assert f"which rank {r} does not hold (it holds stage {r} only)" in message, message


@pytest.mark.ranks
def test_cut_by_tarantella_from_a_function(tmp_path):
    """num_stages=2 on a model given as a function: Tarantella times the
    blocks with the model's weights allocated for the while, then each rank
    keeps its stage's, which start as in a normal build; training matches
    serial Keras (the cuts chosen by timing may differ from the SplitLayers
    of the mlp's 2-stage build, so the comparison is with serial Keras)."""
    out = str(tmp_path / "auto")
    run(mpirun_command(2, sys.executable, WORKER, "mlp", "--out", out, "--num-stages", "2",
                       "--optimizer", "sgd", "--build-fn"), timeout=600)
    serial = str(tmp_path / "serial")
    run([sys.executable, WORKER, "mlp", "--serial", "--build-fn", "--out", serial,
         "--num-stages", "2", "--optimizer", "sgd"])
    got = load(out, 2)
    assert_ranks_identical(got)
    assert_matches_serial(got[0], load(serial, 1)[0], "mlp cut by Tarantella")
    normal = dict(np.load(os.path.join(serial, "rank0-stage.npz")))
    for r in range(2):
        said = dict(np.load(os.path.join(out, f"rank{r}-stage.npz")))
        inits = [k for k in said if k.startswith("init/")]
        assert inits and all(np.array_equal(said[k], normal[k]) for k in inits)
        assert "belongs to pipeline stage" in str(said["guard/fit"])


def test_a_layer_that_cannot_be_built_deferred_is_named():
    code = """
import numpy as np, keras, tarantella as tnt
class Table(keras.layers.Layer):
    def build(self, shape):
        self.table = keras.Variable(np.ones((shape[-1], 2), "float32"))
    def call(self, x):
        return x @ self.table
tnt.init()
try:
    tnt.Model(lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(3),
                                        tnt.keras.layers.SplitLayer(), Table(name="lookup")]),
              parallel_strategy=tnt.ParallelStrategy.PIPELINING)
except tnt.TarantellaError as e:
    print("error:", e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "error: layer 'lookup' (Table) cannot be built without allocating its weights" \
        in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "add_weight(shape=..., initializer=...)" in proc.stdout
