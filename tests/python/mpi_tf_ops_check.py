"""Checks of Tarantella's TensorFlow ops that need a libtnt context.

test_tf_ops.py runs them, each in a fresh process since MPI can be started
only once per process: at 1 rank as a plain process (MPI then starts as a
singleton) and at 2 ranks under mpirun, for example

    python3 mpi_tf_ops_check.py round_trip errors
    mpirun -np 2 python3 mpi_tf_ops_check.py ranks collectives

The context, the world group and the fusion sets are made through ctypes
(libtnt_calls.py) on the libtnt.so that the op library loaded, since the integer handles that
the ops carry are only known to that copy of libtnt. The op library is
$TNT_TF_OPS_LIBRARY, else libtnt_tf_ops.so of the installed tarantella
package. Every check prints "<check>: OK" on each rank when it passes and
raises when it does not.
"""
import ctypes
import glob
import importlib.util
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from libtnt_calls import FusionOptions, TensorInfo, check, libtnt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Checks trace a function per dtype on purpose; TensorFlow would warn.
tf.get_logger().setLevel("ERROR")

DTYPES = [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.int8,
          tf.int16, tf.uint8]
TNT_DTYPES = {tf.float32: 0, tf.float64: 1, tf.float16: 2, tf.bfloat16: 3, tf.int32: 4,
              tf.int64: 5, tf.int8: 6, tf.int16: 7, tf.uint8: 8}
TNT_OPS = {"sum": 0, "average": 1, "min": 2, "max": 3}


def op_library_path():
    """$TNT_TF_OPS_LIBRARY, else the op library of the installed package,
    else None."""
    path = os.environ.get("TNT_TF_OPS_LIBRARY")
    if path:
        return path
    spec = importlib.util.find_spec("tarantella")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "libtnt_tf_ops.so")


class Tnt:
    """The op library, and a libtnt context over every rank of the job."""

    def __init__(self, ops_path):
        self.ops = tf.load_op_library(ops_path)
        self.lib = lib = libtnt()
        self.ctx = ctypes.c_void_p()
        check(lib, lib.tnt_context_create(None, ctypes.byref(self.ctx)), "tnt_context_create")
        self.world = lib.tnt_context_world(self.ctx)
        self.rank = lib.tnt_group_rank(self.world)
        self.size = lib.tnt_group_size(self.world)
        self.group = lib.tnt_group_handle(self.world)
        self._sets = []

    def fusion(self, tensors, threshold_bytes, op="average", mode=0):
        """A fusion set of `tensors` [(id, tf.TensorShape or count, dtype)],
        listed in backprop order, in `mode` (tnt_fusion_mode_t); returns its
        handle."""
        infos = (TensorInfo * len(tensors))(
            *[TensorInfo(i, count_of(n), TNT_DTYPES[dt]) for i, n, dt in tensors])
        f = ctypes.c_void_p()
        options = FusionOptions(ctypes.sizeof(FusionOptions), threshold_bytes, TNT_OPS[op],
                                TNT_DTYPES[tf.float32], mode=mode)
        check(self.lib, self.lib.tnt_fusion_create(self.world, infos, len(tensors),
                                                   ctypes.byref(options), ctypes.byref(f)),
              "tnt_fusion_create")
        self._sets.append(f)
        return self.lib.tnt_fusion_handle(f)

    def part(self, fusion, tensor_id):
        """This rank's part (lo, hi) of the tensor in the set of handle `fusion`."""
        lo, hi = ctypes.c_size_t(), ctypes.c_size_t()
        check(self.lib, self.lib.tnt_fusion_part(self.lib.tnt_fusion_lookup(fusion), tensor_id,
                                                 ctypes.byref(lo), ctypes.byref(hi)),
              "tnt_fusion_part")
        return lo.value, hi.value

    def start(self, tensor, fusion, tensor_id):
        return self.ops.tnt_fusion_start(tensor, 1.0, fusion=fusion, tensor_id=tensor_id,
                                         count=count_of(tensor.shape))

    def finish(self, token, like, fusion, tensor_id):
        return self.ops.tnt_fusion_finish(token, like, 1.0, fusion=fusion, tensor_id=tensor_id,
                                          count=count_of(like.shape))

    def close(self):
        for f in self._sets:
            check(self.lib, self.lib.tnt_fusion_destroy(f), "tnt_fusion_destroy")
        check(self.lib, self.lib.tnt_context_destroy(self.ctx), "tnt_context_destroy")


