/*
 * tarantella._core: the Python binding of libtnt.
 *
 * The module owns one libtnt context per process (created by init(),
 * destroyed by finalize() or at interpreter exit) and exposes the world
 * group's collectives on any object that supports the buffer protocol, plus
 * fusion sets whose integer handles the TensorFlow ops look up.
 *
 * Every blocking libtnt call runs with the GIL released, so other Python
 * threads (TensorFlow's among them) keep running while a rank waits for its
 * peers. All module state below is only touched with the GIL held. A
 * counter of calls in flight keeps finalize() from destroying the context
 * underneath a call that another thread is still making.
 *
 * Arguments are checked here, before libtnt sees them, so that a mistake
 * raises a Python exception that says what to change instead of a libtnt
 * status whose explanation went to stderr.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tnt/tnt.h"

/* Casts a METH_VARARGS | METH_KEYWORDS function to PyCFunction; the detour
 * through void (*)(void) keeps -Wcast-function-type quiet. */
#define TNT_PYFN(f) ((PyCFunction)(void (*)(void))(f))

/* ------------------------------------------------------------ module state */

enum ctx_state { NOT_INITIALIZED, INITIALIZING, READY, FINALIZED, INIT_FAILED };

typedef struct FusionObject FusionObject;

static enum ctx_state g_state = NOT_INITIALIZED;
static tnt_context_t *g_ctx;
static tnt_group_t *g_world;
/* Why init() failed, for the message of every later call. */
static char g_init_error[256];
/* Calls that use g_ctx with the GIL released. */
static long g_busy;
/* Open fusion sets, closed by finalize() before the context goes away. */
static FusionObject *g_fusions;
static int g_atexit_registered;

/* TntError and its subclasses, one for each status that a caller may want
 * to catch on its own (exception_for). */
static PyObject *TntError;
static PyObject *TntTimeoutError;
static PyObject *TntInvalidArgumentError;
static PyObject *TntMismatchError;
static PyObject *TntNoMemoryError;
static PyObject *TntUnsupportedError;

/* ------------------------------------------------------------- exceptions */

/* The exception class of a failed status: a TntError, which is also the
 * fitting built-in exception where there is one. */
static PyObject *exception_for(tnt_status_t st) {
  switch (st) {
    case TNT_ERR_TIMEOUT: return TntTimeoutError;         /* also TimeoutError */
    case TNT_ERR_INVALID_ARG: return TntInvalidArgumentError; /* also ValueError */
    case TNT_ERR_MISMATCH: return TntMismatchError;       /* the ranks' programs differ */
    case TNT_ERR_NO_MEMORY: return TntNoMemoryError;      /* also MemoryError */
    case TNT_ERR_UNSUPPORTED: return TntUnsupportedError; /* also NotImplementedError */
    default: return TntError; /* MPI, FAILED, STATE, INTERNAL */
  }
}

/* Raises exception_for(st) for status `st` of `call`: the status name,
 * `detail` when given, libtnt's reason for this call's failure
 * (tnt_last_error, read on the thread that made the call) and the
 * context's record of its first failure, which names the peer that was
 * missing. The exception carries the last two as attributes `status` and
 * `context_error`. */
static PyObject *raise_status(const char *call, tnt_status_t st, const char *detail) {
  const char *why = "";
  if (g_ctx != NULL) tnt_context_error(g_ctx, &why);
  /* After the context failed, libtnt's reason only restates the first
   * failure, which follows anyway. */
  const char *reason = *why && st == TNT_ERR_FAILED ? "" : tnt_last_error();
  if (detail == NULL && *reason) {
    detail = reason;
    reason = "";
  }
  PyObject *cls = exception_for(st);
  const char *hint = "";
  if (st == TNT_ERR_FAILED) {
    hint =
        "; the communication context cannot be used after that failure: end the job "
        "(tarantella._core.abort) and start it again";
  }
  PyObject *msg = PyUnicode_FromFormat(
      "%s failed: %s%s%s%s%s%s%s%s", call, tnt_status_string(st), detail != NULL ? "; " : "",
      detail != NULL ? detail : "", *reason ? "; " : "", reason, *why ? "; first failure: " : "",
      why, hint);
  PyObject *exc = NULL;
  PyObject *status = NULL;
  PyObject *context_error = NULL;
  if (msg == NULL) goto done;
  exc = PyObject_CallOneArg(cls, msg);
  if (exc == NULL) goto done;
  status = PyLong_FromLong((long)st);
  context_error = PyUnicode_FromString(why);
  if (status == NULL || context_error == NULL) goto done;
  if (PyObject_SetAttrString(exc, "status", status) < 0) goto done;
  if (PyObject_SetAttrString(exc, "context_error", context_error) < 0) goto done;
  PyErr_SetObject(cls, exc);
done:
  Py_XDECREF(msg);
  Py_XDECREF(exc);
  Py_XDECREF(status);
  Py_XDECREF(context_error);
  return NULL;
}

/* 0 when the context is ready; otherwise raises TntError naming `call`
 * and what to do, and returns -1. */
