"""Keras callbacks on many ranks.

Metrics in the logs are already global (see metrics.py), so a callback that
decides from them (EarlyStopping, ReduceLROnPlateau, LearningRateScheduler,
TerminateOnNaN) decides identically on every rank, and runs on every rank.
Callbacks that write files write them once:

* ModelCheckpoint and CSVLogger run on the master only; checkpoints are
  written through a temporary file and a rename (the model's saves are the
  master's alone while a master-only callback runs). A pipelined model's
  ModelCheckpoint runs on every rank instead, and saves through the
  model's collective save (pipeline/checkpoint.py): no rank holds another
  stage's weights for it;
* TensorBoard runs on the master only, or on every rank into
  ``<log_dir>/rank_<r>`` when TNT_TENSORBOARD_ON_ALL_DEVICES is true;
* BackupAndRestore restores on every rank (the backup is read by all) and
  writes and deletes its backup on the master only (a pipelined model's
  stages write their own weights files), so that a job killed while it
  writes leaves the previous backup usable.

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
import json
import os
import re

import keras
import numpy as np

from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import progress
from tarantella import resume
from tarantella import runtime
from tarantella import saving
from tarantella import settings

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
        if name in _ALIASES and resume.skipping(args[0]):
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


# The metadata's names of a backup's files.
_BACKUP_FILES = ("tnt_weights", "tnt_previous", "tnt_state", "tnt_previous_state")


def _backup_files(meta):
    """The names of the files of the backups that the metadata `meta`
    names (a pipelined model's weights are a list of files, one a stage)."""
    names = set()
    for k in _BACKUP_FILES:
        value = meta.get(k)
        names.update(value if isinstance(value, list) else [value])
    names.discard(None)
    return names


def _remove_files(directory, names, keep):
    """Removes the files `names` of `directory` not in `keep`."""
    for name in names:
        if name not in keep:
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def _savez(path, arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _backup_error(path, error, old):
    """What went wrong when the master wrote the backup file `path`, and
    which backup (the metadata `old`) is kept."""
    cause = error
    while cause.__cause__ is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    errno = getattr(cause, "errno", None)
    if errno is None:
        # h5py writes the errno into the message of the OSError it raises.
        found = re.search(r"\[Errno (\d+)\]", str(cause))
        errno = int(found.group(1)) if found else None
    reason = (f"{os.strerror(errno)} (errno {errno})" if errno
              else f"{type(error).__name__}: {error}")
    kept = (f"the previous backup (epoch {old.get('epoch', 0)}, batch {old['batch']}) is kept, "
            "and a fit started again resumes from it" if old.get("tnt_weights")
            else "no earlier backup exists")
    return f"BackupAndRestore could not write {path}: {reason}; {kept}"


def _backup_atomically(callback, callbacks):
    """Makes a BackupAndRestore write on the master only, and so that a job
    killed at any moment leaves a consistent backup: the weights go to a
    new file named by epoch and batch (through a temporary file; a
    pipelined model's go to a file per stage, each written by the stage's
    rank of the first replica, and every rank learns whether all of them
    were written), and so does the state the weights leave out (resume.py:
    every rank's random seeds and metric accumulators); then the metadata
    that names these files replaces the previous metadata in one rename, and
    only then the previous files are deleted. Every rank restores the
    backup the metadata names (of a pipelined model: its stage's file) and
    goes on from the batch after it (resume.py). With
    double_checkpoint=True the previous backup is kept and named in the
    metadata too, and a restore that cannot read the latest weights (an
    I/O error) restores the previous ones, as Keras's own BackupAndRestore
    does. The backup also holds the logs of the finished epochs and the state
    of the user's `callbacks` that fit keeps from epoch to epoch
    (resume.callbacks_state), which a resumed fit gives back to them and to
    its History when its first epoch begins, after every callback's
    on_train_begin has reset them."""
    backup = internals.BackupState(callback)
    model_of = lambda: callback.model  # noqa: E731
    pending = {}  # the restored backup's position and state, until its epoch begins
    finished = {}  # the logs of the finished epochs of the fit in progress

    def metadata():
        try:
            with open(backup.metadata_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def restore_position(meta, prefix):
        """After the weights of the backup that meta names (prefix "" for
        the latest, "previous_" for the one before) were loaded."""
        state = meta.get(f"tnt_{prefix}state")
        if state is None:
            return
        epoch = meta["epoch"] if not prefix else meta.get("tnt_previous_epoch", 0)
        batches = meta.get(f"tnt_{prefix}batches_done", 0)
        with np.load(os.path.join(callback.backup_dir, state)) as tables:
            pending.update(tables=dict(tables), batches=batches)
        backup.resume_at(epoch, batches)
        resume.replay_iterators(model_of(), meta.get(f"tnt_{prefix}iterators_to_replay", 0))

    def restore(names):
        """Restores this rank's file of the weights files `names`; returns
        why this rank (of a pipeline: the first rank that) could not read
        its file, or None. Collective for a pipelined model."""
        name = resume.weights_file_to_restore(model_of(), names)
        try:
            resume.restore_variables(model_of(), os.path.join(callback.backup_dir, name))
            unreadable = None
        except resume.UnreadableBackup as e:
            unreadable = str(e)
        if isinstance(names, list):  # the stages restore the same backup
            unreadable = runtime.first_message(unreadable)
        return unreadable

    def load():
        meta = metadata()
        names = meta.get("tnt_weights")
        if names is None:
            return backup.keras_load()
        unreadable = restore(names)
        if unreadable is None:
            backup.set_initial_epoch(meta["epoch"])
            restore_position(meta, "")
            return
        previous = meta.get("tnt_previous")
        if not previous:
            raise resume.UnreadableBackup(unreadable)
        log.logger.warning("%s; restoring the previous backup %s", unreadable, previous)
        unreadable = restore(previous)
        if unreadable is not None:
            raise resume.UnreadableBackup(unreadable)
        backup.set_initial_epoch(meta.get("tnt_previous_epoch", 0))
        restore_position(meta, "previous_")

    keras_train_begin = callback.on_train_begin

    def on_train_begin(logs=None):
        finished.clear()
        keras_train_begin(logs)

    def on_epoch_begin(epoch, logs=None):
        if not pending:
            return
        tables = pending.pop("tables")
        finished.update(resume.restore_callbacks_state(user_callbacks, model_of(), tables))
        if not resume.restore_seeds(model_of(), tables):
            log.logger.info("BackupAndRestore: the backup was taken on %d ranks: training goes "
                            "on from it with fresh random seeds and metrics",
                            len(tables["seeds"]))
        resume.skip_batches(model_of(), pending.pop("batches"), tables["metrics"])

    keras_epoch_end = callback.on_epoch_end

    def on_epoch_end(epoch, logs=None):
        resume.end_of_epoch()
        finished[epoch] = dict(logs or {})
        keras_epoch_end(epoch, logs)

    def write_weights(name, writing):
        """Writes this rank's weights file `name` of the backup. The file
        being written is writing[0]."""
        writing[0] = callback.backup_dir
        os.makedirs(callback.backup_dir, exist_ok=True)
        writing[0] = os.path.join(callback.backup_dir, name)
        arrays = resume.variables_snapshot(model_of())
        saving.write_atomically(writing[0], lambda path: _savez(path, arrays))

    def write(names, state, tables, old, writing):
        """Writes the backup's state file `state`, then the metadata that
        names it and the weights files `names` (master). The file being
        written is writing[0]. Returns the names of the files the metadata
        names."""
        writing[0] = os.path.join(callback.backup_dir, state)
        saving.write_atomically(writing[0], lambda path: _savez(path, tables))
        done = backup.batches_done()
        meta = {"epoch": backup.epoch, "batch": backup.batch, "tnt_weights": names,
                "tnt_state": state, "tnt_batches_done": done,
                "tnt_iterators_to_replay": resume.iterators_to_replay(model_of(), done)}
        if callback.double_checkpoint and old.get("tnt_weights") not in (None, names):
            meta.update(tnt_previous=old["tnt_weights"], tnt_previous_epoch=old.get("epoch", 0),
                        tnt_previous_state=old.get("tnt_state"),
                        tnt_previous_batches_done=old.get("tnt_batches_done", 0),
                        tnt_previous_iterators_to_replay=old.get("tnt_iterators_to_replay", 0))
        text = json.dumps(meta)

        def write_meta(path):
            with open(path, "w") as f:
                f.write(text)
        writing[0] = backup.metadata_path
        saving.write_atomically(writing[0], write_meta)
        return _backup_files(meta)

    def save():
        tables = resume.gather(model_of())  # collective: every rank saves
        base = f"epoch{backup.epoch}-batch{backup.batch}"
        names, state = resume.weights_files(model_of(), base), f"{base}.state.npz"
        own = resume.own_weights_file(model_of(), names)
        old = metadata() if own is not None or runtime.is_master_rank() else {}
        writing, error, text = [None], None, None
        if own is not None:
            try:
                write_weights(own, writing)
            except Exception as e:  # noqa: BLE001 (every rank learns of any failure)
                error, text = e, _backup_error(writing[0], e, old)
        if isinstance(names, list):  # the first failed stage writer's error, on every rank
            text = runtime.first_message(text)
        if runtime.is_master_rank():
            if text is None:
                tables.update(resume.callbacks_state(user_callbacks, finished))
                try:
                    keep = write(names, state, tables, old, writing)
                except Exception as e:  # noqa: BLE001 (every rank learns of any failure)
                    error, text = e, _backup_error(writing[0], e, old)
                else:
                    _remove_files(callback.backup_dir, _backup_files(old), keep)
                    # What a job killed while it wrote a backup left behind.
                    saving.remove_leftover_temporaries(callback.backup_dir)
            if text is not None:
                # What this backup wrote before it failed; the previous backup is untouched.
                new = _backup_files({"tnt_weights": names, "tnt_state": state})
                _remove_files(callback.backup_dir, new, _backup_files(old))
        # The master's error (or a stage's), on every rank, so that all stop at once.
        text = runtime.master_message(text)
        if text is not None:
            raise runtime.TarantellaError(text) from error

    user_callbacks = [cb.callback if isinstance(cb, Callback) else cb for cb in callbacks]
    backup.keras_load_hook(load)
    backup.keras_save_hook(save)
    callback.on_train_begin = on_train_begin
    callback.on_epoch_begin = on_epoch_begin
    callback.on_epoch_end = on_epoch_end
    if not runtime.is_master_rank():
        callback.on_train_end = lambda logs=None: None


def distribute(callbacks, pipelined=False):
    """The callbacks this rank runs, adapted as described above. A
    BackupAndRestore comes after the others, so that a backup taken at an
    epoch's end holds their state after that epoch (EarlyStopping's count),
    and a restored backup gives them their state after their on_train_begin
    reset it. For a `pipelined` model a ModelCheckpoint runs on every rank:
    the model's save and save_weights, which it calls, are collective (the
    master writes the file from the stages' values streamed to it), and it
    decides when to save from the global logs, alike on every rank."""
    out, backups = [], []
    for cb in callbacks or []:
        if pipelined and isinstance(cb, keras.callbacks.ModelCheckpoint):
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
            _backup_atomically(cb, callbacks)
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
