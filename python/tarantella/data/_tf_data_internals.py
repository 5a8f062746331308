"""The one module that reads tf.data's private structure (TensorFlow 2.21).

A tf.data.Dataset keeps its transformations as a chain of private classes,
each holding its input in `_input_dataset`. Tarantella walks that chain to
find a dataset's batching (batches.batch_info) and to select each rank's
samples before the expensive maps (sharing.py). Everything it reads is named
here; tests/python/test_data_share.py checks that these names still exist
in the installed TensorFlow.
"""
import atexit
import ctypes
import re
import sys
import threading

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.util import structure
from tensorflow.python.ops import gen_dataset_ops

# Dataset classes by what they do; tf.data keeps them private, so they are
# recognised by name.
BATCH = {"BatchDataset", "_BatchDataset", "ParallelBatchDataset", "_ParallelBatchDataset",
         "PaddedBatchDataset", "_PaddedBatchDataset", "DenseToRaggedBatchDataset",
         "_DenseToRaggedDataset"}
# Batching whose rows are plain rows of the input: a rank's rows batched on
# their own equal the rank's slice of the global batch (padding and ragged
# batching depend on the other rows of the batch).
PLAIN_BATCH = {"_BatchDataset", "_ParallelBatchDataset"}
UNBATCH = {"UnbatchDataset", "_UnbatchDataset", "RebatchDataset", "_RebatchDataset"}
SOURCES = {"TensorSliceDataset", "_TensorSliceDataset", "RangeDataset", "_RangeDataset",
           "TensorDataset", "_TensorDataset", "TFRecordDatasetV2", "TextLineDatasetV2",
           "FixedLengthRecordDatasetV2", "_GeneratorDataset"}
MAP = {"_MapDataset", "_ParallelMapDataset"}
SHUFFLE = {"_ShuffleDataset"}
PREFETCH = {"_PrefetchDataset"}
OPTIONS = {"_OptionsDataset"}
# Stateful ops that give the same result whichever elements a rank maps.
HARMLESS_STATEFUL = {"Assert"}


def kind(dataset):
    """The class name of the dataset's last transformation."""
    return type(dataset).__name__


def describe(dataset):
    """The dataset's last transformation as a user wrote it: "filter" for
    _FilterDataset, "padded_batch" for _PaddedBatchDataset."""
    name = kind(dataset).lstrip("_")
    name = re.sub(r"(V\d+)?$", "", name)
    name = re.sub(r"Dataset$", "", name) or name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def input_of(dataset):
    """The dataset that `dataset`'s last transformation reads, or None."""
    return getattr(dataset, "_input_dataset", None)


def slices_of(dataset):
    """The tensors that `dataset` = tf.data.Dataset.from_tensor_slices(...)
    slices, one per component in tf.nest's order, where every component is a
    dense tensor held in memory; else None."""
    if kind(dataset) != "_TensorSliceDataset" or not tf.executing_eagerly():
        return None
    if not all(type(s) is tf.TensorSpec for s in tf.nest.flatten(dataset.element_spec)):
        return None
    tensors = list(dataset._tensors)
    return tensors if all(hasattr(t, "numpy") for t in tensors) else None


def batch_params(dataset):
    """(batch size, drop_remainder) of a batching dataset; None where not static."""
    size = tf.get_static_value(getattr(dataset, "_batch_size", None))
    drop = tf.get_static_value(getattr(dataset, "_drop_remainder", None))
    return (None if size is None else int(size)), (None if drop is None else bool(drop))


def stateful_ops(map_dataset):
    """Types of the stateful ops in a map's function (random numbers,
    Python functions, variables updates): their results depend on how many
    elements a process mapped before."""
    graph = map_dataset._map_func.function.graph
    return sorted({op.type for op in graph.get_operations()
                   if op.op_def.is_stateful and op.type not in HARMLESS_STATEFUL})


def map_function(map_dataset):
    """(the traced function of a map, the structure of its input, that of
    its output): the function takes and returns flat lists of tensors."""
    wrapper = map_dataset._map_func
    return wrapper.function, wrapper._input_structure, wrapper.output_structure


def to_tensor_list(element_structure, element):
    return structure.to_tensor_list(element_structure, element)


def from_tensor_list(element_structure, tensors):
    return structure.from_compatible_tensor_list(element_structure, tensors)


def map_call(map_dataset):
    """The function of a map, on one element (a tuple for several
    components) as the map gives it."""
    function, input_structure, output_structure = map_function(map_dataset)

    def call(element):
        return from_tensor_list(output_structure,
                                function(*to_tensor_list(input_structure, element)))
    return call


def parallelism(map_datasets):
    """The parallelism of a map that does the work of `map_datasets`: None
    where they are all sequential, AUTOTUNE where one is autotuned, else the
    largest of their num_parallel_calls."""
    calls = [int(tf.get_static_value(m._num_parallel_calls)) for m in map_datasets
             if getattr(m, "_num_parallel_calls", None) is not None]
    if not calls:
        return None
    return tf.data.AUTOTUNE if tf.data.AUTOTUNE in calls else max(calls)


