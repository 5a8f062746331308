"""Gradient averaging inside the training step, through fusion buckets.

Each rank's gradients are scaled by its sample count n_r and the fused
allreduce sums them together with the counts; dividing by the summed count
N gives sum_r n_r * g_r / N, the gradient of the mean loss over the global
batch, also when micro-batches differ in size. libtnt does the scaling
where it copies the data anyway (into the fusion bucket, and out of it), so
the step makes no extra pass over the gradients; it computes as
TensorFlow's Mul and RealDiv would, so the bits are the same. The count
travels as the first tensor of the fusion set, so its bucket is reduced
first.

Tensors are handed to the fusion set in backprop order (the reverse of the
variable order), each by its own start op as soon as its gradient exists;
the engine reduces a bucket while backprop continues. The finish ops block
a TensorFlow thread while they wait (TensorFlow's C API cannot keep an
asynchronous kernel's completion callback alive), so every finish depends
on all starts: a finish never occupies a thread that a start still needs.

TNT_OVERLAP (runtime.overlap()) goes to the fusion set: off, libtnt
reduces no bucket before every start of the step has run, so no
communication overlaps backprop; auto, the set times both in its first
rounds and keeps the faster.

The ops are stateless, and TensorFlow evaluates stateless ops whose inputs
are all known ahead of time while it optimizes the graph. The sample count
therefore arrives as a variable read, never as a constant (a static batch
dimension would make tf.shape() one).
"""
import tensorflow as tf

from tarantella import _core
from tarantella import log
from tarantella import ops
from tarantella import runtime

_DTYPES = {tf.float32: "float32", tf.float64: "float64", tf.float16: "float16",
           tf.bfloat16: "bfloat16", tf.int8: "int8", tf.int16: "int16", tf.int32: "int32",
           tf.int64: "int64", tf.uint8: "uint8"}


class GradientReducer:
    """Fusion sets by gradient signature, created while tracing, over
    `group` (a _core.create_group handle of `size` ranks; None: all ranks)."""

    def __init__(self, group=None, size=None):
        self._sets = {}
        self._group = group
        self._size = size

    def _fusion(self, signature, count_id):
        fusion = self._sets.get(signature)
        if fusion is None:
            tensors = [(count_id, 1, "float32")]
            tensors += [(i, n, dt) for i, n, dt in signature]
            kb = runtime.threshold_kb()
            tune = kb == "auto"
            threshold = 0 if tune else int(kb * 1024)
            wire = runtime.compression()
            overlap = runtime.overlap()
            fusion = _core.Fusion(tensors, threshold, "sum", group=self._group, wire_dtype=wire,
                                  tune_threshold=tune, order=runtime.fusion_order(),
                                  overlap=overlap)
            log.logger.debug("fusion set: %d tensors in %d buckets (threshold %s, overlap %s, "
                             "float32 travels as %s)", len(tensors), fusion.num_buckets,
                             "tuned" if tune else f"{threshold} bytes", overlap,
                             wire or "float32")
            self._sets[signature] = fusion
        return fusion

    def reduce(self, grads, local_count, after=()):
        """Averages `grads` (list, None allowed) across ranks, weighted by
        `local_count` samples (a float32 scalar read from a variable). No
        gradient enters its bucket before the tensors `after` exist. Runs at
        trace time; returns new tensors."""
        if (runtime.get_size() if self._size is None else self._size) == 1:
            return list(grads)
        dense = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            dense.append(g)
        order = [i for i in reversed(range(len(dense))) if dense[i] is not None]
        signature = []
        for i in order:
            g = dense[i]
            if g.dtype not in _DTYPES:
                raise runtime.TarantellaError(
                    f"gradient {i} has dtype {g.dtype.name}, which Tarantella cannot reduce")
            if not g.shape.is_fully_defined():
                raise runtime.TarantellaError(
                    f"gradient {i} has an unknown shape {g.shape}; variables must have static "
                    "shapes")
            signature.append((i, int(g.shape.num_elements()), _DTYPES[g.dtype]))
        signature = tuple(signature)
        count_id = len(dense)
        fusion = self._fusion(signature, count_id)
        h = fusion.handle

        with tf.control_dependencies(list(after)):
            n = tf.reshape(local_count, [1])
            tokens = {count_id: ops.fusion_start(n, h, count_id, 1)}
            for i, numel, _ in signature:
                tokens[i] = ops.fusion_start(dense[i], h, i, numel, scale=n[0])
        with tf.control_dependencies([tf.group(list(tokens.values()))]):
            total = ops.fusion_finish(tokens[count_id], n, h, count_id, 1)[0]
            out = list(dense)
            for i, numel, _ in signature:
                out[i] = ops.fusion_finish(tokens[i], dense[i], h, i, numel, divisor=total)
        return out
