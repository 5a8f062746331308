/*
 * The collectives of tarantella._core over the world group or a group of
 * create_group(): each checks its arguments, acquires its buffers and
 * makes the libtnt call with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdio.h>

#include "core.h"

/* What every collective call checks first: a context, its dtype and group
 * arguments. The group, or NULL with an exception set. */
static tnt_group_t *collective_head(const char *call, PyObject *dtype_obj, PyObject *group_obj,
                                    int *dtype) {
  if (require_context(call) < 0 || parse_dtype(call, dtype_obj, dtype) < 0) return NULL;
  return group_arg(call, group_obj);
}

PyDoc_STRVAR(create_group_doc,
             "create_group(ranks)\n--\n\n"
             "Creates the group of the world ranks `ranks` (distinct, in the order that\n"
             "defines group ranks) and returns its handle, for the group= argument of the\n"
             "collectives, of Fusion and of the TensorFlow ops. Collective over the listed\n"
             "ranks, which pass the same list; the calling rank must be among them. The\n"
             "group lives as long as the context.");

static PyObject *core_create_group(PyObject *module, PyObject *ranks_obj) {
  (void)module;
  static const char call[] = "create_group";
  if (require_context(call) < 0) return NULL;
  PyObject *seq = PySequence_Fast(ranks_obj, "create_group: ranks must be a list of ranks");
  if (seq == NULL) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int *ranks = PyMem_Malloc((size_t)n * sizeof *ranks + 1);
  PyObject *result = NULL;
  if (ranks == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  /* libtnt checks the list (ranks that exist, each once, this one among
   * them) and says what is wrong. */
  for (Py_ssize_t i = 0; i < n; ++i) {
    int overflow = 0;
    long r = PyLong_AsLongAndOverflow(PySequence_Fast_GET_ITEM(seq, i), &overflow);
    if (r == -1 && PyErr_Occurred()) goto done;
    ranks[i] = overflow || r < INT_MIN || r > INT_MAX ? -1 : (int)r;
  }
  tnt_context_t *ctx = tnt_group_context(g_world);
  tnt_group_t *g = NULL;
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_group_create(ctx, ranks, (int)n, &g));
  if (st < 0) {
    raise_status(call, st, NULL);
    goto done;
  }
  result = PyLong_FromLongLong((long long)tnt_group_handle(g));
done:
  PyMem_Free(ranks);
  Py_DECREF(seq);
  return result;
}

PyDoc_STRVAR(allreduce_doc,
             "allreduce(buf, op='sum', out=None, dtype=None, group=None)\n--\n\n"
             "Reduces buf element-wise across all ranks (of `group`, a create_group()\n"
             "handle, when given) with op ('sum', 'average', 'min'\n"
             "or 'max'; 'average' divides integers with integer division). The result\n"
             "replaces buf, or goes to out (same dtype and element count) when given.\n"
             "buf is any C-contiguous buffer of float32, float64, float16, int8, int16,\n"
             "int32, int64 or uint8 (integer sums wrap around in the type's width);\n"
             "dtype='bfloat16' takes a buffer with 2-byte elements as bfloat16 (dtype\n"
             "overrides the buffer's own element type; the item size must match). Every\n"
             "rank passes the same dtype and count. Returns the array holding the result.");

static PyObject *core_allreduce(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  static const char call[] = "allreduce";
  static char *kwlist[] = {"buf", "op", "out", "dtype", "group", NULL};
  PyObject *buf_obj, *op_obj = NULL, *out_obj = Py_None, *dtype_obj = Py_None, *group_obj = NULL;
  PyObject *result = NULL;
  tensor_t in = {0}, out = {0};
  int dtype;
  tnt_op_t op;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOO:allreduce", kwlist, &buf_obj, &op_obj,
                                   &out_obj, &dtype_obj, &group_obj)) {
    return NULL;
  }
  tnt_group_t *g = collective_head(call, dtype_obj, group_obj, &dtype);
  if (g == NULL || parse_op(call, op_obj, TNT_SUM, &op) < 0) return NULL;
  const int in_place = out_obj == Py_None;
  if (get_buffers(call, "buf", buf_obj, "out", in_place ? NULL : out_obj, 1, dtype, &in, &out) <
      0) {
    goto done;
  }
  if (!in_place && out.count != in.count) {
    PyErr_Format(PyExc_ValueError,
                 "%s: out has %zu elements but buf has %zu; pass an out of buf's size "
                 "(e.g. numpy.empty_like(buf))",
                 call, out.count, in.count);
    goto done;
  }
  void *dst = in_place ? in.view.buf : out.view.buf;
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_allreduce(g, in.view.buf, dst, in.count, in.dtype, op));
  result = result_of(call, st, NULL, in_place ? buf_obj : out_obj);
