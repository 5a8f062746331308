"""Saving, loading and rebuilding models: ``tnt.models``.

Files are written once and atomically (saving.py) and are ordinary Keras
files. Loading returns a tnt.Model, compiled when the model was saved
compiled.
"""
import os
import zipfile

import keras

from tarantella import runtime
from tarantella import saving
from tarantella.model import Model
from tarantella.pipeline.layout import ParallelStrategy

def save_model(model, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
    """Saves a tnt.Model or a keras.Model like tnt.Model.save."""
    if isinstance(model, Model):
        return model.save(filepath, overwrite=overwrite,
                          tnt_save_all_devices=tnt_save_all_devices, **kwargs)
    saving.write_on_master(filepath, overwrite, tnt_save_all_devices,
                           lambda path: model.save(path, overwrite=True, **kwargs))


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True,
               parallel_strategy=ParallelStrategy.DATA, num_micro_batches=None, num_stages=None):
    """A tnt.Model from a file written by save; compiled if it was saved
    compiled (and compile=True), distributed as tnt.Model(model,
    parallel_strategy, num_micro_batches, num_stages) does (a file's
    SplitLayers are its cuts)."""
    runtime.require_init()
    path = os.fspath(filepath)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file; give the path that save() wrote")
    if path.endswith(".keras") and not zipfile.is_zipfile(path):
        raise runtime.TarantellaError(
            f"{path} is not a .keras file written by save() (it is not a zip archive): the "
            "file is damaged, or of another kind")
    return Model(keras.saving.load_model(filepath, custom_objects=custom_objects,
                                         compile=compile, safe_mode=safe_mode),
                 parallel_strategy, num_micro_batches, num_stages)


def model_from_config(config, custom_objects=None):
    """A tnt.Model with the architecture of `config` (model.get_config())."""
    return Model.from_config(config, custom_objects=custom_objects)


def model_from_json(json_string, custom_objects=None):
    runtime.require_init()
    return Model(keras.models.model_from_json(json_string, custom_objects=custom_objects))


def clone_model(model, **kwargs):
    """A tnt.Model with the architecture of `model` and new weights."""
    runtime.require_init()
    return Model(keras.models.clone_model(model, **kwargs))


def model_from_yaml(*args, **kwargs):
    raise runtime.TarantellaError(
        "model_from_yaml() is gone from Keras 3: save the architecture with model.to_json() "
        "and load it with tnt.models.model_from_json()")
