"""Tarantella's settings: every ``TNT_*`` variable, as libtnt's registry reads them.

Each setting is declared once, in libtnt (``src/util/settings.def``), with its
kind, default, accepted values and a line of help; ``tarantella --settings``
prints them all. This module is the only way the Python package reads one:
no module reads a ``TNT_`` variable from the environment itself. The
registry reads the environment when ``tnt.init()`` runs (or at the first
``get`` before that); a bad value raises a ``TarantellaError`` that names the
setting and lists what it takes.
"""
from tarantella import _core
from tarantella.errors import TarantellaError

_values = None


def load():
    """Reads every setting from the environment again; returns nothing.
    Raises TarantellaError for an invalid value."""
    global _values
    try:
        _core.settings_load()
    except _core.TntInvalidArgumentError as e:
        raise TarantellaError(str(e)) from None
    _values = {s["name"]: s for s in _core.settings()}


def describe():
    """Every setting as a dict (name, kind, default, words, user, help,
    value, source, error), in the registry's order."""
    if _values is None:
        load()
    return list(_values.values())


def get(name):
    """The value of setting ``name``: a bool for a switch, a number (int for
    an integer) or one of its words (a str, such as "auto") for a number, the
    word for a choice, the text (None when unset) for a text."""
    if _values is None:
        load()
    s = _values[name]
    value, kind = s["value"], s["kind"]
    if kind == "switch":
        return value == "on"
    if kind in ("number", "integer") and value not in s["words"]:
        return int(value) if kind == "integer" else float(value)
    if kind == "text":
        return value or None
    return value
