"""Process-wide state: the communication context, ranks and settings."""
import os
import random

import tensorflow as tf

from tarantella import _core
from tarantella import _requirements
from tarantella import _keras_internals
from tarantella.errors import TarantellaError
from tarantella import log
from tarantella import settings

MASTER_RANK = 0

# Seed given to TensorFlow when the user has not seeded it, so that
# `shuffle()` without a seed permutes identically on every rank.
DEFAULT_SEED = 42


def init(seed=None):
    """Sets up communication among all ranks, on every rank. Optional: the
    first call that needs the runtime (tnt.get_size(), tnt.Model, ...)
    initializes it; call it first to choose the seed.

    Started with plain ``python``, the program is a 1-rank run. ``seed``
    seeds TensorFlow, Python and NumPy identically on every rank (default
    42), so that unseeded shuffles and initializers agree across ranks.
    """
    if _core.is_initialized():
        return
    if seed is not None and not is_whole_number(seed):
        raise TarantellaError(f"tnt.init(seed={seed!r}): the seed must be an integer, "
                              "or None for the default")
    _require_tensorflow_backend()
    settings.load()  # a bad setting fails here, naming what it takes
    _core.init()
    log.configure(_core.rank(), _core.size())
    _share_tensorflow_threads()  # before anything starts TensorFlow's runtime
    _keras_internals.verify()
    import numpy as np
    import tensorflow as tf
    s = DEFAULT_SEED if seed is None else int(seed)
    tf.random.set_seed(s)
    random.seed(s)
    np.random.seed(s)
    log.logger.debug("initialized: rank %d of %d, local rank %d of %d",
                     _core.rank(), _core.size(), _core.local_rank(), _core.local_size())


