"""Distributed datasets: every global batch is split into one micro-batch per rank.

The user always speaks in global batches. Rank r of P takes, from a global
batch of b samples, the contiguous slice of ``b // P`` samples, plus one
when ``r < b % P``. Every rank therefore runs the same number of steps, even
when b is not a multiple of P and for a partial last batch; the gradient
reduction weights each rank by its sample count, so training equals serial
training with the global batch.
"""
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import log
from tarantella import runtime

# Dataset classes that batch, and those that undo batching. tf.data keeps
# them private, so they are recognised by name.
_BATCH = {"BatchDataset", "_BatchDataset", "ParallelBatchDataset", "_ParallelBatchDataset",
          "PaddedBatchDataset", "_PaddedBatchDataset", "DenseToRaggedBatchDataset",
          "_DenseToRaggedDataset"}
_UNBATCH = {"UnbatchDataset", "_UnbatchDataset", "RebatchDataset", "_RebatchDataset"}
_SOURCES = {"TensorSliceDataset", "_TensorSliceDataset", "RangeDataset", "_RangeDataset",
            "TensorDataset", "_TensorDataset", "TFRecordDatasetV2", "TextLineDatasetV2",
            "FixedLengthRecordDatasetV2", "_GeneratorDataset"}


class BatchInfo:
    """What is known of a dataset's batching: batched (True/False/None for
    unknown), the batch size and drop_remainder when a batch op was found."""

    def __init__(self, batched, size=None, drop_remainder=None):
        self.batched = batched
        self.size = size
        self.drop_remainder = drop_remainder


def batch_info(dataset):
    """Walks the dataset's transformations back to its source."""
    ds = dataset
    for _ in range(1000):
        name = type(ds).__name__
        if name in _BATCH:
            size = tf.get_static_value(getattr(ds, "_batch_size", None))
            drop = tf.get_static_value(getattr(ds, "_drop_remainder", None))
            return BatchInfo(True, None if size is None else int(size),
                             None if drop is None else bool(drop))
        if name in _UNBATCH:
            return BatchInfo(False)
        if name in _SOURCES:
            return BatchInfo(False)
        nxt = getattr(ds, "_input_dataset", None)
        if nxt is None:
            return BatchInfo(None)
        ds = nxt
    return BatchInfo(None)


def micro_batch_sizes(global_batch, size):
    """Samples of each rank for a global batch of `global_batch`."""
    base, rem = divmod(global_batch, size)
    return [base + (1 if r < rem else 0) for r in range(size)]


def _slicer(rank, size):
    def slice_batch(*args):
        element = args[0] if len(args) == 1 else args
        flat = tf.nest.flatten(element)
        b = tf.shape(flat[0], out_type=tf.int64)[0]
        base, rem = b // size, b % size
        r = tf.constant(rank, tf.int64)
        n = base + tf.cast(r < rem, tf.int64)
        off = r * base + tf.minimum(r, rem)
        return tf.nest.map_structure(lambda t: t[off:off + n], element)
    return slice_batch


def require_batched(info, what):
    """Raises the error for a dataset that BatchInfo `info` shows unbatched."""
    if info.batched is False:
        raise runtime.TarantellaError(
            f"the {what} dataset is not batched: batch it with the global batch size "
            "(dataset.batch(global_batch_size)) or pass tnt_micro_batch_size")


def distribute(dataset, micro_batch_size=None, what="training", parts=None):
    """The dataset of this rank's micro-batches.

    `dataset` is batched with the global batch size, or unbatched when
    `micro_batch_size` is given (then the global batch is micro_batch_size
    times the number of parts). `parts` = (this rank's part, the number of
    parts) that every global batch is split into: by default one part per
    rank; a pipeline's replicas share one part among their stages.
    """
    part, size = parts if parts is not None else (runtime.get_rank(), runtime.get_size())
    info = batch_info(dataset)
    if micro_batch_size is not None:
        if not runtime._is_whole_number(micro_batch_size) or micro_batch_size <= 0:
            raise runtime.TarantellaError(
                f"tnt_micro_batch_size={micro_batch_size!r} must be a positive whole number of "
                "samples")
        mbs = int(micro_batch_size)
        global_batch = mbs * size
        if info.batched:
            if info.size is not None and info.size != global_batch:
                raise runtime.TarantellaError(
                    f"the {what} dataset is batched with {info.size} samples, but "
                    f"tnt_micro_batch_size={mbs} on {size} ranks means a global batch of "
                    f"{global_batch}; batch the dataset with {global_batch} samples or leave "
                    "it unbatched")
        else:
            dataset = dataset.batch(global_batch, drop_remainder=False)
            info = BatchInfo(True, global_batch, False)
    else:
        require_batched(info, what)
    if info.size is not None and info.size < size:
        raise runtime.TarantellaError(
            f"the global batch size of the {what} dataset ({info.size}) is smaller than the "
            f"number of ranks ({size}); use a global batch of at least {size} samples")
    if info.size is not None:
        log.logger.info("%s: global batch size %d, %s %s", what, info.size,
                        "micro-batch sizes" if parts is None else "shares of the replicas",
                        micro_batch_sizes(info.size, size))
    dataset = without_autotune_stalls(dataset)
    if size == 1:
        return dataset
    return dataset.map(_slicer(part, size))


