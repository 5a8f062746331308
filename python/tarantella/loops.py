"""Custom training loops on many ranks.

For a loop of your own (``for x, y in dataset: ... tape.gradient ...``):

    dataset = tnt.data.distribute(dataset)          # this rank's micro-batches
    tnt.broadcast_variables(model.variables)        # every rank starts alike
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = tnt.DistributedGradientTape(tape, num_samples=tf.shape(x)[0])
    grads = tape.gradient(loss, model.trainable_variables)   # averaged
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    tnt.allreduce(loss)                             # the global loss, for logs

or ``tnt.distribute_optimizer(optimizer)`` instead of the tape. Inside a
tf.function every collective of the loop is chained in one order on every
rank, and gradients go through the same fusion buckets as in fit, so
communication overlaps backprop; eager execution works too.
"""
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import runtime
from tarantella import step
from tarantella.pipeline import stage as pipeline_stage


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns the gradients averaged
    over all ranks. With `num_samples` (this rank's sample count, a scalar
    or tensor), each rank weighs by its share of the global batch, which
    equals serial training also for micro-batches of unequal size; without,
    every rank weighs alike. Use it or a distributed optimizer, not both
    (gradients averaged once are not averaged again)."""

    def __init__(self, tape, num_samples=None):
        if not isinstance(tape, tf.GradientTape):
            raise TypeError(f"tnt.DistributedGradientTape wraps a tf.GradientTape; got "
                            f"{type(tape).__name__}")
        runtime.require_init()
        self.tape = tape
        self.num_samples = num_samples

    def __enter__(self):
        self.tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self.tape.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self.tape, name)

    # Tarantella's own Python code is plain graph building: AutoGraph, which
    # converts what a tf.function calls, must leave it alone.
    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, **kwargs):
        pipeline_stage.require_not_pipelined(tf.nest.flatten(sources),
                                             "tnt.DistributedGradientTape.gradient")
        grads = self.tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        current = step.active()
        if self.num_samples is not None:
            current.set_count(self.num_samples)
        flat = tf.nest.flatten(grads, expand_composites=False)
        likes = tf.nest.flatten(sources, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, current.reduce_gradients(flat, likes))


def broadcast_variables(variables, root=runtime.MASTER_RANK):
    """Gives every variable of `variables` rank `root`'s value (eagerly, on
    every rank: collective)."""
    if not tf.executing_eagerly():
        raise runtime.TarantellaError(
            "tnt.broadcast_variables runs eagerly: call it before the training loop, outside "
            "tf.function")
    runtime.broadcast_values(list(variables), root=root)


_OPS = ("average", "sum", "min", "max")


@tf.autograph.experimental.do_not_convert
def allreduce(value, op="average"):
    """`value` (a tensor or NumPy array) reduced over all ranks: "average"
    (default), "sum", "min" or "max". In a tf.function, chained with the
    loop's other collectives. Collective."""
    if op not in _OPS:
        raise runtime.TarantellaError(f"tnt.allreduce(op={op!r}): op must be one of {_OPS}")
    runtime.require_init()
    if tf.is_tensor(value) or not tf.executing_eagerly():
        tensor = tf.convert_to_tensor(value)
        if runtime.get_size() == 1:
            return tensor
        return step.active().allreduce(tensor, op)
    array = np.array(value, copy=True)
    if runtime.get_size() > 1:
        _core.allreduce(array, op=op)
    return array
