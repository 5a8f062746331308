"""Process-wide state: the communication context, ranks and settings."""
import os
import random

from tarantella import _core
from tarantella import log

MASTER_RANK = 0

# Default threshold of tensor fusion in KiB, from the fusion threshold sweep
# (docs/performance.md); TNT_FUSION_THRESHOLD_KB overrides it.
DEFAULT_FUSION_THRESHOLD_KB = 32

# Seed given to TensorFlow when the user has not seeded it, so that
# `shuffle()` without a seed permutes identically on every rank.
DEFAULT_SEED = 42


class TarantellaError(RuntimeError):
    """A misuse of Tarantella: the message says what to change."""


def init(seed=None):
    """Sets up communication among all ranks; call it first, on every rank.

    Started with plain ``python``, the program is a 1-rank run. ``seed``
    seeds TensorFlow, Python and NumPy identically on every rank (default
    42), so that unseeded shuffles and initializers agree across ranks.
    """
    if _core.is_initialized():
        return
    _core.init()
    log.configure(_core.rank(), _core.size())
    import numpy as np
    import tensorflow as tf
    s = DEFAULT_SEED if seed is None else int(seed)
    tf.random.set_seed(s)
    random.seed(s)
    np.random.seed(s)
    threshold_kb()  # validate the environment early
    log.logger.debug("initialized: rank %d of %d, local rank %d of %d",
                     _core.rank(), _core.size(), _core.local_rank(), _core.local_size())


def require_init():
    if not _core.is_initialized():
        raise TarantellaError(
            "Tarantella is not initialized: call tnt.init() at the start of the "
            "program, before creating models or datasets")


def get_rank():
    require_init()
    return _core.rank()


def get_size():
    require_init()
    return _core.size()


def get_local_rank():
    require_init()
    return _core.local_rank()


def get_local_size():
    require_init()
    return _core.local_size()


def get_master_rank():
    return MASTER_RANK


def is_master_rank():
    return get_rank() == MASTER_RANK


def threshold_kb():
    """The fusion threshold in KiB from TNT_FUSION_THRESHOLD_KB, or the default."""
    raw = os.environ.get("TNT_FUSION_THRESHOLD_KB")
    if raw is None or raw.strip() == "":
        return DEFAULT_FUSION_THRESHOLD_KB
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise TarantellaError(
            f"TNT_FUSION_THRESHOLD_KB={raw!r} is not a non-negative number of KiB "
            f"(e.g. {DEFAULT_FUSION_THRESHOLD_KB}); fix or unset it")
    return value


def output_on_all_devices():
    return log._truthy(os.environ.get("TNT_OUTPUT_ON_ALL_DEVICES", "false"))
