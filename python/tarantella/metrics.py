"""Global metrics: results computed from the sum of every rank's metric state.

Keras metrics keep additive state (totals and counts, confusion counts);
summing each state variable across ranks and computing the result from the
sums gives the metric of the whole global batch, exactly, also when ranks
hold different numbers of samples. The sums are substituted for the local
state only while the results are computed (a Keras StatelessScope), so the
local state keeps accumulating undisturbed.

A custom ``train_step`` may return logs of its own: values of the model's
metrics (trackers such as ``keras.metrics.Mean``) become their global
results as above, and any other scalar becomes its mean over the ranks,
each weighted by its share of the global batch (``global_logs``).
"""
import keras
import numpy as np
import tensorflow as tf

from tarantella import runtime
from tarantella.callbacks import LOCAL_PREFIX


def _variables(metrics):
    seen, out = set(), []
    for m in metrics:
        for v in m.variables:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def _with_global_state(metrics, compute, step):
    """compute() with every variable of `metrics` replaced by its sum over
    all ranks (one allreduce per dtype, in the step's chain)."""
    variables = _variables(metrics)
    if runtime.get_size() == 1 or not variables:
        return compute()
    by_dtype = {}
    for v in variables:
        by_dtype.setdefault(v.dtype, []).append(v)
    mapping = []
    for dtype in sorted(by_dtype):
        vs = by_dtype[dtype]
        flat = tf.concat([tf.reshape(v.value, [-1]) for v in vs], axis=0)
        summed = step.allreduce(flat, "sum")
        parts = tf.split(summed, [int(np.prod(v.shape)) for v in vs])
        mapping += [(v, tf.reshape(p, v.shape)) for v, p in zip(vs, parts)]
    with keras.StatelessScope(state_mapping=mapping):
        return compute()


def global_results(metrics, local_results, step, with_local=False):
    """local_results() computed from the global state of `metrics`. With
    `with_local`, this rank's own results are added under keys prefixed
    LOCAL_PREFIX."""
    local = {}
    if with_local:
        local = {LOCAL_PREFIX + k: v for k, v in local_results().items()}
    return {**_with_global_state(metrics, local_results, step), **local}


def global_logs(model, logs, step):
    """The logs a custom step returned, made global (see above)."""
    if runtime.get_size() == 1 or not isinstance(logs, dict):
        return logs
    by_name = {m.name: m for m in model.metrics}
    tracked = [k for k in logs if k in by_name]
    out = dict(logs)
    if tracked:
        def results():
            return {k: by_name[k].result() for k in tracked}
        out.update(_with_global_state([by_name[k] for k in tracked], results, step))
    for k, v in logs.items():
        if k not in by_name and tf.is_tensor(v) and v.dtype.is_floating and v.shape.rank == 0:
            out[k] = step.weighted_mean(v)
    return out
