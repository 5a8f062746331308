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
    Tarantella; ``isinstance(layer, SplitLayer)`` recognizes it. Called on
    several tensors, it raises a ValueError."""

    def __new__(cls, name=None, **kwargs):
        if name is None:
            name = f"{MARK}_{keras.backend.get_uid(MARK)}"
        elif not name.startswith(MARK):
            name = f"{MARK}_{name}"
        layer = keras.layers.Identity(name=name, **kwargs)
        # Keras computes the layer's output with compute_output_spec on
        # symbolic tensors (building a model) and with call on eager ones;
        # the checks are the layer's own, so its class (and what Keras
        # saves) stays Identity.
        layer.call = _one_tensor(layer, layer.call)
        layer.compute_output_spec = _one_tensor(layer, layer.compute_output_spec)
        return layer


def _one_tensor(layer, method):
    """`method` of `layer`, raising a ValueError when given several tensors."""
    def checked(inputs, *args, **kwargs):
        if isinstance(inputs, (list, tuple, dict)):
            raise ValueError(
                f"SplitLayer '{layer.name}' was given {len(inputs)} tensors; a SplitLayer cuts "
                "one tensor: put one SplitLayer on each tensor that crosses the cut")
        return method(inputs, *args, **kwargs)
    return checked
