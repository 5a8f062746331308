"""Callbacks, evaluate, predict and save/load on N ranks against serial Keras."""
import csv
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "callbacks_worker.py")


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("serial"))
    run([sys.executable, WORKER, "--serial", "--out", out])
    return out


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, _, fs in os.walk(path) for f in fs)


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_callbacks_match_serial(nranks, serial, tmp_path, python):
    out = str(tmp_path)
    saved = os.path.join(out, "model.keras")
    run(mpirun_command(nranks, python, WORKER, "--out", out, "--save", saved), timeout=600)
    results = load(out, nranks)
    assert_ranks_identical(results)
    got, want = results[0], load(serial, 1)[0]

    # History, EarlyStopping's epoch and ReduceLROnPlateau's rates.
    hist = sorted(k for k in want if k.startswith("history/"))
    assert hist == sorted(k for k in got if k.startswith("history/"))
    epochs = len(want["history/loss"])
    assert epochs < 12, "the test must make EarlyStopping stop early"
    for k in hist:
        assert len(got[k]) == epochs, f"{k}: stopped after {len(got[k])} epochs, serial {epochs}"
        assert np.allclose(got[k], want[k], rtol=0, atol=1e-4), f"{k}: {got[k]} != {want[k]}"
    assert np.array_equal(got["lr"], want["lr"]), f"learning rates {got['lr']} != {want['lr']}"
    assert len(set(want["lr"].tolist())) > 1, "the test must make ReduceLROnPlateau act"

    # evaluate and predict.
    assert np.allclose(got["evaluate"], want["evaluate"], rtol=0, atol=1e-4)
    assert got["predict"].shape == want["predict"].shape
    assert np.allclose(got["predict"], want["predict"], rtol=0, atol=1e-5)

    # CSVLogger: one file, same rows and columns, same numbers.
    rows, serial_rows = read_csv(os.path.join(out, "log.csv")), read_csv(
        os.path.join(serial, "log.csv"))
    assert len(rows) == len(serial_rows) and rows[0].keys() == serial_rows[0].keys()
    for r, s in zip(rows, serial_rows):
        for k in s:
            assert abs(float(r[k]) - float(s[k])) <= 1e-4, f"log.csv {k}: {r[k]} != {s[k]}"

    # ModelCheckpoint: one set of files, named as serially.
    assert files_under(os.path.join(out, "ckpt")) == files_under(os.path.join(serial, "ckpt"))

    # TensorBoard: the master's logs only.
    tb = sorted(os.listdir(os.path.join(out, "tb")))
    assert tb == sorted(os.listdir(os.path.join(serial, "tb"))) == ["train", "validation"]

    # Nothing else was written, and no temporary file is left behind.
    names = set(os.listdir(out))
    assert names == {"ckpt", "tb", "log.csv", "model.keras"} | {
        f"rank{r}.npz" for r in range(nranks)}, names


def test_tensorboard_on_all_devices(tmp_path, python):
    out = str(tmp_path)
    run(mpirun_command(2, python, WORKER, "--out", out),
        env={"TNT_TENSORBOARD_ON_ALL_DEVICES": "true"})
    assert sorted(os.listdir(os.path.join(out, "tb"))) == ["rank_0", "rank_1"]
    for r in (0, 1):
        assert sorted(os.listdir(os.path.join(out, "tb", f"rank_{r}"))) == ["train",
                                                                          "validation"]


def test_save_on_three_ranks_load_on_one_and_two(tmp_path, python):
    saved = str(tmp_path / "model.keras")
    run(mpirun_command(3, python, WORKER, "--out", str(tmp_path / "save"), "--save", saved))
    trained = load(str(tmp_path / "save"), 3)[0]
    resumed = {}
    for n in (1, 2):
        out = str(tmp_path / f"resume{n}")
        run(mpirun_command(n, python, WORKER, "--out", out, "--resume", saved))
        results = load(out, n)
        assert_ranks_identical(results)
        resumed[n] = results[0]
        for k in trained:
            if k.startswith("final/"):
                assert np.array_equal(resumed[n]["loaded/" + k[6:]], trained[k]), \
                    f"weights loaded on {n} ranks differ from those saved on 3 ({k})"
    for k in resumed[1]:
        if k.startswith("resumed/"):
            assert np.allclose(resumed[1][k], resumed[2][k], rtol=0, atol=1e-5), \
                f"{k}: training resumed on 1 and 2 ranks diverges"


WRAPPER = r'''
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {here!r})
import tensorflow as tf, keras
import tarantella as tnt
from train_worker import make_data, make_model
tnt.init()
x, y = make_data(80)
model = tnt.Model(make_model(2))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
seen = {{"local": [], "global": [], "master": []}}
def recorder(kind):
    return keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: seen[kind].append(dict(logs)))
history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0,
                    callbacks=[tnt.keras.callbacks.Callback(recorder("local"),
                                                            aggregate_logs=False),
                               tnt.keras.callbacks.Callback(recorder("global")),
                               tnt.keras.callbacks.Callback(recorder("master"),
                                                            run_on_all_ranks=False)])
seen["history"] = history.history
with open(os.path.join({out!r}, f"rank{{tnt.get_rank()}}.json"), "w") as f:
    json.dump(seen, f)
'''


def test_callback_wrapper_chooses_ranks_and_logs(tmp_path, python):
    import json
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER.format(here=os.path.dirname(os.path.abspath(__file__)),
                                     out=str(tmp_path)))
    run(mpirun_command(2, python, str(script)))
    seen = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    for r in (0, 1):
        assert [set(e) for e in seen[r]["local"]] == [{"loss", "accuracy"}] * 2
        assert seen[r]["global"] == seen[0]["global"], "global logs differ between ranks"
        assert [e["loss"] for e in seen[r]["global"]] == seen[r]["history"]["loss"]
    assert len(seen[0]["master"]) == 2 and seen[1]["master"] == []
    # Equal micro-batches: the global loss is the mean of the local ones.
    for epoch in range(2):
        local = [seen[r]["local"][epoch]["loss"] for r in (0, 1)]
        assert local[0] != local[1]
        assert abs(sum(local) / 2 - seen[0]["global"][epoch]["loss"]) < 1e-5
