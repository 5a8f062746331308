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
Keras's Adam computes ``(g - m) * (1 - beta_1)``, ``g * g``, ``m * alpha``
and ``sqrt(v)`` as temporaries as large as the variable, and TensorFlow runs
the first moment's update, the second's and other variables' updates at
once, each with its temporaries, beside the gradients of every variable.
TensorFlow's fused Adam computes ``1 - beta_1`` in float32, where Keras
rounds it from a Python float, so its bits differ; and updating a part of
a variable in place (a block of rows) switches the variable to copying on
every read. A stage's Adam therefore runs Keras's own operations, one part
after the other: the first moment, the second, the variable, then the next
variable's. Every other optimizer, AMSGrad, and anything but dense float32
gradients update as Keras does.
"""
import weakref

import keras
import tensorflow as tf

from tarantella import _keras_internals as internals
from tarantella import step
from tarantella import subclass

_in_place = weakref.WeakSet()  # optimizers that update_in_place() was asked of
# Per traced graph, the last Adam update (_adam_in_order): the next waits for it.
_last_update = weakref.WeakKeyDictionary()


class DistributedOptimizer:
    """Placed in front of an optimizer's class by distribute()."""

    def apply(self, grads, trainable_variables=None):
        grads = step.active().reduce_gradients(list(grads))
        return super().apply(grads, trainable_variables)

    def update_step(self, gradient, variable, learning_rate):
        if self not in _in_place or not (_fused_update(self, gradient, variable, learning_rate)
                                         or _adam_in_order(self, gradient, variable,
                                                           learning_rate)):
            super().update_step(gradient, variable, learning_rate)


def update_in_place(optimizer):
    """Makes the distributed `optimizer` update its variables without
    temporaries where a fused kernel computes Keras's update bit for bit
    (keras.optimizers.SGD, with or without momentum, dense float32)."""
    _in_place.add(distribute(optimizer))


def _fused_update(optimizer, gradient, variable, learning_rate):
    """Runs Keras's SGD update of `variable` as one fused kernel; False when
    there is none for it (then Keras's own update_step runs)."""
    if (subclass.base_class(optimizer) is not keras.optimizers.SGD
            or not _dense_float32(gradient, variable)):
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


def _dense_float32(gradient, variable):
    # Keras's TensorFlow backend hands update_step the tf.Variable.
    return (isinstance(gradient, tf.Tensor) and gradient.dtype == tf.float32
            and isinstance(variable, tf.Variable) and variable.dtype == tf.float32)


def _adam_in_order(optimizer, gradient, variable, learning_rate):
    """Runs Keras's Adam.update_step of `variable`, operation for operation,
    one part after the other (see above); False where it does not apply
    (then Keras's own update_step runs)."""
    if (subclass.base_class(optimizer) is not keras.optimizers.Adam or optimizer.amsgrad
            or not _dense_float32(gradient, variable)):
        return False
    ops = keras.ops
    lr = ops.cast(learning_rate, variable.dtype)
    local_step = ops.cast(optimizer.iterations + 1, variable.dtype)
    beta_1_power = ops.power(ops.cast(optimizer.beta_1, variable.dtype), local_step)
    beta_2_power = ops.power(ops.cast(optimizer.beta_2, variable.dtype), local_step)
    m, v = (slot.value for slot in internals.adam_slots(optimizer, variable))
    alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    graph = tf.compat.v1.get_default_graph()
    with tf.control_dependencies(_last_update.get(graph, [])):
        done = m.assign_add(ops.multiply(ops.subtract(gradient, m), 1 - optimizer.beta_1),
                            read_value=False)
    with tf.control_dependencies([done]):
        done = v.assign_add(ops.multiply(ops.subtract(ops.square(gradient), v),
                                         1 - optimizer.beta_2), read_value=False)
    with tf.control_dependencies([done]):
        done = variable.assign_sub(ops.divide(ops.multiply(m, alpha),
                                              ops.add(ops.sqrt(v), optimizer.epsilon)),
                                   read_value=False)
    if not tf.executing_eagerly():
        _last_update[graph] = [done]
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
