"""Exact resume of fit from a BackupAndRestore backup, also in mid-epoch.

Keras's BackupAndRestore restores the weights and the optimizer state and
starts fit again at the beginning of the epoch in which the backup was
taken. Under Tarantella a resumed fit goes on where the backup was taken,
as if it had never stopped:

* the weights and the optimizer's variables go to a NumPy file of their
  own (``variables_snapshot``), written in about half the time of Keras's
  save_weights;
* the state that a weights file leaves out is backed up too (``gather``):
  the random seed generators of the model (dropout and other random layers)
  and Keras's global one, and the metric accumulators of the epoch in
  progress, of every rank (metrics are summed across ranks only when their
  results are computed, metrics.py);
* the state that Keras's callbacks keep from epoch to epoch of one fit
  (``callbacks_state``): the History of the finished epochs, and
  EarlyStopping's and ReduceLROnPlateau's counts and best values (and
  EarlyStopping's best weights when it restores them);
* the training data is at the same place: a shuffle that reshuffles on
  each iteration draws its order from the number of iterators made of the
  dataset before (Keras makes one or two an epoch), so the backup records
  how many the fit made before the one that the epoch to resume trains on,
  and the resumed fit makes (and drops) as many before its first epoch
  begins (``replay_iterators``); it then goes past the batches
  of the epoch that were already trained on, without training on them and
  without calling the batch hooks of the callbacks (``skip_batches``).

With the same number of ranks the resumed run computes exactly what the
uninterrupted run computes, so its weights are bitwise the same.

A pipelined model is backed up stage by stage: the rank of each stage in
the pipeline's first replica writes the variables of its stage (its
weights, and the optimizer's variables, which are the stage's own) to a
weights file of the stage, and every rank restores its stage's file only;
no rank ever holds the whole model for a backup.
"""
import json
import weakref
import zipfile

import keras
import numpy as np

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import _tf_data_internals as tfdi
from tarantella import data
from tarantella import runtime

# The training dataset of each model's fit in progress.
_training_data = weakref.WeakKeyDictionary()
# In the epoch a resumed fit starts in, the batches below this index were
# trained on before the backup (skip_batches); None otherwise.
_skip_below = None

# float64 holds every integer up to 2**53 exactly; seed states and counts
# stay far below it, which _table checks.
_EXACT_INTEGERS = 2 ** 53


def track_training_data(model, dataset, steps_per_epoch):
    """(the dataset and the steps per epoch that `model`'s fit must train
    on, and a callback it must run first), about to train on `dataset`,
    which counts the iterators made of it. Without `steps_per_epoch`, fit
    reads one iterator across its epochs (data.across_epochs), which makes
    two iterators of `dataset` an epoch, as Keras does. Given
    `steps_per_epoch` equal to the data's batches, Keras makes the iterator
    of each epoch at the end of the epoch before (`ahead`), else at the
    epoch's start."""
    counted = tfdi.CountsIterators(dataset)
    counted.ahead = (steps_per_epoch is not None and
                     steps_per_epoch == int(dataset.cardinality().numpy()))
    given = counted
    if steps_per_epoch is None:
        given, steps_per_epoch = data.across_epochs(counted, model.steps_per_execution)
    counted.epochs = _Epochs(counted, steps_per_epoch) if given is not counted else None
    _training_data[model] = counted
    return given, steps_per_epoch, counted.epochs


class _Epochs(keras.callbacks.Callback):
    """Counts the epochs that a fit reading one iterator across its epochs
    finished. Keras makes the iterator that it drops at the end of an
    epoch that read all its batches (not of one that a callback stopped);
    that iterator then makes it when the next epoch begins, and this makes
    the last epoch's when the fit ends."""

    def __init__(self, counted, steps):
        super().__init__()
        self.counted, self.steps = counted, steps
        self.done, self.last_batch, self.whole = 0, -1, False

    def on_epoch_begin(self, epoch, logs=None):
        self.last_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        self.last_batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.done += 1
        self.whole = self.last_batch == self.steps - 1

    def on_train_end(self, logs=None):
        if self.whole:
            iter(self.counted)


def iterators_to_replay(model, batches_done):
    """How many iterators of its training data a fit resumed from a backup
    taken now must make and drop before its first epoch: those the fit in
    progress made before the one that its epoch in progress trains on
    (`batches_done` > 0), or that its next epoch trains on. The resumed fit
    makes that one itself, at its first epoch's start."""
    dataset = _training_data.get(model)
    if dataset is None:
        return 0
    made = dataset.iterators_made
    if dataset.epochs is not None:  # two an epoch, made inside fit's one iterator
        return made + 2 * dataset.epochs.done
    return made - 1 if batches_done > 0 or dataset.ahead else made


def skipping(batch):
    """Whether batch `batch` of the epoch in progress is one that the
    restored backup had trained on, which fit goes past untrained: the
    callbacks' batch hooks are not called for it."""
    return _skip_below is not None and batch < _skip_below


def _pipeline(model):
    """The pipeline of `model` (pipeline/stage.py), or None."""
    return getattr(getattr(model, "_tnt", None), "pipeline", None)


def weights_files(model, base):
    """The names of the weights files of the backup `base` of `model`: one
    name, or for a pipelined model one per rank of the pipeline, named by
    the stages it holds (stage3, or stage1-3 under the interleaved
    schedule), in the ranks' order."""
    pipeline = _pipeline(model)
    if pipeline is None:
        return f"{base}.weights.npz"
    schedule = pipeline.schedules[True]
    return [f"{base}.stage{'-'.join(str(s) for s in schedule.stages_of(r))}.weights.npz"
            for r in range(len(pipeline.layout.pipeline_ranks))]


