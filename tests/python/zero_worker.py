"""Trains train_worker's models with each optimizer at ZeRO stages 0 to 3
on the same ranks, from the same weights, on the same data, and records
per case and stage the per-epoch losses, the final weights and the bytes
of optimizer state and of trainable weights this rank holds (stage 3 is
skipped where it is refused: pipelines, train_steps of their own).

A case is an optimizer of train_worker.OPTIMIZERS, or OPTIMIZER:MODEL to
train a model of MODELS other than --model's. Every rank writes
OUT/rank<r>.npz, keys "<case>/z<stage>/<what>".

--readers: the fit also validates (its val_loss recorded), a second fit of
one epoch has a callback that reads the weights after every batch (their
sums recorded), one train_on_batch follows, then a predict of 10 samples.

--pass-memory: only pass_memory() (what predict, evaluate and fit's
steps hold at stages 0 and 3).
"""
import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_worker  # noqa: E402  (sets TensorFlow's threads and log level)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from tarantella import _keras_internals as internals  # noqa: E402
from tarantella.pipeline.weights import allocated_bytes  # noqa: E402


def sequential(seed, mixed=False):
    """train_worker's model, as a Sequential model."""
    functional = train_worker.make_model(seed, mixed)
    model = keras.Sequential([keras.Input(shape=(12,))] + functional.layers[1:])
    return model


class OwnStep(keras.Sequential):
    """A model whose train_step is its own: its gradients from a tape (a
    tnt.DistributedGradientTape when `averaged`), applied with
    optimizer.apply."""

    averaged = False

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        if self.averaged:
            tape = tnt.DistributedGradientTape(tape, num_samples=tf.shape(x)[0])
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return self.compute_metrics(x, y, y_pred)


def own_step(seed, mixed=False, averaged=False):
    model = OwnStep(sequential(seed, mixed).layers)
    model.averaged = averaged
    return model


def norm_dropout(seed, mixed=False):
    """A model with a synchronized BatchNormalization layer, Dropout and an
    unsynchronized BatchNormalization layer (moving statistics that are
    not trained, random masks)."""
    keras.utils.set_random_seed(seed)
    dtype = "mixed_float16" if mixed else "float32"
    inputs = keras.Input(shape=(12,))
    h = keras.layers.Dense(16, activation="tanh", dtype=dtype)(inputs)
    h = keras.layers.BatchNormalization(synchronized=True, dtype=dtype)(h)
    h = keras.layers.Dropout(0.2, seed=seed)(h)
    h = keras.layers.Dense(8, activation="relu", dtype=dtype)(h)
    h = keras.layers.BatchNormalization(dtype=dtype)(h)
    outputs = keras.layers.Dense(4, activation="softmax", dtype="float32")(h)
    return keras.Model(inputs, outputs)


class Looped(keras.layers.Layer):
    """A square weight applied 3 times in a loop, and once more in a
    branch of a cond: its value is first read inside the loop's body."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], shape[-1]), initializer="glorot_uniform")

    def call(self, x):
        h = keras.ops.fori_loop(0, 3, lambda i, h: keras.ops.tanh(h @ self.w), x)
        return keras.ops.cond(keras.ops.sum(h) > 0, lambda: h @ self.w, lambda: h)


def looped(seed, mixed=False):
    """train_worker's inputs through a dense layer, two Looped layers and a
    softmax layer."""
    keras.utils.set_random_seed(seed)
    dtype = "mixed_float16" if mixed else "float32"
    inputs = keras.Input(shape=(12,))
    h = Looped(dtype=dtype)(keras.layers.Dense(8, dtype=dtype)(inputs))
    outputs = keras.layers.Dense(4, activation="softmax", dtype="float32")(Looped(dtype=dtype)(h))
    return keras.Model(inputs, outputs)


class EinsumHead(train_worker.TiedHead):
    """TiedHead whose backward pass reads the embedding matrix itself (not
    a transpose of it, made in the forward pass)."""

    def call(self, h):
        return keras.ops.einsum("...d,vd->...v", h, self.embedding.embeddings)


def tied_far(seed, mixed=False):
    """train_worker's sequence model with three Dense layers between the
    embedding's lookup and the head that reads the embedding again: the
    head's backward pass feeds the gradients of the layers between, so
    stage 3's backward pass cannot wait for them to gather the embedding
    again (zero/steps.py's _Regathering keeps its first gather)."""
    if mixed:
        raise ValueError("the sequence model is float32 only")
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(12,))
    embedding = keras.layers.Embedding(6, 4)
    h = embedding(train_worker.Tokens()(inputs))
    for _ in range(3):
        h = keras.layers.Dense(4, activation="tanh")(h)
    h = keras.layers.Flatten()(EinsumHead(embedding)(h))
    outputs = keras.layers.Dense(4, activation="softmax")(h)
    return keras.Model(inputs, outputs)


