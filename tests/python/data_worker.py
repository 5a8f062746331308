"""Feeds data to fit/evaluate in every way Tarantella accepts, and records results.

--serial runs the equivalent plain Keras calls. Each rank writes
OUT/rank<r>.npz; scenario names prefix the keys.
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


def compiled(serial):
    model = make_model(seed=5)
    if not serial:
        import tarantella as tnt
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def record(results, name, history=None, model=None, evaluation=None):
    if history is not None:
        for k, v in history.history.items():
            results[f"{name}/{k}"] = np.array(v, dtype=np.float64)
    if model is not None:
        for i, w in enumerate(model.get_weights()):
            results[f"{name}/w{i}"] = w
    if evaluation is not None:
        results[f"{name}/evaluate"] = np.array(evaluation, dtype=np.float64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    p.add_argument("--ranks", type=int, default=1, help="rank count to emulate serially")
    args = p.parse_args()
    serial = args.serial
    rank, size = 0, args.ranks
    if not serial:
        import tarantella as tnt
        tnt.init()
        rank, size = tnt.get_rank(), tnt.get_size()

    x, y = make_data(110)
    xv, yv = make_data(37, seed=11)
    results = {}

    # NumPy arrays with the global batch size, validation arrays too.
    m = compiled(serial)
    h = m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              validation_data=(xv, yv))
    record(results, "numpy", h, m, m.evaluate(xv, yv, batch_size=8, verbose=0))

    # An unbatched dataset and a micro-batch size: the global batch is
    # micro_batch * ranks.
    m = compiled(serial)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    mbs = 6
    if serial:
        h = m.fit(ds.batch(mbs * size), epochs=2, verbose=0)
    else:
        h = m.fit(ds, tnt_micro_batch_size=mbs, epochs=2, verbose=0)
    record(results, "micro", h, m)

    # A batched dataset with batched validation data, and evaluate.
    m = compiled(serial)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(13)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(7)
    h = m.fit(train, validation_data=val, epochs=2, verbose=0)
    record(results, "dataset", h, m, m.evaluate(val, verbose=0))

    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
