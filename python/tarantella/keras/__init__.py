"""Keras-shaped helpers of Tarantella (``tnt.keras.callbacks``, ``tnt.keras.layers``)."""
from tarantella.keras import callbacks
from tarantella.keras import layers

__all__ = ["callbacks", "layers"]
