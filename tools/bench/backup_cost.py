#!/usr/bin/env python3
"""The step-time cost of BackupAndRestore(save_freq=N) on the quick start.

Times fits of the quick start's LeNet-5 with and without
keras.callbacks.BackupAndRestore in ABBA rounds, and each backup's own
time; the method: docs/research/benchmarks.md.

    tarantella -n 2 -- tools/bench/backup_cost.py --save-freq 50 \\
        [--dir /tmp/backup] [--json bench/results/reliability_backup.jsonl]
"""
import argparse
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
from bench_results import module_of, write_results  # noqa: E402

fashion_mnist = module_of("examples", "fashion_mnist")
DATA_DIR, load_fashion_mnist = fashion_mnist.DATA_DIR, fashion_mnist.load_fashion_mnist
lenet5_model_generator = module_of("examples", "quick_start").lenet5_model_generator


class StepClock(keras.callbacks.Callback):
    """The time from the end of the first training step to the end of the last."""

    def on_train_begin(self, logs=None):
        self.first = self.last = None

    def on_train_batch_end(self, batch, logs=None):
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last


class TimedBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore that records how long each of its backups takes:
    with an integer save_freq it backs up after every save_freq-th batch
    of the fit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.durations, self.batches = [], 0

    def on_train_batch_end(self, batch, logs=None):
        start = time.perf_counter()
        super().on_train_batch_end(batch, logs)
        self.batches += 1
        if self.batches % self.save_freq == 0:
            self.durations.append(time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-freq", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200, help="steps of each timed fit")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of four fits (ABBA)")
    parser.add_argument("--dir", help="where the backups go (default: a temporary folder)")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    tnt.init()
    keras.utils.set_random_seed(42)
    (x, y), _ = load_fashion_mnist(DATA_DIR)
    batch = 64
    data = tf.data.Dataset.from_tensor_slices((x[:batch * args.steps], y[:batch * args.steps]))
    data = data.shuffle(batch * args.steps, seed=42).batch(batch)
    model = tnt.Model(lenet5_model_generator())
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    model.fit(data, epochs=1, verbose=0)  # warm-up: tracing, the first allocation
    root = args.dir or tempfile.mkdtemp(prefix="tnt-backup-cost-")
    clock = StepClock()
    times = {False: [], True: []}
    backup_s = []
    for r in range(args.rounds):
        for with_backup in (False, True, True, False):
            # BackupAndRestore deletes its backup at the end of the fit.
            backup_dir = os.path.join(root, f"round{r}")
            callbacks = [clock]
            if with_backup:
                callbacks.append(TimedBackup(backup_dir, save_freq=args.save_freq))
            model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
            if with_backup:
                backup_s += callbacks[-1].durations
            times[with_backup].append((clock.last - clock.first) / (args.steps - 1))
    if not tnt.is_master_rank():
        return
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    plain = np.array(times[False]).reshape(args.rounds, 2).mean(axis=1)
    backed = np.array(times[True]).reshape(args.rounds, 2).mean(axis=1)
    costs = backed / plain - 1
    # A backup's time over save_freq steps without backups.
    estimate = float(np.median(backup_s)) / (args.save_freq * float(np.median(plain)))
    write_results(args.json, "reliability_backup", {
        "config": {"ranks": tnt.get_size(), "global_batch": batch,
                   "save_freq": args.save_freq, "steps": args.steps},
        "rounds": [{"round": r, "ms_per_step_without": plain[r] * 1e3,
                    "ms_per_step_with": backed[r] * 1e3, "cost": costs[r]}
                   for r in range(args.rounds)],
        "median_cost": float(np.median(costs)),
        "backup_ms": [t * 1e3 for t in backup_s], "estimated_cost": estimate})

if __name__ == "__main__":
    main()
