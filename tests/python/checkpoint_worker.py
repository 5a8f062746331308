"""Checkpoints of a pipelined model, round trip.

  checkpoint_worker.py save   CASE --dir DIR --stages K   (on K ranks)
  checkpoint_worker.py keras  CASE --dir DIR              (one process, plain Keras)
  checkpoint_worker.py resume CASE --dir DIR --stages K'  (on K' ranks)

CASE: "functional" or "sequential", the same four Dense layers, without
SplitLayers: Tarantella cuts them into K stages (num_stages).

save: a model built by a function, on K stages, trains one epoch with Adam,
then writes DIR/ckpt.weights.json (sharded), DIR/one.weights.h5 and
DIR/model.keras (values streamed in pieces of 256 bytes); writes
DIR/save.npz (rank 0): the predictions then, the whole model's weights
then ("w/<i>": model.weights[i]), and those after one more epoch
("after/<i>"). Every rank writes DIR/guard-save-<rank>.txt: what reading the other stages' weights
gave after the saves, and DIR/errors-<rank>.txt: the errors of a save to a
file name without a weights ending, and of one over an existing file with
overwrite=False (one per line).
keras: plain Keras loads each file into the model built whole; writes
DIR/keras.npz: per file, its predictions, weights and optimizer variables.
resume: tnt.models.load_model(DIR/model.keras) on K' stages (other cuts),
and a model built by a function that loads DIR/ckpt.weights.json, each
train one more epoch; writes DIR/resume.npz (rank 0): the weights after it
("keras/<i>", "json/<i>"), and DIR/guard-resume-<rank>.txt.
callback: a model built by a function, on K stages, trains one epoch with
ModelCheckpoints (DIR/callback.keras; DIR/callback-best.weights.h5, best
only, weights only; DIR/callback-batch<b>.weights.h5 every 2 batches),
then saves DIR/direct.keras and DIR/direct.weights.h5 itself; every rank
writes DIR/guard-callback-<rank>.txt: at each batch's and the epoch's end,
after the checkpoints, whether it held the whole model and what reading
the other stages' weights gave.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
import stage_guard  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

SAMPLES, BATCH, MICRO_BATCHES = 96, 24, 2
FILES = ("ckpt.weights.json", "one.weights.h5", "model.keras")


def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(SAMPLES, 8)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(8, 3))).astype(np.float32)
    return x, y


def build(case):
    keras.utils.set_random_seed(7)
    layers = [keras.layers.Dense(16, activation="tanh", name=f"d{k}") for k in range(3)]
    layers.append(keras.layers.Dense(3, name="out"))
    if case == "sequential":
        return keras.Sequential([keras.Input((8,), name="x")] + layers, name="seq")
    h = inputs = keras.Input((8,), name="x")
    for layer in layers:
        h = layer(h)
    return keras.Model(inputs, h, name="fun")


def compile_model(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")


def fit(model, x, y):
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)


def guard(tnt, model):
    """What reading every weight of the other stages gives: each read must
    raise (the weight is not allocated on this rank)."""
    read, errors = stage_guard.read_other_stages(tnt, model)
    return f"read: {read}" if read else f"refused: {len(errors)}"


def fit_with_checkpoints(tnt, model, x, y, path):
    """Fits one epoch with ModelCheckpoints that save the model, its best
    weights and its weights every 2 batches; a callback after them records,
    at every batch's and the epoch's end, whether this rank held the whole
    model (Pipeline.whole) or could read a weight of another stage."""
    rank = tnt.get_rank()

    class Guard(keras.callbacks.Callback):
        def check(self, when):
            with open(path(f"guard-callback-{rank}.txt"), "a") as f:
                f.write(f"{when}: whole {model._tnt.pipeline.whole.depth}, "
                        f"{guard(tnt, model)}\n")

        def on_train_batch_end(self, batch, logs=None):
            self.check(f"batch {batch}")

        def on_epoch_end(self, epoch, logs=None):
            self.check(f"epoch {epoch}")

    checkpoints = [
        keras.callbacks.ModelCheckpoint(path("callback.keras")),
        keras.callbacks.ModelCheckpoint(path("callback-best.weights.h5"), monitor="loss",
                                        save_best_only=True, save_weights_only=True),
        keras.callbacks.ModelCheckpoint(path("callback-batch{batch}.weights.h5"),
                                        save_weights_only=True, save_freq=2)]
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=checkpoints + [Guard()])


def weights(model, prefix):
    """The whole model's weights, by their place in model.weights (a path
    may hold the name of the model, which Keras may change on loading)."""
    return {f"{prefix}/{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "keras", "resume", "callback"])
    p.add_argument("case", choices=["functional", "sequential"])
    p.add_argument("--dir", required=True)
    p.add_argument("--stages", type=int, default=2)
    args = p.parse_args()
    x, y = data()
    path = lambda name: os.path.join(args.dir, name)  # noqa: E731
    if args.mode == "keras":
        out = {}
        for name in FILES:
            if name.endswith(".keras"):
                model = keras.saving.load_model(path(name))
            else:
                model = build(args.case)
                compile_model(model)
                model.optimizer.build(model.trainable_variables)
                model.load_weights(path(name))
            out[f"{name}/predict"] = model.predict(x, batch_size=BATCH, verbose=0)
            for i, v in enumerate(model.optimizer.variables):
                out[f"{name}/opt/{i}"] = np.asarray(v)
            out.update(weights(model, f"{name}/w"))
        np.savez(path("keras.npz"), **out)
        return 0

    import tarantella as tnt
    tnt.init()
    rank = tnt.get_rank()
    pipelining = dict(parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                      num_micro_batches=MICRO_BATCHES, num_stages=args.stages)
    if args.mode == "save":
        # Values travel in pieces of at most 256 bytes here (16 MiB by
        # default): a 16 x 16 kernel goes in four, a bias in one.
        from tarantella.pipeline import checkpoint
        checkpoint.CHUNK_BYTES = 256
        model = tnt.Model(lambda: build(args.case), **pipelining)
        compile_model(model)
        fit(model, x, y)
        model.save_weights(path(FILES[0]))
        model.save_weights(path(FILES[1]))
        model.save(path(FILES[2]))
        with open(path(f"guard-save-{rank}.txt"), "w") as f:
            f.write(guard(tnt, model))
        errors = []
        for bad in (lambda: model.save_weights(path("w.h5")),
                    lambda: model.save_weights(path(FILES[1]), overwrite=False)):
            try:
                bad()
                errors.append("no error")
            except tnt.TarantellaError as e:
                errors.append(str(e))
        with open(path(f"errors-{rank}.txt"), "w") as f:
            f.write("\n".join(errors))
        out = {"predict": model.predict(x, batch_size=BATCH, verbose=0)}
        out.update(weights(model, "w"))
        fit(model, x, y)
        out.update(weights(model, "after"))
        if rank == 0:
            np.savez(path("save.npz"), **out)
        return 0

    if args.mode == "callback":
        model = tnt.Model(lambda: build(args.case), **pipelining)
        compile_model(model)
        fit_with_checkpoints(tnt, model, x, y, path)
        model.save(path("direct.keras"))
        model.save_weights(path("direct.weights.h5"))
        return 0

    loaded = tnt.models.load_model(path(FILES[2]), **pipelining)
    by_fn = tnt.Model(lambda: build(args.case), **pipelining)
    compile_model(by_fn)
    by_fn.load_weights(path(FILES[0]))
    with open(path(f"guard-resume-{rank}.txt"), "w") as f:
        f.write(f"{guard(tnt, loaded)} {guard(tnt, by_fn)}")
    fit(loaded, x, y)
    fit(by_fn, x, y)
    out = {"cuts": np.array([",".join(c) for c in by_fn._tnt.pipeline.partition.cut_names])}
    out.update(weights(loaded, "keras"))
    out.update(weights(by_fn, "json"))
    if rank == 0:
        np.savez(path("resume.npz"), **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