def count_of(shape):
    return int(np.prod(shape)) if not isinstance(shape, int) else shape


def expect_error(error, text, fn):
    """Runs fn and checks that it raises `error` with `text` in the message."""
    try:
        fn()
    except error as e:
        assert text in str(e), f"expected {text!r} in: {e}"
        return str(e)
    raise AssertionError(f"expected {error.__name__} containing {text!r}")


def rank_values(shape, dtype, rank, salt=0):
    """Small non-negative integers, so that every dtype holds them, their
    sums and their halves exactly: the checks compare exactly."""
    n = count_of(shape)
    ints = (np.arange(n) * 7 + 3 * salt) % 11 + 2 * rank
    return tf.constant(ints.reshape(shape), dtype=dtype)


def expected(shape, dtype, size, op, salt=0):
    """The reduction over ranks 0..size-1 of rank_values."""
    per_rank = np.stack([rank_values(shape, tf.float64, r, salt).numpy() for r in range(size)])
    if op == "sum":
        out = per_rank.sum(axis=0)
    elif op == "average":
        total = per_rank.sum(axis=0)
        # libtnt divides integers by the group size with integer division.
        out = total // size if dtype.is_integer else total / size
    elif op == "min":
        out = per_rank.min(axis=0)
    else:
        out = per_rank.max(axis=0)
    return tf.constant(out, dtype=dtype).numpy()


def assert_equal(actual, wanted, what):
    actual = np.asarray(actual, dtype=np.float64)
    wanted = np.asarray(wanted, dtype=np.float64)
    np.testing.assert_array_equal(actual, wanted, err_msg=what)


# ------------------------------------------------------------------ checks


def check_round_trip(t):
    """Start and finish of the gradients of a model with weights of four
    float dtypes, plus two integer tensors, inside a tf.function (at 1 rank
    the average is the tensor itself), and the same eagerly."""
    assert t.size == 1
    assert not tf.config.optimizer.get_jit(), "XLA auto-clustering must be off"
    rng = np.random.default_rng(0)
    variables = [tf.Variable(tf.constant(rng.normal(size=s), dtype=dt))
                 for s, dt in [([4, 3], tf.float32), ([5], tf.float64), ([2, 2], tf.float16),
                               ([7], tf.bfloat16)]]
    ints = [([3], tf.int32), ([2, 2], tf.int64)]
    # Ids need not be dense or ordered; the list is in backprop order.
    ids = [11, 7, 42, 3, 100, 5]
    shapes = [(v.shape, v.dtype) for v in variables] + ints
    plan = [(ids[k],) + shapes[k] for k in reversed(range(len(ids)))]

    def make_step(fusion):
        @tf.function(jit_compile=False)
        def step(x, i32, i64):
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32) ** 2) * x
                                 for v in variables])
            tensors = tape.gradient(loss, variables) + [i32, i64]
            tokens = [t.start(tensors[k], fusion, ids[k]) for k in reversed(range(len(ids)))]
            # Finishes after every start: a finish holds a thread while it
            # waits (see src/tf_ops/tnt_tf_ops.c).
            with tf.control_dependencies(tokens):
                out = [t.finish(tokens[len(ids) - 1 - k], tensors[k], fusion, ids[k])
                       for k in range(len(ids))]
            return tensors, out
        return step

    for threshold in (0, 64, 1 << 20):
        fusion = t.fusion(plan, threshold)
        step = make_step(fusion)
        for s in range(3):
            x = tf.constant(1.0 + s)
            i32 = tf.constant([s, 2 * s, -s], tf.int32)
            i64 = tf.constant([[s, 1], [2, 3 * s]], tf.int64)
            tensors, out = step(x, i32, i64)
            for k, (a, b) in enumerate(zip(tensors, out)):
                assert b.dtype == a.dtype and b.shape == a.shape
                assert_equal(b, a, f"tensor {ids[k]}, threshold {threshold}, step {s}")
        graph = step.get_concrete_function(x, i32, i64).graph
        types = [op.type for op in graph.get_operations()]
        assert types.count("TntFusionStart") == 6 and types.count("TntFusionFinish") == 6
        assert not any(op.op_def.is_stateful for op in graph.get_operations()
                       if op.type.startswith("Tnt"))

    # Eagerly: every dtype, started in one order and finished in another.
    tensors = {10 + k: rank_values([3, 2], dt, 0, k) for k, dt in enumerate(DTYPES)}
    fusion = t.fusion([(i, v.shape, v.dtype) for i, v in tensors.items()], 16)
    ids = list(tensors)
    started, finished = ids[3:] + ids[:3], ids[::-1][2:] + ids[::-1][:2]
    for _ in range(2):
        tokens = {i: t.start(tensors[i], fusion, i) for i in started}
        for i in finished:
            out = t.finish(tokens[i], tensors[i], fusion, i)
            assert out.dtype == tensors[i].dtype
            assert_equal(out, tensors[i], f"eager tensor {i}")


