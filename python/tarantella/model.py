"""tnt.Model: a Keras model trained on all ranks.

``tnt.Model(keras_model)`` returns a new model over the same layers and
weights (distributed(), the one place where distributed models are made):
its class is a subclass of keras_model's own class (subclass.py) with the
methods below in front, so the result *is* a keras.Model (and still a
Functional, a Sequential or the user's own subclass) and everything Keras
offers works on it, while keras_model itself is left as it was. Only what
distribution needs changes, through Keras's public extension points:

* ``train_step`` runs the model's own step (Keras's, or an overridden one)
  inside a Tarantella step (step.py): every distributed optimizer averages
  its gradients across ranks (optimizers.py) before it clips or applies
  them, and synchronized BatchNormalization uses the global batch's
  statistics (batch_norm.py);
* ``get_metrics_result`` computes the metrics of the global batch
  (metrics.py);
* ``compile`` distributes the optimizer and keeps the distributed step out
  of XLA (the communication ops are not XLA ops);
* ``fit``, ``evaluate`` and ``predict`` split every global batch into
  micro-batches (data/), broadcast the master's weights first, and adapt
  the callbacks to many ranks (callbacks.py, backup/);
* ``save`` and ``save_weights`` write once, atomically (saving.py), files
  that plain Keras loads;
* output (progress bars, ``summary``) comes from the master rank only,
  unless TNT_OUTPUT_ON_ALL_DEVICES is set.

With ``parallel_strategy=ParallelStrategy.PIPELINING`` (or ``ALL``) the
model is cut into stages at its SplitLayers and each rank trains one stage
(pipeline/): ``train_step`` and ``test_step`` run the rank's stage on
micro-batches, the datasets are split among the replicas of the pipeline
instead of among all ranks. Each rank holds its stage's weights only
(pipeline/weights.py); ``tnt.Model(build_fn, ...)`` builds the model
without allocating any weight, so that none of its ranks ever holds the
whole model while it trains. ``save`` and ``save_weights`` stream the
stages' values to the master, which writes the file (``.weights.json``:
Keras's sharded format, one shard per stage), and ``load_weights`` reads
each rank's stage only (pipeline/checkpoint.py); ModelCheckpoint saves
through them. The whole model is gathered on every rank of the pipeline,
and freed again, only while its weights are read (get_weights); predict
runs through the stages, and BackupAndRestore backs each stage up on its
own.

With ``zero_stage`` 1, 2 or 3 each rank keeps its part of the optimizer's
state only (zero/shards.py), at 3 of the weights too, which its steps gather
(zero/steps.py); ``save``, ``save_weights``, ModelCheckpoint and
BackupAndRestore stream the parts to the master, which writes the state
whole, and loading gives each rank its part (zero/checkpoint.py).
"""
import contextlib
import copy
import hashlib
import os

import keras
import numpy as np
import tensorflow as tf

from tarantella import _keras_internals as internals
from tarantella import batch_norm
from tarantella import callbacks as tnt_callbacks
from tarantella import data
from tarantella import log
from tarantella import metrics
from tarantella import optimizers
from tarantella import runtime
from tarantella import saving
from tarantella import step
from tarantella import subclass
from tarantella import timeline
from tarantella.zero import shards as zero_shards
from tarantella.zero import checkpoint as zero_checkpoint
from tarantella.zero import steps as zero_steps
from tarantella.backup import position
from tarantella.pipeline import checkpoint
from tarantella.pipeline import stage as pipeline_stage
from tarantella.pipeline import weights as stage_weights
from tarantella.pipeline.layout import ParallelStrategy


def _steps(dataset, steps=None):
    """The steps a loop over `dataset` takes: `steps` when given, else the
    dataset's cardinality (-1: infinite, -2: unknown, 0: no dataset)."""
    if steps is not None:
        return int(steps)
    if dataset is None:
        return 0
    return int(dataset.cardinality().numpy())


class _State:
    """What Tarantella keeps per model (a plain object, so Keras does not
    track it as model state)."""

    def __init__(self):
        self.resources = step.Resources()
        self.broadcast_pending = True
        self.with_local = False
        self.saves_of_this_rank = False
        self.pipeline = None  # a pipeline.stage.Pipeline when pipelined
        self.zero_stage = 0
        self.deferred = ()  # variables a build function made, not allocated yet (zero_stage=3)

    def data_parallel_ranks(self):
        """The ranks that average each gradient: all, or a stage's replicas."""
        return runtime.get_size() if self.pipeline is None else self.pipeline.num_replicas


