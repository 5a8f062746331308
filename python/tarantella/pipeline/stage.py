"""A pipelined tnt.Model's steps: this rank runs its stage of the model on
the micro-batches of its replica's share of each global batch.

A training step of stage s (inside Keras's traced train function):

1. the replica's batch of n samples is split into M micro-batches of
   n // M samples, one more for the first n % M (as data.py splits a global
   batch among ranks);
2. the schedule (schedule.py) runs: a forward receives the micro-batch's
   activations from stage s - 1 (stage 0 reads the data), runs the stage
   under a GradientTape and sends the outputs to stage s + 1; the last stage
   computes the loss and updates the metrics. A backward receives the
   gradients of the stage's outputs, differentiates, sends the gradients of
   the stage's inputs back, and adds the weight gradients to the step's sum;
3. micro-batch i's loss is weighted by n_i / n, so the sum is the gradient
   of the replica's mean loss; the optimizer then averages it over the
   replicas of the stage, weighted by each replica's n (gradients.py), which
   gives the gradient of the global batch's mean loss: what serial Keras
   computes for that batch.

Metrics are the last stage's: every other stage leaves its metric state at
zero, so the global results, computed from the sum of every rank's state
(metrics.py), are those of the last stages of all replicas. The loss shown
also holds the regularization losses of every stage.

Every rank holds the whole Keras model's layers, but the weights of its
stage only (weights.py); whole() gives it every stage's weights (and
whole_optimizer() every stage's optimizer slots), copied from the ranks
that train them, for as long as the model is saved, its weights are read
or it predicts, and frees them afterwards.
"""
import contextlib
import weakref

import keras
import tensorflow as tf

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import ops
from tarantella import runtime
from tarantella import step
from tarantella import subclass
from tarantella.pipeline import autocut
from tarantella.pipeline import partition as partition_lib
from tarantella.pipeline import schedule as schedule_lib
from tarantella.pipeline import weights as weights_lib
from tarantella.pipeline.layers import is_split_layer
from tarantella.pipeline.layout import Layout
from tarantella.pipeline.layout import ParallelStrategy

MAX_MICRO_BATCHES = 16383  # tags of libtnt's transfers: 2 per micro-batch, < 32768

_pipelined = weakref.WeakValueDictionary()  # id -> variable of a pipelined model


def require_not_pipelined(variables, what):
    """Raises when one of `variables` belongs to a pipelined model: only
    the model's own steps can train it."""
    for v in variables:
        if _pipelined.get(id(v)) is v:
            raise runtime.TarantellaError(
                f"{what} was given the weight {v.path} of a pipelined tnt.Model; a pipeline "
                "trains through the model's own fit (its stages exchange micro-batches): train "
                "it with fit, or use ParallelStrategy.DATA for a custom loop")


def is_one_stage(model, strategy, num_stages):
    """True when `model`, to be pipelined with `strategy`, is a functional
    or Sequential model without SplitLayers and no num_stages was given:
    one stage, trained data-parallel (the chosen way is logged). Raises
    under PIPELINING on several ranks, where one stage cannot run."""
    if num_stages is not None or not partition_lib.is_graph_model(model):
        return False
    if any(is_split_layer(layer) for layer in model.layers):
        return False
    if ParallelStrategy.DATA not in strategy and runtime.get_size() > 1:
        raise runtime.TarantellaError(
            f"model '{model.name}' has no SplitLayer, so it is one pipeline stage, which "
            f"ParallelStrategy.PIPELINING runs on one rank, not {runtime.get_size()}: put "
            "tnt.keras.layers.SplitLayer() on the tensors where the model is to be cut, pass "
            "num_stages=K to let Tarantella cut it, or use ParallelStrategy.DATA or ALL")
    log.logger.info("model '%s' has no SplitLayer: it is one pipeline stage, trained "
                    "data-parallel on %d rank(s)", model.name, runtime.get_size())
    return True