def check_scaled(t):
    """The gradient path's weighted average: scaling by the rank's count n_r
    in the start op and dividing by the summed count N in the finish op gives
    bitwise what TensorFlow's x * cast(n_r) before the start and
    sum / cast(N) after the finish give, for every float dtype (float32
    also over a 16-bit wire is covered by libtnt's C test)."""
    dtypes = [tf.float32, tf.float64, tf.float16, tf.bfloat16]
    tensors = [(i, tf.TensorShape([257 + 31 * i]), dt) for i, dt in enumerate(dtypes)]
    scaled_set = t.fusion(tensors, 1024, op="sum")
    plain_set = t.fusion(tensors, 1024, op="sum")
    n = tf.constant(float(t.rank + 2))
    total = tf.constant(float(sum(r + 2 for r in range(t.size))))

    rng = np.random.default_rng(17 + t.rank)
    xs = [tf.cast(rng.standard_normal(count_of(s)) * 3, dt) for _, s, dt in tensors]
    # Eagerly, every start before any finish, in the same order on every rank.
    tokens = [t.ops.tnt_fusion_start(x, n, fusion=scaled_set, tensor_id=i, count=count_of(s))
              for (i, s, _), x in zip(tensors, xs)]
    got = [t.ops.tnt_fusion_finish(k, x, total, fusion=scaled_set, tensor_id=i,
                                   count=count_of(s))
           for (i, s, _), x, k in zip(tensors, xs, tokens)]
    xs_n = [x * tf.cast(n, dt) for (_, _, dt), x in zip(tensors, xs)]
    tokens = [t.start(x, plain_set, i) for (i, _, _), x in zip(tensors, xs_n)]
    want = [t.finish(k, x, plain_set, i) / tf.cast(total, dt)
            for (i, _, dt), x, k in zip(tensors, xs_n, tokens)]
    for (i, _, dt), g, w in zip(tensors, got, want):
        g, w = g.numpy(), w.numpy()
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), (
            f"{dt.name}: {int(np.sum(g != w))} elements differ from TensorFlow's scaling")