def _arguments(model=None, parallel_strategy=ParallelStrategy.DATA, num_micro_batches=None,
               num_stages=None, pipeline_schedule=None, *, zero_stage=0,
               num_pipeline_stages=None):
    """tnt.Model's arguments; `num_pipeline_stages` is the original
    Tarantella's name for the micro-batches of a pipeline."""
    if num_pipeline_stages is not None:
        if num_micro_batches is not None:
            raise runtime.TarantellaError(
                "num_pipeline_stages and num_micro_batches were both given; they are the same "
                "setting (micro-batches per global batch): give num_micro_batches only")
        log.logger.info("num_pipeline_stages=%s taken as num_micro_batches (its meaning in "
                        "earlier Tarantella versions)", num_pipeline_stages)
        num_micro_batches = num_pipeline_stages
    return (model, parallel_strategy, num_micro_batches, num_stages, pipeline_schedule,
            zero_stage)


class _ModelType(type(keras.Model)):
    """Calling tnt.Model distributes a model (distributed()). Calling the
    class of a distributed model, as Keras does when it rebuilds a model
    of that class (clone_model), builds a model of the original class and
    distributes it."""

    def __call__(cls, *args, **kwargs):
        if cls is Model:
            try:
                arguments = _arguments(*args, **kwargs)
            except TypeError as e:
                raise TypeError(
                    f"{e}: tnt.Model takes (model, parallel_strategy=ParallelStrategy.DATA, "
                    "num_micro_batches=None, num_stages=None, pipeline_schedule=None, *, "
                    "zero_stage=0)") from None
            return distributed(*arguments)
        return distributed(cls._tnt_base(*args, **kwargs))


def distributed(model, strategy=ParallelStrategy.DATA, num_micro_batches=None,
                num_stages=None, schedule=None, zero_stage=0):
    """The one place where distributed models are made: a new model of
    `model`'s class with tnt.Model's methods in front, over `model`'s
    layers and variables (`model` itself is left as it is); see Model."""
    runtime.require_init()
    deferred = ()
    if callable(model) and not isinstance(model, (keras.Model, keras.layers.Layer)):
        model, deferred = stage_weights.build_deferred(model)
    if not isinstance(model, keras.Model):
        raise TypeError(f"tnt.Model wraps a keras.Model, or a function that returns one; got "
                        f"{type(model).__name__}")
    if not isinstance(strategy, ParallelStrategy):
        raise runtime.TarantellaError(
            f"parallel_strategy={strategy!r} is not a tnt.ParallelStrategy: use "
            "ParallelStrategy.DATA, PIPELINING or ALL")
    pipelined = ParallelStrategy.PIPELINING in strategy
    for name, value in (("num_micro_batches", num_micro_batches), ("num_stages", num_stages),
                        ("pipeline_schedule", schedule)):
        if value is not None and not pipelined:
            raise runtime.TarantellaError(
                f"{name} applies to pipelined models only: pass "
                "parallel_strategy=tnt.ParallelStrategy.PIPELINING or ALL, or drop it")
    zero_shards.check_stage(zero_stage)
    base = subclass.base_class(model)
    wrapped = internals.twin(model, subclass.mixin_class(Model, base))
    wrapped._tnt = _State()
    wrapped._tnt.zero_stage = zero_stage
    if pipelined and pipeline_stage.is_one_stage(wrapped, strategy, num_stages):
        pipelined = False
    if pipelined and zero_stage == 3:
        raise runtime.TarantellaError(
            "zero_stage=3 shards the weights of a data-parallel model; a pipelined model "
            "already holds each stage's weights on that stage's ranks only: use zero_stage=1 or "
            "2 with ParallelStrategy.ALL (the optimizer's state of each stage is then shared "
            "among its replicas), or ParallelStrategy.DATA with zero_stage=3")
    if pipelined:
        wrapped._tnt.pipeline = pipeline_stage.Pipeline(wrapped, strategy, num_micro_batches,
                                                        num_stages, deferred, schedule)
        wrapped._tnt.resources = wrapped._tnt.pipeline.resources()
    elif zero_stage == 3 and runtime.get_size() > 1:
        # Allocated a variable at a time when the optimizer takes its parts.
        wrapped._tnt.deferred = deferred
        batch_norm.synchronize(wrapped)
    else:
        stage_weights.allocate_all(deferred)
        batch_norm.synchronize(wrapped)
    if wrapped.compiled:
        # A model compiled before (or loaded compiled): distributed as
        # compile would, with the optimizer it holds.
        wrapped._tnt_compiled()
    return wrapped


