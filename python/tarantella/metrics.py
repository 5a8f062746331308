"""Global metrics: results computed from the sum of every rank's metric state.

Keras metrics keep additive state (totals and counts, confusion counts);
summing each state variable across ranks and computing the result from the
sums gives the metric of the whole global batch, exactly, also when ranks
hold different numbers of samples. The sums are substituted for the local
state only while the results are computed (a Keras StatelessScope), so the
local state keeps accumulating undisturbed.
"""
import keras
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import ops
from tarantella import runtime
from tarantella.callbacks import LOCAL_PREFIX


def metric_variables(model):
    seen, out = set(), []
    for m in model.metrics:
        for v in m.variables:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def global_results(model, local_results, control_inputs=(), with_local=False):
    """Calls `local_results()` with every metric variable replaced by its
    sum over all ranks. `control_inputs` must run before the reduction (the
    gradient reduction of the same step), so that all ranks issue their
    collectives in one order. With `with_local`, this rank's own results are
    added under keys prefixed LOCAL_PREFIX."""
    local = {}
    if with_local:
        local = {LOCAL_PREFIX + k: v for k, v in local_results().items()}
    if runtime.get_size() == 1:
        return {**local_results(), **local}
    variables = metric_variables(model)
    if not variables:
        return {**local_results(), **local}
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(v.dtype, []).append(v)
    mapping = []
    previous = list(control_inputs)
    for dtype in sorted(by_dtype):
        vs = by_dtype[dtype]
        # One allreduce per dtype, chained so that every rank issues them in
        # the same order.
        with tf.control_dependencies(previous):
            flat = tf.concat([tf.reshape(v.value, [-1]) for v in vs], axis=0)
            summed = ops.allreduce(flat, _core.world_handle(), "sum")
        previous = [summed]
        parts = tf.split(summed, [int(np.prod(v.shape)) for v in vs])
        mapping += [(v, tf.reshape(p, v.shape)) for v, p in zip(vs, parts)]
    with keras.StatelessScope(state_mapping=mapping):
        return {**local_results(), **local}
