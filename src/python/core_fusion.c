/*
 * tarantella._core.Fusion: a libtnt fusion set, whose integer handle the
 * TensorFlow ops look up to start and finish its tensors. finalize()
 * closes the open ones (g_fusions).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

typedef struct FusionObject FusionObject;

struct FusionObject {
  PyObject_HEAD
  tnt_fusion_t *fusion; /* NULL once closed */
  int64_t handle;
  Py_ssize_t num_buckets;
  Py_ssize_t ntensors;
  tnt_fusion_mode_t mode;
  FusionObject *prev, *next; /* in g_fusions while open */
  PyObject *weakreflist;
};

/* The names of the modes, in the order of tnt_fusion_mode_t. */
static const char *const mode_names[TNT_FUSION_MODE_COUNT] = {"allreduce", "reduce_scatter",
                                                              "allgather"};

/* Open fusion sets, closed by finalize() before the context goes away. */
static FusionObject *g_fusions;

/* Detaches the libtnt set from `self` and destroys it with the GIL
 * released; the object is closed before the GIL is let go, so no other
 * thread can reach the set meanwhile. */
static void fusion_close_now(FusionObject *self) {
  tnt_fusion_t *f = self->fusion;
  if (f == NULL) return;
  self->fusion = NULL;
  if (self->prev != NULL) {
    self->prev->next = self->next;
  } else {
    g_fusions = self->next;
  }
  if (self->next != NULL) self->next->prev = self->prev;
  self->prev = self->next = NULL;
  TNT_WITHOUT_GIL(tnt_fusion_destroy(f));
}

void close_all_fusions(void) {
  while (g_fusions != NULL) fusion_close_now(g_fusions);
}

/* Parses one (id, count, dtype) entry of the tensor list. */
static int parse_tensor_entry(PyObject *item, Py_ssize_t i, tnt_tensor_info_t *t) {
  static const char call[] = "Fusion";
  int rc = -1;
  PyObject *entry = NULL, *id = NULL;
  if (!PyTuple_Check(item) && !PyList_Check(item)) goto bad_shape;
  entry = PySequence_Fast(item, "");
  if (entry == NULL || PySequence_Fast_GET_SIZE(entry) != 3) goto bad_shape;
  id = PyNumber_Index(PySequence_Fast_GET_ITEM(entry, 0));
  if (id == NULL) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: tensors[%zd]: the id must be an integer", call, i);
    goto done;
  }
  t->id = PyLong_AsUnsignedLongLong(id);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: tensors[%zd]: the id must be in 0..2**64-1, not %R", call,
                 i, id);
    goto done;
  }
  char what[48];
  snprintf(what, sizeof what, "tensors[%zd]: the count", i);
  if (as_count(call, what, PySequence_Fast_GET_ITEM(entry, 1), &t->count) < 0) goto done;
  int dtype;
  if (parse_dtype(call, PySequence_Fast_GET_ITEM(entry, 2), &dtype) < 0) goto done;
  if (dtype < 0) {
    PyErr_Format(PyExc_TypeError,
                 "%s: tensors[%zd]: the dtype must be a name such as 'float32', not None", call, i);
    goto done;
  }
  t->dtype = (tnt_dtype_t)dtype;
  rc = 0;
  goto done;
bad_shape:
  PyErr_Clear();
  PyErr_Format(PyExc_TypeError,
               "%s: tensors[%zd] must be a tuple (id, count, dtype), such as (0, 1024, "
               "'float32'), not %R",
               call, i, item);
done:
  Py_XDECREF(entry);
  Py_XDECREF(id);
  return rc;
}

