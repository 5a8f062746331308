"""Every private Keras (and TensorFlow graph) attribute Tarantella relies
on, in one place (tf.data's: data/_tf_data_internals.py).

Keras offers no public hook for these; each use says why it is needed.
``verify()`` checks that all of them still exist and fails naming the Keras
version when one has changed (tnt.init() runs it, and so does
tests/python/test_keras_native.py::
test_keras_internals_exist_and_a_missing_one_names_the_version).
"""
import keras
import tensorflow as tf

# (what, owner, attribute): the internals below.
_USED = (
    # BatchNormalization computes its batch statistics in _moments; with
    # synchronized=True Keras reduces them through tf.distribute, which does
    # nothing outside a tf.distribute strategy. Tarantella's synchronized
    # layers override it (SynchronizedMoments).
    ("BatchNormalization._moments", keras.layers.BatchNormalization, "_moments"),
    # The axes _moments reduces over (all but the feature axis).
    ("BatchNormalization._reduction_axes", None, "_reduction_axes"),
    # An optimizer clips its gradients in _clip_gradients, after a
    # LossScaleOptimizer has unscaled them; a ZeRO optimizer's norms come
    # from every rank's parts (zero.ShardedClipping overrides it).
    ("Optimizer._clip_gradients", keras.optimizers.Optimizer, "_clip_gradients"),
    # Every layer of a model, nested ones included; Model.layers lists only
    # the top level.
    ("Layer._flatten_layers", keras.layers.Layer, "_flatten_layers"),
    # BackupAndRestore has no public way to change where and how it writes
    # its backup; Tarantella writes it from the master only and atomically
    # (backup/callback.py), through these (BackupAndRestoreHooks).
    ("BackupAndRestore._load_model", keras.callbacks.BackupAndRestore, "_load_model"),
    ("BackupAndRestore._save_model", keras.callbacks.BackupAndRestore, "_save_model"),
    ("BackupAndRestore._training_metadata_path", "backup", "_training_metadata_path"),
    ("BackupAndRestore._current_epoch", "backup", "_current_epoch"),
    ("BackupAndRestore._last_batch_seen", "backup", "_last_batch_seen"),
    # A fit resumed in mid-epoch counts the batches to its next backup from
    # the restored one, as the interrupted fit did (BackupAndRestoreHooks.resume_at).
    ("BackupAndRestore._batches_seen_since_last_saving", "backup",
     "_batches_seen_since_last_saving"),
    # Where fit starts when a backup is restored.
    ("Model._initial_epoch", "model", "_initial_epoch"),
    # A pipelined step computes the loss and the metrics on the last stage,
    # one micro-batch at a time, from outputs that the model's own call did
    # not produce; Keras's train_step reaches them through these, and
    # compute_loss would add every stage's regularization losses.
    ("Trainer._compile_loss", "compiled", "_compile_loss"),
    ("Trainer._compile_metrics", "compiled", "_compile_metrics"),
    ("Trainer._loss_tracker", "compiled", "_loss_tracker"),
    # tnt.Model(m) is a second model over m's layers and variables (twin()):
    # a copy of m's attributes with a tracker of its own, so that what the
    # distributed model tracks later (its optimizer, metrics) stays out of m.
    ("Layer._tracker", "model", "_tracker"),
    ("Layer._initialize_tracker", "model", "_initialize_tracker"),
    ("Tracker.config", "tracker", "config"),
    ("Tracker.add_to_store", "tracker", "add_to_store"),
    ("Tracker.locked", "tracker", "locked"),
    ("Tracker._lock_violation_msg", "tracker", "_lock_violation_msg"),
    # A pipeline stage holds only its own weights (pipeline/weights.py):
    # a variable made inside StatelessScope(initialize_variables=False) has
    # no value (_value None) and its initializer (_initializer) waits in a
    # list of pending variables until _deferred_initialize allocates it.
    # Keras has no public way to allocate one variable, to leave one out of
    # the pending list, or to free a variable's value.
    ("Variable._value", "variable", "_value"),
    ("Variable._initializer", "variable", "_initializer"),
    ("Variable._deferred_initialize", "variable", "_deferred_initialize"),
    # A layer that a model calls more than once (a Sequential built from a
    # config calls its layers again at each add) has the output of its first
    # call as layer.output; the stages of a pipeline need the one in the
    # model's own graph, which Keras keeps only in these.
    ("Function._nodes_by_depth", "functional", "_nodes_by_depth"),
    ("Node.output_tensors", "node", "output_tensors"),
    # A pipeline stage's SGD updates a variable and its momentum in one
    # fused kernel (pipeline/in_place.py); which momentum is the
    # variable's, Keras's update_step finds through this alone.
    ("Optimizer._get_variable_index", keras.optimizers.SGD, "_get_variable_index"),
    # A pipeline stage's Adam runs Keras's update of a variable and its
    # moments one part after the other (pipeline/in_place.py); Keras keeps the
    # moments only in these.
    ("Adam._momentums", "adam", "_momentums"),
    ("Adam._velocities", "adam", "_velocities"),
    # A zero-bubble schedule holds a stage's weight-gradient ops (W) back
    # until their place in the schedule; B's gradient made them, so
    # tf.control_dependencies, which applies to ops as they are made,
    # cannot (hold_back).
    ("Operation._add_control_inputs", tf.Operation, "_add_control_inputs"),
    # At ZeRO stage 3 the backward pass reads a layer's weights from a
    # second gather, so that the forward pass's copy is freed after the
    # forward pass; the tape made the backward ops on the first copy
    # (rewire).
    ("Operation._update_input", tf.Operation, "_update_input"),
)


