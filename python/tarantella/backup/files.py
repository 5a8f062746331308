"""The weights files of a backup, and the files its metadata names.

The weights and the optimizer's variables go to a NumPy file of their own
(``variables_snapshot``), written in about half the time of Keras's
save_weights. A pipelined model is backed up stage by stage: the rank of
each stage in the pipeline's first replica writes the variables of its
stage (its weights, and the optimizer's variables, which are the stage's
own) to a weights file of the stage, and every rank restores its stage's
file only; no rank ever holds the whole model for a backup. A model whose
optimizer state is sharded (zero_stage) is backed up as plain data
parallelism would be, its optimizer's state whole: the master writes the
file while every rank streams its parts of the state to it, a piece at a
time (stream_weights, zero/checkpoint.py), and every rank restores its
parts from it, on any number of ranks and at any stage.
"""
import contextlib
import os
import zipfile

import keras
import numpy as np

from tarantella import runtime
from tarantella import saving
from tarantella.zero import checkpoint as zero_checkpoint
from tarantella.pipeline import checkpoint

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


def _backed_up_variables(model, parts=None):
    """The variables of a backup's weights file: the model's weights (of a
    pipelined model, those of this rank's stages), then the optimizer's
    variables (its step count, learning rate, moments; a pipelined model's
    optimizer is its stages'; with a sharded state, `parts`
    (zero_checkpoint.Parts), those of the whole model's optimizer, held in
    parts), in a fixed order."""
    pipeline = pipeline_of(model)
    variables = list(model.weights if pipeline is None else
                     [w for s in pipeline.stages for w in pipeline.models[s].weights])
    if model.optimizer is not None:
        variables += list(model.optimizer.variables if parts is None else
                          parts.optimizer_variables)
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


def streams_weights(model):
    """Whether every rank takes part in writing the backup's weights file,
    the master's (stream_weights): the optimizer's state is in the ranks'
    parts."""
    return zero_checkpoint.writes_parts(model)


def stream_weights(model, path=None, before=None):
    """The weights file of a backup of a model whose optimizer state is in
    parts (streams_weights): the master writes it to `path` after before()
    (which makes its directory), the other ranks (`path` None) send it their
    parts. Collective: the writer's error is raised once every rank has
    streamed."""
    parts = zero_checkpoint.Parts(model)
    plan = _Numbered(_backed_up_variables(model, parts))
    with contextlib.ExitStack() as stack:
        def sink():
            before()
            return stack.enter_context(_NpzSink(path))
        checkpoint.stream(parts, plan, sink if path is not None else None, all_devices=False)


class _Numbered:
    """The plan (pipeline/checkpoint.py) of a backup's weights file: the
    values of `variables`, as the arrays "0", "1", ... (variables_snapshot's
    names)."""

    groups = ()

    def __init__(self, variables):
        self.entries = [checkpoint.Entry("", str(i), None, v) for i, v in enumerate(variables)]


class _NpzSink:
    """Writes a plan's values into the NumPy file `path`, as np.savez writes
    them, a piece at a time (a sink of checkpoint.stream)."""

    def __init__(self, path):
        self.archive = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)
        self.member = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.member is not None:
            self.member.close()
        self.archive.close()

    def dataset(self, entry, shape, dtype):
        if self.member is not None:
            self.member.close()
        self.member = self.archive.open(f"{entry.key}.npy", "w", force_zip64=True)
        np.lib.format.write_array_header_1_0(self.member, {
            "descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
            "shape": shape})
        return self.member

    def put(self, member, piece, array):
        member.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def restore_variables(model, path):
    """Gives the model's and the optimizer's variables the values of the
    weights file `path` (written from variables_snapshot, or by
    stream_weights), one variable at a time; a sharded optimizer state gets
    this rank's parts. Raises UnreadableBackup when it cannot be read, a
    TarantellaError when it is of another model."""
    if model.optimizer is not None and not model.optimizer.built:
        # Its moments exist once it is built, as Keras's own restore does.
        pipeline = pipeline_of(model)
        model.optimizer.build(model.trainable_variables if pipeline is None
                              else pipeline.trainable)
    parts = zero_checkpoint.Parts(model) if zero_checkpoint.sharded(model) else None
    source = parts or checkpoint.Whole()
    variables = _backed_up_variables(model, parts)

    def unreadable(e):
        return UnreadableBackup(f"BackupAndRestore cannot read {path}: {e}")

    def of_another_model(count):
        return runtime.TarantellaError(
            f"BackupAndRestore: {path} holds {count} variables of other shapes than the "
            f"{len(variables)} of this model and its optimizer: resume with the model and "
            "optimizer of the run that took the backup")
    try:
        archive = np.load(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise unreadable(e) from e
    with archive:
        if len(archive.files) != len(variables):
            raise of_another_model(len(archive.files))
        for i, v in enumerate(variables):
            try:
                value = archive[str(i)]
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
                raise unreadable(e) from e
            if value.shape != source.shape(v):
                raise of_another_model(len(archive.files))
            source.assign(v, value)


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
