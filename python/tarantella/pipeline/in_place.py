"""The in-place update of a pipeline stage's optimizer.

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
from tarantella import optimizers
from tarantella import subclass
from tarantella.zero import shards as zero_shards

# Per traced graph, the last Adam update (_adam_in_order): the next waits for it.
_last_update = weakref.WeakKeyDictionary()


class InPlaceUpdate(optimizers.DistributedOptimizer):
    """Placed in front of an optimizer's class by update_in_place()."""

    def update_step(self, gradient, variable, learning_rate):
        if not (_fused_update(self, gradient, variable, learning_rate)
                or _adam_in_order(self, gradient, variable, learning_rate)):
            super().update_step(gradient, variable, learning_rate)


def update_in_place(optimizer):
    """Makes `optimizer` distributed (optimizers.distribute), and makes it
    update its variables without temporaries (see above): SGD, with or
    without momentum, through a fused kernel, Adam one part after the
    other. Doing it twice changes nothing. A sharded optimizer (zero/shards.py)
    reduces its gradients itself and updates parts, 1/N of the stage: it
    updates as Keras does."""
    if isinstance(optimizer, zero_shards.ShardedOptimizer):
        return
    optimizers.distribute(optimizer)
    if not isinstance(optimizer, InPlaceUpdate):
        optimizer.__class__ = subclass.mixin_class(InPlaceUpdate, subclass.base_class(optimizer))


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