def hold_back(roots, after):
    """Makes the graph ops `roots` wait for `after` (tensors or ops)."""
    ops = [t if isinstance(t, tf.Operation) else t.op for t in after]
    if ops:
        for op in roots:
            op._add_control_inputs(ops)


def rewire(op, index, tensor):
    """Makes the graph op `op` read `tensor` as its input `index`."""
    op._update_input(index, tensor)


# The keyword with which Keras's fit calls evaluate for validation, on data
# that fit prepared itself (tnt.Model.evaluate must not distribute it again).
FIT_VALIDATION_KEYWORD = "_use_cached_eval_dataset"


def verify():
    """Raises RuntimeError naming the Keras version and the internal when
    one of the internals Tarantella relies on is missing."""
    bn = keras.layers.BatchNormalization()
    bn.build((None, 2))
    instances = {None: bn, "backup": keras.callbacks.BackupAndRestore("unused"),
                 "model": keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])}
    instances["tracker"] = instances["model"]._tracker
    functional_input = keras.Input((1,))
    instances["functional"] = keras.Model(functional_input,
                                          keras.layers.Dense(1)(functional_input))
    instances["node"] = instances["functional"].layers[-1]._inbound_nodes[0]
    if set(instances["tracker"].config) != set(_TRACKED):
        _missing(f"the tracker's lists {_TRACKED}")
    fresh = keras.layers.Dense(1)
    for name in _OWN_WRAPPERS:
        if name not in vars(fresh):
            _missing(f"Layer.__new__'s per-instance {name} wrapper")
    from keras.src.saving import object_registration
    if not isinstance(getattr(object_registration, "GLOBAL_CUSTOM_NAMES", None), dict):
        _missing("object_registration.GLOBAL_CUSTOM_NAMES")
    instances["variable"] = keras.Variable(keras.initializers.Zeros(), shape=(1,))
    instances["adam"] = keras.optimizers.Adam()
    instances["adam"].build([keras.Variable(keras.initializers.Zeros(), shape=(1,))])
    from keras.src.backend.common import global_state
    from keras.src.backend.common import symbolic_scope
    if not callable(getattr(symbolic_scope, "in_symbolic_scope", None)):
        _missing("symbolic_scope.in_symbolic_scope")
    if not callable(getattr(global_state, "get_global_attribute", None)):
        _missing("global_state.get_global_attribute")
    instances["compiled"] = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    instances["compiled"].compile(optimizer="sgd", loss="mse", metrics=["mae"])
    for what, owner, attribute in _USED:
        target = instances[owner] if owner in instances else owner
        if not hasattr(target, attribute):
            _missing(what)
    import inspect
    from keras.src.backend.tensorflow import trainer  # to read fit's source only
    from keras.src.random import seed_generator
    if not hasattr(seed_generator, "GLOBAL_SEED_GENERATOR"):
        _missing("seed_generator.GLOBAL_SEED_GENERATOR")
    if FIT_VALIDATION_KEYWORD not in inspect.getsource(trainer.TensorFlowTrainer.fit):
        _missing(f"fit's {FIT_VALIDATION_KEYWORD}= keyword of evaluate")


