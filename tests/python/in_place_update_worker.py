"""Trains the same models with Keras's SGD and Adam and with those a
pipeline stage uses (pipeline/in_place.py: TensorFlow's fused kernels
for SGD, Keras's operations one after the other for Adam), on one rank, and
prints whether their weights are bitwise equal (test_in_place_update.py)."""
import json
import sys

import numpy as np
import keras
import tensorflow as tf

import tarantella as tnt
from tarantella.pipeline.in_place import update_in_place

CONFIGS = [("SGD", dict(momentum=0.0)), ("SGD", dict(momentum=0.9)),
           ("SGD", dict(momentum=0.9, nesterov=True)),
           ("Adam", dict()), ("Adam", dict(beta_1=0.8, beta_2=0.99, epsilon=1e-3))]


def optimizer_of(name, config):
    return getattr(keras.optimizers, name)(0.05 if name == "SGD" else 0.01, **config)


def build(kind):
    keras.utils.set_random_seed(3)
    if kind == "sequential":
        return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="tanh"),
                                 keras.layers.Dense(4)])
    inputs = keras.Input((12,))
    h = keras.layers.Dense(16, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4)(h) + keras.layers.Dense(4)(inputs))


def trained(kind, name, config, in_place):
    model = build(kind)
    optimizer = optimizer_of(name, config)
    if in_place:
        update_in_place(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    y = rng.normal(size=(64, 4)).astype(np.float32)
    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    return model.get_weights()


def fused_kernels(name, config):
    """The update ops of one traced apply of the in-place optimizer."""
    variable = keras.Variable(np.ones((3, 2), np.float32))
    optimizer = optimizer_of(name, config)
    update_in_place(optimizer)
    optimizer.build([variable])
    apply = tf.function(lambda g: optimizer.apply([g], [variable]))
    graph = apply.get_concrete_function(tf.ones((3, 2))).graph
    writes = [op for op in graph.get_operations()
              if op.type.startswith("Resource")
              or ("VariableOp" in op.type and op.type != "ReadVariableOp")]
    return sorted({op.type for op in writes}), adds_in_order(writes)


def adds_in_order(writes):
    """Whether one AssignAddVariableOp waits (through its inputs and control
    inputs) for another: Adam's second moment for its first, in order; in
    Keras's own update the two are independent."""
    adds = [op for op in writes if op.type == "AssignAddVariableOp"]

    def ancestors(op):
        seen, todo = set(), [op]
        while todo:
            node = todo.pop()
            for parent in [t.op for t in node.inputs] + list(node.control_inputs):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen
    return any(a in ancestors(b) for a in adds for b in adds if a is not b)


tnt.init()
results = []
for name, config in CONFIGS:
    for kind in ("sequential", "functional"):
        keras_weights = trained(kind, name, config, in_place=False)
        fused_weights = trained(kind, name, config, in_place=True)
        ops, in_order = fused_kernels(name, config)
        results.append({"optimizer": name, "config": config, "model": kind,
                        "bitwise_equal": all(np.array_equal(a, b) for a, b in
                                             zip(keras_weights, fused_weights)),
                        "changed": not all(np.array_equal(a, b) for a, b in
                                           zip(build(kind).get_weights(), fused_weights)),
                        "ops": ops, "in_order": in_order})
json.dump(results, sys.stdout)
