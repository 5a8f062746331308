"""Tests of tarantella._core, the extension over libtnt.

Most tests run in this process as a 1-rank job (MPI started as a singleton);
the life-cycle tests that need a fresh process (before init, after finalize)
and the multi-rank tests (mpirun with 2 and 3 ranks running
mpi_core_check.py) run in subprocesses. Run after installing the package:

    python3 -m pip install --no-build-isolation . && python3 -m pytest tests/python
"""
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import tarantella._core as core
from conftest import require_ranks_mark
from libtnt_calls import FusionCalls, LibtntError

HERE = os.path.dirname(os.path.abspath(__file__))

# numpy dtype -> the libtnt dtype it maps to. np.intc and np.longlong have
# the buffer formats 'i' and 'q'; np.int64 has 'l' on Linux; np.int8,
# np.int16 and np.uint8 have 'b', 'h' and 'B'.
NUMERIC = [np.float32, np.float64, np.float16, np.intc, np.int64, np.longlong, np.int8,
           np.int16, np.uint8]
OPS = ["sum", "average", "min", "max"]
SESSION_TIMEOUT_S = 3.0


@pytest.fixture(scope="module", autouse=True)
def context():
    # Not finalized here: MPI cannot start twice in one process, and other
    # test modules of this pytest run may still need it. The atexit hook
    # finalizes it.
    core.init(timeout_s=SESSION_TIMEOUT_S)


def clean_env(**extra):
    """The environment for child processes.

    MPI, started as a singleton by init(), adds its own variables to the
    C-level environment of this process; children that inherited them
    would take them for their own job (a nested mpirun exits at once).
    os.environ is Python's copy from before init(), without them.
    """
    return dict(os.environ, **extra)