static int require_context(const char *call) {
  switch (g_state) {
    case READY:
      return 0;
    case NOT_INITIALIZED:
      PyErr_Format(TntError, "%s: tarantella is not initialized: call tarantella.init() first",
                   call);
      break;
    case INITIALIZING:
      PyErr_Format(TntError, "%s: tarantella.init() is still running in another thread", call);
      break;
    case FINALIZED:
      PyErr_Format(TntError,
                   "%s: tarantella was finalized; MPI cannot be started again in the same "
                   "process, so call finalize() only when the program is done communicating",
                   call);
      break;
    case INIT_FAILED:
      PyErr_Format(TntError,
                   "%s: tarantella.init() failed earlier (%s); MPI cannot be started again in "
                   "the same process: fix the cause and restart the program",
                   call, g_init_error);
      break;
  }
  return -1;
}

/*
 * Runs `stmt`, a libtnt call that may wait for peers, with the GIL released
 * so that other Python threads keep running meanwhile; the call is counted
 * in g_busy, which keeps finalize() from destroying the context underneath
 * it.
 */
// clang-format off
#define TNT_WITHOUT_GIL(stmt) \
  do {                        \
    ++g_busy;                 \
    Py_BEGIN_ALLOW_THREADS    \
    stmt;                     \
    Py_END_ALLOW_THREADS      \
    --g_busy;                 \
  } while (0)
// clang-format on

/* The end of an entry point that made the libtnt call `call`: raises for a
 * failed status `st` (with `detail` when given), and otherwise returns a
 * new reference to `result`. */
static PyObject *result_of(const char *call, tnt_status_t st, const char *detail,
                           PyObject *result) {
  if (st < 0) return raise_status(call, st, detail);
  Py_INCREF(result);
  return result;
}

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

/* Parses a dtype name ("float32", ...) or None (*out = -1). */
static int parse_dtype(const char *call, PyObject *obj, int *out) {
  *out = -1;
  if (obj == NULL || obj == Py_None) return 0;
  return parse_name(call, &kDtypeNames, obj, out);
}

/* Parses "sum", "average", "min" or "max"; NULL gives `fallback`. */
static int parse_op(const char *call, PyObject *obj, tnt_op_t fallback, tnt_op_t *out) {
  *out = fallback;
  if (obj == NULL) return 0;
  int op;
  if (parse_name(call, &kOpNames, obj, &op) < 0) return -1;
  *out = (tnt_op_t)op;
  return 0;
}

/* ------------------------------------------------------------------ buffers */

/* A buffer seen as a flat array of one libtnt dtype. */
typedef struct tensor {
  Py_buffer view;
  int held;
  tnt_dtype_t dtype;
  size_t count;
} tensor_t;

