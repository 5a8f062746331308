"""Checks tarantella._core across ranks; run it under mpirun.

    mpirun -np 3 python3 tests/python/mpi_core_check.py          # every check
    mpirun -np 2 python3 tests/python/mpi_core_check.py timeout  # a missing peer

Every rank checks its own results. The exit status is 0 when every check
passed on every rank, 1 when a check failed. In the "timeout" mode only rank 0
enters an allreduce: it must get a TntTimeoutError that names rank 1,
and then ends the job with abort(3), the status the test driver expects
(abort(4) when the error was not the expected one).
"""
import sys
import threading
import time
import traceback

import ml_dtypes
import numpy as np

import tarantella._core as core
from libtnt_calls import FusionCalls

FLOAT_DTYPES = [np.float32, np.float64, np.float16]
INT_DTYPES = [np.int32, np.int64]


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {core.rank()}: {what}")


def check_equal(got, want, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape and np.array_equal(got, want),
          f"{what}: got {got.tolist()}, want {want.tolist()}")


def check_ranks(rank, size):
    ranks = np.full(1, rank, np.int64)
    everyone = np.zeros(size, np.int64)
    core.allgather(ranks, everyone)
    check_equal(everyone, np.arange(size), "allgather of the ranks")
    check(0 <= core.local_rank() < core.local_size() <= size, "local rank and size")
    check(1 <= core.num_hosts() <= size, "number of hosts")
    check(core.world_handle() > 0, "world handle")


def check_allreduce(rank, size):
    # Small integers are exact in every dtype, float16 and bfloat16 included.
    mean = (size + 1) / 2
    for dt in FLOAT_DTYPES:
        a = np.full(7, rank + 1, dt)
        core.allreduce(a, "average")
        check_equal(a, np.full(7, mean), f"average of {np.dtype(dt).name}")
    bf = np.full(5, rank + 1, ml_dtypes.bfloat16)
    core.allreduce(bf, "average", dtype="bfloat16")
    check_equal(bf.astype(np.float32), np.full(5, mean), "average of bfloat16")
    for dt in INT_DTYPES:
        a = np.arange(6, dtype=dt) + rank
        out = np.zeros_like(a)
        result = core.allreduce(a, "sum", out=out)
        check(result is out, "allreduce returns out")
        check_equal(out, size * np.arange(6) + size * (size - 1) // 2,
                    f"sum of {np.dtype(dt).name}")
        check_equal(a, np.arange(6) + rank, "allreduce with out leaves buf alone")
        core.allreduce(a, "max")
        check_equal(a, np.arange(6) + size - 1, f"max of {np.dtype(dt).name}")
        b = np.arange(6, dtype=dt) - rank
        core.allreduce(b, "min")
        check_equal(b, np.arange(6) - (size - 1), f"min of {np.dtype(dt).name}")
    # A size that takes the bandwidth algorithms rather than the small path.
    big = np.full(1 << 18, rank + 1, np.float32)
    core.allreduce(big, "average")
    check_equal(big[[0, -1]], [mean, mean], "average of 1 MiB")


def check_broadcast(rank, size):
    root = 1 if size > 1 else 0
    for dt in FLOAT_DTYPES + INT_DTYPES:
        want = np.arange(9, dtype=dt) * 7
        a = want.copy() if rank == root else np.zeros(9, dt)
        core.broadcast(a, root=root)
        check_equal(a, want, f"broadcast of {np.dtype(dt).name} from rank {root}")
    bf = (np.arange(4) + 1).astype(ml_dtypes.bfloat16)
    got = bf.copy() if rank == root else np.zeros(4, ml_dtypes.bfloat16)
    core.broadcast(got, root, dtype="bfloat16")
    check_equal(got.astype(np.float32), np.arange(4) + 1, "broadcast of bfloat16")


def check_allgatherv(rank, size):
    counts = [r + 1 for r in range(size)]
    send = np.full(rank + 1, rank, np.float64)
    recv = np.zeros(sum(counts), np.float64)
    core.allgatherv(send, recv, counts)
    want = np.concatenate([np.full(r + 1, r) for r in range(size)])
    check_equal(recv, want, "allgatherv")