# train_worker's, and Lamb, whose update reads each variable's norm.
OPTIMIZERS = dict(train_worker.OPTIMIZERS, lamb=lambda: keras.optimizers.Lamb(0.01),
                  adafactor=lambda: keras.optimizers.Adafactor(0.01))

MODELS = {"functional": train_worker.make_model, "sequential": sequential,
          "norm_dropout": norm_dropout, "sequence": train_worker.make_sequence_model,
          "looped": looped, "tied_far": tied_far,
          "own_step": own_step,
          "own_step_tape": lambda seed, mixed=False: own_step(seed, mixed, averaged=True)}


class AllocationPeak:
    """Until close(), the most bytes that the variables Tarantella allocates
    (those a build function made, which hold no value until then) hold at
    once, taken after each allocation."""

    def __init__(self):
        self.seen, self.peak = {}, 0
        self.original = internals.allocate
        internals.allocate = self._allocate

    def _allocate(self, variable, initializer=None):
        self.original(variable, initializer)
        self.seen[id(variable)] = variable
        self.peak = max(self.peak, allocated_bytes(self.seen.values()))

    def close(self):
        internals.allocate = self.original
        return self.peak


def tensor_bytes():
    """What TensorFlow's allocator holds for tensors now (run with
    TF_CPU_ALLOCATOR_USE_BFC=true: the CPU allocator that keeps
    statistics); resets the statistics' peak to it."""
    tf.config.experimental.reset_memory_stats("CPU:0")
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


def tensor_peak_kib(base):
    """The most TensorFlow's allocator held for tensors above `base` (bytes)
    since tensor_bytes()."""
    return (tf.config.experimental.get_memory_info("CPU:0")["peak"] - base) // 1024


