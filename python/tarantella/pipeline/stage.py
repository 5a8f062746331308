"""A pipelined tnt.Model's steps: this rank runs its stage of the model (or,
interleaved, its stages) on the micro-batches of its replica's share of
each global batch.

A training step of stage s (inside Keras's traced train function):

1. the replica's batch of n samples is split into M micro-batches of
   n // M samples, one more for the first n % M (as data/ splits a global
   batch among ranks);
2. the rank's list of actions (schedule.py) runs through one interpreter
   (_Step, a method per kind of action): a forward receives the micro-batch's
   activations from stage s - 1 (stage 0 reads the data), runs the stage
   under a GradientTape and sends the outputs to stage s + 1; the last stage
   computes the loss and updates the metrics. A backward receives the
   gradients of the stage's outputs, differentiates, sends the gradients of
   the stage's inputs back, and adds the weight gradients to the step's sum
   (with TNT_PIPELINE_WEIGHT_GRADIENTS=recompute it computes the inputs'
   gradients only, and the stage gets its weight gradients from one more
   forward and backward of the whole batch once its part of the schedule is
   over: what the sum held, and a micro-batch's new gradients beside it,
   are never held). The zero-bubble schedules split the backward: B builds
   the whole backward as above but only the inputs' gradients run with
   it; the ops that compute the weight gradients alone wait for the
   micro-batch's W action, which adds their result to the sum;
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
stage only (weights.py); whole() gives it every stage's weights, copied
from the ranks that train them, for as long as its weights are read
(get_weights), and frees them afterwards. save and save_weights, and so
ModelCheckpoint, stream the stages to the writer instead (checkpoint.py),
BackupAndRestore backs each stage up on its own (backup/), and predict
runs through the stages.
"""
import weakref

