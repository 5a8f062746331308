"""The original Tarantella's collectives tests (tensor_allreducer_test.py,
tensor_broadcaster_test.py, tensor_allgatherer_test.py), in Keras 3
spelling, with their empty and int16 cases, and every dtype the original
accepted on all three collectives.

pytest runs this file on every rank at once (test_original_collectives.py
launches it): every rank runs the same cases in the same order, so their
collectives meet.
"""
import math

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import tarantella as tnt

tnt.init()

# Every dtype the original accepted, with ml_dtypes' bfloat16.
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16, np.float32, np.float64,
          ml_dtypes.bfloat16]


def same_random_int_all_ranks(low, high):
    value = np.array([np.random.randint(low, high)], dtype=np.int64)
    return int(tnt.TensorBroadcaster(value, 0).broadcast(value if tnt.get_rank() == 0 else None)[0])


# ------------------------------------------------------------ allreduce

@pytest.mark.parametrize("array_length", [0, 8, 35, 67])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_single_array_identical_inputs(array_length, dtype):
    input_array = np.ones(shape=(array_length, 1), dtype=dtype)
    expected_output_array = input_array * tnt.get_size()

    allreducer = tnt.TensorAllreducer(input_array)
    output_array = allreducer.allreduce(input_array)

    assert isinstance(output_array, np.ndarray)
    assert output_array.shape == expected_output_array.shape
    assert output_array.dtype == expected_output_array.dtype
    assert np.array_equal(output_array, expected_output_array)


@pytest.mark.parametrize("array_length", [11, 44, 81])
def test_single_array_different_inputs(array_length):
    input_array = np.empty(shape=(array_length, 1), dtype=np.float32)
    input_array.fill(tnt.get_rank())
    expected_output_array = np.full(input_array.shape, sum(range(tnt.get_size())), np.float32)

    output_array = tnt.TensorAllreducer(input_array).allreduce(input_array)

    assert isinstance(output_array, np.ndarray)
    assert np.array_equal(output_array, expected_output_array)


@pytest.mark.parametrize("list_length", [0, 1, 5, 12])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_list_of_arrays_identical_inputs(list_length, dtype):
    input_array = np.ones(shape=(50, 1), dtype=dtype)
    input_list = [input_array for _ in range(list_length)]
    expected_output_array = input_array * tnt.get_size()

    output_list = tnt.TensorAllreducer(input_list).allreduce(input_list)

    assert isinstance(output_list, list)
    assert len(output_list) == list_length
    assert all(np.array_equal(array, expected_output_array) for array in output_list)


def test_list_of_arrays_identical_inputs_diff_types():
    input_list = [np.ones(shape=(238, 1), dtype=np.float32),
                  np.ones(shape=(42, 1), dtype=np.double),
                  np.ones(shape=(99, 1), dtype=np.float32)]
    expected_output_list = [array * tnt.get_size() for array in input_list]

    output_list = tnt.TensorAllreducer(input_list).allreduce(input_list)

    assert isinstance(output_list, list)
    assert all(np.array_equal(out, expected)
               for out, expected in zip(output_list, expected_output_list))


@pytest.mark.parametrize("length", [0, 5, 56, 89])
def test_dict_many_keys(length):
    input_value = 4.2
    input_dict = dict.fromkeys(("key " + str(i) for i in range(length)), input_value)
    expected_output_value = input_value * tnt.get_size()

    output_dict = tnt.TensorAllreducer(input_dict).allreduce(input_dict)

    assert isinstance(output_dict, dict)
    assert len(input_dict) == len(output_dict)
    assert all(v == expected_output_value for v in output_dict.values())


def test_dict_varying_values():
    input_2d = np.full(shape=(4, 5), fill_value=3.29, dtype=np.float32)
    input_3d = np.full(shape=(2, 15, 4), fill_value=17.0, dtype=np.float64)
    input_dict = {"list_of_tensors": [input_2d, input_2d, input_2d], "single_tensor": input_3d}

    output_dict = tnt.TensorAllreducer(input_dict).allreduce(input_dict)

    assert isinstance(output_dict, dict)
    assert len(output_dict) == 2
    assert len(output_dict["list_of_tensors"]) == 3
    assert all(np.array_equal(array, tnt.get_size() * input_2d)
               for array in output_dict["list_of_tensors"])
    assert np.array_equal(output_dict["single_tensor"], tnt.get_size() * input_3d)


