"""Files of a model whose values are spread over the ranks, written and
read piece by piece: those of a pipelined model (each stage holds its
own weights and optimizer state; here) and those of a model whose
optimizer state is sharded (zero/checkpoint.py).

Such a model is saved in Keras's own layouts, so that plain Keras
loads it: a ``.weights.h5`` file, a ``.keras`` archive (its config, its
metadata and a ``model.weights.h5`` inside), or Keras's sharded weights
format (``ckpt.weights.json``: an index naming, for every group of
weights, the ``ckpt_<i>.weights.h5`` shard files that hold it), here with
one shard per stage. No rank ever holds the whole model for it:

* every rank works out the same plan: the groups and keys Keras would write
  for the whole model (its own walk of the model, recorded without reading
  a value: _keras_internals.saved_layout) and, for each, where the value
  is. The whole optimizer's variables are mapped to the ranks' optimizers
  variable by variable (_keras_internals.optimizer_layout), as the whole
  model's optimizer would hold them: one block of state per trainable
  variable, plus its own iterations and learning rate;
* the master writes every file (no shared file system is assumed). The
  values reach it in the plan's order, one variable at a time and at most
  CHUNK_BYTES of it at a time, from the ranks that hold them (a source says
  how: Stages, from the rank of the value's stage in this rank's pipeline,
  which broadcasts it within the pipeline; zero_checkpoint.Parts, from
  every rank's part of it); each piece is written into its dataset at once.
  The master's memory beyond its own values is one such piece; every other
  rank of the pipeline also receives each piece (the group's broadcast)
  and drops it. With tnt_save_all_devices=True every rank of every
  pipeline writes.

Loading reads the file on every rank (it must be readable there: a shared
file system, or a copy on each host) and assigns this rank's values only
(its stage's variables and its optimizer's state), one variable at a time.
"""
import contextlib
import json
import os
import pathlib
import zipfile

import h5py
import keras
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import runtime
from tarantella import saving
from tarantella import subclass

CHUNK_BYTES = 16 << 20
_MAX_DIMS = 32
_HEADER = 1 + _MAX_DIMS + 4  # ndim, dims, the dtype's name (32 bytes)
_WEIGHTS_IN_ARCHIVE = "model.weights.h5"  # as keras.saving.save_model names it


class Entry:
    """One value of the file: dataset `key` of group `path`, held by the
    ranks of `stage` (None: by every rank) in `variable` there (None on
    other stages), or the constant `value`."""

    def __init__(self, path, key, stage, variable=None, value=None):
        self.path, self.key, self.stage = path, key, stage
        self.variable, self.value = variable, value


def stage_of_variables(pipeline):
    """{id(variable): its stage} for every variable of every stage (its
    weights, and the states of its seed generators)."""
    stage_of = {}
    for s, stage_model in enumerate(pipeline.partition.stages):
        for v in stage_model.variables:
            stage_of.setdefault(id(v), s)
    return stage_of


def optimizer_sources(optimizer, whole, pipeline, stage_of):
    """Where the state of the whole model's optimizer lives: for an
    optimizer like `optimizer` (this stage's, built over the stage's
    trainable variables) built over `whole` (the model's trainable
    variables), one (stage, variable) per variable in its order: the stage
    that holds the state (None: every stage, as the iterations), and this
    rank's optimizer variable that holds it (None on other stages). Returns
    (that optimizer, built over stand-ins, as _keras_internals.
    optimizer_layout makes it; the list)."""
    own = list(pipeline.trainable)
    with subclass.original_classes([optimizer]):
        stand_in, layout = internals.optimizer_layout(optimizer, whole)
        _, own_layout = internals.optimizer_layout(optimizer, own)
    if len(own_layout) != len(optimizer.variables):
        raise runtime.TarantellaError(
            f"optimizer {type(optimizer).__name__} holds {len(optimizer.variables)} variables "
            f"on stage {pipeline.stage}, but one built the same way over the stage's weights "
            f"holds {len(own_layout)}: its state cannot be mapped to the whole model's "
            "variable by variable; use one of Keras's built-in optimizers, or save the "
            "weights of a model compiled without an optimizer")
    mine = {}  # (id of a model variable, or None; k) -> this stage's optimizer variable
    for (i, k), v in zip(own_layout, optimizer.variables):
        mine[(None if i is None else id(own[i]), k)] = v
    sources = []
    for i, k in layout:
        key = (None if i is None else id(whole[i]), k)
        sources.append((None if i is None else stage_of.get(key[0]), mine.get(key)))
    return stand_in, sources


