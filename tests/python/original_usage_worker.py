"""Programs for test_original_usage.py: code written for the original
Tarantella (its test suite's usage, in Keras 3 spelling), run on the ranks
of a Tarantella job. Each mode prints lines the tests check."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

if sys.argv[1:2] != ["plain_load"]:  # plain_load shows that plain Keras needs no Tarantella
    import tarantella as tnt  # noqa: E402


def mlp(split=False):
    inputs = keras.Input(shape=(6,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    if split:
        x = tnt.keras.layers.SplitLayer(name="cut")(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def data(n=48):
    rng = np.random.default_rng(3)
    return rng.random((n, 6), dtype=np.float32), rng.integers(0, 3, n).astype(np.int32)


def compile_sgd(model):
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def same_on_every_rank(weights):
    """True when every rank holds the master's weights (bitwise)."""
    flat = np.concatenate([w.reshape(-1) for w in weights]).astype(np.float64)
    master = tnt.TensorBroadcaster(flat, 0).broadcast(flat)
    return bool(tnt.TensorAllreducer(int(np.array_equal(flat, master)), "min").allreduce(
        int(np.array_equal(flat, master))))


def strategy():
    """1: the strategy by position; num_pipeline_stages counts micro-batches."""
    x, y = data()
    model = tnt.Model(mlp(), tnt.ParallelStrategy.DATA)
    compile_sgd(model)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    print("positional DATA trained", same_on_every_rank(model.get_weights()))
    piped = tnt.Model(mlp(split=True), parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                      num_pipeline_stages=4)
    print("num_pipeline_stages as micro-batches", piped._tnt.pipeline.num_micro_batches)
    compile_sgd(piped)
    print("pipelined loss finite", bool(np.isfinite(
        piped.fit(x, y, batch_size=16, epochs=1, verbose=0).history["loss"][0])))


def one_stage():
    """2: a model without SplitLayers under ALL (any ranks) or PIPELINING (one rank)."""
    x, y = data()
    which = sys.argv[3]
    model = tnt.Model(mlp(), parallel_strategy=getattr(tnt.ParallelStrategy, which))
    compile_sgd(model)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    print(f"{which} one stage pipelined", model._tnt.pipeline is not None)
    print(f"{which} one stage trained, same on every rank", same_on_every_rank(model.get_weights()))


def callbacks():
    """3: an explicit ProgbarLogger prints each line once; fit returns the user's History."""
    x, y = data()
    model = tnt.Model(mlp())
    compile_sgd(model)
    history = keras.callbacks.History()
    returned = model.fit(x, y, batch_size=16, epochs=3, verbose=2,
                         callbacks=[keras.callbacks.ProgbarLogger(), history])
    print("fit returned the user's History", returned is history,
          sorted(history.history), len(history.history["loss"]))


