"""Keras callbacks on many ranks.

Metrics in the logs are already global (see metrics.py), so a callback that
decides from them (EarlyStopping, ReduceLROnPlateau, LearningRateScheduler,
TerminateOnNaN) decides identically on every rank, and runs on every rank.
Callbacks that write files write them once:

* ModelCheckpoint and CSVLogger run on the master only; checkpoints are
  written through a temporary file and a rename (the model's saves are the
  master's alone while a master-only callback runs). The ModelCheckpoint
  of a pipelined model, or of one whose optimizer state is sharded
  (zero_stage), runs on every rank instead, and saves through the model's
  collective save (pipeline/checkpoint.py): no rank holds another stage's
  weights or another rank's part of the state for it;
* TensorBoard runs on the master only, or on every rank into
  ``<log_dir>/rank_<r>`` when TNT_TENSORBOARD_ON_ALL_DEVICES is true;
* BackupAndRestore is replaced by a DistributedBackupAndRestore made from
  it (backup/; a user's subclass keeps its own methods), which restores on every rank (the backup is
  read by all) and writes and deletes its backup on the master only (a
  pipelined model's stages write their own weights files), so that a job
  killed while it writes leaves the previous backup usable.

A callback that runs on the master only and raises ends fit on every rank:
the other ranks learn of the failure at the next epoch's end (or at the
start or end of training) and raise an error that names it.

User-defined callbacks run on every rank with the global logs, unless
wrapped in ``tnt.keras.callbacks.Callback`` to choose otherwise. Printing
(``verbose``) is left on the master only unless TNT_OUTPUT_ON_ALL_DEVICES.

Tarantella's wrappers forward only the hooks the wrapped callback defines,
so Keras still dispatches the batch hooks of the others asynchronously.
"""
import contextlib
import os

import keras

from tarantella import progress
from tarantella import runtime
from tarantella import settings
from tarantella import backup
from tarantella.backup import position

LOCAL_PREFIX = "tnt_local/"

_NO_INDEX = {"on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
             "on_predict_begin", "on_predict_end"}
_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
          "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
          "on_predict_batch_begin", "on_predict_batch_end")
# Keras's training batch hooks call these older names by default.
_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


def _without_local(logs):
    if logs is None or not any(k.startswith(LOCAL_PREFIX) for k in logs):
        return logs
    return {k: v for k, v in logs.items() if not k.startswith(LOCAL_PREFIX)}


def _defines(callback, hook):
    """True when `callback` has its own `hook` (from its class, or set on the
    instance as LambdaCallback does), not keras.callbacks.Callback's."""
    names = [hook] + ([_ALIASES[hook]] if hook in _ALIASES else [])
    return any(getattr(getattr(callback, n), "__func__", None)
               is not getattr(keras.callbacks.Callback, n) for n in names)


class _Forwarding(keras.callbacks.Callback):
    """Hands calls to `callback` with the logs that `_logs` chooses: here the
    global ones, without this rank's local metrics. Made with forwarding(),
    which gives it exactly the hooks it needs."""

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

    def _forward(self, name, args, logs):
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


def _hook(name):
    """The method `name`, which hands the call to self._forward; Keras passes
    logs by position or by keyword."""
    leading = 0 if name in _NO_INDEX else 1

    def method(self, *args, **kwargs):
        args = list(args)
        logs = kwargs.pop("logs") if "logs" in kwargs else (
            args.pop() if len(args) > leading else None)
        # Batches a resumed fit goes past untrained are no batches to callbacks.
        if name in _ALIASES and position.skipping(args[0]):
            return
        self._forward(name, args, logs)
    method.__name__ = name
    return method


_FORWARDING_CLASSES = {}


def forwarding(cls, callback, hooks, *args):
    """An instance of a subclass of `cls` (a _Forwarding) that defines the
    methods `hooks`, made for `callback`."""
    key = (cls, frozenset(hooks))
    sub = _FORWARDING_CLASSES.get(key)
    if sub is None:
        sub = type(cls.__name__, (cls,), {h: _hook(h) for h in hooks})
        _FORWARDING_CLASSES[key] = sub
    return sub(callback, *args)


def _forwarded_hooks(callback):
    hooks = [h for h in _HOOKS if _defines(callback, h)]
    if isinstance(callback, keras.callbacks.ModelCheckpoint) and callback.save_freq == "epoch":
        # Its batch hooks do nothing then; leaving them out keeps Keras's
        # asynchronous dispatch of batch hooks.
        hooks = [h for h in hooks if "batch" not in h]
    return hooks


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
        return logs_for(self.aggregate_logs, logs)


for _name in _HOOKS:
    setattr(Callback, _name, _hook(_name))


def logs_for(aggregate_logs, logs):
    """The global logs, or (aggregate_logs=False) this rank's own."""
    if logs is None or aggregate_logs:
        return _without_local(logs)
    return {k[len(LOCAL_PREFIX):]: v for k, v in logs.items() if k.startswith(LOCAL_PREFIX)}


class _WithLogs(_Forwarding):
    """Forwards with global or local logs (a tnt Callback's choice)."""

    def __init__(self, callback, aggregate_logs):
        super().__init__(callback)
        self.aggregate_logs = aggregate_logs

    def _logs(self, logs):
        return logs_for(self.aggregate_logs, logs)