class Plan:
    """The groups (path, metadata) and entries of the whole model's file,
    the same on every rank; sources are known on the ranks that hold them.
    `stage_of`: {id(variable): its stage} (a variable not in it is held by
    every rank); `optimizer`: for a model with an optimizer, (the optimizer
    built over stand-ins of the model's trainable variables, and for each
    of its variables (stage, this rank's variable that holds it)), as
    optimizer_sources returns them."""

    def __init__(self, model, stage_of, optimizer=None):
        self.groups, self.entries = [], []
        with model._tnt_plain():
            layout = internals.saved_layout(
                model, skip=[model.optimizer] if optimizer is not None else ())
        for path, metadata, _, pairs in layout:
            self.groups.append((path, metadata))
            for key, value in pairs:
                if isinstance(value, keras.Variable):
                    self.entries.append(Entry(path, key, stage_of.get(id(value)), value))
                else:
                    self.entries.append(Entry(path, key, None, value=np.asarray(value)))
        self.model_entries = len(self.entries)  # the optimizer's follow
        if optimizer is None:
            return
        stand_in, sources = optimizer
        position = {id(v): p for p, v in enumerate(stand_in.variables)}
        # Where Keras's walk puts model.optimizer (and, for a
        # LossScaleOptimizer, its inner optimizer below it).
        for path, metadata, saveable, pairs in internals.saved_layout(
                stand_in, inner_path="optimizer"):
            self.groups.append((path, metadata))
            for key, _ in pairs:
                stage, variable = sources[position[id(saveable.variables[int(key)])]]
                self.entries.append(Entry(path, key, stage, variable))


class Whole:
    """Where the values of a plan are (a source): on this rank, whole.
    Stages and zero_checkpoint.Parts say otherwise for some of them; a
    source's `plan` is that of the model's file.

    A source's values reach a writer through describe and piece; an entry
    that `moves` travels between ranks, and every rank that takes part in a
    write (participates) calls both for it, in the plan's order. `holds`,
    `shape` and `assign` read a file into the variables."""

    kind = "a model"  # what the messages call it
    num_shards = 1  # of the .weights.json files it writes
    sharded_json = "one shard"

    def participates(self, all_devices):
        """Whether this rank streams values to the writers when it does not
        write."""
        return False

    def moves(self, entry, all_devices):
        return False

    def describe(self, entry, moved):
        """The (shape, NumPy dtype) of `entry`'s value."""
        v = entry.variable
        return tuple(v.shape), np.dtype(tf.as_dtype(v.dtype).as_numpy_dtype)

    def piece(self, entry, moved, shape, dtype, piece):
        """Rows `piece` (a range of the first axis; None: a scalar) of
        `entry`'s value, an array."""
        value = entry.variable.value
        return np.asarray(value if piece is None else value[piece[0]:piece[1]])

    def holds(self, entry):
        """Whether this rank assigns `entry` when it loads a file."""
        return entry.variable is not None

    def shape(self, variable):
        """The shape that the file holds for `variable`."""
        return tuple(variable.shape)

    def assign(self, variable, stored):
        """Assigns `variable` its value from `stored` (an h5py dataset, or an
        array, of the shape `shape` gives)."""
        variable.assign(stored[()])


