"""Keras-shaped helpers of Tarantella (``tnt.keras.callbacks``)."""
from tarantella.keras import callbacks

__all__ = ["callbacks"]
