/*
 * tarantella._core's timeline calls: whether this process writes one, and
 * the user's own spans and instants in it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>

#include "core.h"

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

PyMethodDef core_timeline_methods[] = {
    {"timeline_enabled", (PyCFunction)core_timeline_enabled, METH_NOARGS, timeline_enabled_doc},
    {"timeline_begin", TNT_PYFN(core_timeline_begin), METH_VARARGS | METH_KEYWORDS,
     timeline_begin_doc},
    {"timeline_end", TNT_PYFN(core_timeline_end), METH_VARARGS | METH_KEYWORDS, timeline_end_doc},
    {"timeline_instant", TNT_PYFN(core_timeline_instant), METH_VARARGS | METH_KEYWORDS,
     timeline_instant_doc},
    {NULL, NULL, 0, NULL},
};
