"""Collectives on Python values: ``tnt.TensorAllreducer``,
``tnt.TensorBroadcaster`` and ``tnt.TensorAllgatherer``.

Each is made once for a structure of values (a number, a NumPy array, a
TensorFlow tensor, or lists and dicts of them, nested) and then called, on
every rank, with values of that structure; it returns values of the same
kinds. The values travel through libtnt's collectives, one call per
array, outside any tf.function (use tnt.allreduce in a training step).
"""
import numbers

import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import runtime

_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
           "uint8")
_OPS = ("sum", "average", "min", "max")


def _leaves(value, what):
    """The leaves of `value` in order, as (kind, array) pairs; TypeError for
    what cannot travel. Empty lists, dicts and arrays are values like any
    other: an empty container has no leaves, an empty array is a leaf of
    no elements."""
    if isinstance(value, dict):
        return [leaf for k in value for leaf in _leaves(value[k], what)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v, what)]
    if isinstance(value, bool) or not (isinstance(value, (numbers.Number, np.ndarray, np.generic))
                                       or tf.is_tensor(value)):
        raise TypeError(f"{what}: {type(value).__name__} values cannot be communicated; give "
                        "numbers, NumPy arrays, TensorFlow tensors, or lists and dicts of them")
    array = np.array(value.numpy() if tf.is_tensor(value) else value, copy=True)
    if array.dtype.name not in _DTYPES:
        raise TypeError(f"{what}: arrays of {array.dtype.name} cannot be communicated; use one "
                        f"of {', '.join(_DTYPES)}")
    kind = "tensor" if tf.is_tensor(value) else (
        "array" if isinstance(value, np.ndarray) else type(value))
    return [(kind, np.ascontiguousarray(array))]


def _rebuild(template, results):
    """`template`'s structure with its leaves replaced by `results`
    (an iterator of (kind, array)), each of its leaf's kind."""
    if isinstance(template, dict):
        return {k: _rebuild(template[k], results) for k in template}
    if isinstance(template, (list, tuple)):
        return type(template)(_rebuild(v, results) for v in template)
    kind, array = next(results)
    if kind == "tensor":
        return tf.convert_to_tensor(array)
    if kind == "array":
        return array
    return kind(array.item()) if array.size == 1 else array


def _signature(leaves):
    return [(a.shape, a.dtype) for _, a in leaves]


class _Collective:
    """Made for the structure of `inputs`; later calls must keep it."""

    def __init__(self, inputs):
        runtime.require_init()
        self._name = type(self).__name__
        self._template = inputs
        self._signature = _signature(_leaves(inputs, self._name))

    def _checked(self, inputs):
        leaves = _leaves(inputs, self._name)
        if _signature(leaves) != self._signature:
            raise ValueError(
                f"{self._name}: the values given have shapes and dtypes "
                f"{_signature(leaves)}, but it was made for {self._signature}; make one for "
                "each structure of values")
        return leaves


class TensorAllreducer(_Collective):
    """``TensorAllreducer(inputs, reduction_op="sum")``; ``allreduce(inputs)``
    returns `inputs` reduced element-wise over all ranks with "sum",
    "average", "min" or "max". Collective."""

    def __init__(self, inputs, reduction_op="sum"):
        if reduction_op not in _OPS:
            raise ValueError(f"TensorAllreducer: reduction_op={reduction_op!r} must be one "
                             f"of {_OPS}")
        super().__init__(inputs)
        self.reduction_op = reduction_op

    def allreduce(self, inputs):
        leaves = self._checked(inputs)
        for _, array in leaves:
            _core.allreduce(array, op=self.reduction_op, dtype=array.dtype.name)
        return _rebuild(inputs, iter(leaves))


class TensorBroadcaster(_Collective):
    """``TensorBroadcaster(inputs, root_rank=0)``, made on every rank with
    values of the structure to broadcast; ``broadcast(inputs)`` on the root
    rank and ``broadcast()`` on the others return the root's values on every
    rank. Collective."""

    def __init__(self, inputs, root_rank=0):
        super().__init__(inputs)
        if not runtime.is_whole_number(root_rank) or not 0 <= root_rank < runtime.get_size():
            raise ValueError(f"TensorBroadcaster: root_rank={root_rank!r} must be a rank, "
                             f"from 0 to {runtime.get_size() - 1}")
        self.root_rank = int(root_rank)

    def broadcast(self, inputs=None):
        if inputs is None:
            if runtime.get_rank() == self.root_rank:
                raise ValueError("TensorBroadcaster.broadcast(): the root rank must give the "
                                 "values to broadcast")
            inputs = self._template
        leaves = self._checked(inputs)
        for _, array in leaves:
            _core.broadcast(array, root=self.root_rank, dtype=array.dtype.name)
        return _rebuild(self._template, iter(leaves))


class TensorAllgatherer(_Collective):
    """``TensorAllgatherer(inputs)``; ``allgather(inputs)`` returns, for
    each array (or number) of `inputs`, a flat NumPy array of every rank's
    elements in rank order. Ranks may give arrays of different lengths.
    Collective."""

    def allgather(self, inputs):
        leaves = _leaves(inputs, self._name)
        if [a.dtype for _, a in leaves] != [d for _, d in self._signature]:
            raise ValueError(f"{self._name}: the values given have other dtypes than those it "
                             "was made for; make one for each structure of values")
        size = runtime.get_size()
        counts = np.zeros(size * len(leaves), dtype=np.int64)
        _core.allgather(np.array([a.size for _, a in leaves], dtype=np.int64), counts)
        counts = counts.reshape(size, len(leaves))
        gathered = []
        for i, (_, array) in enumerate(leaves):
            out = np.empty(int(counts[:, i].sum()), dtype=array.dtype)
            _core.allgatherv(array.reshape(-1), out, [int(c) for c in counts[:, i]],
                             dtype=array.dtype.name)
            gathered.append(("array", out))
        return _rebuild(inputs, iter(gathered))