static void release_tensor(tensor_t *t) {
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
  switch (f[0]) {
    case 'f':
      *out = TNT_FLOAT32;
      return v->itemsize == 4 ? 0 : -1;
    case 'd':
      *out = TNT_FLOAT64;
      return v->itemsize == 8 ? 0 : -1;
    case 'e':
      *out = TNT_FLOAT16;
      return v->itemsize == 2 ? 0 : -1;
    case 'b':
      *out = TNT_INT8;
      return v->itemsize == 1 ? 0 : -1;
    case 'B':
      *out = TNT_UINT8;
      return v->itemsize == 1 ? 0 : -1;
    case 'h':
      *out = TNT_INT16;
      return v->itemsize == 2 ? 0 : -1;
    case 'i':
    case 'l':
    case 'q':
      /* C's int and long differ in size between platforms: go by size. */
      if (v->itemsize == 4) {
        *out = TNT_INT32;
        return 0;
      }
      if (v->itemsize == 8) {
        *out = TNT_INT64;
        return 0;
      }
      return -1;
    default:
      return -1;
  }
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

/*
 * Acquires `obj` (argument `name` of `call`) as a C-contiguous array,
 * writable when `writable`. With `dtype` >= 0 the buffer is taken as that
 * dtype whatever its format says (its item size must match), which is how
 * bfloat16 arrays without a usable format get in; otherwise the format
 * decides. On failure raises and leaves `t` released.
 */
static int get_tensor(const char *call, const char *name, PyObject *obj, int writable, int dtype,
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

/*
 * Acquires the buffers of the collective `call`, as every collective takes
 * them. With `out_obj` NULL the call works in place: the input `in_name`
 * is acquired writable and `out` (which may be NULL) is left alone.
 * Otherwise the input is read and the output `out_name` written: it must
 * hold the input's dtype and lie apart from it, or, with `same_allowed`,
 * be the input itself. `dtype` as for get_tensor. On failure raises; the
 * caller releases both either way.
 */
static int get_buffers(const char *call, const char *in_name, PyObject *in_obj,
                       const char *out_name, PyObject *out_obj, int same_allowed, int dtype,
                       tensor_t *in, tensor_t *out) {
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

/* --------------------------------------------------------- context calls */

/* Registers finalization at interpreter exit, once: Python's atexit runs
 * while the interpreter still works, before the module is torn down. */
static int register_atexit(PyObject *module) {
  if (g_atexit_registered) return 0;
  int rc = -1;
  PyObject *atexit = PyImport_ImportModule("atexit");
  PyObject *hook = PyObject_GetAttrString(module, "_finalize_at_exit");
  PyObject *res = NULL;
  if (atexit != NULL && hook != NULL) res = PyObject_CallMethod(atexit, "register", "O", hook);
  if (res != NULL) {
    g_atexit_registered = 1;
    rc = 0;
  }
  Py_XDECREF(res);
  Py_XDECREF(hook);
  Py_XDECREF(atexit);
  return rc;
}

PyDoc_STRVAR(init_doc,
             "init(timeout_s=None)\n--\n\n"
             "Starts communication: initializes MPI (unless it already is) and creates the\n"
             "process's libtnt context over all ranks. Every rank must call it. A second\n"
             "call is a no-op. timeout_s bounds every wait for a peer, in seconds; None\n"
             "takes the setting TNT_TIMEOUT_S (default 30 s). The context is finalized\n"
             "at interpreter exit, or earlier by finalize(). MPI cannot be started twice\n"
             "in one process, so init() cannot be called again after finalize() or after\n"
             "a failed init().");

static PyObject *core_init(PyObject *module, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"timeout_s", NULL};
  PyObject *timeout_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:init", kwlist, &timeout_obj)) return NULL;
  if (g_state == READY) Py_RETURN_NONE;
  if (g_state != NOT_INITIALIZED) {
    require_context("init");
    return NULL;
  }
  tnt_config_t config = {0.0};
  if (timeout_obj != Py_None) {
    config.timeout_s = PyFloat_AsDouble(timeout_obj);
    if (config.timeout_s == -1.0 && PyErr_Occurred()) return NULL;
    if (!(config.timeout_s > 0)) {
      PyErr_Format(PyExc_ValueError,
                   "init: timeout_s must be a positive number of seconds (or None for "
                   "TNT_TIMEOUT_S, default 30), not %R",
                   timeout_obj);
      return NULL;
    }
  }
  /* A bad setting is the user's to fix, and init() can then be called again. */
  if (tnt_settings_load() < 0) {
    PyErr_SetString(TntInvalidArgumentError, tnt_last_error());
    return NULL;
  }
  /* Registered first, so that a context is never left without its hook. */
  if (register_atexit(module) < 0) return NULL;
  g_state = INITIALIZING;
  tnt_context_t *ctx = NULL;
  tnt_status_t st;
  Py_BEGIN_ALLOW_THREADS
  st = tnt_context_create(&config, &ctx);
  Py_END_ALLOW_THREADS
  if (st < 0) {
    /* libtnt has finalized the MPI it initialized, so this cannot be
     * retried; later calls say so. */
    g_state = INIT_FAILED;
    snprintf(g_init_error, sizeof g_init_error, "%s", tnt_status_string(st));
    return raise_status("init", st,
                        "MPI could not be started or its ranks could not be set up (libtnt's "
                        "log on stderr says why)");
  }
  g_ctx = ctx;
  g_world = tnt_context_world(ctx);
  g_state = READY;
  Py_RETURN_NONE;
}

static void close_all_fusions(void);

/* Destroys the context; `at_exit` skips it (silently) while other threads
 * are still inside a call, since destroying it then would pull the context
 * out from under them. */
static int finalize_context(int at_exit) {
  if (g_state != READY) return 0;
  if (g_busy > 0) {
    if (at_exit) return 0;
    PyErr_Format(TntError,
                 "finalize: %ld call(s) are still running in other threads; let them return "
                 "first",
                 g_busy);
    return -1;
  }
  close_all_fusions();
  tnt_context_t *ctx = g_ctx;
  g_ctx = NULL;
  g_world = NULL;
  g_state = FINALIZED;
  /* A failed context is destroyed without finalizing MPI (see tnt.h); its
   * failure was reported when it happened, so the status is not raised. */
  Py_BEGIN_ALLOW_THREADS
  tnt_context_destroy(ctx);
  Py_END_ALLOW_THREADS
  return 0;
}

PyDoc_STRVAR(finalize_doc,
             "finalize()\n--\n\n"
             "Closes every open Fusion, destroys the context and finalizes MPI if init()\n"
             "started it (not after a communication failure: such a process should end\n"
             "with abort()). Runs by itself at interpreter exit; a no-op when the module\n"
             "is not initialized. Raises TntError while other threads are inside a call.");

static PyObject *core_finalize(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  if (finalize_context(0) < 0) return NULL;
  Py_RETURN_NONE;
}

PyDoc_STRVAR(finalize_at_exit_doc,
             "_finalize_at_exit()\n--\n\n"
             "finalize() for the atexit hook: never raises, and leaves the context alone\n"
             "while daemon threads are still inside a call.");

static PyObject *core_finalize_at_exit(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  finalize_context(1);
  Py_RETURN_NONE;
}

PyDoc_STRVAR(is_initialized_doc,
             "is_initialized()\n--\n\n"
             "True between a successful init() and finalize().");

static PyObject *core_is_initialized(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  return PyBool_FromLong(g_state == READY);
}

PyDoc_STRVAR(rank_doc, "rank()\n--\n\nThis process's rank among all ranks (0 .. size() - 1).");
PyDoc_STRVAR(size_doc, "size()\n--\n\nThe number of ranks in the job.");
PyDoc_STRVAR(local_rank_doc,
             "local_rank()\n--\n\nThis process's rank among the ranks on its host.");
PyDoc_STRVAR(local_size_doc, "local_size()\n--\n\nThe number of ranks on this host.");
PyDoc_STRVAR(num_hosts_doc, "num_hosts()\n--\n\nThe number of distinct hosts of the job.");
PyDoc_STRVAR(world_handle_doc,
             "world_handle()\n--\n\n"
             "The integer handle of the group of all ranks (tnt_group_handle), for the\n"
             "TensorFlow ops, which look the group up with tnt_group_lookup.");

/* The getters of the world group differ only in the libtnt query they make,
 * so one macro writes them all: `name` is also the call named in errors. */
#define TNT_WORLD_GETTER(name, query)                                            \
  static PyObject *core_##name(PyObject *module, PyObject *Py_UNUSED(ignored)) { \
    (void)module;                                                                \
    if (require_context(#name) < 0) return NULL;                                 \
    return PyLong_FromLongLong((long long)query(g_world));                       \
  }

TNT_WORLD_GETTER(rank, tnt_group_rank)
TNT_WORLD_GETTER(size, tnt_group_size)
TNT_WORLD_GETTER(local_rank, tnt_group_local_rank)
TNT_WORLD_GETTER(local_size, tnt_group_local_size)
TNT_WORLD_GETTER(num_hosts, tnt_group_num_hosts)
TNT_WORLD_GETTER(world_handle, tnt_group_handle)

PyDoc_STRVAR(timeout_doc,
             "timeout()\n--\n\n"
             "Seconds any wait for a peer lasts before it fails (the context's timeout).");

static PyObject *core_timeout(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  if (require_context("timeout") < 0) return NULL;
  return PyFloat_FromDouble(tnt_context_timeout(g_ctx));
}

PyDoc_STRVAR(abort_doc,
             "abort(exit_code)\n--\n\n"
             "Ends every process of the job with exit_code (MPI_Abort), after flushing\n"
             "sys.stdout and sys.stderr. For a rank that cannot go on after a failure.");

static PyObject *core_abort(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  static char *kwlist[] = {"exit_code", NULL};
  int code = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i:abort", kwlist, &code)) return NULL;
  if (require_context("abort") < 0) return NULL;
  /* libtnt flushes C's stdio; Python's own buffers are flushed here. */
  static const char *streams[] = {"stdout", "stderr"};
  for (int i = 0; i < 2; ++i) {
    PyObject *f = PySys_GetObject(streams[i]);
    PyObject *r = f != NULL && f != Py_None ? PyObject_CallMethod(f, "flush", NULL) : NULL;
    Py_XDECREF(r);
    PyErr_Clear();
  }
  Py_BEGIN_ALLOW_THREADS
  tnt_context_abort(g_ctx, code);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------ collectives */

/* The group that a `group` argument names: the world for None, else the
 * group of that handle (create_group()); NULL with an exception set. */
static tnt_group_t *group_arg(const char *call, PyObject *obj) {
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

/* Reads a non-negative integer that fits in size_t (also numpy integers). */
static int as_count(const char *call, const char *what, PyObject *obj, size_t *out) {
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

/* ---------------------------------------------------------------- timeline */

PyDoc_STRVAR(settings_load_doc,
             "settings_load()\n--\n\n"
             "Reads every TNT_* setting from the environment (init() does it too).\n"
             "Raises TntInvalidArgumentError, whose message names the setting and lists\n"
             "what it takes, when a value is invalid.");

static PyObject *core_settings_load(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  if (tnt_settings_load() < 0) {
    PyErr_SetString(TntInvalidArgumentError, tnt_last_error());
    return NULL;
  }
  Py_RETURN_NONE;
}

PyDoc_STRVAR(settings_doc,
             "settings()\n--\n\n"
             "Every setting as of the last settings_load() (or the environment, when none\n"
             "ran yet): a tuple of dicts with the keys name, kind (switch, number,\n"
             "integer, choice or text), default, words (a tuple of the words it takes),\n"
             "user (libtnt, python or launcher), help, value (canonical text; '' when a\n"
             "text is unset), source (default, environment or command line) and error\n"
             "(None, or why the environment's value was rejected).");

static PyObject *core_settings(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  static const char *const sources[] = {"default", "environment", "command line"};
  const size_t n = tnt_settings_count();
  PyObject *all = PyTuple_New((Py_ssize_t)n);
  for (size_t i = 0; all != NULL && i < n; ++i) {
    tnt_setting_info_t s;
    tnt_setting_info(i, &s);
    PyObject *words = s.words != NULL ? PyUnicode_FromString(s.words) : PyUnicode_FromString("");
    PyObject *word_tuple = NULL;
    if (words != NULL) {
      PyObject *sep = PyUnicode_FromString("|");
      PyObject *list = sep != NULL && s.words != NULL ? PyUnicode_Split(words, sep, -1)
                                                      : PyList_New(0);
      Py_XDECREF(sep);
      word_tuple = list != NULL ? PyList_AsTuple(list) : NULL;
      Py_XDECREF(list);
      Py_DECREF(words);
    }
    PyObject *d = word_tuple == NULL ? NULL
                                     : Py_BuildValue("{s:s,s:s,s:s,s:N,s:s,s:s,s:s,s:s,s:z}", "name",
                                                     s.name, "kind", s.kind, "default",
                                                     s.default_value, "words", word_tuple, "user",
                                                     s.user, "help", s.help, "value", s.value,
                                                     "source", sources[s.source], "error", s.error);
    if (d == NULL) {
      Py_CLEAR(all);
      break;
    }
    PyTuple_SET_ITEM(all, (Py_ssize_t)i, d);
  }
  return all;
}

PyDoc_STRVAR(timeline_enabled_doc,
             "timeline_enabled()\n--\n\n"
             "True while this process writes a timeline (TNT_TIMELINE was set when init()\n"
             "ran).");

static PyObject *core_timeline_enabled(PyObject *module, PyObject *Py_UNUSED(ignored)) {
  (void)module;
  return PyBool_FromLong(tnt_timeline_enabled());
}

/* timeline_begin, timeline_end and timeline_instant differ only in the
 * phase of the event they add. */
static PyObject *timeline_event(const char *call, char phase, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"name", "category", NULL};
  const char *name = NULL;
  const char *category = "user";
  char format[32];
  snprintf(format, sizeof format, "s|s:%s", call);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, kwlist, &name, &category)) return NULL;
  if (!tnt_timeline_enabled()) Py_RETURN_NONE;
  tnt_status_t st = tnt_timeline_event(name, category, phase);
  if (st < 0) return raise_status(call, st, NULL);
  Py_RETURN_NONE;
}

PyDoc_STRVAR(timeline_begin_doc,
             "timeline_begin(name, category='user')\n--\n\n"
             "Begins a span called name on the calling thread in the timeline (a no-op\n"
             "without one); timeline_end(name) ends it. Spans of a thread nest.");
PyDoc_STRVAR(timeline_end_doc,
             "timeline_end(name, category='user')\n--\n\n"
             "Ends the calling thread's innermost span, which timeline_begin(name) began.");
PyDoc_STRVAR(timeline_instant_doc,
             "timeline_instant(name, category='user')\n--\n\n"
             "Marks an instant called name on the calling thread in the timeline.");

static PyObject *core_timeline_begin(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  return timeline_event("timeline_begin", 'B', args, kwargs);
}

static PyObject *core_timeline_end(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  return timeline_event("timeline_end", 'E', args, kwargs);
}

static PyObject *core_timeline_instant(PyObject *module, PyObject *args, PyObject *kwargs) {
  (void)module;
  return timeline_event("timeline_instant", 'i', args, kwargs);
}

/* ------------------------------------------------------------------ Fusion */

struct FusionObject {
  PyObject_HEAD
  tnt_fusion_t *fusion; /* NULL once closed */
  int64_t handle;
  Py_ssize_t num_buckets;
  Py_ssize_t ntensors;
  long busy;                 /* calls on this set with the GIL released */
  FusionObject *prev, *next; /* in g_fusions while open */
  PyObject *weakreflist;
};

static PyTypeObject FusionType;

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

static void close_all_fusions(void) {
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
                           "tune_threshold", "order",           "overlap", NULL};
  PyObject *tensors_obj, *threshold_obj, *op_obj = NULL, *group_obj = NULL, *wire_obj = NULL;
  const char *order = "list", *overlap = "on";
  int tune = 0;
  PyObject *seq = NULL;
  FusionObject *self = NULL;
  tnt_tensor_info_t *list = NULL;
  tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;
  int wire;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO$Opss:Fusion", kwlist, &tensors_obj,
                                   &threshold_obj, &op_obj, &group_obj, &wire_obj, &tune, &order,
                                   &overlap)) {
    return NULL;
  }
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
  /* libtnt checks the list itself (unique ids: TntInvalidArgumentError,
   * a ValueError) and keeps it; start() and finish() ask it for each
   * tensor's entry (tnt_fusion_tensor). */
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

/* Reads a tensor id and asks the open set `f` for its entry (*t); 0, or
 * -1 with KeyError raised when it is not in the set. */
static int fusion_tensor(const tnt_fusion_t *f, const char *call, PyObject *id_obj,
                         tnt_tensor_info_t *t) {
  PyObject *index = PyNumber_Index(id_obj);
  if (index == NULL) return -1;
  unsigned long long id = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (!PyErr_Occurred() && tnt_fusion_tensor(f, id, t)) return 0;
  PyErr_Clear();
  PyObject *msg = PyUnicode_FromFormat("%s: tensor id %R is not in this Fusion", call, id_obj);
  if (msg != NULL) PyErr_SetObject(PyExc_KeyError, msg);
  Py_XDECREF(msg);
  return -1;
}

/* Acquires the buffer of tensor `t` and checks it against the set's entry. */
static int fusion_buffer(const char *call, const char *name, PyObject *obj, int writable,
                         const tnt_tensor_info_t *t, tensor_t *out) {
  /* bfloat16 has no buffer format of its own: such tensors take any buffer
   * of 2-byte elements. */
  int want = t->dtype == TNT_BFLOAT16 ? TNT_BFLOAT16 : -1;
  if (get_tensor(call, name, obj, writable, want, out) < 0) return -1;
  if (out->dtype != t->dtype) {
    PyErr_Format(PyExc_TypeError, "%s: tensor %llu is %s but %s holds %s", call,
                 (unsigned long long)t->id, tnt_dtype_name(t->dtype), name,
                 tnt_dtype_name(out->dtype));
    release_tensor(out);
    return -1;
  }
  if (out->count != t->count) {
    PyErr_Format(PyExc_ValueError, "%s: tensor %llu has %zu elements but %s has %zu", call,
                 (unsigned long long)t->id, t->count, name, out->count);
    release_tensor(out);
    return -1;
  }
  return 0;
}

/* What Fusion.start and Fusion.finish both begin with: the open set, the
 * id of tensor `id_obj`, and the tensor's buffer `obj` (argument `name`).
 * Returns NULL with an exception raised and `buf` released on failure. */
static tnt_fusion_t *fusion_tensor_buffer(FusionObject *self, const char *call, PyObject *id_obj,
                                          const char *name, PyObject *obj, int writable,
                                          uint64_t *id, tensor_t *buf) {
  tnt_fusion_t *f = fusion_get(self, call);
  if (f == NULL) return NULL;
  tnt_tensor_info_t t;
  if (fusion_tensor(f, call, id_obj, &t) < 0) return NULL;
  if (fusion_buffer(call, name, obj, writable, &t, buf) < 0) return NULL;
  *id = t.id;
  return f;
}

PyDoc_STRVAR(fusion_bucket_of_doc,
             "bucket_of(id)\n--\n\n"
             "The index of the bucket that holds tensor id (KeyError when unknown).");

static PyObject *fusion_bucket_of(FusionObject *self, PyObject *id_obj) {
  static const char call[] = "Fusion.bucket_of";
  tnt_fusion_t *f = fusion_get(self, call);
  if (f == NULL) return NULL;
  tnt_tensor_info_t t;
  if (fusion_tensor(f, call, id_obj, &t) < 0) return NULL;
  return PyLong_FromLong(tnt_fusion_bucket_of(f, t.id));
}

PyDoc_STRVAR(fusion_start_doc,
             "start(id, buf)\n--\n\n"
             "Copies buf (tensor id's data: its dtype and element count) into the tensor's\n"
             "bucket and returns at once; once every tensor of a bucket has started, the\n"
             "bucket is reduced in the background. Each tensor starts once per round, and\n"
             "a round of a bucket ends when every tensor of the bucket has finished:\n"
             "starting a tensor again before that raises TntError.");

static PyObject *fusion_start(FusionObject *self, PyObject *args, PyObject *kwargs) {
  static const char call[] = "Fusion.start";
  static char *kwlist[] = {"id", "buf", NULL};
  PyObject *id_obj, *buf_obj;
  tensor_t buf = {0};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:start", kwlist, &id_obj, &buf_obj)) {
    return NULL;
  }
  uint64_t id;
  tnt_fusion_t *f = fusion_tensor_buffer(self, call, id_obj, "buf", buf_obj, 0, &id, &buf);
  if (f == NULL) return NULL;
  tnt_status_t st;
  ++self->busy;
  TNT_WITHOUT_GIL(st = tnt_fusion_start(f, id, buf.view.buf));
  --self->busy;
  release_tensor(&buf);
  return result_of(call, st, NULL, Py_None);
}

