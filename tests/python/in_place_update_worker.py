"""Trains the same models with Keras's SGD and with the SGD a pipeline
stage uses (optimizers.update_in_place: TensorFlow's fused kernels), on one
rank, and prints whether their weights are bitwise equal
(test_in_place_update.py)."""
import json
import sys

import numpy as np
import keras
import tensorflow as tf

import tarantella as tnt
from tarantella import optimizers

CONFIGS = [dict(momentum=0.0), dict(momentum=0.9), dict(momentum=0.9, nesterov=True)]


def build(kind):
    keras.utils.set_random_seed(3)
    if kind == "sequential":
        return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="tanh"),
                                 keras.layers.Dense(4)])
    inputs = keras.Input((12,))
    h = keras.layers.Dense(16, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4)(h) + keras.layers.Dense(4)(inputs))


def trained(kind, config, in_place):
    model = build(kind)
    optimizer = keras.optimizers.SGD(0.05, **config)
    if in_place:
        optimizers.update_in_place(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    y = rng.normal(size=(64, 4)).astype(np.float32)
    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    return model.get_weights()


def fused_kernels(config):
    """The update ops of one traced apply of the in-place SGD."""
    variable = keras.Variable(np.ones((3, 2), np.float32))
    optimizer = keras.optimizers.SGD(0.05, **config)
    optimizers.update_in_place(optimizer)
    optimizer.build([variable])
    apply = tf.function(lambda g: optimizer.apply([g], [variable]))
    graph = apply.get_concrete_function(tf.ones((3, 2))).graph
    return sorted({op.type for op in graph.get_operations()
                   if op.type.startswith("Resource")
                   or ("VariableOp" in op.type and op.type != "ReadVariableOp")})


tnt.init()
results = []
for config in CONFIGS:
    for kind in ("sequential", "functional"):
        keras_weights = trained(kind, config, in_place=False)
        fused_weights = trained(kind, config, in_place=True)
        results.append({"config": config, "model": kind,
                        "bitwise_equal": all(np.array_equal(a, b) for a, b in
                                             zip(keras_weights, fused_weights)),
                        "changed": not all(np.array_equal(a, b) for a, b in
                                           zip(build(kind).get_weights(), fused_weights)),
                        "ops": fused_kernels(config)})
json.dump(results, sys.stdout)