def own_weights_file(model, names):
    """The one of `names` (from weights_files) that this rank writes, or
    None: the master writes the file of a model that is not pipelined; the
    rank of each stage in the first replica writes its stage's."""
    pipeline = _pipeline(model)
    if pipeline is None:
        return names if runtime.is_master_rank() else None
    return names[pipeline.stage] if pipeline.layout.replica == 0 else None


def weights_file_to_restore(model, names):
    """The one of a backup's weights files `names` that this rank restores.
    Raises a TarantellaError when the backup is of a model cut into other
    stages or held by other ranks (or not pipelined, when this one is)."""
    pipeline = _pipeline(model)
    expected = weights_files(model, "")

    def what(files):
        if not isinstance(files, list):
            return "a model that is not pipelined"
        held = [f.split(".")[-3][len("stage"):] for f in files]
        stages = sum(len(h.split("-")) for h in held)
        return (f"a pipeline of {stages} stages" if len(held) == stages else
                f"a pipeline of {stages} stages on {len(held)} ranks (stages {', '.join(held)})")
    if what(names) != what(expected):
        raise runtime.TarantellaError(
            f"BackupAndRestore: the backup was taken of {what(names)}, and this is "
            f"{what(expected)}: resume with the model, stages and schedule of the run that took "
            "the backup")
    return names if pipeline is None else names[pipeline.stage]


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


class UnreadableBackup(runtime.TarantellaError):
    """A backup's weights file cannot be read (damaged, or gone)."""


def _backed_up_variables(model):
    """The variables of a backup's weights file: the model's weights (of a
    pipelined model, those of this rank's stages), then the optimizer's
    variables (its step count, learning rate, moments; a pipelined model's
    optimizer is its stages'), in a fixed order."""
    pipeline = _pipeline(model)
    variables = list(model.weights if pipeline is None else
                     [w for s in pipeline.stages for w in pipeline.models[s].weights])
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def variables_snapshot(model):
    """The values of the model's and the optimizer's variables, as arrays
    for a backup's weights file. Copying them takes a few milliseconds;
    Keras's save_weights spends more than that in walking the model alone."""
    return {str(i): np.array(keras.ops.convert_to_numpy(v))
            for i, v in enumerate(_backed_up_variables(model))}


def restore_variables(model, path):
    """Gives the model's and the optimizer's variables the values of the
    weights file `path` (written from variables_snapshot). Raises
    UnreadableBackup when it cannot be read, a TarantellaError when it is
    of another model."""
    if model.optimizer is not None and not model.optimizer.built:
        # Its moments exist once it is built, as Keras's own restore does.
        pipeline = _pipeline(model)
        model.optimizer.build(model.trainable_variables if pipeline is None
                              else pipeline.trainable)
    variables = _backed_up_variables(model)
    try:
        with np.load(path) as f:
            values = [f[str(i)] for i in range(len(f.files))]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise UnreadableBackup(f"BackupAndRestore cannot read {path}: {e}") from e
    shapes = [tuple(v.shape) for v in variables]
    if [a.shape for a in values] != shapes:
        raise runtime.TarantellaError(
            f"BackupAndRestore: {path} holds {len(values)} variables of other shapes than the "
            f"{len(variables)} of this model and its optimizer: resume with the model and "
            "optimizer of the run that took the backup")
    for v, a in zip(variables, values):
        v.assign(a)


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


def _assign(variables, table):
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
    return _assign(_seed_variables(model), tables["seeds"])


def replay_iterators(model, count):
    """Before the first epoch of a resumed fit: makes and drops `count`
    iterators of the training data (iterators_to_replay, at the backup)."""
    dataset = _training_data.get(model)
    if dataset is None:
        return
    while dataset.iterators_made < count:
        iter(dataset)


def skip_batches(model, batches, metrics_table):
    """At the start of an epoch: fit takes the first `batches` batches of
    the epoch from the data without training on them (batches is a multiple
    of the steps per execution, as a backup is taken after a step), and the
    metrics then hold the values of gather's `metrics_table`."""
    global _skip_below
    if batches > 0:
        _skip_below = batches
        model.train_function = _Skip(model, batches, metrics_table)


def end_of_epoch():
    """Called at the end of every epoch: the next one is trained in whole."""
    global _skip_below
    _skip_below = None


class _Skip:
    """Stands in for `model.train_function` until `batches` batches have
    been taken from the data; then restores the metrics, puts the real
    function back, and returns the metrics' results, as a real step would.
    Keras builds the compiled metrics in the first step; they are built here
    on the last skipped batch (an inference pass, which draws no random
    numbers and changes no layer state), reset, then given their values; a
    pipeline built them before fit, and no rank can run its whole model."""

    def __init__(self, model, batches, metrics_table):
        self.model = model
        self.real = model.train_function
        self.left = batches
        self.metrics_table = metrics_table

    def __call__(self, iterator):
        for _ in range(self.model.steps_per_execution):
            batch = next(iterator)
        self.left -= self.model.steps_per_execution
        if self.left > 0:
            return {}
        if _pipeline(self.model) is None:
            # A pipeline built its metrics before fit (stage.build_state).
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            self.model.compute_metrics(x, y, self.model(x, training=False), sample_weight)
        self.model.reset_metrics()
        # On another number of ranks the metrics start afresh (callbacks.py says so).
        _assign(list(self.model.metrics_variables), self.metrics_table)
        self.model.train_function = self.real
        return self.model.get_metrics_result()
