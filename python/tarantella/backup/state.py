"""What a backup's weights file leaves out, and a resumed fit needs.

* the random seed generators of the model (dropout and other random layers)
  and Keras's global one, and the metric accumulators of the epoch in
  progress, of every rank (``gather``; metrics are summed across ranks only
  when their results are computed, metrics.py);
* the state that Keras's callbacks keep from epoch to epoch of one fit
  (``callbacks_state``): the History of the finished epochs, and
  EarlyStopping's and ReduceLROnPlateau's counts and best values (and
  EarlyStopping's best weights when it restores them).
"""
import json

import keras
import numpy as np

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import runtime

# float64 holds every integer up to 2**53 exactly; seed states and counts
# stay far below it, which _table checks.
_EXACT_INTEGERS = 2 ** 53


def _seed_variables(model):
    """The random seed generators' states, which the weights file leaves
    out, in a fixed order (of a pipelined model, also those of the stages
    that this rank does not hold, which hold no value here)."""
    skip = {id(v) for v in list(model.weights) + list(model.metrics_variables)}
    if model.optimizer is not None:
        skip.update(id(v) for v in model.optimizer.variables)
    candidates = list(model.variables)
    global_seeds = internals.global_seed_generator()
    if global_seeds is not None:
        candidates.append(global_seeds.state)
    out = []
    for v in candidates:
        if id(v) not in skip:
            skip.add(id(v))
            out.append(v)
    return out


# The attributes in which Keras's callbacks keep their state from epoch to
# epoch (set by their on_train_begin, changed by their on_epoch_end).
_CALLBACK_STATE = ((keras.callbacks.EarlyStopping, ("wait", "stopped_epoch", "best", "best_epoch")),
                   (keras.callbacks.ReduceLROnPlateau, ("wait", "best", "cooldown_counter")))


def _stateful(callbacks):
    """The callbacks among `callbacks` whose state is backed up, in order."""
    types = tuple(t for t, _ in _CALLBACK_STATE)
    return [cb for cb in callbacks if isinstance(cb, types)]


def _attributes(callback):
    return next(names for t, names in _CALLBACK_STATE if isinstance(callback, t))


def _number(value):
    """A Python number (or None) of a log value or a callback's best value."""
    return None if value is None else float(np.asarray(value))


def callbacks_state(callbacks, epochs):
    """The state of `callbacks` (the user's list) that a resumed fit needs,
    as arrays for the backup's state file: the logs of the finished
    `epochs` ({epoch: logs}), the attributes of _CALLBACK_STATE, and
    EarlyStopping's best weights when it keeps them."""
    state = {"epochs": {str(e): {k: _number(v) for k, v in logs.items()}
                        for e, logs in epochs.items()},
             "callbacks": []}
    arrays = {}
    for i, cb in enumerate(_stateful(callbacks)):
        state["callbacks"].append({a: _number(getattr(cb, a)) for a in _attributes(cb)})
        for j, w in enumerate(getattr(cb, "best_weights", None) or []):
            arrays[f"callback{i}_best_weight{j}"] = np.asarray(w)
    arrays["callbacks"] = np.array(json.dumps(state))
    return arrays


def restore_callbacks_state(callbacks, model, tables):
    """Gives `callbacks` (the user's list) and `model.history` the state of
    callbacks_state's arrays in `tables`. Returns the finished epochs' logs
    ({epoch: logs}); {} when the backup holds no such state."""
    if "callbacks" not in tables:
        return {}
    state = json.loads(str(tables["callbacks"]))
    saved = state["callbacks"]
    stateful = _stateful(callbacks)
    if len(saved) != len(stateful):
        raise runtime.TarantellaError(
            f"BackupAndRestore: the backup holds the state of {len(saved)} EarlyStopping or "
            f"ReduceLROnPlateau callback(s), but fit has {len(stateful)}: resume with the "
            "callbacks of the run that took the backup")
    for i, (cb, values) in enumerate(zip(stateful, saved)):
        for name, value in values.items():
            setattr(cb, name, int(value) if name != "best" and value is not None else value)
        weights = sorted((k for k in tables if k.startswith(f"callback{i}_best_weight")),
                         key=lambda k: int(k.rsplit("weight", 1)[1]))
        if weights:
            cb.best_weights = [tables[k] for k in weights]
    epochs = {int(e): logs for e, logs in state["epochs"].items()}
    history = model.history
    for e in sorted(epochs):
        history.epoch.append(e)
        for k, v in epochs[e].items():
            history.history.setdefault(k, []).append(v)
    return epochs


def _held(v):
    """The value of `v`, zeros when this rank does not hold it (a variable
    of another pipeline stage)."""
    if not internals.is_allocated(v):
        return np.zeros(v.shape, v.dtype)
    return np.asarray(keras.ops.convert_to_numpy(v))


def _table(variables):
    """Every rank's values of `variables`, one row per rank (collective)."""
    values = [_held(v) for v in variables]
    for v, array in zip(variables, values):
        if array.dtype.kind in "iu" and array.size and np.abs(array).max() >= _EXACT_INTEGERS:
            raise runtime.TarantellaError(
                f"BackupAndRestore: {v.path} holds an integer beyond 2**53, which the backup "
                "cannot keep exactly")
    row = np.concatenate([a.astype(np.float64).ravel() for a in values] or [np.zeros(0)])
    table = np.zeros((runtime.get_size(), row.size))
    table[runtime.get_rank()] = row
    if runtime.get_size() > 1:
        _core.allreduce(table, op="sum")
    return table


def assign(variables, table):
    """Assigns this rank's row of `table`. Returns False (and assigns
    nothing) when the table is of other variables or another rank count."""
    sizes = [int(np.prod(v.shape)) for v in variables]
    if table.shape != (runtime.get_size(), sum(sizes)):
        return False
    row, start = table[runtime.get_rank()], 0
    for v, n in zip(variables, sizes):
        if internals.is_allocated(v):
            v.assign(row[start:start + n].reshape(v.shape).astype(v.dtype))
        start += n
    return True


def gather(model):
    """The state of `model` that its weights file leaves out, of every rank:
    a dict of tables (collective: every rank calls it)."""
    return {"seeds": _table(_seed_variables(model)),
            "metrics": _table(list(model.metrics_variables))}


def restore_seeds(model, tables):
    """Gives the seed generators this rank's states from gather's tables.
    Returns False when they are of another model or rank count."""
    return assign(_seed_variables(model), tables["seeds"])