def _missing(what):
    raise RuntimeError(
        f"Tarantella relies on the Keras internal {what}, which Keras {keras.__version__} does "
        "not have; use the Keras version Tarantella was tested with (3.15) or update "
        "tarantella/_keras_internals.py")


# The tracker's lists; each is also the layer attribute "_" + its name,
# except where a class keeps a list of its own under that name (Sequential's
# _layers), which the twin shares.
_TRACKED = ("trainable_variables", "non_trainable_variables", "layers", "metrics",
            "seed_generators")
# Methods that Layer.__new__ wraps per instance, in closures over that instance.
_OWN_WRAPPERS = ("build", "quantize")


def _tracked_list(layer, name):
    return layer._tracker.config[name][1]


def twin(model, cls):
    """A new instance of `cls` (a subclass of type(model)) that shares
    `model`'s layers, variables and every other attribute, but tracks on
    its own: what is set on the twin later (an optimizer, compiled metrics)
    does not reach `model`. Keras has no public way to make a second model
    over the same layers that keeps the model's own class (a subclassed
    model's call() reads its attributes)."""
    new = cls.__new__(cls)  # Layer.__new__: the build wrapper of `new` itself
    own = {name: vars(new)[name] for name in _OWN_WRAPPERS}
    state = dict(vars(model))
    old = state.pop("_tracker")
    vars(new).update(state)
    new._initialize_tracker()
    for name in _TRACKED:
        for value in _tracked_list(model, name):
            new._tracker.add_to_store(name, value)
        own_list = state.get("_" + name)
        if own_list is not None and own_list is not _tracked_list(model, name):
            vars(new)["_" + name] = own_list  # the class's own list, shared
    if old.locked:
        new._tracker.lock(old._lock_violation_msg)
    vars(new).update(own)
    return new


def serialize_as(cls, base):
    """Makes Keras serialize instances of `cls` (a subclass of `base` that
    carries its name) under the name registered for `base`
    (register_keras_serializable), so that they load as `base`. Keras maps
    classes to registered names in a dict that has no public setter."""
    from keras.src.saving import object_registration
    name = keras.saving.get_registered_name(base)
    if name != base.__name__:
        object_registration.GLOBAL_CUSTOM_NAMES[cls] = name


def compiled_loss(model, y, y_pred, sample_weight):
    """The loss that compile() set up, without the regularization losses,
    and each output's unweighted loss (models of several outputs; [] for
    one). Keras's loss also adds each output's loss to a Mean metric of its
    own; those metrics are left as they were: a pipeline computes the loss
    one micro-batch at a time, and adds the step's loss of each output
    once (count_output_losses), as Keras adds a batch's."""
    loss = compile_loss(model)
    if not loss:
        return None, []
    before = [[keras.ops.copy(v.value) for v in metric.variables] for metric in loss.metrics]
    value = loss(y, y_pred, sample_weight)
    parts = []
    for metric, old in zip(loss.metrics, before):
        total, count = metric.variables  # a Mean: the sum of the values and of their weights
        parts.append(keras.ops.cast((total.value - old[0]) / (count.value - old[1]), "float32"))
        for v, b in zip(metric.variables, old):
            v.assign(b)  # after the reads: the traced step orders a variable's uses
    return value, parts


def count_output_losses(model, values, weight):
    """Adds `values`, each output's loss of a step, to the output's loss
    metric with `weight`, as Keras's loss does with a batch's."""
    for metric, value in zip(compile_loss(model).metrics, values):
        metric.update_state(value, sample_weight=weight)


def compile_loss(model):
    """The loss that compile() set up (a Keras loss container), or None."""
    return model._compile_loss


def compile_metrics(model):
    """The metrics that compile() set up (a Keras metric container), or None."""
    return model._compile_metrics


def loss_tracker(model):
    """The Mean metric behind the "loss" that fit and evaluate show."""
    return model._loss_tracker


