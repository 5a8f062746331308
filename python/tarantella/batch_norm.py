"""BatchNormalization on many ranks.

``BatchNormalization(synchronized=True)``: in training, the layer's batch
statistics are those of the global batch. Each rank sums its inputs, their
squares and their count per feature; one allreduce adds them up, and the
mean and variance follow as Keras computes them for a synchronized layer
(E[x^2] - E[x]^2), so training equals serial Keras with the same global
batch, also for micro-batches of different sizes. The gradient flows back
through the same sums (step.Step.differentiable_sum).

Unsynchronized layers normalize with their micro-batch's statistics, as
documented, so their moving mean and variance drift apart between ranks.
``average_moving_statistics`` replaces them by their average over the
ranks; Tarantella calls it at the end of every epoch and of fit, and
before evaluate, predict and every save, so that a checkpoint is the same
whichever rank wrote it and every rank evaluates the same model.
"""
import keras
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import runtime
from tarantella import step
from tarantella import subclass


def layers(model):
    """The BatchNormalization layers of `model`, nested ones included."""
    return [layer for layer in internals.flatten_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization)]


def synchronize(model):
    """Makes the synchronized BatchNormalization layers of `model` use the
    statistics of the global batch."""
    for layer in layers(model):
        if layer.synchronized:
            subclass.add_mixin(layer, internals.SynchronizedMoments)


def _global_moments(layer, inputs, axes):
    """Mean and variance of `inputs` over `axes` and over all ranks, as
    keras.ops.moments(..., synchronized=True) computes them serially; None
    outside a tnt.Model's training step or on one rank."""
    current = step.current()
    if current is None or runtime.get_size() == 1:
        return None
    dtype = inputs.dtype
    x = tf.cast(inputs, tf.float32) if dtype in (tf.float16, tf.bfloat16) else inputs
    total = tf.reduce_sum(x, axis=axes, keepdims=True)
    squares = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
    count = tf.reduce_sum(tf.ones_like(x), axis=axes, keepdims=True)
    shape = tf.shape(total)
    flat = tf.concat([tf.reshape(t, [-1]) for t in (total, squares, count)], axis=0)
    total, squares, count = [tf.reshape(t, shape)
                             for t in tf.split(current.differentiable_sum(flat), 3)]
    mean = tf.math.divide_no_nan(total, count)
    variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
    mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    if x is not inputs:
        mean = tf.cast(tf.clip_by_value(mean, dtype.min, dtype.max), dtype)
        variance = tf.cast(tf.clip_by_value(variance, dtype.min, dtype.max), dtype)
    return mean, variance


internals.SynchronizedMoments.moments_hook = staticmethod(_global_moments)


def average_moving_statistics(model):
    """Sets the moving mean and variance of every unsynchronized
    BatchNormalization layer to their average over the ranks. Collective."""
    if runtime.get_size() == 1:
        return
    variables = [v for layer in layers(model) if not layer.synchronized and layer.built
                 for v in (layer.moving_mean, layer.moving_variance)]
    if not variables:
        return
    values = [np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64) for v in variables]
    flat = np.concatenate([a.ravel() for a in values])
    _core.allreduce(flat, op="sum")
    flat /= runtime.get_size()
    offset = 0
    for v, a in zip(variables, values):
        v.assign(flat[offset:offset + a.size].reshape(a.shape).astype(v.dtype))
        offset += a.size


class AverageMovingStatistics(keras.callbacks.Callback):
    """Averages the moving statistics at the end of every epoch. Runs on
    every rank, before the callbacks that save."""

    def on_epoch_end(self, epoch, logs=None):
        average_moving_statistics(self.model)


class AverageMovingStatisticsEvery(AverageMovingStatistics):
    """Also averages them after every `batches` training batches, so that a
    checkpoint written at that frequency holds the averages."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches
        self._seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self._seen += 1
        if self._seen % self.batches == 0:
            average_moving_statistics(self.model)


def averaging_callback(model, callbacks):
    """The callback that averages `model`'s moving statistics for fit with
    `callbacks` (a list), or None when the model needs none."""
    if runtime.get_size() == 1 or not any(not layer.synchronized for layer in layers(model)):
        return None
    freqs = [cb.save_freq for cb in callbacks
             if isinstance(cb, keras.callbacks.ModelCheckpoint) and isinstance(cb.save_freq, int)]
    if freqs:
        import math
        return AverageMovingStatisticsEvery(math.gcd(*freqs))
    return AverageMovingStatistics()


def warn_small_micro_batches(model, smallest, what):
    """Logs that unsynchronized BatchNormalization layers see micro-batches
    of only `smallest` samples, and the remedy."""
    local = [layer.name for layer in layers(model) if not layer.synchronized]
    if local and smallest < 16:
        log.logger.warning(
            "BatchNormalization layers %s see micro-batches of %d samples in %s; statistics "
            "of fewer than 16 samples are noisy: use BatchNormalization(synchronized=True) for "
            "statistics of the global batch, or a larger global batch",
            ", ".join(local[:3]) + (", ..." if len(local) > 3 else ""), smallest, what)