def run_python(code, timeout=120):
    """Runs `code` in a fresh interpreter; returns (exit status, stdout + stderr)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=HERE, env=clean_env())
    return proc.returncode, proc.stdout + proc.stderr


def mpirun_command(np_):
    require_ranks_mark()
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["-np", str(np_)]


# ---------------------------------------------------------------- life cycle


def test_init_is_idempotent():
    assert core.is_initialized()
    core.init()
    core.init(timeout_s=100)
    assert core.is_initialized()


def test_world_of_one_rank():
    assert core.rank() == 0
    assert core.size() == 1
    assert core.local_rank() == 0
    assert core.local_size() == 1
    assert core.num_hosts() == 1
    handle = core.world_handle()
    assert isinstance(handle, int) and handle > 0


def test_calls_before_init_raise():
    status, out = run_python("""
        import numpy as np
        import tarantella._core as core
        assert not core.is_initialized()
        core.finalize()  # a no-op before init
        calls = [core.rank, core.size, core.local_rank, core.local_size, core.num_hosts,
                 core.world_handle, core.barrier, lambda: core.abort(1),
                 lambda: core.allreduce(np.zeros(2)), lambda: core.broadcast(np.zeros(2)),
                 lambda: core.allgather(np.zeros(1), np.zeros(1)),
                 lambda: core.allgatherv(np.zeros(1), np.zeros(1), [1]),
                 lambda: core.Fusion([(0, 1, "float32")], 0)]
        for call in calls:
            try:
                call()
            except core.TntError as e:
                assert "call tarantella.init() first" in str(e), str(e)
            else:
                raise AssertionError("no error before init")
        print("ok")
        """)
    assert status == 0 and "ok" in out, out


def test_finalize_ends_the_context():
    status, out = run_python("""
        import numpy as np
        import tarantella._core as core
        core.init()
        fusion = core.Fusion([(0, 2, "float32")], 0)
        core.finalize()
        assert not core.is_initialized()
        assert fusion.closed, "finalize closes open fusion sets"
        core.finalize()  # a second finalize is a no-op
        for call in [core.rank, lambda: core.allreduce(np.zeros(2)), core.init]:
            try:
                call()
            except core.TntError as e:
                assert "finalized" in str(e), str(e)
            else:
                raise AssertionError("no error after finalize")
        print("ok")
        """)
    assert status == 0 and "ok" in out, out


def test_exit_without_finalize_is_clean():
    # The atexit hook finalizes MPI, also with a Fusion still open.
    status, out = run_python("""
        import tarantella._core as core
        core.init()
        fusion = core.Fusion([(0, 2, "float32")], 0)
        print("ok")
        """)
    assert status == 0 and "ok" in out, out


def test_init_rejects_a_bad_timeout():
    status, out = run_python("""
        import tarantella._core as core
        for bad in [0, -1.5]:
            try:
                core.init(timeout_s=bad)
            except ValueError as e:
                assert "positive number of seconds" in str(e), str(e)
            else:
                raise AssertionError("bad timeout accepted")
        assert not core.is_initialized()
        core.init(timeout_s=2.5)
        print("ok")
        """)
    assert status == 0 and "ok" in out, out


def test_exception_classes():
    assert issubclass(core.TntError, RuntimeError)
    assert issubclass(core.TntTimeoutError, core.TntError)
    assert issubclass(core.TntTimeoutError, TimeoutError)
    # One class per status a caller may want to catch, each also the fitting
    # built-in exception.
    for cls, also in [(core.TntInvalidArgumentError, ValueError),
                      (core.TntNoMemoryError, MemoryError),
                      (core.TntUnsupportedError, NotImplementedError),
                      (core.TntMismatchError, core.TntError)]:
        assert issubclass(cls, core.TntError) and issubclass(cls, also), cls


def test_libtnt_refusals_raise_with_libtnt_reason():
    # libtnt checks the root itself; its status and reason reach Python.
    with pytest.raises(core.TntInvalidArgumentError) as info:
        core.broadcast(np.zeros(3, np.float32), root=1)
    assert info.value.status == -1
    assert "TNT_ERR_INVALID_ARG" in str(info.value) and "root=1 is not a rank" in str(info.value)
    # A later, unrelated failure carries its own reason, not the earlier one.
    with pytest.raises(core.TntInvalidArgumentError, match="appears more than once") as info:
        core.Fusion([(3, 2, "float32"), (3, 2, "float32")], 0)
    assert "root=1" not in str(info.value)


def test_every_function_has_a_docstring():
    names = ["init", "finalize", "is_initialized", "rank", "size", "local_rank", "local_size",
             "num_hosts", "world_handle", "allreduce", "broadcast", "allgather", "allgatherv",
             "barrier", "abort"]
    for name in names:
        doc = getattr(core, name).__doc__
        assert doc and len(doc) > 10, name
    assert core.Fusion.close.__doc__ and core.Fusion.__doc__ and core.__doc__


# ---------------------------------------------------------------- collectives


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", OPS)
def test_allreduce_in_place(dtype, op):
    a = (np.arange(12) - 3).astype(dtype).reshape(3, 4)
    want = a.copy()
    assert core.allreduce(a, op) is a
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_allreduce_into_out(dtype):
    a = np.arange(5).astype(dtype)
    out = np.zeros_like(a)
    assert core.allreduce(a, "sum", out) is out
    np.testing.assert_array_equal(out, a)
    a.flags.writeable = False  # the input is only read
    core.allreduce(a, op="max", out=out)


def test_allreduce_bfloat16():
    a = np.array([1.5, -2, 3], ml_dtypes.bfloat16)
    core.allreduce(a, "average", dtype="bfloat16")
    np.testing.assert_array_equal(a.astype(np.float32), [1.5, -2, 3])
    # The raw bits of bfloat16 in a uint16 array, as TensorFlow may give them.
    bits = a.view(np.uint16).copy()
    core.allreduce(bits, dtype="bfloat16")
    np.testing.assert_array_equal(bits, a.view(np.uint16))


def test_allreduce_other_buffers():
    b = bytearray(np.arange(4, dtype=np.float32).tobytes())
    core.allreduce(memoryview(b).cast("f"))
    np.testing.assert_array_equal(np.frombuffer(b, np.float32), np.arange(4))
    core.allreduce(np.zeros(0, np.float32))  # empty is fine
    core.allreduce(np.array(2.5))  # so is a 0-d array


@pytest.mark.parametrize("dtype", NUMERIC)
def test_broadcast(dtype):
    a = np.arange(6).astype(dtype)
    assert core.broadcast(a) is a
    assert core.broadcast(a, root=0) is a
    np.testing.assert_array_equal(a, np.arange(6))


def test_broadcast_bfloat16():
    a = np.arange(3).astype(ml_dtypes.bfloat16)
    core.broadcast(a, 0, dtype="bfloat16")
    np.testing.assert_array_equal(a.astype(np.float32), np.arange(3))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_allgather(dtype):
    send = np.arange(4).astype(dtype)
    recv = np.zeros(4, dtype)
    assert core.allgather(send, recv) is recv
    np.testing.assert_array_equal(recv, send)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_allgatherv(dtype):
    send = np.arange(3).astype(dtype)
    recv = np.zeros(3, dtype)
    assert core.allgatherv(send, recv, [3]) is recv
    np.testing.assert_array_equal(recv, send)
    core.allgatherv(send, recv, counts=(np.int64(3),))


def test_barrier():
    assert core.barrier() is None


def test_collectives_release_the_gil():
    # A thread that counts while the main thread is inside libtnt calls.
    stop = threading.Event()
    ticks = []

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        a = np.ones(1 << 20, np.float32)
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            core.allreduce(a)
    finally:
        stop.set()
        t.join()
    assert ticks


# ---------------------------------------------------------------- bad inputs


def raises(exc, fragment, call):
    with pytest.raises(exc) as info:
        call()
    assert fragment in str(info.value), str(info.value)


def test_buffers_that_are_rejected():
    raises(TypeError, "buffer protocol", lambda: core.allreduce([1.0, 2.0]))
    raises(ValueError, "C-contiguous",
           lambda: core.allreduce(np.zeros((4, 4), np.float32)[:, 1]))
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    raises(ValueError, "read-only", lambda: core.allreduce(ro))
    raises(ValueError, "read-only", lambda: core.allreduce(b"abcd"))
    raises(ValueError, "read-only", lambda: core.broadcast(ro))
    for bad in [np.uint16, np.uint32, np.bool_, np.complex64, np.uint64]:
        raises(TypeError, "element format", lambda: core.allreduce(np.zeros(2, bad)))
    raises(TypeError, "byte order", lambda: core.allreduce(np.zeros(2, ">f4")))
    raises(TypeError, "dtype='bfloat16'",
           lambda: core.allreduce(np.zeros(2, ml_dtypes.bfloat16)))
    raises(TypeError, "2-byte elements",
           lambda: core.allreduce(np.zeros(2, np.float32), dtype="bfloat16"))


def test_bad_arguments_of_allreduce():
    a = np.zeros(3, np.float32)
    raises(ValueError, "unknown op 'mean'", lambda: core.allreduce(a, "mean"))
    raises(TypeError, "op must be a string", lambda: core.allreduce(a, 1))
    raises(ValueError, "unknown dtype 'float8'", lambda: core.allreduce(a, dtype="float8"))
    raises(TypeError, "dtype must be a string", lambda: core.allreduce(a, dtype=np.float32))
    raises(TypeError, "out holds float64 but buf holds float32",
           lambda: core.allreduce(a, out=np.zeros(3)))
    raises(ValueError, "out has 4 elements but buf has 3",
           lambda: core.allreduce(a, out=np.zeros(4, np.float32)))
    big = np.zeros(6, np.float32)
    raises(ValueError, "overlaps", lambda: core.allreduce(big[:4], out=big[2:]))
    raises(TypeError, "", lambda: core.allreduce())


def test_bad_arguments_of_broadcast():
    a = np.zeros(3, np.float32)
    raises(ValueError, "root=1 is not a rank", lambda: core.broadcast(a, root=1))
    raises(ValueError, "root=-1 is not a rank", lambda: core.broadcast(a, -1))
    raises(TypeError, "", lambda: core.broadcast(a, root="0"))


def test_bad_arguments_of_allgather():
    send = np.zeros(3, np.float32)
    raises(ValueError, "size() * len(send)",
           lambda: core.allgather(send, np.zeros(4, np.float32)))
    raises(TypeError, "recv holds float64 but send holds float32",
           lambda: core.allgather(send, np.zeros(3)))
    raises(ValueError, "read-only", lambda: core.allgather(send, bytes(12)))
    buf = np.zeros(6, np.float32)
    raises(ValueError, "overlap", lambda: core.allgather(buf[:3], buf[2:5]))


def test_bad_arguments_of_allgatherv():
    send = np.zeros(3, np.float32)
    recv = np.zeros(3, np.float32)
    raises(ValueError, "one per rank", lambda: core.allgatherv(send, recv, [3, 0]))
    raises(ValueError, "counts[0] is 2", lambda: core.allgatherv(send, recv, [2]))
    raises(ValueError, "non-negative", lambda: core.allgatherv(send, recv, [-3]))
    raises(TypeError, "must be an integer", lambda: core.allgatherv(send, recv, [3.0]))
    raises(TypeError, "sequence", lambda: core.allgatherv(send, recv, 3))
    raises(ValueError, "sum(counts)",
           lambda: core.allgatherv(send, np.zeros(5, np.float32), [3]))


# ---------------------------------------------------------------- fusion
# A Fusion's tensors are started and finished by the TensorFlow ops; these
# tests make the same libtnt calls through ctypes (libtnt_calls.py).

FUSED = [(7, 3, "float32"), (3, 2, "float32"), (9, 4, "float64"), (1, 5, "int32"),
         (4, 2, "bfloat16"), (5, 3, "float16"), (6, 2, "int64")]
NP_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
             "int64": np.int64, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TNT_ERR_TIMEOUT = -4


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("threshold", [0, 16, 1 << 20])
def test_fusion_round_trip(op, threshold):
    with core.Fusion(FUSED, threshold, op) as fusion:
        assert fusion.handle > 0
        assert 1 <= fusion.num_buckets <= len(FUSED)
        if threshold == 0:
            assert fusion.num_buckets == len(FUSED)
        calls = FusionCalls(fusion.handle)
        buckets = {tid: calls.bucket_of(tid) for tid, _, _ in FUSED}
        assert set(buckets.values()) == set(range(fusion.num_buckets))
        for step in range(3):
            data = {tid: (np.arange(n) + step - 1).astype(NP_DTYPES[dt]) for tid, n, dt in FUSED}
            for tid, _, _ in reversed(FUSED):
                calls.start(tid, data[tid])
            for tid, n, dt in FUSED:
                np.testing.assert_array_equal(calls.finish(tid, np.zeros(n, NP_DTYPES[dt])),
                                              data[tid])
    assert fusion.closed


def test_fusion_handles_are_distinct_and_default_op_works():
    a = core.Fusion([(0, 4, "float32")], 0)
    b = core.Fusion([(0, 4, "float32")], 0)
    assert a.handle != b.handle
    x = np.arange(4, dtype=np.float32)
    calls = FusionCalls(a.handle)
    calls.start(0, x)
    np.testing.assert_array_equal(calls.finish(0, np.zeros(4, np.float32)), x)
    assert "2 buckets" not in repr(a) and "1 tensors" in repr(a)
    a.close()
    a.close()  # idempotent
    assert "closed" in repr(a)
    del b  # deallocation closes it


@pytest.mark.parametrize("wire,rounded", [("float16", np.float16),
                                         ("bfloat16", ml_dtypes.bfloat16)])
def test_fusion_wire_dtype(wire, rounded):
    # float32 tensors travel in the wire dtype (rounded to nearest even);
    # a float64 tensor of the same set travels exactly.
    x = np.array([1.0, -2.5, 1 / 3, 1e-3, 3e4, 0.0], np.float32)
    y = np.array([1 / 3, 1e300], np.float64)
    with core.Fusion([(0, 6, "float32"), (1, 2, "float64")], 1 << 20, "sum",
                     wire_dtype=wire) as fusion:
        calls = FusionCalls(fusion.handle)
        for _ in range(2):
            calls.start(1, y)
            calls.start(0, x)
            out = calls.finish(0, np.zeros(6, np.float32))
            np.testing.assert_array_equal(out, x.astype(rounded).astype(np.float32))
            assert out[2] != x[2]
            np.testing.assert_array_equal(calls.finish(1, np.zeros(2, np.float64)), y)


def test_fusion_tunes_its_threshold():
    # After 3 warm-up rounds the candidates take turns, twice over, then one
    # deciding round; the plan changes between rounds and results stay
    # exact throughout.
    tensors = [(i, 40000, "float32") for i in range(6)]
    candidates = [32, 128, 512, 2048, 8192]
    with core.Fusion(tensors, 0, "sum", tune_threshold=True) as fusion:
        calls = FusionCalls(fusion.handle)
        seen = []
        for step in range(16):
            seen.append(fusion.threshold_bytes // 1024)
            data = [np.full(40000, step + i, np.float32) for i in range(6)]
            for i in reversed(range(6)):
                calls.start(i, data[i])
            for i in range(6):
                np.testing.assert_array_equal(calls.finish(i, np.zeros(40000, np.float32)),
                                              data[i])
        assert seen[:14] == [32] * 3 + candidates * 2 + [8192]
        assert seen[14] in candidates and seen[15] == seen[14]
        # Buckets close once they hold the threshold.
        buckets, held = 0, 0
        for _ in range(6):
            held += 160000
            if held >= seen[14] * 1024:
                buckets, held = buckets + 1, 0
        assert fusion.num_buckets == buckets + (held > 0)


def test_fusion_readiness_order():
    # Round 0 starts the tensors in reverse; from round 2 on bucket k holds
    # the k-th tensor started in round 0.
    tensors = [(i, 3, "float32") for i in range(4)]
    with core.Fusion(tensors, 0, "sum", order="readiness") as fusion:
        calls = FusionCalls(fusion.handle)
        for step in range(3):
            for i in reversed(range(4)):
                calls.start(i, np.full(3, i + step, np.float32))
            for i in range(4):
                np.testing.assert_array_equal(calls.finish(i, np.zeros(3, np.float32)),
                                              np.full(3, i + step, np.float32))
        assert [calls.bucket_of(i) for i in range(4)] == [3, 2, 1, 0]
    raises(ValueError, "use 'list' or 'readiness'",
           lambda: core.Fusion(tensors, 0, order="ready"))


def test_fusion_overlap():
    # Off: the set says so and results are exact. Tune: on for the 3 warm-up
    # rounds, then on and off take turns twice, the deciding round keeps
    # off, then the master's choice stays; results stay exact throughout.
    tensors = [(i, 5, "float32") for i in range(3)]

    def step(fusion, k):
        calls = FusionCalls(fusion.handle)
        for i in reversed(range(3)):
            calls.start(i, np.full(5, i + k, np.float32))
        for i in range(3):
            np.testing.assert_array_equal(calls.finish(i, np.zeros(5, np.float32)),
                                          np.full(5, i + k, np.float32))

    with core.Fusion(tensors, 0, "sum", overlap="off") as fusion:
        assert not fusion.overlaps
        step(fusion, 0)
    with core.Fusion(tensors, 0, "sum", overlap="auto") as fusion:
        seen = []
        for k in range(10):
            seen.append(fusion.overlaps)
            step(fusion, k)
        assert seen[:8] == [True, True, True, True, False, True, False, False]
        assert seen[8] == seen[9] == fusion.overlaps
    raises(ValueError, "overlap 'tune': use 'on', 'off' or 'auto'",
           lambda: core.Fusion(tensors, 0, overlap="tune"))


def test_fusion_bad_wire_dtype():
    raises(ValueError, "float16 or bfloat16",
           lambda: core.Fusion([(0, 2, "float32")], 0, wire_dtype="int32"))
    raises(ValueError, "unknown dtype 'fp8'",
           lambda: core.Fusion([(0, 2, "float32")], 0, wire_dtype="fp8"))
    raises(TypeError, "at most 4 positional",
           lambda: core.Fusion([(0, 2, "float32")], 0, "sum", None, "float16"))
    with core.Fusion([(0, 2, "float32")], 0, wire_dtype="float32") as fusion:
        calls = FusionCalls(fusion.handle)
        x = np.array([1 / 3, 2.0], np.float32)
        calls.start(0, x)
        np.testing.assert_array_equal(calls.finish(0, np.zeros(2, np.float32)), x)


def test_fusion_modes():
    # On one rank every part is the whole tensor: the reduce-scatter set
    # finishes whole tensors and the allgather set takes them.
    sets = {mode: core.Fusion(FUSED, 16, "sum", mode=mode)
            for mode in ("allreduce", "reduce_scatter", "allgather")}
    for mode, fusion in sets.items():
        assert fusion.mode == mode
        assert fusion.num_buckets == sets["allreduce"].num_buckets
        assert [fusion.part(tid) for tid, _, _ in FUSED] == [(0, n) for _, n, _ in FUSED]
    rs, ag = FusionCalls(sets["reduce_scatter"].handle), FusionCalls(sets["allgather"].handle)
    for step in range(2):
        data = {tid: (np.arange(n) + step).astype(NP_DTYPES[dt]) for tid, n, dt in FUSED}
        for tid, _, _ in FUSED:
            rs.start(tid, data[tid])
        for tid, n, dt in FUSED:
            part = rs.finish(tid, np.zeros(n, NP_DTYPES[dt]))
            ag.start(tid, part)
        for tid, n, dt in FUSED:
            np.testing.assert_array_equal(ag.finish(tid, np.zeros(n, NP_DTYPES[dt])), data[tid])
    for fusion in sets.values():
        fusion.close()
    raises(ValueError, "use 'allreduce', 'reduce_scatter' or 'allgather'",
           lambda: core.Fusion(FUSED, 0, mode="scatter"))
    raises(ValueError, "tune_threshold to 0",
           lambda: core.Fusion(FUSED, 0, mode="reduce_scatter", tune_threshold=True))
    raises(ValueError, "order to TNT_FUSION_ORDER_LIST",
           lambda: core.Fusion(FUSED, 0, mode="allgather", order="readiness"))
    with core.Fusion(FUSED, 0, mode="reduce_scatter") as fusion:
        raises(ValueError, "not in the fusion set", lambda: fusion.part(99))
        raises(TypeError, "integer", lambda: fusion.part("7"))
    raises(core.TntError, "closed", lambda: fusion.part(7))


def test_fusion_of_no_tensors():
    fusion = core.Fusion([], 1024)
    assert fusion.num_buckets == 0
    assert FusionCalls(fusion.handle).bucket_of(0) == -1
    fusion.close()


def test_fusion_bad_lists():
    raises(TypeError, "must be a tuple (id, count, dtype)",
           lambda: core.Fusion([(1, 2)], 0))
    raises(TypeError, "must be a tuple (id, count, dtype)", lambda: core.Fusion([5], 0))
    raises(TypeError, "list of (id, count, dtype)", lambda: core.Fusion(5, 0))
    raises(ValueError, "appears more than once",
           lambda: core.Fusion([(1, 2, "float32"), (1, 3, "float64")], 0))
    raises(ValueError, "unknown dtype 'float8'", lambda: core.Fusion([(1, 2, "float8")], 0))
    raises(TypeError, "dtype must be a name", lambda: core.Fusion([(1, 2, None)], 0))
    raises(ValueError, "non-negative", lambda: core.Fusion([(1, -2, "float32")], 0))
    raises(ValueError, "the id must be in", lambda: core.Fusion([(-1, 2, "float32")], 0))
    raises(TypeError, "the id must be an integer", lambda: core.Fusion([("a", 2, "float32")], 0))
    raises(ValueError, "threshold_bytes must be a non-negative",
           lambda: core.Fusion([(1, 2, "float32")], -1))
    raises(ValueError, "unknown op", lambda: core.Fusion([(1, 2, "float32")], 0, "mean"))


def test_fusion_calls_out_of_order():
    fusion = core.Fusion([(1, 4, "float32"), (2, 2, "bfloat16")], 0)
    calls = FusionCalls(fusion.handle)
    x = np.zeros(4, np.float32)
    assert calls.bucket_of(99) == -1
    raises(LibtntError, "tensor 1 was not started", lambda: calls.finish(1, x))
    calls.start(1, x)
    raises(LibtntError, "tensor 1 was started already in this round", lambda: calls.start(1, x))
    calls.finish(1, x)
    fusion.close()


def test_fusion_finish_times_out_and_can_be_retried():
    # Both tensors share a bucket, which is reduced once both have started.
    fusion = core.Fusion([(1, 2, "float32"), (2, 2, "float32")], 1 << 20)
    assert fusion.num_buckets == 1
    calls = FusionCalls(fusion.handle)
    a = np.ones(2, np.float32)
    calls.start(1, a)
    with pytest.raises(LibtntError) as info:
        calls.finish(1, np.zeros(2, np.float32), timeout_s=0.2)
    assert "every rank must start every tensor" in str(info.value)
    assert info.value.status == TNT_ERR_TIMEOUT
    assert calls.context_status() == 0  # the context is still healthy
    calls.start(2, a * 2)
    np.testing.assert_array_equal(calls.finish(1, np.zeros(2, np.float32)), a)
    np.testing.assert_array_equal(calls.finish(2, np.zeros(2, np.float32)), a * 2)
    fusion.close()


def test_fusion_round_ends_when_the_whole_bucket_finished():
    fusion = core.Fusion([(1, 2, "float32"), (2, 2, "float32")], 1 << 20)
    calls = FusionCalls(fusion.handle)
    one, two = np.ones(2, np.float32), np.full(2, 2, np.float32)
    calls.start(1, one)
    calls.start(2, two)
    calls.finish(1, np.zeros(2, np.float32))
    # Tensor 2 has not finished round 1: tensor 1 cannot start round 2 yet.
    raises(LibtntError, "started already in this round", lambda: calls.start(1, one))
    calls.finish(2, np.zeros(2, np.float32))
    calls.start(1, one)
    fusion.close()


def test_fusion_finish_waits_for_a_start_in_another_thread():
    # A thread waits in finish() for a bucket that this thread completes.
    fusion = core.Fusion([(1, 2, "float32"), (2, 2, "float32")], 1 << 20)
    calls = FusionCalls(fusion.handle)
    one, two = np.ones(2, np.float32), np.full(2, 2, np.float32)
    calls.start(1, one)
    results = []

    def finish_one():
        begin = time.monotonic()
        out = calls.finish(1, np.zeros(2, np.float32))
        results.append((time.monotonic() - begin, out))

    t = threading.Thread(target=finish_one)
    t.start()
    time.sleep(0.3)
    calls.start(2, two)
    t.join()
    waited, out = results[0]
    assert 0.2 < waited < SESSION_TIMEOUT_S
    np.testing.assert_array_equal(out, one)
    calls.finish(2, np.zeros(2, np.float32))
    fusion.close()
    assert core.is_initialized()


# ---------------------------------------------------------------- multi-rank

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")


@needs_mpirun
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.ranks
def test_across_ranks(ranks):
    cmd = mpirun_command(ranks) + [sys.executable, os.path.join(HERE, "mpi_core_check.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=clean_env(TNT_TIMEOUT_S="20"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"every check passed on {ranks} ranks" in out, out


@needs_mpirun
@pytest.mark.ranks
def test_timeout_names_the_missing_peer():
    cmd = mpirun_command(2) + [sys.executable, os.path.join(HERE, "mpi_core_check.py"),
                               "timeout"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=clean_env())
    out = proc.stdout + proc.stderr
    assert "rank 0 got: allreduce failed: TNT_ERR_TIMEOUT" in out, out
    assert proc.returncode == 3, out