static PyObject *fusion_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static const char call[] = "Fusion";
  static char *kwlist[] = {"tensors",        "threshold_bytes", "op",      "group", "wire_dtype",
                           "tune_threshold", "order",           "overlap", "mode",  NULL};
  PyObject *tensors_obj, *threshold_obj, *op_obj = NULL, *group_obj = NULL, *wire_obj = NULL;
  const char *order = "list", *overlap = "on", *mode = "allreduce";
  int tune = 0;
  PyObject *seq = NULL;
  FusionObject *self = NULL;
  tnt_tensor_info_t *list = NULL;
  tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;
  int wire;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO$Opsss:Fusion", kwlist, &tensors_obj,
                                   &threshold_obj, &op_obj, &group_obj, &wire_obj, &tune, &order,
                                   &overlap, &mode)) {
    return NULL;
  }
  int m = 0;
  while (m < TNT_FUSION_MODE_COUNT && strcmp(mode, mode_names[m]) != 0) ++m;
  if (m == TNT_FUSION_MODE_COUNT) {
    PyErr_Format(PyExc_ValueError,
                 "%s: mode '%s': use 'allreduce', 'reduce_scatter' or 'allgather'", call, mode);
    return NULL;
  }
  opt.mode = (tnt_fusion_mode_t)m;
  if (strcmp(overlap, "off") == 0) {
    opt.overlap = TNT_FUSION_OVERLAP_OFF;
  } else if (strcmp(overlap, "auto") == 0) {
    opt.overlap = TNT_FUSION_OVERLAP_TUNE;
  } else if (strcmp(overlap, "on") != 0) {
    PyErr_Format(PyExc_ValueError, "%s: overlap '%s': use 'on', 'off' or 'auto'", call, overlap);
    return NULL;
  }
  opt.tune_threshold = tune;
  if (strcmp(order, "readiness") == 0) {
    opt.order = TNT_FUSION_ORDER_READINESS;
  } else if (strcmp(order, "list") != 0) {
    PyErr_Format(PyExc_ValueError, "%s: order '%s': use 'list' or 'readiness'", call, order);
    return NULL;
  }
  if (require_context(call) < 0) return NULL;
  tnt_group_t *group = group_arg(call, group_obj);
  if (group == NULL) return NULL;
  if (as_count(call, "threshold_bytes", threshold_obj, &opt.threshold_bytes) < 0) return NULL;
  if (parse_op(call, op_obj, TNT_AVERAGE, &opt.op) < 0) return NULL;
  /* libtnt names the wire dtypes it accepts. */
  if (parse_dtype(call, wire_obj, &wire) < 0) return NULL;
  opt.wire_dtype = wire < 0 ? TNT_FLOAT32 : (tnt_dtype_t)wire;
  seq = PySequence_Fast(tensors_obj, "Fusion: tensors must be a list of (id, count, dtype)");
  if (seq == NULL) goto fail;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  list = PyMem_Malloc((size_t)n * sizeof *list + 1);
  self = (FusionObject *)type->tp_alloc(type, 0);
  if (list == NULL || self == NULL) {
    if (!PyErr_Occurred()) PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (parse_tensor_entry(PySequence_Fast_GET_ITEM(seq, i), i, &list[i]) < 0) goto fail;
  }
  self->ntensors = n;
  self->mode = opt.mode;
  /* libtnt checks the list itself (unique ids: TntInvalidArgumentError,
   * a ValueError) and keeps it. */
  /* Creation is collective: every rank compares the list with the others. */
  tnt_fusion_t *f = NULL;
  tnt_status_t st;
  TNT_WITHOUT_GIL(st = tnt_fusion_create(group, list, (size_t)n, &opt, &f));
  if (st < 0) {
    raise_status(call, st, NULL);
    goto fail;
  }
  self->fusion = f;
  self->handle = tnt_fusion_handle(f);
  self->num_buckets = (Py_ssize_t)tnt_fusion_num_buckets(f);
  self->next = g_fusions;
  if (g_fusions != NULL) g_fusions->prev = self;
  g_fusions = self;
  PyMem_Free(list);
  Py_DECREF(seq);
  return (PyObject *)self;
