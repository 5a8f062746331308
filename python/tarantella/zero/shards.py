"""Sharded data parallelism: ZeRO stages 1, 2 and 3 (``tnt.Model(...,
zero_stage=1, 2 or 3)``).

Plain data parallelism keeps the whole optimizer state on every rank. With
a stage above 0, each rank keeps the optimizer state of its part of every
variable only, updates that part, and gathers the updated parts of the
others, so that every rank holds the whole weights for the next step.

The parts. The model's gradients travel in fusion buckets (gradients.py:
the sample count, then the variables in backprop order, up to the fusion
threshold each); libtnt cuts every bucket into one block per rank, the
blocks its allreduce reduces one by one, and rank r's part of a variable is
where the variable meets block r of its bucket: one contiguous range of the
variable's elements, empty on some ranks. The parts are a fixed function of
the variables' sizes, the fusion threshold and the number of ranks.

Stage 1 averages the gradients as stage 0 does (an allreduce) and keeps the
parts; stages 2 and 3 reduce-scatter them: each rank receives its blocks only,
computed as the allreduce computes them, so the parts' gradients are
bitwise those of stage 0 at every stage.

The update. The optimizer is built on part variables (1-D, one for each of
the model's variables, of its part's size) instead of the model's own, so
its slots hold 1/N of the model. Each step copies the model's values into
the parts (so set_weights and load_weights between steps are seen), applies
the optimizer to them with the parts' gradients, and gathers the updated
parts into the model's variables, a variable (or the small ones together)
at a time (gather_some), so that a step holds a few gathered variables
beside the weights, not a second copy of the model. An elementwise
optimizer computes every element as it would on the whole tensor, so the
weights are bitwise those of stage 0. A LossScaleOptimizer decides whether
the gradients are finite from every rank's parts.

Stage 3 keeps the weights in parts too: the parts are the only copy of
the trainable weights (the model's own variables hold no value; Shards.hold
frees them, a variable at a time), and a step gathers the whole weights
into tensors that the model runs on, a layer at a time as it reads them
(gather_some, steps.py), instead of gathering them into the model's
variables after the update. The arithmetic of the
passes, the reduce-scatter and the update is stage 2's: bitwise stage 0.

A pipelined model (ParallelStrategy.ALL) shards within each stage's
replica group: the ranks that run the same stages on other parts of the
batch, which average its gradients at stage 0. Each rank keeps its part of
its stages' variables.
"""
import keras
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import gradients
from tarantella import log
from tarantella import ops
from tarantella import runtime
from tarantella import step
from tarantella import subclass

STAGES = (0, 1, 2, 3)
# A variable of at least this many bytes is gathered on its own, into the
# vector that becomes its value; smaller ones are gathered together, in one
# collective, and put in order by a copy (Shards.gather_some).
GATHER_ALONE_BYTES = 256 * 1024
# Keras's optimizers whose update computes every element from that
# element's gradient and state alone (and the norms of clipnorm and
# global_clipnorm, ShardedClipping), or from sums over whole variables that
# come from the parts (Lamb's norms, ShardedLamb; Adafactor's factored
# moments and root mean squares, ShardedAdafactor): a part's update is that
# part of the whole tensor's. Muon (orthogonalized matrices) reads whole
# tensors otherwise.
ELEMENTWISE = (keras.optimizers.SGD, keras.optimizers.RMSprop, keras.optimizers.Adam,
               keras.optimizers.Adadelta, keras.optimizers.Adagrad, keras.optimizers.Adamax,
               keras.optimizers.Nadam, keras.optimizers.Ftrl, keras.optimizers.Lion,
               keras.optimizers.Lamb, keras.optimizers.Adafactor)