def test_single_value():
    inputs = float(tnt.get_rank())
    output = tnt.TensorAllreducer(inputs).allreduce(inputs)
    assert isinstance(output, float)
    assert output == sum(range(tnt.get_size()))


def test_single_array_empty():
    """Empty in, empty out: the same shape and dtype."""
    input_array = np.empty(shape=(0, 3), dtype=np.float32)
    output_array = tnt.TensorAllreducer(input_array).allreduce(input_array)
    assert isinstance(output_array, np.ndarray)
    assert output_array.shape == (0, 3) and output_array.dtype == np.float32


@pytest.mark.parametrize("empty", [[], {}, (), {"a": []}, [[], {}]])
def test_empty_structures_come_back_as_they_went(empty):
    for collective in (tnt.TensorAllreducer(empty).allreduce,
                       tnt.TensorAllgatherer(empty).allgather):
        assert collective(empty) == empty
        assert type(collective(empty)) is type(empty)
    caster = tnt.TensorBroadcaster(empty, 0)
    out = caster.broadcast(empty) if tnt.get_rank() == 0 else caster.broadcast()
    assert out == empty and type(out) is type(empty)


def test_unsupported_type():
    with pytest.raises(TypeError):
        tnt.TensorAllreducer("sample input")


@pytest.mark.parametrize("input_value, dtype", [(4.67, np.float32),
                                                (4.00000067, np.double),
                                                (-42111, np.int32),
                                                (42, np.int16)])
def test_tensor_numeric(input_value, dtype):
    expected_value = tf.constant(input_value, dtype=dtype) * tnt.get_size()
    value = tf.constant(input_value, dtype=dtype)

    output = tnt.TensorAllreducer(value).allreduce(value)

    assert tf.is_tensor(output)
    assert output.dtype == value.dtype
    assert output == expected_value


@pytest.mark.parametrize("input_shape", [(6,), (11, 12), (4, 5, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_nd_tensor(input_shape, dtype):
    input_array = np.ones(shape=input_shape, dtype=dtype)
    output = tnt.TensorAllreducer(tf.constant(input_array)).allreduce(tf.constant(input_array))
    assert tf.is_tensor(output)
    assert np.array_equal(output.numpy(), input_array * tnt.get_size())


@pytest.mark.parametrize("input_dict", [
    {"a": tf.constant(22.610077, dtype=np.float32),
     "b": tf.constant(1.000610077, dtype=np.float64)},
    {"a": tf.constant(-31222, dtype=np.int16), "b": tf.constant(55000111, dtype=np.int32)}])
def test_dict_of_tensors(input_dict):
    # TensorFlow's product wraps int16 around as libtnt's sum does:
    # -31222 * 3 ranks is -28130 in int16.
    expected_dict = {k: v * tnt.get_size() for k, v in input_dict.items()}

    output_dict = tnt.TensorAllreducer(input_dict).allreduce(input_dict)

    assert all(tf.is_tensor(v) for v in output_dict.values())
    assert output_dict == expected_dict


@pytest.mark.parametrize("special, found", [(math.nan, np.isnan), (math.inf, np.isinf)],
                         ids=["nan", "inf"])
@pytest.mark.parametrize("array_length, index", [(35, 12), (12, 7), (78, 3)])
def test_array_nan_and_inf(special, found, array_length, index):
    injection_rank = same_random_int_all_ranks(0, tnt.get_size())
    input_array = np.ones(shape=(array_length, 1), dtype=np.float32)
    if tnt.get_rank() == injection_rank:
        input_array[index] = special
    output_array = tnt.TensorAllreducer(input_array).allreduce(input_array)
    assert found(output_array[index])


# ------------------------------------- every dtype on every collective

def rank_values(dtype, rank, n=37):
    """Rank `rank`'s contribution: small integers, so that every sum over a
    few ranks is exact in every dtype (bfloat16 holds integers to 256)."""
    base = (np.arange(n) * 7 + rank * 3) % 11
    return base.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "average", "min", "max"])
def test_allreduce_every_dtype(dtype, op):
    mine = rank_values(dtype, tnt.get_rank())
    every = np.stack([rank_values(np.float64, r) for r in range(tnt.get_size())])
    # The exact result, from float64 (exact for these small integers), in
    # the dtype: integers divide with truncation, as documented.
    if op == "average" and np.issubdtype(np.dtype(dtype), np.integer):
        want = np.trunc(every.sum(axis=0) / tnt.get_size()).astype(dtype)
    else:
        want = {"sum": every.sum(axis=0), "average": every.sum(axis=0) / tnt.get_size(),
                "min": every.min(axis=0), "max": every.max(axis=0)}[op].astype(dtype)

    for value in (mine, tf.constant(mine)):
        got = tnt.TensorAllreducer(value, reduction_op=op).allreduce(value)
        got = got.numpy() if tf.is_tensor(got) else got
        assert got.dtype == np.dtype(dtype)
        assert np.array_equal(got, want), (got, want)


def test_int16_sums_wrap_around_as_numpy_does():
    mine = np.array([32767, -32768, 1000], dtype=np.int16)
    got = tnt.TensorAllreducer(mine).allreduce(mine)
    want = np.sum(np.stack([mine] * tnt.get_size()), axis=0, dtype=np.int16)
    assert got.dtype == np.int16 and np.array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("length", [0, 5])
def test_broadcast_every_dtype(dtype, length):
    root = tnt.get_size() - 1
    values = rank_values(dtype, 100, length)
    caster = tnt.TensorBroadcaster(values, root)
    got = caster.broadcast(values) if tnt.get_rank() == root else caster.broadcast()
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, values)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allgather_every_dtype(dtype):
    # Rank r gives r elements (rank 0 none): uneven and empty parts.
    mine = rank_values(dtype, tnt.get_rank(), tnt.get_rank())
    got = tnt.TensorAllgatherer(mine).allgather(mine)
    want = np.concatenate([rank_values(dtype, r, r) for r in range(tnt.get_size())])
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)


