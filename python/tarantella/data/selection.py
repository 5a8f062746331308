"""A rank's rows of every global batch, selected before the maps: by a
predicate on the samples' places, or gathered from the tensors of a
from_tensor_slices source by their indices (shuffles permute indices)."""
import weakref

import numpy as np
import tensorflow as tf

from tarantella.data import _tf_data_internals as tfdi
from tarantella.data import batches
from tarantella.data import stateless


def slices_below(base):
    """The from_tensor_slices source (of tensors in memory) that `base` is,
    or shuffles; else None."""
    while tfdi.kind(base) in tfdi.SHUFFLE:
        base = tfdi.input_of(base)
    return base if tfdi.slices_of(base) is not None else None


def _selector(part, size, batch_size, count):
    """The predicate on (index, sample) that keeps this rank's rows of each
    global batch of `count` samples (-1: endless), the last one included."""
    full = batches.micro_batch_sizes(batch_size, size)
    begin, end = sum(full[:part]), sum(full[:part + 1])
    last = count % batch_size if count >= 0 else 0
    tail = batches.micro_batch_sizes(last, size)
    tail_begin, tail_end = sum(tail[:part]), sum(tail[:part + 1])

    def keep(index, _):
        pos = index % batch_size
        in_last = index >= count - last if last else tf.constant(False)
        return tf.where(in_last, (pos >= tail_begin) & (pos < tail_end),
                        (pos >= begin) & (pos < end))
    return keep


def selected_rows(base, part, size, batch_size, drop, count):
    """This rank's rows of every global batch that `base` batched by
    `batch_size` gives, one row after the other."""
    if size == 1:
        return base
    if batches.fixed_shapes(base.element_spec):
        # Samples of one shape: cut the global batches as the batch does and
        # keep this rank's slice of each (cheaper than a predicate per sample).
        return base.batch(batch_size, drop_remainder=drop).map(
            batches.slicer(part, size)).unbatch()
    if drop and count >= 0 and count % batch_size:
        base = base.take(count - count % batch_size)
        count -= count % batch_size
    return base.enumerate().filter(_selector(part, size, batch_size, count)).map(
        lambda _, sample: sample)


def _positions(part, size, batch_size, drop, count):
    """(the places, in an epoch of `count` samples, of this rank's rows of
    every global batch of `batch_size`, the partial last one unless `drop`:
    a row of places per batch, the last one filled up with its first place
    where it is shorter; the number of the rank's rows in each batch)."""
    full, last = divmod(count, batch_size)
    sizes = batches.micro_batch_sizes(batch_size, size)
    places = (np.arange(full, dtype=np.int64)[:, None] * batch_size + sum(sizes[:part]) +
              np.arange(sizes[part], dtype=np.int64))
    rows = [sizes[part]] * full
    if last and not drop:
        tail = batches.micro_batch_sizes(last, size)
        width = max(sizes[part], tail[part])
        places = np.pad(places, [(0, 1), (0, width - sizes[part])])  # the new row set below
        begin = full * batch_size + sum(tail[:part])
        places[-1] = begin
        places[-1, :tail[part]] += np.arange(tail[part])
        rows.append(tail[part])
    return places, np.array(rows, dtype=np.int64)


# Per shuffle of a source: the indices of the source's samples, shuffled as
# it shuffles the samples (kept, so that a later fit goes on with the next
# permutations, as the shuffle itself would).
_orders = weakref.WeakKeyDictionary()


def _order(shuffled, count):
    """An iteration of it is one element: the indices of the `count` samples
    of the source in the order in which `shuffled` (shuffles of the source)
    gives them at the same iteration."""
    try:
        order = _orders.get(shuffled)
    except TypeError:
        order = None
    if order is None:
        shuffles, ds = [], shuffled
        while tfdi.kind(ds) in tfdi.SHUFFLE:
            shuffles.append(ds)
            ds = tfdi.input_of(ds)
        order = tf.data.Dataset.range(count)
        for step in reversed(shuffles):
            order = tfdi.Reshuffled(step, order)
        order = order.batch(count)
        try:
            _orders[shuffled] = order
        except TypeError:
            pass
    return order


def gathered(base, seeded, part, size, batch_size, drop, count):
    """(a dataset with an element per global batch, (the number n of this
    rank's rows in it, their indices in the source, their seeds, one
    tensor per random map, where `seeded`), of which the first n rows
    count; the function that gathers the rows at the indices it is given
    (a vector, or one index for one row), each behind its seeds, (seeds,
    rows), where seeded) for a `base` that is from_tensor_slices of
    tensors, shuffled or not; else None. `seeded` is a pair: the samples'
    keys (stateless.sample_keys), the function that makes the seeds of a
    vector of keys.

    The rank gathers its rows from the source's tensors by their indices,
    so that it neither reads nor shuffles the others: a shuffle permutes the
    indices of the samples instead (tfdi.Reshuffled: the same permutation),
    and at every iteration one element, the epoch's order and the keys of
    its samples, gives the indices and seeds of the rank's rows of the
    epoch, a batch at a time."""
    source = slices_below(base)
    if source is None or count <= 0:
        return None
    tensors = tfdi.slices_of(source)
    spec = source.element_spec
    places, rows = _positions(part, size, batch_size, drop, count)
    places, rows = tf.constant(places), tf.constant(rows)

    def rows_at(at, *seeds):
        sample = tf.nest.pack_sequence_as(spec, [tf.gather(t, at) for t in tensors])
        return (seeds, sample) if seeds else sample
    if source is base and seeded is None:
        return tf.data.Dataset.from_tensor_slices((rows, places)), rows_at
    epoch = {}
    if source is not base:
        epoch["order"] = _order(base, count)
    if seeded is not None:
        epoch["keys"] = seeded[0].batch(-(-count // stateless.KEYS_AT_ONCE))

    def batches_of_epoch(epoch):
        at = tf.gather(epoch["order"], places) if "order" in epoch else places
        if "keys" not in epoch:
            return rows, at
        keys = tf.gather(tf.reshape(epoch["keys"], [-1]), tf.reshape(places, [-1]))
        seeds = tuple(tf.reshape(s, tf.concat([tf.shape(places), tf.shape(s)[1:]], 0))
                      for s in seeded[1](keys))
        return (rows, at) + seeds
    return tf.data.Dataset.zip(epoch).take(1).map(batches_of_epoch).unbatch(), rows_at


def first(rows, *batched):
    """The first `rows` rows of each of `batched`."""
    return tuple(t[:rows] for t in batched)