def check_stage(zero_stage):
    """`zero_stage` checked: an int of STAGES."""
    if isinstance(zero_stage, bool) or zero_stage not in STAGES:
        raise runtime.TarantellaError(
            f"zero_stage={zero_stage!r} is not a ZeRO stage Tarantella has: use 0 (plain data "
            "parallelism), 1 (optimizer state sharded), 2 (gradients and optimizer state "
            "sharded) or 3 (weights, gradients and optimizer state sharded)")
    if zero_stage and runtime.threshold_kb() == "auto":
        raise runtime.TarantellaError(
            f"zero_stage={zero_stage} needs a fixed fusion plan, but TNT_FUSION_THRESHOLD_KB is "
            "auto: set it to a number of KiB (the default is 32)")
    if zero_stage and runtime.fusion_order() != "list":
        raise runtime.TarantellaError(
            f"zero_stage={zero_stage} needs a fixed fusion plan, but TNT_FUSION_ORDER is "
            f"{runtime.fusion_order()}: set it to list (the default)")
    return zero_stage


class Shards:
    """This rank's parts of `variables` (a list of the model's variables)
    and the fusion sets that move them, at `stage` 1, 2 or 3, among the ranks
    of `group` (a _core.create_group handle of `size` ranks; None: all)."""

    def __init__(self, variables, stage, group=None, size=None):
        self.stage = stage
        self.group = group
        self.size = runtime.get_size() if size is None else size
        self.variables = list(variables)
        self.signature = gradients.signature(self.variables)
        self._every_range = None  # every_range()
        mode = "allreduce" if stage == 1 else "reduce_scatter"
        self.reducer = gradients.GradientReducer(group, size, mode=mode)
        # The parts are where the variables meet the ranks' blocks of the
        # buckets of stage 0's plan (the plan of a gather set, which runs no
        # round: the parts are gathered by gather_some).
        planned = self.reducer.fusion(self.signature, "allgather")
        self.ranges = [planned.part(i) for i in range(len(self.variables))]
        # The sample count's part: the fusion sets' first tensor, which keeps
        # their plan that of stage 0's. A variable: TensorFlow runs a start
        # of a constant (or an empty tensor) ahead of time, while it
        # optimizes the graph, and drops a finish whose value nothing uses.
        lo, hi = planned.part(gradients.count_id(self.signature))
        self.count_part = tf.Variable(tf.zeros([hi - lo]), trainable=False)
        # Zeros: copy_in gives them the model's values before every update (a
        # slice of the weight would keep the weight's whole buffer alive).
        # Never cast: stage 3 gathers them inside a layer's mixed-precision
        # call, whose reads of the whole weights are cast instead.
        self.parts = [
            keras.Variable(initializer="zeros", shape=(hi - lo,), dtype=v.dtype, trainable=False,
                           autocast=False, name=v.name)
            for v, (lo, hi) in zip(self.variables, self.ranges)]

    def every_range(self):
        """[rank, i] = (lo, hi) of every rank's part of variable i.
        Collective the first time (every rank of the group calls it then:
        ShardedOptimizer.build does, or hold() at stage 3)."""
        if self._every_range is None:
            mine = np.array(self.ranges, dtype=np.int64).reshape(-1)
            every = np.zeros(self.size * mine.size, dtype=np.int64)
            _core.allgather(mine, every, group=self.group)
            self._every_range = every.reshape(self.size, -1, 2)
        return self._every_range

    def held_bytes(self):
        """Bytes of the parts, this rank's."""
        return sum(_nbytes(p) for p in self.parts)

    def reduce(self, grads, current):
        """The parts of `grads` averaged over the global batch, None where a
        gradient is None. The fusion sets are planned for every variable, so
        a missing gradient travels as zeros (its variable is not updated)."""
        missing = [g is None for g in grads]
        if current.averaged(grads):  # by a DistributedGradientTape: each rank slices them
            return [None if g is None else tf.reshape(tf.convert_to_tensor(g), [-1])[lo:hi]
                    for g, (lo, hi) in zip(grads, self.ranges)]
        dense = [tf.zeros(v.shape, v.dtype) if g is None else g
                 for g, v in zip(gradients.shaped(grads, self.variables), self.variables)]
        after, waves = current.gradient_waves or (current.after(), None)
        out = self.reducer.reduce(dense, current.local_count, after, self.count_part,
                                  [p.value for p in self.parts], waves, pace=True)
        current.record(out)
        if self.stage == 1:
            out = [tf.reshape(g, [-1])[lo:hi] for g, (lo, hi) in zip(out, self.ranges)]
        return [None if m else g for g, m in zip(out, missing)]

    def copy_in(self):
        """Assigns the model's values to the parts; returns the assignments."""
        return [p.assign(tf.reshape(v.value, [-1])[lo:hi])
                for p, v, (lo, hi) in zip(self.parts, self.variables, self.ranges)]

    def hold(self):
        """(Stage 3, eagerly) Makes the parts the only copy of the weights:
        one variable at a time, allocates it if it has no value yet (a model
        built by a function), takes the master's value, copies this rank's
        part and frees the variable, which keeps a guard (NotHeld). No rank
        holds more than its parts and one whole variable. Collective."""
        for v, p, (lo, hi) in zip(self.variables, self.parts, self.ranges):
            if not internals.is_allocated(v):
                internals.allocate(v)
            runtime.broadcast_values([v], group=self.group)
            # A copy: a variable assigned a slice keeps the sliced tensor's
            # whole buffer.
            p.assign(tf.raw_ops.DeepCopy(x=tf.reshape(v.value, [-1])[lo:hi]))
            internals.unallocate(v, NotHeld(v.path))
        self.every_range()

    def gather(self, current):
        """Gathers the updated parts into the model's variables (stages 1
        and 2), in the step's chain, a variable (or a few small ones) at a
        time (gather_some); a gather waits for the assignments of the one
        two before, so that the step holds at most two gathered values
        beside the weights. Returns the assignments."""
        assigned = [tf.no_op(), tf.no_op()]  # each batch's assignments
        for batch in self.batches(range(len(self.variables))):
            wholes = self.gather_some(batch, current, after=[assigned[-2]])
            assigned.append(tf.group([self.variables[i].assign(w)
                                      for i, w in zip(batch, wholes)]))
        current.record(assigned)
        return assigned

    def batches(self, indices):
        """`indices` in batches for gather_some: a variable of
        GATHER_ALONE_BYTES or more alone, the others together by dtype."""
        big = {i for i in indices if _nbytes(self.variables[i]) >= GATHER_ALONE_BYTES}
        rest = {}  # by dtype
        for i in indices:
            if i not in big:
                rest.setdefault(self.variables[i].dtype, []).append(i)
        return [[i] for i in indices if i in big] + list(rest.values())

    def gather_some(self, indices, current, after=(), chained=True):
        """The whole values of the variables `indices`, gathered from every
        rank's parts after the ops `after` and (`chained`) the step's last
        collective: tensors, in the order of `indices`.
        Every rank's part of a variable is a range of its elements, the
        ranks' ranges in rank order (see the top), so a variable gathered
        alone is the gathered vector itself; small ones of one dtype are
        gathered together in one allgatherv, then put in order (a copy)."""
        every = self.every_range()  # computed by hold() or the optimizer's build
        wholes = {}
        chain = list(after) + (current.after() if chained else [])
        for group in self.batches(indices):
            sizes = every[:, group, 1] - every[:, group, 0]  # [rank, variable]
            counts = sizes.sum(axis=1)
            parts = [self.parts[i].value for i in group]
            with tf.control_dependencies(chain):
                mine = tf.concat(parts, 0) if len(parts) > 1 else tf.identity(parts[0])
                flat = ops.allgatherv(mine, _core.world_handle() if self.group is None
                                      else self.group, counts)
            current.record(flat)
            chain = [flat]
            if len(group) == 1:
                wholes[group[0]] = tf.reshape(flat, self.variables[group[0]].shape)
                continue
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[:, None] + np.concatenate(
                [np.zeros((self.size, 1), np.int64), np.cumsum(sizes, axis=1)[:, :-1]], axis=1)
            for j, i in enumerate(group):
                wholes[i] = tf.reshape(tf.concat([flat[starts[r, j]:starts[r, j] + sizes[r, j]]
                                                  for r in range(self.size)], 0),
                                       self.variables[i].shape)
        return [wholes[i] for i in indices]


