"""Oracle tests: training on N ranks equals serial Keras with the same global batch.

For every optimizer the worker trains the same model on the same data from
the same initial weights; 150 samples in global batches of 20 give micro-
batches of unequal size at 3 and 4 ranks and a partial last batch of 10.
"""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "train_worker.py")


def load(out, nranks):
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(nranks)]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("serial"))
    run([sys.executable, WORKER, "--serial", "--out", out])
    return load(out, 1)[0]


def assert_ranks_identical(results):
    for key in results[0]:
        for r, res in enumerate(results[1:], start=1):
            assert np.array_equal(res[key], results[0][key]), \
                f"{key} differs between rank 0 and rank {r}"


def assert_matches_serial(result, serial, tol):
    cases = sorted({k.split("/")[0] for k in result})
    for case in cases:
        got, want = result[f"{case}/loss"], serial[f"{case}/loss"]
        assert np.allclose(got, want, rtol=0, atol=tol), \
            f"{case}: per-epoch loss {got} differs from serial {want} by more than {tol}"
        got, want = result[f"{case}/accuracy"], serial[f"{case}/accuracy"]
        assert np.allclose(got, want, rtol=0, atol=1e-6), \
            f"{case}: per-epoch accuracy {got} differs from serial {want}"


# 4 ranks in make test-long: 1, 2 and 3 cover one rank, even and odd counts
# and uneven micro-batches; the launcher's cluster test trains on 4. Every
# optimizer on 2 ranks; on the others one with momentum and one with
# moments (the averaging an optimizer is given does not depend on it).
def train(out, nranks, python=sys.executable):
    cases = [] if nranks == 2 else ["--cases", "sgd_momentum,adam"]
    run(mpirun_command(nranks, python, WORKER, "--out", out, *cases), timeout=900)
    return load(out, nranks)


_trained = {}


def trained(tmp_path_factory, nranks):
    """The worker's results on `nranks` ranks, trained once a session."""
    if nranks not in _trained:
        _trained[nranks] = train(str(tmp_path_factory.mktemp(f"ranks{nranks}")), nranks)
    return _trained[nranks]


@pytest.mark.parametrize("nranks", [1, 2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_training_equals_serial(nranks, serial, tmp_path_factory):
    results = trained(tmp_path_factory, nranks)
    assert_ranks_identical(results)
    assert_matches_serial(results[0], serial, tol=1e-4)


def test_sequence_model_equals_serial(tmp_path, python):
    # Gradients with no static shape of their own (a tied embedding's, a
    # Dense kernel's on 3-D inputs) are averaged in their variables' shapes.
    cases = ["--model", "sequence", "--cases", "sgd_momentum,adam"]
    run([sys.executable, WORKER, "--serial", "--out", str(tmp_path / "serial"), *cases])
    run(mpirun_command(2, python, WORKER, "--out", str(tmp_path / "ranks"), *cases),
        timeout=900)
    results = load(str(tmp_path / "ranks"), 2)
    assert_ranks_identical(results)
    assert_matches_serial(results[0], load(str(tmp_path / "serial"), 1)[0], tol=1e-4)


def test_two_runs_are_bitwise_identical(tmp_path, tmp_path_factory):
    outs = [trained(tmp_path_factory, 3)[0], train(str(tmp_path), 3)[0]]
    for key in outs[0]:
        assert np.array_equal(outs[0][key], outs[1][key]), f"{key} differs between two runs"


def test_mixed_precision_equals_serial(tmp_path, python):
    serial_out = str(tmp_path / "serial")
    run([sys.executable, WORKER, "--serial", "--mixed", "--cases", "sgd,adam",
         "--out", serial_out])
    out = str(tmp_path / "dist")
    run(mpirun_command(2, python, WORKER, "--mixed", "--cases", "sgd,adam", "--out", out))
    results = load(out, 2)
    assert_ranks_identical(results)
    assert_matches_serial(results[0], load(serial_out, 1)[0], tol=1e-3)


@pytest.mark.parametrize("compression,tol", [("fp16", 1e-3)])
def test_compressed_training_is_close_to_serial(compression, tol, serial, tmp_path, python):
    # Gradients travel in 16 bits: the loss stays close to serial Keras,
    # every rank holds the same weights. (bf16 goes through the same code
    # with the other conversion, which test_core and test_fusion_mpi cover.)
    out = str(tmp_path)
    run(mpirun_command(2, python, WORKER, "--out", out, "--cases", "sgd,adam"),
        env={"TNT_COMPRESSION": compression})
    results = load(out, 2)
    assert_ranks_identical(results)
    for case in ("sgd", "adam"):
        got, want = results[0][f"{case}/loss"], serial[f"{case}/loss"]
        assert np.allclose(got, want, rtol=0, atol=tol), \
            f"{case} with {compression}: loss {got} is not within {tol} of serial {want}"


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_overlap_settings_train_like_serial(overlap, serial, tmp_path, python):
    # TNT_OVERLAP=on reduces buckets during backprop, off holds every bucket
    # until backprop is over (the default, auto, tries both in the first 8
    # steps and keeps the master's faster): the same training as serial
    # Keras either way, identical on every rank.
    out = str(tmp_path)
    run(mpirun_command(2, python, WORKER, "--out", out, "--cases", "sgd,adam"),
        env={"TNT_OVERLAP": overlap})
    results = load(out, 2)
    assert_ranks_identical(results)
    assert_matches_serial(results[0], serial, tol=1e-4)


def test_tuned_fusion_training_equals_serial(serial, tmp_path, python):
    # TNT_FUSION_THRESHOLD_KB=auto and TNT_FUSION_ORDER=readiness: the 16
    # steps of the run cover the 14 rounds of tuning and the 2 of ordering;
    # the plans change while training stays equal to serial Keras and
    # identical on every rank.
    out = str(tmp_path)
    run(mpirun_command(3, python, WORKER, "--out", out, "--cases", "sgd,adam"),
        env={"TNT_FUSION_THRESHOLD_KB": "auto", "TNT_FUSION_ORDER": "readiness"})
    results = load(out, 3)
    assert_ranks_identical(results)
    assert_matches_serial(results[0], serial, tol=1e-4)
