"""The step being traced: where distributed optimizers, distributed
gradient tapes, synchronized BatchNormalization layers and global metrics
find the sample count and the collectives of the step.

A tnt.Model's ``train_step`` and ``test_step`` run inside ``model_step``.
A custom training loop has no model step; its collectives belong to the
loop's step of the graph being traced (``loop_step``), or run one by one in
eager mode.

Every collective of a step is chained after the step's previous one (a
control dependency), so every rank issues them in one order, whatever
order TensorFlow would otherwise pick for independent ops.
"""
import contextlib
import threading
import weakref

import keras
import tensorflow as tf

from tarantella import _core
from tarantella import gradients
from tarantella import ops
from tarantella import runtime

_local = threading.local()


class Resources:
    """What the steps of one model (or of the custom loops) keep across
    traces: fusion sets by gradient signature, and the variable that
    carries the step's sample count (a variable, so that TensorFlow cannot
    treat the count as a constant; see gradients.py). Gradients are averaged
    over `group` (a _core.create_group handle of `group_size` ranks; None:
    all ranks)."""

    def __init__(self, group=None, group_size=None):
        self.group = group
        self.group_size = group_size
        self.reducer = gradients.GradientReducer(group, group_size)
        self.count_var = tf.Variable(0.0, trainable=False, dtype=tf.float32,
                                     name="tnt_local_samples")


class Step:
    """One traced step: its local sample count and its chain of collectives."""

    def __init__(self, resources, count=None):
        self.resources = resources
        self.local_count = None
        self.metrics_global = False  # get_metrics_result made the logs global
        self._last = None  # the step's latest collective
        self._reduced = set()  # ids of gradients this step has averaged
        # (ZeRO stage 3) what the gradients' reduce-scatter follows (the
        # forward pass's last collective) and the order of its starts, of
        # the backward pass's gathers and of its own collectives:
        # GradientReducer.reduce's `after` and `waves`.
        self.gradient_waves = None
        self.set_count(count)

    def set_count(self, count):
        """Weights this rank's gradients and values by `count` samples (a
        scalar; None: 1, every rank alike)."""
        if runtime.get_size() == 1:
            return
        count = 1.0 if count is None else count
        self.resources.count_var.assign(tf.cast(count, tf.float32))
        self.local_count = self.resources.count_var.read_value()

    # ------------------------------------------------------------ the chain

    def after(self):
        """What the next collective of the step must wait for."""
        last = self._last
        if last is None or tf.executing_eagerly():
            return []
        if getattr(last, "graph", None) is not tf.compat.v1.get_default_graph():
            return []
        return [last]

    def latest(self):
        """The step's latest collective (an op), or None."""
        return self._last

    def record(self, tensors):
        """Makes `tensors` (the outputs of a collective) the step's latest."""
        tensors = [t for t in tf.nest.flatten(tensors) if t is not None]
        if tensors and not tf.executing_eagerly():
            self._last = tf.group(tensors)

    # ------------------------------------------------------------ collectives

    def reduce_gradients(self, grads, likes):
        """`grads` (a list, None allowed) of `likes` (their variables or
        source tensors) averaged over the global batch (see gradients.py);
        gradients this step averaged already pass."""
        grads = list(grads)
        if self.averaged(grads):
            return grads
        grads = gradients.shaped(grads, likes)
        out = self.resources.reducer.reduce(grads, self.local_count, self.after())
        self.record(out)
        self._reduced.update(id(g) for g in out if g is not None)
        return out

    def averaged(self, grads):
        """Whether this step has averaged every gradient of `grads` (a
        list, None allowed) already, as a DistributedGradientTape does."""
        return bool(grads) and all(g is None or id(g) in self._reduced for g in grads)

    def allreduce(self, tensor, op="sum", group=None):
        """`tensor` reduced with `op` over `group` (a _core.create_group
        handle; None: all ranks), in the step's chain."""
        with tf.control_dependencies(self.after()):
            out = ops.allreduce(tensor, _core.world_handle() if group is None else group, op)
        self.record(out)
        return out

    def weighted_mean(self, tensor):
        """The mean of `tensor` over the ranks, each weighted by its share
        of the global batch."""
        n = self.local_count
        both = tf.concat([tf.reshape(tf.cast(tensor, tf.float32) * n, [-1]),
                          tf.reshape(n, [1])], axis=0)
        summed = self.allreduce(both)
        return tf.cast(tf.reshape(summed[:-1] / summed[-1], tf.shape(tensor)), tensor.dtype)

    def differentiable_sum(self, tensor):
        """The sum of `tensor` over all ranks. Its gradient is the sum of the
        ranks' gradients, each weighted by its share of the global batch, so
        that the later weighting by sample count gives the global-batch
        gradient."""
        count = self.local_count

        @tf.custom_gradient
        def summed(t):
            def grad(upstream):
                scale = tf.cast(count, upstream.dtype)
                return self.allreduce(upstream * scale) / scale
            return self.allreduce(t), grad
        return summed(tensor)


def current():
    """The step being traced (or run) on this thread, or None."""
    return getattr(_local, "step", None)


@contextlib.contextmanager
def model_step(resources, batch):
    """Makes a Step of a tnt.Model current while its step function runs on
    `batch`; the sample count is the batch's."""
    count = None
    if runtime.get_size() > 1:
        x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        first = next(t for t in tf.nest.flatten(x) if t is not None)
        count = tf.shape(first)[0]
    previous = current()
    _local.step = Step(resources, count)
    try:
        yield _local.step
    finally:
        _local.step = previous


_loop_resources = None
_loop_steps = weakref.WeakKeyDictionary()  # graph -> its loop step


def loop_step():
    """The step of a custom training loop: one per traced graph (so that the
    collectives of a tf.function are chained), a new one for each eager call."""
    global _loop_resources
    runtime.require_init()
    if _loop_resources is None:
        _loop_resources = Resources()
    if tf.executing_eagerly():
        return Step(_loop_resources)
    graph = tf.compat.v1.get_default_graph()
    found = _loop_steps.get(graph)
    if found is None:
        found = _loop_steps[graph] = Step(_loop_resources)
    return found


def active():
    """The model step being traced, or else the custom loop's step."""
    return current() or loop_step()
