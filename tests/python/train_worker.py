"""Trains small models with every optimizer and records what happened.

Run serially (--serial: plain Keras, no Tarantella) or on N ranks under
mpirun (Tarantella). Every rank writes OUT/rank<r>.npz with, per case, the
per-epoch losses and the final weights; the tests compare them with the
serial run. Data and initial weights depend only on the seed, so every
configuration starts from the same point.
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

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "adamax": lambda: keras.optimizers.Adamax(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "nadam": lambda: keras.optimizers.Nadam(0.01),
    "lion": lambda: keras.optimizers.Lion(0.001),
    "ftrl": lambda: keras.optimizers.Ftrl(0.05),
    "sgd_clipnorm": lambda: keras.optimizers.SGD(0.05, clipnorm=0.1),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.5),
}


def make_data(n, seed=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    w = rng.normal(size=(12, 4)).astype(np.float32)
    y = np.argmax(x @ w + 0.1 * rng.normal(size=(n, 4)), axis=1).astype(np.int32)
    return x, y


def make_model(seed, mixed=False):
    keras.utils.set_random_seed(seed)
    dtype = "mixed_float16" if mixed else "float32"
    inputs = keras.Input(shape=(12,))
    h = keras.layers.Dense(16, activation="tanh", dtype=dtype)(inputs)
    h = keras.layers.Dense(8, activation="relu", dtype=dtype)(h)
    outputs = keras.layers.Dense(4, activation="softmax", dtype="float32")(h)
    return keras.Model(inputs, outputs)


class Tokens(keras.layers.Layer):
    """Each feature as a token of a vocabulary of 6 (its rounded value)."""

    def call(self, x):
        return keras.ops.cast(keras.ops.clip(keras.ops.round(x) + 3, 0, 5), "int32")


class TiedHead(keras.layers.Layer):
    """Logits over the vocabulary from the embedding matrix of `embedding`
    (tied input and output embeddings, as language models have)."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, h):
        return keras.ops.matmul(h, keras.ops.transpose(self.embedding.embeddings))


def make_sequence_model(seed, mixed=False):
    """A language model's layers on a sequence of 12 tokens: an embedding
    read by its lookup and by the head (its gradient is the sum of an
    IndexedSlices and a tensor), Dense layers on 3-D inputs (the gradient
    of a batched matmul's kernel has no static shape when the batch has
    none)."""
    if mixed:
        raise ValueError("the sequence model is float32 only")
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(12,))
    embedding = keras.layers.Embedding(6, 4)
    h = keras.layers.Dense(4, activation="tanh")(embedding(Tokens()(inputs)))
    h = keras.layers.Flatten()(TiedHead(embedding)(h))
    outputs = keras.layers.Dense(4, activation="softmax")(h)
    return keras.Model(inputs, outputs)


MODELS = {"functional": make_model, "sequence": make_sequence_model}


def make_cut_model(seed, mixed=False, stages=2, kind="functional"):
    """make_model's model cut into `stages` (2 or 3) pipeline stages: a
    SplitLayer before its second (and third) Dense layer; a Sequential
    model for `kind` "sequential"."""
    import tarantella as tnt
    layers = []
    for i, layer in enumerate(make_model(seed, mixed).layers[1:]):
        if 0 < i < stages:
            layers.append(tnt.keras.layers.SplitLayer(name=f"cut{i}"))
        layers.append(layer)
    inputs = keras.Input(shape=(12,))
    if kind == "sequential":
        return keras.Sequential([inputs] + layers)
    h = inputs
    for layer in layers:
        h = layer(h)
    return keras.Model(inputs, h)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    p.add_argument("--cases", default=",".join(OPTIMIZERS))
    p.add_argument("--model", default="functional", choices=sorted(MODELS))
    p.add_argument("--samples", type=int, default=150)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--mixed", action="store_true", help="mixed_float16 layers (loss scaling)")
    args = p.parse_args()

    rank = 0
    if not args.serial:
        import tarantella as tnt
        tnt.init()
        rank = tnt.get_rank()

    x, y = make_data(args.samples)
    results = {}
    for case in args.cases.split(","):
        model = MODELS[args.model](seed=3, mixed=args.mixed)
        if not args.serial:
            model = tnt.Model(model)
        model.compile(optimizer=OPTIMIZERS[case](), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
        history = model.fit(ds, epochs=args.epochs, verbose=0, shuffle=False)
        results[f"{case}/loss"] = np.array(history.history["loss"], dtype=np.float64)
        results[f"{case}/accuracy"] = np.array(history.history["accuracy"], dtype=np.float64)
        for i, w in enumerate(model.get_weights()):
            results[f"{case}/w{i}"] = w
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
