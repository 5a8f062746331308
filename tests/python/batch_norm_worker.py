"""Trains a model with BatchNormalization serially (plain Keras) or on the
ranks of a Tarantella job, and records losses, weights and a checkpoint.

--synchronized   BatchNormalization(synchronized=True): on N ranks the
                 statistics are those of the global batch, as serially.
otherwise        per-micro-batch statistics; the moving statistics must
                 still be identical on every rank after fit and in the
                 checkpoint.
Every rank writes OUT/rank<r>.npz.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)


def make_data(n, seed=11):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6, 6, 2)).astype(np.float32) * 3.0 + 1.0
    y = (x.mean(axis=(1, 2, 3)) > 1.0).astype(np.int32)
    return x, y


def make_model(synchronized):
    keras.utils.set_random_seed(5)
    inputs = keras.Input(shape=(6, 6, 2))
    h = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization(synchronized=synchronized)(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(8)(h)
    h = keras.layers.BatchNormalization(synchronized=synchronized, momentum=0.5)(h)
    outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.Activation("tanh")(h))
    return keras.Model(inputs, outputs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    p.add_argument("--synchronized", action="store_true")
    p.add_argument("--samples", type=int, default=150)
    p.add_argument("--batch", type=int, default=20)
    args = p.parse_args()
    rank = 0
    model = make_model(args.synchronized)
    if not args.serial:
        import tarantella as tnt
        tnt.init()
        rank = tnt.get_rank()
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = make_data(args.samples)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
    ckpt = os.path.join(args.out, "ckpt.weights.h5")
    history = model.fit(ds, epochs=3, verbose=0, shuffle=False, callbacks=[
        keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True)])
    results = {"loss": np.array(history.history["loss"]),
               "accuracy": np.array(history.history["accuracy"]),
               "evaluate": np.array(model.evaluate(ds, verbose=0))}
    for i, w in enumerate(model.get_weights()):
        results[f"w{i}"] = np.asarray(w)
    check = make_model(args.synchronized)
    check.load_weights(ckpt)
    for i, w in enumerate(check.get_weights()):
        results[f"checkpoint/w{i}"] = np.asarray(w)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
