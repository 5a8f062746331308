"""TensorFlow ops of Tarantella (written in C), loaded once on first use."""
import os

import tensorflow as tf

from tarantella import settings

_library = None


@tf.autograph.experimental.do_not_convert  # first called inside a traced function at times
def library():
    """The loaded op library (``libtnt_tf_ops.so`` next to this package)."""
    global _library
    if _library is None:
        override = settings.get("TNT_TF_OPS_LIBRARY")
        path = override or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "libtnt_tf_ops.so")
        if override and not os.path.exists(path):
            raise ImportError(
                f"TNT_TF_OPS_LIBRARY={override}: no such file; unset it to use the ops "
                "installed with Tarantella")
        if not os.path.exists(path):
            raise ImportError(
                f"Tarantella's TensorFlow ops are missing ({path}); reinstall the package "
                "with `pip install --no-build-isolation .` from the source tree")
        _library = tf.load_op_library(path)
    return _library


def fusion_start(tensor, fusion, tensor_id, count, scale=1.0):
    """Hands `tensor` times `scale` (a float32 scalar) to fusion set
    `fusion`; libtnt scales it as it copies it. Returns a token for finish.
    `count` is the number of elements of `tensor`: the whole tensor's, or in
    an allgather set the part's (a 1-D tensor of hi - lo elements,
    `Fusion.part`)."""
    return library().tnt_fusion_start(tensor, scale, fusion=fusion, tensor_id=tensor_id,
                                      count=count)


def fusion_finish(token, like, fusion, tensor_id, count, divisor=1.0):
    """The reduced value of tensor `tensor_id` divided by `divisor` (a
    float32 scalar; libtnt divides as it copies it out), shaped like
    `like`, which has `count` elements: the whole tensor, or in a
    reduce-scatter set its part (a 1-D tensor of hi - lo elements,
    `Fusion.part`), which is all the finish gives then."""
    return library().tnt_fusion_finish(token, like, divisor, fusion=fusion,
                                       tensor_id=tensor_id, count=count)


def allreduce(tensor, group, op="sum"):
    return library().tnt_allreduce(tensor, group=group, op=op)


def broadcast(tensor, group, root=0):
    return library().tnt_broadcast(tensor, group=group, root=root)


def allgatherv(part, group, counts):
    """Every rank's `part` (a vector of counts[r] elements on rank r of
    `group`), in rank order: a vector of sum(counts) elements."""
    out = library().tnt_allgatherv(part, group=group, counts=[int(c) for c in counts])
    out.set_shape([sum(int(c) for c in counts)])
    return out


def pipe_send(tensor, group, peer, tag):
    """Posts `tensor` to rank `peer` of `group`; returns a token at once."""
    return library().tnt_pipe_send(tensor, group=group, peer=peer, tag=tag)


def pipe_recv(shape, dtype, group, peer, tag):
    """The tensor of `shape` (an int64 vector) that rank `peer` sends."""
    return library().tnt_pipe_recv(shape, T=dtype, group=group, peer=peer, tag=tag)


def pipe_flush(group):
    """Waits until every send posted to `group` is done; returns a token."""
    return library().tnt_pipe_flush(group=group)


def stamp(tensor, name):
    """(tensor, the time it was ready) for a timeline span (see span)."""
    return library().tnt_stamp(tensor, label=name)


def span(stamp_, tensor, name):
    """`tensor`, once a timeline span `name` from `stamp_` to now is written."""
    return library().tnt_span(stamp_, tensor, label=name)
