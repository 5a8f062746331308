/*
 * The arguments of tarantella._core's calls (see core.h): dtype and op
 * names, buffers seen as arrays of one libtnt dtype, counts and groups.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "core.h"

/* ------------------------------------------------------------ dtypes, ops */

static int host_is_little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

/* The names of dtypes or ops, as libtnt gives them. */
typedef struct name_table {
  const char *what; /* the argument: "dtype", "op" */
  const char *(*name_of)(int);
  int count;
  const char *choices;
} name_table_t;

static const char *dtype_name_at(int i) {
  return tnt_dtype_name((tnt_dtype_t)i);
}

static const char *op_name_at(int i) {
  return tnt_op_name((tnt_op_t)i);
}

static const name_table_t kDtypeNames = {
    "dtype", dtype_name_at, TNT_DTYPE_COUNT,
    "'float32', 'float64', 'float16', 'bfloat16', 'int8', 'int16', 'int32', 'int64' or "
    "'uint8'"};
static const name_table_t kOpNames = {"op", op_name_at, TNT_OP_COUNT,
                                      "'sum', 'average', 'min' or 'max'"};

/* Parses `obj`, a str that must be one of the names of `t`; *out is its
 * index. */
static int parse_name(const char *call, const name_table_t *t, PyObject *obj, int *out) {
  if (!PyUnicode_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s: %s must be a string (%s), not %s", call, t->what,
                 t->choices, Py_TYPE(obj)->tp_name);
    return -1;
  }
  const char *name = PyUnicode_AsUTF8(obj);
  if (name == NULL) return -1;
  for (int i = 0; i < t->count; ++i) {
    if (strcmp(name, t->name_of(i)) == 0) {
      *out = i;
      return 0;
    }
  }
  PyErr_Format(PyExc_ValueError, "%s: unknown %s '%s': use %s", call, t->what, name, t->choices);
  return -1;
}

int parse_dtype(const char *call, PyObject *obj, int *out) {
  *out = -1;
  if (obj == NULL || obj == Py_None) return 0;
  return parse_name(call, &kDtypeNames, obj, out);
}

int parse_op(const char *call, PyObject *obj, tnt_op_t fallback, tnt_op_t *out) {
  *out = fallback;
  if (obj == NULL) return 0;
  int op;
  if (parse_name(call, &kOpNames, obj, &op) < 0) return -1;
  *out = (tnt_op_t)op;
  return 0;
}

/* ------------------------------------------------------------------ buffers */

void release_tensor(tensor_t *t) {
  if (t->held) PyBuffer_Release(&t->view);
  t->held = 0;
}

/* Maps a buffer format to a dtype: 0 on success, -1 for an element type
 * libtnt cannot reduce, -2 for data in the non-native byte order. */
static int dtype_of_format(const Py_buffer *v, tnt_dtype_t *out) {
  const char *f = v->format != NULL ? v->format : "B";
  if (*f == '@' || *f == '=') {
    ++f;
  } else if (*f == '<' || *f == '>' || *f == '!') {
    if ((*f == '<') != host_is_little_endian()) return -2;
    ++f;
  }
  if (f[0] == '\0' || f[1] != '\0') return -1;
  /* The formats of one size each; C's int and long differ in size between
   * platforms, so those go by size. */
  static const struct {
    char format;
    tnt_dtype_t dtype;
  } kFormats[] = {{'f', TNT_FLOAT32}, {'d', TNT_FLOAT64}, {'e', TNT_FLOAT16},
                  {'b', TNT_INT8},    {'B', TNT_UINT8},   {'h', TNT_INT16}};
  for (size_t k = 0; k < sizeof kFormats / sizeof kFormats[0]; ++k) {
    if (f[0] != kFormats[k].format) continue;
    *out = kFormats[k].dtype;
    return (size_t)v->itemsize == tnt_dtype_size(*out) ? 0 : -1;
  }
  if (strchr("ilq", f[0]) == NULL || (v->itemsize != 4 && v->itemsize != 8)) return -1;
  *out = v->itemsize == 4 ? TNT_INT32 : TNT_INT64;
  return 0;
}

/* PyObject_GetBuffer failed on `obj`: replaces the exporter's error with
 * one that names the argument and the fix when the cause can be told. */
static void explain_buffer_error(const char *call, const char *name, PyObject *obj, int writable,
                                 int with_format) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  Py_buffer v;
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (with_format && PyObject_GetBuffer(obj, &v, flags) == 0) {
    /* Everything but the element type can be exported: numpy does this for
     * dtypes without a buffer format, such as ml_dtypes' bfloat16. */
    PyBuffer_Release(&v);
    PyObject *s = value != NULL ? PyObject_Str(value) : NULL;
    const char *reason = s != NULL ? PyUnicode_AsUTF8(s) : NULL;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s: the element type of %s cannot be described through the buffer "
                 "protocol (%s); for bfloat16 data pass dtype='bfloat16'",
                 call, name, reason != NULL ? reason : "no format");
    Py_XDECREF(s);
    goto done;
  }
  PyErr_Clear();
  if (PyObject_GetBuffer(obj, &v, PyBUF_STRIDES) == 0) {
    int contiguous = PyBuffer_IsContiguous(&v, 'C');
    int readonly = v.readonly;
    PyBuffer_Release(&v);
    if (!contiguous) {
      PyErr_Format(PyExc_ValueError,
                   "%s: %s must be C-contiguous; pass numpy.ascontiguousarray(%s) instead", call,
                   name, name);
      goto done;
    }
    if (writable && readonly) {
      PyErr_Format(PyExc_ValueError,
                   "%s: %s is read-only, but the result is written into it; pass a writable "
                   "array (numpy.array(%s) makes a writable copy)",
                   call, name, name);
      goto done;
    }
  }
  PyErr_Clear();
  /* No better explanation: the exporter's own error stands. */
  PyErr_Restore(type, value, tb);
  return;