class Stages(Whole):
    """Where the values of pipelined `model`'s file are: a stage's on the
    rank of that stage in this rank's pipeline, which broadcasts them within
    the pipeline (those every stage holds, on every rank)."""

    kind = "a pipelined model"
    sharded_json = "one shard per stage"

    def __init__(self, model, pipeline):
        self.pipeline = pipeline
        self.num_shards = pipeline.partition.num_stages
        stage_of = stage_of_variables(pipeline)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:  # as fit builds it: for the stage's weights
                optimizer.build(pipeline.trainable)
            optimizer = optimizer_sources(optimizer, list(model.trainable_variables), pipeline,
                                          stage_of)
        self.plan = Plan(model, stage_of, optimizer)

    def participates(self, all_devices):
        return all_devices or self.pipeline.layout.replica == 0

    def _root(self, entry):
        return None if entry.stage is None else self.pipeline.rank_of(entry.stage)

    def moves(self, entry, all_devices):
        root = self._root(entry)
        return root is not None and (all_devices or root != 0) and runtime.get_size() > 1

    def holds(self, entry):
        return entry.variable is not None and (
            entry.stage is None or entry.stage in self.pipeline.stages)

    def describe(self, entry, moved):
        if not moved:
            return super().describe(entry, moved)
        v = entry.variable if self.holds(entry) else None
        header = _broadcast(_header(self.shape(v), v.dtype) if v is not None else None,
                            _HEADER * 8, self._root(entry),
                            self.pipeline.layout.pipeline_group).view(np.int64)
        return _from_header(header)

    def piece(self, entry, moved, shape, dtype, piece):
        if not moved:
            return super().piece(entry, moved, shape, dtype, piece)
        count = 1 if piece is None else piece[1] - piece[0]
        nbytes = count * dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        raw = _broadcast(self.held_piece(entry, shape, dtype, piece)
                         if self.holds(entry) else None, nbytes, self._root(entry),
                         self.pipeline.layout.pipeline_group)
        return raw.view(dtype).reshape(shape if piece is None else (count,) + shape[1:])

    def held_piece(self, entry, shape, dtype, piece):
        """Rows `piece` of `entry`'s value, on a rank that holds it."""
        return super().piece(entry, False, shape, dtype, piece)


# ------------------------------------------------------------------ writing

def _header(array_shape, dtype):
    header = np.zeros(_HEADER, dtype=np.int64)
    header[0] = len(array_shape)
    header[1:1 + len(array_shape)] = array_shape
    name = tf.as_dtype(dtype).name.encode()
    header[1 + _MAX_DIMS:].view(np.uint8)[:len(name)] = np.frombuffer(name, dtype=np.uint8)
    return header


def _from_header(header):
    ndim = int(header[0])
    name = header[1 + _MAX_DIMS:].view(np.uint8).tobytes().rstrip(b"\0").decode()
    return tuple(int(d) for d in header[1:1 + ndim]), np.dtype(tf.as_dtype(name).as_numpy_dtype)