class NotHeld:
    """The initializer of a model's variable at zero_stage=3, whose value is
    in the ranks' parts: Keras reads it when the variable's value is read
    outside a step (see pipeline/weights.py's _NotHeld)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, shape, dtype=None):
        if internals.in_shape_inference():
            return tf.zeros(shape, dtype)
        raise runtime.TarantellaError(
            f"the weight {self.path} is held in parts, one on each rank (zero_stage=3), so it "
            "has no value of its own on this rank: train, evaluate and predict with the "
            "model's fit, evaluate and predict (their steps gather the weights), read the "
            "weights with model.get_weights() (collective: every rank gathers them), or use "
            "zero_stage=2, which keeps the whole weights on every rank")


class ShardedOptimizer:
    """Placed in front of an optimizer's class by shard(): its state is
    built on this rank's parts of the variables (Shards)."""

    def build(self, variables):
        shards = Shards(variables, self._tnt_zero_stage, *self._tnt_zero_group)
        self._tnt_shards = shards
        # The optimizer that updates the parts (a LossScaleOptimizer's inner
        # one) knows them too: ShardedAdafactor reads their whole shapes.
        getattr(self, "inner_optimizer", self)._tnt_shards = shards
        super().build(shards.parts)
        whole = _mib(variables)
        part = shards.held_bytes() / 2**20
        if shards.stage == 3:
            shards.hold()
        else:
            shards.every_range()  # for gather, whose steps cannot run collectives eagerly
        log.logger.info(
            "ZeRO stage %d over %d ranks: this rank holds %.1f MiB of weights, %.1f MiB of "
            "averaged gradients and %.1f MiB of optimizer state (for its part of the weights, "
            "%.1f MiB)", shards.stage, shards.size, part if shards.stage == 3 else whole,
            whole if shards.stage == 1 else part, _mib(self.variables), part)

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            if self._tnt_zero_stage == 3:
                raise runtime.TarantellaError(
                    "zero_stage=3: the optimizer was given gradients before fit, evaluate or "
                    "predict cut the weights into the ranks' parts; at stage 3 the model "
                    "trains through its fit only (a custom training loop reads the weights, "
                    "which its variables do not hold at stage 3): use zero_stage=2 for a "
                    "custom loop")
            self.build(list(trainable_variables))
        shards = self._tnt_shards
        if trainable_variables is not None and \
                [id(v) for v in trainable_variables] != [id(v) for v in shards.variables]:
            raise runtime.TarantellaError(
                "an optimizer with zero_stage > 0 updates the variables it was built for, all "
                "at once; it was given others: apply the gradients of every trainable variable "
                "of the model together")
        current = step.active()
        parts = shards.reduce(list(grads), current)
        pairs = [(g, p) for g, p in zip(parts, shards.parts) if g is not None]
        if shards.stage == 3:  # the parts are the weights; the next step gathers them
            super().apply([g for g, _ in pairs], [p for _, p in pairs])
        else:
            with tf.control_dependencies(shards.copy_in()):
                super().apply([g for g, _ in pairs], [p for _, p in pairs])
        # The update's collectives (Lamb's and Adafactor's sums) may run in
        # a branch of a LossScaleOptimizer's tf.cond, which the step's chain
        # cannot name: the step's next collective waits for the updated
        # parts, which are read after the branch.
        current.record([tf.identity(p.value) for p in shards.parts])
        if shards.stage < 3:
            shards.gather(current)

    def check_finite(self, grads):
        """(LossScaleOptimizer) Whether every rank's parts are finite."""
        finite = tf.cast(super().check_finite(grads), tf.float32)
        return step.active().allreduce(tf.reshape(finite, [1]), "min",
                                       self._tnt_zero_group[0])[0] > 0


