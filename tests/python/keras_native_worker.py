"""Programs for test_keras_native.py and test_seed_snippets.py, run on the
ranks of a Tarantella job (or plainly: one rank). Each mode prints lines the
tests check."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402

if sys.argv[1:2] != ["plain_load"]:  # plain_load shows that plain Keras needs no Tarantella
    import tarantella as tnt  # noqa: E402


def lenet5_model_generator():
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Conv2D(6, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


def data(n=64):
    rng = np.random.default_rng(1)
    return (rng.random((n, 28, 28, 1), dtype=np.float32),
            rng.integers(0, 10, n).astype(np.int32))


class Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)


def api(out):
    """tnt.Model is the keras.Model: isinstance, summary, plot_model,
    callbacks that read self.model, files that plain Keras loads."""
    tnt.init()
    km = lenet5_model_generator()
    model = tnt.Model(km)
    print("same object", model is km)
    print("user model unchanged", type(km) is keras.Model(km.inputs, km.outputs).__class__
          and not isinstance(km, tnt.Model))
    print("isinstance keras.Model", isinstance(model, keras.Model))
    print("isinstance tnt.Model", isinstance(model, tnt.Model))
    print("class", type(model).__name__)
    seq = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    print("sequential", isinstance(seq, keras.Sequential) and isinstance(seq, tnt.Model))
    sub = tnt.Model(Subclassed())
    print("subclassed", isinstance(sub, Subclassed) and isinstance(sub, tnt.Model))
    model.summary()
    keras.utils.plot_model(model, to_file=os.path.join(out, "model.png"), show_shapes=True)
    print("plot_model", os.path.getsize(os.path.join(out, "model.png")) > 0)

    seen = []

    class Reads(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(self.model is model)

    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[Reads()])
    print("callback model", seen == [True])
    model.save(os.path.join(out, "model.keras"))
    model.save_weights(os.path.join(out, "model.weights.h5"))
    np.save(os.path.join(out, "predictions.npy"), model.predict(x, verbose=0))


def plain_load(out):
    """Plain Keras (no Tarantella imported) loads what tnt.Model saved."""
    model = keras.saving.load_model(os.path.join(out, "model.keras"))
    print("loaded class", type(model).__name__, type(model).__module__)
    print("loaded optimizer", type(model.optimizer).__name__, type(model.optimizer).__module__)
    x, _ = data()
    same = np.allclose(model.predict(x, verbose=0), np.load(os.path.join(out, "predictions.npy")),
                       atol=1e-6)
    print("same predictions", same)
    fresh = lenet5_model_generator()
    fresh.load_weights(os.path.join(out, "model.weights.h5"))
    print("weights load", all(np.array_equal(a, b)
                              for a, b in zip(fresh.get_weights(), model.get_weights())))
    print("tarantella imported", "tarantella" in sys.modules)


def failing_callback(out):
    """A callback that runs on the master only raises: fit ends on every rank."""
    tnt.init()
    model = tnt.Model(lenet5_model_generator())
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = data()
    missing = os.path.join(out, "no", "such", "dir", "log.csv")
    try:
        model.fit(x, y, batch_size=16, epochs=3, verbose=0,
                  callbacks=[keras.callbacks.CSVLogger(missing)])
    except Exception as e:
        print(f"rank {tnt.get_rank()} fit raised {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print(f"rank {tnt.get_rank()} fit returned", flush=True)


if __name__ == "__main__":
    {"api": api, "plain_load": plain_load, "failing_callback": failing_callback}[sys.argv[1]](
        sys.argv[2])
