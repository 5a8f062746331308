"""Trains with the common Keras callbacks, evaluates, predicts and saves.

--serial runs plain Keras. Writes OUT/rank<r>.npz (history, learning-rate
sequence, evaluation, predictions, weights) and lets the callbacks write
their files under OUT (CSV log, checkpoints, TensorBoard logs). With
--resume MODEL it loads a saved model instead, records its weights and
trains one more epoch.
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


def datasets():
    x, y = make_data(165)
    x, y, xv, yv = x[:120], y[:120], x[120:], y[120:]
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(15)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(9)
    return train, val, xv


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    p.add_argument("--resume", help="a saved model to load and train one more epoch")
    p.add_argument("--save", help="save the trained model here")
    args = p.parse_args()
    rank = 0
    if not args.serial:
        import tarantella as tnt
        tnt.init()
        rank = tnt.get_rank()
    os.makedirs(args.out, exist_ok=True)
    train, val, xv = datasets()
    results = {}

    if args.resume:
        model = (keras.saving.load_model(args.resume) if args.serial
                 else tnt.models.load_model(args.resume))
        for i, w in enumerate(model.get_weights()):
            results[f"loaded/w{i}"] = w
        model.fit(train, epochs=1, verbose=0)
        for i, w in enumerate(model.get_weights()):
            results[f"resumed/w{i}"] = w
    else:
        model = make_model(seed=3)
        if not args.serial:
            model = tnt.Model(model)
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        rates = []
        callbacks = [
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.002),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                              min_delta=0.2),
            keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: rates.append(
                float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))),
            keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv")),
            keras.callbacks.ModelCheckpoint(
                os.path.join(args.out, "ckpt", "epoch{epoch:02d}.weights.h5"),
                save_weights_only=True),
            keras.callbacks.TensorBoard(os.path.join(args.out, "tb")),
        ]
        history = model.fit(train, validation_data=val, epochs=12, callbacks=callbacks,
                            verbose=0)
        for k, v in history.history.items():
            results[f"history/{k}"] = np.array(v, dtype=np.float64)
        results["lr"] = np.array(rates)
        results["evaluate"] = np.array(model.evaluate(val, verbose=0))
        results["predict"] = model.predict(xv, batch_size=8, verbose=0)
        if args.save:
            model.save(args.save)
        for i, w in enumerate(model.get_weights()):
            results[f"final/w{i}"] = w
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
