"""Datasets from NumPy arrays, as Keras builds them for fit(x, y)."""
import numpy as np
import tensorflow as tf

from tarantella import runtime


def from_arrays(x, y=None, sample_weight=None, batch_size=None, shuffle=False):
    """A dataset of global batches from NumPy arrays (or lists/dicts of them),
    as Keras builds for `fit(x, y, batch_size=...)`."""
    if batch_size is None:
        batch_size = 32
    if not runtime.is_whole_number(batch_size) or batch_size <= 0:
        raise runtime.TarantellaError(
            f"batch_size={batch_size!r} must be a positive whole number of samples (the global "
            "batch size)")
    parts = tuple(p for p in (x, y, sample_weight) if p is not None)
    data = parts[0] if len(parts) == 1 else parts
    ds = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        n = len(tf.nest.flatten(x)[0])
        ds = ds.shuffle(n, seed=runtime.DEFAULT_SEED, reshuffle_each_iteration=True)
    return ds.batch(int(batch_size))


def is_array_like(x):
    return isinstance(x, (np.ndarray, list, tuple, dict)) or tf.is_tensor(x)


def split_arrays(arrays, validation_split):
    """Keras's validation_split for arrays: the last fraction validates."""
    if not 0 < validation_split < 1:
        raise runtime.TarantellaError(
            f"validation_split={validation_split!r} must be a fraction between 0 and 1 (the "
            "share of the samples that validates, e.g. 0.2)")
    flat = tf.nest.flatten(arrays)
    n = len(flat[0])
    cut = int(n * (1.0 - validation_split))
    train = tf.nest.map_structure(lambda a: a[:cut], arrays)
    val = tf.nest.map_structure(lambda a: a[cut:], arrays)
    return train, val
