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

A pipeline stage's optimizer updates its variables in place
(pipeline/in_place.py).
"""
import keras

from tarantella import step
from tarantella import subclass
from tarantella.zero import shards as zero_shards


class DistributedOptimizer:
    """Placed in front of an optimizer's class by distribute()."""

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        likes = grads if trainable_variables is None else list(trainable_variables)
        grads = step.active().reduce_gradients(grads, likes)
        return super().apply(grads, trainable_variables)


def distribute(optimizer):
    """Makes `optimizer` (a keras.optimizers.Optimizer) average gradients
    across ranks; returns it. Doing it twice changes nothing."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"tnt.distribute_optimizer takes a keras.optimizers.Optimizer; got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, zero_shards.ShardedOptimizer):
        return optimizer  # it reduces its gradients itself
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