def check_modes(t):
    """The ops on a reduce-scatter set and an allgather set of the same
    tensors: the first's finish, given a 1-D `like` of the part's elements,
    outputs the part, bitwise the allreduce set's elements there; the
    second's start takes that part and its finish gives the whole tensor,
    shaped like `like`. Shapes are static in a tf.function; a count that is
    not the part's fails the op."""
    shapes = [tf.TensorShape([3, 50]), tf.TensorShape([7]), tf.TensorShape([2, 2, 33])]
    tensors = [(i, s, tf.float32) for i, s in enumerate(shapes)]
    ar, rs, ag = (t.fusion(tensors, 256, mode=mode) for mode in range(3))
    parts = [t.part(rs, i) for i, _, _ in tensors]
    assert parts == [t.part(ag, i) for i, _, _ in tensors] == [t.part(ar, i) for i, _, _ in tensors]
    rng = np.random.default_rng(5 + t.rank)
    xs = [tf.constant(rng.standard_normal(s.as_list()), tf.float32) for s in shapes]
    likes = [tf.reshape(x, [-1])[lo:hi] for x, (lo, hi) in zip(xs, parts)]
    # Eagerly, every start of a set before any of its finishes.
    tokens = [t.start(x, ar, i) for (i, _, _), x in zip(tensors, xs)]
    whole = [t.finish(k, x, ar, i) for (i, _, _), x, k in zip(tensors, xs, tokens)]
    tokens = [t.start(x, rs, i) for (i, _, _), x in zip(tensors, xs)]
    got = [t.finish(k, p, rs, i) for (i, _, _), p, k in zip(tensors, likes, tokens)]
    for w, g, (lo, hi) in zip(whole, got, parts):
        assert g.shape == [hi - lo], g.shape
        assert g.numpy().tobytes() == tf.reshape(w, [-1])[lo:hi].numpy().tobytes()
    tokens = [t.start(g, ag, i) for (i, _, _), g in zip(tensors, got)]
    gathered = [t.finish(k, x, ag, i) for (i, _, _), x, k in zip(tensors, xs, tokens)]
    for w, g in zip(whole, gathered):
        assert g.shape == w.shape and g.numpy().tobytes() == w.numpy().tobytes()

    def step(x, part):
        token = t.ops.tnt_fusion_start(x, 1.0, fusion=rs, tensor_id=0, count=150)
        reduced = t.ops.tnt_fusion_finish(token, part, 1.0, fusion=rs, tensor_id=0,
                                          count=parts[0][1] - parts[0][0])
        token = t.ops.tnt_fusion_start(reduced, 1.0, fusion=ag, tensor_id=0,
                                       count=parts[0][1] - parts[0][0])
        return t.ops.tnt_fusion_finish(token, x, 1.0, fusion=ag, tensor_id=0, count=150)

    traced = tf.function(step, jit_compile=False).get_concrete_function(
        tf.TensorSpec([3, 50], tf.float32), tf.TensorSpec([parts[0][1] - parts[0][0]], tf.float32))
    assert traced.structured_outputs.shape == [3, 50]
    if t.size > 1:
        expect_error(tf.errors.InvalidArgumentError,
                     "but the part of tensor 0 in its reduce-scatter fusion set has",
                     lambda: t.ops.tnt_fusion_finish(
                         t.start(xs[0], rs, 0), xs[0], 1.0, fusion=rs, tensor_id=0, count=150))
        # The failed finish left tensor 0 started: finish it as the set expects.
        for i, x in zip(range(1, 3), xs[1:]):
            t.start(x, rs, i)
        for (i, _, _), p in zip(tensors, likes):
            t.finish(tf.constant(i, tf.int64), p, rs, i)


