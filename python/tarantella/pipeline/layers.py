"""SplitLayer: the mark of a cut between two pipeline stages.

A cut is a Keras ``Identity`` layer whose name starts with ``tnt_split``:
a model that holds cuts is an ordinary Keras model, which Keras alone
saves, loads and runs (where it does nothing), and Tarantella finds the
cuts again in a model loaded from a file.
"""
import keras

MARK = "tnt_split"


def is_split_layer(layer):
    """True when `layer` marks a cut (made by SplitLayer, or loaded from a file)."""
    return type(layer) is keras.layers.Identity and layer.name.startswith(MARK)


class _SplitLayerType(type):
    def __instancecheck__(cls, obj):
        return is_split_layer(obj)


class SplitLayer(metaclass=_SplitLayerType):
    """``SplitLayer(name=None)``: an identity layer; in a pipelined
    tnt.Model, the layers before it and the layers after it run on
    different ranks, and its output travels from one to the other. Several
    SplitLayers that are equally deep in the model cut several tensors at
    the same cut; each cuts one tensor. Outside a pipeline (plain Keras,
    data parallelism) it does nothing.

    It is a ``keras.layers.Identity`` named ``tnt_split_<name>`` (or
    ``tnt_split_<n>`` without a name), so that a saved model loads without
    Tarantella; ``isinstance(layer, SplitLayer)`` recognizes it."""

    def __new__(cls, name=None, **kwargs):
        if name is None:
            name = f"{MARK}_{keras.backend.get_uid(MARK)}"
        elif not name.startswith(MARK):
            name = f"{MARK}_{name}"
        return keras.layers.Identity(name=name, **kwargs)