def without_autotune_stalls(dataset):
    """`dataset` with tf.data's autotuning off, unless its options say
    otherwise. TensorFlow 2.21 destroys an iterator only after the iterator's
    autotuning thread wakes up from a sleep that grows to a minute, and Keras
    drops an iterator every epoch: the program stands still for seconds (17 s
    an epoch for the quick start), on each rank at another time. Without
    autotuning, AUTOTUNE parallelism means one call per core."""
    if dataset.options().autotune.enabled is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def from_arrays(x, y=None, sample_weight=None, batch_size=None, shuffle=False):
    """A dataset of global batches from NumPy arrays (or lists/dicts of them),
    as Keras builds for `fit(x, y, batch_size=...)`."""
    if batch_size is None:
        batch_size = 32
    if not runtime._is_whole_number(batch_size) or batch_size <= 0:
        raise runtime.TarantellaError(
            f"batch_size={batch_size!r} must be a positive whole number of samples (the global "
            "batch size)")
    parts = tuple(p for p in (x, y, sample_weight) if p is not None)
    data = parts[0] if len(parts) == 1 else parts
    ds = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        n = len(tf.nest.flatten(x)[0])
        ds = ds.shuffle(n, seed=runtime.DEFAULT_SEED, reshuffle_each_iteration=True)
    return ds.batch(int(batch_size))


def is_array_like(x):
    return isinstance(x, (np.ndarray, list, tuple, dict)) or tf.is_tensor(x)


def split_arrays(arrays, validation_split):
    """Keras's validation_split for arrays: the last fraction validates."""
    if not 0 < validation_split < 1:
        raise runtime.TarantellaError(
            f"validation_split={validation_split!r} must be a fraction between 0 and 1 (the "
            "share of the samples that validates, e.g. 0.2)")
    flat = tf.nest.flatten(arrays)
    n = len(flat[0])
    cut = int(n * (1.0 - validation_split))
    train = tf.nest.map_structure(lambda a: a[:cut], arrays)
    val = tf.nest.map_structure(lambda a: a[cut:], arrays)
    return train, val


def _gather_leaf(local, rows, global_batch, size):
    """The rows of every rank, put back in the order of the global batches."""
    local = np.ascontiguousarray(local)
    row_bytes = local[:1].nbytes if len(local) else int(np.prod(local.shape[1:])) * local.itemsize
    raw = local.view(np.uint8).ravel()
    padded_len = (raw.size + 7) // 8
    send = np.zeros(padded_len * 8, dtype=np.uint8)
    send[:raw.size] = raw
    byte_counts = [r * row_bytes for r in rows]
    counts = [(b + 7) // 8 for b in byte_counts]
    recv = np.zeros(sum(counts), dtype=np.int64)
    _core.allgatherv(send.view(np.int64), recv, counts)
    recv_bytes = recv.view(np.uint8)
    parts, offset = [], 0
    for r in range(size):
        chunk = recv_bytes[offset * 8:offset * 8 + byte_counts[r]]
        parts.append(chunk.view(local.dtype).reshape((rows[r],) + local.shape[1:]))
        offset += counts[r]
    total = sum(rows)
    full, last = divmod(total, global_batch)
    sizes = [global_batch] * full + ([last] if last else [])
    cursor = [0] * size
    out = []
    for b in sizes:
        for r, n in enumerate(micro_batch_sizes(b, size)):
            out.append(parts[r][cursor[r]:cursor[r] + n])
            cursor[r] += n
    if cursor != list(rows):
        raise runtime.TarantellaError(
            f"gathered predictions do not match global batches of {global_batch}: "
            f"ranks hold {rows} rows")
    return np.concatenate(out, axis=0)


def gather_batches(local, global_batch):
    """Gathers per-rank predictions (arrays, or nested lists/dicts of arrays)
    computed on micro-batches, in the original sample order, on every rank."""
    size = runtime.get_size()
    leaves = tf.nest.flatten(local)
    mine = np.array([len(leaves[0])], dtype=np.int64)
    rows = np.zeros(size, dtype=np.int64)
    _core.allgather(mine, rows)
    rows = [int(r) for r in rows]
    gathered = [_gather_leaf(np.asarray(leaf), rows, global_batch, size) for leaf in leaves]
    return tf.nest.pack_sequence_as(local, gathered)
