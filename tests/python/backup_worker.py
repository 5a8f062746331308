"""BackupAndRestore(double_checkpoint=True) on the ranks of a job: training
is interrupted at epoch 3, the latest backup's weights file is then damaged,
and a new fit restores the previous backup (epoch 2) on every rank, as
Keras's own BackupAndRestore falls back to its previous checkpoint; the
History it returns holds the epochs of the backup too; a user's subclass
of BackupAndRestore keeps its own methods."""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402


class Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 3:
            raise RuntimeError("interrupted")


class EpochsRun(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


class CountingBackup(keras.callbacks.BackupAndRestore):
    """A user's subclass: its own attribute and method run under Tarantella."""

    def __init__(self, backup_dir):
        super().__init__(backup_dir, double_checkpoint=True)
        self.ended = []

    def on_epoch_end(self, epoch, logs=None):
        self.ended.append(epoch)
        super().on_epoch_end(epoch, logs)


def model():
    keras.utils.set_random_seed(1)
    m = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    m.compile(optimizer="sgd", loss="mse")
    return m


def main():
    backup_dir = sys.argv[1]
    tnt.init()
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x[:, :2].copy()
    try:
        model().fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup_dir, double_checkpoint=True), Interrupt()])
    except RuntimeError as e:
        print(f"rank {tnt.get_rank()}: first fit {e}")
    meta = json.load(open(os.path.join(backup_dir, "training_metadata.json")))
    if tnt.is_master_rank():
        print("metadata", json.dumps(meta, sort_keys=True))
        with open(os.path.join(backup_dir, meta["tnt_weights"]), "wb") as f:
            f.write(b"damaged")
    tnt.allreduce(np.zeros(1))  # every rank waits for the damage
    ran, counting = EpochsRun(), CountingBackup(backup_dir)
    history = model().fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[counting, ran])
    print(f"rank {tnt.get_rank()}: resumed for epochs {ran.epochs}, History of epochs "
          f"{history.epoch} with {len(history.history['loss'])} losses")
    print(f"rank {tnt.get_rank()}: the subclass's on_epoch_end ran for epochs {counting.ended}")


if __name__ == "__main__":
    main()
