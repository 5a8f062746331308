"""Checkpoints of models whose optimizer state is sharded (zero_stage 1 to
3; at stage 3 the weights too).

The files hold the optimizer's state (and the weights) whole, as plain
data parallelism writes it: every rank streams its parts of each slot (and
at stage 3 of each weight) to the master, in
pieces (of 64 bytes here, which cut across the ranks' parts), and the
master writes the file. So plain Keras loads save's, save_weights' and
ModelCheckpoint's files of a stage-2 or stage-3 run and gets the weights and the
optimizer variables that a stage-0 run saves, bit for bit (also under
mixed precision, whose LossScaleOptimizer holds an inner optimizer).

Loading gives each rank its part of every slot, whatever the stage and the
number of ranks of the run that wrote the file. Stages 1 to 3 compute
what stage 0 computes bit for bit (test_zero.py), so every comparison
below is bitwise: one more epoch from a checkpoint equals one more epoch
of the uninterrupted run (2 ranks: save, load_model, load_weights at other
stages); from a file written on 3 ranks at stage 2, one more epoch on 2
ranks at stage 1, 2 or 3 equals one at stage 0 from the same file; a
BackupAndRestore backup restores the same way (a fit at stage 2 or 3
interrupted by an exception, then resumed, ends as the uninterrupted run;
a backup taken on 3 ranks resumes on 2 at stages 2 and 3 as at stage 0). The
same holds for a pipelined model (ParallelStrategy.ALL, 2 stages x 2
replicas) whose stages' replicas share their state. See
zero_checkpoint_worker.py.
"""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_zero import adafactor_bound

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "zero_checkpoint_worker.py")
STEPS = 6  # an epoch: 120 samples in global batches of 20


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """The files and results of every run of the worker."""
    d = str(tmp_path_factory.mktemp("zero-checkpoints"))
    run(mpirun_command(3, sys.executable, WORKER, "save3", "--dir", d))
    run(mpirun_command(2, sys.executable, WORKER, "main", "--dir", d))
    run(mpirun_command(4, sys.executable, WORKER, "hybrid", "--dir", d))
    run([sys.executable, WORKER, "keras", "--dir", d])
    return d


@pytest.fixture(scope="module")
def runs(directory):
    ranks = [dict(np.load(os.path.join(directory, f"rank{r}.npz"))) for r in range(2)]
    return dict(np.load(os.path.join(directory, "keras.npz"))), ranks


@pytest.fixture(scope="module")
def hybrid(directory):
    """The 4 ranks' results of the pipelined model (2 stages x 2 replicas)."""
    return [dict(np.load(os.path.join(directory, f"hybrid{r}.npz"))) for r in range(4)]


def values(result, prefix):
    """The arrays `prefix`/0, `prefix`/1, ... of a result."""
    keys = [k for k in result if k.rsplit("/", 1)[0] == prefix]
    return [result[k] for k in sorted(keys, key=lambda k: int(k.rsplit("/", 1)[1]))]


def assert_bitwise(got, want, what):
    assert got and len(got) == len(want), f"{what}: {len(got)} arrays, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: array {i}"
        assert np.array_equal(g, w), \
            f"{what}: array {i} differs by up to {np.max(np.abs(g - w))}"


@pytest.mark.parametrize("name,stage_zero", [
    ("z2.keras", "z0.keras"), ("callback-z2.keras", "z0.keras"),
    ("z2.weights.h5", "z0.weights.h5"), ("z2.weights.json", "z0.weights.h5"),
    ("mixed-z2.keras", "mixed-z0.keras"),
    # Stage 3, whose weights are in parts too.
    ("z3.keras", "z0.keras"), ("callback-z3.keras", "z0.keras"),
    ("z3.weights.h5", "z0.weights.h5"), ("z3.weights.json", "z0.weights.h5"),
    ("mixed-z3.keras", "mixed-z0.keras"),
    # A pipelined model's stages whose replicas share the state.
    ("hz2.keras", "hz0.keras"), ("hz2.weights.h5", "hz0.weights.h5"),
    ("hz2.weights.json", "hz0.weights.h5")])
def test_plain_keras_loads_the_state_that_stage_zero_saves(runs, name, stage_zero):
    keras_, _ = runs
    for what in ("w", "opt"):
        assert_bitwise(values(keras_, f"{name}/{what}"), values(keras_, f"{stage_zero}/{what}"),
                       f"{name} against {stage_zero}, {what}")
    optimizer = values(keras_, f"{name}/opt")
    # Adam: iterations, learning rate, m and v of each of the 6 weights (a
    # LossScaleOptimizer's own 4 variables first).
    assert len(optimizer) == 2 + 2 * 6 + (4 if name.startswith("mixed") else 0)
    assert int(optimizer[-14]) == STEPS
    assert all(np.any(v != 0) for v in optimizer[-12:]), f"{name}: an empty slot"


@pytest.mark.parametrize("resumed", ["keras-z2", "keras-z0", "h5-z1", "json-z2", "keras3-z3",
                                     "keras3-z0", "keras0-z3", "h5-z3", "json-z3"])