def check_errors(t):
    """Errors that need a context: a tensor outside the set, a repeated
    start (libtnt's TNT_ERR_STATE), a token of another tensor, a count
    mismatch inside a tf.function, a broadcast root outside the group."""
    a = tf.ones([4])
    b = tf.constant([1, 2, 3], tf.int32)
    fusion = t.fusion([(1, 4, tf.float32), (2, 3, tf.int32)], 0)
    expect_error(tf.errors.InvalidArgumentError, f"tensor 9 is not in fusion set {fusion}",
                 lambda: t.ops.tnt_fusion_start(a, 1.0, fusion=fusion, tensor_id=9, count=4))
    token_a = t.start(a, fusion, 1)
    expect_error(tf.errors.FailedPreconditionError, "TNT_ERR_STATE",
                 lambda: t.start(a, fusion, 1))
    token_b = t.start(b, fusion, 2)
    expect_error(tf.errors.InvalidArgumentError, "is not the token of tensor 1",
                 lambda: t.finish(token_b, a, fusion, 1))
    # The failed calls left the round intact.
    assert_equal(t.finish(token_a, a, fusion, 1), a, "tensor 1")
    assert_equal(t.finish(token_b, b, fusion, 2), b, "tensor 2")

    @tf.function(jit_compile=False)
    def wrong_count(x):
        return t.ops.tnt_fusion_start(x, 1.0, fusion=fusion, tensor_id=1, count=5)

    expect_error(tf.errors.InvalidArgumentError,
                 "tensor 1 has 4 elements, but its fusion set expects count=5",
                 lambda: wrong_count(a))
    expect_error(tf.errors.InvalidArgumentError, f"root={t.size} is not a rank",
                 lambda: t.ops.tnt_broadcast(a, group=t.group, root=t.size))
    counts = [4] * t.size
    expect_error(tf.errors.InvalidArgumentError,
                 f"rank {t.rank} contributes 3 elements, but counts says 4",
                 lambda: t.ops.tnt_allgatherv(b, group=t.group, counts=counts))
    expect_error(tf.errors.InvalidArgumentError,
                 f"counts has {t.size + 1} entries, but group {t.group} has {t.size} ranks",
                 lambda: t.ops.tnt_allgatherv(a, group=t.group, counts=counts + [4]))


def check_collectives(t):
    """TntAllreduce with every op, TntBroadcast from the last rank and
    TntAllgatherv of parts of unequal sizes (rank r gives 2 r + 1 elements,
    the last rank none), for every dtype, eagerly and in a tf.function, at
    any number of ranks."""
    ops = list(TNT_OPS)
    root = t.size - 1
    counts = [2 * r + 1 for r in range(t.size - 1)] + [0]
    for dtype in DTYPES:
        x = rank_values([3, 4], dtype, t.rank)
        before = x.numpy().copy()
        parts = [tf.reshape(rank_values([3, 4], dtype, r), [-1])[:counts[r]]
                 for r in range(t.size)]
        for gathered in (t.ops.tnt_allgatherv(parts[t.rank], group=t.group, counts=counts),
                         tf.function(lambda p: t.ops.tnt_allgatherv(p, group=t.group,
                                                                    counts=counts),
                                     jit_compile=False)(parts[t.rank])):
            assert_equal(gathered, tf.concat(parts, 0), f"allgatherv of {dtype.name}")
        for op in ops:
            out = t.ops.tnt_allreduce(x, group=t.group, op=op)
            assert out.dtype == dtype and out.shape == x.shape
            assert_equal(out, expected([3, 4], dtype, t.size, op), f"{op} of {dtype.name}")
        out = t.ops.tnt_broadcast(x, group=t.group, root=root)
        assert_equal(out, rank_values([3, 4], dtype, root), f"broadcast of {dtype.name}")
        assert_equal(x, before, "the input of broadcast must not change")

        @tf.function(jit_compile=False)
        def collectives(v):
            # Collectives must run in the same order on every rank, and
            # TensorFlow orders stateless ops only by their dependencies.
            results = []
            for op in ops:
                with tf.control_dependencies(results[-1:]):
                    results.append(t.ops.tnt_allreduce(v * 1, group=t.group, op=op))
            with tf.control_dependencies(results[-1:]):
                results.append(t.ops.tnt_broadcast(v, group=t.group, root=root))
            return results, v

        for salt in range(2):
            results, same = collectives(rank_values([3, 4], dtype, t.rank, salt))
            for op, out in zip(ops, results):
                assert_equal(out, expected([3, 4], dtype, t.size, op, salt),
                             f"{op} of {dtype.name} in a tf.function")
            assert_equal(results[-1], rank_values([3, 4], dtype, root, salt),
                         f"broadcast of {dtype.name} in a tf.function")
            assert_equal(same, rank_values([3, 4], dtype, t.rank, salt), "broadcast input")