PyDoc_STRVAR(fusion_finish_doc,
             "finish(id, out, timeout_s=-1)\n--\n\n"
             "Waits for the bucket of tensor id (at most timeout_s seconds; < 0 or None:\n"
             "the context timeout) and copies the reduced tensor into out (writable, the\n"
             "tensor's dtype and element count). Returns out. Raises TntTimeoutError when\n"
             "the bucket is not done in time (the log names the tensors this rank has not\n"
             "started); finish may then be called again.");

static PyObject *fusion_finish(FusionObject *self, PyObject *args, PyObject *kwargs) {
  static const char call[] = "Fusion.finish";
  static char *kwlist[] = {"id", "out", "timeout_s", NULL};
  PyObject *id_obj, *out_obj, *timeout_obj = Py_None;
  tensor_t out = {0};
  double timeout_s = -1.0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:finish", kwlist, &id_obj, &out_obj,
                                   &timeout_obj)) {
    return NULL;
  }
  if (timeout_obj != Py_None) {
    timeout_s = PyFloat_AsDouble(timeout_obj);
    if (timeout_s == -1.0 && PyErr_Occurred()) return NULL;
    if (timeout_s != timeout_s) {
      PyErr_Format(PyExc_ValueError, "%s: timeout_s must be a number of seconds, not nan", call);
      return NULL;
    }
  }
  uint64_t id;
  tnt_fusion_t *f = fusion_tensor_buffer(self, call, id_obj, "out", out_obj, 1, &id, &out);
  if (f == NULL) return NULL;
  tnt_status_t st;
  ++self->busy;
  TNT_WITHOUT_GIL(st = tnt_fusion_finish(f, id, out.view.buf, timeout_s));
  --self->busy;
  release_tensor(&out);
  return result_of(call, st, NULL, out_obj);
}

