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
from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import ops
from tarantella import runtime

_DTYPES = {tf.float32: "float32", tf.float64: "float64", tf.float16: "float16",
           tf.bfloat16: "bfloat16", tf.int8: "int8", tf.int16: "int16", tf.int32: "int32",
           tf.int64: "int64", tf.uint8: "uint8"}


def signature(tensors):
    """The fusion signature of `tensors` (gradients or variables, None
    allowed): (index, elements, dtype) of each in backprop order (the
    reverse of the list's), Nones left out."""
    out = []
    for i in reversed(range(len(tensors))):
        t = tensors[i]
        if t is None:
            continue
        dtype = tf.as_dtype(t.dtype)
        if dtype not in _DTYPES:
            raise runtime.TarantellaError(
                f"gradient {i} has dtype {dtype.name}, which Tarantella cannot reduce")
        shape = tf.TensorShape(t.shape)
        if not shape.is_fully_defined():
            raise runtime.TarantellaError(
                f"gradient {i} has an unknown shape {shape}; variables must have static "
                "shapes")
        out.append((i, int(shape.num_elements()), _DTYPES[dtype]))
    return tuple(out)


def shaped(grads, likes):
    """`grads` (a list, None allowed) as dense tensors of the static shapes
    of `likes` (their variables, or the tensors they are the gradients of).
    TensorFlow leaves a gradient's static shape partly unknown where it
    comes from dynamic shapes: a Dense kernel's on 3-D inputs whose batch
    has no static size (a batched matmul's gradient), a tied embedding's
    (an IndexedSlices plus a tensor)."""
    out = []
    for g, like in zip(grads, likes):
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        if g is not None and not g.shape.is_fully_defined() and \
                tf.TensorShape(like.shape).is_fully_defined():
            g = tf.ensure_shape(g, like.shape)
        out.append(g)
    return out


def count_id(signature):
    """The id of the sample count in the fusion set of `signature`."""
    return max((i for i, _, _ in signature), default=-1) + 1