done:
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

int get_tensor(const char *call, const char *name, PyObject *obj, int writable, int dtype,
               tensor_t *t) {
  memset(t, 0, sizeof *t);
  if (!PyObject_CheckBuffer(obj)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: %s must be a numpy array or another object with the buffer protocol, "
                 "not %s",
                 call, name, Py_TYPE(obj)->tp_name);
    return -1;
  }
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0) | (dtype < 0 ? PyBUF_FORMAT : 0);
  if (PyObject_GetBuffer(obj, &t->view, flags) < 0) {
    explain_buffer_error(call, name, obj, writable, dtype < 0);
    return -1;
  }
  t->held = 1;
  if (t->view.itemsize <= 0) {
    PyErr_Format(PyExc_TypeError, "%s: %s has an item size of %zd bytes", call, name,
                 t->view.itemsize);
    goto fail;
  }
  if (dtype >= 0) {
    if ((size_t)t->view.itemsize != tnt_dtype_size((tnt_dtype_t)dtype)) {
      PyErr_Format(PyExc_TypeError,
                   "%s: %s has %zd-byte elements, but dtype '%s' needs %zu-byte elements", call,
                   name, t->view.itemsize, tnt_dtype_name((tnt_dtype_t)dtype),
                   tnt_dtype_size((tnt_dtype_t)dtype));
      goto fail;
    }
    t->dtype = (tnt_dtype_t)dtype;
  } else {
    int r = dtype_of_format(&t->view, &t->dtype);
    if (r == -2) {
      PyErr_Format(PyExc_TypeError,
                   "%s: %s is in the non-native byte order (format '%s'); convert it with "
                   "x.astype(x.dtype.newbyteorder('='))",
                   call, name, t->view.format);
      goto fail;
    }
    if (r < 0) {
      PyErr_Format(PyExc_TypeError,
                   "%s: %s has the element format '%s' (%zd bytes), which tarantella cannot "
                   "reduce: use float32, float64, float16, int8, int16, int32, int64 or uint8 "
                   "data, or pass "
                   "dtype='bfloat16' for bfloat16 data",
                   call, name, t->view.format != NULL ? t->view.format : "B", t->view.itemsize);
      goto fail;
    }
  }
  t->count = (size_t)(t->view.len / t->view.itemsize);
  return 0;
fail:
  release_tensor(t);
  return -1;
}

/* Whether the memory of two tensors overlaps (empty ones never do). */
static int overlaps(const tensor_t *a, const tensor_t *b) {
  const char *pa = a->view.buf, *pb = b->view.buf;
  if (a->view.len == 0 || b->view.len == 0) return 0;
  return pa < pb + b->view.len && pb < pa + a->view.len;
}

int get_buffers(const char *call, const char *in_name, PyObject *in_obj, const char *out_name,
                PyObject *out_obj, int same_allowed, int dtype, tensor_t *in, tensor_t *out) {
  if (out_obj == NULL) return get_tensor(call, in_name, in_obj, 1, dtype, in);
  if (get_tensor(call, in_name, in_obj, 0, dtype, in) < 0) return -1;
  if (get_tensor(call, out_name, out_obj, 1, dtype, out) < 0) return -1;
  if (out->dtype != in->dtype) {
    PyErr_Format(PyExc_TypeError, "%s: %s holds %s but %s holds %s; give %s %s's dtype", call,
                 out_name, tnt_dtype_name(out->dtype), in_name, tnt_dtype_name(in->dtype), out_name,
                 in_name);
    return -1;
  }
  if (!overlaps(in, out) || (same_allowed && in->view.buf == out->view.buf)) return 0;
  if (same_allowed) {
    PyErr_Format(PyExc_ValueError,
                 "%s: %s partly overlaps %s; pass the same array (in place) or separate arrays",
                 call, out_name, in_name);
  } else {
    PyErr_Format(PyExc_ValueError, "%s: %s and %s overlap; pass separate arrays", call, in_name,
                 out_name);
  }
  return -1;
}

/* ------------------------------------------------------- counts, groups */

int as_count(const char *call, const char *what, PyObject *obj, size_t *out) {
  PyObject *index = PyNumber_Index(obj);
  if (index == NULL) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: %s must be an integer, not %s", call, what,
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  size_t v = PyLong_AsSize_t(index);
  Py_DECREF(index);
  if (v == (size_t)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: %s must be a non-negative integer, not %R", call, what,
                 obj);
    return -1;
  }
  *out = v;
  return 0;
}

tnt_group_t *group_arg(const char *call, PyObject *obj) {
  if (obj == NULL || obj == Py_None) return g_world;
  long long handle = PyLong_AsLongLong(obj);
  if (handle == -1 && PyErr_Occurred()) return NULL;
  tnt_group_t *g = tnt_group_lookup((int64_t)handle);
  if (g == NULL) {
    PyErr_Format(PyExc_ValueError,
                 "%s: group=%lld is not a live group; pass a handle that create_group() "
                 "returned",
                 call, handle);
  }
  return g;
}
