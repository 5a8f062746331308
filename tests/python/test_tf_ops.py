"""Tests of Tarantella's TensorFlow ops (libtnt_tf_ops.so).

What needs no libtnt context (op definitions, shape inference, argument
errors, handles that do not exist) is tested in this process. What
communicates runs mpi_tf_ops_check.py in a fresh process, because MPI can
be started only once per process and other test modules finalize it: at 1
rank as a plain process, at 2 ranks under mpirun.

The op library is $TNT_TF_OPS_LIBRARY, else libtnt_tf_ops.so of the
installed tarantella package; without it the tests are skipped. From a
build tree:

    TNT_TF_OPS_LIBRARY=build-tfops/src/tf_ops/libtnt_tf_ops.so \\
        python3 -m pytest tests/python/test_tf_ops.py
"""
import os
import subprocess
import sys

import pytest

tf = pytest.importorskip("tensorflow")

import mpi_tf_ops_check as check  # noqa: E402
from conftest import require_ranks_mark  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mpi_tf_ops_check.py")
OPS_PATH = check.op_library_path()

pytestmark = pytest.mark.skipif(
    OPS_PATH is None or not os.path.exists(OPS_PATH),
    reason=f"the op library is not built ({OPS_PATH or 'no tarantella package'}): install "
           "the package or set TNT_TF_OPS_LIBRARY to build/src/tf_ops/libtnt_tf_ops.so")

OP_NAMES = ["TntFusionStart", "TntFusionFinish", "TntAllreduce", "TntBroadcast",
            "TntAllgatherv"]
NO_SUCH_HANDLE = 987654321


@pytest.fixture(scope="module")
def ops():
    return tf.load_op_library(os.path.abspath(OPS_PATH))


def run_checks(nranks, *checks, env=None, timeout=300):
    """Runs mpi_tf_ops_check.py with `checks` on `nranks` ranks."""
    cmd = [sys.executable, SCRIPT, *checks]
    if nranks > 1:
        require_ranks_mark()
        mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(nranks)]
        if os.geteuid() == 0:
            mpirun.append("--allow-run-as-root")
        cmd = mpirun + cmd
    # os.environ is Python's copy of the environment, without what MPI may
    # have added to this process if another test module started it.
    full_env = dict(os.environ, TNT_TF_OPS_LIBRARY=os.path.abspath(OPS_PATH),
                    TNT_TIMEOUT_S="60", TF_CPP_MIN_LOG_LEVEL="2")
    full_env.update(env or {})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=HERE)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s:\n{e.stdout}\n{e.stderr}")
    return proc


def assert_checks_pass(nranks, *checks, env=None):
    proc = run_checks(nranks, *checks, env=env)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"checks {checks} at {nranks} ranks exited with {proc.returncode}:\n"
                    f"{output[-8000:]}")
    for name in checks:
        assert proc.stdout.count(f" {name}: OK") == nranks, output[-8000:]
    return proc.stdout


# ------------------------------------------------------ in this process


def test_ops_are_registered_and_stateless(ops):
    with tf.Graph().as_default() as graph:
        x = tf.ones([4])
        token = ops.tnt_fusion_start(x, 1.0, fusion=1, tensor_id=0, count=4)
        ops.tnt_fusion_finish(token, x, 1.0, fusion=1, tensor_id=0, count=4)
        ops.tnt_allreduce(x, group=1, op="sum")
        ops.tnt_broadcast(x, group=1, root=0)
        ops.tnt_allgatherv(x, group=1, counts=[4])
    defs = {op.type: op.op_def for op in graph.get_operations() if op.type.startswith("Tnt")}
    assert sorted(defs) == sorted(OP_NAMES)
    # Stateful ops would be chained in program order inside a tf.function,
    # and the starts would no longer overlap backprop.
    assert not any(d.is_stateful for d in defs.values())


