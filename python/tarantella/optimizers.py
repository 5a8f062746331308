"""Distributed optimizers: gradients are averaged across ranks before they
are clipped or applied.

``distribute(optimizer)`` subclasses the optimizer in place (as Horovod's
``DistributedOptimizer`` does): its ``apply`` first averages the gradients
over the global batch, then runs the optimizer's own ``apply``. In a
tnt.Model's step the average is weighted by each rank's sample count; in a
custom training loop every rank weighs alike unless a
DistributedGradientTape was told the sample count (loops.py). For mixed
precision Keras wraps the optimizer in a LossScaleOptimizer, whose update
sits inside a conditional on the gradients being finite; the wrapper is the
one distributed, so every rank takes the same branch.

A pipeline stage's optimizer (update_in_place) updates with TensorFlow's
fused kernels where they compute exactly what Keras's update_step does:
Keras's SGD computes ``m * momentum - g * lr`` and ``var + m`` (or ``var -
g * lr``) as separate operations, each a temporary as large as the
variable, which a stage that holds a large part of a model has no room for;
ResourceApplyKerasMomentum and ResourceApplyGradientDescent evaluate the
same expressions, operation for operation, in the variables' own buffers.
Every other optimizer, and SGD on anything but dense float32 gradients,
updates as Keras does.
"""
import weakref

import keras
import tensorflow as tf

from tarantella import _keras_internals as internals
from tarantella import step
from tarantella import subclass

_in_place = weakref.WeakSet()  # optimizers that update_in_place() was asked of


class DistributedOptimizer:
    """Placed in front of an optimizer's class by distribute()."""

    def apply(self, grads, trainable_variables=None):
        grads = step.active().reduce_gradients(list(grads))
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        if self not in _in_place or not _fused_update(self, gradient, variable, learning_rate):
            super().update_step(gradient, variable, learning_rate)


def update_in_place(optimizer):
    """Makes the distributed `optimizer` update its variables without
    temporaries where a fused kernel computes Keras's update bit for bit
    (keras.optimizers.SGD, with or without momentum, dense float32)."""
    _in_place.add(distribute(optimizer))


def _fused_update(optimizer, gradient, variable, learning_rate):
    """Runs Keras's SGD update of `variable` as one fused kernel; False when
    there is none for it (then Keras's own update_step runs)."""
    # Keras's TensorFlow backend hands update_step the tf.Variable.
    if (subclass.base_class(optimizer) is not keras.optimizers.SGD
            or not isinstance(gradient, tf.Tensor) or gradient.dtype != tf.float32
            or not isinstance(variable, tf.Variable) or variable.dtype != tf.float32):
        return False
    lr = tf.cast(learning_rate, tf.float32)
    if optimizer.momentum == 0:
        tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=lr, delta=gradient)
        return True
    momentum = optimizer.momentums[internals.optimizer_variable_index(optimizer, variable)]
    tf.raw_ops.ResourceApplyKerasMomentum(
        var=variable.handle, accum=momentum.value.handle, lr=lr, grad=gradient,
        momentum=tf.cast(optimizer.momentum, tf.float32), use_nesterov=optimizer.nesterov)
    return True


def distribute(optimizer):
    """Makes `optimizer` (a keras.optimizers.Optimizer) average gradients
    across ranks; returns it. Doing it twice changes nothing."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"tnt.distribute_optimizer takes a keras.optimizers.Optimizer; got "
                        f"{type(optimizer).__name__}")
    return subclass.add_mixin(optimizer, DistributedOptimizer)


def distribute_held_by(model):
    """Distributes every optimizer `model` holds in an attribute (as models
    whose train_step applies several optimizers keep them), except those
    wrapped by a LossScaleOptimizer it also holds."""
    found = []
    for value in vars(model).values():
        for v in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(v, keras.optimizers.Optimizer):
                found.append(v)
    wrapped = {id(o.inner_optimizer) for o in found
               if isinstance(o, keras.optimizers.LossScaleOptimizer)}
    for o in found:
        if id(o) not in wrapped:
            distribute(o)
