"""Each rank prepares only its share of the data (tarantella/data.py).

The rows every rank gets for every global batch must be exactly those of
the whole-pipeline path (every rank runs the whole pipeline and slices each
global batch), while the maps before the batch see only about 1/N of the
samples. The selection runs in this process for ranks 0..N-1 (data.distribute
takes the part explicitly); fit on 2 ranks against serial Keras is at the end.
"""
import logging
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, mpirun_command, run
from test_training import load

from tarantella import _tf_data_internals as tfdi
from tarantella import data
from tarantella import settings
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
                                                 (43, 8, False), (9, 9, False)])
def test_shared_rows_equal_the_whole_pipeline(size, samples, batch, drop, data_share):
    def build(counter):
        return pairs(samples).map(counter).batch(batch, drop_remainder=drop).prefetch(2)
    counts = check_equal_today(build, size, data_share, samples=samples)
    used = samples - (samples % batch if drop else 0) if size > 1 else samples
    assert sum(counts) == used
    assert max(counts) <= -(-batch // size) * -(-samples // batch)


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
    ("random", "stateful ops (RandomUniformInt)"),
    ("padded", "its batching (padded_batch) depends on every row"),
    ("after_batch", "a transformation (map) follows the batch"),
    ("small_last", "last global batch holds 1 samples, fewer than the 2 ranks"),
    ("unknown_count", "number of samples before the maps is unknown"),
    ("no_map", "no map comes between tensor_slice and the batch"),
])
def test_unsafe_pipelines_fall_back_and_say_why(case, reason, data_share, caplog):
    # A pipeline without maps has nothing to share: it is said in DEBUG only.
    caplog.set_level(logging.DEBUG if case == "no_map" else logging.INFO, logger="tarantella")
    random = lambda x, y: (x + tf.random.uniform([], 0, 1, tf.int64), y)  # noqa: E731
    builders = {
        "filter": lambda c: pairs(20).map(c).filter(lambda x, y: x % 3 > 0).batch(4),
        "random": lambda c: pairs(20).map(c).map(random).batch(4),
        "padded": lambda c: pairs(20).map(c).padded_batch(4),
        "after_batch": lambda c: pairs(20).map(c).batch(4).map(lambda x, y: (x - 1, y)),
        "small_last": lambda c: pairs(21).map(c).batch(4),
        "unknown_count": lambda c: pairs(20).filter(lambda x, y: x > 2).map(c).batch(4),
        "no_map": lambda c: pairs(20).batch(4),
    }
    samples = {"small_last": 21, "unknown_count": 17, "no_map": 0}.get(case, 20)
    ds = builders[case](Counter())
    data.distribute(ds, parts=(0, 2))
    data.distribute(ds, parts=(1, 2))
    assert caplog.text.count("every rank runs the whole input pipeline") == 1, caplog.text
    assert reason in caplog.text
    said = [r for r in caplog.records if "every rank runs" in r.getMessage()]
    assert said[0].levelno == (logging.DEBUG if case == "no_map" else logging.INFO)
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
    assert list(tfdi.remap(parallel, tfdi.remap(mapped, src)).as_numpy_iterator()) == \
        list(range(1, 11))
    assert list(tfdi.reprefetch(src.prefetch(3), src).as_numpy_iterator()) == list(range(10))


@pytest.mark.parametrize("pipeline", [False, True], ids=["data-parallel", "pipelined"])
def test_fit_equals_serial(pipeline, tmp_path, python):
    """On 2 ranks (data-parallel), or on 2 replicas of a 2-stage pipeline
    (4 ranks): the replicas share the global batches."""
    flags = ["--pipeline"] if pipeline else []
    ranks = 4 if pipeline else 2
    serial_out = str(tmp_path / "serial")
    run([sys.executable, WORKER, "--serial", "--out", serial_out] + flags)
    serial = load(serial_out, 1)[0]
    out = str(tmp_path / "dist")
    run(mpirun_command(ranks, python, WORKER, "--out", out, *flags), timeout=300)
    results = load(out, ranks)
    for key in serial:
        if key.startswith("mapped/"):
            continue
        for r in range(ranks):
            assert np.allclose(results[r][key], serial[key], rtol=0, atol=1e-5), key
    # 2 epochs of 90 samples in global batches of 16 (the last one of 10):
    # each of 2 shares maps 8 + 5 rows of the batches.
    assert [int(r["mapped/fit"]) for r in results] == [2 * 45] * ranks
    assert int(serial["mapped/fit"]) == 2 * 90


def test_the_shared_dataset_still_tells_the_global_batch():
    ds = data.distribute(pairs(20).map(Counter()).batch(6, drop_remainder=True), parts=(1, 2))
    info = data.batch_info(ds)
    assert (info.size, info.drop_remainder) == (6, True)
    assert ds.cardinality().numpy() == 3
