"""Predictions made on micro-batches, gathered on every rank in the order
of the global batches."""
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import runtime
from tarantella.data import batches


def _gather_leaf(local, rows, global_batch, holders):
    """The rows of every rank, put back in the order of the global batches,
    whose parts `holders` hold (the ranks in the order of the parts)."""
    size = len(rows)
    local = np.ascontiguousarray(local)
    row_bytes = local[:1].nbytes if len(local) else int(np.prod(local.shape[1:])) * local.itemsize
    raw = local.view(np.uint8).ravel()
    padded_len = (raw.size + 7) // 8
    send = np.zeros(padded_len * 8, dtype=np.uint8)
    send[:raw.size] = raw
    byte_counts = [r * row_bytes for r in rows]
    counts = [(b + 7) // 8 for b in byte_counts]
    recv = np.zeros(sum(counts), dtype=np.int64)
    _core.allgatherv(send.view(np.int64), recv, counts)
    recv_bytes = recv.view(np.uint8)
    parts, offset = [], 0
    for r in range(size):
        chunk = recv_bytes[offset * 8:offset * 8 + byte_counts[r]]
        parts.append(chunk.view(local.dtype).reshape((rows[r],) + local.shape[1:]))
        offset += counts[r]
    if len(holders) == 1:  # one rank predicted every batch whole
        return parts[holders[0]]
    total = sum(rows)
    full, last = divmod(total, global_batch)
    sizes = [global_batch] * full + ([last] if last else [])
    cursor = [0] * size
    out = []
    for b in sizes:
        for r, n in zip(holders, batches.micro_batch_sizes(b, len(holders))):
            out.append(parts[r][cursor[r]:cursor[r] + n])
            cursor[r] += n
    if cursor != list(rows):
        raise runtime.TarantellaError(
            f"gathered predictions do not match global batches of {global_batch}: "
            f"ranks hold {rows} rows")
    return np.concatenate(out, axis=0)


def gather_batches(local, global_batch, holders=None):
    """Gathers per-rank predictions (arrays, or nested lists/dicts of arrays)
    computed on micro-batches, in the original sample order, on every rank.
    `holders`: the ranks that hold the parts of each global batch, in order
    (by default every rank, a part each); the other ranks hold no rows."""
    size = runtime.get_size()
    holders = list(range(size)) if holders is None else holders
    leaves = tf.nest.flatten(local)
    mine = np.array([len(leaves[0])], dtype=np.int64)
    rows = np.zeros(size, dtype=np.int64)
    _core.allgather(mine, rows)
    rows = [int(r) for r in rows]
    gathered = [_gather_leaf(np.asarray(leaf), rows, global_batch, holders) for leaf in leaves]
    return tf.nest.pack_sequence_as(local, gathered)
