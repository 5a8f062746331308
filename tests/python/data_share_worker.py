"""Trains on a mapped dataset, serially (--serial: plain Keras) or on the
ranks of a Tarantella job, and records the weights, the losses and how many
samples the map processed on this rank (key mapped/fit).

Every rank writes OUT/rank<r>.npz.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

from train_worker import make_data, make_model  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)

SAMPLES, BATCH, EPOCHS = 90, 16, 2


class Counter:
    """A map (deterministic for tf.data) that counts the samples it processed."""

    def __init__(self):
        self.calls = 0

    def _count(self, x):
        self.calls += 1
        return np.tanh(x) * 2

    def __call__(self, x, y):
        x = tf.numpy_function(self._count, [x], tf.float32, stateful=False)
        x.set_shape([12])
        return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    args = p.parse_args()
    rank = 0
    model = make_model(seed=5)
    if not args.serial:
        import tarantella as tnt
        tnt.init()
        rank = tnt.get_rank()
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    x, y = make_data(SAMPLES)
    counter = Counter()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(counter).batch(BATCH).prefetch(2)
    history = model.fit(ds, epochs=EPOCHS, verbose=0)
    results = {"loss": np.array(history.history["loss"]), "mapped/fit": np.array(counter.calls)}
    for i, w in enumerate(model.get_weights()):
        results[f"w{i}"] = w
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
