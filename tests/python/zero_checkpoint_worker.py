"""Checkpoints of models whose optimizer state is sharded (zero_stage).

train_worker's model learns with Adam (or, --mixed, under a
LossScaleOptimizer) on 120 samples in global batches of 20 (6 steps an
epoch), always from the same weights, in the same order.

    zero_checkpoint_worker.py save3 --dir D   (3 ranks) one epoch at stage 2,
        saved to D/ckpt3.keras; then a fit with BackupAndRestore(save_freq=4)
        at stage 2, interrupted at epoch 1, batch 3 (after the backup of
        step 8): its backup stays in D/backup3; then Adafactor's run, D/af-z2.keras
        and D/adafactor<r>.npz (see adafactor_run()).
    zero_checkpoint_worker.py main --dir D    (2 ranks) writes D/main.npz
        (rank 0; every rank's final weights in D/rank<r>.npz too): see main().
    zero_checkpoint_worker.py hybrid --dir D  (4 ranks) the same model cut in
        2 stages, ParallelStrategy.ALL (2 replicas): writes D/hybrid.npz
        (and D/hybrid<r>.npz): see hybrid_run().
    zero_checkpoint_worker.py keras --dir D   (one process, plain Keras)
        loads the files of main, hybrid and Adafactor's run and writes their
        weights and optimizer variables to D/keras.npz.

Values travel in pieces of at most 64 bytes here (16 MiB by default), so
that a slot goes to the master in several pieces, most of them cut across
the ranks' parts.
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_worker  # noqa: E402  (sets TensorFlow's threads and log level)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SAMPLES, BATCH = 120, 20
# Saved by main: the weights files and .keras files of stages 0, 2 and 3.
FILES = ("z0.keras", "z2.keras", "z3.keras", "callback-z2.keras", "callback-z3.keras",
         "z0.weights.h5", "z2.weights.h5", "z3.weights.h5", "z2.weights.json",
         "z3.weights.json", "mixed-z0.keras", "mixed-z2.keras", "mixed-z3.keras")
# Saved by hybrid, of the model cut in 2 stages.
HYBRID_FILES = ("hz0.keras", "hz2.keras", "hz0.weights.h5", "hz2.weights.h5",
                "hz2.weights.json")


def dataset():
    x, y = train_worker.make_data(SAMPLES)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def optimizer(mixed=False):
    adam = keras.optimizers.Adam(0.01)
    return keras.optimizers.LossScaleOptimizer(adam) if mixed else adam


def compiled(model, mixed=False):
    model.compile(optimizer=optimizer(mixed), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def new_model(tnt, stage, seed=3, mixed=False):
    return compiled(tnt.Model(train_worker.make_model(seed, mixed), zero_stage=stage), mixed)


def new_hybrid(tnt, stage, seed=3):
    """The model cut in 2 stages, under ParallelStrategy.ALL."""
    return compiled(tnt.Model(train_worker.make_cut_model(seed), zero_stage=stage,
                              parallel_strategy=tnt.ParallelStrategy.ALL, num_micro_batches=2))


def norm_model(seed):
    """train_worker's inputs through a dense layer, BatchNormalization and a
    softmax layer."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12,))
    h = keras.layers.BatchNormalization()(keras.layers.Dense(16)(inputs))
    return keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(h))


def fit(model, epochs=1, callbacks=()):
    model.fit(dataset(), epochs=epochs, verbose=0, shuffle=False, callbacks=list(callbacks))
    return model