class ShardedClipping:
    """Placed in front of the class of the optimizer that updates the parts
    (a LossScaleOptimizer's inner one) when it clips by norm: a norm is
    that of the whole tensor (clipnorm) or of all of them (global_clipnorm),
    so it comes from the sums of every rank's parts' squares. The sums are
    added in another order than a whole tensor's: the clipped gradients
    equal stage 0's within rounding, not bitwise."""

    def _clip_gradients(self, grads):
        if not (self.clipnorm and self.clipnorm > 0) and \
                not (self.global_clipnorm and self.global_clipnorm > 0):
            return super()._clip_gradients(grads)  # clipvalue is elementwise
        squares = tf.stack([tf.reduce_sum(tf.square(g)) for g in grads])
        sums = tf.unstack(step.active().allreduce(squares, group=self._tnt_zero_group[0]),
                          num=len(grads))
        if self.clipnorm and self.clipnorm > 0:
            out = []
            for g, l2sum in zip(grads, sums):  # as Keras's _clip_by_norm
                positive = l2sum > 0
                l2norm = tf.where(positive, tf.sqrt(tf.where(positive, l2sum, 1.0)), l2sum)
                out.append(g * self.clipnorm / tf.maximum(l2norm, self.clipnorm))
            return out
        norm = tf.sqrt(tf.add_n(sums))  # as Keras's clip_by_global_norm
        scale = self.global_clipnorm * tf.minimum(1.0 / norm, 1.0 / self.global_clipnorm)
        scale = scale + (norm - norm)
        return [g * scale for g in grads]