class Pipeline:
    """The pipeline of one tnt.Model on this rank."""

    def __init__(self, model, strategy, num_micro_batches, num_stages=None, deferred=()):
        """`deferred`: the variables of a model built by
        weights.build_deferred, none of them allocated yet."""
        if num_micro_batches is not None and (not runtime._is_whole_number(num_micro_batches) or num_micro_batches < 1
              or num_micro_batches > MAX_MICRO_BATCHES):
            raise runtime.TarantellaError(
                f"num_micro_batches={num_micro_batches!r} must be a whole number from 1 to "
                f"{MAX_MICRO_BATCHES} (micro-batches per global batch and replica)")
        for step_name in ("train_step", "test_step"):
            if getattr(subclass.base_class(model), step_name) is not getattr(keras.Model,
                                                                              step_name):
                raise runtime.TarantellaError(
                    f"model '{model.name}' has a {step_name} of its own, but a pipeline runs its "
                    f"own train_step and test_step (the stages exchange micro-batches): train "
                    "it with ParallelStrategy.DATA, or move the custom logic into layers and "
                    "the loss")
        if num_stages is not None:
            if not runtime._is_whole_number(num_stages) or num_stages < 2:
                raise runtime.TarantellaError(
                    f"num_stages={num_stages!r} must be a whole number of at least 2 (the "
                    "stages to cut the model into)")
            if any(is_split_layer(layer) for layer in model.layers):
                raise runtime.TarantellaError(
                    f"model '{model.name}' has SplitLayers and num_stages={num_stages} was "
                    "given: either place the cuts (SplitLayers) or let Tarantella choose them "
                    "(num_stages), not both")
            # Timing the blocks needs their weights: a model built without
            # them holds them all while it is cut (see docs/pipelining.md).
            with weights_lib.allocated_meanwhile(deferred):
                plan = autocut.plan(model, int(num_stages))
            self.partition = partition_lib.Partition(model, cut_after=plan.cuts)
            self.partition.costs = [plan.cost_text(s) for s in range(plan.num_stages)]
        else:
            self.partition = partition_lib.Partition(model)
        k = self.partition.num_stages
        self.layout = Layout(strategy, k)
        self.num_micro_batches = int(num_micro_batches or 2 * k)
        self.schedule_name = schedule_lib.name_from_settings()
        self.stage = self.layout.stage
        self.model = self.partition.stages[self.stage]
        self.trainable = list(self.model.trainable_variables)
        for v in model.weights:
            _pipelined[id(v)] = v
        others = weights_lib.hold_stage(self.partition.stages, self.stage, deferred)
        self.whole = weights_lib.Whole(
            others, self.stage, lambda: self._from_each_stage(self.partition.variables))
        self.described = False

    # ------------------------------------------------------------- placement

    @property
    def num_replicas(self):
        return self.layout.num_replicas

    def resources(self):
        """The step resources: gradients average over the stage's replicas."""
        return step.Resources(self.layout.replica_group, self.layout.num_replicas)

    def describe(self, global_batch=None):
        """Logs the partition once, on the master."""
        if self.described:
            return
        self.described = True
        mbs = None
        if global_batch:
            mbs = max(1, global_batch // (self.num_replicas * self.num_micro_batches))
        ops_ = schedule_lib.training(self.schedule_name, 0, self.partition.num_stages,
                                     self.num_micro_batches)
        log.logger.info(
            "pipeline: %d stages x %d replicas, %d micro-batches per step, schedule %s "
            "(stage 0 holds at most %d micro-batches' activations)", self.partition.num_stages,
            self.num_replicas, self.num_micro_batches, self.schedule_name,
            schedule_lib.in_flight(ops_))
        for line in self.partition.description(mbs):
            log.logger.info("pipeline: %s", line)

    def build_state(self, model, dataset):
        """Builds the optimizer, and the compiled metrics from a batch of
        `dataset` (Keras builds them at their first update, which only the
        last stage makes; every rank needs them built to add their state
        up)."""
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # For the stage's weights only: its slots (momentums, ...) are
            # the stage's alone (whole_optimizer() assembles them for files).
            optimizer.build(self.trainable)
        metrics = internals.compile_metrics(model)
        if metrics is None or metrics.built or dataset is None:
            return
        x, y, _ = keras.utils.unpack_x_y_sample_weight(next(iter(dataset)))
        y = tf.nest.map_structure(lambda t: t[:1], y)
        shapes = [tuple(t.shape[1:]) for t in model.outputs]
        if all(d is not None for shape in shapes for d in shape):
            # Metrics are built from shapes: zeros shaped like one sample's
            # outputs, not a forward pass of the whole model on this stage.
            outputs = [tf.zeros((1,) + shape, t.dtype) for shape, t in zip(shapes, model.outputs)]
            metrics.build(y, outputs[0] if len(outputs) == 1 else outputs)
        else:  # outputs of unknown shapes: from the whole model, gathered for it
            with self.whole():
                metrics.build(y, model(tf.nest.map_structure(lambda t: t[:1], x),
                                       training=False))

    # ------------------------------------------------------------- the steps

    def _split(self, structure, sizes):
        m = self.num_micro_batches
        if structure is None:
            return [None] * m
        flat = tf.nest.flatten(structure)
        parts = [tf.split(t, sizes, num=m) if t is not None else [None] * m for t in flat]
        return [tf.nest.pack_sequence_as(structure, [p[i] for p in parts]) for i in range(m)]

    def _recv(self, spec, n, peer, tag, after):
        shape, dtype = spec
        dims = tf.concat([tf.reshape(tf.cast(n, tf.int64), [1]),
                          tf.constant(shape, dtype=tf.int64, shape=[len(shape)])], axis=0)
        with tf.control_dependencies(after):
            t = ops.pipe_recv(dims, tf.as_dtype(dtype), self.layout.pipeline_group, peer, tag)
        t.set_shape((None,) + tuple(shape))
        return t

    def _send(self, tensor, dtype, peer, tag):
        return ops.pipe_send(tf.cast(tensor, dtype), self.layout.pipeline_group, peer, tag)

    def _run(self, model, data, training):
        """Runs this stage's schedule on `data`; returns the summed weight
        gradients (training) or None."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        k, s, m = self.partition.num_stages, self.stage, self.num_micro_batches
        last = s == k - 1
        first_x = next(t for t in tf.nest.flatten(x) if t is not None)
        n = tf.shape(first_x)[0]
        sizes = tf.stack([n // m + tf.cast(i < n % m, tf.int32) for i in range(m)])
        xs = self._split(x, sizes) if s == 0 else [None] * m
        ys = self._split(y, sizes) if last else [None] * m
        ws = self._split(sample_weight, sizes) if last else [None] * m
        in_specs = self.partition.cut_specs[s - 1] if s > 0 else None
        out_specs = self.partition.cut_specs[s] if not last else None
        tracker = internals.loss_tracker(model)
        compiled_metrics = internals.compile_metrics(model)
        nf = tf.cast(n, tf.float32)
        ops_ = (schedule_lib.training(self.schedule_name, s, k, m) if training
                else schedule_lib.inference(m))
        saved, grads, after = {}, None, []
        timeline = _core.timeline_enabled()  # TNT_TIMELINE: spans of every F and B
        for kind, i in ops_:
            n_i = sizes[i]
            scale = tf.math.divide_no_nan(tf.cast(n_i, tf.float32), nf)
            if kind == "F":
                if s == 0:
                    with tf.control_dependencies(after):
                        inputs = tf.nest.map_structure(tf.identity, xs[i])
                else:
                    inputs = [self._recv(spec, n_i, s - 1, 2 * i, after) for spec in in_specs]
                    after = []
                    if len(inputs) == 1:
                        inputs = inputs[0]
                if timeline:
                    flat = tf.nest.flatten(inputs)
                    flat[0], began = ops.stamp(flat[0], f"forward {i}")
                    inputs = tf.nest.pack_sequence_as(inputs, flat)
                with tf.GradientTape() as tape:
                    tape.watch([t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]
                               if s > 0 else [])
                    outputs = self.model(inputs, training=training)
                    objective = tf.constant(0.0)
                    reg = [tf.cast(l, tf.float32) for l in self.model.losses]
                    reg = tf.add_n(reg) if reg else None
                    if last:
                        loss = internals.compiled_loss(model, ys[i], outputs, ws[i])
                        loss = tf.cast(loss, tf.float32) if loss is not None else tf.constant(0.0)
                        total = loss + reg if reg is not None else loss
                        objective = total * scale
                    elif reg is not None:
                        objective = reg * scale
                    if training and model.optimizer is not None:
                        # Mixed precision: every stage scales alike (see train_step).
                        objective = model.optimizer.scale_loss(objective)
                if last:
                    if timeline:
                        total = ops.span(began, total, f"forward {i}")
                    tracker.update_state(total, sample_weight=n_i)
                    if compiled_metrics is not None:
                        compiled_metrics.update_state(ys[i], outputs, ws[i])
                    after = [total]
                else:
                    if reg is not None:
                        tracker.total.assign_add(tf.cast(reg * tf.cast(n_i, tf.float32),
                                                         tracker.total.dtype))
                    outs = tf.nest.flatten(outputs)
                    if timeline:
                        outs[0] = ops.span(began, outs[0], f"forward {i}")
                    after = [self._send(o, spec[1], s + 1, 2 * i)
                             for o, spec in zip(outs, out_specs)]
                if training:
                    saved[i] = (tape, inputs, outputs, objective)
                continue
            tape, inputs, outputs, objective = saved.pop(i)
            # The stage's outputs are differentiated with the received
            # gradients (a vector-Jacobian product), its own loss with 1.
            targets, seeds = [objective], [tf.ones_like(objective)]
            if not last:
                for o, spec in zip(tf.nest.flatten(outputs), out_specs):
                    if tf.as_dtype(spec[1]).is_floating:
                        targets.append(o)
                        seeds.append(tf.cast(self._recv(spec, n_i, s + 1, 2 * i + 1, after),
                                             o.dtype))
                        after = []
            if timeline:  # the backward begins with its first received gradient
                if len(seeds) > 1:
                    seeds[1], began = ops.stamp(seeds[1], f"backward {i}")
                else:
                    # A seed TensorFlow cannot fold into a constant (the
                    # stamp would then run while the graph is optimized).
                    with tf.control_dependencies(after):
                        seeds[0] = seeds[0] + 0.0 * tf.stop_gradient(objective)
                    seeds[0], began = ops.stamp(seeds[0], f"backward {i}")
            # Gradients flow back through the floating inputs only.
            float_in = [t for t in (tf.nest.flatten(inputs) if s > 0 else [])
                        if t.dtype.is_floating]
            sources = list(self.trainable) + float_in
            got = tape.gradient(targets, sources, output_gradients=seeds)
            got = [tf.zeros(v.shape, dtype=v.dtype) if g is None else
                   tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                   for g, v in zip(got, sources)]
            if timeline and got:
                got[0] = ops.span(began, got[0], f"backward {i}")
            w_grads = got[:len(self.trainable)]
            grads = w_grads if grads is None else [a + b for a, b in zip(grads, w_grads)]
            # The next pass starts once these gradients are summed: a
            # micro-batch's gradients are never kept beside the next one's.
            after = list(grads)
            back = [spec for spec in (in_specs or []) if tf.as_dtype(spec[1]).is_floating]
            for g, spec in zip(got[len(self.trainable):], back):
                after.append(self._send(g, spec[1], s - 1, 2 * i + 1))
        flush = ops.pipe_flush(self.layout.pipeline_group)
        # The step's collectives (the replicas' gradient averages, the global
        # metrics) block a TensorFlow thread while they wait: they start once
        # this stage's part of the schedule is over, never while it needs
        # the threads.
        step.current().record(flush)
        if grads is None:
            return None
        with tf.control_dependencies([flush]):
            return [tf.identity(g) for g in grads]

    def train_step(self, model, data):
        grads = self._run(model, data, training=True)
        if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
            grads = self._finite_everywhere(grads or [])
        if self.trainable:
            model.optimizer.apply(grads, self.trainable)
        return model.get_metrics_result()

    def _finite_everywhere(self, grads):
        """`grads`, or NaNs when any rank's gradients are not finite. A
        LossScaleOptimizer skips the step and lowers its scale on non-finite
        gradients; every stage must decide alike, or their scales (and the
        loss that the last stage scales) would part."""
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads]
                               or [tf.constant(True)])
        everywhere = step.current().allreduce(tf.reshape(tf.cast(finite, tf.float32), [1]),
                                              "min")[0] > 0
        return [tf.where(everywhere, g, tf.constant(float("nan"), g.dtype)) for g in grads]

    def test_step(self, model, data):
        self._run(model, data, training=False)
        return model.get_metrics_result()

    # ------------------------------------------------------------- the whole model

    def broadcast_stage(self):
        """Every replica of this rank's stage takes replica 0's weights (a
        broadcast within the stage's replica group). Collective."""
        if self.layout.replica_group is not None:
            runtime.broadcast_values(self.model.weights, root=0,
                                     group=self.layout.replica_group)

    def _from_each_stage(self, per_stage, sources=None):
        """Assigns to the variables `per_stage[s]` the values that the rank
        of stage s holds in `sources[s]` (the same variables by default)."""
        for s, variables in enumerate(per_stage):
            mine = (sources or per_stage)[s] if s == self.stage else variables
            runtime.broadcast_values(variables, mine, root=s, group=self.layout.pipeline_group)

    @contextlib.contextmanager
    def whole_optimizer(self, model, fill=True):
        """Within it, model.optimizer is an optimizer of every weight of the
        model, as files hold it: with `fill`, it holds each stage's state
        (from the rank that trains the stage), for writing; else its state
        comes from a file being read, and goes to the stage's optimizer at
        the end. Each rank's own optimizer keeps the state of its stage
        only; this one needs the memory of the whole state while it lasts.
        Collective."""
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or not optimizer.built:
            yield
            return
        with subclass.original_classes([optimizer]):
            config = keras.optimizers.serialize(optimizer)
        whole = keras.optimizers.deserialize(config)
        whole.build(model.trainable_variables)
        ours = _by_name(optimizer.variables)
        slots = internals.optimizer_slots(whole, self.partition.variables)
        in_slots = {id(v) for vs in slots for v in vs}
        shared = [v for v in whole.variables if id(v) not in in_slots]  # iterations, ...
        if fill:
            for v in shared:
                if v.name in ours:
                    v.assign(ours[v.name])
            self._from_each_stage(slots, [[ours[v.name] for v in vs] if i == self.stage else []
                                          for i, vs in enumerate(slots)])
        model.optimizer = whole
        try:
            yield
        finally:
            model.optimizer = optimizer
        # What changed meanwhile (a callback's new learning rate, a file's
        # state) goes to the stage's optimizer.
        for v in shared + ([] if fill else slots[self.stage]):
            if v.name in ours:
                ours[v.name].assign(v)


def _by_name(variables):
    return {v.name: v for v in variables}


class _WholeModelForSavers:
    """Shared by the two callbacks below: around the hooks in which the
    callbacks that save run (each epoch's end, and every batch's end when
    one saves every few batches), the first gives every rank the whole
    model's weights and the whole optimizer; the last one, after those
    callbacks, frees the other stages' weights and gives the stage's
    optimizer back."""

    def __init__(self, pipeline, every_batch):
        self.pipeline = pipeline
        self.every_batch = every_batch
        self.context = None

    def enter(self, model):
        self.context = contextlib.ExitStack()
        self.context.enter_context(self.pipeline.whole())
        self.context.enter_context(self.pipeline.whole_optimizer(model))

    def exit(self):
        if self.context is not None:
            context, self.context = self.context, None
            context.__exit__(None, None, None)


class _Open(keras.callbacks.Callback):
    def __init__(self, shared):
        super().__init__()
        self.shared = shared

    def on_epoch_end(self, epoch, logs=None):
        self.shared.enter(self.model)

    def on_train_batch_end(self, batch, logs=None):
        if self.shared.every_batch:
            self.shared.enter(self.model)


class _Close(keras.callbacks.Callback):
    def __init__(self, shared):
        super().__init__()
        self.shared = shared

    def on_epoch_end(self, epoch, logs=None):
        self.shared.exit()

    def on_train_batch_end(self, batch, logs=None):
        self.shared.exit()

    def on_train_end(self, logs=None):
        self.shared.exit()


def around_savers(pipeline, callbacks):
    """(first, last): callbacks to put before and after `callbacks` so that
    those that save write the whole model; (None, None) when none saves.
    A BackupAndRestore needs none: each stage backs up and restores its own
    variables (resume.py)."""
    savers = [cb for cb in callbacks if isinstance(cb, keras.callbacks.ModelCheckpoint)]
    if not savers:
        return None, None
    every_batch = any(isinstance(getattr(cb, "save_freq", "epoch"), int) for cb in savers)
    shared = _WholeModelForSavers(pipeline, every_batch)
    return _Open(shared), _Close(shared)
