"""One iterator for all the epochs of fit, made as Keras makes its own."""
import numpy as np
import tensorflow as tf

from tarantella.data import _tf_data_internals as tfdi
from tarantella.data import per_rank


def across_epochs(dataset, steps_per_execution=1):
    """(a dataset that gives the epochs of `dataset` one after the other,
    endlessly, the batches of an epoch): what fit trains on, read by one
    iterator for all its epochs, with Keras told the steps of an epoch;
    (`dataset`, None) where the number of its batches is not known or not
    a multiple of `steps_per_execution` (a step of several batches would
    then read across an epoch's end).

    Making an iterator has a fixed cost (tf.data instantiates and rewrites
    every map's function for it), which Keras pays twice an epoch: it makes
    the iterator of an epoch at its start and one more at its end, which
    it drops. Here the one iterator makes both inside it, in Keras's order
    (the dropped one of an epoch when the next epoch begins, then the one
    that epoch reads; the dropped one is never read), so that a shuffle
    that reshuffles on each iteration draws the orders that it draws in
    plain Keras, and nothing reads ahead across an epoch's end. The last
    epoch's dropped iterator is the caller's to make (backup/position.py)."""
    batches = tf.get_static_value(dataset.cardinality())
    specs = tf.nest.flatten(dataset.element_spec)
    if (batches is None or batches <= 0 or batches % steps_per_execution or
            not all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None for s in specs)):
        return dataset, None
    # tf.data would put a prefetch at the end of the endless dataset (where
    # it would read ahead across an epoch's end); each epoch ends in one.
    epoch = per_rank.prefetched(dataset)

    def nothing(*_):
        return tf.constant(0, tf.int64)

    def like_epoch(_):  # never called: the types of an epoch's batches
        return tf.nest.pack_sequence_as(epoch.element_spec, [
            tf.zeros([d or 0 for d in s.shape], s.dtype) for s in specs])
    # An iterator of the epoch, made and never read: a choice between
    # datasets makes an iterator of each when it begins, and reads only the
    # chosen one, here an empty one. (Its elements are scalars: TensorFlow
    # 2.21 fails to concatenate a choice of other elements.)
    dropped = tf.data.Dataset.choose_from_datasets(
        [epoch.map(nothing), tf.data.Dataset.range(0)],
        tf.data.Dataset.from_tensors(np.int64(1)).repeat()).map(like_epoch)
    # The second dataset of a concatenation is made when the first ends.
    endless = epoch.concatenate(dropped.concatenate(epoch).repeat())
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return tfdi.DeletesIteratorsAside(endless.with_options(options)), int(batches)