def core_share():
    """The cores this rank may use: its share of the host's cores, or the
    cores of its affinity where the launcher narrowed it; None where the
    rank has the host to itself."""
    cores = len(os.sched_getaffinity(0))
    if cores < (os.cpu_count() or cores):
        return cores
    local = _core.local_size() if _core.is_initialized() else 1
    return max(1, cores // local) if local > 1 else None


def _share_tensorflow_threads():
    """Ranks that share a host each run an op's work on their share of its
    cores (TensorFlow's intra-op threads), rather than each on all of them,
    unless the program chose the number itself (TF_NUM_INTRAOP_THREADS, or
    tf.config.threading before tnt.init). The inter-op pool keeps its size:
    its threads mostly wait, and an op that blocks must not hold up others."""
    share = core_share()
    if (share is None or _requirements.tensorflow_threads_chosen()
            or tf.config.threading.get_intra_op_parallelism_threads()):
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(share)
    except RuntimeError:  # TensorFlow has already made its thread pools
        log.logger.debug("TensorFlow runs already: its intra-op threads stay as they are")
        return
    log.logger.debug("TensorFlow's intra-op threads: %d (this rank's share of the cores)", share)


def _require_tensorflow_backend():
    import keras
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise TarantellaError(
            f"Keras runs on the {backend!r} backend (KERAS_BACKEND); Tarantella trains with "
            "TensorFlow: set KERAS_BACKEND=tensorflow (or remove the setting) before keras is "
            "imported")


def is_whole_number(value):
    """True for ints (and NumPy integers), not for bools, floats or strings."""
    import numbers
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def require_init():
    """Initializes Tarantella (with the default seed) when the program has
    not called tnt.init(): every call that needs the runtime starts here."""
    if not _core.is_initialized():
        init()


def disagreements(values):
    """Compares `values` (a dict of name -> int) across ranks with one small
    allgather (collective: every rank calls it with the same names).
    Returns {name: (master's value, {rank: its value})} for every name on
    which some rank differs from the master; {} when all agree."""
    size = get_size()
    if size == 1:
        return {}
    import numpy as np
    names = list(values)
    mine = np.array([int(values[n]) for n in names], dtype=np.int64)
    everyone = np.zeros(size * len(names), dtype=np.int64)
    _core.allgather(mine, everyone)
    table = everyone.reshape(size, len(names))
    out = {}
    for j, name in enumerate(names):
        master = int(table[MASTER_RANK, j])
        differ = {r: int(table[r, j]) for r in range(size) if table[r, j] != master}
        if differ:
            out[name] = (master, differ)
    return out


def broadcast_arrays(arrays, root=MASTER_RANK):
    """Copies of NumPy `arrays` holding rank `root`'s values, on every rank
    (one broadcast of their bytes). Collective: every rank passes arrays of
    the same dtypes and shapes."""
    import numpy as np
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if not arrays or get_size() == 1:
        return arrays
    blob = np.concatenate([a.view(np.uint8).ravel() for a in arrays])
    padded = np.zeros((blob.size + 7) // 8 * 8, dtype=np.uint8)
    padded[:blob.size] = blob
    _core.broadcast(padded.view(np.int64), root=root)
    out, offset = [], 0
    for a in arrays:
        out.append(padded[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape))
        offset += a.nbytes
    return out


_CHUNK_BYTES = 16 << 20


def broadcast_values(targets, sources=None, root=MASTER_RANK, group=None):
    """Assigns to every variable of `targets` the value that rank `root`
    holds in the matching variable of `sources` (by default `targets`
    themselves), with `group` (a _core.create_group handle) among its ranks.
    Values travel about 16 MiB at a time, so that the memory this needs
    beyond the variables is one such chunk, whatever the model's size.
    Collective: every rank passes variables of the same shapes and dtypes."""
    import numpy as np
    targets = list(targets)
    sources = targets if sources is None else list(sources)
    if get_size() == 1 or not targets:
        return
    chunks, chunk, size = [], [], 0
    for target, source in zip(targets, sources):
        dtype = np.dtype(tf.as_dtype(target.dtype).as_numpy_dtype)
        shape = tuple(target.shape)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if chunk and size + nbytes > _CHUNK_BYTES:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append((target, source, dtype, shape, nbytes))
        size += nbytes
    chunks.append(chunk)
    for chunk in chunks:
        # Each value is copied once, straight into the chunk's buffer, and
        # that copy is freed before the next value is read.
        buf = np.zeros((sum(c[4] for c in chunk) + 7) // 8, dtype=np.int64)
        raw = buf.view(np.uint8)
        offset = 0
        for _, source, _, _, nbytes in chunk:
            raw[offset:offset + nbytes] = np.asarray(source.numpy()).reshape(-1).view(np.uint8)
            offset += nbytes
        _core.broadcast(buf, root=root, group=group)
        offset = 0
        for target, _, dtype, shape, nbytes in chunk:
            target.assign(raw[offset:offset + nbytes].view(dtype).reshape(shape))
            offset += nbytes
        del buf, raw


_MESSAGE_BYTES = 1024


def master_message(text=None):
    """The master's `text` (a str, or None), on every rank; other ranks'
    `text` is ignored. Collective: every rank calls it."""
    return _message_of(MASTER_RANK, text)


def first_message(text=None):
    """The `text` (a str, or None) of the lowest rank that has one, on every
    rank; None when no rank has. Collective: every rank calls it."""
    import numpy as np
    if get_size() == 1:
        return text
    has = np.zeros(get_size())
    has[get_rank()] = text is not None
    _core.allreduce(has, op="sum")
    senders = np.flatnonzero(has)
    return None if senders.size == 0 else _message_of(int(senders[0]), text)


def _message_of(root, text):
    """Rank `root`'s `text` (a str, or None), on every rank. Collective."""
    import numpy as np
    buf = np.zeros(_MESSAGE_BYTES // 8, dtype=np.int64)
    raw = buf.view(np.uint8)
    if get_rank() == root and text is not None:
        data = text.encode()[:_MESSAGE_BYTES - 9]
        raw[0] = 1
        raw[8:8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    if get_size() > 1:
        _core.broadcast(buf, root=root)
    if raw[0] == 0:
        return None
    return raw[8:].tobytes().rstrip(b"\0").decode(errors="replace")


def check_agreement(what, values):
    """Raises a TarantellaError on every rank unless all ranks hold the same
    `values`; the message names, per value, the ranks that differ from the
    master and what they hold. `what` names the call ("fit")."""
    problems = [f"{name} is {master} on the master rank but "
                + ", ".join(f"{v} on rank {r}" for r, v in differ.items())
                for name, (master, differ) in disagreements(values).items()]
    if problems:
        raise TarantellaError(
            f"the ranks disagree on {what}: " + "; ".join(problems) +
            ". Every rank must make the same calls with datasets of the same length")


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
    """The fusion threshold in KiB (TNT_FUSION_THRESHOLD_KB), or "auto" when
    the fusion sets tune it themselves."""
    return settings.get("TNT_FUSION_THRESHOLD_KB")


def in_flight_bytes():
    """Bytes of gradient buckets a rank keeps waiting for their
    reduce-scatter before backprop waits (TNT_FUSION_IN_FLIGHT_MIB)."""
    return int(settings.get("TNT_FUSION_IN_FLIGHT_MIB") * 2**20)


# TNT_COMPRESSION's words: the dtype gradients travel in (None: float32).
_COMPRESSIONS = {"none": None, "fp16": "float16", "bf16": "bfloat16"}


def compression():
    """The dtype that float32 gradients travel in (TNT_COMPRESSION):
    'float16', 'bfloat16', or None (uncompressed). Each step of the
    reduction adds in float32."""
    return _COMPRESSIONS[settings.get("TNT_COMPRESSION")]


def fusion_order():
    """The order in which gradients fill their fusion buckets
    (TNT_FUSION_ORDER): 'list' (backprop order) or 'readiness' (the order in
    which the master's gradients became ready in the first step)."""
    return settings.get("TNT_FUSION_ORDER")


def overlap():
    """When gradients are reduced (TNT_OVERLAP): "on" as soon as backprop
    has given each fusion bucket's gradients, "off" once every gradient of
    the step is computed (no CPU taken from backprop), "auto" the faster of
    the two, timed in the first steps, the same on every rank."""
    return settings.get("TNT_OVERLAP")


def output_on_all_devices():
    return settings.get("TNT_OUTPUT_ON_ALL_DEVICES")