class ShardedLamb:
    """Placed in front of Lamb's class when it updates the parts: Lamb
    scales each variable's update by the ratio of the variable's norm to
    the update's, norms of whole tensors. They come from the sums of every
    rank's parts' squares, all of them in one allreduce once every part's
    update is known; the sums are added in another order than a whole
    tensor's, so the weights equal stage 0's within rounding. The moments
    are updated as keras.optimizers.Lamb.update_step updates them."""

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        self._tnt_updates = []  # (part, its update, learning rate), by update_step
        super()._backend_update_step(grads, trainable_variables, learning_rate)
        updates, self._tnt_updates = self._tnt_updates, []
        squares = tf.stack([tf.reduce_sum(tf.square(t)) for part, update, _ in updates
                            for t in (part, update)])
        sums = step.active().allreduce(squares, group=self._tnt_zero_group[0])
        for i, (part, update, lr) in enumerate(updates):
            w_norm, g_norm = tf.sqrt(sums[2 * i]), tf.sqrt(sums[2 * i + 1])
            ratio = tf.where(w_norm > 0, tf.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
            self.assign_sub(part, ratio * lr * update)

    def update_step(self, gradient, variable, learning_rate):
        ops_ = keras.ops
        lr = ops_.cast(learning_rate, variable.dtype)
        gradient = ops_.cast(gradient, variable.dtype)
        local_step = ops_.cast(self.iterations + 1, variable.dtype)
        beta_1_power = ops_.power(ops_.cast(self.beta_1, variable.dtype), local_step)
        beta_2_power = ops_.power(ops_.cast(self.beta_2, variable.dtype), local_step)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign_add(m, ops_.multiply(ops_.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops_.multiply(ops_.subtract(ops_.square(gradient), v),
                                         1 - self.beta_2))
        m_t_hat = ops_.divide(m, (1.0 - beta_1_power))
        v_sqrt = ops_.add(ops_.sqrt(ops_.divide(v, (1.0 - beta_2_power))), self.epsilon)
        self._tnt_updates.append((variable, ops_.divide(m_t_hat, v_sqrt), lr))


class ShardedAdafactor:
    """Placed in front of Adafactor's class when it updates the parts.
    Adafactor keeps, for a variable of two or more dimensions, the means of
    its squared gradients over the last axis (r) and over the one before (c)
    instead of one second moment per element, and scales the update by the
    root mean squares of the whole variable and of the whole update. A part
    is a range of the variable's elements that cuts rows, so every rank adds
    up its part's squares by row and by column, one allreduce gives the
    whole sums (with the variable's sum of squares), and every rank keeps r
    and c whole: the same values on every rank, a row and a column of the
    variable in size (Slots writes them as the optimizer's own variables).
    The estimate v of the second moments is then computed for the part's
    elements, and one more allreduce gives the update's sum of squares. The
    sums are added in another order than a whole tensor's: the weights
    equal stage 0's within rounding. The arithmetic is
    keras.optimizers.Adafactor.update_step's."""

    def build(self, var_list):
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, var_list)
        shards = self._tnt_shards
        self._tnt_wholes = {id(p): (tuple(v.shape), lo, hi) for p, v, (lo, hi) in
                            zip(shards.parts, shards.variables, shards.ranges)}
        self._r, self._c, self._v = [], [], []
        self._tnt_replicated = set()  # ids of r and c: whole, alike on every rank
        for part in var_list:
            shape = self._tnt_wholes[id(part)][0]
            for factors, factor_shape in ((self._r, shape[:-1]),
                                          (self._c, shape[:-2] + shape[-1:])):
                if len(shape) < 2:  # not factored: a placeholder, as Adafactor's own
                    factors.append(keras.Variable(0, name=part.name, trainable=False))
                else:
                    factors.append(self.add_variable(shape=factor_shape, dtype=part.dtype,
                                                     name=part.name))
                self._tnt_replicated.add(id(factors[-1]))
            self._v.append(self.add_variable_from_reference(reference_variable=part,
                                                            name="velocity"))

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        group = self._tnt_zero_group[0]
        squares = [tf.square(tf.cast(g, p.dtype)) + tf.cast(self.epsilon_1, p.dtype)
                   for g, p in zip(grads, trainable_variables)]
        # The parts' sums by row and by column of the factored variables,
        # and of each variable's squares, added up over the ranks at once.
        local, places = [], []
        for part, square in zip(trainable_variables, squares):
            shape, lo, hi = self._tnt_wholes[id(part)]
            places.append(len(local))
            if len(shape) >= 2:
                rows, cols = shape[-2], shape[-1]
                at = tf.range(lo, hi, dtype=tf.int64)
                local.append(tf.math.unsorted_segment_sum(
                    square, at // cols, int(np.prod(shape[:-1], dtype=np.int64))))
                local.append(tf.math.unsorted_segment_sum(
                    square, at // (rows * cols) * cols + at % cols,
                    int(np.prod(shape[:-2], dtype=np.int64)) * cols))
            local.append(tf.reshape(tf.reduce_sum(tf.square(part)), [1]))
        sizes = [int(t.shape[0]) for t in local]
        summed = tf.split(step.active().allreduce(tf.concat(local, 0), group=group), sizes)
        ops_ = keras.ops
        local_step = ops_.cast(self.iterations + 1, tf.float32)
        lr = ops_.cast(learning_rate, tf.float32)
        if not callable(self._learning_rate) and self.relative_step:
            lr = ops_.minimum(lr, 1 / ops_.sqrt(local_step))
        rho_t = ops_.minimum(lr, 1 / ops_.sqrt(local_step))
        beta_2_t = ops_.subtract(1, ops_.power(local_step, self.beta_2_decay))
        updates, u_squares = [], []
        for part, grad, square, at in zip(trainable_variables, grads, squares, places):
            shape, lo, hi = self._tnt_wholes[id(part)]
            size = int(np.prod(shape, dtype=np.int64))
            index = self._get_variable_index(part)
            v = self._v[index]
            if len(shape) >= 2:
                rows, cols = shape[-2], shape[-1]
                r, c = self._r[index], self._c[index]
                row_means = tf.reshape(summed[at] / cols, shape[:-1])
                col_means = tf.reshape(summed[at + 1] / rows, shape[:-2] + shape[-1:])
                self.assign(r, beta_2_t * r + (1 - beta_2_t) * row_means)
                self.assign(c, beta_2_t * c + (1 - beta_2_t) * col_means)
                ratio = tf.reshape(r / ops_.mean(r, axis=-1, keepdims=True), [-1])
                flat = tf.range(lo, hi, dtype=tf.int64)
                self.assign(v, tf.gather(ratio, flat // cols) *
                            tf.gather(tf.reshape(c, [-1]), flat // (rows * cols) * cols
                                      + flat % cols))
            else:
                self.assign(v, beta_2_t * v + (1 - beta_2_t) * square)
            u_t = tf.cast(grad, part.dtype) / ops_.sqrt(v)
            rms_w = ops_.sqrt(summed[at + (2 if len(shape) >= 2 else 0)][0] / size)
            alpha_t = ops_.maximum(self.epsilon_2, rms_w) * rho_t
            updates.append((part, u_t, alpha_t, size))
            u_squares.append(tf.reduce_sum(tf.square(u_t)))
        u_sums = step.active().allreduce(tf.stack(u_squares), group=group) if updates else []
        for (part, u_t, alpha_t, size), u_sum in zip(updates, tf.unstack(u_sums)):
            u_hat = u_t / ops_.maximum(1.0, ops_.sqrt(u_sum / size) / self.clip_threshold)
            self.assign_sub(part, alpha_t * u_hat)


def _nbytes(variable):
    return int(np.prod(variable.shape)) * np.dtype(variable.dtype).itemsize


def _mib(variables):
    return sum(_nbytes(v) for v in variables) / 2**20


def shard(optimizer, stage, resources):
    """Makes `optimizer` keep the state of this rank's parts only, at ZeRO
    `stage` (1, 2 or 3), among the ranks that average the gradients of
    `resources` (step.Resources); returns it."""
    if isinstance(optimizer, ShardedOptimizer):
        return optimizer  # compiled again with the same optimizer
    if optimizer.built:
        raise runtime.TarantellaError(
            f"zero_stage={stage}: the optimizer was built (it has a state for the whole "
            "model) before the model was distributed: give tnt.Model a model compiled with a "
            "new optimizer, or compile the tnt.Model")
    updating = optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        updating = optimizer.inner_optimizer
    if not isinstance(updating, ELEMENTWISE):
        raise runtime.TarantellaError(
            f"zero_stage={stage} updates each rank's part of every variable on its own, which "
            "computes the update of the whole variable only for an optimizer that updates each "
            "element from its own gradient and state (or, as Lamb and Adafactor, from sums that "
            f"the parts add up); {type(updating).__name__} is not one "
            "of them (it reads whole tensors, or Tarantella does not know it): use "
            "zero_stage=0 with it, or one of "
            f"{', '.join(c.__name__ for c in ELEMENTWISE)} (AdamW among the Adams)")
    optimizer._tnt_zero_stage = stage
    if isinstance(updating, keras.optimizers.Lamb):
        subclass.add_mixin(updating, ShardedLamb)
    if isinstance(updating, keras.optimizers.Adafactor):
        subclass.add_mixin(updating, ShardedAdafactor)
    for o in {id(optimizer): optimizer, id(updating): updating}.values():
        o._tnt_zero_group = (resources.group, resources.group_size)
    subclass.add_mixin(updating, ShardedClipping)
    return subclass.add_mixin(optimizer, ShardedOptimizer)