def check_ranks(t):
    """Averages over the ranks of tensors of every dtype, which each rank
    starts in its own order, over several rounds, eagerly and in a
    tf.function; with one bucket per tensor and with fused buckets."""
    assert t.size > 1
    specs = [(20 + k, [k + 1, 3], DTYPES[k % len(DTYPES)]) for k in range(9)]
    ids = [i for i, _, _ in specs]
    # Rank 0 starts in plan order, rank 1 in the reverse order, others in a
    # random one.
    order = list(ids)
    if t.rank == 1:
        order.reverse()
    elif t.rank > 1:
        order = list(np.random.default_rng(t.rank).permutation(ids))
    shape_of = {i: s for i, s, _ in specs}
    dtype_of = {i: dt for i, _, dt in specs}

    def inputs(salt):
        return {i: rank_values(shape_of[i], dtype_of[i], t.rank, salt + i) for i in ids}

    def verify(out, salt, what):
        for i in ids:
            assert out[i].dtype == dtype_of[i] and list(out[i].shape) == shape_of[i]
            assert_equal(out[i], expected(shape_of[i], dtype_of[i], t.size, "average", salt + i),
                         f"tensor {i}, {what}")

    for threshold in (0, 40):
        fusion = t.fusion(specs, threshold)
        for salt in range(3):
            values = inputs(salt)
            tokens = {i: t.start(values[i], fusion, i) for i in order}
            out = {i: t.finish(tokens[i], values[i], fusion, i) for i in reversed(order)}
            verify(out, salt, f"eager, threshold {threshold}")
            # The result must not have been written over the input.
            for i in ids:
                assert_equal(values[i], rank_values(shape_of[i], dtype_of[i], t.rank, salt + i),
                             f"input {i}")

        @tf.function(jit_compile=False)
        def step(values):
            tokens = {}
            for i in order:
                # Chained in this rank's order, so that ranks really differ.
                with tf.control_dependencies(list(tokens.values())[-1:]):
                    tokens[i] = t.start(values[i], fusion, i)
            with tf.control_dependencies(list(tokens.values())):
                return {i: t.finish(tokens[i], values[i], fusion, i) for i in ids}

        for salt in range(3, 6):
            verify(step(inputs(salt)), salt, f"tf.function, threshold {threshold}")


