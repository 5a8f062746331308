"""The plan of the sharing rewrite: which of a dataset's transformations
run on a rank's rows only (the maps between the selection and the batch),
or why none may."""
from tarantella import runtime
from tarantella.data import _tf_data_internals as tfdi
from tarantella.data import selection
from tarantella.data import stateless


class Plan:
    """How a rank's share is built: `base` (the chain up to the selection,
    run as it is), `moved` (the maps and prefetches that follow the
    selection, in order), the batch's size and drop_remainder, `after`
    (the prefetches after the batch, in order), `random` (the maps of
    `moved` whose random ops were rewritten: id(map) -> stateless.Rewritten)
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


def plan(dataset, rewrite_random=True):
    """(a Plan, None) where sharing is safe, else (None, the reason).
    With `rewrite_random`, maps whose stateful ops are random draws are
    shared with those draws rewritten (stateless.rewrite)."""
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
            rewritten, stateful = stateless.rewrite(ds, len(moved))
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
                                                             selection.slices_below(ds) is None):
        return None, reason or "no map comes between tnt.data.shard_here() and the batch"
    moved.reverse()
    after.reverse()
    return Plan(ds, moved, batch_size, drop, after, random), None


def has_map(dataset):
    """Whether a map may come anywhere in the dataset's chain (True as well
    where the chain ends in something other than a source, a zip say)."""
    ds = dataset
    while True:
        if tfdi.kind(ds) in tfdi.MAP:
            return True
        if tfdi.input_of(ds) is None:
            return tfdi.kind(ds) not in tfdi.SOURCES
        ds = tfdi.input_of(ds)
