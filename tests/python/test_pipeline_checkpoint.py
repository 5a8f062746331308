"""Checkpoints of a pipelined model that no rank gathers whole.

A model built by a function trains one epoch on K stages (3, with 1F1B or
ZB-H1; 2 with ZB-H2; 4 on 2 ranks with the interleaved schedule and with ZBV; 4 in the
long test) and
saves a sharded
checkpoint (a shard per stage), a .weights.h5 file and a .keras file, the
master writing each from the stages' values streamed to it
(checkpoint_worker.py). Plain Keras, in one process, loads each into the
model built whole: the weights are those of the pipeline bitwise (copied,
never computed), and its predictions are within 1e-5 of the pipeline's.
Loaded on 2 stages cut elsewhere (by tnt.models.load_model from the .keras
file, and by load_weights from the sharded one), one more epoch gives the
weights of one more epoch of the uninterrupted model. After the saves and
the loads, reading any weight of another stage raises on every rank: none
is allocated there.

Tolerances. Predictions: plain Keras computes each output from the same
float32 weights in other batch shapes and graphs than the pipeline (whose
stages run separately), so each of the 4 layers may round its 8- or
16-term dot products differently: about 16 * 2**-24 relative per layer, on
values of magnitude <= 4 (tanh outputs times weights of magnitude < 1
summed), 4 layers: 4 * 16 * 4 * 6e-8 = 1.5e-5 at the very worst, 1e-5 with
the usual cancellation; the outputs are of magnitude ~1. Weights after one
more epoch: both runs make the same 4 Adam steps (learning rate 0.01) from
the same state; Adam moves a weight by at most the learning rate times
m / sqrt(v), which a relative gradient difference d changes by about d;
gradients computed with other cuts differ by rounding only (d <= 1e-4,
generously), so 4 * 0.01 * 1e-4 = 4e-6 < 1e-5.
"""
import json
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run

WORKER = os.path.join(ROOT, "tests", "python", "checkpoint_worker.py")
FILES = ("ckpt.weights.json", "one.weights.h5", "model.keras")
STEPS = 4  # 96 samples in global batches of 24 (checkpoint_worker.py)


def ranks(stages, schedule):
    """The ranks that run `stages` stages: one each, or two each when
    interleaved or in a V (ZBV)."""
    return stages // 2 if schedule in ("interleaved", "zbv") else stages


def round_trip(d, case, stages, resume_stages, schedule):
    run(mpirun_command(ranks(stages, schedule), sys.executable, WORKER, "save", case, "--dir",
                       d, "--stages", str(stages)), env={"TNT_PIPELINE_SCHEDULE": schedule})
    run([sys.executable, WORKER, "keras", case, "--dir", d])
    run(mpirun_command(resume_stages, sys.executable, WORKER, "resume", case, "--dir", d,
                       "--stages", str(resume_stages)))
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(case, stages, resume_stages, schedule):
        key = (case, stages, resume_stages, schedule)
        if key not in cache:
            d = str(tmp_path_factory.mktemp(f"{case}-{stages}-{resume_stages}-{schedule}"))
            cache[key] = round_trip(d, *key)
        return cache[key]
    return get


# (model, stages saved, stages loaded, schedule of the save): interleaved
# and ZBV, 2 ranks hold 4 stages, two each, and still write a shard per stage.
CASES = [("functional", 3, 2, "1f1b"), ("sequential", 3, 2, "zb-h1"),
         ("functional", 2, 3, "zb-h2"),
         ("sequential", 4, 2, "interleaved"), ("functional", 4, 2, "zbv"),
         pytest.param("functional", 4, 2, "1f1b", marks=pytest.mark.long)]