def check_fusion(rank, size):
    tensors = [(10, 3, "float32"), (11, 5, "float32"), (12, 4, "float64"),
               (13, 1, "float32"), (14, 6, "int64"), (15, 2, "bfloat16")]
    dtypes = {"float32": np.float32, "float64": np.float64, "int64": np.int64,
              "bfloat16": ml_dtypes.bfloat16}
    # 16 bytes: some buckets hold more than one tensor.
    with core.Fusion(tensors, 16, "average") as fusion:
        check(fusion.num_buckets >= 4, f"{fusion.num_buckets} buckets")
        calls = FusionCalls(fusion.handle)
        # Ranks start their tensors in different orders; libtnt must still
        # reduce the buckets in the same order everywhere.
        order = tensors if rank % 2 == 0 else tensors[::-1]
        for step in range(3):
            for tid, count, dtype in order:
                value = (rank + 1) * (step + 1) * 2
                calls.start(tid, np.full(count, value, dtypes[dtype]))
            for tid, count, dtype in tensors:
                out = calls.finish(tid, np.zeros(count, dtypes[dtype]))
                want = (step + 1) * (size + 1)
                check_equal(out.astype(np.float64), np.full(count, want),
                            f"fusion tensor {tid} ({dtype}) in round {step}")
    check(fusion.closed, "Fusion closed by the with block")

    # Every rank must detect a list that differs between ranks.
    try:
        core.Fusion([(1, 4 + rank, "float32")], 0)
    except core.TntMismatchError as e:
        check("disagree" in str(e), f"mismatched Fusion message: {e}")
    else:
        check(size == 1, "a Fusion whose list differs between ranks was created")


def check_fusion_modes(rank, size):
    # The parts of a reduce-scatter set and an allgather set made with the
    # same list and threshold agree and tile every tensor; the reduce-scatter
    # gives each rank its part of the allreduce's result bit for bit, and
    # gathering the parts gives the allreduce's tensors.
    tensors = [(20, 37, "float32"), (21, 1, "float32"), (22, 100, "float64"), (23, 40, "float32")]
    rng = np.random.default_rng(rank)
    data = {tid: rng.standard_normal(n).astype(dt) for tid, n, dt in tensors}
    sets = [core.Fusion(tensors, 64, "average", mode=mode)
            for mode in ("allreduce", "reduce_scatter", "allgather")]
    ar, rs, ag = (FusionCalls(f.handle) for f in sets)
    for tid, n, dt in tensors:
        lo, hi = sets[0].part(tid)
        check(sets[1].part(tid) == sets[2].part(tid) == (lo, hi), f"parts of tensor {tid}")
        total = np.array([hi - lo], np.int64)
        core.allreduce(total, "sum")
        check(total[0] == n, f"the parts of tensor {tid} hold {total[0]} of {n} elements")
        ar.start(tid, data[tid])
        rs.start(tid, data[tid])
    wholes = {}
    for tid, n, dt in tensors:
        lo, hi = sets[0].part(tid)
        wholes[tid] = ar.finish(tid, np.zeros(n, dt))
        part = rs.finish(tid, np.zeros(hi - lo, dt))
        check_equal(part.view(np.uint8), wholes[tid][lo:hi].view(np.uint8),
                    f"part of tensor {tid}")
        ag.start(tid, part)
    for tid, n, dt in tensors:
        check_equal(ag.finish(tid, np.zeros(n, dt)).view(np.uint8), wholes[tid].view(np.uint8),
                    f"gathered tensor {tid}")
    for f in sets:
        f.close()


def check_finalize_waits_for_calls(rank, size):
    # finalize() must not end the context under a call that another thread
    # is still making: here a barrier that waits for rank 0.
    if rank == 0:
        time.sleep(1.0)
        core.barrier()
        return
    waiting = threading.Thread(target=core.barrier)
    waiting.start()
    time.sleep(0.2)
    try:
        core.finalize()
    except core.TntError as e:
        check("still running in other threads" in str(e), f"finalize message: {e}")
    else:
        check(False, "finalize ended the context under a running barrier")
    waiting.join()
    check(core.is_initialized(), "the context survives the refused finalize")


def run_checks():
    core.init()
    rank, size = core.rank(), core.size()
    check_ranks(rank, size)
    check_allreduce(rank, size)
    check_broadcast(rank, size)
    check_allgatherv(rank, size)
    check_fusion(rank, size)
    check_fusion_modes(rank, size)
    check_finalize_waits_for_calls(rank, size)
    core.barrier()
    if rank == 0:
        print(f"mpi_core_check: every check passed on {size} ranks", flush=True)
    core.finalize()


def run_timeout():
    core.init(timeout_s=2)
    if core.rank() != 0:
        # The missing peers: they wait for rank 0 to end the job.
        time.sleep(60)
        core.abort(4)
    try:
        core.allreduce(np.ones(16, np.float32))
    except core.TntTimeoutError as e:
        print(f"rank 0 got: {e}", flush=True)
        ok = "rank 1" in str(e) and "rank 1" in e.context_error
        core.abort(3 if ok else 4)
    core.abort(4)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "checks"
    try:
        if mode == "timeout":
            run_timeout()
        else:
            run_checks()
    except Exception:  # noqa: BLE001 - every failure becomes the exit status
        traceback.print_exc()
        sys.stderr.flush()
        if core.is_initialized() and core.size() > 1:
            core.abort(1)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