class Interrupt(keras.callbacks.Callback):
    """Raises at `batch` of `epoch`, as a job that fails there."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.current, batch) == (self.epoch, self.batch):
            raise RuntimeError("interrupted")


def interrupted_backup(tnt, stage, backup_dir, new=new_model):
    """A fit of 2 epochs with BackupAndRestore(save_freq=4) at `stage`,
    interrupted at epoch 1, batch 3: its last backup is of step 8."""
    try:
        fit(new(tnt, stage), epochs=2, callbacks=[
            keras.callbacks.BackupAndRestore(backup_dir, save_freq=4), Interrupt(1, 3)])
    except RuntimeError as e:
        assert "interrupted" in str(e), e
    else:
        raise AssertionError("the fit was not interrupted")


def resumed(tnt, stage, backup_dir, new=new_model):
    """The model after the interrupted fit resumed from `backup_dir`."""
    return fit(new(tnt, stage, seed=5), epochs=2,
               callbacks=[keras.callbacks.BackupAndRestore(backup_dir, save_freq=4)])


def weights(model, prefix):
    return {f"{prefix}/{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}


def one_more_epoch(out, key, model):
    """Records the optimizer's step count of `model`, loaded from a file,
    and its weights after one more epoch, under `key`."""
    out[f"iterations-{key}"] = np.asarray(model.optimizer.iterations)
    out.update(weights(fit(model), key))


def from_weights_files(out, path, cases, new):
    """one_more_epoch of a new model (`new(stage)`, other initial weights)
    that loads the weights file `name`, for each (name, key, stage)."""
    for name, key, stage in cases:
        model = new(stage)
        model.load_weights(path(name))
        one_more_epoch(out, key, model)


def main_run(tnt, path):
    """Runs on 2 ranks; records (keys of main.npz):
    z0, z2, z3: the weights after 2 epochs at stages 0, 2 and 3, saved after
        the first;
    keras-z2, keras-z0: one epoch of models loaded (tnt.models.load_model) at
        stage 2 from z2.keras and from z0.keras; keras3-z3, keras3-z0: at
        stage 3 from z3.keras and z0.keras; keras0-z3: at stage 0 from z3.keras;
    h5-z1, json-z2, h5-z3, json-z3: one epoch of new models (other initial
        weights) that load_weights from z2.weights.h5 at stage 1,
        z2.weights.json at 2, z3.weights.h5 and z3.weights.json at 3;
    from3-z0, from3-z1, from3-z2, from3-z3: one epoch from ckpt3.keras (3
        ranks, stage 2) at stages 0 to 3;
    af-from3-z0, af-from3-z2: one epoch from af-z2.keras (3 ranks, stage 2,
        Adafactor) at stages 0 and 2;
    norm, norm-loaded: a model with BatchNormalization at stage 3, one more
        epoch after it was saved, and one epoch of the model load_model read
        from its file at stage 3;
    backup-z2, backup-z3: the interrupted fit at stage 2 (3), resumed at
        stage 2 (3);
    backup3-z0, backup3-z2, backup3-z3: save3's interrupted fit (3 ranks)
        resumed at stages 0, 2 and 3;
    iterations-*: the optimizer's step count after loading;
    alone: the error of a save at stage 2 from one rank alone."""
    out = {}
    for stage in (0, 2, 3):
        model = new_model(tnt, stage)
        callbacks = [keras.callbacks.ModelCheckpoint(path(f"callback-z{stage}.keras"))] \
            if stage else []
        fit(model, callbacks=callbacks)
        model.save(path(f"z{stage}.keras"))
        model.save_weights(path(f"z{stage}.weights.h5"))
        if stage:
            model.save_weights(path(f"z{stage}.weights.json"))
        if stage == 2:
            try:  # as a callback that runs on the master only would save
                with model._tnt_saves_of_this_rank():
                    model.save(path("alone.keras"))
            except tnt.TarantellaError as e:
                out["alone"] = np.array(str(e))
        out.update(weights(fit(model), f"z{stage}"))
        mixed = fit(new_model(tnt, stage, mixed=True))
        mixed.save(path(f"mixed-z{stage}.keras"))

    for name, key, stage in (("z2", "keras-z2", 2), ("z0", "keras-z0", 2),
                             ("z3", "keras3-z3", 3), ("z0", "keras3-z0", 3),
                             ("z3", "keras0-z3", 0)):
        one_more_epoch(out, key,
                       tnt.models.load_model(path(f"{name}.keras"), zero_stage=stage))
    from_weights_files(out, path, (("z2.weights.h5", "h5-z1", 1),
                                   ("z2.weights.json", "json-z2", 2),
                                   ("z3.weights.h5", "h5-z3", 3),
                                   ("z3.weights.json", "json-z3", 3)),
                       lambda stage: new_model(tnt, stage, seed=5))
    for stage in (0, 1, 2, 3):
        model = tnt.models.load_model(path("ckpt3.keras"), zero_stage=stage)
        out.update(weights(fit(model), f"from3-z{stage}"))
    for stage in (0, 2):  # Adafactor's moments, whole and in parts, on fewer ranks
        model = tnt.models.load_model(path("af-z2.keras"), zero_stage=stage)
        out.update(weights(fit(model), f"af-from3-z{stage}"))

    # BatchNormalization's statistics, loaded at stage 3 beside the parts.
    model = fit(compiled(tnt.Model(norm_model(3), zero_stage=3)))
    model.save(path("norm-z3.keras"))
    one_more_epoch(out, "norm-loaded", tnt.models.load_model(path("norm-z3.keras"),
                                                             zero_stage=3))
    out.update(weights(fit(model), "norm"))

    for stage in (2, 3):
        interrupted_backup(tnt, stage, path(f"backup-z{stage}"))
        out.update(weights(resumed(tnt, stage, path(f"backup-z{stage}")), f"backup-z{stage}"))
    for stage in (0, 2, 3):
        copy = path(f"backup3-z{stage}")
        if tnt.is_master_rank():
            shutil.copytree(path("backup3"), copy)
        tnt.allreduce(np.zeros(1))  # every rank waits for the copy
        out.update(weights(resumed(tnt, stage, copy), f"backup3-z{stage}"))
    return out


def adafactor_run(tnt, path):
    """Adafactor at stage 2, whose factored moments every rank holds whole
    (the rest of its state in parts); records (keys of adafactor<r>.npz):
    af-state/<i>: this rank's optimizer variables after one epoch, when the
        model was saved to af-z2.keras;
    af-z2: the weights after one more epoch;
    af-loaded: the weights after one epoch of the model that load_model read
        from af-z2.keras at stage 2; iterations-af-loaded its step count."""
    model = tnt.Model(train_worker.make_model(3), zero_stage=2)
    model.compile(optimizer=keras.optimizers.Adafactor(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit(model).save(path("af-z2.keras"))
    out = {f"af-state/{i}": np.asarray(v) for i, v in enumerate(model.optimizer.variables)}
    out.update(weights(fit(model), "af-z2"))
    one_more_epoch(out, "af-loaded", tnt.models.load_model(path("af-z2.keras"), zero_stage=2))
    return out


def hybrid_run(tnt, path):
    """Runs on 4 ranks, 2 stages x 2 replicas; records (keys of hybrid.npz):
    hz0, hz2: the weights after 2 epochs at stage 0 and 2, saved after the
        first (HYBRID_FILES);
    hkeras-z2, hkeras-z0: one epoch of models loaded at stage 2 from
        hz2.keras and hz0.keras;
    hh5-z2, hjson-z1: one epoch of new models (other initial weights) that
        load_weights from hz2.weights.h5 at stage 2 and hz2.weights.json at 1;
    hbackup-z2: an interrupted fit at stage 2, resumed at stage 2;
    iterations-*: the optimizer's step count after loading."""
    out = {}
    for stage in (0, 2):
        model = fit(new_hybrid(tnt, stage))
        model.save(path(f"hz{stage}.keras"))
        model.save_weights(path(f"hz{stage}.weights.h5"))
        if stage:
            model.save_weights(path("hz2.weights.json"))
        out.update(weights(fit(model), f"hz{stage}"))
    for name in ("z2", "z0"):
        one_more_epoch(out, f"hkeras-{name}", tnt.models.load_model(
            path(f"h{name}.keras"), zero_stage=2, num_micro_batches=2,
            parallel_strategy=tnt.ParallelStrategy.ALL))
    from_weights_files(out, path, (("hz2.weights.h5", "hh5-z2", 2),
                                   ("hz2.weights.json", "hjson-z1", 1)),
                       lambda stage: new_hybrid(tnt, stage, seed=5))
    interrupted_backup(tnt, 2, path("hbackup"), new_hybrid)
    out.update(weights(resumed(tnt, 2, path("hbackup"), new_hybrid), "hbackup-z2"))
    return out


