"""Files of a model whose optimizer state is sharded (shards.py): written
whole, as plain data parallelism writes them, and read into parts.

At zero_stage 1 or 2 every rank holds the whole weights, but of each slot
of the optimizer (a moment, an accumulator: one of a trainable variable's
shape) only its part: the range of the variable's elements that
Shards.ranges gives the rank. save, save_weights, ModelCheckpoint and
BackupAndRestore write every slot whole, in the order and shape of plain
data parallelism's optimizer, so that plain Keras loads the files and gets
the optimizer state a zero_stage=0 run would have saved; the files load at
any stage on any number of ranks, each rank taking its range of every slot.

Parts tells the writers of pipeline/checkpoint.py (and of backup/files.py)
where the values are: the weights and the optimizer's own variables
(iterations, learning rate) on every rank, whole; a slot in the ranks'
parts. The master writes the file (every rank with
tnt_save_all_devices=True); a slot reaches it piece by piece (at most
checkpoint.CHUNK_BYTES at a time), every rank sending the elements of the
piece in its range (an allgatherv: every rank receives the piece, and drops
it). No rank holds more of the state than its own parts and one piece.

Loading reads the file on every rank (as Keras's load_weights does) and
assigns each rank its range of every slot, read from the rows that hold it.

At zero_stage 3 the trainable weights are in parts too (the model's
variables hold no value): they move and load as the slots do, so the
files are those of the other stages.

StageParts does the same for a pipelined model (ParallelStrategy.ALL),
whose stages' replicas share their stages' slots: a piece of a slot is put
together among the replicas of its stage (the allgatherv within their
group), then reaches the master as every value of its stage does
(pipeline/checkpoint.py's Stages). The backup of a pipelined model writes
a file per stage (backup/files.py): Parts of that stage, among its
replicas.
"""
import functools

import numpy as np

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import runtime
from tarantella import subclass
from tarantella.zero import shards as zero_shards
from tarantella.pipeline import checkpoint


def sharded(model):
    """Whether `model`'s optimizer keeps its state in parts (zero_stage > 0
    on several ranks), built or not."""
    return isinstance(getattr(model, "optimizer", None), zero_shards.ShardedOptimizer)


def writes_parts(model):
    """Whether a file of `model` holds state that is in the ranks' parts (an
    optimizer not yet built has none: Keras writes the file as it is)."""
    return sharded(model) and model.optimizer.built


def check_together(model, what):
    """Refuses `what` (save, save_weights) from one rank alone, as a
    callback that runs on the master only would call it: the parts of the
    optimizer's state are on every rank."""
    if writes_parts(model):
        raise runtime.TarantellaError(
            f"{what} was called on one rank alone (by a callback that runs on the master "
            f"only), but zero_stage={model.optimizer._tnt_shards.stage} keeps the optimizer's "
            "state in parts on every rank, which write the file together: let the callback "
            "run on every rank (ModelCheckpoint does)")