PyDoc_STRVAR(fusion_close_doc,
             "close()\n--\n\n"
             "Destroys the fusion set (waiting for reductions still running); its handle\n"
             "is then invalid. Idempotent; also done when the object is deleted.");

static PyObject *fusion_close(FusionObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->busy > 0) {
    PyErr_Format(TntError,
                 "Fusion.close: another thread is inside start() or finish() of this "
                 "Fusion; close it once they returned");
    return NULL;
  }
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

static PyObject *fusion_get_closed(FusionObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->fusion == NULL);
}

static PyObject *fusion_repr(FusionObject *self) {
  return PyUnicode_FromFormat("<tarantella._core.Fusion handle=%lld, %zd tensors in %zd buckets%s>",
                              (long long)self->handle, self->ntensors, self->num_buckets,
                              self->fusion == NULL ? ", closed" : "");
}

static PyMethodDef fusion_methods[] = {
    {"bucket_of", (PyCFunction)fusion_bucket_of, METH_O, fusion_bucket_of_doc},
    {"start", TNT_PYFN(fusion_start), METH_VARARGS | METH_KEYWORDS, fusion_start_doc},
    {"finish", TNT_PYFN(fusion_finish), METH_VARARGS | METH_KEYWORDS, fusion_finish_doc},
    {"close", (PyCFunction)fusion_close, METH_NOARGS, fusion_close_doc},
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
    {"closed", (getter)fusion_get_closed, NULL, "True once close() has run.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(fusion_doc,
             "Fusion(tensors, threshold_bytes, op='average', group=None, *, wire_dtype=None,\n"
             "       tune_threshold=False, order='list', overlap='on')\n--\n\n"
             "A tensor fusion set over all ranks (over `group`, a create_group() handle,\n"
             "when given). tensors lists (id, count, dtype) in the\n"
             "order the tensors become ready (backprop order): id a unique integer, count\n"
             "the number of elements, dtype a name ('float32', 'float64', 'float16',\n"
             "'bfloat16', 'int8', 'int16', 'int32', 'int64', 'uint8'). Tensors are packed\n"
             "into buckets of one dtype\n"
             "each that close at threshold_bytes (0: one tensor per bucket); each bucket is\n"
             "reduced with op as soon as all its tensors have started. Creation is\n"
             "collective: every rank passes the same list. Each round, every tensor is\n"
             "started once (start) and finished once (finish). wire_dtype 'float16' or\n"
             "'bfloat16' sends float32 tensors in 16 bits (each reduction step adds in\n"
             "float32); None or 'float32' sends them as they are. tune_threshold=True\n"
             "ignores threshold_bytes: the set tries 32 KiB to 8 MiB in its first rounds\n"
             "and keeps the master's fastest; order='readiness' fills the buckets in the\n"
             "order the master started the tensors in the first round; overlap='off'\n"
             "reduces no bucket before every tensor has started the round, 'auto' keeps\n"
             "the faster of on and off, timed in the first rounds (see tnt_fusion_options_t\n"
             "in tnt.h).");

/* clang-format cannot lay out the head macros of these two initializers. */
// clang-format off
static PyTypeObject FusionType = {
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

/* ------------------------------------------------------------------ module */

static PyMethodDef core_methods[] = {
    {"init", TNT_PYFN(core_init), METH_VARARGS | METH_KEYWORDS, init_doc},
    {"finalize", (PyCFunction)core_finalize, METH_NOARGS, finalize_doc},
    {"_finalize_at_exit", (PyCFunction)core_finalize_at_exit, METH_NOARGS, finalize_at_exit_doc},
    {"is_initialized", (PyCFunction)core_is_initialized, METH_NOARGS, is_initialized_doc},
    {"rank", (PyCFunction)core_rank, METH_NOARGS, rank_doc},
    {"size", (PyCFunction)core_size, METH_NOARGS, size_doc},
    {"local_rank", (PyCFunction)core_local_rank, METH_NOARGS, local_rank_doc},
    {"local_size", (PyCFunction)core_local_size, METH_NOARGS, local_size_doc},
    {"num_hosts", (PyCFunction)core_num_hosts, METH_NOARGS, num_hosts_doc},
    {"timeout", (PyCFunction)core_timeout, METH_NOARGS, timeout_doc},
    {"world_handle", (PyCFunction)core_world_handle, METH_NOARGS, world_handle_doc},
    {"create_group", (PyCFunction)core_create_group, METH_O, create_group_doc},
    {"allreduce", TNT_PYFN(core_allreduce), METH_VARARGS | METH_KEYWORDS, allreduce_doc},
    {"broadcast", TNT_PYFN(core_broadcast), METH_VARARGS | METH_KEYWORDS, broadcast_doc},
    {"allgather", TNT_PYFN(core_allgather), METH_VARARGS | METH_KEYWORDS, allgather_doc},
    {"allgatherv", TNT_PYFN(core_allgatherv), METH_VARARGS | METH_KEYWORDS, allgatherv_doc},
    {"barrier", (PyCFunction)core_barrier, METH_NOARGS, barrier_doc},
    {"settings_load", (PyCFunction)core_settings_load, METH_NOARGS, settings_load_doc},
    {"settings", (PyCFunction)core_settings, METH_NOARGS, settings_doc},
    {"abort", TNT_PYFN(core_abort), METH_VARARGS | METH_KEYWORDS, abort_doc},
    {"timeline_enabled", (PyCFunction)core_timeline_enabled, METH_NOARGS, timeline_enabled_doc},
    {"timeline_begin", TNT_PYFN(core_timeline_begin), METH_VARARGS | METH_KEYWORDS,
     timeline_begin_doc},
    {"timeline_end", TNT_PYFN(core_timeline_end), METH_VARARGS | METH_KEYWORDS, timeline_end_doc},
    {"timeline_instant", TNT_PYFN(core_timeline_instant), METH_VARARGS | METH_KEYWORDS,
     timeline_instant_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(core_doc,
             "Tarantella's communication core (libtnt) for Python.\n\n"
             "init() starts communication among all ranks of the job; the collectives\n"
             "(allreduce, broadcast, allgather, allgatherv, barrier) then work in place on\n"
             "numpy arrays or any other C-contiguous buffer, over all ranks, and Fusion\n"
             "reduces many tensors through fusion buckets. Every call blocks at most the\n"
             "context timeout (init(timeout_s=...) or TNT_TIMEOUT_S, default 30 s) and\n"
             "raises TntTimeoutError naming the missing peer instead of hanging; a\n"
             "communication failure raises TntError, after which the job should end.");

// clang-format off
static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tarantella._core",
    .m_doc = core_doc,
    .m_size = -1,
    .m_methods = core_methods,
};
// clang-format on

/* The subclasses of TntError: each is also `also` (unless NULL). */
static const struct {
  PyObject **cls;
  const char *name;
  PyObject **also;
  const char *doc;
} kErrors[] = {
    {&TntTimeoutError, "TntTimeoutError", &PyExc_TimeoutError,
     "A peer did not answer within the timeout (TNT_ERR_TIMEOUT): a TntError that is also a "
     "TimeoutError."},
    {&TntInvalidArgumentError, "TntInvalidArgumentError", &PyExc_ValueError,
     "libtnt refused an argument (TNT_ERR_INVALID_ARG): a TntError that is also a ValueError."},
    {&TntMismatchError, "TntMismatchError", NULL,
     "The ranks called different collectives, or the same with different arguments, at the "
     "same point (TNT_ERR_MISMATCH)."},
    {&TntNoMemoryError, "TntNoMemoryError", &PyExc_MemoryError,
     "libtnt ran out of memory (TNT_ERR_NO_MEMORY): a TntError that is also a MemoryError."},
    {&TntUnsupportedError, "TntUnsupportedError", &PyExc_NotImplementedError,
     "Not supported by this build or MPI (TNT_ERR_UNSUPPORTED): a TntError that is also a "
     "NotImplementedError."},
};

/* A subclass of TntError (and of `also`, unless NULL) added to module m as
 * `name`; NULL with an exception set on failure. The module holds the
 * reference that the static pointer uses. */
static PyObject *new_error(PyObject *m, const char *name, PyObject *also, const char *doc) {
  char qualified[64];
  snprintf(qualified, sizeof qualified, "tarantella._core.%s", name);
  PyObject *bases = also != NULL ? PyTuple_Pack(2, TntError, also) : Py_NewRef(TntError);
  if (bases == NULL) return NULL;
  PyObject *cls = PyErr_NewExceptionWithDoc(qualified, doc, bases, NULL);
  Py_DECREF(bases);
  if (cls == NULL) return NULL;
  if (PyModule_AddObject(m, name, cls) < 0) {
    Py_DECREF(cls);
    return NULL;
  }
  return cls;
}

PyMODINIT_FUNC PyInit__core(void) {
  PyObject *m = NULL;
  if (PyType_Ready(&FusionType) < 0) goto fail;
  m = PyModule_Create(&core_module);
  if (m == NULL) goto fail;
  TntError = PyErr_NewExceptionWithDoc(
      "tarantella._core.TntError",
      "A libtnt call failed. The message names the status and the context's first failure "
      "(which peer was missing); attributes: status (the tnt_status_t code) and "
      "context_error (the context's message, empty when the context is healthy).",
      PyExc_RuntimeError, NULL);
  if (TntError == NULL) goto fail;
  if (PyModule_AddObjectRef(m, "TntError", TntError) < 0) goto fail;
  for (size_t k = 0; k < sizeof kErrors / sizeof kErrors[0]; ++k) {
    PyObject *also = kErrors[k].also != NULL ? *kErrors[k].also : NULL;
    *kErrors[k].cls = new_error(m, kErrors[k].name, also, kErrors[k].doc);
    if (*kErrors[k].cls == NULL) goto fail;
  }
  if (PyModule_AddObjectRef(m, "Fusion", (PyObject *)&FusionType) < 0) goto fail;
  if (PyModule_AddStringConstant(m, "__version__", TNT_VERSION_STRING) < 0) goto fail;
  return m;
fail:
  Py_XDECREF(m);
  return NULL;
}
