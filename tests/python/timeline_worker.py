"""Trains a small model for a few steps with the timeline on (TNT_TIMELINE
set by the test), plus one barrier, so that every kind of event is in the
trace. Prints the facts the test checks the trace against."""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
from tarantella import _core  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

STEPS = 6


def main():
    tnt.init()
    keras.utils.set_random_seed(3)
    inputs = keras.Input(shape=(32,))
    h = inputs
    for _ in range(3):
        h = keras.layers.Dense(64, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(h))
    model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 16, 32)).astype(np.float32)
    y = rng.integers(0, 4, size=STEPS * 16).astype(np.int32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    _core.barrier()
    facts = {"rank": tnt.get_rank(), "steps": STEPS, "enabled": _core.timeline_enabled(),
             "tensors": len(model.trainable_weights),
             "gradient_bytes": int(sum(np.prod(w.shape) * 4 for w in model.trainable_weights))}
    print("FACTS " + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