def global_seed_generator():
    """The SeedGenerator behind keras.random calls without a seed, or None
    when none was made (asking Keras for it would make one, drawing from
    Python's random module)."""
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    return global_state.get_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR)


def pending_variables():
    """The variables made inside StatelessScope(initialize_variables=False)
    that Keras allocates when the next top-level StatelessScope ends (a
    list that Keras keeps among its global attributes; changing it changes
    what Keras allocates)."""
    from keras.src.backend.common import global_state
    return global_state.get_global_attribute("uninitialized_variables", [],
                                             set_to_default=True)


def is_allocated(variable):
    """True when `variable` holds a value."""
    return variable._value is not None


def allocate(variable, initializer=None):
    """Gives an unallocated `variable` its value: its own initializer's draw
    (the draw of a normal build with the same seed), or `initializer`'s."""
    if initializer is not None:
        variable._initializer = initializer
    variable._deferred_initialize()


def initializer(variable):
    """The initializer that allocates an unallocated `variable`."""
    return variable._initializer


def unallocate(variable, guard):
    """Drops `variable`'s value; `guard(shape, dtype)` answers any later
    read of it (Variable.value calls the initializer of a variable without a
    value)."""
    variable._value = None
    variable._initializer = guard


def in_shape_inference():
    """True while Keras infers shapes symbolically (compute_output_spec),
    where an unallocated variable may stand for its value."""
    from keras.src.backend.common import symbolic_scope
    return symbolic_scope.in_symbolic_scope()


def output_in_graph(functional, layer):
    """The output of `layer` where the graph of `functional` calls it
    (layer.output is that of its first call, maybe in another graph)."""
    for nodes in functional._nodes_by_depth.values():
        for node in nodes:
            if node.operation is layer:
                outputs = node.output_tensors
                return outputs[0] if len(outputs) == 1 else outputs
    return layer.output


def seed_generators(layer):
    """The SeedGenerators that `layer` itself draws random numbers from
    (Dropout's, a random augmentation's); Keras keeps them in its tracker
    only."""
    return list(_tracked_list(layer, "seed_generators"))


def flatten_layers(model):
    """Every layer inside `model`, nested ones included (not `model` itself)."""
    return list(model._flatten_layers(include_self=False, recursive=True))


class SynchronizedMoments:
    """Placed in front of a BatchNormalization class: in a tnt.Model's
    training step, batch statistics come from `moments_hook(layer, inputs,
    axes)` when it returns something other than None."""

    moments_hook = None  # set by tarantella.batch_norm

    def _moments(self, inputs, mask):
        if mask is None and SynchronizedMoments.moments_hook is not None:
            moments = SynchronizedMoments.moments_hook(self, inputs, self._reduction_axes)
            if moments is not None:
                return moments
        return super()._moments(inputs, mask)


class BackupAndRestoreHooks(keras.callbacks.BackupAndRestore):
    """A keras.callbacks.BackupAndRestore whose subclass writes and restores
    the backup itself (save_backup, load_backup), where Keras's on_train_begin,
    on_epoch_end and on_train_batch_end would call Keras's own, and reads and
    sets Keras's count of epochs and batches through the methods below."""

    def _load_model(self):
        self.load_backup()

    def _save_model(self):
        self.save_backup()

    def keras_load(self):
        """Keras's own restore, of a backup that Keras wrote."""
        super()._load_model()

    @property
    def metadata_path(self):
        return self._training_metadata_path

    @property
    def epoch(self):
        return self._current_epoch

    @property
    def batch(self):
        return self._last_batch_seen

    def batches_done(self):
        """Batches of the epoch in progress trained on when a backup is
        taken: all those up to the last one seen for a backup after a
        batch; none for a backup at the end of an epoch (which the epoch
        count then includes)."""
        return 0 if self.save_freq == "epoch" else self._last_batch_seen + 1

    def resume_at(self, epoch, batches_done):
        """Counts epochs and batches from a restored backup, as the fit that
        took it did (Keras's own restore leaves the count of epochs at 0
        until the first epoch ends)."""
        self._current_epoch = epoch
        self._last_batch_seen = max(batches_done - 1, 0)
        self._batches_seen_since_last_saving = 0

    def set_initial_epoch(self, epoch):
        self.model._initial_epoch = epoch


