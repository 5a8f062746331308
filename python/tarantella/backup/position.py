"""The place in the data of a resumed fit.

A shuffle that reshuffles on each iteration draws its order from the number
of iterators made of the dataset before (Keras makes one or two an epoch),
so a backup records how many the fit made before the one that the epoch to
resume trains on, and the resumed fit makes (and drops) as many before its
first epoch begins (``replay_iterators``); it then goes past the batches of
the epoch that were already trained on, without training on them and
without calling the batch hooks of the callbacks (``skip_batches``).
"""
import weakref

import keras

from tarantella import data
from tarantella.zero import steps as zero_steps
from tarantella.backup import files
from tarantella.backup import state
from tarantella.data import _tf_data_internals as tfdi

# The training dataset of each model's fit in progress.
_training_data = weakref.WeakKeyDictionary()
# In the epoch a resumed fit starts in, the batches below this index were
# trained on before the backup (skip_batches); None otherwise.
_skip_below = None


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
    numbers and changes no layer state; at zero_stage=3, whose ranks hold
    parts of the weights, zeros of the outputs' shapes), reset, then given
    their values; a pipeline built them before fit, and no rank can run its
    whole model."""

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
        if files.pipeline_of(self.model) is None:
            # A pipeline built its metrics before fit (stage.build_state).
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            y_pred = zero_steps.stand_in_outputs(self.model, x) if \
                zero_steps.holds_parts(self.model) else self.model(x, training=False)
            self.model.compute_metrics(x, y, y_pred, sample_weight)
        self.model.reset_metrics()
        # On another number of ranks the metrics start afresh (callbacks.py says so).
        state.assign(list(self.model.metrics_variables), self.metrics_table)
        self.model.train_function = self.real
        return self.model.get_metrics_result()
