"""Each rank prepares only its share of the data (tarantella/data/).

The rows every rank gets for every global batch must be exactly those of
the whole-pipeline path (every rank runs the whole pipeline and slices each
global batch), while the maps before the batch see only about 1/N of the
samples. The selection runs in this process for ranks 0..N-1 (data.distribute
takes the part explicitly); fit on 2 ranks against serial Keras is at the end.
"""
import gc
import logging
import os
import sys
import threading
import time
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, mpirun_command, run
from test_training import load

from tarantella import data
from tarantella import runtime
from tarantella import settings
from tarantella.data import _tf_data_internals as tfdi
from tarantella.data import maps as row_maps
from tarantella.data import selection
from tarantella.runtime import TarantellaError


@pytest.fixture(autouse=True)
def data_share(monkeypatch):
    """set(value): TNT_DATA_SHARE for this test (settings are read when they
    are loaded); the environment's own settings come back after it."""
    def set_share(value):
        monkeypatch.setenv("TNT_DATA_SHARE", value)
        settings.load()
    yield set_share
    monkeypatch.undo()
    settings.load()

WORKER = os.path.join(ROOT, "tests", "python", "data_share_worker.py")


class Counter:
    """A map that counts the samples it processed (a stateless op for tf.data,
    so that it does not stop the rewrite)."""

    def __init__(self, stateful=False):
        self.calls = 0
        self.stateful = stateful

    def _count(self, v):
        self.calls += 1
        return v

    def __call__(self, x, y):
        if self.stateful:
            x = tf.py_function(self._count, [x], tf.int64)
        else:
            x = tf.numpy_function(self._count, [x], tf.int64, stateful=False)
        x.set_shape([])
        return x * 10, y


def rows(ds):
    return [[b[0].tolist(), b[1].tolist()] for b in ds.as_numpy_iterator()]


def rank_rows(build, part, size, share, data_share):
    """(rows of every batch, samples the counting map processed) of a rank."""
    data_share("1" if share else "0")
    counter = Counter()
    got = rows(data.distribute(build(counter), parts=(part, size)))
    return got, counter.calls


def pairs(n):
    return tf.data.Dataset.from_tensor_slices((np.arange(n, dtype=np.int64),
                                               np.arange(n, dtype=np.float32) / 2))


def check_equal_today(build, size, data_share, shared=True, samples=None):
    """The shared rows equal today's on every rank; returns the counts."""
    counts = []
    for part in range(size):
        today, today_calls = rank_rows(build, part, size, False, data_share)
        got, calls = rank_rows(build, part, size, True, data_share)
        assert got == today, f"rank {part} of {size}"
        counts.append(calls)
        assert today_calls == samples
        if shared and size > 1:
            assert calls == sum(len(b[0]) for b in got), f"rank {part}: mapped {calls}"
        else:
            assert calls == samples
    return counts


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("samples,batch,drop", [(40, 7, False), (40, 7, True), (42, 6, False),
                                                 (43, 8, False), (9, 9, False), (5, 8, False)])