fail:
  PyMem_Free(list);
  Py_XDECREF(seq);
  Py_XDECREF(self);
  return NULL;
}

static void fusion_dealloc(FusionObject *self) {
  if (self->weakreflist != NULL) PyObject_ClearWeakRefs((PyObject *)self);
  fusion_close_now(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The open set of `self`, or NULL with TntError raised. */
static tnt_fusion_t *fusion_get(FusionObject *self, const char *call) {
  if (require_context(call) < 0) return NULL;
  if (self->fusion == NULL) {
    PyErr_Format(TntError, "%s: this Fusion is closed", call);
    return NULL;
  }
  return self->fusion;
}

PyDoc_STRVAR(fusion_close_doc,
             "close()\n--\n\n"
             "Destroys the fusion set (waiting for reductions still running); its handle\n"
             "is then invalid. Idempotent; also done when the object is deleted.");

static PyObject *fusion_close(FusionObject *self, PyObject *Py_UNUSED(ignored)) {
  fusion_close_now(self);
  Py_RETURN_NONE;
}

static PyObject *fusion_enter(FusionObject *self, PyObject *Py_UNUSED(ignored)) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *fusion_exit(FusionObject *self, PyObject *args) {
  (void)args;
  return fusion_close(self, NULL);
}

static PyObject *fusion_get_handle(FusionObject *self, void *closure) {
  (void)closure;
  return PyLong_FromLongLong((long long)self->handle);
}

/* A set that tunes its threshold replans during its first rounds. */
static PyObject *fusion_get_num_buckets(FusionObject *self, void *closure) {
  (void)closure;
  if (self->fusion != NULL) self->num_buckets = (Py_ssize_t)tnt_fusion_num_buckets(self->fusion);
  return PyLong_FromSsize_t(self->num_buckets);
}

static PyObject *fusion_get_threshold_bytes(FusionObject *self, void *closure) {
  (void)closure;
  if (fusion_get(self, "Fusion.threshold_bytes") == NULL) return NULL;
  return PyLong_FromSize_t(tnt_fusion_threshold(self->fusion));
}

static PyObject *fusion_get_overlaps(FusionObject *self, void *closure) {
  (void)closure;
  if (fusion_get(self, "Fusion.overlaps") == NULL) return NULL;
  return PyBool_FromLong(tnt_fusion_overlaps(self->fusion));
}

static PyObject *fusion_get_mode(FusionObject *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(mode_names[self->mode]);
}

static PyObject *fusion_get_closed(FusionObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->fusion == NULL);
}

static PyObject *fusion_repr(FusionObject *self) {
  return PyUnicode_FromFormat("<tarantella._core.Fusion handle=%lld, %zd tensors in %zd buckets%s>",
                              (long long)self->handle, self->ntensors, self->num_buckets,
                              self->fusion == NULL ? ", closed" : "");
}

PyDoc_STRVAR(fusion_part_doc,
             "part(tensor_id) -> (lo, hi)\n--\n\n"
             "This rank's part of the tensor: its elements [lo, hi) of the flattened tensor\n"
             "(lo == hi when it has none), the same in every mode and for every set made\n"
             "with the same list, threshold and group. In mode 'reduce_scatter' the finish\n"
             "gives these hi - lo elements; in mode 'allgather' the start takes them.");

static PyObject *fusion_part(FusionObject *self, PyObject *arg) {
  static const char call[] = "Fusion.part";
  tnt_fusion_t *f = fusion_get(self, call);
  if (f == NULL) return NULL;
  PyObject *index = PyNumber_Index(arg);
  if (index == NULL) return NULL;
  const unsigned long long id = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (PyErr_Occurred()) return NULL;
  size_t lo, hi;
  const tnt_status_t st = tnt_fusion_part(f, (uint64_t)id, &lo, &hi);
  if (st < 0) return raise_status(call, st, NULL);
  return Py_BuildValue("(nn)", (Py_ssize_t)lo, (Py_ssize_t)hi);
}

static PyMethodDef fusion_methods[] = {
    {"close", (PyCFunction)fusion_close, METH_NOARGS, fusion_close_doc},
    {"part", (PyCFunction)fusion_part, METH_O, fusion_part_doc},
    {"__enter__", (PyCFunction)fusion_enter, METH_NOARGS, "Returns the Fusion itself."},
    {"__exit__", (PyCFunction)fusion_exit, METH_VARARGS, "Closes the Fusion."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fusion_getset[] = {
    {"handle", (getter)fusion_get_handle, NULL,
     "The integer handle (tnt_fusion_handle) that the TensorFlow ops look up.", NULL},
    {"num_buckets", (getter)fusion_get_num_buckets, NULL, "The number of fusion buckets.", NULL},
    {"threshold_bytes", (getter)fusion_get_threshold_bytes, NULL,
     "The threshold of the plan in use (the tuned one, once a tuning set has decided).", NULL},
    {"overlaps", (getter)fusion_get_overlaps, NULL,
     "True when the plan in use reduces buckets while tensors are still to start (overlap "
     "on, or the tuned choice once a set that tunes it has decided).",
     NULL},
    {"mode", (getter)fusion_get_mode, NULL,
     "'allreduce', 'reduce_scatter' or 'allgather', as created.", NULL},
    {"closed", (getter)fusion_get_closed, NULL, "True once close() has run.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(fusion_doc,
             "Fusion(tensors, threshold_bytes, op='average', group=None, *, wire_dtype=None,\n"
             "       tune_threshold=False, order='list', overlap='on', mode='allreduce')\n--\n\n"
             "A tensor fusion set over all ranks (over `group`, a create_group() handle,\n"
             "when given). tensors lists (id, count, dtype) in the\n"
             "order the tensors become ready (backprop order): id a unique integer, count\n"
             "the number of elements, dtype a name ('float32', 'float64', 'float16',\n"
             "'bfloat16', 'int8', 'int16', 'int32', 'int64', 'uint8'). Tensors are packed\n"
             "into buckets of one dtype\n"
             "each that close at threshold_bytes (0: one tensor per bucket); each bucket is\n"
             "reduced with op as soon as all its tensors have started. Creation is\n"
             "collective: every rank passes the same list. Each round, the TensorFlow ops\n"
             "start every tensor once and finish it once (by the set's handle). wire_dtype\n"
             "'float16' or 'bfloat16' sends float32 tensors in 16 bits (each reduction\n"
             "step adds in float32); None or 'float32' sends them as they are.\n"
             "tune_threshold=True\n"
             "ignores threshold_bytes: the set tries 32 KiB to 8 MiB in its first rounds\n"
             "and keeps the master's fastest; order='readiness' fills the buckets in the\n"
             "order the master started the tensors in the first round; overlap='off'\n"
             "reduces no bucket before every tensor has started the round, 'auto' keeps\n"
             "the faster of on and off, timed in the first rounds (see tnt_fusion_options_t\n"
             "in tnt.h). mode='reduce_scatter' reduce-scatters each bucket: a finish gives\n"
             "only the tensor's part (see part()), bitwise the allreduce's elements there;\n"
             "mode='allgather' gathers the parts: a start takes only the part and a finish\n"
             "gives the whole tensor. Both need tune_threshold=False and order='list'.");

/* clang-format cannot lay out the head macros of these two initializers. */
// clang-format off
PyTypeObject FusionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tarantella._core.Fusion",
    .tp_basicsize = sizeof(FusionObject),
    .tp_dealloc = (destructor)fusion_dealloc,
    .tp_repr = (reprfunc)fusion_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = fusion_doc,
    .tp_weaklistoffset = offsetof(FusionObject, weakreflist),
    .tp_methods = fusion_methods,
    .tp_getset = fusion_getset,
    .tp_new = fusion_new,
};
// clang-format on
