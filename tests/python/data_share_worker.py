"""Trains on a mapped dataset, serially (--serial: plain Keras) or on the
ranks of a Tarantella job, and records the weights, the losses and how many
samples the map processed on this rank in fit (key mapped/fit); without
--pipeline also evaluate's loss and predict's outputs on the same dataset.

--pipeline cuts the model into 2 stages (SplitLayer; plain Keras ignores
the cut) and trains it on 2 replicas of the pipeline (4 ranks): the
replicas share every global batch.

--stop-in-epoch stops fit after the 3rd batch of its 2nd epoch (a callback
sets stop_training), so that evaluate and predict then draw their orders
after a fit that did not read its last epoch whole.

--random multiplies every sample by random factors (tf.random.uniform) in
the map, after a shuffle: an augmentation drawn at random.

Every rank writes OUT/rank<r>.npz. With --runs RUN[,RUN...] the job trains
several runs one after another, each into OUT/RUN/, RUN being the flags
above joined by "+" ("plain" for none), e.g. "shuffle+unbuilt".
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

from train_worker import make_data, make_model  # noqa: E402
import tarantella as tnt  # noqa: E402

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


class StopInEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 2:
            self.model.stop_training = True


def pipelined_model():
    keras.utils.set_random_seed(5)
    inputs = keras.Input(shape=(12,))
    h = keras.layers.Dense(16, activation="tanh")(inputs)
    h = tnt.keras.layers.SplitLayer()(h)
    outputs = keras.layers.Dense(4, activation="softmax")(h)
    return keras.Model(inputs, outputs)


FLAGS = ("pipeline", "random", "shuffle", "unbuilt", "stop-in-epoch")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--random", action="store_true")
    p.add_argument("--shuffle", action="store_true", help="shuffle before the counted map")
    p.add_argument("--unbuilt", action="store_true",
                   help="a Sequential model without an Input: fit builds it")
    p.add_argument("--stop-in-epoch", action="store_true")
    p.add_argument("--runs", help="RUN[,RUN...]: RUN is flags joined by '+', or 'plain'")
    args = p.parse_args()
    if not args.serial:
        tnt.init()
    if not args.runs:
        return train(args, args.out)
    for spec in args.runs.split(","):
        flags = [] if spec == "plain" else spec.split("+")
        if set(flags) - set(FLAGS):
            p.error(f"{spec}: flags are {', '.join(FLAGS)}")
        run_args = dict(vars(args), **{f.replace("-", "_"): f in flags for f in FLAGS})
        train(argparse.Namespace(**run_args), os.path.join(args.out, spec))
    return 0


def train(args, out):
    rank = 0
    if args.pipeline:
        model = pipelined_model()
    elif args.unbuilt:
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.layers.Dense(16, activation="tanh", kernel_initializer=
                                                     keras.initializers.GlorotUniform(seed=1)),
                                  keras.layers.Dense(4, activation="softmax", kernel_initializer=
                                                     keras.initializers.GlorotUniform(seed=2))])
    else:
        model = make_model(seed=5)
    keras.utils.set_random_seed(42)  # as tnt.init() seeds every rank
    if not args.serial:
        rank = tnt.get_rank()
        if args.pipeline:
            model = tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.ALL,
                              num_micro_batches=2)
        else:
            model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    x, y = make_data(SAMPLES)
    counter = Counter()
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if args.random:
        ds = ds.shuffle(SAMPLES).map(lambda x, y: (x * tf.random.uniform([12], 0.5, 1.5), y),
                                     num_parallel_calls=2)
    if args.shuffle:
        ds = ds.shuffle(SAMPLES)
    ds = ds.map(counter).batch(BATCH).prefetch(2)
    callbacks = [StopInEpoch()] if args.stop_in_epoch else []
    history = model.fit(ds, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    results = {"loss": np.array(history.history["loss"]), "mapped/fit": np.array(counter.calls)}
    if not args.pipeline:
        results["evaluate"] = np.array(model.evaluate(ds, verbose=0))
        results["predict"] = model.predict(ds, verbose=0)
    for i, w in enumerate(model.get_weights()):
        results[f"w{i}"] = w
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
