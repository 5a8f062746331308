"""tnt.Model is a keras.Model; Keras internals are named; the Keras backend
is checked; a failing master-only callback ends fit on every rank."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, mpirun_command, run

WORKER = os.path.join(ROOT, "tests", "python", "keras_native_worker.py")


def lines(proc):
    return proc.stdout.splitlines()


def test_tnt_model_is_a_keras_model_and_saves_plain_keras_files(tmp_path):
    out = lines(run([sys.executable, WORKER, "api", str(tmp_path)]))
    # tnt.Model(km) is a new model over km's layers; km stays a plain Keras model.
    for expected in ("same object False", "user model unchanged True",
                     "isinstance keras.Model True", "isinstance tnt.Model True",
                     "class Functional", "sequential True", "subclassed True",
                     "plot_model True", "callback model True"):
        assert expected in out, f"{expected!r} not in {out}"
    loaded = lines(run([sys.executable, WORKER, "plain_load", str(tmp_path)]))
    for expected in ("loaded class Functional keras.src.models.functional",
                     "loaded optimizer SGD keras.src.optimizers.sgd",
                     "same predictions True", "weights load True",
                     "tarantella imported False"):
        assert expected in loaded, f"{expected!r} not in {loaded}"


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_other_keras_backends_get_a_clear_error(backend):
    code = "import tarantella as tnt\ntnt.init()\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, KERAS_BACKEND=backend))
    assert proc.returncode != 0
    assert f"Keras runs on the '{backend}' backend (KERAS_BACKEND)" in proc.stderr, \
        proc.stderr[-2000:]
    assert "set KERAS_BACKEND=tensorflow" in proc.stderr


def test_keras_internals_exist_and_a_missing_one_names_the_version():
    code = ("import keras\n"
            "from tarantella import _keras_internals as k\n"
            "k.verify()\n"
            "print('verified', keras.__version__)\n"
            "del keras.layers.BatchNormalization._moments\n"
            "try:\n"
            "    k.verify()\n"
            "except RuntimeError as e:\n"
            "    print('error:', e)\n")
    proc = run([sys.executable, "-c", code])
    import keras
    assert f"verified {keras.__version__}" in proc.stdout
    assert (f"error: Tarantella relies on the Keras internal BatchNormalization._moments, which "
            f"Keras {keras.__version__} does not have") in proc.stdout, proc.stdout


@pytest.mark.ranks
def test_failing_master_only_callback_ends_fit_on_every_rank(tmp_path, python):
    cmd = mpirun_command(2, python, WORKER, "failing_callback", str(tmp_path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TNT_TIMEOUT_S="60"))
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "fit returned" not in text
    assert "rank 0 fit raised FileNotFoundError" in text, text[-3000:]
    assert ("rank 1 fit raised TarantellaError: the callback CSVLogger, which runs on the "
            "master rank only, failed there (FileNotFoundError") in text, text[-3000:]
    assert "disagree" not in text and "timed out" not in text, text[-3000:]