def reprefetch(prefetch_dataset, dataset, rows=1):
    """`dataset` prefetched as `prefetch_dataset` is, where an element of
    `dataset` holds `rows` of its elements (the buffer then counts elements
    of `dataset`, rounded up)."""
    size = int(tf.get_static_value(prefetch_dataset._buffer_size))
    return dataset.prefetch(size if size <= 0 else -(-size // rows))


class Reshuffled(dataset_ops.UnaryUnchangedStructureDataset):
    """`input_dataset` shuffled as the shuffle `shuffled` shuffles its input:
    with its buffer size, its seeds and its reshuffling at every iteration.
    tf.data's shuffle draws its positions whatever the elements are, so that
    the i-th iteration of both gives the same permutation (of the indices
    of the samples, say, instead of the samples). Its seed generator is its
    own: iterations count from its first one."""

    def __init__(self, shuffled, input_dataset):
        self._input_dataset, self._name = input_dataset, None
        variant = gen_dataset_ops.shuffle_dataset_v3(
            input_dataset._variant_tensor, buffer_size=shuffled._buffer_size,
            seed=shuffled._seed, seed2=shuffled._seed2,
            seed_generator=gen_dataset_ops.dummy_seed_generator(),
            reshuffle_each_iteration=shuffled._reshuffle_each_iteration, **self._common_args)
        super().__init__(input_dataset, variant)


class _PassThrough(dataset_ops.UnaryUnchangedStructureDataset):
    """The elements of its input unchanged: a mark in the dataset's chain."""

    def __init__(self, input_dataset):
        self._input_dataset = input_dataset
        super().__init__(input_dataset, input_dataset._variant_tensor)


class ShardHere(_PassThrough):
    """Where each rank may select its share of the samples (per_rank.shard_here)."""


class SharedBatches(_PassThrough):
    """A rank's micro-batches, built by selecting its rows before the maps:
    records the global batch they are part of, which its chain no longer
    holds."""

    def __init__(self, input_dataset, global_batch, drop_remainder):
        self.global_batch = global_batch
        self.drop_remainder = drop_remainder
        super().__init__(input_dataset)


class DeletesIteratorsAside(_PassThrough):
    """Its iterators are deleted in a thread of their own, once nothing else
    holds them. Deleting an autotuned iterator can take seconds (8 s
    measured on 2 ranks at the start of every other epoch, where Keras drops
    the iterator of the previous epoch), and the rank would stand still
    while the others wait for it; deleted aside, that iterator took less
    than 0.01 s and no epoch start waited."""

    def __iter__(self):
        iterator = super().__iter__()
        _ASIDE.hold(iterator)
        return iterator


class _Aside:
    """Holds iterators until it is their last holder, then deletes them, in
    a thread that runs while it holds any (every 50 ms it looks which
    iterators the program dropped). When the program exits, the thread
    finishes the deletion it is in and stops (a daemon thread that deletes
    an iterator while the interpreter shuts down aborts the process: "FATAL:
    exception not rethrown"), and the iterators still held, dropped or not,
    are never deleted: deleting an autotuned iterator waits for tf.data's
    autotuning thread to wake, up to 10 s after an iterator lived a while
    (9 s measured at the exit of a rank whose allreduce had timed out, with
    the iterator of its fit still held by the error's traceback), and a
    process that ends has nothing to gain from it."""

    _PERIOD_S = 0.05
    # sys.getrefcount of an iterator that only the list of held ones holds:
    # that list, the loop's variable and getrefcount's argument.
    _ONLY_HERE = 3

    def __init__(self):
        self._held, self._lock, self._thread = [], threading.Lock(), None
        self._closed = threading.Event()
        atexit.register(self.close)

    def hold(self, iterator):
        with self._lock:
            self._held.append(iterator)
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._run, name="tnt-iterators",
                                                daemon=True)
                self._thread.start()

    def close(self):
        """Stops the thread and keeps every iterator held to the end."""
        with self._lock:
            self._closed.set()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            for iterator in self._held:
                # A reference that nothing gives back: neither the program's
                # end nor the interpreter's shutdown deletes the iterator.
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(iterator))

    def _run(self):
        while not self._closed.wait(self._PERIOD_S):
            with self._lock:
                dropped = [sys.getrefcount(it) <= self._ONLY_HERE for it in self._held]
                dropped, self._held = ([it for it, d in zip(self._held, dropped) if d],
                                       [it for it, d in zip(self._held, dropped) if not d])
                if not self._held and not dropped:
                    self._thread = None
                    return
            del dropped  # the iterators are deleted here, outside the lock
        with self._lock:
            self._thread = None


_ASIDE = _Aside()


class CountsIterators(DeletesIteratorsAside):
    """Counts the iterators made of it: a shuffle that reshuffles on each
    iteration draws each order from the number of iterators made before
    (backup/position.py)."""

    def __init__(self, input_dataset):
        self.iterators_made = 0
        super().__init__(input_dataset)

    def __iter__(self):
        self.iterators_made += 1
        return super().__iter__()
