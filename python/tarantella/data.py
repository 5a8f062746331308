"""Distributed datasets: every global batch is split into one micro-batch per rank.

The user always speaks in global batches. Rank r of P takes, from a global
batch of b samples, the contiguous slice of ``b // P`` samples, plus one
when ``r < b % P``. Every rank therefore runs the same number of steps, even
when b is not a multiple of P and for a partial last batch; the gradient
reduction weights each rank by its sample count, so training equals serial
training with the global batch.

Each rank prepares only its share: where the maps between the dataset's
source and its batch are element-wise and deterministic (or the user marked
the place with ``shard_here()``), a rank selects its rows of every global
batch before those maps and batches them alone, so it maps about 1/P of the
samples. Maps that draw random numbers are shared too: their random ops
are rewritten to draw from (seed, epoch, sample index) (_stateless.py), so
that every number of ranks sees the same samples. ``TNT_DATA_SHARE=0``
turns sharing off, ``TNT_DATA_SHARE=deterministic`` shares deterministic
maps only (random maps keep their streams, and every rank runs them whole);
where sharing is not safe, every rank runs the whole pipeline and keeps its
slice, and the log says why.
"""
import logging
import weakref

import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import _stateless
from tarantella import _tf_data_internals as tfdi
from tarantella import log
from tarantella import runtime
from tarantella import settings


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
    rank; a pipeline's replicas share one part among their stages. The same
    dataset distributed again the same way gives the same result.
    """
    part, size = parts if parts is not None else (runtime.get_rank(), runtime.get_size())
    # Kept on the dataset (and gone with it): each fit of the same dataset
    # gets the same result, without tracing its functions again, and with
    # its shuffles and random draws going on from where the last fit left.
    key = (what, micro_batch_size, parts, part, size, share_mode())
    done = dataset.__dict__.setdefault("_tnt_distributed", {})
    if key not in done:
        done[key] = _distribute(dataset, micro_batch_size, what, parts, part, size)
    return done[key]


def _distribute(dataset, micro_batch_size, what, parts, part, size):
    given = dataset
    info = batch_info(dataset)
    if micro_batch_size is not None:
        if not runtime.is_whole_number(micro_batch_size) or micro_batch_size <= 0:
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
    if size > 1:
        dataset = for_ranks(dataset)
    shared = share(dataset, part, size, what, given)
    if shared is None and size == 1:
        return dataset
    mine = _prefetched(shared if shared is not None else dataset.map(_slicer(part, size)))
    return tfdi.DeletesIteratorsAside(mine) if size > 1 else mine


def shard_here():
    """Marks where each rank may select its share of the samples, for
    ``dataset.apply``: ``ds.apply(tnt.data.shard_here()).map(decode).batch(64)``.

    Every transformation between the mark and the batch must be a ``map``
    (or ``prefetch``) that turns one sample into one sample, whatever the
    other samples: Tarantella then maps only this rank's rows of every global
    batch, even where it cannot prove the maps deterministic by itself (a
    ``tf.py_function``, say). Without distribution the mark changes nothing."""
    return tfdi.ShardHere


# Datasets whose sharing was already logged, so that each is logged once.
_reported = weakref.WeakSet()


def _report(dataset, what, message, *args, level=logging.INFO):
    try:
        if dataset in _reported:
            return
        _reported.add(dataset)
    except TypeError:
        pass
    log.logger.log(level, "%s dataset: " + message, what, *args)


def share_mode():
    """TNT_DATA_SHARE: "on" (the default), "deterministic" (random maps are
    not shared) or "off"."""
    return settings.get("TNT_DATA_SHARE")


class _Plan:
    """How a rank's share is built: `base` (the chain up to the selection,
    run as it is), `moved` (the maps and prefetches that follow the
    selection, in order), the batch's size and drop_remainder, `after`
    (the prefetches after the batch, in order), `random` (the maps of
    `moved` whose random ops were rewritten: id(map) -> _stateless.Rewritten)
    and `given` (the dataset the user gave, whose sample keys they draw
    from; set when built)."""

    def __init__(self, base, moved, batch_size, drop, after, random):
        self.base, self.moved, self.after = base, moved, after
        self.batch_size, self.drop, self.random = batch_size, drop, random
        self.given = None


def _find_mark(dataset):
    ds = dataset
    while ds is not None and tfdi.kind(ds) not in tfdi.BATCH | tfdi.UNBATCH:
        if isinstance(ds, tfdi.ShardHere):
            return ds
        ds = tfdi.input_of(ds)
    return None


def _plan(dataset, rewrite_random=True):
    """(a _Plan, None) where sharing is safe, else (None, the reason).
    With `rewrite_random`, maps whose stateful ops are random draws are
    shared with those draws rewritten (_stateless.rewrite)."""
    after, ds = [], dataset
    while tfdi.kind(ds) in tfdi.PREFETCH | tfdi.OPTIONS:
        after.append(ds)
        ds = tfdi.input_of(ds)
    name = tfdi.kind(ds)
    if name not in tfdi.BATCH:
        return None, f"a transformation ({tfdi.describe(ds)}) follows the batch"
    if name not in tfdi.PLAIN_BATCH:
        return None, (f"its batching ({tfdi.describe(ds)}) depends on every row of the global "
                      "batch")
    batch_size, drop = tfdi.batch_params(ds)
    if batch_size is None or drop is None:
        return None, "its batch size or drop_remainder is not a constant"
    mark = _find_mark(tfdi.input_of(ds))
    moved, ds = [], tfdi.input_of(ds)
    reason, random = None, {}
    while ds is not mark:
        name = tfdi.kind(ds)
        stateful = tfdi.stateful_ops(ds) if name in tfdi.MAP else []
        if stateful and rewrite_random:
            rewritten, stateful = _stateless.rewrite(ds, len(moved))
            if rewritten is not None:
                random[id(ds)] = rewritten
        if stateful and mark is None:
            reason = (f"a map holds stateful ops ({', '.join(stateful)}) whose results depend "
                      "on the samples mapped before: draw random numbers with "
                      "tf.random.stateless_* or tf.image.stateless_random_*, or, where the "
                      "results do not depend on the order, mark where sharing may start with "
                      "tnt.data.shard_here()")
        elif name not in tfdi.MAP | tfdi.PREFETCH | tfdi.OPTIONS:
            reason = f"no map comes between {tfdi.describe(ds)} and the batch"
        if reason is not None:
            if mark is not None:
                raise runtime.TarantellaError(
                    f"tnt.data.shard_here() is followed by {tfdi.describe(ds)} before the "
                    "batch; only map and prefetch may come between the mark and the batch: "
                    f"move the mark after the {tfdi.describe(ds)}")
            break
        moved.append(ds)
        ds = tfdi.input_of(ds)
    if mark is not None:
        ds = tfdi.input_of(mark)
    if not any(tfdi.kind(m) in tfdi.MAP for m in moved) and (mark is not None or
                                                             _slices_below(ds) is None):
        return None, reason or "no map comes between tnt.data.shard_here() and the batch"
    moved.reverse()
    after.reverse()
    return _Plan(ds, moved, batch_size, drop, after, random), None


def _has_map(dataset):
    """Whether a map may come anywhere in the dataset's chain (True as well
    where the chain ends in something other than a source, a zip say)."""
    ds = dataset
    while True:
        if tfdi.kind(ds) in tfdi.MAP:
            return True
        if tfdi.input_of(ds) is None:
            return tfdi.kind(ds) not in tfdi.SOURCES
        ds = tfdi.input_of(ds)


def _selector(part, size, batch_size, count):
    """The predicate on (index, sample) that keeps this rank's rows of each
    global batch of `count` samples (-1: endless), the last one included."""
    full = micro_batch_sizes(batch_size, size)
    begin, end = sum(full[:part]), sum(full[:part + 1])
    last = count % batch_size if count >= 0 else 0
    tail = micro_batch_sizes(last, size)
    tail_begin, tail_end = sum(tail[:part]), sum(tail[:part + 1])

    def keep(index, _):
        pos = index % batch_size
        in_last = index >= count - last if last else tf.constant(False)
        return tf.where(in_last, (pos >= tail_begin) & (pos < tail_end),
                        (pos >= begin) & (pos < end))
    return keep


def _rows(base, part, size, batch_size, drop, count):
    """This rank's rows of every global batch that `base` batched by
    `batch_size` gives, one row after the other."""
    if size == 1:
        return base
    if _fixed_shapes(base.element_spec):
        # Samples of one shape: cut the global batches as the batch does and
        # keep this rank's slice of each (cheaper than a predicate per sample).
        return base.batch(batch_size, drop_remainder=drop).map(_slicer(part, size)).unbatch()
    if drop and count >= 0 and count % batch_size:
        base = base.take(count - count % batch_size)
        count -= count % batch_size
    return base.enumerate().filter(_selector(part, size, batch_size, count)).map(
        lambda _, sample: sample)


def _fixed_shapes(spec):
    """Whether every component of an element of `spec` is a dense tensor of
    one shape."""
    return all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
               for s in tf.nest.flatten(spec))


def _positions(part, size, batch_size, drop, count):
    """(the places, in an epoch of `count` samples, of this rank's rows of
    every global batch of `batch_size`, the partial last one unless `drop`:
    a row of places per batch, the last one filled up with its first place
    where it is shorter; the number of the rank's rows in each batch)."""
    full, last = divmod(count, batch_size)
    sizes = micro_batch_sizes(batch_size, size)
    places = (np.arange(full, dtype=np.int64)[:, None] * batch_size + sum(sizes[:part]) +
              np.arange(sizes[part], dtype=np.int64))
    rows = [sizes[part]] * full
    if last and not drop:
        tail = micro_batch_sizes(last, size)
        width = max(sizes[part], tail[part])
        places = np.pad(places, [(0, 1), (0, width - sizes[part])], mode="edge")
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


def _slices_below(base):
    """The from_tensor_slices source (of tensors in memory) that `base` is,
    or shuffles; else None."""
    while tfdi.kind(base) in tfdi.SHUFFLE:
        base = tfdi.input_of(base)
    return base if tfdi.slices_of(base) is not None else None


def _gathered(base, seeded, part, size, batch_size, drop, count):
    """(a dataset with an element per global batch, (the number n of this
    rank's rows in it, their indices in the source, their seeds, one
    tensor per random map, where `seeded`), of which the first n rows
    count; the function that gathers the rows at the indices it is given
    (a vector, or one index for one row), each behind its seeds, (seeds,
    rows), where seeded) for a `base` that is from_tensor_slices of
    tensors, shuffled or not; else None. `seeded` is a pair: the samples'
    keys (_sample_keys), the function that makes the seeds of a vector of
    keys.

    The rank gathers its rows from the source's tensors by their indices,
    so that it neither reads nor shuffles the others: a shuffle permutes the
    indices of the samples instead (tfdi.Reshuffled: the same permutation),
    and at every iteration one element, the epoch's order and the keys of
    its samples, gives the indices and seeds of the rank's rows of the
    epoch, a batch at a time."""
    source = _slices_below(base)
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
        epoch["keys"] = seeded[0].batch(-(-count // _KEYS_AT_ONCE))

    def batches_of_epoch(epoch):
        at = tf.gather(epoch["order"], places) if "order" in epoch else places
        if "keys" not in epoch:
            return rows, at
        keys = tf.gather(tf.reshape(epoch["keys"], [-1]), tf.reshape(places, [-1]))
        seeds = tuple(tf.reshape(s, tf.concat([tf.shape(places), tf.shape(s)[1:]], 0))
                      for s in seeded[1](keys))
        return (rows, at) + seeds
    return tf.data.Dataset.zip(epoch).take(1).map(batches_of_epoch).unbatch(), rows_at


def _first(rows, *batched):
    """The first `rows` rows of each of `batched`."""
    return tuple(t[:rows] for t in batched)


# Per dataset given by the user: the stream of per-sample keys its shares
# draw from (kept, so that an epoch of a later fit draws other numbers).
_keys = weakref.WeakKeyDictionary()


def _sample_keys(given):
    """An endless dataset of the keys of the samples, in vectors of
    _KEYS_AT_ONCE: another sequence at every iteration (epoch), the same on
    every rank; the k-th sample of an epoch gets its k-th key whatever the
    number of ranks. A key of the epoch (Dataset.random, which draws
    another sequence at every iteration, from the global seed that tnt.init
    sets and this op seed) seeds each vector (one op, where a random element
    a sample would cost each its own element)."""
    try:
        keys = _keys.get(given)
    except TypeError:
        keys = None
    if keys is None:
        keys = tf.data.Dataset.random(seed=_SAMPLE_KEY_SEED, rerandomize_each_iteration=True).map(
            lambda key: tf.random.stateless_uniform(
                [_KEYS_AT_ONCE], tf.stack([key, _SAMPLE_KEY_SEED]), minval=None, maxval=None,
                dtype=tf.int64))
        try:
            _keys[given] = keys
        except TypeError:
            pass
    return keys


_KEYS_AT_ONCE = 1024
_SAMPLE_KEY_SEED = 27182818  # an op seed, next to the global seed


def _maps_of_a_row(plan):
    """One function that maps a row as the plan's maps do, one after the
    other: it takes (the row's seeds, the row) where some of them draw random
    numbers (each such map draws from its own seeds), else the row."""
    calls, nth = [], 0
    for step in plan.moved:
        if tfdi.kind(step) not in tfdi.MAP:
            continue
        if id(step) in plan.random:
            calls.append((plan.random[id(step)].call, nth))
            nth += 1
        else:
            calls.append((tfdi.map_call(step), None))

    def maps(element):
        seeds, row = element if plan.random else ((), element)
        for call, k in calls:
            row = call(row) if k is None else call(row, seeds[k])
        return row
    return maps


def _element(components):
    """An element as tf.data passes its components to a function."""
    return components[0] if len(components) == 1 else components


# The most ops a micro-batch's map holds to map its rows one after the other
# in its body (its rows times the ops of the maps), without a loop: each
# iterator instantiates the map's function anew (see _map_rows).
_UNROLLED_OPS = 4096


def _map_rows(row_maps, rows, mapped, width, ops):
    """`row_maps` applied to each row of the batched `rows` (a row maps to
    `mapped`, a structure of TensorSpecs; the maps hold `ops` ops), the
    results batched: each row goes through the same ops as alone. A step of
    a loop (tf.map_fn) costs a row about half of what the augment
    benchmark's maps cost it (on 2 ranks, 14 us against 33 us), so a batch
    of its usual `width` rows is mapped one row after the other in the
    map's body, where that stays within _UNROLLED_OPS; a shorter one (the
    partial last batch) or a wider one in a loop."""
    def unrolled():
        out = [row_maps(tf.nest.map_structure(lambda t: t[i], rows)) for i in range(width)]
        return tf.nest.map_structure(lambda *rows: tf.stack(rows), *out)

    def looped():
        return tf.map_fn(row_maps, rows, fn_output_signature=mapped)
    if width * ops > _UNROLLED_OPS:
        return looped()
    return tf.cond(tf.shape(tf.nest.flatten(rows)[0])[0] == width, unrolled, looped)


def _share_batches(plan, part, size, count):
    """This rank's micro-batches: its rows of every global batch, mapped by
    the plan's maps; random maps draw from (seed, the row's key). The seeds
    of all the random maps go along with each row, made from the keys of
    many rows at once.

    Rows of one shape (from_tensor_slices' always) come a micro-batch at a
    time and the maps run over its rows in one call (_map_rows): each row
    goes through the same ops as it would alone, with the same results to
    the bit, without the cost that tf.data adds to every element a map
    calls its function on (tens of microseconds on 2 cores, more than a
    light augmentation itself)."""
    seeded = None
    if plan.random:
        random = [plan.random[id(step)] for step in plan.moved if id(step) in plan.random]
        seeded = (_sample_keys(plan.given),
                  lambda keys: tuple(rewritten.seeds(keys) for rewritten in random))
    micro = micro_batch_sizes(plan.batch_size, size)[part]
    maps = [step for step in plan.moved if tfdi.kind(step) in tfdi.MAP]
    mapped = maps[-1].element_spec if maps else None
    parallel = tfdi.parallelism(maps)
    how = {} if parallel is None else {"num_parallel_calls": parallel, "deterministic": True}
    row_maps = _maps_of_a_row(plan)
    ops = sum(len(tfdi.map_function(step)[0].graph.get_operations()) for step in maps)
    batched = bool(maps) and all(type(s) is tf.TensorSpec for s in tf.nest.flatten(mapped))
    gathered = _gathered(plan.base, seeded, part, size, plan.batch_size, plan.drop, count)
    if gathered is not None:
        indices, rows_at = gathered
        if not maps:
            mine = indices.map(lambda *batch: rows_at(*_first(*batch)))
        elif batched:
            # Gathering the rows of a batch in one op is cheaper than a row
            # at a time inside the loop (measured on 2 ranks).
            mine = indices.map(lambda *batch: _map_rows(
                row_maps, rows_at(*_first(*batch)), mapped, micro, ops), **how)
        else:
            mine = indices.map(_first).unbatch().map(
                lambda *row: row_maps(rows_at(*row)), **how).batch(micro)
    else:
        base = plan.base
        if seeded is not None:
            seeds = seeded[0].map(seeded[1]).unbatch()
            base = tf.data.Dataset.zip((seeds, base))
        rows = _rows(base, part, size, plan.batch_size, plan.drop, count)
        if batched and _fixed_shapes(rows.element_spec):
            mine = rows.batch(micro).map(lambda *batch: _map_rows(
                row_maps, _element(batch), mapped, micro, ops), **how)
        else:
            mine = rows.map(lambda *row: row_maps(_element(row)), **how).batch(micro)
    for step in plan.moved:
        if tfdi.kind(step) in tfdi.PREFETCH:
            mine = tfdi.reprefetch(step, mine, rows=micro)
    return mine


def share(dataset, part, size, what="training", given=None):
    """This rank's micro-batches of the batched `dataset`, built so that the
    maps before the batch see only this rank's rows; None where that is off
    or not safe (then the log says why, once per dataset `given` by the
    user, `dataset` by default), and on 1 rank where no map draws random
    numbers (the dataset is then the rank's share as it is)."""
    given = dataset if given is None else given
    mode = share_mode()
    if mode == "off":
        return None
    plan, reason = _plan(dataset, rewrite_random=mode == "on")
    count = None
    if plan is not None:
        count = tf.get_static_value(plan.base.cardinality())
        if count is None or count == tf.data.UNKNOWN_CARDINALITY:
            plan, reason = None, ("the number of samples before the maps is unknown (a Python "
                                  "generator or a filter upstream): state it with dataset.apply("
                                  "tf.data.experimental.assert_cardinality(n)) before the maps")
    if plan is not None and not plan.drop and count >= 0 and 0 < count % plan.batch_size < size:
        reason = (f"its last global batch holds {count % plan.batch_size} samples, fewer than "
                  f"the {size} ranks")
        if plan.random:
            # Every rank maps the whole global batches, with the draws of 1 rank.
            _report(given, what, "every rank runs the whole input pipeline: %s%s", reason,
                    _random_note(plan))
            return _build(plan, 0, 1, int(count), given, dataset).map(_slicer(part, size))
        plan = None
    if plan is None:
        if size > 1:
            # A pipeline without any map has nothing worth sharing: said in DEBUG only.
            _report(given, what, "every rank runs the whole input pipeline: %s", reason,
                    level=logging.INFO if _has_map(dataset) else logging.DEBUG)
        return None
    if size == 1 and not plan.random:
        return None
    maps = sum(tfdi.kind(step) in tfdi.MAP for step in plan.moved)
    if size > 1 and maps == 0:
        _report(given, what, "each rank reads only its rows of every global batch from the "
                "source (from_tensor_slices)")
    elif size > 1:
        _report(given, what, "each rank maps only its share of the samples: its rows of every "
                "global batch are selected before %d map(s)%s", maps, _random_note(plan))
    else:
        _report(given, what, "%s", _random_note(plan).lstrip("; "))
    return _build(plan, part, size, int(count), given, dataset)


def _build(plan, part, size, count, given, dataset):
    """The micro-batches of `part` of `size` that `plan` gives (see share)."""
    plan.given = given
    mine = _share_batches(plan, part, size, count)
    if count >= 0:
        batches = count // plan.batch_size if plan.drop else -(-count // plan.batch_size)
        mine = mine.apply(tf.data.experimental.assert_cardinality(batches))
    for step in plan.after:
        if tfdi.kind(step) in tfdi.PREFETCH:
            mine = tfdi.reprefetch(step, mine)
    mine = tfdi.SharedBatches(mine, plan.batch_size, plan.drop)
    return mine.with_options(dataset.options())


def _random_note(plan):
    if not plan.random:
        return ""
    return (f"; the random ops of {len(plan.random)} map(s) draw from (seed, epoch, sample "
            "index), so that any number of ranks sees the same augmented samples (serial Keras "
            "draws other random numbers: the two agree in distribution only; "
            "TNT_DATA_SHARE=deterministic keeps the random streams unshared)")


def for_ranks(dataset):
    """`dataset` as ranks that train together need it: with the parallelism
    of this rank's share of the host's cores. Ranks on one host would
    otherwise each size tf.data's parallelism (and its autotuning's CPU
    budget) to all of the host's cores and oversubscribe them. A rank whose
    affinity the launcher narrowed gets the cores it may run on. Options
    that the dataset sets itself win.

    tf.data autotunes the dataset as it does for plain Keras: the stall
    that deleting an autotuned iterator caused at epoch starts is gone
    with the iterators deleted aside (tfdi.DeletesIteratorsAside, which
    distribute puts around a rank's dataset)."""
    given = dataset.options()
    options = tf.data.Options()
    share = runtime.core_share()
    if share is not None:
        if given.autotune.cpu_budget is None:
            options.autotune.cpu_budget = share
        if given.threading.private_threadpool_size is None:
            options.threading.private_threadpool_size = share
    return dataset.with_options(options)


def _prefetched(dataset):
    """`dataset` with a prefetch at its end, as tf.data's autotuning would
    inject (whose buffer grows by itself even without autotuning)."""
    ds = dataset
    while tfdi.kind(ds) in tfdi.OPTIONS or isinstance(ds, (tfdi.SharedBatches,
                                                           tfdi.DeletesIteratorsAside)):
        ds = tfdi.input_of(ds)
    if tfdi.kind(ds) in tfdi.PREFETCH:
        return dataset
    return dataset.prefetch(tf.data.AUTOTUNE)


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
    epoch = _prefetched(dataset)

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


def from_arrays(x, y=None, sample_weight=None, batch_size=None, shuffle=False):
    """A dataset of global batches from NumPy arrays (or lists/dicts of them),
    as Keras builds for `fit(x, y, batch_size=...)`."""
    if batch_size is None:
        batch_size = 32
    if not runtime.is_whole_number(batch_size) or batch_size <= 0:
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


def _gather_leaf(local, rows, global_batch, holders):
    """The rows of every rank, put back in the order of the global batches,
    whose parts `holders` hold (the ranks in the order of the parts)."""
    size = len(rows)
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
    if len(holders) == 1:  # one rank predicted every batch whole
        return parts[holders[0]]
    total = sum(rows)
    full, last = divmod(total, global_batch)
    sizes = [global_batch] * full + ([last] if last else [])
    cursor = [0] * size
    out = []
    for b in sizes:
        for r, n in zip(holders, micro_batch_sizes(b, len(holders))):
            out.append(parts[r][cursor[r]:cursor[r] + n])
            cursor[r] += n
    if cursor != list(rows):
        raise runtime.TarantellaError(
            f"gathered predictions do not match global batches of {global_batch}: "
            f"ranks hold {rows} rows")
    return np.concatenate(out, axis=0)


def gather_batches(local, global_batch, holders=None):
    """Gathers per-rank predictions (arrays, or nested lists/dicts of arrays)
    computed on micro-batches, in the original sample order, on every rank.
    `holders`: the ranks that hold the parts of each global batch, in order
    (by default every rank, a part each); the other ranks hold no rows."""
    size = runtime.get_size()
    holders = list(range(size)) if holders is None else holders
    leaves = tf.nest.flatten(local)
    mine = np.array([len(leaves[0])], dtype=np.int64)
    rows = np.zeros(size, dtype=np.int64)
    _core.allgather(mine, rows)
    rows = [int(r) for r in rows]
    gathered = [_gather_leaf(np.asarray(leaf), rows, global_batch, holders) for leaf in leaves]
    return tf.nest.pack_sequence_as(local, gathered)
