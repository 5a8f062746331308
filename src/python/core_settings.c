/*
 * tarantella._core's view of libtnt's settings registry: settings_load()
 * and settings().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core.h"

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


PyMethodDef core_settings_methods[] = {
    {"settings_load", (PyCFunction)core_settings_load, METH_NOARGS, settings_load_doc},
    {"settings", (PyCFunction)core_settings, METH_NOARGS, settings_doc},
    {NULL, NULL, 0, NULL},
};
