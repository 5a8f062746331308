"""Training that a fault interrupts, for the reliability tests.

kill        rank --victim SIGKILLs itself at global training step --step,
            after writing the time of the kill to --kill-file.
checkpoint  trains with BackupAndRestore (--dir/backup) and a full-model
            ModelCheckpoint per epoch (--dir/ckpt-<epoch>.keras); with
            --kill-at-rename N the master dies during its N-th atomic save:
            the temporary file is cut to half its size (bytes still on
            their way to disk) and the process is killed before the rename.
            --resume PATH loads that checkpoint with tnt.models.load_model
            and continues from --initial-epoch. Each rank writes its final
            weights to --out/rank<r>.npz.
"""
import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
from train_worker import make_data, make_model  # noqa: E402


class KillAtStep(keras.callbacks.Callback):
    def __init__(self, step, kill_file):
        super().__init__()
        self.step, self.kill_file, self.seen = step, kill_file, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            with open(self.kill_file, "w") as f:
                f.write(f"{time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)


def kill_during_rename(n):
    """Makes the n-th rename of a Tarantella temporary file the moment the
    process dies, with that file half written."""
    real_replace = os.replace
    count = [0]

    def replace(src, dst, *args, **kwargs):
        if ".tnt-tmp-" in os.fspath(src):
            count[0] += 1
            if count[0] == n:
                os.truncate(src, os.path.getsize(src) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst, *args, **kwargs)
    os.replace = replace


def compiled():
    model = tnt.Model(make_model(seed=3))
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def pipelined(stages):
    """A classifier cut into `stages` stages, and its data."""
    from pipeline_worker import build, data
    model = tnt.Model(build("cls", stages), parallel_strategy=tnt.ParallelStrategy.PIPELINING)
    model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, data("cls")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["kill", "checkpoint"])
    p.add_argument("--victim", type=int, default=0)
    p.add_argument("--step", type=int, default=1)
    p.add_argument("--kill-file")
    p.add_argument("--dir")
    p.add_argument("--out")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--kill-at-rename", type=int, default=0)
    p.add_argument("--resume")
    p.add_argument("--initial-epoch", type=int, default=0)
    p.add_argument("--pipeline", action="store_true",
                   help="kill: train a model cut into one stage per rank")
    args = p.parse_args()
    tnt.init()
    x, y = make_data(96)

    if args.mode == "kill":
        model = compiled()
        if args.pipeline:
            model, (x, y) = pipelined(tnt.get_size())
        cbs = [KillAtStep(args.step, args.kill_file)] if tnt.get_rank() == args.victim else []
        model.fit(x, y, batch_size=12, epochs=10000, verbose=0, shuffle=False, callbacks=cbs)
        sys.exit("training ended without the kill")

    if args.kill_at_rename and tnt.is_master_rank():
        kill_during_rename(args.kill_at_rename)
    model = tnt.models.load_model(args.resume) if args.resume else compiled()
    cbs = [keras.callbacks.BackupAndRestore(os.path.join(args.dir, "backup")),
           keras.callbacks.ModelCheckpoint(os.path.join(args.dir, "ckpt-{epoch}.keras"))]
    model.fit(x, y, batch_size=16, epochs=args.epochs, initial_epoch=args.initial_epoch,
              verbose=0, shuffle=False, callbacks=cbs)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{tnt.get_rank()}.npz"),
             *[np.asarray(w) for w in model.get_weights()])


if __name__ == "__main__":
    main()
