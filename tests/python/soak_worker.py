"""Trains a small model for 2000 steps and records memory and file
descriptors along the way; writes OUT/rank<r>.npz."""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
from train_worker import make_data, make_model  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
MARKS = (100, 500, 1000, 1500, 2000)


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Probe(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch, self.rows = 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self.params["steps"] * self.epoch + batch + 1
        if step in MARKS:
            self.rows.append((step, rss_mb(), len(os.listdir("/proc/self/fd"))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    tnt.init()
    x, y = make_data(4000)
    model = tnt.Model(make_model(3))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    probe = Probe()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(40)  # 100 steps an epoch
    model.fit(ds, epochs=20, verbose=0, callbacks=[tnt.keras.callbacks.Callback(probe)])
    np.savez(os.path.join(args.out, f"rank{tnt.get_rank()}.npz"), probe=np.array(probe.rows),
             weights=np.concatenate([w.ravel() for w in model.get_weights()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
