"""The training step being traced: what distributed optimizers and
synchronized BatchNormalization layers need from it.

A tnt.Model's ``train_step`` runs inside ``training_step(...)``. While it
is traced, every distributed optimizer that applies gradients finds the step
here (its sample count and its gradient reducer), and so do the
synchronized BatchNormalization layers, whose collectives are chained in one
order that is the same on every rank (see ``Step.allreduce``).
"""
import contextlib
import threading

import keras
import tensorflow as tf

from tarantella import _core
from tarantella import ops
from tarantella import runtime

_local = threading.local()


def current():
    """The step being traced on this thread, or None."""
    return getattr(_local, "step", None)


class Step:
    """One traced training step of a tnt.Model."""

    def __init__(self, state, batch):
        self.reducer = state.reducer
        self.reducer.last_outputs = []
        self.local_count = None
        # The latest blocking collective of the step (synchronized
        # BatchNormalization); later collectives and the gradient buckets
        # wait for it, so that every rank issues them in one order.
        self.last_collective = None
        if runtime.get_size() > 1:
            x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
            first = next(t for t in tf.nest.flatten(x) if t is not None)
            # Through a variable, so that TensorFlow cannot treat the count
            # as a constant (see gradients.py).
            state.count_var.assign(tf.cast(tf.shape(first)[0], tf.float32))
            self.local_count = state.count_var.read_value()

    def reduce_gradients(self, grads):
        """`grads` averaged over the global batch (see gradients.py)."""
        after = [] if self.last_collective is None else [self.last_collective]
        return self.reducer.reduce(grads, self.local_count, after)

    def allreduce(self, tensor):
        """The sum of `tensor` over all ranks, after the step's previous
        collective. Its gradient is the sum of the ranks' gradients, each
        weighted by its share of the global batch, so that the reducer's
        later weighting by sample count gives the global-batch gradient."""
        count = self.local_count

        @tf.custom_gradient
        def summed(t):
            out = self._chained_sum(t)

            def grad(upstream):
                scaled = upstream * tf.cast(count, upstream.dtype)
                return self._chained_sum(scaled) / tf.cast(count, upstream.dtype)
            return out, grad
        return summed(tensor)

    def _chained_sum(self, tensor):
        deps = [] if self.last_collective is None else [self.last_collective]
        with tf.control_dependencies(deps):
            out = ops.allreduce(tensor, _core.world_handle(), "sum")
        self.last_collective = out
        return out


@contextlib.contextmanager
def training_step(state, batch):
    """Makes a Step of `state` (a tnt.Model's) current while the step is traced."""
    previous = current()
    _local.step = Step(state, batch)
    try:
        yield _local.step
    finally:
        _local.step = previous