def test_shape_inference(ops):
    @tf.function(jit_compile=False)
    def graph(x):
        token = ops.tnt_fusion_start(x, 1.0, fusion=1, tensor_id=0, count=6)
        out = ops.tnt_fusion_finish(token, x, 1.0, fusion=1, tensor_id=0, count=6)
        reduced = ops.tnt_allreduce(x, group=1, op="average")
        broadcast = ops.tnt_broadcast(x, group=1, root=0)
        gathered = ops.tnt_allgatherv(tf.reshape(x, [-1]), group=1, counts=[6])
        return token, out, reduced, broadcast, gathered

    token, out, reduced, broadcast, gathered = graph.get_concrete_function(
        tf.TensorSpec([None, 3], tf.float64)).structured_outputs
    assert token.shape.rank == 0 and token.dtype == tf.int64
    assert gathered.shape.as_list() == [None] and gathered.dtype == tf.float64
    for t in (out, reduced, broadcast):
        assert t.shape.as_list() == [None, 3] and t.dtype == tf.float64

    @tf.function(jit_compile=False)
    def vector_token(x):
        return ops.tnt_fusion_finish(tf.constant([1, 2], tf.int64), x, 1.0, fusion=1, tensor_id=1,
                                     count=2)

    with pytest.raises(ValueError, match="rank"):
        vector_token.get_concrete_function(tf.TensorSpec([2], tf.float32))


def test_types_and_attributes_are_checked(ops):
    with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
        ops.tnt_allreduce(tf.constant([1, 2], tf.uint16), group=1, op="sum")
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        ops.tnt_allreduce(tf.constant([1.0]), group=1, op="prod")
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        ops.tnt_fusion_start(tf.constant([1.0]), 1.0, fusion=1, tensor_id=-1, count=1)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_count_mismatch_names_both_counts(ops, in_function):
    def start(x):
        return ops.tnt_fusion_start(x, 1.0, fusion=NO_SUCH_HANDLE, tensor_id=3, count=6)

    fn = tf.function(start, jit_compile=False) if in_function else start
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="tensor 3 has 4 elements, but its fusion set expects count=6"):
        fn(tf.ones([2, 2]))


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_unknown_fusion_handle(ops, in_function):
    message = (f"fusion set {NO_SUCH_HANDLE} does not exist: create the model's fusion set "
               "before running the graph")

    def start(x):
        return ops.tnt_fusion_start(x, 1.0, fusion=NO_SUCH_HANDLE, tensor_id=0, count=4)

    def finish(x):
        return ops.tnt_fusion_finish(tf.constant(0, tf.int64), x, 1.0, fusion=NO_SUCH_HANDLE,
                                     tensor_id=0, count=4)

    for fn in (start, finish):
        fn = tf.function(fn, jit_compile=False) if in_function else fn
        with pytest.raises(tf.errors.FailedPreconditionError, match=message):
            fn(tf.ones([4]))


def test_unknown_group_handle(ops):
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=f"group {NO_SUCH_HANDLE} does not exist"):
        ops.tnt_allreduce(tf.ones([4]), group=NO_SUCH_HANDLE, op="sum")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=f"group {NO_SUCH_HANDLE} does not exist"):
        ops.tnt_broadcast(tf.ones([4]), group=NO_SUCH_HANDLE, root=0)


# --------------------------------------------- with a context, 1 rank


def test_round_trip_of_gradients_in_a_function():
    assert_checks_pass(1, "round_trip")


@pytest.mark.ranks
def test_scaling_in_libtnt_equals_tensorflows_bitwise():
    assert_checks_pass(3, "scaled")


@pytest.mark.ranks
def test_reduce_scatter_and_allgather_sets():
    assert_checks_pass(3, "modes")


def test_errors_with_a_fusion_set():
    assert_checks_pass(1, "errors")


def test_allreduce_and_broadcast_one_rank():
    assert_checks_pass(1, "collectives")


def test_communication_overlaps_backprop():
    """See check_overlap in mpi_tf_ops_check.py for how it is measured."""
    out = assert_checks_pass(1, "overlap")
    print("".join(line + "\n" for line in out.splitlines() if line.startswith("overlap:")))


# ------------------------------------------------------------- 2 ranks


@pytest.mark.ranks
def test_two_ranks_start_in_different_orders():
    assert_checks_pass(2, "ranks", "collectives")


@pytest.mark.ranks
def test_two_ranks_failure_reaches_tensorflow():
    # The check ends both processes without finalizing MPI after a failed
    # context, so mpirun reports an improper exit: the result is in the output.
    proc = run_checks(2, "failure", env={"TNT_TIMEOUT_S": "3"}, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.stdout.count(" failure: OK") == 2, output[-8000:]
    assert "the communication context failed: allreduce of fusion bucket 0" in output