def _pieces(shape, itemsize):
    """Ranges of the first axis, each at most CHUNK_BYTES (one row when a
    row is larger); [None] for a scalar."""
    if not shape:
        return [None]
    row = itemsize * int(np.prod(shape[1:], dtype=np.int64))
    step = max(1, CHUNK_BYTES // max(row, 1))
    return [(a, min(a + step, shape[0])) for a in range(0, shape[0], step)] or [(0, 0)]


def _broadcast(array, nbytes, root, group):
    """`array`'s bytes (root) on every rank of `group`, as uint8."""
    buf = np.zeros((nbytes + 7) // 8, dtype=np.int64)
    raw = buf.view(np.uint8)
    if array is not None:
        raw[:nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    _core.broadcast(buf, root=root, group=group)
    return raw[:nbytes]


def stream(source, plan, make_sink, all_devices):
    """Runs the values of `plan` (its groups and entries) through the sink
    that `make_sink()` returns (None on ranks that do not write):
    sink.group(path, metadata, stage) for every group, then for each entry
    sink.dataset(entry, shape, dtype) and sink.put(dataset, piece, array)
    for its pieces (a sink may leave out group). The values come from
    `source` (a Whole); those that move between ranks reach the writers
    collectively. A failing sink stops writing, not receiving; its error is
    raised at the end."""
    error = None

    def call(fn, *args):
        nonlocal error
        if fn is not None and error is None:
            try:
                return fn(*args)
            except Exception as e:  # the stream goes on, so that no rank waits forever
                error = e
        return None

    sink = call(make_sink)

    stages = {}
    for e in plan.entries:
        if e.stage is not None:
            stages[e.path] = min(stages.get(e.path, e.stage), e.stage)
    for path, metadata in plan.groups:
        call(getattr(sink, "group", None), path, metadata, stages.get(path, 0))
    for e in plan.entries:
        moved = source.moves(e, all_devices)
        if not moved and make_sink is None:
            continue
        if e.value is not None:
            call(getattr(sink, "put", None), call(getattr(sink, "dataset", None), e,
                                                  e.value.shape, e.value.dtype), None, e.value)
            continue
        shape, dtype = source.describe(e, moved)
        dataset = call(getattr(sink, "dataset", None), e, shape, dtype)
        for piece in _pieces(shape, dtype.itemsize):
            call(getattr(sink, "put", None), dataset, piece,
                 source.piece(e, moved, shape, dtype, piece))
    if error is not None:
        raise error


def _vars_name(path):
    return f"{path}/vars" if path else "vars"


class _H5Sink:
    """Writes into one h5py.File (a .weights.h5 file, or the weights of a
    .keras archive)."""

    def __init__(self, h5):
        self.h5 = h5

    def group(self, path, metadata, stage):
        g = self.h5.require_group(_vars_name(path))
        for k, v in (metadata or {}).items():
            g.attrs[k] = v

    def dataset(self, entry, shape, dtype):
        return self.h5.require_group(_vars_name(entry.path)).create_dataset(
            entry.key, shape=shape, dtype=dtype)

    def put(self, dataset, piece, array):
        if piece is None:
            dataset[()] = array
        else:
            dataset[piece[0]:piece[1]] = array


class _ShardedSink:
    """Writes Keras's sharded format: shard s holds stage s's values (and
    those every rank holds in shard 0), and the index maps each group to its
    shards (keras.src.saving.saving_lib.ShardedH5IOStore's layout)."""

    def __init__(self, json_path, num_stages):
        path = pathlib.Path(json_path)
        base = path.stem.replace(".weights", "")
        self.names = [f"{base}_{s:05}.weights.h5" for s in range(num_stages)]
        self.final = [path.with_name(n) for n in self.names]
        self.tmp = [pathlib.Path(saving.temporary_name(p)) for p in self.final]
        self.files = [h5py.File(p, "w") for p in self.tmp]
        self.sinks = [_H5Sink(f) for f in self.files]
        self.weight_map, self.total = {}, 0

    def group(self, path, metadata, stage):
        self.sinks[stage].group(path, metadata, stage)

    def dataset(self, entry, shape, dtype):
        s = entry.stage or 0
        d = self.sinks[s].dataset(entry, shape, dtype)
        name = "/" + _vars_name(entry.path)
        shards = self.weight_map.setdefault(name, [])
        if self.names[s] not in shards:
            shards.append(self.names[s])
        self.total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return d

    put = _H5Sink.put

    def finish(self, index_path):
        for f in self.files:
            f.close()
        for tmp, final in zip(self.tmp, self.final):
            os.replace(tmp, final)
        weight_map = {k: (v[0] if len(v) == 1 else v) for k, v in self.weight_map.items()}
        with open(index_path, "w") as f:
            json.dump({"metadata": {"total_size": self.total}, "weight_map": weight_map}, f,
                      indent=4)

    def abandon(self):
        for f, tmp in zip(self.files, self.tmp):
            f.close()
            if tmp.exists():
                tmp.unlink()


def save_weights(model, source, filepath, overwrite, all_devices):
    """model.save_weights for a model whose values `source` (a Whole)
    holds: `filepath` ends in .weights.h5 (one file) or .weights.json
    (sharded, source.num_shards shards). Collective."""
    filepath = os.fspath(filepath)
    if filepath.endswith(".weights.json"):
        kind = "sharded"
    elif filepath.endswith(".weights.h5"):
        kind = "h5"
    else:
        raise runtime.TarantellaError(
            f"{filepath}: {source.kind} saves its weights to a file ending in .weights.h5 (one "
            f"file) or .weights.json (Keras's sharded format, {source.sharded_json}); rename it")

    def write(path):
        with contextlib.ExitStack() as files:
            if kind == "h5":
                stream(source, source.plan,
                       lambda: _H5Sink(files.enter_context(h5py.File(path, "w"))), all_devices)
                return
            sinks = []

            def sharded():
                sinks.append(_ShardedSink(filepath, source.num_shards))
                files.callback(sinks[0].abandon)
                return sinks[0]
            stream(source, source.plan, sharded, all_devices)
            sinks[0].finish(path)

    _write_collectively(source, filepath, overwrite, all_devices, write)


def save(model, source, filepath, overwrite, all_devices):
    """model.save for a model whose values `source` (a Whole) holds (a
    .keras archive, as keras.saving.save_model writes it; the weights go
    through a temporary file next to it). Collective."""
    filepath = os.fspath(filepath)
    if not filepath.endswith(".keras"):
        raise runtime.TarantellaError(
            f"{filepath}: {source.kind} saves to a .keras file (or its weights with "
            "save_weights): rename it")

    def write(path):
        weights = saving.temporary_name(filepath + ".weights.h5")
        try:
            with contextlib.ExitStack() as files:
                stream(source, source.plan,
                       lambda: _H5Sink(files.enter_context(h5py.File(weights, "w"))), all_devices)
            with model._tnt_plain():
                config, metadata = internals.model_file_json(model)
            with zipfile.ZipFile(path, "w") as archive:
                archive.writestr("metadata.json", metadata)
                archive.writestr("config.json", config)
                archive.write(weights, _WEIGHTS_IN_ARCHIVE)
                internals.save_assets(model, archive)
        finally:
            if os.path.exists(weights):
                os.remove(weights)

    _write_collectively(source, filepath, overwrite, all_devices, write)


def _write_collectively(source, filepath, overwrite, all_devices, write):
    if not overwrite and runtime.get_size() > 1:
        # The master decides (the other ranks may not see its file system):
        # either every rank streams, or none does.
        exists = runtime.broadcast_arrays([np.array([os.path.exists(filepath)])])[0][0]
        if exists:
            raise runtime.TarantellaError(f"{filepath} exists and overwrite=False: remove it "
                                          "or pass overwrite=True")

    def send():
        if source.participates(all_devices):
            stream(source, source.plan, None, all_devices)
    saving.write_on_master(filepath, overwrite, all_devices, write, others=send)


# ------------------------------------------------------------------ reading

class _Reader:
    """The datasets of a .weights.h5, .weights.json (sharded) or .keras
    file, by group path and key."""

    def __init__(self, filepath):
        self.path = os.fspath(filepath)
        self.archive, self.files, self.index = None, {}, None
        if self.path.endswith(".weights.json"):
            with open(self.path) as f:
                self.index = json.load(f)["weight_map"]
        elif self.path.endswith(".keras"):
            self.archive = zipfile.ZipFile(self.path)
            self.files[None] = h5py.File(self.archive.open(_WEIGHTS_IN_ARCHIVE), "r")
        else:
            self.files[None] = h5py.File(self.path, "r")

    def _file(self, name):
        if name not in self.files:
            self.files[name] = h5py.File(pathlib.Path(self.path).with_name(name), "r")
        return self.files[name]

    def group(self, path):
        """The h5 groups that hold group `path`'s datasets."""
        name = _vars_name(path)
        if self.index is None:
            return [self.files[None][name]] if name in self.files[None] else []
        shards = self.index.get("/" + name, [])
        return [self._file(n)[name] for n in ([shards] if isinstance(shards, str) else shards)]

    def close(self):
        for f in self.files.values():
            f.close()
        if self.archive is not None:
            self.archive.close()


def load(source, filepath):
    """Assigns to the variables of the model of `source` (a Whole) that this
    rank holds (of a pipeline, those of its stage and its optimizer's
    state) their values in `filepath` (see _Reader); the others are not
    read."""
    plan = source.plan
    reader = _Reader(filepath)
    try:
        skipped = set()
        for path, _ in plan.groups:
            want = sum(1 for e in plan.entries if e.path == path)
            have = sum(len(g) for g in reader.group(path))
            if path.startswith("optimizer") and have != want:
                # As Keras does: an optimizer state of another size is not loaded.
                skipped.add(path)
                if runtime.is_master_rank():
                    log.logger.warning(
                        "%s holds %d variables for the optimizer (%s), which has %d: its "
                        "state is not loaded (it was saved for another optimizer, or without "
                        "one)", filepath, have, path, want)
        for e in plan.entries:
            if not source.holds(e) or e.path in skipped:
                continue
            found = [g[e.key] for g in reader.group(e.path) if e.key in g]
            if not found:
                raise runtime.TarantellaError(
                    f"{filepath} has no value for {e.path}/{e.key} ({e.variable.path}): give "
                    "a file that this model (or the same model, saved with Keras or "
                    "Tarantella) wrote")
            stored, expected = found[0], source.shape(e.variable)
            if tuple(stored.shape) != expected:
                raise runtime.TarantellaError(
                    f"{filepath}: {e.path}/{e.key} has shape {tuple(stored.shape)}, but "
                    f"{e.variable.path} has shape {expected}: the file was written for "
                    "another model")
            source.assign(e.variable, stored)
    finally:
        reader.close()
