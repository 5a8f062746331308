"""Saving, loading and rebuilding models: ``tnt.models``.

Files are written by the master rank only (every rank waits until they
exist), or by every rank with ``tnt_save_all_devices=True``; either way
through a temporary file and a rename, so an interrupted save never leaves
a half-written file under the final name. Loading returns a tnt.Model,
compiled when the model was saved compiled.
"""
import os
import zipfile

import keras
import numpy as np

from tarantella import _core
from tarantella import runtime
from tarantella.model import Model

# Endings that Keras requires a path to keep.
_SUFFIXES = (".weights.h5", ".weights.json", ".keras", ".h5", ".json")


def _temporary_name(path):
    head, base = os.path.split(os.path.abspath(path))
    suffix = next((s for s in _SUFFIXES if base.endswith(s)), "")
    stem = base[:len(base) - len(suffix)] if suffix else base
    return os.path.join(head, f".{stem}.tnt-tmp-{os.getpid()}{suffix}")


def write_atomically(filepath, write):
    """Runs write(temporary_path) and renames the result to `filepath`, so
    that `filepath` is either the old file or the complete new one."""
    filepath = os.fspath(filepath)
    tmp = _temporary_name(filepath)
    try:
        write(tmp)
        os.replace(tmp, filepath)
    except Exception as e:
        # The writer only saw the temporary name: the message names the real one.
        if tmp not in str(e):
            raise
        try:
            renamed = type(e)(str(e).replace(tmp, filepath))
        except Exception:  # an exception class that wants other arguments
            raise e from None
        raise renamed from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_on_master(filepath, overwrite, all_devices, write):
    """write_atomically on the master (or every rank), then every rank waits.
    Collective."""
    filepath = os.fspath(filepath)
    if not overwrite and os.path.exists(filepath):
        raise runtime.TarantellaError(f"{filepath} exists and overwrite=False: remove it or "
                                      "pass overwrite=True")
    error = None
    if all_devices or runtime.is_master_rank():
        try:
            write_atomically(filepath, write)
        except Exception as e:  # reported after the ranks met, so no rank hangs
            error = e
    if runtime.get_size() > 1:
        # Every rank learns which ranks failed to write, instead of only a barrier.
        failed = np.zeros(runtime.get_size(), dtype=np.int64)
        try:
            _core.allgather(np.array([error is not None], dtype=np.int64), failed)
        except _core.TntError as e:
            raise runtime.TarantellaError(
                f"saving {filepath}: the other ranks did not take part. Saving is collective: "
                "every rank must call save/save_weights (the master rank writes, the others "
                "wait for it), not only the master rank; "
                f"{e}") from (error or e)
        failed_ranks = [r for r in range(runtime.get_size()) if failed[r]]
        if failed_ranks and error is None:
            raise runtime.TarantellaError(
                f"saving {filepath} failed on rank(s) {failed_ranks}; its error is in the "
                "log of that rank")
    if error is not None:
        raise error


def save_model(model, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
    """Saves a tnt.Model or a keras.Model like tnt.Model.save."""
    if isinstance(model, Model):
        return model.save(filepath, overwrite=overwrite,
                          tnt_save_all_devices=tnt_save_all_devices, **kwargs)
    write_on_master(filepath, overwrite, tnt_save_all_devices,
                    lambda path: model.save(path, overwrite=True, **kwargs))


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):
    """A tnt.Model from a file written by save; compiled if it was saved
    compiled (and compile=True)."""
    runtime.require_init()
    path = os.fspath(filepath)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file; give the path that save() wrote")
    if path.endswith(".keras") and not zipfile.is_zipfile(path):
        raise runtime.TarantellaError(
            f"{path} is not a .keras file written by save() (it is not a zip archive): the "
            "file is damaged, or of another kind")
    return Model(keras.saving.load_model(filepath, custom_objects=custom_objects,
                                         compile=compile, safe_mode=safe_mode))


def model_from_config(config, custom_objects=None):
    """A tnt.Model with the architecture of `config` (model.get_config())."""
    runtime.require_init()
    if "class_name" in config and "config" in config:
        km = keras.saving.deserialize_keras_object(config, custom_objects=custom_objects)
    elif "input_layers" in config:
        km = keras.Model.from_config(config, custom_objects=custom_objects)
    else:
        km = keras.Sequential.from_config(config, custom_objects=custom_objects)
    return Model(km)


def model_from_json(json_string, custom_objects=None):
    runtime.require_init()
    return Model(keras.models.model_from_json(json_string, custom_objects=custom_objects))


def clone_model(model, **kwargs):
    """A tnt.Model with the architecture of `model` and new weights."""
    runtime.require_init()
    km = model.model if isinstance(model, Model) else model
    return Model(keras.models.clone_model(km, **kwargs))


def model_from_yaml(*args, **kwargs):
    raise runtime.TarantellaError(
        "model_from_yaml() is gone from Keras 3: save the architecture with model.to_json() "
        "and load it with tnt.models.model_from_json()")