def test_one_more_epoch_from_a_checkpoint_is_that_of_the_uninterrupted_run(runs, resumed):
    """keras-z2 and keras-z0: load_model at stage 2 from stage 2's and
    stage 0's .keras (keras3-*: at stage 3; keras0-z3: stage 3's file at
    stage 0); h5-z1 and json-z2: load_weights into a model of other initial
    weights, at stage 1 from .weights.h5 and at stage 2 from .weights.json
    (h5-z3, json-z3: stage 3's files at stage 3); then one epoch."""
    _, ranks = runs
    for r, result in enumerate(ranks):
        assert int(result[f"iterations-{resumed}"]) == STEPS
        for uninterrupted in ("z2", "z3", "z0"):
            assert_bitwise(values(result, resumed), values(result, uninterrupted),
                           f"rank {r}: {resumed} against {uninterrupted}")


def test_stage_3_loads_batch_normalization_beside_the_parts(runs):
    """load_model at stage 3 allocates the non-trainable variables (moving
    statistics) a variable at a time and loads them, and the parts: one
    more epoch equals the saved model's."""
    _, ranks = runs
    for r, result in enumerate(ranks):
        assert int(result["iterations-norm-loaded"]) == STEPS
        assert_bitwise(values(result, "norm-loaded"), values(result, "norm"), f"rank {r}")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_checkpoint_of_3_ranks_resumes_on_2_at_every_stage(runs, stage):
    _, ranks = runs
    for r, result in enumerate(ranks):
        assert_bitwise(values(result, f"from3-z{stage}"), values(result, "from3-z0"),
                       f"rank {r}: stage {stage} from 3 ranks' file")


def test_backup_and_restore_resumes_an_interrupted_fit_bitwise(runs):
    _, ranks = runs
    for r, result in enumerate(ranks):
        for stage in (2, 3):
            assert_bitwise(values(result, f"backup-z{stage}"), values(result, f"z{stage}"),
                           f"rank {r}: resumed at stage {stage}")
            assert_bitwise(values(result, f"backup3-z{stage}"), values(result, "backup3-z0"),
                           f"rank {r}: a backup of 3 ranks resumed on 2 at stage {stage}")


def test_adafactor_writes_its_whole_moments_and_its_parts(directory, runs):
    """Adafactor at stage 2 on 3 ranks: every rank holds the factored
    moments of a kernel (a mean per row and per column) whole, and its part
    of every other slot. Plain Keras reads from the saved file each rank's
    whole moments and the parts put together, bit for bit; one more epoch
    of the model load_model reads at stage 2 equals that of the
    uninterrupted run."""
    keras_, _ = runs
    ranks = [dict(np.load(os.path.join(directory, f"adafactor{r}.npz"))) for r in range(3)]
    saved = values(keras_, "af-z2.keras/opt")
    states = [values(result, "af-state") for result in ranks]
    assert saved and all(len(state) == len(saved) for state in states)
    kinds = set()
    for i, whole in enumerate(saved):
        held = [state[i] for state in states]
        if all(h.shape == whole.shape for h in held):  # whole on every rank
            kinds.add("whole" if whole.ndim else "scalar")
            for r, h in enumerate(held):
                assert np.array_equal(h, whole), f"variable {i}: rank {r}'s differs from the file"
        else:
            kinds.add("parts")
            assert np.array_equal(np.concatenate(held), whole.reshape(-1)), f"variable {i}"
    assert kinds == {"scalar", "whole", "parts"}, kinds
    for r, result in enumerate(ranks):
        assert int(result["iterations-af-loaded"]) == STEPS
        assert_bitwise(values(result, "af-loaded"), values(result, "af-z2"), f"rank {r}")
    # On 2 ranks, one more epoch at stage 2 from the file equals one at stage
    # 0 within the rounding of test_zero.py's bound (an epoch of 6 steps).
    _, two = runs
    for r, result in enumerate(two):
        want = values(result, "af-from3-z0")
        got = values(result, "af-from3-z2")
        bound = adafactor_bound(want, steps=STEPS)
        assert len(got) == len(want) == 6, r
        for g, w in zip(got, want):
            assert np.max(np.abs(g - w)) <= bound, (r, np.max(np.abs(g - w)), bound)


def test_a_save_from_the_master_alone_is_refused(runs):
    _, ranks = runs
    for result in ranks:
        message = str(result["alone"])
        assert "one rank alone" in message and "let the callback run on every rank" in message


def test_a_pipeline_whose_replicas_share_the_state_resumes_bitwise(hybrid):
    """ParallelStrategy.ALL, 2 stages x 2 replicas at stage 2: each stage's
    slots are put together from its replicas' parts when saved, and cut
    into them when loaded. One more epoch from save's .keras (of stage 2
    and of stage 0), from save_weights' .weights.h5 (at stage 2) and
    .weights.json (at stage 1), and the interrupted fit resumed from its
    BackupAndRestore backup (a file per stage) all end as the
    uninterrupted run at stage 2 and at stage 0, on every rank."""
    for r, result in enumerate(hybrid):
        assert_bitwise(values(result, "hz2"), values(result, "hz0"), f"rank {r}: hz2")
        for resumed in ("hkeras-z2", "hkeras-z0", "hh5-z2", "hjson-z1"):
            assert int(result[f"iterations-{resumed}"]) == STEPS
        for resumed in ("hkeras-z2", "hkeras-z0", "hh5-z2", "hjson-z1", "hbackup-z2"):
            assert_bitwise(values(result, resumed), values(result, "hz2"),
                           f"rank {r}: {resumed} against the uninterrupted run")
