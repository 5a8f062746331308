"""Distributed versions of Keras objects, made by subclassing them in place.

``tnt.Model(model)`` and the distributed optimizer do what Horovod does for
Keras optimizers: the object keeps its identity, its state and its class's
behaviour, and its class becomes a subclass of the original one that puts
Tarantella's methods in front (``mixin``). The subclass carries the name and
module of the original class, so that Keras serializes the object as the
original class and plain Keras loads what Tarantella saves.
"""
import contextlib

from tarantella import _keras_internals

_CLASSES = {}


def mixin_class(mixin, base):
    """The class (cached) whose instances behave as `mixin` in front of `base`."""
    key = (mixin, base)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = type(base.__name__, (mixin, base), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__, "_tnt_base": base})
        _CLASSES[key] = cls
        _keras_internals.serialize_as(cls, base)
    return cls


def add_mixin(obj, mixin):
    """Turns `obj` into an instance of mixin_class(mixin, type(obj)), once."""
    if not isinstance(obj, mixin):
        obj.__class__ = mixin_class(mixin, type(obj))
    return obj


def base_class(obj):
    """The class `obj` had before add_mixin."""
    return getattr(type(obj), "_tnt_base", type(obj))


@contextlib.contextmanager
def original_classes(objects):
    """Gives every object of `objects` its original class for the duration
    (for writers that record the exact class of what they write)."""
    def original(cls):  # below every mixin the object was given
        while "_tnt_base" in vars(cls):
            cls = cls._tnt_base
        return cls

    changed = [(o, type(o)) for o in objects if original(type(o)) is not type(o)]
    for o, cls in changed:
        o.__class__ = original(cls)
    try:
        yield
    finally:
        for o, cls in changed:
            o.__class__ = cls
