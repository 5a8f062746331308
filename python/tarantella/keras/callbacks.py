"""``tnt.keras.callbacks.Callback(cb, run_on_all_ranks=True, aggregate_logs=True)``."""
from tarantella.callbacks import Callback

__all__ = ["Callback"]
