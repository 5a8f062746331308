"""Automatic cutting: where to cut a model into balanced pipeline stages.

Not available yet: choose_cuts raises until it is.
"""
from tarantella import runtime


def choose_cuts(model, num_stages):
    """Names of the num_stages - 1 layers after which `model` is cut."""
    raise runtime.TarantellaError(
        f"automatic cutting (num_stages={num_stages}) is not available yet: place "
        "tnt.keras.layers.SplitLayer() where model '{model.name}' is to be cut")
