"""Tarantella: data-parallel and pipelined training of Keras models on many processes.

    import tarantella as tnt
    model = tnt.Model(keras_model)   # then compile / fit / evaluate as usual
"""
from tarantella import _requirements  # noqa: F401 (first: TensorFlow 2.21 is there, or what to install)
from tarantella import data
from tarantella import keras
from tarantella.collectives import TensorAllgatherer
from tarantella.collectives import TensorAllreducer
from tarantella.collectives import TensorBroadcaster
from tarantella import models
from tarantella import settings
from tarantella.loops import DistributedGradientTape
from tarantella.loops import allreduce
from tarantella.loops import broadcast_variables
from tarantella.model import Model
from tarantella.model import Sequential
from tarantella.optimizers import distribute as distribute_optimizer
from tarantella.pipeline import ParallelStrategy
from tarantella.errors import TarantellaError
from tarantella.runtime import get_local_rank
from tarantella.runtime import get_local_size
from tarantella.runtime import get_master_rank
from tarantella.runtime import get_rank
from tarantella.runtime import get_size
from tarantella.runtime import init
from tarantella.runtime import is_master_rank

__version__ = "0.1.0"

__all__ = ["Model", "Sequential", "TensorAllreducer", "TensorBroadcaster", "TensorAllgatherer",
           "ParallelStrategy", "TarantellaError", "keras", "models", "data", "settings", "init",
           "get_rank", "get_size",
           "get_master_rank", "is_master_rank", "get_local_rank", "get_local_size",
           "DistributedGradientTape", "distribute_optimizer", "broadcast_variables", "allreduce"]
