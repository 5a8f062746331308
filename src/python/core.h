/*
 * tarantella._core: the Python binding of libtnt. What its files share:
 * core_module.c (module state, exceptions, the context calls, the module),
 * core_args.c (dtype and op names, buffers, counts, groups),
 * core_collectives.c, core_fusion.c (the Fusion type), core_settings.c
 * and core_timeline.c.
 *
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
#ifndef TNT_PYTHON_CORE_H
#define TNT_PYTHON_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "tnt/tnt.h"

/* Casts a METH_VARARGS | METH_KEYWORDS function to PyCFunction; the detour
 * through void (*)(void) keeps -Wcast-function-type quiet. */
#define TNT_PYFN(f) ((PyCFunction)(void (*)(void))(f))

/* ------------------------------------------------- module state (core_module.c) */

enum ctx_state { NOT_INITIALIZED, INITIALIZING, READY, FINALIZED, INIT_FAILED };

extern enum ctx_state g_state;
extern tnt_context_t *g_ctx;
extern tnt_group_t *g_world;
/* Calls that use g_ctx with the GIL released. */
extern long g_busy;

/* TntError and its subclasses, one for each status that a caller may want
 * to catch on its own. */
extern PyObject *TntError;
extern PyObject *TntInvalidArgumentError;

/* Raises the TntError subclass of status `st` of `call`, with `detail`
 * when given, libtnt's reason and the context's first failure; returns
 * NULL. */
PyObject *raise_status(const char *call, tnt_status_t st, const char *detail);
/* 0 when the context is ready; otherwise raises TntError naming `call`
 * and what to do, and returns -1. */
int require_context(const char *call);
/* The end of an entry point that made the libtnt call `call`: raises for a
 * failed status `st` (with `detail` when given), and otherwise returns a
 * new reference to `result`. */
PyObject *result_of(const char *call, tnt_status_t st, const char *detail, PyObject *result);

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

/* ------------------------------------------------------ arguments (core_args.c) */

/* Parses a dtype name ("float32", ...) or None (*out = -1). */
int parse_dtype(const char *call, PyObject *obj, int *out);
/* Parses "sum", "average", "min" or "max"; NULL gives `fallback`. */
int parse_op(const char *call, PyObject *obj, tnt_op_t fallback, tnt_op_t *out);
/* Reads a non-negative integer that fits in size_t (also numpy integers). */
int as_count(const char *call, const char *what, PyObject *obj, size_t *out);
/* The group that a `group` argument names: the world for None, else the
 * group of that handle (create_group()); NULL with an exception set. */
tnt_group_t *group_arg(const char *call, PyObject *obj);

/* A buffer seen as a flat array of one libtnt dtype. */
typedef struct tensor {
  Py_buffer view;
  int held;
  tnt_dtype_t dtype;
  size_t count;
} tensor_t;

void release_tensor(tensor_t *t);
/*
 * Acquires `obj` (argument `name` of `call`) as a C-contiguous array,
 * writable when `writable`. With `dtype` >= 0 the buffer is taken as that
 * dtype whatever its format says (its item size must match), which is how
 * bfloat16 arrays without a usable format get in; otherwise the format
 * decides. On failure raises and leaves `t` released.
 */
int get_tensor(const char *call, const char *name, PyObject *obj, int writable, int dtype,
               tensor_t *t);
/*
 * Acquires the buffers of the collective `call`, as every collective takes
 * them. With `out_obj` NULL the call works in place: the input `in_name`
 * is acquired writable and `out` (which may be NULL) is left alone.
 * Otherwise the input is read and the output `out_name` written: it must
 * hold the input's dtype and lie apart from it, or, with `same_allowed`,
 * be the input itself. `dtype` as for get_tensor. On failure raises; the
 * caller releases both either way.
 */
int get_buffers(const char *call, const char *in_name, PyObject *in_obj, const char *out_name,
                PyObject *out_obj, int same_allowed, int dtype, tensor_t *in, tensor_t *out);

/* ------------------------------------------- the module's functions, by file */

extern PyMethodDef core_collective_methods[]; /* core_collectives.c */
extern PyMethodDef core_settings_methods[];   /* core_settings.c */
extern PyMethodDef core_timeline_methods[];   /* core_timeline.c */

/* The Fusion type (core_fusion.c); close_all_fusions closes every open one
 * before the context goes away. */
extern PyTypeObject FusionType;
void close_all_fusions(void);

#endif