import keras
import tensorflow as tf

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import gradients
from tarantella import log
from tarantella import ops
from tarantella import runtime
from tarantella import settings
from tarantella import step
from tarantella import subclass
from tarantella.pipeline import autocut
from tarantella.pipeline import in_place
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

    def __init__(self, model, strategy, num_micro_batches, num_stages=None, deferred=(),
                 schedule=None):
        """`deferred`: the variables of a model built by
        weights.build_deferred, none of them allocated yet; `schedule`: the
        schedule's name (None: TNT_PIPELINE_SCHEDULE's)."""
        _check_arguments(model, num_micro_batches)
        self.partition = _partition(model, num_stages, deferred)
        k = self.partition.num_stages
        self.num_micro_batches = int(num_micro_batches or 2 * k)
        self.schedule_name, chooser = schedule_lib.chosen(schedule)
        ranks = k
        try:
            if self.schedule_name in schedule_lib.CHUNKED:
                if ParallelStrategy.DATA in strategy:
                    raise schedule_lib.ScheduleError(
                        f"the {self.schedule_name} pipeline schedule runs with "
                        "ParallelStrategy.PIPELINING (every rank holds several chunks of the "
                        "model): use PIPELINING, or the 1f1b schedule for replicas of a "
                        "pipeline")
                ranks = runtime.get_size()
            # Checked once here: a schedule that would deadlock or exceed its
            # memory bound fails before any rank starts it.
            training = schedule_lib.training(self.schedule_name, k, ranks,
                                             self.num_micro_batches)
            self.schedules = {True: training, False: schedule_lib.inference(training)}
        except schedule_lib.ScheduleError as e:
            raise schedule_lib.ScheduleError(f"{e} (the schedule is {chooser})") from None
        self.layout = Layout(strategy, k, ranks)
        # This rank's place in its pipeline, and the stages (chunks) it runs.
        self.stage = self.layout.stage
        self.stages = self.schedules[True].stages_of(self.stage)
        self.model = self.partition.stages[self.stage]
        self.recompute = settings.get("TNT_PIPELINE_WEIGHT_GRADIENTS") == "recompute"
        if self.recompute and self.schedules[True].splits_backward:
            raise runtime.TarantellaError(
                f"TNT_PIPELINE_WEIGHT_GRADIENTS=recompute computes a stage's weight gradients "
                f"after its part of the schedule, but the {self.schedule_name} schedule "
                f"computes them in passes of their own ({chooser}): unset "
                "TNT_PIPELINE_WEIGHT_GRADIENTS, or choose the 1f1b, gpipe or interleaved "
                "schedule")
        if self.recompute:
            _check_recomputable(model)
        self.models = {s: self.partition.stages[s] for s in self.stages}
        self.trainable_of = {s: list(self.models[s].trainable_variables) for s in self.stages}
        self.trainable = [v for s in self.stages for v in self.trainable_of[s]]
        # Per rank of the pipeline, the variables of its stages: what the
        # whole model is gathered from.
        self.rank_variables = [
            [v for s in self.schedules[True].stages_of(r) for v in self.partition.variables[s]]
            for r in range(ranks)]
        for v in model.weights:
            _pipelined[id(v)] = v
        others = weights_lib.hold_stages(self.partition.stages, self.stages, deferred)
        self.whole = weights_lib.Whole(
            others, self.stages, lambda: self._from_each_stage(self.rank_variables))
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
        schedule = self.schedules[True]
        first = schedule.stages_of(0)
        who = (f"stage {first[0]}" if len(first) == 1
               else f"rank 0 (stages {', '.join(map(str, first))})")
        gradients = ("; weight gradients recomputed from the whole batch after the schedule "
                     "(each stage also keeps its inputs of every micro-batch)"
                     if self.recompute else "")
        log.logger.info(
            "pipeline: %d stages x %d replicas, %d micro-batches per step, schedule %s "
            "(%s holds at most %d micro-batches' activations; bubble %.3f of a step at "
            "best%s)", self.partition.num_stages, self.num_replicas, self.num_micro_batches,
            self.schedule_name, who, schedule.held(0), schedule_lib.idle_share(schedule),
            gradients)
        for line in self.partition.description(mbs):
            log.logger.info("pipeline: %s", line)

    def build_state(self, model, dataset):
        """Builds the optimizer, and the compiled metrics and loss from a
        batch of `dataset` (Keras builds them at their first update, which
        only the last stage makes; every rank needs them built to add their
        state up: the loss has a metric per output when there are several)."""
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # For the stage's weights only: its slots (momentums, ...) are
            # the stage's alone (checkpoint.py maps them for files).
            optimizer.build(self.trainable)
        if optimizer is not None:
            in_place.update_in_place(optimizer)
        output = self.partition.output  # the structure of the model's outputs
        # The loss keeps state (a metric per output) only for several outputs.
        several = len(tf.nest.flatten(output)) > 1
        unbuilt = [c for c in (internals.compile_metrics(model),
                               internals.compile_loss(model) if several else None)
                   if c is not None and not c.built]
        if not unbuilt or dataset is None:
            return
        x, y, _ = keras.utils.unpack_x_y_sample_weight(next(iter(dataset)))
        y = tf.nest.map_structure(lambda t: t[:1], y)
        if all(d is not None for t in tf.nest.flatten(output) for d in t.shape[1:]):
            # Built from shapes: zeros shaped like one sample's outputs,
            # not a forward pass of the whole model on this stage.
            outputs = tf.nest.map_structure(
                lambda t: tf.zeros((1,) + tuple(t.shape[1:]), t.dtype), output)
        else:  # outputs of unknown shapes: from the whole model, gathered for it
            with self.whole():
                outputs = model(tf.nest.map_structure(lambda t: t[:1], x), training=False)
        if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
            outputs = outputs[0]  # one output (a Sequential model's list of one)
        for container in unbuilt:
            container.build(y, outputs)

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

    def _run(self, model, data, training, predicting=False):
        """Runs this rank's actions of the schedule on `data`; returns the
        summed weight gradients of its stages (training), the last stage's
        outputs of each micro-batch (predicting, on the rank of the last
        stage), or None."""
        schedule = self.schedules[training]
        step_ = _Step(self, model, data, schedule, training, predicting)
        for action in schedule.actions[self.layout.stage]:
            step_.run(action)
        step_.count_output_losses()
        if step_.recompute:
            for s in self.stages:
                step_.recompute_weight_gradients(s)
        flush = ops.pipe_flush(self.layout.pipeline_group)
        # The step's collectives (the replicas' gradient averages, the global
        # metrics) block a TensorFlow thread while they wait: they start once
        # this stage's part of the schedule is over, never while it needs
        # the threads.
        step.current().record(flush)
        if predicting:
            return step_.predicted if step_.last in self.stages else None
        if not training:
            return None
        grads = [g for s in self.stages for g in step_.grads[s]]
        # No weight is updated before every gradient exists: an update while
        # a read of that weight still feeds a gradient yet to come (the
        # recomputed backward reads the weights it differentiates) makes
        # TensorFlow copy the weight first (copy on write).
        with tf.control_dependencies([flush] + grads):
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

    def predict_step(self, model, data):
        """The predictions of this replica's part of the batch, in the
        structure of the model's outputs, on the rank of the last stage; no
        rows on the other ranks (model.predict gathers the rows)."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        predicted = self._run(model, (x,), training=False, predicting=True)
        leaves = tf.nest.flatten(self.partition.output)
        if predicted is None:
            flat = [tf.zeros([0] + list(t.shape[1:]), t.dtype) for t in leaves]
        else:
            flat = [tf.concat(parts, axis=0) for parts in
                    zip(*[tf.nest.flatten(outputs) for outputs in predicted])]
        if len(flat) == 1:
            return flat[0]
        return tf.nest.pack_sequence_as(self.partition.output, flat)

    def rank_of(self, stage):
        """The rank, within its pipeline, that runs `stage`."""
        return self.schedules[True].rank_of(stage)

    def predicting_ranks(self):
        """The ranks that hold the predictions, in the order of the parts of
        a global batch: the rank of the last stage in each replica."""
        ranks = len(self.layout.pipeline_ranks)
        last = self.rank_of(self.partition.num_stages - 1)
        return [r * ranks + last for r in range(self.num_replicas)]

    # ------------------------------------------------------------- the whole model

    def broadcast_stage(self):
        """Every replica of this rank's stage takes replica 0's weights (a
        broadcast within the stage's replica group). Collective."""
        if self.layout.replica_group is not None:
            runtime.broadcast_values([v for s in self.stages for v in self.models[s].weights],
                                     root=0,
                                     group=self.layout.replica_group)

    def _from_each_stage(self, per_stage, sources=None):
        """Assigns to the variables `per_stage[s]` the values that the rank
        of stage s holds in `sources[s]` (the same variables by default)."""
        for s, variables in enumerate(per_stage):
            mine = (sources or per_stage)[s] if s == self.stage else variables
            runtime.broadcast_values(variables, mine, root=s, group=self.layout.pipeline_group)


class _Step:
    """One step of this rank's schedule, traced: a method per kind of
    action (schedule.Kind, dispatched by run), and the state that the
    actions pass on, per (stage, micro-batch). `after`: what the next
    transfer or pass waits for, so that TensorFlow runs the actions in the
    list's order."""

    def __init__(self, pipeline, model, data, schedule, training, predicting=False):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        self.pipeline, self.model = pipeline, model
        self.schedule, self.training, self.predicting = schedule, training, predicting
        self.predicted = []  # predicting: the last stage's outputs of each micro-batch
        m = pipeline.num_micro_batches
        self.last = pipeline.partition.num_stages - 1
        first_x = next(t for t in tf.nest.flatten(x) if t is not None)
        n = tf.shape(first_x)[0]
        self.static_batch = first_x.shape[0]  # Keras weighs each output's loss by it
        self.output_losses = []  # of the micro-batches so far, each weighted by n_i / n
        self.sizes = tf.stack([n // m + tf.cast(i < n % m, tf.int32) for i in range(m)])
        self.nf = tf.cast(n, tf.float32)
        self.xs = pipeline._split(x, self.sizes) if 0 in pipeline.stages else None
        runs_last = self.last in pipeline.stages
        self.ys = pipeline._split(y, self.sizes) if runs_last else None
        self.ws = pipeline._split(sample_weight, self.sizes) if runs_last else None
        self.tracker = internals.loss_tracker(model)
        self.compiled_metrics = internals.compile_metrics(model)
        self.timeline = _core.timeline_enabled()  # TNT_TIMELINE: spans of every F and B
        self.after = []
        self.received = {}  # (s, i) -> the stage's inputs
        self.handed = {}    # tag -> tensors this rank sent to itself (_send)
        self.sending = {}   # (s, i) -> the stage's outputs (F) or input gradients (B)
        self.seeds = {}     # (s, i) -> the received gradients of the stage's outputs
        self.saved = {}     # (s, i) -> (tape, inputs, outputs, objective), until B
        self.grads = {s: None for s in pipeline.stages}  # summed weight gradients
        # TNT_PIPELINE_WEIGHT_GRADIENTS=recompute: (s, i) -> the stage's
        # inputs (s > 0) and the received gradients of its outputs, kept
        # for the stage's weight gradients after the schedule.
        self.recompute = training and pipeline.recompute
        self.kept_inputs, self.kept_seeds = {}, {}
        # Where the backward is split: (s, i) -> the weight gradients that
        # B built, the ops that W holds back (_weight_only_roots) and what
        # B ended with (its span, on the timeline).
        self.weight_passes = {}

    def run(self, action):
        """Runs `action` through the method of its kind."""
        _ACTIONS[action.kind](self, action)

    def _specs(self, s):
        cuts = self.pipeline.partition.cut_specs
        return (cuts[s - 1] if s > 0 else None), (cuts[s] if s < self.last else None)

    def _float_outputs(self, s, outputs):
        """Stage s's outputs that carry gradients back (the floating ones)."""
        _, out_specs = self._specs(s)
        return [o for o, spec in zip(tf.nest.flatten(outputs), out_specs)
                if tf.as_dtype(spec[1]).is_floating]

    def _send(self, action, tensors, specs):
        """Sends `tensors` (of cut `specs`) for the SEND `action`; returns
        what the next action waits for. To this rank itself (the turn of a
        V schedule, whose two adjacent stages share a rank), the tensors are
        handed to the matching receive."""
        peer, tag = self.schedule.transfer(action)
        if peer == self.pipeline.stage:
            self.handed[tag] = [tf.cast(t, spec[1]) for t, spec in zip(tensors, specs)]
            return list(self.handed[tag])
        return [self.pipeline._send(t, spec[1], peer, tag) for t, spec in zip(tensors, specs)]

    def _receive(self, action, specs):
        """The tensors (of cut `specs`) that the RECV `action` receives
        (none for no specs: then the next action waits for what it did)."""
        peer, tag = self.schedule.transfer(action)
        if peer == self.pipeline.stage:
            return self.handed.pop(tag)
        if not specs:
            return []
        out = [self.pipeline._recv(spec, self.sizes[action.micro_batch], peer, tag, self.after)
               for spec in specs]
        self.after = []
        return out

    def recv_activations(self, action):
        s, i = action.stage, action.micro_batch
        in_specs, _ = self._specs(s)
        inputs = self._receive(action, in_specs)
        self.received[(s, i)] = inputs[0] if len(inputs) == 1 else inputs

    def forward(self, action):
        s, i = action.stage, action.micro_batch
        n_i = self.sizes[i]
        scale = tf.math.divide_no_nan(tf.cast(n_i, tf.float32), self.nf)
        if s == 0:
            with tf.control_dependencies(self.after):
                inputs = tf.nest.map_structure(tf.identity, self.xs[i])
        else:
            inputs = self.received.pop((s, i))
        if self.timeline:
            flat = tf.nest.flatten(inputs)
            flat[0], began = ops.stamp(flat[0], f"forward {_label(self.schedule, s, i)}")
            inputs = tf.nest.pack_sequence_as(inputs, flat)
        stage_model = self.pipeline.models[s]
        last = s == self.last
        with tf.GradientTape() as tape:
            tape.watch([t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]
                       if s > 0 else [])
            outputs = stage_model(inputs, training=self.training)
            objective = tf.constant(0.0)
            reg = _regularization(stage_model)
            if last and not self.predicting:
                loss, parts = self._loss(i, outputs)
                parts = [p * scale for p in parts]
                self.output_losses = ([a + p for a, p in zip(self.output_losses, parts)]
                                      if self.output_losses else parts)
                total = loss + reg if reg is not None else loss
                objective = total * scale
            elif reg is not None:
                objective = reg * scale
            if self.training and self.model.optimizer is not None:
                # Mixed precision: every stage scales alike (see train_step).
                objective = self.model.optimizer.scale_loss(objective)
        if last and self.predicting:
            self.predicted.append(outputs)
            self.after = tf.nest.flatten(outputs)[:1]
        elif last:
            if self.timeline:
                total = ops.span(began, total, f"forward {_label(self.schedule, s, i)}")
            self.tracker.update_state(total, sample_weight=n_i)
            if self.compiled_metrics is not None:
                self.compiled_metrics.update_state(self.ys[i], outputs, self.ws[i])
            self.after = [total]
        else:
            if reg is not None:
                self.tracker.total.assign_add(tf.cast(reg * tf.cast(n_i, tf.float32),
                                                      self.tracker.total.dtype))
            outs = tf.nest.flatten(outputs)
            if self.timeline:
                outs[0] = ops.span(began, outs[0], f"forward {_label(self.schedule, s, i)}")
            self.sending[(s, i)] = outs
            self.after = []
        if self.training:
            self.saved[(s, i)] = (tape, inputs, outputs, objective)
        if self.recompute and s > 0:
            self.kept_inputs[(s, i)] = inputs

    def _loss(self, i, outputs):
        """Micro-batch i's loss (float32), without regularization, and the
        unweighted loss of each output (models of several outputs)."""
        loss, parts = internals.compiled_loss(self.model, self.ys[i], outputs, self.ws[i])
        return (tf.cast(loss, tf.float32) if loss is not None else tf.constant(0.0)), parts

    def count_output_losses(self):
        """Adds the replica's batch's loss of each output (of its micro-
        batches', each weighted by n_i / n) to the output's loss metric,
        once, as Keras does with a batch's."""
        if self.output_losses:
            internals.count_output_losses(self.model, self.output_losses, self.static_batch)

    def send_activations(self, action):
        s, i = action.stage, action.micro_batch
        _, out_specs = self._specs(s)
        self.after = self._send(action, self.sending.pop((s, i)), out_specs)

    def recv_gradients(self, action):
        s, i = action.stage, action.micro_batch
        _, out_specs = self._specs(s)
        _, _, outputs, _ = self.saved[(s, i)]
        floating = [(o, spec) for o, spec in zip(tf.nest.flatten(outputs), out_specs)
                    if tf.as_dtype(spec[1]).is_floating]
        received = self._receive(action, [spec for _, spec in floating])
        self.seeds[(s, i)] = [tf.cast(g, o.dtype) for g, (o, _) in zip(received, floating)]

    def backward(self, action):
        s, i = action.stage, action.micro_batch
        tape, inputs, outputs, objective = self.saved.pop((s, i))
        # The stage's outputs are differentiated with the received
        # gradients (a vector-Jacobian product), its own loss with 1.
        targets, seeds = [objective], [tf.ones_like(objective)]
        if s < self.last:
            targets += self._float_outputs(s, outputs)
            seeds += self.seeds.pop((s, i))
            if self.recompute:
                self.kept_seeds[(s, i)] = seeds[1:]
        label = f"backward {_label(self.schedule, s, i)}"
        if self.timeline:  # the backward begins with its first received gradient
            if len(seeds) > 1:
                seeds[1], began = ops.stamp(seeds[1], label)
            else:
                # A seed TensorFlow cannot fold into a constant (the
                # stamp would then run while the graph is optimized).
                with tf.control_dependencies(self.after):
                    seeds[0] = seeds[0] + 0.0 * tf.stop_gradient(objective)
                seeds[0], began = ops.stamp(seeds[0], label)
        # Gradients flow back through the floating inputs only.
        float_in = [t for t in (tf.nest.flatten(inputs) if s > 0 else [])
                    if t.dtype.is_floating]
        trainable = [] if self.recompute else self.pipeline.trainable_of[s]
        sources = list(trainable) + float_in
        split = self.schedule.splits_backward
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        first = len(graph.get_operations()) if split and graph is not None else None
        got = _dense(tape.gradient(targets, sources, output_gradients=seeds), sources) \
            if sources else []
        w_grads, in_grads = got[:len(trainable)], got[len(trainable):]
        if split:
            # B ends with the gradients it sends (the first stage sends
            # none: its B is the arrival of its output gradients).
            ended = in_grads or seeds[1:]
            if self.timeline and ended:
                ended[0] = ops.span(began, ended[0], label)
            self.sending[(s, i)] = in_grads
            # W computes the weight gradients, from the ops that this
            # gradient built for them alone.
            self.weight_passes[(s, i)] = (
                w_grads, _weight_only_roots(graph, first, w_grads, in_grads), ended[:1])
            self.after = list(ended) or self.after
            return
        if self.timeline and got:
            got[0] = ops.span(began, got[0], label)
        self.sending[(s, i)] = got[len(trainable):]
        if self.recompute:
            self.after = got
            return
        self._add_weight_gradients(s, got[:len(trainable)])

    def backward_weight(self, action):
        """W of a schedule that splits the backward: the weight gradients
        that B built run once the actions before this one have, and are
        added to the stage's sum."""
        s, i = action.stage, action.micro_batch
        w_grads, roots, b_ended = self.weight_passes.pop((s, i))
        label = f"weight gradients {_label(self.schedule, s, i)}"
        start = self.after
        if self.timeline:
            # Stamped from what B ended with: a span that only control
            # dependencies wait for would be pruned from the graph.
            with tf.control_dependencies(self.after):
                marker = tf.identity(b_ended[0]) if b_ended else tf.timestamp()
            _, began = ops.stamp(marker, label)
            start = [began]
        internals.hold_back(roots, start)
        if self.timeline and w_grads:
            w_grads[0] = ops.span(began, w_grads[0], label)
        self._add_weight_gradients(s, w_grads)
        self.after = self.after or list(start)

    def _add_weight_gradients(self, s, w_grads):
        summed = self.grads[s]
        self.grads[s] = w_grads if summed is None else [a + b for a, b in zip(summed, w_grads)]
        # The next pass starts once these gradients are summed: a
        # micro-batch's gradients are never kept beside the next one's.
        self.after = list(self.grads[s])

    def recompute_weight_gradients(self, s):
        """Stage s's weight gradients of the step (TNT_PIPELINE_WEIGHT_
        GRADIENTS=recompute): one forward of the replica's batch through the
        stage, after the schedule, and one backward of the objective that its
        micro-batches' passes had (each loss weighted by n_i / n, the
        received gradients of the outputs as seeds). The stage's layers draw
        no random numbers and keep no batch statistics
        (_check_recomputable), so the forward computes what the passes did;
        the gradients come from the whole batch at once (the order of their
        sums is serial Keras's, not the micro-batches')."""
        m = self.pipeline.num_micro_batches
        parts = [self.xs[i] if s == 0 else self.kept_inputs.pop((s, i)) for i in range(m)]
        inputs = tf.nest.map_structure(lambda *t: tf.concat(t, axis=0), *parts)
        with tf.control_dependencies(self.after):
            inputs = tf.nest.map_structure(tf.identity, inputs)
        if self.timeline:
            flat = tf.nest.flatten(inputs)
            flat[0], began = ops.stamp(flat[0], f"weight gradients of stage {s}")
            inputs = tf.nest.pack_sequence_as(inputs, flat)
        stage_model = self.pipeline.models[s]
        with tf.GradientTape() as tape:
            outputs = stage_model(inputs, training=True)
            reg = _regularization(stage_model)
            # The passes' regularization, reg x n_i / n, summed: reg x 1 (0 for an empty batch).
            objective = (reg * tf.math.divide_no_nan(self.nf, self.nf) if reg is not None
                         else tf.constant(0.0))
            if s == self.last:
                scales = tf.math.divide_no_nan(tf.cast(self.sizes, tf.float32), self.nf)
                parts = self.pipeline._split(outputs, self.sizes)
                objective += tf.add_n([self._loss(i, parts[i])[0] * scales[i]
                                        for i in range(m)])
            if self.model.optimizer is not None:
                objective = self.model.optimizer.scale_loss(objective)
        targets, seeds = [objective], [tf.ones_like(objective)]
        if s < self.last:
            targets += self._float_outputs(s, outputs)
            kept = [self.kept_seeds.pop((s, i)) for i in range(m)]
            seeds += [tf.concat(per_output, axis=0) for per_output in zip(*kept)]
        trainable = self.pipeline.trainable_of[s]
        grads = _dense(tape.gradient(targets, trainable, output_gradients=seeds), trainable)
        if self.timeline and grads:
            grads[0] = ops.span(began, grads[0], f"weight gradients of stage {s}")
        self.grads[s] = grads
        self.after = list(grads)

    def send_gradients(self, action):
        s, i = action.stage, action.micro_batch
        in_specs, _ = self._specs(s)
        back = [spec for spec in in_specs if tf.as_dtype(spec[1]).is_floating]
        self.after += self._send(action, self.sending.pop((s, i)), back)


def _regularization(stage_model):
    """The sum of the stage's regularization losses (float32), or None."""
    reg = [tf.cast(loss, tf.float32) for loss in stage_model.losses]
    return tf.add_n(reg) if reg else None


def _dense(grads, sources):
    """Gradients as dense tensors, zeros where a source had none."""
    return [tf.zeros(v.shape, dtype=v.dtype) if g is None else g
            for g, v in zip(gradients.shaped(grads, sources), sources)]


def _weight_only_roots(graph, first, weight_grads, input_grads):
    """The ops of `graph` from the `first`-th on (those that a backward
    built) that compute `weight_grads` but not `input_grads`, and take no
    input from each other: everything W computes waits for them. None in
    eager mode (`graph` None), where ops run as they are made, in the
    list's order."""
    if graph is None:
        return []
    built = set(graph.get_operations()[first:])

    def ancestors(tensors):
        seen, todo = set(), [t.op for t in tensors]
        while todo:
            op = todo.pop()
            if op in built and op not in seen:
                seen.add(op)
                todo += [t.op for t in op.inputs] + list(op.control_inputs)
        return seen

    only = ancestors(weight_grads) - ancestors(input_grads)
    return [op for op in only if not any(t.op in only for t in op.inputs)
            and not any(c in only for c in op.control_inputs)]


def _check_arguments(model, num_micro_batches):
    """Raises for micro-batches that are no whole number in range, and for a
    model with a train_step or test_step of its own."""
    if num_micro_batches is not None and (not runtime.is_whole_number(num_micro_batches)
                                          or num_micro_batches < 1
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


def _partition(model, num_stages, deferred):
    """The model cut at its SplitLayers, or (num_stages) where autocut
    balances the stages' measured costs."""
    if num_stages is not None:
        if not runtime.is_whole_number(num_stages) or num_stages < 2:
            raise runtime.TarantellaError(
                f"num_stages={num_stages!r} must be a whole number of at least 2 (the "
                "stages to cut the model into)")
        if any(is_split_layer(layer) for layer in model.layers):
            raise runtime.TarantellaError(
                f"model '{model.name}' has SplitLayers and num_stages={num_stages} was "
                "given: either place the cuts (SplitLayers) or let Tarantella choose them "
                "(num_stages), not both")
        # Timing a block needs its weights: a model built without them
        # allocates one block at a time while it is cut.
        plan = autocut.plan(model, int(num_stages),
                            weights_lib.allocated_meanwhile if deferred else None)
        partition = partition_lib.Partition(model, cut_after=plan.cuts)
        partition.costs = [plan.cost_text(s) for s in range(plan.num_stages)]
        return partition
    return partition_lib.Partition(model)


def _check_recomputable(model):
    """TNT_PIPELINE_WEIGHT_GRADIENTS=recompute runs each stage's forward
    twice a step and needs the second to compute what the micro-batches'
    did: raises, on every rank alike, for a layer that draws random numbers
    (Dropout, noise, random augmentation) or keeps batch statistics."""
    for layer in internals.flatten_layers(model):
        what = ("draws random numbers" if internals.seed_generators(layer) else
                "normalizes with batch statistics"
                if isinstance(layer, keras.layers.BatchNormalization) else None)
        if what is not None:
            raise runtime.TarantellaError(
                f"TNT_PIPELINE_WEIGHT_GRADIENTS=recompute computes a stage's weight gradients "
                f"from a second forward of the whole batch, but layer '{layer.name}' "
                f"({type(layer).__name__}) {what}, so that forward would not compute what the "
                "micro-batches' did: unset TNT_PIPELINE_WEIGHT_GRADIENTS (each micro-batch's "
                "gradients are then summed)")


def _label(schedule, s, i):
    """A pass's name on the timeline: the micro-batch, and the stage when
    a rank runs several."""
    return f"{i}" if schedule.num_stages == schedule.num_ranks else f"{i} of stage {s}"


# The method of _Step that runs each kind of action.
_ACTIONS = {schedule_lib.Kind.RECV_ACTIVATIONS: _Step.recv_activations,
            schedule_lib.Kind.FORWARD: _Step.forward,
            schedule_lib.Kind.SEND_ACTIVATIONS: _Step.send_activations,
            schedule_lib.Kind.RECV_GRADIENTS: _Step.recv_gradients,
            schedule_lib.Kind.BACKWARD: _Step.backward,
            schedule_lib.Kind.SEND_GRADIENTS: _Step.send_gradients,
            schedule_lib.Kind.BACKWARD_WEIGHT: _Step.backward_weight}