def test_shared_rows_equal_the_whole_pipeline(size, samples, batch, drop, data_share):
    def build(counter):
        return pairs(samples).map(counter).batch(batch, drop_remainder=drop).prefetch(2)
    counts = check_equal_today(build, size, data_share, samples=samples)
    used = samples - (samples % batch if drop else 0) if size > 1 else samples
    assert sum(counts) == used
    assert max(counts) <= -(-batch // size) * -(-samples // batch)


@pytest.mark.parametrize("unrolled", [True, False])
def test_float_maps_give_the_same_bits_shared(unrolled, data_share, monkeypatch):
    """A rank maps its rows a micro-batch at a time, the rows one after the
    other in one body (or in a loop: a partial last batch, a map too large
    to repeat): every row gets the bits it gets mapped alone, float
    reductions and image ops included."""
    if not unrolled:
        monkeypatch.setattr(row_maps, "_UNROLLED_OPS", 0)
    batch = 6
    images = np.random.default_rng(3).normal(size=(3 * batch + 5, 6, 6, 3)).astype(np.float32)

    def build():
        def transform(x, y):
            x = tf.image.adjust_contrast(tf.tanh(x * 1.7), 1.3)
            return x - tf.reduce_mean(x, axis=[0, 1]), tf.reduce_sum(x) + y
        ds = tf.data.Dataset.from_tensor_slices((images, np.arange(len(images), dtype=np.float32)))
        return ds.shuffle(len(images), seed=2).map(transform).batch(batch)
    for size in (2, 3):
        for part in range(size):
            got = {}
            for share in ("0", "1"):
                data_share(share)
                got[share] = list(data.distribute(build(), parts=(part, size)).as_numpy_iterator())
            assert len(got["1"]) == 4
            for a, b in zip(got["0"], got["1"]):
                assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("drop", [False, True])
def test_samples_of_varying_shapes(drop, data_share):
    """Rows that cannot be batched before the map (ragged) are selected one
    by one."""
    lengths = [1 + i % 4 for i in range(40)]
    ragged = tf.RaggedTensor.from_row_lengths(np.arange(sum(lengths), dtype=np.int64), lengths)

    def build(counter):
        ds = tf.data.Dataset.from_tensor_slices((ragged, np.arange(40, dtype=np.float32)))
        return ds.map(lambda r, y: (tf.reduce_sum(r), y)).map(counter).batch(7, drop)
    counts = check_equal_today(build, 3, data_share, samples=40)
    assert sum(counts) == (35 if drop else 40)


def test_an_endless_dataset(data_share, caplog):
    caplog.set_level(logging.INFO, logger="tarantella")
    got = {}
    for share in ("0", "1"):
        data_share(share)
        ds = pairs(10).repeat().map(Counter()).batch(6)
        got[share] = rows(data.distribute(ds, parts=(1, 2)).take(5))
    assert got["1"] == got["0"]
    assert "each rank maps only its share" in caplog.text


def test_unbatched_dataset_with_micro_batch_size(data_share):
    for part in range(3):
        data_share("0")
        today = rows(data.distribute(pairs(27).map(Counter()), 4, parts=(part, 3)))
        data_share("1")
        counter = Counter()
        assert rows(data.distribute(pairs(27).map(counter), 4, parts=(part, 3))) == today
        assert counter.calls == sum(len(b[0]) for b in today)


def test_maps_after_a_shuffle_and_parallel_unordered_maps(data_share):
    """The shuffle stays before the selection (the same order on every rank);
    a map with deterministic=False is run in order."""
    def build(counter):
        return (pairs(30).shuffle(30, seed=3).map(counter)
                .map(lambda x, y: (x + 1, y), num_parallel_calls=2, deterministic=False)
                .batch(8))
    data_share("1")
    serial = rows(build(Counter()))
    for size in (2, 3):
        parts = [rank_rows(build, p, size, True, data_share) for p in range(size)]
        for i, batch in enumerate(serial):
            joined = sum((parts[p][0][i][0] for p in range(size)), [])
            assert joined == batch[0]
        assert sum(c for _, c in parts) == 30


@pytest.mark.parametrize("maps", ["deterministic", "random", "none"])
def test_each_rank_reads_only_its_rows(maps, data_share, monkeypatch):
    """From from_tensor_slices, shuffled or not, a rank gathers its rows by
    their indices and shuffles indices instead of samples. Its rows equal
    those that reading every sample and selecting afterwards gives (the same
    pipeline over a source that cannot be indexed: a range mapped to the
    rows; without maps, the whole pipeline on every rank), over epochs that
    reshuffle and over two fits of one dataset (the second goes on with the
    next permutations), random draws included."""
    random = maps == "random"
    images = np.arange(58, dtype=np.float32).reshape(29, 2)
    gathered = []
    real = selection.gathered

    def spy(*args):
        mine = real(*args)
        gathered.append(mine is not None)
        return mine
    monkeypatch.setattr(selection, "gathered", spy)

    def augment(x, y):
        return (x + tf.random.uniform([2]) if random else x * 2), y

    def build(indexable, shuffle):
        tf.random.set_seed(42)  # what tnt.init does on every rank
        if indexable:
            ds = tf.data.Dataset.from_tensor_slices((images, np.arange(29)))
        else:
            ds = tf.data.Dataset.range(29).map(lambda i: (tf.gather(images, i), i))
        if shuffle:
            ds = ds.shuffle(29, seed=4).shuffle(7)
        return (ds if maps == "none" else ds.map(augment)).batch(6)

    for shuffle in (False, True):
        for size in (1, 2, 3) if random else (2, 3):
            for part in range(size):
                got = {}
                for indexable in (True, False):
                    # Without maps, the whole pipeline: TNT_DATA_SHARE=0.
                    data_share("0" if maps == "none" and not indexable else "1")
                    ds = build(indexable or maps == "none", shuffle)
                    fits = [data.distribute(ds, parts=(part, size)) for _ in range(2)]
                    got[indexable] = [[b[0].tolist(), b[1].tolist()] for fit in fits
                                      for _ in range(2) for b in fit.as_numpy_iterator()]
                # One build per dataset: the second fit gets the first's.
                assert gathered[-2:] == [True, False] if maps != "none" else \
                    gathered[-1:] == [True]
                assert got[True] == got[False], f"shuffle={shuffle}, rank {part} of {size}"
                epochs = np.array_split(np.array([r for b in got[True] for r in b[1]]), 4)
                assert all(len(e) == len(epochs[0]) for e in epochs)
                if shuffle:  # every epoch, later fits included, has another order
                    assert len({tuple(e) for e in epochs}) == 4


def test_a_stateful_map_needs_the_mark(data_share, caplog):
    caplog.set_level(logging.INFO, logger="tarantella")

    def unmarked(counter):
        counter.stateful = True
        return pairs(20).map(counter).batch(6)

    def marked(counter):
        counter.stateful = True
        return pairs(20).apply(data.shard_here()).map(counter).batch(6)
    check_equal_today(unmarked, 2, data_share, shared=False, samples=20)
    assert "stateful ops (EagerPyFunc)" in caplog.text
    counts = check_equal_today(marked, 2, data_share, samples=20)
    assert counts == [10, 10]


def test_the_mark_changes_nothing_without_distribution():
    ds = pairs(5).apply(data.shard_here()).batch(2)
    assert rows(ds) == rows(pairs(5).batch(2))
    assert data.batch_info(ds).size == 2


@pytest.mark.parametrize("case,reason", [
    ("filter", "no map comes between filter and the batch"),
    ("random", "stateful ops (RandomShuffle)"),
    ("keras_seed_in_loop", "ReadVariableOp in a tf.cond or loop"),
    ("random_off", "stateful ops (RandomUniformInt)"),
    ("padded", "its batching (padded_batch) depends on every row"),
    ("after_batch", "a transformation (map) follows the batch"),
    ("small_last", "last global batch holds 1 samples, fewer than the 2 ranks"),
    ("unknown_count", "number of samples before the maps is unknown"),
    ("no_map", "no map comes between repeat and the batch"),
])
def test_unsafe_pipelines_fall_back_and_say_why(case, reason, data_share, caplog):
    # A pipeline without maps has nothing to share: it is said in DEBUG only.
    caplog.set_level(logging.DEBUG if case == "no_map" else logging.INFO, logger="tarantella")
    # RandomShuffle has no stateless counterpart; a draw inside a loop would
    # repeat its seed at every pass; TNT_DATA_SHARE=deterministic keeps
    # random streams unshared.
    random = lambda x, y: (x + tf.random.shuffle(tf.range(3, dtype=tf.int64), seed=5)[0], y)  # noqa
    uniform = lambda x, y: (x + tf.random.uniform([], 0, 1, tf.int64), y)  # noqa: E731
    seed_generator = keras.random.SeedGenerator(3)

    def in_loop(x, y):
        for _ in tf.range(2):
            x += tf.cast(keras.random.uniform([], seed=seed_generator) > 2, tf.int64)
        return x, y
    builders = {
        "filter": lambda c: pairs(20).map(c).filter(lambda x, y: x % 3 > 0).batch(4),
        "random": lambda c: pairs(20).map(c).map(random).batch(4),
        "keras_seed_in_loop": lambda c: pairs(20).map(c).map(in_loop).batch(4),
        "random_off": lambda c: pairs(20).map(c).map(uniform).batch(4),
        "padded": lambda c: pairs(20).map(c).padded_batch(4),
        "after_batch": lambda c: pairs(20).map(c).batch(4).map(lambda x, y: (x - 1, y)),
        "small_last": lambda c: pairs(21).map(c).batch(4),
        "unknown_count": lambda c: pairs(20).filter(lambda x, y: x > 2).map(c).batch(4),
        "no_map": lambda c: pairs(20).repeat(1).batch(4),
    }
    samples = {"small_last": 21, "unknown_count": 17, "no_map": 0}.get(case, 20)
    if case == "random_off":
        data_share("deterministic")
    ds = builders[case](Counter())
    data.distribute(ds, parts=(0, 2))
    data.distribute(ds, parts=(1, 2))
    assert caplog.text.count("every rank runs the whole input pipeline") == 1, caplog.text
    assert reason in caplog.text
    said = [r for r in caplog.records if "every rank runs" in r.getMessage()]
    assert said[0].levelno == (logging.DEBUG if case == "no_map" else logging.INFO)
    if case != "random_off":  # check_equal_today sets TNT_DATA_SHARE itself
        check_equal_today(builders[case], 2, data_share, shared=False, samples=samples)


def test_a_misplaced_mark_is_an_error():
    ds = pairs(20).apply(data.shard_here()).filter(lambda x, y: x > 2).map(Counter()).batch(4)
    with pytest.raises(TarantellaError, match="shard_here.. is followed by filter before"):
        data.distribute(ds, parts=(0, 2))


def test_switched_off(data_share):
    data_share("0")
    counter = Counter()
    rows(data.distribute(pairs(20).map(counter).batch(4), parts=(1, 2)))
    assert counter.calls == 20


def test_tf_data_internals_of_tensorflow_2_21():
    """The private tf.data structure _tf_data_internals reads, in TensorFlow
    2.21: when this fails after a TensorFlow upgrade, adapt that module."""
    assert tf.__version__.startswith("2.21."), tf.__version__
    src = tf.data.Dataset.range(10)
    mapped = src.map(lambda x: x + 1)
    parallel = src.map(lambda x: x, num_parallel_calls=2, deterministic=False)
    kinds = {
        "_RangeDataset": (src, tfdi.SOURCES),
        "_TensorSliceDataset": (pairs(3), tfdi.SOURCES),
        "_MapDataset": (mapped, tfdi.MAP),
        "_ParallelMapDataset": (parallel, tfdi.MAP),
        "_BatchDataset": (src.batch(2), tfdi.PLAIN_BATCH),
        "_ParallelBatchDataset": (src.batch(2, num_parallel_calls=2), tfdi.PLAIN_BATCH),
        "_PaddedBatchDataset": (src.padded_batch(2), tfdi.BATCH),
        "_UnbatchDataset": (src.batch(2).unbatch(), tfdi.UNBATCH),
        "_PrefetchDataset": (src.prefetch(3), tfdi.PREFETCH),
        "_OptionsDataset": (src.with_options(tf.data.Options()), tfdi.OPTIONS),
    }
    for name, (ds, group) in kinds.items():
        assert tfdi.kind(ds) == name and name in group
    assert tfdi.input_of(mapped) is src
    assert tfdi.batch_params(src.batch(4, drop_remainder=True)) == (4, True)
    assert tfdi.stateful_ops(mapped) == []
    autotuned = src.map(lambda x: x, num_parallel_calls=tf.data.AUTOTUNE)
    assert tfdi.parallelism([mapped]) is None
    assert tfdi.parallelism([mapped, parallel]) == 2
    assert tfdi.parallelism([parallel, autotuned]) == tf.data.AUTOTUNE
    assert tfdi.kind(tfdi.reprefetch(src.prefetch(3), src)) in tfdi.PREFETCH
    assert tfdi.reprefetch(src.prefetch(3), src)._buffer_size.numpy() == 3
    assert tfdi.reprefetch(src.prefetch(5), src, rows=2)._buffer_size.numpy() == 3
    assert tfdi.reprefetch(src.prefetch(tf.data.AUTOTUNE), src, rows=2)._buffer_size.numpy() == \
        tf.data.AUTOTUNE


# run -> the ranks it trains on: 2 (data-parallel) or 4 (2 replicas of a
# 2-stage pipeline).
FIT_RUNS = {"plain": 2, "pipeline": 4, "shuffle": 2, "shuffle+unbuilt": 2,
            "shuffle+stop-in-epoch": 2}


@pytest.fixture(scope="module")
def fit_runs(tmp_path_factory):
    """FIT_RUNS' results serially (one process) and on their ranks (one job
    per number of ranks), and the random augmentation's on 2 ranks."""
    d = tmp_path_factory.mktemp("fit")
    run([sys.executable, WORKER, "--serial", "--out", str(d / "serial"),
         "--runs", ",".join(FIT_RUNS)])
    jobs = {2: [r for r, n in FIT_RUNS.items() if n == 2] + ["random"], 4: ["pipeline"]}
    for ranks, runs in jobs.items():
        run(mpirun_command(ranks, sys.executable, WORKER, "--out", str(d / f"ranks{ranks}"),
                           "--runs", ",".join(runs)), timeout=300)
    serial = {r: load(str(d / "serial" / r), 1)[0] for r in FIT_RUNS}
    ranks = {r: load(str(d / f"ranks{n}" / r), n) for r, n in FIT_RUNS.items()}
    ranks["random"] = load(str(d / "ranks2" / "random"), 2)
    return serial, ranks


@pytest.mark.parametrize("spec", list(FIT_RUNS),
                         ids=["data-parallel", "pipelined", "data-parallel-reshuffled",
                              "unbuilt-model-reshuffled", "stopped-in-an-epoch-reshuffled"])
@pytest.mark.ranks
def test_fit_equals_serial(spec, fit_runs):
    """On 2 ranks (data-parallel), or on 2 replicas of a 2-stage pipeline
    (4 ranks): the replicas share the global batches. Reshuffled each epoch,
    every epoch's order must be plain Keras's (it follows the count of
    iterators made of the dataset before), also where fit builds the model
    (from zeros shaped like a batch, not from a batch of the data), and in
    evaluate and predict after a fit that a callback stopped in an epoch
    (Keras makes no iterator at the end of that epoch)."""
    serial, results = fit_runs[0][spec], fit_runs[1][spec]
    ranks = FIT_RUNS[spec]
    for key in serial:
        if key.startswith("mapped/"):
            continue
        for r in range(ranks):
            assert np.allclose(results[r][key], serial[key], rtol=0, atol=1e-5), key
    if "stop-in-epoch" in spec:
        return  # how far the prefetch read into the stopped epoch varies
    # 2 epochs of 90 samples in global batches of 16 (the last one of 10):
    # each of 2 shares maps 8 + 5 rows of the batches.
    assert [int(r["mapped/fit"]) for r in results] == [2 * 45] * ranks
    assert int(serial["mapped/fit"]) == 2 * 90


def test_the_shared_dataset_still_tells_the_global_batch():
    ds = data.distribute(pairs(20).map(Counter()).batch(6, drop_remainder=True), parts=(1, 2))
    info = data.batch_info(ds)
    assert (info.size, info.drop_remainder) == (6, True)
    assert ds.cardinality().numpy() == 3


def augmented(counter):
    """Images augmented at random as Keras users write it: tf.image's random
    crop, flip, brightness and contrast, and Keras preprocessing layers (which
    draw through a SeedGenerator), after a shuffle; `counter` counts the
    samples mapped."""
    keras.utils.set_random_seed(42)  # what tnt.init does on every rank
    flip, crop = keras.layers.RandomFlip("horizontal", seed=3), keras.layers.RandomCrop(5, 5)
    rng = np.random.default_rng(0)
    images = rng.random((23, 8, 8, 3)).astype(np.float32)

    def augment(x, y):
        x = tf.image.random_crop(x, [6, 6, 3])
        x = tf.image.random_flip_left_right(x)
        x = tf.image.random_brightness(x, 0.2)
        x = tf.image.random_contrast(x, 0.8, 1.2)
        return crop(flip(x)), y

    def count(x, y):
        return x, y + 0 * counter(y, y)[0]
    ds = tf.data.Dataset.from_tensor_slices((images, np.arange(23, dtype=np.int64)))
    return ds.shuffle(23, seed=1).map(augment, num_parallel_calls=3).map(count).batch(5)


def global_batches(size, epochs=2):
    """The global batches of `epochs` epochs put together from the shares of
    `size` simulated ranks (each with its own dataset, as in a real run), and
    the samples each rank mapped."""
    counters = [Counter() for _ in range(size)]
    shares = [data.distribute(augmented(counters[p]), parts=(p, size)) for p in range(size)]
    batches = []
    for _ in range(epochs):
        got = [list(s.as_numpy_iterator()) for s in shares]
        for b in range(len(got[0])):
            batches.append([np.concatenate([g[b][i] for g in got]) for i in (0, 1)])
    return batches, [c.calls for c in counters]


def test_random_augmentation_is_the_same_on_any_number_of_ranks(data_share, caplog):
    caplog.set_level(logging.INFO, logger="tarantella")
    data_share("1")
    one, _ = global_batches(1)
    assert "random ops of 1 map(s) draw from (seed, epoch, sample index)" in caplog.text
    assert "agree in distribution only" in caplog.text
    assert len(one) == 10 and one[0][0].shape == (5, 5, 5, 3)
    # The augmentation draws: the same image differs between the epochs (its
    # crop offsets alone take 9 values), and so do the samples of a batch.
    first = {int(y): x for x, y in zip(*[np.concatenate(c) for c in zip(*one[:5])])}
    second = {int(y): x for x, y in zip(*[np.concatenate(c) for c in zip(*one[5:])])}
    assert sorted(first) == sorted(second) == list(range(23))
    assert sum(not np.array_equal(first[k], second[k]) for k in first) > 15
    for size in (2, 3, 4):  # on 4, the last batch of 3 cannot be shared: all map all
        got, mapped = global_batches(size)
        assert len(got) == len(one)
        for b, (mine, ref) in enumerate(zip(got, one)):
            assert np.array_equal(mine[1], ref[1]), f"{size} ranks, batch {b}: other samples"
            assert np.array_equal(mine[0], ref[0]), f"{size} ranks, batch {b}: other draws"
        # Each rank mapped its rows only: per epoch, its part of the 4 batches
        # of 5 and the last of 3.
        per_epoch = [sum(data.micro_batch_sizes(b, size)[p] for b in (5, 5, 5, 5, 3))
                     for p in range(size)]
        assert mapped == ([2 * n for n in per_epoch] if size < 4 else [2 * 23] * 4)


@pytest.mark.ranks
def test_fit_with_random_augmentation_is_the_same_on_any_number_of_ranks(tmp_path, python,
                                                                        fit_runs):
    """Trained on 1, 2 and 3 ranks, a model whose input map draws random
    factors ends with the same weights and losses: every rank count sees the
    same augmented samples. What differs is the order in which the gradient
    allreduce adds the ranks' float32 partial sums: a relative error of a
    few 1e-7 per step, over 12 steps of SGD(0.1) on weights of order 1,
    far below the 1e-5 allowed (the bound the serial comparisons use)."""
    results = {2: fit_runs[1]["random"]}
    for ranks in (1, 3):
        out = str(tmp_path / f"r{ranks}")
        run(mpirun_command(ranks, python, WORKER, "--out", out, "--random"), timeout=300)
        results[ranks] = load(out, ranks)
    one = results[1][0]
    for ranks in (2, 3):
        for key in one:
            if key.startswith("mapped/"):
                continue
            for r in range(ranks):
                assert np.allclose(results[ranks][r][key], one[key], rtol=0, atol=1e-5), \
                    f"{ranks} ranks, rank {r}: {key}"
        # Each rank maps only its rows: 2 epochs of 5 global batches of 16 and
        # one of 10, split as micro_batch_sizes splits them.
        mapped = [int(res["mapped/fit"]) for res in results[ranks]]
        assert mapped == [2 * sum(data.micro_batch_sizes(b, ranks)[r] for b in [16] * 5 + [10])
                          for r in range(ranks)]
    # The draws matter: without them (the serial comparison above) the
    # losses differ.
    assert not np.allclose(fit_runs[0]["plain"]["loss"], one["loss"], rtol=0, atol=1e-5)


def test_ranks_get_their_share_of_the_cores(monkeypatch):
    """On several ranks: the rank's share of the cores, unless the dataset's
    options say otherwise, and tf.data's autotuning as the dataset has it
    (on by default, as in Keras); a prefetch ends the rank's dataset, whose
    iterators are deleted aside. On 1 rank the options stay the dataset's
    own."""
    monkeypatch.setattr(runtime, "core_share", lambda: 3)
    one = data.distribute(pairs(20).map(Counter()).batch(4), parts=(0, 1))
    assert one.options().autotune.enabled is None
    assert one.options().threading.private_threadpool_size is None
    mine = data.distribute(pairs(20).map(Counter()).batch(4), parts=(0, 2))
    options = mine.options()
    assert options.autotune.enabled is None
    assert (options.threading.private_threadpool_size, options.autotune.cpu_budget) == (3, 3)
    assert isinstance(mine, tfdi.DeletesIteratorsAside)
    assert tfdi.kind(tfdi.input_of(mine)) in tfdi.PREFETCH
    own = tf.data.Options()
    own.autotune.enabled = False
    own.threading.private_threadpool_size = 5
    mine = data.distribute(pairs(20).map(Counter()).batch(4).with_options(own), parts=(1, 2))
    options = mine.options()
    assert options.autotune.enabled is False
    assert (options.threading.private_threadpool_size, options.autotune.cpu_budget) == (5, 3)
    # Rank 1 of 2: rows 2 and 3 of every batch of 4, mapped (x * 10).
    assert rows(mine) == [[[10 * i, 10 * (i + 1)], [i / 2, (i + 1) / 2]]
                          for i in range(2, 20, 4)]


THREADS = ("import tensorflow as tf, tarantella as tnt; from tarantella import runtime; "
           "tnt.init(); print('threads', runtime.core_share(), "
           "tf.config.threading.get_intra_op_parallelism_threads())")


@pytest.mark.parametrize("chosen", [None, "2"])
@pytest.mark.ranks
def test_ranks_share_the_cores_among_tensorflow_threads(chosen, python):
    """Two ranks on this host: each runs TensorFlow's ops on its share of
    the cores, unless the program chose the number of threads itself."""
    env = {"TF_NUM_INTRAOP_THREADS": chosen} if chosen else {}
    out = run(mpirun_command(2, python, "-c", THREADS), timeout=300, env=env).stdout
    found = [line.split()[1:] for line in out.splitlines() if line.startswith("threads")]
    assert len(found) == 2, out
    for share, threads in found:
        assert share != "None"  # two ranks on one host always share it
        assert threads == ("0" if chosen else share), out


def test_iterators_are_deleted_aside(monkeypatch):
    """An iterator of a rank's dataset is deleted in the thread that holds
    it once the program dropped it, not where the program drops it."""
    # A holder of its own: the process's one may still be deleting the
    # iterators that earlier tests dropped (seconds each, see _Aside).
    monkeypatch.setattr(tfdi, "_ASIDE", tfdi._Aside())
    mine = data.distribute(pairs(20).map(Counter()).batch(4), parts=(0, 2))
    deleted_in = []
    iterator = iter(mine)
    next(iterator)
    weakref.finalize(iterator, lambda: deleted_in.append(threading.current_thread().name))
    del iterator
    # The thread looks every 50 ms; deleting an autotuned iterator can wait
    # for its autotuning thread (up to 10 s).
    for _ in range(1200):  # 60 s at most
        if deleted_in:
            break
        time.sleep(0.05)
    assert deleted_in == ["tnt-iterators"]


def test_iterators_held_aside_are_never_deleted_once_the_program_exits():
    """When the program exits (close, which atexit calls), the thread stops
    at once, and no iterator it holds is deleted, dropped or not, neither
    then nor by the interpreter's shutdown: deleting an autotuned iterator
    can wait seconds for tf.data's autotuning thread, and a daemon thread
    that deletes one while the interpreter shuts down can abort the
    process."""
    aside = tfdi._Aside()
    aside._PERIOD_S = 3600  # the thread would not look again before the end of the test
    deleted = []
    dropped, kept = (iter(pairs(8).map(Counter()).batch(4)) for _ in range(2))
    for name, iterator in (("dropped", dropped), ("kept", kept)):
        next(iterator)
        aside.hold(iterator)
        weakref.finalize(iterator, deleted.append, name).atexit = False
    dropped_ref = weakref.ref(dropped)
    del dropped, iterator
    start = time.monotonic()
    aside.close()
    assert time.monotonic() - start < 60
    assert aside._thread is None
    del kept
    gc.collect()
    assert deleted == [] and dropped_ref() is not None


def test_core_share_without_a_launcher():
    """Not initialized (one process, the host to itself): no share, unless
    the process's affinity is narrower than the host."""
    narrowed = len(os.sched_getaffinity(0)) < os.cpu_count()
    assert runtime.core_share() == (len(os.sched_getaffinity(0)) if narrowed else None)


def test_every_rewritten_random_op(data_share, caplog):
    """Normal, truncated normal and categorical draws are rewritten as the
    uniform ones are: 2 ranks, each mapping its half, draw what 1 rank draws."""
    caplog.set_level(logging.INFO, logger="tarantella")
    data_share("1")

    def build():
        tf.random.set_seed(42)

        def draw(x, y):
            noise = (tf.random.normal([3]) + tf.random.truncated_normal([3]) +
                     tf.cast(tf.random.categorical([[0.0, 1.0, 2.0]], 3)[0], tf.float32))
            return tf.cast(x, tf.float32) + noise, y
        return pairs(12).map(draw).batch(4)
    one = rows(data.distribute(build(), parts=(0, 1)))
    halves = [rows(data.distribute(build(), parts=(p, 2))) for p in range(2)]
    joined = [[halves[0][b][0] + halves[1][b][0], halves[0][b][1] + halves[1][b][1]]
              for b in range(3)]
    assert "selected before 1 map(s); the random ops of 1 map(s) draw" in caplog.text
    assert joined == one
    assert len({tuple(r) for b in one for r in b[0]}) == 12  # every sample drew its own


def test_a_dataset_distributed_again_is_not_built_again(data_share):
    """Each fit distributes its dataset: fit after fit on one dataset gets
    the same distributed dataset (its functions are not traced again, and
    its shuffle and random draws go on from where the last fit left them);
    another part, use or setting gets its own."""
    ds = (pairs(24).shuffle(24, seed=3)
          .map(lambda x, y: (x + tf.random.uniform([], 0, 9, tf.int64, seed=5), y)).batch(6))
    first = data.distribute(ds, parts=(0, 2))
    assert data.distribute(ds, parts=(0, 2)) is first
    again = [rows(data.distribute(ds, parts=(0, 2))) for _ in range(2)]
    assert again[0] != again[1]  # the next epoch: reshuffled, drawn anew
    assert data.distribute(ds, parts=(1, 2)) is not first
    assert data.distribute(ds, parts=(0, 2), what="validation") is not first
    assert data.distribute(ds, parts=(0, 2)) is first
    data_share("deterministic")
    assert data.distribute(ds, parts=(0, 2)) is not first


def test_one_iterator_across_epochs_draws_the_orders_of_two_iterators_an_epoch():
    """fit reads its epochs through one iterator (data.across_epochs): each
    epoch must give what plain Keras's iterators give (it makes two an
    epoch and reads the first: a dataset that reshuffles on each iteration
    draws one order for each), and nothing may read ahead across an epoch's
    end: the counting map sees the epochs' samples and no more."""
    def build(counter):
        tf.random.set_seed(42)
        return pairs(10).shuffle(10).map(counter).batch(4).prefetch(2)
    keras_like, counter = [], Counter()
    ds = build(counter)
    for _ in range(3):
        keras_like.append(rows(ds))
        dropped = iter(ds)
        del dropped
    counter = Counter()
    endless, steps = data.across_epochs(build(counter))
    assert steps == 3
    iterator = iter(endless)
    mine = [[[v.numpy().tolist() for v in next(iterator)] for _ in range(steps)]
            for _ in range(3)]
    time.sleep(0.2)  # what a prefetch after the epochs' end would read by now
    assert mine == keras_like
    assert len({str(epoch) for epoch in mine}) == 3  # reshuffled each epoch
    assert counter.calls == 3 * 10


@pytest.mark.parametrize("case", ["unknown", "endless", "steps-per-execution"])
def test_without_a_known_number_of_batches_each_epoch_keeps_its_iterator(case):
    """Where the batches of an epoch are not known (or a step of several
    batches would read across an epoch's end), fit gets the dataset as it
    is, and Keras makes each epoch's iterator."""
    ds = pairs(10)
    if case == "unknown":
        ds = ds.filter(lambda x, y: x >= 0)
    ds = ds.batch(4)
    if case == "endless":
        ds = ds.repeat()
    assert data.across_epochs(ds, 2 if case == "steps-per-execution" else 1) == (ds, None)