def check_round_trip(d, stages, resume_stages):
    saved, keras_ = np.load(os.path.join(d, "save.npz")), np.load(os.path.join(d, "keras.npz"))
    paths = [k[2:] for k in saved if k.startswith("w/")]
    for name in FILES:
        for p in paths:
            assert np.array_equal(keras_[f"{name}/w/{p}"], saved[f"w/{p}"]), f"{name}: {p}"
        diff = np.abs(keras_[f"{name}/predict"] - saved["predict"]).max()
        assert diff <= 1e-5, f"plain Keras's predictions from {name} differ by {diff}"
        # Adam: iterations, learning rate, then m and v of each of the 8 weights.
        opt = [keras_[f"{name}/opt/{i}"] for i in range(2 + 2 * len(paths))]
        assert f"{name}/opt/{2 + 2 * len(paths)}" not in keras_
        assert int(opt[0]) == STEPS
        assert all(np.any(v != 0) for v in opt[2:]), f"{name}: an optimizer slot is empty"
        for i, v in enumerate(opt):
            assert np.array_equal(v, keras_[f"{FILES[0]}/opt/{i}"]), f"{name}: opt/{i}"
    with open(os.path.join(d, FILES[0])) as f:
        weight_map = json.load(f)["weight_map"]
    shards = {n for v in weight_map.values() for n in ([v] if isinstance(v, str) else v)}
    assert shards == {f"ckpt_{s:05}.weights.h5" for s in range(stages)}
    assert len(weight_map["/optimizer/vars"]) == stages  # each stage's slots in its shard

    resumed = np.load(os.path.join(d, "resume.npz"))
    assert len(resumed["cuts"]) == resume_stages - 1
    for via in ("keras", "json"):
        for p in paths:
            diff = np.abs(resumed[f"{via}/{p}"] - saved[f"after/{p}"]).max()
            assert diff <= 1e-5, f"resumed from {via}: {p} differs by {diff}"
            assert not np.array_equal(saved[f"after/{p}"], saved[f"w/{p}"])  # it trained


@pytest.mark.parametrize("case,stages,resume_stages,schedule", CASES)
@pytest.mark.ranks
def test_round_trip_through_plain_keras_and_other_cuts(runs, case, stages, resume_stages,
                                                       schedule):
    check_round_trip(runs(case, stages, resume_stages, schedule), stages, resume_stages)


@pytest.mark.parametrize("case,stages,resume_stages,schedule", CASES[:1])
@pytest.mark.ranks
def test_bad_file_names_and_overwrite_get_clear_errors_on_every_rank(runs, case, stages,
                                                                     resume_stages, schedule):
    d = runs(case, stages, resume_stages, schedule)
    for r in range(ranks(stages, schedule)):
        with open(os.path.join(d, f"errors-{r}.txt")) as f:
            name, overwrite = f.read().split("\n")
        assert "w.h5" in name and ".weights.h5" in name and ".weights.json" in name, name
        assert "exists and overwrite=False" in overwrite, overwrite


@pytest.mark.parametrize("case,stages,resume_stages,schedule", CASES)
@pytest.mark.ranks
def test_no_rank_holds_another_stage_after_save_and_load(runs, case, stages, resume_stages,
                                                         schedule):
    d = runs(case, stages, resume_stages, schedule)
    for what, count in (("save", ranks(stages, schedule)), ("resume", resume_stages)):
        for r in range(count):
            with open(os.path.join(d, f"guard-{what}-{r}.txt")) as f:
                text = f.read()
            assert "read:" not in text, f"rank {r} after {what}: {text}"
            assert all(int(n) > 0 for n in text.split()[1::2]), f"rank {r}: {text}"


def h5_datasets(source):
    """Every dataset of an h5 file (a path, or a file object), by its path."""
    import h5py
    out = {}
    with h5py.File(source, "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, item[()])
                     if isinstance(item, h5py.Dataset) else None)
    return out


def keras_archive(path):
    """A .keras file's config and weights."""
    import zipfile
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        with archive.open("model.weights.h5") as f:
            return config, h5_datasets(f)


def assert_same_datasets(a, b, what):
    assert a.keys() == b.keys(), what
    for name in a:
        assert np.array_equal(a[name], b[name]), f"{what}: {name}"