# ------------------------------------------------------------ broadcast

@pytest.mark.parametrize("array_shape", [(1), (5, 7), (3, 2, 4)])
def test_broadcast_single_array(array_shape):
    np.random.seed(42)
    input_array = np.random.random_sample(array_shape).astype("float32")
    root_rank = tnt.get_size() - 1
    broadcaster = tnt.TensorBroadcaster(input_array, root_rank)

    if tnt.get_rank() == root_rank:
        output_array = broadcaster.broadcast(input_array)
    else:
        output_array = broadcaster.broadcast()

    assert isinstance(output_array, np.ndarray)
    assert (output_array == input_array).all()


@pytest.mark.parametrize("list_length", [2, 3])
@pytest.mark.parametrize("array_shape", [(1), (5, 7), (3, 2, 4)])
def test_broadcast_list_of_arrays(array_shape, list_length):
    np.random.seed(42)
    input_array = np.random.random_sample(array_shape).astype("float32")
    inputs = list_length * [input_array]
    broadcaster = tnt.TensorBroadcaster(inputs, 0)

    outputs = broadcaster.broadcast(inputs) if tnt.get_rank() == 0 else broadcaster.broadcast()

    assert isinstance(outputs, list)
    assert all((array == input_array).all() for array in outputs)


def test_broadcast_list_of_list():
    np.random.seed(42)
    input_array = np.random.random_sample((1, 1, 3, 4)).astype("float32")
    inputs = 3 * [3 * [input_array]] + [35]
    broadcaster = tnt.TensorBroadcaster(inputs, 0)

    outputs = broadcaster.broadcast(inputs) if tnt.get_rank() == 0 else broadcaster.broadcast()

    assert isinstance(outputs, list)
    assert all((array == input_array).all() for inner in outputs[:-1] for array in inner)
    assert outputs[-1] == 35


# ------------------------------------------------------------ allgather

@pytest.mark.parametrize("array_length", [0, 2])
def test_allgather_single_array_identical_inputs(array_length):
    input_array = np.ones(shape=(array_length, 1), dtype=np.float32)
    output_array = tnt.TensorAllgatherer(input_array).allgather(input_array)
    assert isinstance(output_array, np.ndarray)
    assert np.array_equal(output_array, np.ones(array_length * tnt.get_size(), np.float32))


def test_allgather_scalar_identical_inputs():
    output_array = tnt.TensorAllgatherer(50).allgather(50)
    assert isinstance(output_array, np.ndarray)
    assert np.array_equal(output_array, np.full(tnt.get_size(), 50))
