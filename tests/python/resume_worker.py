"""A fit with BackupAndRestore(save_freq=N) that a restart resumes: dropout
(random seed generators), Adam (optimizer state), NumPy inputs that fit
shuffles anew every epoch, and metrics. With --kill-rank R, rank R kills
itself (SIGKILL) at --kill-epoch/--kill-batch in the first attempt of the
job (TNT_RESTART_COUNT=0), after a backup and before the next; the launcher
then starts the job again and fit resumes from the backup. With
--hang-file F, rank R instead creates F there and waits, for the test to
take its host away. With --fill-disk F, the master fills the file system of
F (a small tmpfs) after step --fill-step, so that the next backup finds no
space left. --kill-in picks other moments for the kill, at global step
--kill-step (counted from 1) of the first attempt: "step" kills rank R in
the forward pass of that step, inside the traced train function;
"allreduce" kills it in the backward pass, --kill-delay seconds after it
started, when the other ranks are waiting for its gradients in the
allreduce; "backup" kills the master (the rank that writes the backup)
after it wrote half of the weights file of the backup taken after that
step, before the file is renamed. The master writes the final weights (and the logs of
the epochs) to --out. --plain trains a model that draws no random numbers
(no dropout) with SGD, whose result does not depend on the number of ranks
beyond rounding (for a job that shrinks); --zero-stage N shards its
optimizer state (tnt.Model's zero_stage). --pipeline [K] cuts the model
into K pipeline stages (2 by default; ParallelStrategy.PIPELINING, 2
micro-batches), the dropout in the last.

    resume_worker.py BACKUP_DIR --out W.npz [--save-freq N] [--kill-rank R ...]
"""
import argparse
import io
import json
import os
import signal
import time

import tensorflow as tf  # noqa: E402  (the fault hooks run inside the traced step)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402