@pytest.mark.ranks
def test_model_checkpoint_writes_what_save_writes_without_gathering(tmp_path):
    """ModelCheckpoint on 2 stages (the whole model, its best weights, its
    weights every 2 batches) writes through the collective save: its files
    equal those that save and save_weights write after the same epoch, bit
    for bit, and no rank held the whole model or could read a weight of
    another stage while the checkpoints were written."""
    d, stages = str(tmp_path), 2
    run(mpirun_command(stages, sys.executable, WORKER, "callback", "functional", "--dir", d,
                       "--stages", str(stages)))
    config, direct = keras_archive(os.path.join(d, "direct.keras"))
    saved_config, saved = keras_archive(os.path.join(d, "callback.keras"))
    assert saved_config == config
    assert_same_datasets(saved, direct, "callback.keras")
    assert any(k.startswith("optimizer/") for k in direct)  # the optimizer's state too
    weights = h5_datasets(os.path.join(d, "direct.weights.h5"))
    # 96 samples in batches of 24: saved after batches 2 and 4, the last
    # one at the epoch's end.
    assert sorted(n for n in os.listdir(d) if n.startswith("callback-batch")) == [
        "callback-batch2.weights.h5", "callback-batch4.weights.h5"]
    for name in ("callback-best.weights.h5", "callback-batch4.weights.h5"):
        assert_same_datasets(h5_datasets(os.path.join(d, name)), weights, name)
    assert not all(np.array_equal(a, b) for a, b in zip(
        h5_datasets(os.path.join(d, "callback-batch2.weights.h5")).values(), weights.values()))
    for r in range(stages):
        with open(os.path.join(d, f"guard-callback-{r}.txt")) as f:
            lines = f.read().splitlines()
        assert len(lines) == STEPS + 1, lines
        for line in lines:
            assert "whole 0, refused:" in line and int(line.split()[-1]) > 0, f"rank {r}: {line}"


OPTIMIZERS = {
    "sgd-momentum": lambda k: k.optimizers.SGD(momentum=0.9),
    "adam": lambda k: k.optimizers.Adam(),
    "adam-amsgrad": lambda k: k.optimizers.Adam(amsgrad=True),
    "adamw": lambda k: k.optimizers.AdamW(),
    "adafactor": lambda k: k.optimizers.Adafactor(),
    "rmsprop-centered-momentum": lambda k: k.optimizers.RMSprop(momentum=0.5, centered=True),
    "adagrad": lambda k: k.optimizers.Adagrad(),
    "adadelta": lambda k: k.optimizers.Adadelta(),
    "adamax": lambda k: k.optimizers.Adamax(),
    "nadam": lambda k: k.optimizers.Nadam(),
    "ftrl": lambda k: k.optimizers.Ftrl(),
    "lion": lambda k: k.optimizers.Lion(),
    "lamb": lambda k: k.optimizers.Lamb(),
    "loss-scale-adam": lambda k: k.optimizers.LossScaleOptimizer(k.optimizers.Adam()),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_maps_to_each_weight(name):
    """The map from an optimizer's variables to the model's weights (which
    a stage's slots go where in the whole model's file) agrees with the
    optimizer built over the real weights: each slot is named after its
    weight (its path, or its name for Adafactor) and shaped from it, and
    the optimizer's own variables (iterations, ...) are those named after
    no weight."""
    import keras
    from tarantella import _keras_internals as internals
    inputs = keras.Input((3, 5))
    h = keras.layers.Dense(4, name="first")(inputs)
    h = keras.layers.Conv1D(2, 2, name="conv")(h)
    model = keras.Model(inputs, keras.layers.Dense(1, name="last")(h))
    weights = model.trainable_variables
    optimizer = OPTIMIZERS[name](keras)
    optimizer.build(weights)
    _, layout = internals.optimizer_layout(optimizer, weights)
    assert len(layout) == len(optimizer.variables)
    slots = {}
    for (i, k), v in zip(layout, optimizer.variables):
        if i is None:
            assert not any(w.path.replace("/", "_") in v.name for w in weights), v.name
            continue
        w = weights[i]
        assert w.path.replace("/", "_") in v.name or v.name == w.name, (v.name, w.path)
        assert len(v.shape) <= len(w.shape) and all(d in w.shape for d in v.shape)
        assert k == slots.get(i, 0)
        slots[i] = k + 1
    assert sorted(slots) == list(range(len(weights)))  # every weight has state
