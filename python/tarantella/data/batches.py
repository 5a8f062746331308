"""What a dataset's batches are: whether and how it is batched, the share
of each rank of a global batch, a rank's slice of one."""
import tensorflow as tf

from tarantella import runtime
from tarantella.data import _tf_data_internals as tfdi


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
        if isinstance(ds, tfdi.SharedBatches):
            return BatchInfo(True, ds.global_batch, ds.drop_remainder)
        name = tfdi.kind(ds)
        if name in tfdi.BATCH:
            size, drop = tfdi.batch_params(ds)
            return BatchInfo(True, size, drop)
        if name in tfdi.UNBATCH or name in tfdi.SOURCES:
            return BatchInfo(False)
        nxt = tfdi.input_of(ds)
        if nxt is None:
            return BatchInfo(None)
        ds = nxt
    return BatchInfo(None)


def require_batched(info, what):
    """Raises the error for a dataset that BatchInfo `info` shows unbatched."""
    if info.batched is False:
        raise runtime.TarantellaError(
            f"the {what} dataset is not batched: batch it with the global batch size "
            "(dataset.batch(global_batch_size)) or pass tnt_micro_batch_size")


def micro_batch_sizes(global_batch, size):
    """Samples of each rank for a global batch of `global_batch`."""
    base, rem = divmod(global_batch, size)
    return [base + (1 if r < rem else 0) for r in range(size)]


def slicer(rank, size):
    """The function, for Dataset.map, that cuts rank `rank`'s slice of
    `size` out of a global batch (micro_batch_sizes' rows, in order)."""
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


def fixed_shapes(spec):
    """Whether every component of an element of `spec` is a dense tensor of
    one shape."""
    return all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
               for s in tf.nest.flatten(spec))


def example_batch(dataset):
    """A batch shaped like `dataset`'s, to build a model with: zeros of one
    sample where the dataset tells every dimension but the batch's, else
    its first batch. Reading a batch makes an iterator, and a dataset that
    reshuffles on each iteration would then draw its epochs' orders one
    iterator later than in plain Keras, which builds a model in its first
    step."""
    specs = tf.nest.flatten(dataset.element_spec)
    if all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None and
           None not in s.shape[1:] for s in specs):
        return tf.nest.pack_sequence_as(dataset.element_spec, [
            tf.zeros([1] + s.shape[1:].as_list() if s.shape.rank else [], s.dtype)
            for s in specs])
    return next(iter(dataset))