class KillAt(keras.callbacks.Callback):
    def __init__(self, rank, epoch, batch, hang_file):
        super().__init__()
        self.rank, self.epoch, self.batch = rank, epoch, batch
        self.hang_file = hang_file
        self.current = None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (tnt.get_rank() == self.rank and (self.current, batch) == (self.epoch, self.batch)
                and os.environ["TNT_RESTART_COUNT"] == "0"):
            if self.hang_file:
                print(f"rank {self.rank} waits at epoch {self.epoch} batch {batch}", flush=True)
                open(self.hang_file, "w").close()
                time.sleep(600)
            print(f"rank {self.rank} kills itself at epoch {self.epoch} batch {batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def first_attempt():
    return os.environ["TNT_RESTART_COUNT"] == "0"


def die(what):
    print(f"rank {tnt.get_rank()} kills itself {what}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class KillInStep(keras.layers.Layer):
    """Passes its input on unchanged. When armed (on the rank to kill, in
    the first attempt), it counts the training forward passes and kills the
    rank in the forward (where="step") or backward (where="allreduce") pass
    of step `step`; unarmed, it adds no operation to the model."""

    def __init__(self, armed=False, where="step", step=0, delay=0.0, **kwargs):
        super().__init__(**kwargs)
        self.armed, self.where, self.step, self.delay = armed, where, step, delay
        self.forwards = 0

    def _forward(self):
        self.forwards += 1
        if self.where == "step" and self.forwards == self.step:
            die(f"in the forward pass of step {self.step}")
        return 0

    def _backward(self):
        if self.where == "allreduce" and self.forwards == self.step:
            # The layers after this one are differentiated; the other ranks
            # finish their backward pass and wait in the allreduce.
            time.sleep(self.delay)
            die(f"in the backward pass of step {self.step}")
        return 0

    def call(self, x, training=False):
        if not (self.armed and training):
            return x

        @tf.custom_gradient
        def hooked(x):
            def grad(dy):
                with tf.control_dependencies([tf.py_function(self._backward, [], tf.int32)]):
                    return tf.identity(dy)
            with tf.control_dependencies([tf.py_function(self._forward, [], tf.int32)]):
                return tf.identity(x), grad
        return hooked(x)


class KillInBackup:
    """Replaces np.savez: at the backup taken after global step `step` (the
    master writes it after its 'step'-th batch), writes half of the weights
    file and kills the rank before the file is complete and renamed."""

    def __init__(self, step):
        self.step, self.steps, self.savez = step, 0, np.savez
        np.savez = self.patched

    def count(self):
        self.steps += 1

    def patched(self, file, *args, **kwargs):
        if self.steps == self.step and hasattr(file, "write") and "weights" in file.name:
            buffer = io.BytesIO()
            self.savez(buffer, *args, **kwargs)
            file.write(buffer.getvalue()[:buffer.tell() // 2])
            file.flush()
            os.fsync(file.fileno())
            die(f"while writing {os.path.basename(file.name)} of the backup after step {self.step}")
        return self.savez(file, *args, **kwargs)


class CountSteps(keras.callbacks.Callback):
    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def on_train_batch_begin(self, batch, logs=None):
        self.counter.count()


class FillDisk(keras.callbacks.Callback):
    """After global step `step`, writes `path` until the disk is full."""

    def __init__(self, step, path):
        super().__init__()
        self.step, self.path, self.steps = step, path, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps != self.step:
            return
        with open(self.path, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                print(f"the disk is full: {e.strerror}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("backup_dir")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-freq", type=lambda v: v if v == "epoch" else int(v), default=4,
                        help='steps between backups, or "epoch"')
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, help="given to fit")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-epoch", type=int, default=1)
    parser.add_argument("--kill-batch", type=int, default=3)
    parser.add_argument("--kill-in", choices=("batch-end", "step", "allreduce", "backup"),
                        default="batch-end")
    parser.add_argument("--kill-step", type=int, default=0)
    parser.add_argument("--kill-delay", type=float, default=3.0)
    parser.add_argument("--hang-file")
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--zero-stage", type=int, default=0)
    parser.add_argument("--pipeline", type=int, nargs="?", const=2, default=0,
                        help="cut the model into this many pipeline stages (2 by default)")
    parser.add_argument("--early-stopping", action="store_true")
    parser.add_argument("--fill-disk")
    parser.add_argument("--fill-step", type=int, default=5)
    args = parser.parse_args()
    tnt.init()
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")
    dropout = [] if args.plain else [keras.layers.Dropout(0.3)]
    # The kill matrix's runs (--kill-in other than batch-end) have the hook
    # layer, armed on the rank to kill only; the others leave it out.
    hook = KillInStep(args.kill_in in ("step", "allreduce") and tnt.get_rank() == args.kill_rank
                      and first_attempt(), args.kill_in, args.kill_step, args.kill_delay)
    hooks = [] if args.kill_in == "batch-end" else [hook]
    if args.pipeline:
        inputs = keras.Input((8,))
        h = tnt.keras.layers.SplitLayer()(keras.layers.Dense(16, activation="relu")(inputs))
        for _ in range(args.pipeline - 2):
            h = tnt.keras.layers.SplitLayer()(keras.layers.Dense(16, activation="relu")(h))
        for layer in dropout + [keras.layers.Dense(3, activation="softmax")]:
            h = layer(h)
        model = tnt.Model(keras.Model(inputs, h), num_micro_batches=2,
                          parallel_strategy=tnt.ParallelStrategy.PIPELINING)
    else:
        model = tnt.Model(keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu")] + hooks + dropout +
            [keras.layers.Dense(3, activation="softmax")]), zero_stage=args.zero_stage)
    optimizer = (keras.optimizers.SGD(0.1, momentum=0.9) if args.plain
                 else keras.optimizers.Adam(0.01))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    callbacks = [keras.callbacks.BackupAndRestore(args.backup_dir, save_freq=args.save_freq,
                                                  delete_checkpoint=False)]
    if args.early_stopping:
        # The loss never improves by 1: training stops after epoch 2.
        stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=2, min_delta=1.0)
        callbacks.append(stopping)
    if args.fill_disk and tnt.is_master_rank():
        callbacks.append(FillDisk(args.fill_step, args.fill_disk))
    if args.kill_in == "backup" and tnt.is_master_rank() and first_attempt():
        callbacks.append(CountSteps(KillInBackup(args.kill_step)))
    if args.kill_in == "batch-end" and args.kill_rank >= 0:
        callbacks.append(KillAt(args.kill_rank, args.kill_epoch, args.kill_batch, args.hang_file))
    if not first_attempt() and tnt.is_master_rank():
        with open(os.path.join(args.backup_dir, "training_metadata.json")) as f:
            meta = json.load(f)
        print(f"resumes from the backup of epoch {meta['epoch']} batch {meta['batch']}",
              flush=True)
    history = model.fit(x, y, batch_size=16, epochs=args.epochs, shuffle=True, verbose=0,
                        callbacks=callbacks, steps_per_epoch=args.steps_per_epoch)
    weights = model.get_weights()  # collective for a pipelined model
    if tnt.is_master_rank():
        np.savez(args.out, *weights)
        last = {k: float(v[-1]) for k, v in history.history.items()}
        summary = {"epochs": history.epoch, "last": last, "history": history.history}
        if args.early_stopping:
            summary["early_stopping"] = {a: float(getattr(stopping, a)) for a in
                                         ("wait", "best", "best_epoch", "stopped_epoch")}
        with open(args.out + ".json", "w") as f:
            json.dump(summary, f)
    print(f"rank {tnt.get_rank()} done")


if __name__ == "__main__":
    main()
