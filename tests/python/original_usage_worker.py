"""Programs for test_original_usage.py: code written for the original
Tarantella (its test suite's usage, in Keras 3 spelling), run on the ranks
of a Tarantella job. Each mode prints lines the tests check."""
import copy
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
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


def one_stage(which):
    """2: a model without SplitLayers under ALL (any ranks) or PIPELINING (one rank)."""
    x, y = data()
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


def from_config_twice():
    """11: every from_config entry point leaves the config it is given as
    it was, so it can be called twice on one dict."""
    x = data()[0]
    seq = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    sub = Subclassed()
    sub(x[:1])
    for kind, m in (("Functional", mlp()), ("Sequential", seq), ("Subclassed", sub)):
        w = tnt.Model(m)
        config = (keras.saving.serialize_keras_object(w) if kind == "Subclassed"
                  else w.get_config())
        entry_points = {"tnt.Model.from_config": tnt.Model.from_config,
                        "tnt.models.model_from_config": tnt.models.model_from_config}
        if kind != "Subclassed":
            entry_points["type(w).from_config"] = type(w).from_config
        if kind == "Sequential":
            entry_points["tnt.Sequential.from_config"] = tnt.Sequential.from_config
        for how, from_config in entry_points.items():
            snapshot = copy.deepcopy(config)
            models = [from_config(config) for _ in range(2)]
            print(kind, how, "twice", config == snapshot,
                  all(isinstance(r, tnt.Model) and r(x).shape == m(x).shape for r in models))


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
    # MODE[,MODE...] OUT: the modes one after another in this process (a
    # launch costs seconds of imports); MODE:ARG gives the mode ARG, the
    # modes that write or read files get OUT.
    for spec in sys.argv[1].split(","):
        mode, _, arg = spec.partition(":")
        if mode not in ("lazy_init", "plain_load"):
            tnt.init()
        files = mode in ("save_uncompiled", "split_save", "plain_load")
        globals()[mode](*([arg] if arg else [sys.argv[2]] if files else []))
