"""Each rank prepares only its share of the samples: its rows of every
global batch are selected before the maps (selection.py) where the plan
allows (planning.py), and the maps run on them alone (maps.py); random
maps draw from (seed, epoch, sample index) (stateless.py)."""
import logging
import weakref

import tensorflow as tf

from tarantella import log
from tarantella import settings
from tarantella.data import _tf_data_internals as tfdi
from tarantella.data import batches
from tarantella.data import maps
from tarantella.data import planning
from tarantella.data import selection
from tarantella.data import stateless


def share_mode():
    """TNT_DATA_SHARE: "on" (the default), "deterministic" (random maps are
    not shared) or "off"."""
    return settings.get("TNT_DATA_SHARE")


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


def _share_batches(plan, part, size, count):
    """This rank's micro-batches: its rows of every global batch, mapped by
    the plan's maps; random maps draw from (seed, the row's key). The seeds
    of all the random maps go along with each row, made from the keys of
    many rows at once.

    Rows of one shape (from_tensor_slices' always) come a micro-batch at a
    time and the maps run over its rows in one call (maps.map_rows): each
    row goes through the same ops as it would alone, with the same results
    to the bit, without the cost that tf.data adds to every element a map
    calls its function on (tens of microseconds on 2 cores, more than a
    light augmentation itself)."""
    seeded = None
    if plan.random:
        random = [plan.random[id(step)] for step in plan.moved if id(step) in plan.random]
        seeded = (stateless.sample_keys(plan.given),
                  lambda keys: tuple(rewritten.seeds(keys) for rewritten in random))
    micro = batches.micro_batch_sizes(plan.batch_size, size)[part]
    map_steps = [step for step in plan.moved if tfdi.kind(step) in tfdi.MAP]
    mapped = map_steps[-1].element_spec if map_steps else None
    parallel = tfdi.parallelism(map_steps)
    how = {} if parallel is None else {"num_parallel_calls": parallel, "deterministic": True}
    row_maps = maps.maps_of_a_row(plan)
    ops = sum(len(tfdi.map_function(step)[0].graph.get_operations()) for step in map_steps)
    batched = bool(map_steps) and all(type(s) is tf.TensorSpec for s in tf.nest.flatten(mapped))
    gathered = selection.gathered(plan.base, seeded, part, size, plan.batch_size, plan.drop,
                                  count)
    if gathered is not None:
        indices, rows_at = gathered
        if not map_steps:
            mine = indices.map(lambda *batch: rows_at(*selection.first(*batch)))
        elif batched:
            # Gathering the rows of a batch in one op is cheaper than a row
            # at a time inside the loop (measured on 2 ranks).
            mine = indices.map(lambda *batch: maps.map_rows(
                row_maps, rows_at(*selection.first(*batch)), mapped, micro, ops), **how)
        else:
            mine = indices.map(selection.first).unbatch().map(
                lambda *row: row_maps(rows_at(*row)), **how).batch(micro)
    else:
        base = plan.base
        if seeded is not None:
            seeds = seeded[0].map(seeded[1]).unbatch()
            base = tf.data.Dataset.zip((seeds, base))
        rows = selection.selected_rows(base, part, size, plan.batch_size, plan.drop, count)
        if batched and batches.fixed_shapes(rows.element_spec):
            mine = rows.batch(micro).map(lambda *batch: maps.map_rows(
                row_maps, maps.element(batch), mapped, micro, ops), **how)
        else:
            mine = rows.map(lambda *row: row_maps(maps.element(row)), **how).batch(micro)
    for step in plan.moved:
        if tfdi.kind(step) in tfdi.PREFETCH:
            mine = tfdi.reprefetch(step, mine, rows=micro)
    return mine


def _random_note(plan):
    if not plan.random:
        return ""
    return (f"; the random ops of {len(plan.random)} map(s) draw from (seed, epoch, sample "
            "index), so that any number of ranks sees the same augmented samples (serial Keras "
            "draws other random numbers: the two agree in distribution only; "
            "TNT_DATA_SHARE=deterministic keeps the random streams unshared)")


def _build(plan, part, size, count, given, dataset):
    """The micro-batches of `part` of `size` that `plan` gives (see share)."""
    plan.given = given
    mine = _share_batches(plan, part, size, count)
    if count >= 0:
        global_batches = count // plan.batch_size if plan.drop else -(-count // plan.batch_size)
        mine = mine.apply(tf.data.experimental.assert_cardinality(global_batches))
    for step in plan.after:
        if tfdi.kind(step) in tfdi.PREFETCH:
            mine = tfdi.reprefetch(step, mine)
    mine = tfdi.SharedBatches(mine, plan.batch_size, plan.drop)
    return mine.with_options(dataset.options())


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
    plan, reason = planning.plan(dataset, rewrite_random=mode == "on")
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
            return _build(plan, 0, 1, int(count), given, dataset).map(batches.slicer(part, size))
        plan = None
    if plan is None:
        if size > 1:
            # A pipeline without any map has nothing worth sharing: said in DEBUG only.
            _report(given, what, "every rank runs the whole input pipeline: %s", reason,
                    level=logging.INFO if planning.has_map(dataset) else logging.DEBUG)
        return None
    if size == 1 and not plan.random:
        return None
    n_maps = sum(tfdi.kind(step) in tfdi.MAP for step in plan.moved)
    if size > 1 and n_maps == 0:
        _report(given, what, "each rank reads only its rows of every global batch from the "
                "source (from_tensor_slices)")
    elif size > 1:
        _report(given, what, "each rank maps only its share of the samples: its rows of every "
                "global batch are selected before %d map(s)%s", n_maps, _random_note(plan))
    else:
        _report(given, what, "%s", _random_note(plan).lstrip("; "))
    return _build(plan, part, size, int(count), given, dataset)