class Slots:
    """This rank's parts of the slots of a sharded, built `optimizer` (a
    moment, an accumulator: one value per element of a trainable variable)
    and, at stage 3, of the trainable weights, and how a piece of a whole
    slot or weight is put together from the parts of the ranks that share
    them (Shards.group). A weight is named by the model's variable, a slot
    by the optimizer's variable of its part."""

    def __init__(self, optimizer):
        self.shards = shards = optimizer._tnt_shards
        updating = getattr(optimizer, "inner_optimizer", optimizer)
        with subclass.original_classes([optimizer]):
            self.stand_in, layout = internals.optimizer_layout(optimizer, shards.variables)
            # ShardedAdafactor makes its state as over the whole variables
            # (the factored moments whole, the rest per part).
            own = layout if isinstance(updating, zero_shards.ShardedAdafactor) else \
                internals.optimizer_layout(optimizer, shards.parts)[1]
        if sorted(own, key=repr) != sorted(layout, key=repr) or \
                len(own) != len(optimizer.variables):
            raise runtime.TarantellaError(
                f"optimizer {type(optimizer).__name__} holds other state for the parts of the "
                "variables than for the variables themselves, so its state cannot be written "
                "whole from the parts: save with zero_stage=0, or use one of Keras's "
                "elementwise optimizers")
        mine = dict(zip(own, optimizer.variables))
        # This rank's variable for each variable of the optimizer of the
        # whole variables, in its order; the slots among them, by variable.
        self.optimizer_variables = [mine[key] for key in layout]
        # State that every rank holds whole (ShardedAdafactor's factored
        # moments) is written and read as the optimizer's own variables.
        replicated = getattr(updating, "_tnt_replicated", set())
        self.slot_of = {}
        for i, k in layout:
            if i is None or id(mine[(i, k)]) in replicated:
                continue
            lo, hi = shards.ranges[i]
            if tuple(mine[(i, k)].shape) != (hi - lo,):
                raise runtime.TarantellaError(
                    f"optimizer {type(optimizer).__name__} keeps state of shape "
                    f"{tuple(mine[(i, k)].shape)} for a part of {hi - lo} elements, not one "
                    "value per element: it cannot be written whole from the parts; save with "
                    "zero_stage=0, or use one of Keras's elementwise optimizers")
            self.slot_of[id(mine[(i, k)])] = i
        self.part_of = {}  # id(a model's variable) -> its part (stage 3)
        if shards.stage == 3:
            for i, (v, part) in enumerate(zip(shards.variables, shards.parts)):
                self.slot_of[id(v)] = i
                self.part_of[id(v)] = part

    def whole_shape(self, variable):
        """The shape of the variable whose slot `variable` holds a part of;
        None for other variables."""
        i = self.slot_of.get(id(variable))
        return None if i is None else tuple(self.shards.variables[i].shape)

    def piece(self, variable, shape, dtype, piece):
        """Rows `piece` (a range of the first axis; None: a scalar) of the
        whole slot whose part `variable` holds, of `shape`: every rank of
        the group sends the elements of the piece in its part (an
        allgatherv) and gets the piece. Collective."""
        i = self.slot_of[id(variable)]
        row = int(np.prod(shape[1:], dtype=np.int64))
        a, b = (0, 1) if piece is None else (piece[0] * row, piece[1] * row)
        ranges = self.shards.every_range()[:, i]
        starts = np.maximum(ranges[:, 0], a)
        counts = np.maximum(np.minimum(ranges[:, 1], b) - starts, 0)
        lo, hi = self.shards.ranges[i]
        start = max(lo, a)
        part = self.part_of.get(id(variable), variable)
        mine = np.asarray(part.value[start - lo:max(min(hi, b), start) - lo])
        size = dtype.itemsize
        received = np.empty(int(counts.sum()) * size, dtype=np.uint8)
        _core.allgatherv(np.ascontiguousarray(mine).view(np.uint8), received,
                         [int(c) * size for c in counts], group=self.shards.group)
        out = np.empty((b - a) * size, dtype=np.uint8)
        at = 0
        for start, count in zip(starts, counts):
            out[(start - a) * size:(start - a + count) * size] = \
                received[at:at + count * size]
            at += count * size
        return out.view(dtype).reshape(shape if piece is None else
                                       (piece[1] - piece[0],) + shape[1:])

    def assign(self, variable, stored):
        """Assigns `variable`, a slot's part, its range of the whole slot
        `stored`, read from the rows that hold it; False for a variable
        that is not a slot's part."""
        i = self.slot_of.get(id(variable))
        if i is None:
            return False
        lo, hi = self.shards.ranges[i]
        shape = self.whole_shape(variable)
        if shape:  # the rows that hold the part
            row = max(1, int(np.prod(shape[1:], dtype=np.int64)))
            first = lo // row
            flat = np.asarray(stored[first:-(-hi // row)]).reshape(-1)
            lo, hi = lo - first * row, hi - first * row
        else:
            flat = np.asarray(stored[()]).reshape(-1)
        self.part_of.get(id(variable), variable).assign(flat[lo:hi])
        return True

    def whole(self, variable):
        """The whole value of `variable` (a weight or a slot's part) as an
        array. Collective."""
        shape = self.whole_shape(variable)
        return self.piece(variable, shape, np.dtype(variable.dtype),
                          (0, shape[0]) if shape else None)


def get_weights(model):
    """The weights of `model` at zero_stage=3 as arrays, those in parts
    gathered (collective)."""
    slots = Slots(model.optimizer)
    return [slots.whole(v) if id(v) in slots.part_of else np.asarray(v.value)
            for v in model.weights]


def set_weights(model, weights):
    """Gives `model` at zero_stage=3 the master's `weights` (arrays, in
    the order of model.weights), each rank its part of those in parts."""
    weights = runtime.broadcast_arrays(weights)
    slots = Slots(model.optimizer)
    for v, w in zip(model.weights, weights):
        if not slots.assign(v, w):
            v.assign(w)


def _built(model):
    """`model`'s optimizer, built as fit builds it (for a pipeline's
    stages, for their variables)."""
    optimizer = model.optimizer
    if not optimizer.built:
        pipeline = model._tnt.pipeline
        optimizer.build(model.trainable_variables if pipeline is None else pipeline.trainable)
    return optimizer


class _SlotSource:
    """What a source (pipeline/checkpoint.py) whose slots are in parts
    (`slots`, Slots) reads files with: the whole slot's shape, and this
    rank's part of it."""

    def shape(self, variable):
        whole = self.slots.whole_shape(variable)  # () for a scalar's slot
        return super().shape(variable) if whole is None else whole

    def assign(self, variable, stored):
        if not self.slots.assign(variable, stored):
            super().assign(variable, stored)


class Parts(_SlotSource, checkpoint.Whole):
    """Where the values of the files of `model` (sharded(model)) are: every
    rank holds the weights and the optimizer's own variables whole, and its
    part of every slot (a slot moves: every rank sends its part of each
    piece). Of a pipelined model, the values of this rank's stages, whose
    replicas share the slots: the file of a stage's backup. Building it
    builds the optimizer, as fit would."""

    def __init__(self, model):
        self.model, self.slots = model, Slots(_built(model))
        self.kind = f"a model with zero_stage={self.slots.shards.stage}"

    @property
    def optimizer_variables(self):
        return self.slots.optimizer_variables

    @functools.cached_property
    def plan(self):
        return checkpoint.Plan(self.model, {}, (self.slots.stand_in,
                                                [(None, v) for v in self.optimizer_variables]))

    def participates(self, all_devices):
        return True

    def moves(self, entry, all_devices):
        return id(entry.variable) in self.slots.slot_of

    def describe(self, entry, moved):
        shape, dtype = super().describe(entry, moved)
        return self.shape(entry.variable), dtype

    def piece(self, entry, moved, shape, dtype, piece):
        if not moved:
            return super().piece(entry, moved, shape, dtype, piece)
        return self.slots.piece(entry.variable, shape, dtype, piece)


class StageParts(_SlotSource, checkpoint.Stages):
    """Where the values of the files of a pipelined `model` whose stages'
    replicas share the optimizer's state (sharded(model)) are: as Stages
    says, but a slot's piece is first put together from the parts of the
    replicas of its stage, so every rank takes part in every write."""

    def __init__(self, model, pipeline):
        super().__init__(model, pipeline)
        self.slots = Slots(model.optimizer)
        self.kind = f"a pipelined model with zero_stage={self.slots.shards.stage}"
        # The slots' entries, known on every rank: the optimizer's entries
        # held by a stage (its own variables are held by every stage).
        self.sliced = {id(e) for e in self.plan.entries[self.plan.model_entries:]
                       if e.stage is not None}

    def participates(self, all_devices):
        return True

    def moves(self, entry, all_devices):
        return id(entry) in self.sliced or super().moves(entry, all_devices)

    def held_piece(self, entry, shape, dtype, piece):
        if id(entry) in self.sliced:
            return self.slots.piece(entry.variable, shape, dtype, piece)
        return super().held_piece(entry, shape, dtype, piece)