done:
  release_tensor(&in);
  release_tensor(&out);
  return result;
}

PyDoc_STRVAR(broadcast_doc,
             "broadcast(buf, root=0, dtype=None, group=None)\n--\n\n"
             "Copies root's buf into buf on every other rank (in place); with `group`\n"
             "(a create_group() handle), among its ranks, root a rank of the group. buf must be\n"
             "writable on every rank and have the same dtype and element count everywhere;\n"
             "dtype as for allreduce(). Returns buf.");

static PyObject *core_broadcast(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  static const char call[] = "broadcast";
  static char *kwlist[] = {"buf", "root", "dtype", "group", NULL};
  PyObject *buf_obj, *dtype_obj = Py_None, *group_obj = NULL;
  PyObject *result = NULL;
  int root = 0, dtype;
  tensor_t buf = {0};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|iOO:broadcast", kwlist, &buf_obj, &root,
                                   &dtype_obj, &group_obj)) {
    return NULL;
  }
  tnt_group_t *g = collective_head(call, dtype_obj, group_obj, &dtype);
  if (g == NULL) return NULL;
  /* libtnt checks the root (TntInvalidArgumentError, a ValueError). The
   * buffer must be writable on the root too, so that every rank accepts or
   * rejects the same arguments and none is left waiting for a rank that
   * raised. */
  if (get_buffers(call, "buf", buf_obj, NULL, NULL, 0, dtype, &buf, NULL) < 0) goto done;
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_broadcast(g, buf.view.buf, buf.count, buf.dtype, root));
  result = result_of(call, st, NULL, buf_obj);
done:
  release_tensor(&buf);
  return result;
}

PyDoc_STRVAR(allgather_doc,
             "allgather(send, recv, dtype=None, group=None)\n--\n\n"
             "Gathers every rank's send (the same element count on every rank) into recv,\n"
             "rank r's elements at r * len(send). recv must be writable and hold exactly\n"
             "size() * len(send) elements of send's dtype. Returns recv.");

static PyObject *core_allgather(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  static const char call[] = "allgather";
  static char *kwlist[] = {"send", "recv", "dtype", "group", NULL};
  PyObject *send_obj, *recv_obj, *dtype_obj = Py_None, *group_obj = NULL;
  PyObject *result = NULL;
  tensor_t send = {0}, recv = {0};
  int dtype;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:allgather", kwlist, &send_obj, &recv_obj,
                                   &dtype_obj, &group_obj)) {
    return NULL;
  }
  tnt_group_t *g = collective_head(call, dtype_obj, group_obj, &dtype);
  if (g == NULL) return NULL;
  if (get_buffers(call, "send", send_obj, "recv", recv_obj, 0, dtype, &send, &recv) < 0) {
    goto done;
  }
  const size_t size = (size_t)tnt_group_size(g);
  if (recv.count / size != send.count || recv.count % size != 0) {
    PyErr_Format(PyExc_ValueError,
                 "%s: recv has %zu elements but must have size() * len(send) = %zu * %zu = %zu; "
                 "allocate it with that many elements",
                 call, recv.count, size, send.count, size * send.count);
    goto done;
  }
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_allgather(g, send.view.buf, send.count, recv.view.buf, send.dtype));
  result = result_of(call, st, NULL, recv_obj);
done:
  release_tensor(&send);
  release_tensor(&recv);
  return result;
}

PyDoc_STRVAR(allgatherv_doc,
             "allgatherv(send, recv, counts, dtype=None, group=None)\n--\n\n"
             "Gathers send from every rank into recv, back to back: counts[r] is the\n"
             "number of elements rank r sends (counts[rank()] == len(send)), and rank r's\n"
             "elements start at sum(counts[:r]). Every rank passes the same counts, one\n"
             "entry per rank, and a writable recv of sum(counts) elements. Returns recv.");

