"""A rank's dataset: its micro-batches of every global batch, shared
(sharing.py) where that is safe, else sliced out of the whole global batch."""
import tensorflow as tf

from tarantella import log
from tarantella import runtime
from tarantella.data import _tf_data_internals as tfdi
from tarantella.data import batches
from tarantella.data import sharing


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
    key = (what, micro_batch_size, parts, part, size, sharing.share_mode())
    done = dataset.__dict__.setdefault("_tnt_distributed", {})
    if key not in done:
        done[key] = _distribute(dataset, micro_batch_size, what, parts, part, size)
    return done[key]


def _distribute(dataset, micro_batch_size, what, parts, part, size):
    given = dataset
    info = batches.batch_info(dataset)
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
            info = batches.BatchInfo(True, global_batch, False)
    else:
        batches.require_batched(info, what)
    if info.size is not None and info.size < size:
        raise runtime.TarantellaError(
            f"the global batch size of the {what} dataset ({info.size}) is smaller than the "
            f"number of ranks ({size}); use a global batch of at least {size} samples")
    if info.size is not None:
        log.logger.info("%s: global batch size %d, %s %s", what, info.size,
                        "micro-batch sizes" if parts is None else "shares of the replicas",
                        batches.micro_batch_sizes(info.size, size))
    if size > 1:
        dataset = for_ranks(dataset)
    shared = sharing.share(dataset, part, size, what, given)
    if shared is None and size == 1:
        return dataset
    mine = prefetched(shared if shared is not None else dataset.map(batches.slicer(part, size)))
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


def prefetched(dataset):
    """`dataset` with a prefetch at its end, as tf.data's autotuning would
    inject (whose buffer grows by itself even without autotuning)."""
    ds = dataset
    while tfdi.kind(ds) in tfdi.OPTIONS or isinstance(ds, (tfdi.SharedBatches,
                                                           tfdi.DeletesIteratorsAside)):
        ds = tfdi.input_of(ds)
    if tfdi.kind(ds) in tfdi.PREFETCH:
        return dataset
    return dataset.prefetch(tf.data.AUTOTUNE)