# A pipelined model is saved stage by stage in Keras's own weights layout.
# Keras decides that layout (which group of the file holds which variable,
# under which key) by walking the model into a store (saving_lib._save_state
# into an H5IOStore); it has no public way to learn the layout without
# writing every value. saved_layout() runs the same walk into a store that
# records instead of writing.

def saved_layout(saveable, inner_path="", skip=()):
    """Keras's weights layout of `saveable` (a model, or an optimizer at
    `inner_path`), leaving out the objects in `skip`: a list of (path, metadata,
    saveable, entries), one per group that Keras writes, in its order, where
    entries are the (key, value) pairs the saveable stores: a layer's
    variables themselves (nothing is read), an optimizer's values read from
    its variables (optimizer.variables[int(key)] is the variable)."""
    import sys
    from keras.src.saving import saving_lib

    class Recorder(saving_lib.H5IOStore):
        def __init__(self):  # no file: the walk's calls are recorded
            self.mode = "w"
            self.groups = []

        def __bool__(self):
            return True

        def make(self, path, metadata=None):
            # _save_state calls make() right before saveable.save_own_variables.
            saveable = sys._getframe(1).f_locals.get("saveable")
            self.groups.append((path, metadata, saveable, []))
            return self

        def __setitem__(self, key, value):
            self.groups[-1][3].append((key, value))

        def close(self):
            pass

    recorder = Recorder()
    saving_lib._save_state(saveable, weights_store=recorder, assets_store=None,
                           inner_path=inner_path, visited_saveables={id(o) for o in skip})
    return recorder.groups


def save_assets(model, archive):
    """Writes the assets of `model`'s layers (vocabularies, ...) into the
    zip `archive` as keras.saving.save_model does (its walk with no weights
    store)."""
    from keras.src.saving import saving_lib
    store = saving_lib.DiskIOStore("assets", archive=archive, mode="w")
    try:
        saving_lib._save_state(model, weights_store=None, assets_store=store, inner_path="",
                               visited_saveables=set())
    finally:
        store.close()


def optimizer_variable_index(optimizer, variable):
    """The index of `variable` among the variables `optimizer` was built
    for: its slots' index in lists such as SGD's momentums."""
    return optimizer._get_variable_index(variable)


def adam_slots(optimizer, variable):
    """The first and second moments (Keras variables) of `variable` in a
    built keras.optimizers.Adam."""
    index = optimizer_variable_index(optimizer, variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def model_file_json(model):
    """The config.json and metadata.json that keras.saving.save_model puts
    into a .keras file for `model` (JSON strings)."""
    from keras.src.saving import saving_lib
    return saving_lib._serialize_model_as_json(model)


def optimizer_layout(like, variables):
    """Which model variable each variable of an optimizer holds state for:
    for an optimizer of the class and config of the optimizer `like`, built
    over `variables`, one item per optimizer variable, in the order of
    optimizer.variables (the order of its files): (i, k) for the k-th
    variable it makes for variables[i], or (None, q) for the q-th of those
    it holds for no variable (iterations, learning rate). Keras has no
    public map; optimizers name what they make for a variable after its
    path (add_variable_from_reference) or its name (Adafactor), so the
    optimizer is built once over stand-ins of the same ranks and dtypes,
    named "tntref<i>x", with one element each. Returns (that optimizer,
    the list)."""
    import re

    import numpy as np
    stand_ins = []
    for i, v in enumerate(variables):
        s = keras.Variable(np.zeros((1,) * len(v.shape), dtype=keras.backend.standardize_dtype(
            v.dtype)), name=f"tntref{i}x", trainable=v.trainable)
        s.overwrite_with_gradient = getattr(v, "overwrite_with_gradient", False)
        stand_ins.append(s)
    optimizer = type(like).from_config(like.get_config())
    optimizer.build(stand_ins)
    layout, made, shared = [], {}, 0
    for ov in optimizer.variables:
        found = re.search(r"tntref(\d+)x", ov.name)
        if found is None:
            layout.append((None, shared))
            shared += 1
        else:
            i = int(found.group(1))
            layout.append((i, made.get(i, 0)))
            made[i] = made.get(i, 0) + 1
    return optimizer, layout
