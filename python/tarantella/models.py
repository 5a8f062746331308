"""Saving, loading and rebuilding models: ``tnt.models``.

Files are written once and atomically (saving.py) and are ordinary Keras
files. Loading returns a tnt.Model, compiled when the model was saved
compiled.
"""
import json
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
               parallel_strategy=ParallelStrategy.DATA, num_micro_batches=None, num_stages=None,
               pipeline_schedule=None, zero_stage=0):
    """A tnt.Model from a file written by save; compiled if it was saved
    compiled (and compile=True), distributed as tnt.Model(model,
    parallel_strategy, num_micro_batches, num_stages, pipeline_schedule,
    zero_stage=zero_stage) does (a file's SplitLayers are its cuts).
    Pipelined, a .keras file is built without allocating the weights and
    each rank reads its stage's only; with zero_stage > 0, each rank reads
    its part of the optimizer's state only."""
    runtime.require_init()
    path = os.fspath(filepath)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file; give the path that save() wrote")
    if path.endswith(".keras") and not zipfile.is_zipfile(path):
        raise runtime.TarantellaError(
            f"{path} is not a .keras file written by save() (it is not a zip archive): the "
            "file is damaged, or of another kind")
    if (ParallelStrategy.PIPELINING in parallel_strategy or zero_stage) and \
            path.endswith(".keras"):
        return _load_in_parts(path, custom_objects, compile, safe_mode, parallel_strategy,
                              num_micro_batches, num_stages, pipeline_schedule, zero_stage)
    return Model(keras.saving.load_model(filepath, custom_objects=custom_objects,
                                         compile=compile, safe_mode=safe_mode),
                 parallel_strategy, num_micro_batches, num_stages, pipeline_schedule,
                 zero_stage=zero_stage)


def _load_in_parts(path, custom_objects, compile, safe_mode, strategy, num_micro_batches,
                   num_stages, schedule, zero_stage):
    """load_model for a pipeline, or with a sharded optimizer state: the
    model is built from the file's config (a pipeline's without allocating
    a weight: tnt.Model of a build function) and compiled with a new
    optimizer, then each rank reads its values only, its stage's or its
    parts (the file must be readable on every rank)."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    compile_config = config.pop("compile_config", None)

    def build():
        return keras.saving.deserialize_keras_object(config, custom_objects=custom_objects,
                                                     safe_mode=safe_mode)
    model = Model(build, strategy, num_micro_batches, num_stages, schedule,
                  zero_stage=zero_stage)
    if compile and compile_config:
        model.compile_from_config(compile_config)
    model.load_weights(path)
    return model


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