def profile_events(fn, *args):
    """Runs fn(*args) under TensorFlow's profiler; returns the executor's
    op events as {node name: (begin, end)} in microseconds."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with tempfile.TemporaryDirectory(prefix="tnt-profile-") as logdir:
        tf.profiler.experimental.start(logdir)
        fn(*args)
        tf.profiler.experimental.stop()
        trace = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
        with open(trace, "rb") as f:
            space.ParseFromString(f.read())
    events = {}
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                # Op events are named "<node name>:<op type>".
                node, sep, _ = names.get(e.metadata_id, "").partition(":")
                if sep:
                    begin = line.timestamp_ns / 1e3 + e.offset_ps / 1e6
                    events[node] = (begin, begin + e.duration_ps / 1e6)
    return events


def check_overlap(t):
    """Communication overlaps backprop: with one bucket per tensor, the
    first bucket's allreduce starts before the last gradient is computed.

    libtnt submits a bucket's allreduce inside the tnt_fusion_start that
    completes the bucket, so with threshold 0 the TntFusionStart op of the
    first tensor in backprop order is when bucket 0 starts. TensorFlow's
    profiler gives the begin and end of every op; the last gradient is the
    one of the first layer's weights, computed by the op that feeds its
    TntFusionStart. A control run that makes every start wait for every
    gradient (what a stateful op would get in a tf.function) shows that the
    measurement tells the two apart."""
    assert t.size == 1
    layers, width, batch = 8, 384, 384
    weights = [tf.Variable(tf.random.normal([width, width], seed=k) * 0.05)
               for k in range(layers)]
    fusion = t.fusion([(k, width * width, tf.float32) for k in reversed(range(layers))], 0)

    def make_step(after_all_gradients):
        @tf.function(jit_compile=False)
        def step(x):
            with tf.GradientTape() as tape:
                y = x
                for w in weights:
                    y = tf.nn.relu(tf.matmul(y, w))
                loss = tf.reduce_sum(y * y)
            grads = tape.gradient(loss, weights)
            with tf.control_dependencies(grads if after_all_gradients else []):
                tokens = {k: t.start(grads[k], fusion, k) for k in reversed(range(layers))}
            with tf.control_dependencies(list(tokens.values())):
                return [t.finish(tokens[k], grads[k], fusion, k) for k in range(layers)]
        return step

    x = tf.random.normal([batch, width], seed=99)
    for after_all_gradients in (False, True):
        step = make_step(after_all_gradients)
        step(x)
        graph = step.get_concrete_function(x).graph
        starts = {op.get_attr("tensor_id"): op for op in graph.get_operations()
                  if op.type == "TntFusionStart"}
        first_bucket = starts[layers - 1].name
        last_gradient = starts[0].inputs[0].op.name
        leads = []
        for _ in range(3):
            events = profile_events(step, x)
            missing = [n for n in (first_bucket, last_gradient) if n not in events]
            assert not missing, f"{missing} not in the profile: {sorted(events)}"
            # How long before the last gradient's op began bucket 0 had
            # been submitted (negative: after).
            leads.append(events[last_gradient][0] - events[first_bucket][1])
        run = "control" if after_all_gradients else "model"
        print(f"overlap: {run}: bucket 0 was submitted this long before the last gradient's "
              f"op ({last_gradient}) began: "
              f"{', '.join(f'{lead / 1e3:+.2f} ms' for lead in leads)}", flush=True)
        if after_all_gradients:
            assert max(leads) < 0, "the control run must start bucket 0 after every gradient"
        else:
            assert sorted(leads)[1] > 0, "bucket 0 must start before the last gradient"


def check_failure(t):
    """A rank that never starts a tensor. Rank 0's bucket 0 times out, which
    fails its context: its finish fails, and its next op fails with the
    context's explanation. Rank 1 waits for bucket 0 in vain and times out.
    Ends the process without finalizing MPI (the context has failed)."""
    assert t.size == 2
    a = tf.ones([4])
    fusion = t.fusion([(1, 4, tf.float32), (2, 4, tf.float32)], 0)
    if t.rank == 0:
        token = t.start(a, fusion, 1)
        messages = [
            expect_error((tf.errors.DeadlineExceededError, tf.errors.AbortedError), "TNT_ERR_",
                         lambda: t.finish(token, a, fusion, 1)),
            expect_error(tf.errors.AbortedError, "the communication context failed: ",
                         lambda: t.ops.tnt_allreduce(a, group=t.group, op="sum"))]
    else:
        token = t.start(a, fusion, 2)
        messages = [expect_error(tf.errors.DeadlineExceededError, "TNT_ERR_TIMEOUT",
                                 lambda: t.finish(token, a, fusion, 2))]
    for m in messages:
        print(f"failure: rank {t.rank} got: {m.splitlines()[0]}", flush=True)


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_")}


def main(names):
    unknown = [n for n in names if n not in CHECKS]
    if not names or unknown:
        sys.exit(f"usage: {sys.argv[0]} CHECK... (CHECK: {', '.join(CHECKS)})")
    path = op_library_path()
    if path is None or not os.path.exists(path):
        sys.exit(f"the op library is missing ({path}); set TNT_TF_OPS_LIBRARY")
    t = Tnt(path)
    for name in names:
        CHECKS[name](t)
        print(f"rank {t.rank}/{t.size} {name}: OK", flush=True)
    if "failure" in names:
        sys.stdout.flush()
        os._exit(0)
    t.close()


if __name__ == "__main__":
    main(sys.argv[1:])
