"""Every way of feeding data gives serial Keras's results, and misuse fails clearly."""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

WORKER = os.path.join(ROOT, "tests", "python", "data_worker.py")


@pytest.mark.parametrize("nranks", [2, 3])
def test_inputs_equal_serial(nranks, tmp_path, python):
    serial_out = str(tmp_path / "serial")
    run([sys.executable, WORKER, "--serial", "--ranks", str(nranks), "--out", serial_out])
    serial = load(serial_out, 1)[0]
    out = str(tmp_path / "dist")
    run(mpirun_command(nranks, python, WORKER, "--out", out), timeout=600)
    results = load(out, nranks)
    assert_ranks_identical(results)
    got = results[0]
    assert set(got) == set(serial)
    for key in serial:
        if "/w" in key:
            assert np.allclose(got[key], serial[key], rtol=0, atol=1e-5), key
        else:
            assert np.allclose(got[key], serial[key], rtol=0, atol=1e-4), \
                f"{key}: {got[key]} != serial {serial[key]}"


MISUSE = r'''
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, {here!r})
import numpy as np, tensorflow as tf, keras
import tarantella as tnt
from train_worker import make_data, make_model
tnt.init()
x, y = make_data(40)
ds = tf.data.Dataset.from_tensor_slices((x, y))
model = tnt.Model(make_model(1))
def expect(fragment, fn):
    try:
        fn()
    except tnt.TarantellaError as e:
        assert fragment in str(e), f"{{fragment!r}} not in {{e}}"
        print("ok:", e)
        return
    raise AssertionError(f"no error for {{fragment}}")
expect("before compile", lambda: model.fit(ds.batch(8)))
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
expect("batched twice", lambda: model.fit(ds.batch(8), batch_size=8))
expect("not batched", lambda: model.fit(ds))
expect("global batch of", lambda: model.fit(ds.batch(7), tnt_micro_batch_size=4))
expect("smaller than the number of ranks", lambda: model.fit(ds.batch(1)))
expect("unsupported", lambda: model.fit("data.csv"))
width = 4 if tnt.get_rank() == 0 else 5
other = tnt.Model(keras.Sequential([keras.Input((12,)), keras.layers.Dense(width),
                                    keras.layers.Dense(4)]))
other.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
expect("ranks [1] have models whose weight shapes differ", lambda: other.fit(ds.batch(8)))
def custom_loop():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x[:4]))
    grads = tape.gradient(loss, model.trainable_variables)
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
expect("custom training loops cannot be distributed", custom_loop)
'''


def test_misuse_gives_clear_errors(tmp_path, python):
    script = tmp_path / "misuse.py"
    script.write_text(MISUSE.format(here=os.path.dirname(os.path.abspath(__file__))))
    proc = run(mpirun_command(2, python, str(script)), timeout=300)
    assert proc.stdout.count("ok:") == 2 * 8, proc.stdout
