"""The weights files of a backup, and the files its metadata names.

The weights and the optimizer's variables go to a NumPy file of their own
(``variables_snapshot``), written in about half the time of Keras's
save_weights. A pipelined model is backed up stage by stage: the rank of
each stage in the pipeline's first replica writes the variables of its
stage (its weights, and the optimizer's variables, which are the stage's
own) to a weights file of the stage, and every rank restores its stage's
file only; no rank ever holds the whole model for a backup.
"""
import os
import zipfile

import keras
import numpy as np

from tarantella import runtime
from tarantella import saving

# The metadata's names of a backup's files.
_METADATA_FILES = ("tnt_weights", "tnt_previous", "tnt_state", "tnt_previous_state")


class UnreadableBackup(runtime.TarantellaError):
    """A backup's weights file cannot be read (damaged, or gone)."""


def pipeline_of(model):
    """The pipeline of `model` (pipeline/stage.py), or None."""
    return getattr(getattr(model, "_tnt", None), "pipeline", None)


def weights_files(model, base):
    """The names of the weights files of the backup `base` of `model`: one
    name, or for a pipelined model one per rank of the pipeline, named by
    the stages it holds (stage3, or stage1-3 under the interleaved
    schedule), in the ranks' order."""
    pipeline = pipeline_of(model)
    if pipeline is None:
        return f"{base}.weights.npz"
    schedule = pipeline.schedules[True]
    return [f"{base}.stage{'-'.join(str(s) for s in schedule.stages_of(r))}.weights.npz"
            for r in range(len(pipeline.layout.pipeline_ranks))]


def own_weights_file(model, names):
    """The one of `names` (from weights_files) that this rank writes, or
    None: the master writes the file of a model that is not pipelined; the
    rank of each stage in the first replica writes its stage's."""
    pipeline = pipeline_of(model)
    if pipeline is None:
        return names if runtime.is_master_rank() else None
    return names[pipeline.stage] if pipeline.layout.replica == 0 else None


def weights_file_to_restore(model, names):
    """The one of a backup's weights files `names` that this rank restores.
    Raises a TarantellaError when the backup is of a model cut into other
    stages or held by other ranks (or not pipelined, when this one is)."""
    pipeline = pipeline_of(model)
    expected = weights_files(model, "")

    def what(files):
        if not isinstance(files, list):
            return "a model that is not pipelined"
        held = [f.split(".")[-3][len("stage"):] for f in files]
        stages = sum(len(h.split("-")) for h in held)
        return (f"a pipeline of {stages} stages" if len(held) == stages else
                f"a pipeline of {stages} stages on {len(held)} ranks (stages {', '.join(held)})")
    if what(names) != what(expected):
        raise runtime.TarantellaError(
            f"BackupAndRestore: the backup was taken of {what(names)}, and this is "
            f"{what(expected)}: resume with the model, stages and schedule of the run that took "
            "the backup")
    return names if pipeline is None else names[pipeline.stage]


def _backed_up_variables(model):
    """The variables of a backup's weights file: the model's weights (of a
    pipelined model, those of this rank's stages), then the optimizer's
    variables (its step count, learning rate, moments; a pipelined model's
    optimizer is its stages'), in a fixed order."""
    pipeline = pipeline_of(model)
    variables = list(model.weights if pipeline is None else
                     [w for s in pipeline.stages for w in pipeline.models[s].weights])
    if model.optimizer is not None:
        variables += list(model.optimizer.variables)
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def variables_snapshot(model):
    """The values of the model's and the optimizer's variables, as arrays
    for a backup's weights file. Copying them takes a few milliseconds;
    Keras's save_weights spends more than that in walking the model alone."""
    return {str(i): np.array(keras.ops.convert_to_numpy(v))
            for i, v in enumerate(_backed_up_variables(model))}


def restore_variables(model, path):
    """Gives the model's and the optimizer's variables the values of the
    weights file `path` (written from variables_snapshot). Raises
    UnreadableBackup when it cannot be read, a TarantellaError when it is
    of another model."""
    if model.optimizer is not None and not model.optimizer.built:
        # Its moments exist once it is built, as Keras's own restore does.
        pipeline = pipeline_of(model)
        model.optimizer.build(model.trainable_variables if pipeline is None
                              else pipeline.trainable)
    variables = _backed_up_variables(model)
    try:
        with np.load(path) as f:
            values = [f[str(i)] for i in range(len(f.files))]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise UnreadableBackup(f"BackupAndRestore cannot read {path}: {e}") from e
    shapes = [tuple(v.shape) for v in variables]
    if [a.shape for a in values] != shapes:
        raise runtime.TarantellaError(
            f"BackupAndRestore: {path} holds {len(values)} variables of other shapes than the "
            f"{len(variables)} of this model and its optimizer: resume with the model and "
            "optimizer of the run that took the backup")
    for v, a in zip(variables, values):
        v.assign(a)


def savez(path, arrays):
    """Writes `arrays` (a dict) to the NumPy file `path`."""
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def named_in(meta):
    """The names of the files of the backups that the metadata `meta`
    names (a pipelined model's weights are a list of files, one a stage)."""
    names = set()
    for k in _METADATA_FILES:
        value = meta.get(k)
        names.update(value if isinstance(value, list) else [value])
    names.discard(None)
    return names


def remove(directory, names, keep):
    """Removes the files `names` of `directory` not in `keep`."""
    for name in names:
        if name not in keep:
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def remove_leftover_temporaries(directory):
    """Removes from `directory` the temporary files of writes that were cut
    short (a process killed while it wrote); no write into it may be in
    progress."""
    remove(directory, [n for n in os.listdir(directory) if saving.is_temporary(n)], ())
