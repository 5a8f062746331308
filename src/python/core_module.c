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

#include <stdio.h>

#include "core.h"

/* ------------------------------------------------------------ module state */

/* The context and its world group (core.h). */

enum ctx_state g_state = NOT_INITIALIZED;
tnt_context_t *g_ctx;
tnt_group_t *g_world;
/* Why init() failed, for the message of every later call. */
static char g_init_error[256];
long g_busy;
static int g_atexit_registered;

/* TntError and its subclasses (core.h); exception_for picks one. */
PyObject *TntError;
static PyObject *TntTimeoutError;
PyObject *TntInvalidArgumentError;
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
PyObject *raise_status(const char *call, tnt_status_t st, const char *detail) {
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
int require_context(const char *call) {
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

/* The end of an entry point that made the libtnt call `call`: raises for a
 * failed status `st` (with `detail` when given), and otherwise returns a
 * new reference to `result`. */
PyObject *result_of(const char *call, tnt_status_t st, const char *detail, PyObject *result) {
  if (st < 0) return raise_status(call, st, detail);
  Py_INCREF(result);
  return result;
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
    {"abort", TNT_PYFN(core_abort), METH_VARARGS | METH_KEYWORDS, abort_doc},
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
  PyMethodDef *const more[] = {core_collective_methods, core_settings_methods,
                               core_timeline_methods};
  for (size_t k = 0; k < sizeof more / sizeof more[0]; ++k) {
    if (PyModule_AddFunctions(m, more[k]) < 0) goto fail;
  }
  if (PyModule_AddObjectRef(m, "Fusion", (PyObject *)&FusionType) < 0) goto fail;
  if (PyModule_AddStringConstant(m, "__version__", TNT_VERSION_STRING) < 0) goto fail;
  return m;
fail:
  Py_XDECREF(m);
  return NULL;
}
