"""DistributedBackupAndRestore: Keras's BackupAndRestore on many ranks."""
import json
import os
import re

import numpy as np

from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import runtime
from tarantella import saving
from tarantella import subclass
from tarantella.backup import files
from tarantella.backup import position
from tarantella.backup import state


class DistributedBackupAndRestore(internals.BackupAndRestoreHooks):
    """A keras.callbacks.BackupAndRestore that writes on the master only,
    and so that a job killed at any moment leaves a consistent backup: the
    weights go to a new file named by epoch and batch (through a temporary
    file; a pipelined model's go to a file per stage, each written by the
    stage's rank of the first replica, and every rank learns whether all of
    them were written; a sharded optimizer state streams from every rank
    to the master's file), and so does the state the weights leave out
    (state.py: every rank's random seeds and metric accumulators); then the
    metadata that names these files replaces the previous metadata in one
    rename, and only then the previous files are deleted. Every rank
    restores the backup the metadata names (of a pipelined model: its
    stage's file) and goes on from the batch after it (position.py). With
    double_checkpoint=True the previous backup is kept and named in the
    metadata too, and a restore that cannot read the latest weights (an
    I/O error) restores the previous ones, as Keras's own BackupAndRestore
    does. The backup also holds the logs of the finished epochs and the
    state of the user's callbacks that fit keeps from epoch to epoch
    (state.callbacks_state), which a resumed fit gives back to them and to
    its History when its first epoch begins, after every callback's
    on_train_begin has reset them.

    Made by distributed() from the user's `keras_callback` and the user's
    `user_callbacks` of fit, whose state it backs up."""

    def __init__(self, keras_callback, user_callbacks):
        # The user's callback as it was made (by its own class's __init__,
        # whose arguments are its own), shallowly copied: it stays as it is.
        self.__dict__.update(keras_callback.__dict__)
        self.user_callbacks = user_callbacks
        self._pending = {}  # the restored backup's position and state, until its epoch begins
        self._finished = {}  # the logs of the finished epochs of the fit in progress

    def on_train_begin(self, logs=None):
        self._finished.clear()
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if not self._pending:
            return
        tables = self._pending.pop("tables")
        self._finished.update(state.restore_callbacks_state(self.user_callbacks, self.model,
                                                            tables))
        if not state.restore_seeds(self.model, tables):
            log.logger.info("BackupAndRestore: the backup was taken on %d ranks: training goes "
                            "on from it with fresh random seeds and metrics",
                            len(tables["seeds"]))
        position.skip_batches(self.model, self._pending.pop("batches"), tables["metrics"])

    def on_epoch_end(self, epoch, logs=None):
        position.end_of_epoch()
        self._finished[epoch] = dict(logs or {})
        super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        if runtime.is_master_rank():  # the master deletes the backup
            super().on_train_end(logs)

    def _metadata(self):
        try:
            with open(self.metadata_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def load_backup(self):
        meta = self._metadata()
        names = meta.get("tnt_weights")
        if names is None:
            return self.keras_load()
        unreadable = self._restore_weights(names)
        if unreadable is None:
            self.set_initial_epoch(meta["epoch"])
            self._restore_position(meta, "")
            return
        previous = meta.get("tnt_previous")
        if not previous:
            raise files.UnreadableBackup(unreadable)
        log.logger.warning("%s; restoring the previous backup %s", unreadable, previous)
        unreadable = self._restore_weights(previous)
        if unreadable is not None:
            raise files.UnreadableBackup(unreadable)
        self.set_initial_epoch(meta.get("tnt_previous_epoch", 0))
        self._restore_position(meta, "previous_")

    def _restore_weights(self, names):
        """Restores this rank's file of the weights files `names`; returns
        why this rank (of a pipeline: the first rank that) could not read
        its file, or None. Collective for a pipelined model."""
        name = files.weights_file_to_restore(self.model, names)
        try:
            files.restore_variables(self.model, os.path.join(self.backup_dir, name))
            unreadable = None
        except files.UnreadableBackup as e:
            unreadable = str(e)
        if isinstance(names, list):  # the stages restore the same backup
            unreadable = runtime.first_message(unreadable)
        return unreadable

    def _restore_position(self, meta, prefix):
        """After the weights of the backup that meta names (prefix "" for
        the latest, "previous_" for the one before) were loaded."""
        state_file = meta.get(f"tnt_{prefix}state")
        if state_file is None:
            return
        epoch = meta["epoch"] if not prefix else meta.get("tnt_previous_epoch", 0)
        batches = meta.get(f"tnt_{prefix}batches_done", 0)
        with np.load(os.path.join(self.backup_dir, state_file)) as tables:
            self._pending.update(tables=dict(tables), batches=batches)
        self.resume_at(epoch, batches)
        position.replay_iterators(self.model, meta.get(f"tnt_{prefix}iterators_to_replay", 0))

    def save_backup(self):
        tables = state.gather(self.model)  # collective: every rank saves
        base = f"epoch{self.epoch}-batch{self.batch}"
        names, state_file = files.weights_files(self.model, base), f"{base}.state.npz"
        own = files.own_weights_file(self.model, names)
        old = self._metadata() if own is not None or runtime.is_master_rank() else {}
        writing, error, text = [None], None, None
        if own is not None:
            try:
                self._write_weights(own, writing)
            except Exception as e:  # noqa: BLE001 (every rank learns of any failure)
                error, text = e, _write_error(writing[0], e, old)
        elif files.streams_weights(self.model):
            files.stream_weights(self.model)  # this rank's parts, to the master's file
        if isinstance(names, list):  # the first failed stage writer's error, on every rank
            text = runtime.first_message(text)
        if runtime.is_master_rank():
            if text is None:
                tables.update(state.callbacks_state(self.user_callbacks, self._finished))
                try:
                    keep = self._write_metadata(names, state_file, tables, old, writing)
                except Exception as e:  # noqa: BLE001 (every rank learns of any failure)
                    error, text = e, _write_error(writing[0], e, old)
                else:
                    files.remove(self.backup_dir, files.named_in(old), keep)
                    # What a job killed while it wrote a backup left behind.
                    files.remove_leftover_temporaries(self.backup_dir)
            if text is not None:
                # What this backup wrote before it failed; the previous backup is untouched.
                new = files.named_in({"tnt_weights": names, "tnt_state": state_file})
                files.remove(self.backup_dir, new, files.named_in(old))
        # The master's error (or a stage's), on every rank, so that all stop at once.
        text = runtime.master_message(text)
        if text is not None:
            raise runtime.TarantellaError(text) from error

    def _write_weights(self, name, writing):
        """Writes this rank's weights file `name` of the backup. The file
        being written is writing[0]."""
        path = os.path.join(self.backup_dir, name)

        def make_directory():
            writing[0] = self.backup_dir
            os.makedirs(self.backup_dir, exist_ok=True)
            writing[0] = path
        if files.streams_weights(self.model):
            # The other ranks stream their parts, also when the directory fails.
            saving.write_atomically(path, lambda tmp: files.stream_weights(self.model, tmp,
                                                                           make_directory))
            return
        make_directory()
        arrays = files.variables_snapshot(self.model)
        saving.write_atomically(path, lambda tmp: files.savez(tmp, arrays))

    def _write_metadata(self, names, state_file, tables, old, writing):
        """Writes the backup's state file `state_file`, then the metadata
        that names it and the weights files `names` (master). The file being
        written is writing[0]. Returns the names of the files the metadata
        names."""
        writing[0] = os.path.join(self.backup_dir, state_file)
        saving.write_atomically(writing[0], lambda path: files.savez(path, tables))
        done = self.batches_done()
        meta = {"epoch": self.epoch, "batch": self.batch, "tnt_weights": names,
                "tnt_state": state_file, "tnt_batches_done": done,
                "tnt_iterators_to_replay": position.iterators_to_replay(self.model, done)}
        if self.double_checkpoint and old.get("tnt_weights") not in (None, names):
            meta.update(tnt_previous=old["tnt_weights"], tnt_previous_epoch=old.get("epoch", 0),
                        tnt_previous_state=old.get("tnt_state"),
                        tnt_previous_batches_done=old.get("tnt_batches_done", 0),
                        tnt_previous_iterators_to_replay=old.get("tnt_iterators_to_replay", 0))
        text = json.dumps(meta)

        def write_meta(path):
            with open(path, "w") as f:
                f.write(text)
        writing[0] = self.metadata_path
        saving.write_atomically(writing[0], write_meta)
        return files.named_in(meta)


def _write_error(path, error, old):
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


def distributed(keras_callback, user_callbacks):
    """The DistributedBackupAndRestore that runs in place of the user's
    `keras_callback`, which is left as it is. Its class goes in front of
    the callback's own (subclass.mixin_class), so that a user's subclass of
    BackupAndRestore keeps its methods and attributes."""
    cls = subclass.mixin_class(DistributedBackupAndRestore, type(keras_callback))
    return cls(keras_callback, user_callbacks)
