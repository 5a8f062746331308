"""Keras callbacks on many ranks.

Metrics in the logs are already global (see metrics.py), so a callback that
decides from them (EarlyStopping, ReduceLROnPlateau, LearningRateScheduler,
TerminateOnNaN) decides identically on every rank, and runs on every rank.
Callbacks that write files write them once:

* ModelCheckpoint and CSVLogger run on the master rank only; checkpoints
  are written through a temporary file and a rename;
* TensorBoard runs on the master only, or on every rank into
  ``<log_dir>/rank_<r>`` when TNT_TENSORBOARD_ON_ALL_DEVICES is true;
* BackupAndRestore restores on every rank (the backup is read by all) and
  writes and deletes its backup on the master only, so that a job killed
  while it writes leaves the previous backup usable.

User-defined callbacks run on every rank with the global logs, unless
wrapped in ``tnt.keras.callbacks.Callback`` to choose otherwise. Printing
(``verbose``) is left on the master only unless TNT_OUTPUT_ON_ALL_DEVICES.
"""
import os

import keras

from tarantella import log
from tarantella import runtime

LOCAL_PREFIX = "tnt_local/"


_NO_INDEX = {"on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
             "on_predict_begin", "on_predict_end"}
_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
          "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
          "on_predict_batch_begin", "on_predict_batch_end")


def _without_local(logs):
    if logs is None or not any(k.startswith(LOCAL_PREFIX) for k in logs):
        return logs
    return {k: v for k, v in logs.items() if not k.startswith(LOCAL_PREFIX)}


class _Forwarding(keras.callbacks.Callback):
    """Hands every call to `callback` with the logs that `_logs` chooses:
    here the global ones, without this rank's local metrics."""

    def __init__(self, callback):
        super().__init__()
        self.callback = callback

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def _logs(self, logs):
        return _without_local(logs)


def _hook(name):
    """The method `name`: calls it on self.callback with self._logs(logs);
    Keras passes logs by position or by keyword."""
    leading = 0 if name in _NO_INDEX else 1

    def method(self, *args, **kwargs):
        args = list(args)
        logs = kwargs.pop("logs") if "logs" in kwargs else (
            args.pop() if len(args) > leading else None)
        seen = self._logs(logs)
        given = dict(seen) if seen is not logs and seen is not None else None
        getattr(self.callback, name)(*args, logs=seen)
        # Callbacks add to the logs they get (ReduceLROnPlateau adds the
        # learning rate): hand what they added or changed to the callbacks
        # after them.
        if given is not None and logs is not None:
            for k, v in seen.items():
                if k not in given or given[k] is not v:
                    logs[k] = v
    method.__name__ = name
    return method


for _name in _HOOKS:
    setattr(_Forwarding, _name, _hook(_name))


class Callback(_Forwarding):
    """Runs `callback` on every rank or the master only, with global logs
    (aggregate_logs=True) or this rank's own (aggregate_logs=False)."""

    def __init__(self, callback, run_on_all_ranks=True, aggregate_logs=True):
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(f"tnt.keras.callbacks.Callback wraps a keras.callbacks.Callback; "
                            f"got {type(callback).__name__}")
        super().__init__(callback)
        self.run_on_all_ranks = run_on_all_ranks
        self.aggregate_logs = aggregate_logs

    def _logs(self, logs):
        if logs is None or self.aggregate_logs:
            return _without_local(logs)
        return {k[len(LOCAL_PREFIX):]: v for k, v in logs.items() if k.startswith(LOCAL_PREFIX)}


class _AtomicSaves:
    """The model as ModelCheckpoint sees it: saves go through a temporary
    file and a rename, so a job killed while saving leaves the previous
    checkpoint intact; everything else is the model's."""

    def __init__(self, model):
        object.__setattr__(self, "_model", model)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_model"), name)

    def __setattr__(self, name, value):
        setattr(object.__getattribute__(self, "_model"), name, value)

    def save(self, filepath, *args, **kwargs):
        from tarantella import models
        models.write_atomically(filepath, lambda p: self._model.save(p, *args, **kwargs))

    def save_weights(self, filepath, *args, **kwargs):
        from tarantella import models
        models.write_atomically(filepath,
                                lambda p: self._model.save_weights(p, *args, **kwargs))


class _Checkpointing(_Forwarding):
    """Runs a ModelCheckpoint whose saves are atomic."""

    def set_model(self, model):
        keras.callbacks.Callback.set_model(self, model)
        self.callback.set_model(_AtomicSaves(model))


def _quiet(callback):
    if (hasattr(callback, "verbose") and not runtime.is_master_rank()
            and not runtime.output_on_all_devices()):
        callback.verbose = 0


def _backup_atomically(callback):
    """Makes a BackupAndRestore write on the master only, and so that a job
    killed at any moment leaves a consistent backup: the weights go to a
    new file named by epoch and batch (through a temporary file), then the
    metadata that names that file replaces the previous metadata in one
    rename, and only then the previous weights file is deleted. Every rank
    restores the weights the metadata names."""
    import json
    from tarantella import models

    def weights_named():
        try:
            with open(callback._training_metadata_path) as f:
                return json.load(f).get("tnt_weights")
        except (OSError, ValueError):
            return None

    keras_load = callback._load_model

    def load():
        name = weights_named()
        if name is not None:
            callback._weights_path = os.path.join(callback.backup_dir, name)
        keras_load()

    def save():
        os.makedirs(callback.backup_dir, exist_ok=True)
        previous = weights_named()
        name = f"epoch{callback._current_epoch}-batch{callback._last_batch_seen}.weights.h5"
        models.write_atomically(os.path.join(callback.backup_dir, name),
                                lambda p: callback.model.save_weights(p, overwrite=True))
        meta = json.dumps({"epoch": callback._current_epoch,
                           "batch": callback._last_batch_seen, "tnt_weights": name})

        def write_meta(path):
            with open(path, "w") as f:
                f.write(meta)
        models.write_atomically(callback._training_metadata_path, write_meta)
        if previous is not None and previous != name:
            try:
                os.remove(os.path.join(callback.backup_dir, previous))
            except FileNotFoundError:
                pass

    callback._load_model = load
    if runtime.is_master_rank():
        callback._save_model = save
    else:
        callback._save_model = lambda *args, **kwargs: None
        callback.on_train_end = lambda logs=None: None


def distribute(callbacks):
    """The callbacks this rank runs, adapted as described above."""
    master = runtime.is_master_rank()
    out = []
    for cb in callbacks or []:
        if isinstance(cb, Callback):
            if cb.run_on_all_ranks or master:
                _quiet(cb.callback)
                out.append(cb)
            continue
        if isinstance(cb, keras.callbacks.ModelCheckpoint):
            if master:
                out.append(_Checkpointing(cb))
            continue
        if isinstance(cb, keras.callbacks.CSVLogger):
            if master:
                out.append(_Forwarding(cb))
            continue
        if isinstance(cb, keras.callbacks.TensorBoard):
            on_all = log._truthy(os.environ.get("TNT_TENSORBOARD_ON_ALL_DEVICES", "false"))
            if on_all:
                cb.log_dir = os.path.join(cb.log_dir, f"rank_{runtime.get_rank()}")
                out.append(_Forwarding(cb))
            elif master:
                out.append(_Forwarding(cb))
            continue
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            _backup_atomically(cb)
        _quiet(cb)
        out.append(_Forwarding(cb))
    return out