# The files in which Keras keeps the optimizer's state too.
_OPTIMIZER_FILES = (".keras", ".weights.h5", ".weights.json")


def _no_options(what, kwargs, source):
    if kwargs:
        raise runtime.TarantellaError(
            f"{what}() of {source.kind} takes no {sorted(kwargs)}: it handles Keras's "
            "default layout only, piece by piece; drop them")


class Model(keras.Model, metaclass=_ModelType):
    """``tnt.Model(model, parallel_strategy=ParallelStrategy.DATA,
    num_micro_batches=None, num_stages=None, pipeline_schedule=None, *,
    zero_stage=0)``: a keras.Model that trains `model` on all ranks. `model` may also be a
    function without arguments that returns the model: Tarantella then
    builds it without allocating its weights, and a pipelined rank
    allocates its stage's weights only.
    It is a new model of `model`'s own class (a Functional, a Sequential or
    the user's subclass, with the methods below in front) over the same
    layers and weights; `model` itself stays a plain Keras model (pipelined,
    its weights of the other stages are freed on each rank). A model can be
    distributed any number of times.

    With PIPELINING or ALL, `model` (functional or Sequential) is cut at its
    SplitLayers into K stages, or by Tarantella into `num_stages` balanced
    stages; PIPELINING needs K ranks, ALL a multiple of K (replicas of the
    pipeline). `num_micro_batches` (default 2 K) splits each replica's share
    of a global batch; `pipeline_schedule` ("1f1b", "gpipe",
    "interleaved", "zb-h1", "zb-h2", "zbv"; default TNT_PIPELINE_SCHEDULE's) orders the stages'
    passes (pipeline/schedule.py). A model without cuts is one stage: under
    ALL it is trained data-parallel, under PIPELINING on one rank.

    `zero_stage` 1, 2 or 3 shards data parallelism: each rank keeps the
    optimizer's state for its part of the weights only (at 2 also its part
    of the averaged gradients, at 3 also its part of the weights), with
    stage 0's results (zero/shards.py); under ALL (stages 1 and 2), among the
    replicas of its stages."""

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A tnt.Model with the architecture in `config` (get_config()).
        `config` stays as it was: Keras's deserializers take a functional
        model's config apart, so they are given a copy."""
        config = copy.deepcopy(config)
        if cls is not Model:
            return distributed(cls._tnt_base.from_config(config, custom_objects=custom_objects))
        runtime.require_init()
        if "class_name" in config and "config" in config:
            km = keras.saving.deserialize_keras_object(config, custom_objects=custom_objects)
        elif "input_layers" in config:
            km = keras.Model.from_config(config, custom_objects=custom_objects)
        elif "layers" in config:
            km = keras.Sequential.from_config(config, custom_objects=custom_objects)
        else:
            raise runtime.TarantellaError(
                "tnt.Model.from_config was given the config of a subclassed model, which does "
                "not name the model's class: call the class's own from_config "
                "(type(model).from_config(config)), or give keras.saving."
                "serialize_keras_object(model)")
        return distributed(km)

    def __call__(self, *args, **kwargs):
        tnt_state = getattr(self, "_tnt", None)
        pipeline = tnt_state.pipeline if tnt_state is not None else None
        if pipeline is not None and not pipeline.whole.depth and \
                not internals.in_shape_inference():
            raise runtime.TarantellaError(
                f"model '{self.name}' is pipelined: each rank holds the weights of its own "
                "stage only, so the whole model cannot run on one rank; a pipeline trains "
                "through the model's own fit (its stages exchange micro-batches), evaluates "
                "with evaluate and predicts with predict: use those, or "
                "ParallelStrategy.DATA for a custom loop")
        return super().__call__(*args, **kwargs)

    # ---------------------------------------------------------------- steps

    def train_step(self, data):
        if self._tnt.pipeline is not None:
            with step.model_step(self._tnt.resources, data):
                return self._tnt.pipeline.train_step(self, data)
        with step.model_step(self._tnt.resources, data) as current:
            if zero_steps.holds_parts(self):
                return metrics.global_logs(self, zero_steps.train_step(self, data, current),
                                           current)
            # Every optimizer the model holds averages its gradients, also
            # those a train_step of the model's own applies.
            optimizers.distribute_held_by(self)
            return metrics.global_logs(self, super().train_step(data), current)

    def test_step(self, data):
        if self._tnt.pipeline is not None:
            with step.model_step(self._tnt.resources, data):
                return self._tnt.pipeline.test_step(self, data)
        with step.model_step(self._tnt.resources, data) as current:
            if zero_steps.holds_parts(self):
                logs = zero_steps.run_gathered(self, current,
                                                 lambda: super(Model, self).test_step(data))
            else:
                logs = super().test_step(data)
            return metrics.global_logs(self, logs, current)

    def predict_step(self, data):
        if self._tnt.pipeline is not None:
            with step.model_step(self._tnt.resources, data):
                return self._tnt.pipeline.predict_step(self, data)
        if zero_steps.holds_parts(self):
            with step.model_step(self._tnt.resources, data) as current:
                return zero_steps.run_gathered(self, current,
                                                 lambda: super(Model, self).predict_step(data))
        return super().predict_step(data)

    def get_metrics_result(self):
        current = step.current()
        if current is not None:
            current.metrics_global = True
        return metrics.global_results(self.metrics, super().get_metrics_result,
                                      current or step.Step(self._tnt.resources),
                                      with_local=self._tnt.with_local)

    # ---------------------------------------------------------------- compile

    def compile(self, *args, **kwargs):
        if kwargs.get("jit_compile") not in (None, False, "auto"):
            log.logger.warning("jit_compile=%r ignored: Tarantella's communication runs "
                               "outside XLA", kwargs["jit_compile"])
        super().compile(*args, **kwargs)
        self._tnt_compiled()

    def compile_from_config(self, config):
        """Compiles as `config` (get_compile_config()) says, like Keras
        does for a model whose compile is its own."""
        if subclass.base_class(self).compile is not keras.Model.compile:
            return super().compile_from_config(config)  # Keras's warning for custom compiles
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built and self._tnt.pipeline is None:
            # (a pipeline's optimizer is built for its stage, by fit or load_weights)
            self.optimizer.build(self.trainable_variables)

    def _tnt_compiled(self):
        self.jit_compile = False
        if self._tnt.zero_stage == 3 and runtime.get_size() > 1 and \
                subclass.base_class(self).train_step is not keras.Model.train_step:
            raise runtime.TarantellaError(
                f"zero_stage=3 keeps the weights in parts, which the steps of fit, evaluate "
                f"and predict gather; {subclass.base_class(self).__name__} has a train_step of "
                "its own, which would read the weights themselves: use zero_stage=2 with it (the "
                "weights whole on every rank, the gradients and the optimizer's state sharded)")
        if self._tnt.zero_stage and self._tnt.data_parallel_ranks() > 1:
            zero_shards.shard(self.optimizer, self._tnt.zero_stage, self._tnt.resources)
        else:
            optimizers.distribute(self.optimizer)
        self._tnt.broadcast_pending = True

    # ---------------------------------------------------------------- weights

    def _tnt_broadcast_weights(self):
        """Makes every rank hold the master's weights (pipelined: every
        replica of a stage those of the stage's first replica); an error
        names the ranks whose weight shapes differ from the master's."""
        self._tnt.broadcast_pending = False
        if runtime.get_size() == 1:
            return
        weights = self.weights
        signature = ";".join(f"{w.dtype}{tuple(w.shape)}" for w in weights).encode()
        digest = int(np.frombuffer(hashlib.sha256(signature).digest()[:8], dtype=np.int64)[0])
        differ = runtime.disagreements({"weights": digest}).get("weights")
        if differ:
            differ = sorted(differ[1])
            raise runtime.TarantellaError(
                f"ranks {differ} have models whose weight shapes differ from the master rank's; "
                "every rank must build the same model")
        if self._tnt.pipeline is not None:
            self._tnt.pipeline.broadcast_stage()
        else:  # (at zero_stage=3 the weights in parts are not the model's)
            runtime.broadcast_values([w for w in weights if internals.is_allocated(w)])

    def _tnt_prepare(self, dataset):
        """Builds the model if needed, broadcasts the weights once, and
        averages the moving statistics of BatchNormalization."""
        if not self.built and not self.weights and dataset is not None:
            # Built by a first call, so that there are weights to broadcast
            # (a model whose train_step is its own may have built parts only).
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data.example_batch(dataset))
            self(x)
        if self._tnt.broadcast_pending:
            self._tnt_broadcast_weights()
        self._tnt_hold()
        if self._tnt.pipeline is None:
            batch_norm.average_moving_statistics(self)
        else:
            self._tnt.pipeline.build_state(self, dataset)

    def _tnt_hold(self):
        """At zero_stage=3 on several ranks, makes the optimizer's parts
        hold the trainable weights (building the optimizer, whose Shards.hold
        takes them) and allocates what a build function left unallocated;
        a model not compiled keeps its weights whole. Collective."""
        if self._tnt.zero_stage != 3 or not self.built:
            return
        if zero_checkpoint.sharded(self) and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        if self._tnt.deferred:
            held = {id(v) for v in self.optimizer._tnt_shards.variables} \
                if zero_steps.holds_parts(self) else set()
            rest = [v for v in self._tnt.deferred if id(v) not in held]
            stage_weights.allocate_all(rest)
            runtime.broadcast_values(rest)
            self._tnt.deferred = ()

    def get_weights(self):
        """The weights of the whole model (collective when pipelined or at
        zero_stage=3: every rank gathers the stages or the parts, holding the
        whole model's weights as the NumPy arrays it returns)."""
        self._tnt_hold()
        if zero_steps.holds_parts(self):
            return zero_checkpoint.get_weights(self)
        if self._tnt.pipeline is not None:
            with self._tnt.pipeline.whole():
                return super().get_weights()
        return super().get_weights()

    def set_weights(self, weights):
        """Sets the weights on every rank to the master's `weights`
        (collective: call it on every rank; pipelined, every rank keeps its
        stage's part; at zero_stage=3, its part of every weight)."""
        self._tnt_hold()
        if zero_steps.holds_parts(self):
            if len(weights) != len(self.weights) or any(
                    tuple(np.shape(w)) != tuple(v.shape) for w, v in zip(weights, self.weights)):
                raise ValueError(
                    f"set_weights was given {len(weights)} arrays of shapes "
                    f"{[tuple(np.shape(w)) for w in weights]}; the model's weights are "
                    f"{[tuple(v.shape) for v in self.weights]}")
            zero_checkpoint.set_weights(self, weights)
            return
        if self._tnt.pipeline is not None:
            with self._tnt.pipeline.whole(fill=False):
                super().set_weights(weights)
                if runtime.get_size() > 1:
                    runtime.broadcast_values(self.weights)
            return
        super().set_weights(weights)
        self._tnt_broadcast_weights()

    def load_weights(self, filepath, *args, **kwargs):
        """Loads weights on every rank; the master's are broadcast before the
        next fit, evaluate or predict. Pipelined, each rank reads the values
        of its stage (and its optimizer's state) only, from a .weights.h5,
        .weights.json (sharded) or .keras file that it can read."""
        path = os.fspath(filepath)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file; give the path that save_weights() "
                                    "wrote")
        try:
            # (a legacy .h5 file holds the weights only, which Keras reads)
            source = self._tnt_source() if self._tnt.pipeline is not None or \
                path.endswith(_OPTIMIZER_FILES) else None
            if source is None and zero_steps.holds_parts(self):
                raise runtime.TarantellaError(
                    f"{path}: at zero_stage=3 the weights are read into the ranks' parts from "
                    "a .keras, .weights.h5 or .weights.json file; this one is of the legacy "
                    "HDF5 format, which Keras reads into the variables themselves: convert it "
                    "(load it into a plain Keras model and save_weights('x.weights.h5'))")
            if source is not None:
                # Each rank reads its own values (of its stage, or its parts) only.
                _no_options("load_weights",  # Keras's (filepath, skip_mismatch, ...)
                            dict(kwargs, **({"skip_mismatch": args[0]} if args else {})), source)
                result = checkpoint.load(source, path)
            else:
                result = super().load_weights(filepath, *args, **kwargs)
        except (OSError, ValueError) as e:
            raise runtime.TarantellaError(
                f"{path}: cannot load weights from it ({e}); give a file that save_weights() "
                "wrote for this model") from e
        self._tnt.broadcast_pending = True
        return result

    def _tnt_source(self, saving_with=None):
        """Where the values of this model's files are (pipeline/checkpoint.py)
        when this rank does not hold them all whole: a pipeline's stages, or
        the parts of a sharded optimizer's state (to load into, or once it
        has a state to save); else None. `saving_with` names the save
        (save, save_weights); one from this rank alone (a master-only
        callback's) writes what this rank holds: None."""
        if saving_with is not None and self._tnt.saves_of_this_rank:
            zero_checkpoint.check_together(self, saving_with)
            return None
        self._tnt_hold()  # (zero_stage=3: the file's weights go to the parts)
        if self._tnt.pipeline is not None:
            if zero_checkpoint.sharded(self):
                return zero_checkpoint.StageParts(self, self._tnt.pipeline)
            return checkpoint.Stages(self, self._tnt.pipeline)
        if zero_checkpoint.writes_parts(self) if saving_with else zero_checkpoint.sharded(self):
            return zero_checkpoint.Parts(self)
        return None

    def _tnt_plain(self):
        """The model and its optimizer with their original classes, for
        writers that record them."""
        return subclass.original_classes(
            [self, getattr(self, "optimizer", None)] + batch_norm.layers(self))

    def save(self, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
        """Saves the whole model from the master rank (every rank with
        tnt_save_all_devices=True), atomically, as a file that plain Keras
        loads; collective. Pipelined, or with a sharded optimizer state
        (zero_stage), the master writes a .keras file from the stages'
        values or the state's parts, streamed to it (pipeline/checkpoint.py,
        zero/checkpoint.py)."""
        source = self._tnt_source("save")
        if source is not None:
            _no_options("save", kwargs, source)
            if self._tnt.pipeline is None:
                batch_norm.average_moving_statistics(self)
            return checkpoint.save(self, source, filepath, overwrite, tnt_save_all_devices)
        keras_save = subclass.base_class(self).save

        def write(path):
            with self._tnt_plain():
                keras_save(self, path, overwrite=True, **kwargs)
        self._tnt_write(filepath, overwrite, tnt_save_all_devices, write)

    def save_weights(self, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
        """Saves the weights from the master rank (every rank with
        tnt_save_all_devices=True), atomically; collective. Pipelined, the
        master writes the stages' values, streamed to it: a .weights.h5
        file, or with a .weights.json path Keras's sharded format with one
        shard per stage (max_shard_size does not apply); with a sharded
        optimizer state (zero_stage), likewise from the state's parts, the
        .weights.json format in one shard."""
        source = self._tnt_source("save_weights")
        if source is not None:
            kwargs.pop("max_shard_size", None)
            _no_options("save_weights", kwargs, source)
            if self._tnt.pipeline is None:
                batch_norm.average_moving_statistics(self)
            return checkpoint.save_weights(self, source, filepath, overwrite,
                                           tnt_save_all_devices)
        keras_save_weights = subclass.base_class(self).save_weights
        self._tnt_write(filepath, overwrite, tnt_save_all_devices,
                        lambda path: keras_save_weights(self, path, overwrite=True, **kwargs))

    def _tnt_write(self, filepath, overwrite, all_devices, write):
        if self._tnt.saves_of_this_rank:
            if not overwrite and os.path.exists(filepath):
                raise runtime.TarantellaError(f"{filepath} exists and overwrite=False: remove "
                                              "it or pass overwrite=True")
            saving.write_atomically(filepath, write)
            return
        batch_norm.average_moving_statistics(self)
        saving.write_on_master(filepath, overwrite, all_devices, write)

    @contextlib.contextmanager
    def _tnt_saves_of_this_rank(self):
        """Within it, save and save_weights write from this rank alone,
        without the other ranks (for callbacks that run on the master only)."""
        before = self._tnt.saves_of_this_rank
        self._tnt.saves_of_this_rank = True
        try:
            yield
        finally:
            self._tnt.saves_of_this_rank = before

    def to_yaml(self, **kwargs):
        raise runtime.TarantellaError(
            "to_yaml() is gone from Keras 3: use model.to_json() and "
            "tnt.models.model_from_json(), or model.get_config()")

    # ---------------------------------------------------------------- data

    def _tnt_verbose(self, verbose):
        if runtime.is_master_rank() or runtime.output_on_all_devices():
            return verbose
        return 0

    def _tnt_dataset(self, x, y, sample_weight, batch_size, micro_batch_size, distribute,
                     shuffle, what):
        """The (distributed) dataset for `x` as fit/evaluate accept it."""
        if isinstance(x, tf.data.Dataset):
            if batch_size is not None:
                raise runtime.TarantellaError(
                    f"batch_size={batch_size} was given together with a tf.data.Dataset for "
                    f"{what}: batch the dataset itself (with the global batch size) and drop "
                    "batch_size, or the data would be batched twice")
            if y is not None:
                raise runtime.TarantellaError(
                    f"y was given together with a tf.data.Dataset for {what}; a dataset "
                    "yields (x, y) pairs itself")
            ds = x
        elif x is None:
            return None
        elif data.is_array_like(x):
            if micro_batch_size is not None and batch_size is None:
                parts = self._tnt_replicas()
                batch_size = micro_batch_size * (parts[1] if parts else runtime.get_size())
            ds = data.from_arrays(x, y, sample_weight, batch_size, shuffle)
        else:
            raise runtime.TarantellaError(
                f"unsupported {what} input of type {type(x).__name__}: pass a tf.data.Dataset "
                "or NumPy arrays")
        if not distribute:
            log.logger.info("%s dataset is not distributed (tnt_distribute_dataset=False): "
                            "every rank trains on all of it", what)
            return ds
        if data.is_array_like(x):
            micro_batch_size = None  # already batched with the global batch
        ds = data.distribute(ds, micro_batch_size, what, self._tnt_replicas())
        info = data.batch_info(ds)
        if info.size is not None and what == "training" and self._tnt.pipeline is None:
            batch_norm.warn_small_micro_batches(
                self, min(data.micro_batch_sizes(info.size, runtime.get_size())), what)
        if self._tnt.pipeline is not None and what == "training":
            self._tnt.pipeline.describe(info.size)
        return ds

    def _tnt_replicas(self):
        """For a pipelined model, (this rank's replica, the number of
        replicas): a global batch is split among the replicas of the
        pipeline; None when it is split among all ranks."""
        if self._tnt.pipeline is None:
            return None
        layout = self._tnt.pipeline.layout
        return layout.replica, layout.num_replicas

    # ---------------------------------------------------------------- Keras API

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, sample_weight=None,
            validation_batch_size=None, tnt_micro_batch_size=None,
            tnt_validation_micro_batch_size=None, tnt_distribute_dataset=True,
            tnt_distribute_validation_dataset=True, **kwargs):
        if not self.compiled:
            raise runtime.TarantellaError("fit() was called before compile(): compile the "
                                          "model first")
        if validation_split and data.is_array_like(x) and not isinstance(x, tf.data.Dataset):
            arrays = tuple(a for a in (x, y, sample_weight) if a is not None)
            train, val = data.split_arrays(arrays, validation_split)
            x, y, sample_weight = (list(train) + [None, None])[:3]
            validation_data = tuple(val)
        elif validation_split:
            raise runtime.TarantellaError("validation_split works with NumPy inputs only; "
                                          "pass validation_data for datasets")
        train = self._tnt_dataset(x, y, sample_weight, batch_size, tnt_micro_batch_size,
                                  tnt_distribute_dataset, shuffle, "training")
        val = None
        if validation_data is not None:
            if isinstance(validation_data, tf.data.Dataset):
                vx, vy, vw = validation_data, None, None
            else:
                vx, vy, vw = (tuple(validation_data) + (None, None))[:3]
            vbs = validation_batch_size if validation_batch_size is not None else (
                None if isinstance(vx, tf.data.Dataset) else batch_size)
            val = self._tnt_dataset(vx, vy, vw, vbs, tnt_validation_micro_batch_size,
                                    tnt_distribute_validation_dataset, False, "validation")
        runtime.check_agreement("fit()", {
            "the number of epochs": epochs,
            "initial_epoch": kwargs.get("initial_epoch", 0),
            "the number of steps per epoch": _steps(train, kwargs.get("steps_per_epoch")),
            "the number of validation steps": _steps(val, kwargs.get("validation_steps")),
            "validation_freq": kwargs.get("validation_freq", 1)})
        self._tnt_prepare(train)
        cbs, verbose = self._tnt_callbacks(callbacks, verbose)
        cbs = timeline.with_step_spans(cbs)  # TNT_TIMELINE: mark the training steps
        # One iterator across the epochs; BackupAndRestore's data position.
        train, steps, epochs_read = position.track_training_data(
            self, train, kwargs.pop("steps_per_epoch", None))
        if epochs_read is not None:
            cbs.insert(0, epochs_read)
        # Shuffling is the dataset's business (arrays were shuffled above).
        history = super().fit(train, epochs=epochs, verbose=verbose, callbacks=cbs,
                              validation_data=val, shuffle=False, steps_per_epoch=steps,
                              **kwargs)
        if self._tnt.pipeline is None:
            batch_norm.average_moving_statistics(self)
        history.history = {k: v for k, v in history.history.items()
                           if not k.startswith(tnt_callbacks.LOCAL_PREFIX)}
        return history

    def _tnt_callbacks(self, callbacks, verbose):
        """This rank's callbacks, and the verbosity to give Keras. When a
        callback asks for this rank's own logs, the steps also return local
        metrics, and the progress bar is one that hides them."""
        cbs = tnt_callbacks.distribute(callbacks, collective_saves=(
            self._tnt.pipeline is not None or zero_checkpoint.sharded(self)))
        if self._tnt.pipeline is None:
            averaging = batch_norm.averaging_callback(self, list(callbacks or []))
            if averaging is not None:
                cbs.insert(0, averaging)
        with_local = tnt_callbacks.wants_local_logs(cbs)
        if with_local != self._tnt.with_local:
            self._tnt.with_local = with_local
            self.train_function = None  # rebuilt with the new results
            self.test_function = None
        verbose = self._tnt_verbose(verbose)
        if with_local and verbose != 0:
            cbs = tnt_callbacks.without_local_logs_in_progress_bars(cbs)
            verbose = 0
        return cbs, verbose

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 tnt_micro_batch_size=None, tnt_distribute_dataset=True, **kwargs):
        if kwargs.get(internals.FIT_VALIDATION_KEYWORD):
            # fit's validation: the validation data were distributed by fit.
            return super().evaluate(x, y, batch_size=batch_size, verbose=verbose,
                                    sample_weight=sample_weight, **kwargs)
        ds = self._tnt_dataset(x, y, sample_weight, batch_size, tnt_micro_batch_size,
                               tnt_distribute_dataset, False, "evaluation")
        runtime.check_agreement("evaluate()", {
            "the number of steps": _steps(ds, kwargs.get("steps"))})
        self._tnt_prepare(ds)
        return super().evaluate(ds, verbose=self._tnt_verbose(verbose), **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", tnt_micro_batch_size=None,
                tnt_distribute_dataset=True, **kwargs):
        """Predictions for every sample of `x`, in order, on every rank; each
        rank computes its micro-batches (pipelined: each replica, through
        its stages, without gathering the model's weights) and the results
        are gathered."""
        size = runtime.get_size()
        if isinstance(x, tf.data.Dataset):
            if batch_size is not None:
                raise runtime.TarantellaError(
                    f"batch_size={batch_size} was given together with a tf.data.Dataset for "
                    "prediction: batch the dataset itself and drop batch_size")
            ds = x
        elif data.is_array_like(x):
            if batch_size is None:
                batch_size = tnt_micro_batch_size * size if tnt_micro_batch_size else 32
            ds = data.from_arrays(x, batch_size=batch_size)
        else:
            raise runtime.TarantellaError(
                f"unsupported prediction input of type {type(x).__name__}: pass a "
                "tf.data.Dataset or NumPy arrays")
        parts = self._tnt_replicas()
        if tnt_micro_batch_size is not None and isinstance(x, tf.data.Dataset):
            ds = data.distribute(ds, tnt_micro_batch_size, "prediction", parts)
            micro_done = True
        else:
            micro_done = False
        info = data.batch_info(ds)
        data.require_batched(info, "prediction")
        verbose = self._tnt_verbose(verbose)
        pipeline = self._tnt.pipeline
        if size == 1 or not tnt_distribute_dataset or info.size is None:
            if size > 1 and tnt_distribute_dataset:
                log.logger.info("prediction: the dataset's batch size is unknown; every %s "
                                "predicts all of it", "replica" if pipeline else "rank")
            if size == 1 and tnt_distribute_dataset and info.size is not None and not micro_done:
                # Random maps draw as they do on any number of ranks.
                ds = data.distribute(ds, None, "prediction")
            self._tnt_prepare(None)
            local = super().predict(ds, verbose=verbose, **kwargs)
            if pipeline is None:
                return local
            # Every replica predicted all of it: the first one's last stage
            # gives every rank its rows.
            return data.gather_batches(local, None, pipeline.predicting_ranks()[:1])
        dist = ds if micro_done else data.distribute(ds, None, "prediction", parts)
        self._tnt_prepare(dist)
        local = super().predict(dist, verbose=verbose, **kwargs)
        return data.gather_batches(local, info.size,
                                   pipeline.predicting_ranks() if pipeline else None)

    def summary(self, *args, **kwargs):
        if runtime.is_master_rank() or runtime.output_on_all_devices():
            return super().summary(*args, **kwargs)
        return None


class _SequentialType(_ModelType):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Model) and isinstance(obj, keras.Sequential)


class Sequential(Model, metaclass=_SequentialType):
    """``tnt.Sequential(layers=None, name=None, trainable=True)``: a
    keras.Sequential model, distributed (data parallelism) as tnt.Model
    does; ``tnt.Sequential.from_config(config)`` likewise."""

    _tnt_base = keras.Sequential