def collectives():
    """4: tnt.TensorAllreducer, TensorBroadcaster, TensorAllgatherer."""
    rank, size = tnt.get_rank(), tnt.get_size()
    checks = {}
    a = np.ones((35, 1), np.float32)
    out = tnt.TensorAllreducer(a).allreduce(a)
    checks["array"] = isinstance(out, np.ndarray) and np.array_equal(out, a * size)
    value = float(rank)
    out = tnt.TensorAllreducer(value).allreduce(value)
    checks["scalar"] = isinstance(out, float) and out == sum(range(size))
    mixed = [np.ones((238, 1), np.float32), np.ones((42, 1), np.float64)]
    out = tnt.TensorAllreducer(mixed).allreduce(mixed)
    checks["list"] = isinstance(out, list) and all(
        np.array_equal(o, i * size) and o.dtype == i.dtype for o, i in zip(out, mixed))
    nested = {"list_of_tensors": [np.full((4, 5), 3.29, np.float32)] * 3,
              "single_tensor": np.full((2, 15, 4), 17.0, np.float64), "value": 4.2}
    out = tnt.TensorAllreducer(nested).allreduce(nested)
    checks["dict"] = (len(out["list_of_tensors"]) == 3
                      and all(np.array_equal(t, size * nested["list_of_tensors"][0])
                              for t in out["list_of_tensors"])
                      and np.array_equal(out["single_tensor"], size * nested["single_tensor"])
                      and out["value"] == 4.2 * size)
    t = tf.constant(np.ones((11, 12), np.float32))
    out = tnt.TensorAllreducer(t).allreduce(t)
    checks["tensor"] = tf.is_tensor(out) and np.array_equal(out.numpy(), t.numpy() * size)
    mine = np.array([rank + 1, -rank], np.int64)
    expected = {"sum": [size * (size + 1) // 2, -sum(range(size))],
                "min": [1, -(size - 1)], "max": [size, 0]}
    for op in ("sum", "min", "max"):
        out = tnt.TensorAllreducer(mine, reduction_op=op).allreduce(mine)
        checks[f"op {op}"] = out.tolist() == expected[op]
    f = np.array([rank + 1.0], np.float64)
    out = tnt.TensorAllreducer(f, reduction_op="average").allreduce(f)
    checks["op average"] = out.tolist() == [(size + 1) / 2]
    nan = np.ones(12, np.float32)
    if rank == size - 1:
        nan[7] = np.nan
    checks["nan"] = bool(np.isnan(tnt.TensorAllreducer(nan).allreduce(nan)[7]))
    root = size - 1
    b = np.random.default_rng(42).random((5, 7)).astype(np.float32)
    caster = tnt.TensorBroadcaster(b, root)
    out = caster.broadcast(b) if rank == root else caster.broadcast()
    checks["broadcast array"] = isinstance(out, np.ndarray) and np.array_equal(out, b)
    inputs = 3 * [3 * [b if rank == 0 else np.zeros_like(b)]] + [35 if rank == 0 else 0]
    caster = tnt.TensorBroadcaster(inputs, 0)
    out = caster.broadcast(inputs) if rank == 0 else caster.broadcast()
    checks["broadcast list of lists"] = (isinstance(out, list) and out[-1] == 35 and all(
        np.array_equal(x, b) for inner in out[:-1] for x in inner))
    g = np.ones((2, 1), np.float32)
    out = tnt.TensorAllgatherer(g).allgather(g)
    checks["allgather array"] = np.array_equal(out, np.ones(2 * size, np.float32))
    out = tnt.TensorAllgatherer(50).allgather(50)
    checks["allgather scalar"] = np.array_equal(out, np.full(size, 50))
    uneven = np.full(rank + 1, rank, np.int32)
    out = tnt.TensorAllgatherer(uneven).allgather(uneven)
    checks["allgather uneven"] = out.tolist() == [r for r in range(size) for _ in range(r + 1)]
    for bad in (np.empty(0, np.float32), [], "sample input"):
        try:
            tnt.TensorAllreducer(bad)
            checks[f"TypeError for {bad!r}"] = False
        except TypeError:
            checks[f"TypeError for {bad!r}"] = True
    failed = [k for k, ok in checks.items() if not ok]
    print(f"rank {rank} collectives: {len(checks)} checks, failed {failed}")


def save_uncompiled(out):
    """5: save before compile; plain Keras loads the file."""
    model = tnt.Model(mlp())
    model.save(os.path.join(out, "uncompiled.keras"))
    np.save(os.path.join(out, "uncompiled.npy"), model.predict(data()[0], verbose=0))
    print("saved before compile")


def sequential():
    """6: tnt.Sequential, and tnt.Sequential.from_config."""
    layers = [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    model = tnt.Sequential(layers)
    print("tnt.Sequential is", type(model).__name__, isinstance(model, tnt.Model),
          isinstance(model, tnt.Sequential))
    again = tnt.Sequential.from_config(model.get_config())
    print("from_config is", type(again).__name__, isinstance(again, tnt.Sequential))
    compile_sgd(again)
    x, y = data()
    again.fit(x, y, batch_size=16, epochs=1, verbose=0)
    print("Sequential trained, same on every rank", same_on_every_rank(again.get_weights()))


@keras.saving.register_keras_serializable(package="original_usage")
class Subclassed(keras.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def wrap():
    """7: tnt.Model(m) leaves m as it is, wraps any number of times, and its
    class round-trips through Keras's config machinery."""
    x = data()[0]
    seq = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    sub = Subclassed()
    sub(x[:1])
    for kind, m in (("Functional", mlp()), ("Sequential", seq), ("Subclassed", sub)):
        before = type(m)
        w = tnt.Model(m)
        w2 = tnt.Model(m, parallel_strategy=tnt.ParallelStrategy.DATA if kind == "Subclassed"
                       else tnt.ParallelStrategy.ALL)
        w3 = tnt.Model(w)
        print(kind, "user model unchanged", type(m) is before and not isinstance(m, tnt.Model)
              and not m.compiled)
        print(kind, "wrapped thrice", all(isinstance(v, tnt.Model) and isinstance(v, before)
                                          for v in (w, w2, w3)), len({id(w), id(w2), id(w3)}))
        print(kind, "shares the weights", all(a is b for a, b in zip(w.weights, m.weights)))
        rebuilt = {
            "type(w).from_config": type(w).from_config(w.get_config()),
            "tnt.Model.from_config": tnt.Model.from_config(
                w.get_config() if kind != "Subclassed"  # a subclassed config names no class
                else keras.saving.serialize_keras_object(w)),
            "keras clone_model": keras.models.clone_model(w),
            "tnt clone_model": tnt.models.clone_model(w),
            "tnt model_from_json": tnt.models.model_from_json(w.to_json()),
        }
        for how, r in rebuilt.items():
            print(kind, how, type(r).__name__, isinstance(r, before), isinstance(r, tnt.Model),
                  r(x).shape == m(x).shape)
        plain = keras.models.model_from_json(w.to_json())
        print(kind, "keras model_from_json plain", not isinstance(plain, tnt.Model))
        compile_sgd(w)
        w.fit(x, data()[1], batch_size=16, epochs=1, verbose=0)
        print(kind, "after fit user model uncompiled", not m.compiled,
              "same predictions", np.allclose(m.predict(x, verbose=0), w.predict(x, verbose=0)))


def split_save(out):
    """8: a pipelined model saves its cuts as Keras layers; Tarantella
    pipelines the reloaded file at the same cuts."""
    x, y = data()
    model = tnt.Model(mlp(split=True), parallel_strategy=tnt.ParallelStrategy.PIPELINING)
    compile_sgd(model)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = os.path.join(out, "piped.keras")
    model.save(path)
    predictions = model.predict(x, verbose=0)
    if tnt.is_master_rank():
        np.save(os.path.join(out, "piped.npy"), predictions)
    loaded = tnt.models.load_model(path, parallel_strategy=tnt.ParallelStrategy.PIPELINING)
    print("reloaded stages", loaded._tnt.pipeline.partition.num_stages,
          "cut", [layer.name for layer in loaded.layers
                  if isinstance(layer, tnt.keras.layers.SplitLayer)])
    print("reloaded same predictions",
          bool(np.allclose(loaded.predict(x, verbose=0), predictions, atol=1e-6)))


def plain_load(out):
    """5 and 8: plain Keras (no Tarantella imported) loads both files."""
    for name in ("uncompiled", "piped"):
        model = keras.saving.load_model(os.path.join(out, f"{name}.keras"))
        same = np.allclose(model.predict(data()[0], verbose=0),
                           np.load(os.path.join(out, f"{name}.npy")), atol=1e-6)
        print(name, "loaded", type(model).__name__, "same predictions", same,
              [type(layer).__name__ for layer in model.layers])
    print("tarantella imported", "tarantella" in sys.modules)


def lazy_init():
    """10: no tnt.init(): the first call that needs the runtime starts it."""
    print("size", tnt.get_size(), "rank", tnt.get_rank())
    model = tnt.Model(mlp())
    compile_sgd(model)
    model.fit(*data(), batch_size=16, epochs=1, verbose=0)
    print("trained without tnt.init()", same_on_every_rank(model.get_weights()))


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode not in ("lazy_init", "plain_load"):
        tnt.init()
    if mode in ("save_uncompiled", "split_save", "plain_load"):
        globals()[mode](out)
    else:
        globals()[mode]()
