"""Keras layers of Tarantella (``tnt.keras.layers``)."""
from tarantella.pipeline.layers import SplitLayer

__all__ = ["SplitLayer"]
