"""Every code snippet of the original Tarantella documentation, as written
(only `...` filled in), run on the ranks of a job. A snippet that Keras 3
cannot run as written must fail with a message that says what to write
instead; the worker prints `ok <name>` or `error <name>: <message>`."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ['TF_DETERMINISTIC_OPS'] = '1'       # reproducibility guide
os.environ['TF_CUDNN_DETERMINISTIC'] = '1'

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402

OUT = sys.argv[1]


def lenet5_model_generator():
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Conv2D(6, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


def snippet(name):
    def run(fn):
        try:
            fn()
            print(f"ok {name}", flush=True)
        except Exception as e:
            print(f"error {name}: {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        return fn
    return run


tnt.init()
tf.random.set_seed(42)
rng = np.random.default_rng(0)
x = rng.random((96, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, 96).astype(np.int32)
batch_size = 32
train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=42).batch(batch_size)
val_dataset = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(batch_size)

model = tnt.Model(lenet5_model_generator())
model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(),
              metrics=[keras.metrics.SparseCategoricalAccuracy()])
tnt_model = model


@snippet("ranks")
def _():
    assert tnt.get_rank() in range(tnt.get_size())
    assert tnt.get_master_rank() == 0
    if tnt.is_master_rank():
        print("Printing from the master rank")


@snippet("history on the master only")
def _():
    history_callback = tf.keras.callbacks.History()
    tnt_model.fit(train_dataset,
                  callbacks=[history_callback] if tnt.is_master_rank() else [])


@snippet("global batch from micro-batch size")
def _():
    micro_batch_size = 16
    batch_size = tnt.get_size() * micro_batch_size
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
    tnt_model.fit(ds)


@snippet("tnt_micro_batch_size")
def _():
    micro_batch_size = 16
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    tnt_model.fit(ds, tnt_micro_batch_size=micro_batch_size,
                  validation_data=tf.data.Dataset.from_tensor_slices((x[:32], y[:32])),
                  tnt_validation_micro_batch_size=micro_batch_size)
    tnt_model.evaluate(ds, tnt_micro_batch_size=micro_batch_size)
    tnt_model.predict(tf.data.Dataset.from_tensor_slices(x), tnt_micro_batch_size=micro_batch_size)


@snippet("save to a path without suffix")
def _():
    model.save(os.path.join(OUT, "path/to/location"))


@snippet("save_model without suffix")
def _():
    tnt.models.save_model(model, os.path.join(OUT, "path/to/location"))


@snippet("save and load")
def _():
    model.save(os.path.join(OUT, "location.keras"))
    loaded = tnt.models.load_model(os.path.join(OUT, "location.keras"))
    assert isinstance(loaded, tnt.Model)
    loaded.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01),
                   loss=keras.losses.SparseCategoricalCrossentropy(),
                   metrics=[keras.metrics.SparseCategoricalAccuracy()])


@snippet("model_from_config")
def _():
    config = model.get_config()
    new_model = tnt.models.model_from_config(config)
    assert isinstance(new_model, tnt.Model)


@snippet("Model.from_config")
def _():
    assert isinstance(tnt.Model.from_config(model.get_config()), tnt.Model)


@snippet("to_json and model_from_json")
def _():
    assert isinstance(tnt.models.model_from_json(model.to_json()), tnt.Model)


@snippet("to_yaml")
def _():
    model.to_yaml()


@snippet("model_from_yaml")
def _():
    tnt.models.model_from_yaml("")


@snippet("clone_model")
def _():
    assert isinstance(tnt.models.clone_model(model), tnt.Model)


@snippet("restore from config and weights")
def _():
    config = model.get_config()
    weights = model.get_weights()
    new_model = tnt.models.model_from_config(config)
    new_model.set_weights(weights)
    assert all(np.array_equal(a, b) for a, b in zip(new_model.get_weights(), weights))


@snippet("save_weights and load_weights")
def _():
    model.save_weights(os.path.join(OUT, "w.weights.h5"))
    model.load_weights(os.path.join(OUT, "w.weights.h5"))


@snippet("ModelCheckpoint as documented")
def _():
    checkpoint_path = os.path.join(OUT, 'path/to/checkpoint/location')
    model_checkpoint_callback = tf.keras.callbacks.ModelCheckpoint(
        filepath=checkpoint_path, monitor='val_acc', verbose=1, save_best_only=False,
        save_weights_only=False, mode='auto', save_freq='epoch', options=None)
    model.fit(train_dataset, validation_data=val_dataset, epochs=2,
              callbacks=[model_checkpoint_callback])


@snippet("ModelCheckpoint without options")
def _():
    checkpoint_path = os.path.join(OUT, 'path/to/checkpoint/location')
    tf.keras.callbacks.ModelCheckpoint(
        filepath=checkpoint_path, monitor='val_acc', verbose=1, save_best_only=False,
        save_weights_only=False, mode='auto', save_freq='epoch')


@snippet("ModelCheckpoint with .keras")
def _():
    checkpoint_path = os.path.join(OUT, 'checkpoint.keras')
    model_checkpoint_callback = tf.keras.callbacks.ModelCheckpoint(
        filepath=checkpoint_path, monitor='val_loss', verbose=1, save_best_only=False,
        save_weights_only=False, mode='auto', save_freq='epoch')
    model.fit(train_dataset, validation_data=val_dataset, epochs=2,
              callbacks=[model_checkpoint_callback])
    assert os.path.exists(checkpoint_path)


@snippet("save on all devices")
def _():
    path = os.path.join(OUT, f"all{tnt.get_rank()}.weights.h5")
    model.save_weights(path, tnt_save_all_devices=True)
    assert os.path.exists(path)


@snippet("reproducibility")
def _():
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=42)
    ds = ds.map(lambda a, b: (a, b), deterministic=True).batch(batch_size)
    tnt_model.fit(ds, verbose=0)