class GradientReducer:
    """Fusion sets by gradient signature, created while tracing (or at once
    by fusion()), over `group` (a _core.create_group handle of `size` ranks;
    None: all ranks). `mode` "allreduce" gives every rank the averaged
    gradients; "reduce_scatter" gives each rank its part of them (zero/shards.py),
    "allgather" makes sets that gather parts. The sample count is the first
    tensor of every set, so that sets of one signature have one plan, and so
    the same parts, whatever their mode."""

    def __init__(self, group=None, size=None, mode="allreduce"):
        self._sets = {}
        self._group = group
        self._size = size
        self._mode = mode

    def fusion(self, signature, mode=None):
        """The set of `signature` (gradients.signature) in `mode` (default:
        the reducer's)."""
        mode = mode or self._mode
        fusion = self._sets.get((mode, signature))
        if fusion is None:
            tensors = [(count_id(signature), 1, "float32")]
            tensors += [(i, n, dt) for i, n, dt in signature]
            kb = runtime.threshold_kb()
            tune = kb == "auto"
            threshold = 0 if tune else int(kb * 1024)
            # TNT_COMPRESSION is the gradients' wire dtype: weights gathered
            # from their parts travel whole (a set's parts do not depend on
            # its wire dtype).
            wire = None if mode == "allgather" else runtime.compression()
            overlap = runtime.overlap()
            if overlap == "auto" and mode == "reduce_scatter" and _paces(signature):
                # Off, every whole vector would wait for the end of backprop
                # at once: the gradients that the room holds back.
                overlap = "on"
            fusion = _core.Fusion(tensors, threshold, "sum", group=self._group, wire_dtype=wire,
                                  tune_threshold=tune, order=runtime.fusion_order(),
                                  overlap=overlap, mode=mode)
            log.logger.debug("fusion set: %d tensors in %d buckets (%s, threshold %s, overlap "
                             "%s, float32 travels as %s)", len(tensors), fusion.num_buckets,
                             mode, "tuned" if tune else f"{threshold} bytes", overlap,
                             wire or "float32")
            self._sets[(mode, signature)] = fusion
        return fusion

    def reduce(self, grads, local_count, after=(), count_sink=None, parts_like=None,
               waves=None, pace=False):
        """Averages `grads` (dense tensors of static shapes, see shaped();
        None allowed) across ranks, weighted by `local_count` samples (a
        float32 scalar read from a variable). No gradient enters its bucket
        before the tensors `after` exist. Runs at trace time; returns new
        tensors. In mode "reduce_scatter" these are the gradients' parts
        (1-D), the sum of the counts comes from an allreduce before the
        first bucket, the count's own part goes to the variable
        `count_sink` (TensorFlow drops a finish whose value nothing uses),
        and `parts_like[i]`, a tensor shaped like gradient i's part, gives
        its finish the part's shape.

        `waves` (stage 3's backward pass gathers weights between the
        gradients' starts) orders the starts: [(indices, gather,
        collectives)], each gradient's index in one wave, in order;
        `gather`, None or a function of the ops it must follow that runs a
        collective and returns its tensors, runs after the starts of the
        waves before, and the starts of its wave wait for it; then the
        backward pass's own `collectives` (graph ops, in their chain's
        order; a synchronized BatchNormalization's), which the wave's
        gradients are the first to need, run, and the wave's starts wait for
        them too. A fusion bucket is submitted by its last member's start,
        so every rank then submits the buckets, the gathers and the
        collectives in one order.

        `pace` (reduce-scatter; graph mode; gradients of more bytes than
        runtime.in_flight_bytes()) keeps the backward pass from running
        ahead of the reduce-scatter: the ops that compute a wave's
        gradients (by default a gradient is a wave of its own, in backprop
        order) wait for the starts of the wave before, and a start waits
        while the buckets not yet reduced pass TNT_FUSION_IN_FLIGHT_MIB
        (libtnt). A rank then holds a few gradients whole at once, not
        all of them. An op that the earlier waves' gradients need (a
        weight read twice, far apart) is not held back: it would wait for
        itself."""
        if (runtime.get_size() if self._size is None else self._size) == 1 and \
                self._mode == "allreduce":
            return list(grads)
        dense = list(grads)
        sig = signature(dense)
        fusion = self.fusion(sig)
        h = fusion.handle
        cid = count_id(sig)
        scattered = self._mode == "reduce_scatter"

        with tf.control_dependencies(list(after)):
            n = tf.reshape(local_count, [1])
            if scattered:
                total = ops.allreduce(n, self._group or _core.world_handle())[0]
        with tf.control_dependencies([total] if scattered else []):
            tokens = {cid: ops.fusion_start(n, h, cid, 1)}
        numels = {i: numel for i, numel, _ in sig}
        started, gate = [tokens[cid]], ([total] if scattered else [])
        pace = pace and scattered and not tf.executing_eagerly() and _paces(sig)
        if waves is None:
            waves = [([i], None, ()) for i, _, _ in sig] if pace else \
                [([i for i, _, _ in sig], None, ())]
        before, needed = [tokens[cid]], set()  # the wave before's starts; what they need
        if pace:
            ancestors(before, needed)
        for indices, gather, collectives in waves:
            if gather is not None:
                gate = gather(started)
            if collectives:
                internals.hold_back(collectives, gate if gather is not None else started)
                gate = list(gate) + list(collectives)
            if pace:
                producers = [_producer(dense[i]) for i in indices]
                if not any(op in needed for op in producers):
                    internals.hold_back(producers, before)
            with tf.control_dependencies(gate):
                for i in indices:
                    tokens[i] = ops.fusion_start(dense[i], h, i, numels[i], scale=n[0])
            before = [tokens[i] for i in indices]
            started += before
            if pace:
                ancestors(before, needed)
        with tf.control_dependencies([tf.group(list(tokens.values()))]):
            if scattered:
                count_sink.assign(ops.fusion_finish(tokens[cid], count_sink.value(), h, cid,
                                                    int(count_sink.shape[0])))
            else:
                total = ops.fusion_finish(tokens[cid], n, h, cid, 1)[0]
            out = list(dense)
            for i, numel, _ in sig:
                if scattered:
                    out[i] = ops.fusion_finish(tokens[i], parts_like[i], h, i,
                                               int(parts_like[i].shape[0]), divisor=total)
                else:
                    out[i] = ops.fusion_finish(tokens[i], dense[i], h, i, numel, divisor=total)
        return out


def _paces(signature):
    """Whether a backward pass of gradients `signature` runs ahead of their
    reduce-scatter unless it is paced: they are larger than the room for
    buckets waiting for it (runtime.in_flight_bytes())."""
    return sum(n * tf.as_dtype(dt).size for _, n, dt in signature) > runtime.in_flight_bytes()


# Ops whose output is their input's buffer: a gradient passed through one
# was computed by the op before it.
_ALIASING = ("Identity", "EnsureShape", "Reshape")


def _producer(tensor):
    """The op that computes `tensor`'s values (a graph tensor)."""
    op = tensor.op
    while op.type in _ALIASING and op.inputs:
        op = op.inputs[0].op
    return op


def ancestors(tensors, found, within=None):
    """Adds to `found` the graph ops that `tensors` (None allowed) depend
    on, among the ops `within` (a set; None: all)."""
    stack = [t.op for t in tf.nest.flatten(tensors, expand_composites=True) if t is not None]
    while stack:
        op = stack.pop()
        if op in found or (within is not None and op not in within):
            continue
        found.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