# Where every rank learns whether a master-only callback has failed.
_AGREEMENT_HOOKS = ("on_train_begin", "on_epoch_end", "on_train_end")


class _MasterOnly(_WithLogs):
    """Runs `callback` on the master only, on behalf of every rank: every
    rank holds one, and at the start and end of training and at every
    epoch's end all of them learn whether the master's callback raised; if
    it did, fit ends on every rank with an error that names it."""

    def __init__(self, callback, aggregate_logs=True):
        super().__init__(callback, aggregate_logs)
        self._error = None

    def _forward(self, name, args, logs):
        if runtime.is_master_rank() and self._error is None:
            try:
                with _saves_of_this_rank(self.model):
                    super()._forward(name, args, logs)
            except Exception as e:  # reported to every rank below
                self._error = e
        if name in _AGREEMENT_HOOKS and runtime.get_size() > 1:
            self._agree(name)
        elif self._error is not None and runtime.get_size() == 1:
            raise self._error

    def _agree(self, hook):
        """Every rank learns the master's error (if any); raises it."""
        error = self._error
        text = runtime.master_message(
            None if error is None else f"{type(error).__name__}: {error}")
        if text is None:
            return
        if runtime.is_master_rank():
            raise error
        raise runtime.TarantellaError(
            f"the callback {type(self.callback).__name__}, which runs on the master rank only, "
            f"failed there ({text}); fit() ends on every rank (noticed at {hook})")


def _saves_of_this_rank(model):
    """A context in which `model`'s save and save_weights write from this
    rank alone (not collectively)."""
    local = getattr(model, "_tnt_saves_of_this_rank", None)
    return local() if local is not None else contextlib.nullcontext()


def _master_only(callback, aggregate_logs=True):
    hooks = set(_forwarded_hooks(callback)) | set(_AGREEMENT_HOOKS)
    return forwarding(_MasterOnly, callback, sorted(hooks), aggregate_logs)


def _quiet(callback):
    if (hasattr(callback, "verbose") and not runtime.is_master_rank()
            and not runtime.output_on_all_devices()):
        callback.verbose = 0


def distribute(callbacks, collective_saves=False):
    """The callbacks this rank runs, adapted as described above. A
    BackupAndRestore comes after the others, so that a backup taken at an
    epoch's end holds their state after that epoch (EarlyStopping's count),
    and a restored backup gives them their state after their on_train_begin
    reset it. With `collective_saves` (a pipelined model, or one whose
    optimizer state is sharded) a ModelCheckpoint runs on every rank: the
    model's save and save_weights, which it calls, are collective (the
    master writes the file from the values streamed to it), and it decides
    when to save from the global logs, alike on every rank."""
    out, backups = [], []
    for cb in callbacks or []:
        if collective_saves and isinstance(cb, keras.callbacks.ModelCheckpoint):
            _quiet(cb)
            out.append(forwarding(_Forwarding, cb, _forwarded_hooks(cb)))
            continue
        if isinstance(cb, Callback):
            _quiet(cb.callback)
            if cb.run_on_all_ranks:
                out.append(forwarding(_WithLogs, cb.callback, _forwarded_hooks(cb.callback),
                                      cb.aggregate_logs))
            else:
                out.append(_master_only(cb.callback, cb.aggregate_logs))
            continue
        if isinstance(cb, (keras.callbacks.ModelCheckpoint, keras.callbacks.CSVLogger,
                           keras.callbacks.TensorBoard)):
            on_all = (isinstance(cb, keras.callbacks.TensorBoard)
                      and settings.get("TNT_TENSORBOARD_ON_ALL_DEVICES"))
            if on_all:
                cb.log_dir = os.path.join(cb.log_dir, f"rank_{runtime.get_rank()}")
                out.append(forwarding(_Forwarding, cb, _forwarded_hooks(cb)))
            else:
                out.append(_master_only(cb))
            continue
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            cb = backup.distributed(cb, [c.callback if isinstance(c, Callback) else c
                                         for c in callbacks])
        _quiet(cb)
        if isinstance(cb, _FOUND_BY_TYPE):
            out.append(cb)  # Keras looks for it by its type (else it adds its own)
        else:
            wrapped = forwarding(_Forwarding, cb, _forwarded_hooks(cb))
            (backups if isinstance(cb, keras.callbacks.BackupAndRestore) else out).append(wrapped)
    return out + backups + [progress.Reporter()]


# The callbacks that Keras's CallbackList looks for by type, adding one of
# its own when the list has none: they are given to Keras as they are.
_FOUND_BY_TYPE = (keras.callbacks.ProgbarLogger, keras.callbacks.History)


def wants_local_logs(callbacks):
    """True when one of `callbacks` (from distribute) wants this rank's own logs."""
    return any(isinstance(cb, _WithLogs) and not cb.aggregate_logs for cb in callbacks)


def without_local_logs_in_progress_bars(callbacks):
    """`callbacks` (from distribute) with the user's progress bars made to
    show the global logs only, and one such bar added when there is none."""
    out = [forwarding(_Forwarding, cb, _forwarded_hooks(cb))
           if isinstance(cb, keras.callbacks.ProgbarLogger) else cb for cb in callbacks]
    if not any(isinstance(cb, keras.callbacks.ProgbarLogger) for cb in callbacks):
        bar = keras.callbacks.ProgbarLogger()
        out.append(forwarding(_Forwarding, bar, _forwarded_hooks(bar)))
    return out