def keras_run(path):
    """Plain Keras loads each of FILES and HYBRID_FILES; returns their
    weights and optimizer variables by file."""
    import tarantella  # noqa: F401  (registers SplitLayer: the hybrid files hold it)
    out = {}
    for name in FILES + HYBRID_FILES + ("af-z2.keras",):
        if name.endswith(".keras"):
            model = keras.saving.load_model(path(name))
        else:
            make = train_worker.make_cut_model if name.startswith("h") else \
                train_worker.make_model
            model = compiled(make(5))
            model.optimizer.build(model.trainable_variables)
            model.load_weights(path(name))
        out.update(weights(model, f"{name}/w"))
        for i, v in enumerate(model.optimizer.variables):
            out[f"{name}/opt/{i}"] = np.asarray(v)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save3", "main", "hybrid", "keras"])
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    path = lambda name: os.path.join(args.dir, name)  # noqa: E731
    if args.mode == "keras":
        np.savez(path("keras.npz"), **keras_run(path))
        return 0

    import tarantella as tnt
    from tarantella.pipeline import checkpoint
    tnt.init()
    checkpoint.CHUNK_BYTES = 64
    if args.mode == "save3":
        fit(new_model(tnt, 2)).save(path("ckpt3.keras"))
        interrupted_backup(tnt, 2, path("backup3"))
        np.savez(path(f"adafactor{tnt.get_rank()}.npz"), **adafactor_run(tnt, path))
        return 0
    if args.mode == "hybrid":
        out = hybrid_run(tnt, path)
        np.savez(path(f"hybrid{tnt.get_rank()}.npz"), **out)
        return 0
    out = main_run(tnt, path)
    if tnt.is_master_rank():
        np.savez(path("main.npz"), **out)
    np.savez(path(f"rank{tnt.get_rank()}.npz"), **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