static PyObject *core_allgatherv(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  static const char call[] = "allgatherv";
  static char *kwlist[] = {"send", "recv", "counts", "dtype", "group", NULL};
  PyObject *send_obj, *recv_obj, *counts_obj, *dtype_obj = Py_None, *group_obj = NULL;
  PyObject *result = NULL, *seq = NULL;
  tensor_t send = {0}, recv = {0};
  size_t *counts = NULL, *displs = NULL;
  int dtype;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OO:allgatherv", kwlist, &send_obj,
                                   &recv_obj, &counts_obj, &dtype_obj, &group_obj)) {
    return NULL;
  }
  tnt_group_t *g = collective_head(call, dtype_obj, group_obj, &dtype);
  if (g == NULL) return NULL;
  const int size = tnt_group_size(g), me = tnt_group_rank(g);
  seq = PySequence_Fast(counts_obj, "allgatherv: counts must be a sequence of integers");
  if (seq == NULL) goto done;
  if (PySequence_Fast_GET_SIZE(seq) != size) {
    PyErr_Format(PyExc_ValueError, "%s: counts has %zd entries; it needs one per rank (%d)", call,
                 PySequence_Fast_GET_SIZE(seq), size);
    goto done;
  }
  counts = PyMem_Malloc((size_t)size * sizeof *counts);
  displs = PyMem_Malloc((size_t)size * sizeof *displs);
  if (counts == NULL || displs == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  size_t total = 0;
  for (int r = 0; r < size; ++r) {
    char what[32];
    snprintf(what, sizeof what, "counts[%d]", r);
    if (as_count(call, what, PySequence_Fast_GET_ITEM(seq, r), &counts[r]) < 0) goto done;
    if (counts[r] > SIZE_MAX - total) {
      PyErr_Format(PyExc_ValueError, "%s: the counts add up to more than fits in memory", call);
      goto done;
    }
    displs[r] = total;
    total += counts[r];
  }
  if (get_buffers(call, "send", send_obj, "recv", recv_obj, 0, dtype, &send, &recv) < 0) {
    goto done;
  }
  if (counts[me] != send.count) {
    PyErr_Format(PyExc_ValueError,
                 "%s: counts[%d] is %zu but this rank's send has %zu elements; counts[r] must "
                 "be the number of elements rank r sends",
                 call, me, counts[me], send.count);
    goto done;
  }
  if (recv.count != total) {
    PyErr_Format(PyExc_ValueError,
                 "%s: recv has %zu elements but must have sum(counts) = %zu; allocate it with "
                 "that many elements",
                 call, recv.count, total);
    goto done;
  }
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_allgatherv(g, send.view.buf, send.count, recv.view.buf, counts,
                                      displs, send.dtype));
  result = result_of(call, st, NULL, recv_obj);
done:
  release_tensor(&send);
  release_tensor(&recv);
  PyMem_Free(counts);
  PyMem_Free(displs);
  Py_XDECREF(seq);
  return result;
}

PyDoc_STRVAR(barrier_doc,
             "barrier()\n--\n\n"
             "Returns once every rank has entered barrier() (or raises on a timeout).");

static PyObject *core_barrier(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  if (require_context("barrier") < 0) return NULL;
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_barrier(g_world));
  return result_of("barrier", st, NULL, Py_None);
}

PyMethodDef core_collective_methods[] = {
    {"create_group", (PyCFunction)core_create_group, METH_O, create_group_doc},
    {"allreduce", TNT_PYFN(core_allreduce), METH_VARARGS | METH_KEYWORDS, allreduce_doc},
    {"broadcast", TNT_PYFN(core_broadcast), METH_VARARGS | METH_KEYWORDS, broadcast_doc},
    {"allgather", TNT_PYFN(core_allgather), METH_VARARGS | METH_KEYWORDS, allgather_doc},
    {"allgatherv", TNT_PYFN(core_allgatherv), METH_VARARGS | METH_KEYWORDS, allgatherv_doc},
    {"barrier", (PyCFunction)core_barrier, METH_NOARGS, barrier_doc},
    {NULL, NULL, 0, NULL},
};