class StepPeak(keras.callbacks.Callback):
    """The most memory the training steps after the first took for tensors
    above what the first left (peak_kib)."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0 and not hasattr(self, "base"):
            self.base = tensor_bytes()

    def on_train_end(self, logs=None):
        self.peak_kib = tensor_peak_kib(self.base)


def pass_memory(out, layers=16, width=512):
    """--pass-memory: a model of `layers` dense layers of `width` units
    (built by a function) at stages 0 and 3; records per stage its
    predictions, evaluation loss and training loss, what its tensors take
    between steps (held_kib), and the most memory
    that predict and evaluate (after a first call of each traced them) and
    fit's steps after its first took for tensors above what was held
    before them."""
    def build():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((width,))
        h = inputs
        for _ in range(layers):
            h = keras.layers.Dense(width, activation="tanh")(h)
        return keras.Model(inputs, h)

    x = np.random.default_rng(0).normal(size=(64, width)).astype(np.float32)
    for stage in (0, 3):
        gc.collect()
        before = tensor_bytes()
        model = tnt.Model(build, zero_stage=stage)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.fit(x, x, batch_size=32, epochs=1, verbose=0)
        out[f"z{stage}/held_kib"] = np.array((tensor_bytes() - before) // 1024)
        runs = {"predict": lambda: model.predict(x, batch_size=32, verbose=0),
                "evaluate": lambda: np.array(model.evaluate(x, x, batch_size=32, verbose=0))}
        for what, call in runs.items():
            out[f"z{stage}/{what}"] = call()  # traced
            base = tensor_bytes()
            for _ in range(3):
                call()
            out[f"z{stage}/{what}_peak_kib"] = np.array(tensor_peak_kib(base))
        steps, many = StepPeak(), np.tile(x, (4, 1))
        out[f"z{stage}/fit"] = np.array(model.fit(many, many, batch_size=32, epochs=1,
                                                  verbose=0, callbacks=[steps]).history["loss"])
        out[f"z{stage}/fit_peak_kib"] = np.array(steps.peak_kib)
    out["weights_kib"] = np.array(layers * (width * width + width) * 4 // 1024)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default=",".join(OPTIMIZERS),
                   help="OPTIMIZER[:MODEL], comma-separated")
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--model", default="functional", choices=sorted(MODELS))
    p.add_argument("--samples", type=int, default=150)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--mixed", action="store_true", help="mixed_float16 layers (loss scaling)")
    p.add_argument("--readers", action="store_true",
                   help="validation, a callback reading the weights, train_on_batch")
    p.add_argument("--pipeline", type=int, default=0,
                   help="K: the model cut into K stages, trained with ParallelStrategy.ALL")
    p.add_argument("--schedule", default=None, help="pipeline_schedule (with --pipeline)")
    p.add_argument("--build-fn", action="store_true",
                   help="tnt.Model(a function that builds the model): record the most "
                        "trainable bytes allocated at once while it was built and distributed")
    p.add_argument("--pass-memory", action="store_true",
                   help="only pass_memory(): predict, evaluate and fit at stages 0 and 3")
    args = p.parse_args()

    tnt.init()
    x, y = train_worker.make_data(args.samples)
    results = {}
    if args.pass_memory:
        pass_memory(results)
        args.cases = ""
    for case in filter(None, args.cases.split(",")):
        name, _, model_name = case.partition(":")
        for stage in map(int, args.stages.split(",")):
            model_name = model_name or args.model
            if stage == 3 and (args.pipeline or model_name.startswith("own_step")):
                continue  # refused (test_bad_input.py): pipelines, train_steps of their own
            if args.pipeline:
                model = tnt.Model(train_worker.make_cut_model(3, args.mixed, args.pipeline,
                                                                 model_name),
                                  parallel_strategy=tnt.ParallelStrategy.ALL,
                                  num_micro_batches=2, pipeline_schedule=args.schedule,
                                  zero_stage=stage)
            elif args.build_fn:
                peak = AllocationPeak()
                model = tnt.Model(lambda: MODELS[model_name](seed=3, mixed=args.mixed),
                                  zero_stage=stage)
            else:
                model = tnt.Model(MODELS[model_name](seed=3, mixed=args.mixed),
                                  zero_stage=stage)
            optimizer = OPTIMIZERS[name]()
            if args.mixed:
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"])
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
            key = f"{case}/z{stage}"
            if args.readers:
                history = model.fit(ds, epochs=args.epochs, verbose=0, shuffle=False,
                                    validation_data=ds.take(2))
                results[f"{key}/val_loss"] = np.array(history.history["val_loss"])
                sums = []
                reader = keras.callbacks.LambdaCallback(
                    on_train_batch_end=lambda b, logs: sums.append(
                        sum(np.sum(w, dtype=np.float64) for w in model.get_weights())))
                history = model.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[reader])
                results[f"{key}/batch_sums"] = np.array(sums)
                model.train_on_batch(x[:args.batch], y[:args.batch])
                # Fewer samples than a batch: 5 a rank.
                results[f"{key}/predict"] = model.predict(x[:10], verbose=0)
            else:
                history = model.fit(ds, epochs=args.epochs, verbose=0, shuffle=False)
            if args.build_fn:
                results[f"{key}/allocated_peak"] = np.array(peak.close())
            results[f"{key}/loss"] = np.array(history.history["loss"], dtype=np.float64)
            results[f"{key}/accuracy"] = np.array(history.history["accuracy"], dtype=np.float64)
            for i, w in enumerate(model.get_weights()):
                results[f"{key}/w{i}"] = w
            slots = [v for v in model.optimizer.variables if len(v.shape)]
            results[f"{key}/slot_bytes"] = np.array(sum(
                int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in slots))
            # Of them, the state every rank holds whole (Adafactor's factored moments).
            replicated = getattr(getattr(model.optimizer, "inner_optimizer", model.optimizer),
                                 "_tnt_replicated", set())
            results[f"{key}/replicated_bytes"] = np.array(sum(
                int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in slots
                if id(v) in replicated))
            # The bytes of trainable weights this rank holds: its variables'
            # values, and at stage 3 its parts (which hold them instead).
            shards = getattr(model.optimizer, "_tnt_shards", None)
            results[f"{key}/trainable_bytes"] = np.array(
                allocated_bytes(model.trainable_variables)
                + (shards.held_bytes() if shards is not None and shards.stage == 3 else 0))
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{tnt.get_rank()}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
