"""Distributed optimizers: gradients are averaged across ranks before they
are clipped or applied.

``distribute(optimizer)`` subclasses the optimizer in place (as Horovod's
``DistributedOptimizer`` does): its ``apply`` first averages the gradients
over the global batch, then runs the optimizer's own ``apply``. For mixed
precision Keras wraps the optimizer in a LossScaleOptimizer, whose update
sits inside a conditional on the gradients being finite; the wrapper is the
one distributed, so every rank takes the same branch.
"""
from tarantella import runtime
from tarantella import step
from tarantella import subclass


class DistributedOptimizer:
    """Placed in front of an optimizer's class by distribute()."""

    def apply(self, grads, trainable_variables=None):
        current = step.current()
        if current is None:
            raise runtime.TarantellaError(
                f"the optimizer {self.name!r} of a tnt.Model was applied outside the model's "
                "training step: Tarantella averages gradients inside model.fit() (the model's "
                "train_step, also an overridden one); train with fit()")
        grads = current.reduce_gradients(list(grads))
        return super().apply(grads, trainable_variables)


def distribute(optimizer):
    """Makes `optimizer` (a keras.optimizers.Optimizer) average gradients
    across ranks; returns it. Doing it twice changes nothing."""
    if optimizer is None:
        return None
    return subclass.add_mixin(optimizer, DistributedOptimizer)
