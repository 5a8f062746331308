"""Custom training, serially (plain Keras) or on the ranks of a Tarantella job.

Cases, comma-separated (every rank writes OUT/<case>/rank<r>.npz with per-epoch
losses and weights):
  two_optimizers  a subclassed model whose compile takes two optimizers and
                  whose train_step applies each to its own part of the model
  vae             a VAE-style model: a layer adds a KL-like term with
                  add_loss, trained with the built-in train_step
  loop            a hand-written tf.function loop with DistributedGradientTape
150 samples in global batches of 20: micro-batches of unequal size at 3 ranks
and a partial last batch.
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

SAMPLES, BATCH, EPOCHS = 150, 20, 3


def make_data(seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 2))).astype(np.float32)
    return x, y


class TwoParts(keras.Model):
    """A body and a head, each trained by its own optimizer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.body = keras.Sequential([keras.layers.Dense(8, activation="tanh")])
        self.head = keras.Sequential([keras.layers.Dense(2)])
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        return self.head(self.body(x))

    def compile(self, body_optimizer, head_optimizer, loss_fn):
        super().compile()
        self.body_optimizer = body_optimizer
        self.head_optimizer = head_optimizer
        self.loss_fn = loss_fn

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            loss = self.loss_fn(y, self(x, training=True))
        body_vars = self.body.trainable_variables
        head_vars = self.head.trainable_variables
        self.body_optimizer.apply_gradients(zip(tape.gradient(loss, body_vars), body_vars))
        self.head_optimizer.apply_gradients(zip(tape.gradient(loss, head_vars), head_vars))
        # Weighted by the batch size, the tracker's mean is the global one.
        self.loss_tracker.update_state(loss, sample_weight=tf.shape(x)[0])
        return {"loss": self.loss_tracker.result(), "last_loss": loss}


class KLTerm(keras.layers.Layer):
    """Adds a KL-like penalty of its input to the model's losses."""

    def call(self, z):
        self.add_loss(0.1 * tf.reduce_mean(tf.reduce_sum(tf.square(z), axis=1)))
        return z


def vae_model():
    inputs = keras.Input((6,))
    z = KLTerm()(keras.layers.Dense(3)(inputs))
    return keras.Model(inputs, keras.layers.Dense(2)(z))


def run_loop(model, optimizer, ds, distributed):
    """A hand-written training loop; returns the per-epoch mean losses."""
    if distributed:
        import tarantella as tnt
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if distributed:
            tape = tnt.DistributedGradientTape(tape, num_samples=tf.shape(x)[0])
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        n = tf.cast(tf.shape(x)[0], tf.float32)
        totals = tf.stack([loss * n, n])
        return tnt.allreduce(totals, op="sum") if distributed else totals

    losses = []
    for _ in range(EPOCHS):
        total = np.zeros(2)
        for x, y in ds:
            total += step(x, y).numpy()
        losses.append(total[0] / total[1])
    return np.array(losses)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cases", help="comma-separated: two_optimizers, vae, loop")
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    args = p.parse_args()
    rank, distributed = 0, not args.serial
    if distributed:
        import tarantella as tnt
        tnt.init()
        rank = tnt.get_rank()
    for case in args.cases.split(","):
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        np.savez(os.path.join(out, f"rank{rank}.npz"), **train(case, distributed))
    return 0


def train(case, distributed):
    """Per-epoch losses and the weights after training `case`."""
    if distributed:
        import tarantella as tnt
    x, y = make_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    keras.utils.set_random_seed(7)
    results = {}
    if case == "loop":
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam(0.01)
        if distributed:
            tnt.broadcast_variables(model.variables)
            ds = tnt.data.distribute(ds)
        results["loss"] = run_loop(model, optimizer, ds, distributed)
    elif case in ("two_optimizers", "vae"):
        if case == "two_optimizers":
            model = TwoParts()
            model(x[:1])
            if distributed:
                model = tnt.Model(model)
            model.compile(keras.optimizers.SGD(0.05, momentum=0.9), keras.optimizers.Adam(0.01),
                          keras.losses.MeanSquaredError())
        else:
            model = vae_model()
            if distributed:
                model = tnt.Model(model)
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        history = model.fit(ds, epochs=EPOCHS, verbose=0, shuffle=False)
        results["loss"] = np.array(history.history["loss"])
    else:
        raise SystemExit(f"unknown case {case!r}: use two_optimizers, vae or loop")
    for i, w in enumerate(model.get_weights()):
        results[f"w{i}"] = np.asarray(w)
    return results

if __name__ == "__main__":
    sys.exit(main())
