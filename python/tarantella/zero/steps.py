"""The steps of a model at ZeRO stage 3 (shards.py), whose weights are in
the ranks' parts: fit, evaluate and predict run Keras's own passes on the
whole weights, gathered a layer at a time as the passes read them.

A step runs the model inside a ``keras.StatelessScope`` that maps each
trainable variable to a tensor gathered from the parts when the model first
reads it (_Gathering; Shards.gather_some): Keras's ``Variable.value`` reads
the scope's value, so the model computes on the gathered weights as it
would on its variables (the way ``stateless_call`` runs a model). The
training step takes the gradients with respect to those tensors,
reduce-scatters them and updates the parts, as stage 2 does; the
arithmetic is stage 0's, so the results are bitwise.

A stateless scope also keeps every assignment made inside it (moving
statistics of BatchNormalization, the state of a Dropout's seed
generator, metrics); _Recording notes which variables were assigned and
assigns them their last values once the passes are done.

Stage 3 runs the steps of Keras's Model. Code that would read the
variables, which hold no value, is refused: a model whose class has its own
train_step when it is compiled, a custom loop when its optimizer is given
gradients before fit has cut the weights into parts.
"""
import keras
import tensorflow as tf

from tarantella import _keras_internals as internals


class _Recording(keras.StatelessScope):
    """A StatelessScope over `mapping` ([(variable, value)]) that assigns,
    in apply(), every variable assigned within it its last value."""

    def __init__(self, mapping):
        super().__init__(state_mapping=mapping, initialize_variables=False)
        self.assigned = {}

    def add_update(self, update):
        super().add_update(update)
        self.assigned[id(update[0])] = update[0]

    def apply(self):
        for v in self.assigned.values():
            v.assign(self.get_current_value(v))


def _shards(model):
    return model.optimizer._tnt_shards


def holds_parts(model):
    """Whether `model`'s weights are in the ranks' parts (stage 3, the
    optimizer built)."""
    shards = getattr(getattr(model, "optimizer", None), "_tnt_shards", None)
    return shards is not None and shards.stage == 3


def _batch_size(x):
    return tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]


def train_step(model, data, current):
    """Keras's training step on weights gathered a layer at a time as the
    forward pass reads them (_Gathering; the tape keeps them for the
    backward pass); the update of the parts as stage 2's."""
    shards = _shards(model)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        with _Gathering(shards, _layer_groups(model, shards), current, tape) as scope:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                      training=True)
        scope.apply()
        internals.loss_tracker(model).update_state(loss, sample_weight=_batch_size(x))
        loss = model.optimizer.scale_loss(loss)
    # A weight the passes did not read has no gradient (as at stage 0).
    wholes = [scope.state_mapping.get(id(v)) for v in shards.variables]
    read = [w for w in wholes if w is not None]
    got = iter(tape.gradient(loss, read))
    grads = [None if w is None else next(got) for w in wholes]
    model.optimizer.apply(grads, shards.variables)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


class _Gathering(_Recording):
    """A _Recording scope in which a trainable weight is gathered from the
    parts when the passes first read it, with the other weights of its
    layer (`groups`: lists of indices into shards.variables), in one
    allgatherv. The gathers follow one another in the order of the reads;
    each waits for the ops that read the weights gathered two gathers
    before, so that a layer's weights arrive while the previous layer
    computes. A weight is freed once its last reader has run: in evaluate
    and predict at most about two layers' weights are whole at once; in
    training `tape` watches them and keeps them for the backward pass."""

    def __init__(self, shards, groups, current, tape=None):
        super().__init__([])
        self.shards, self.current, self.tape = shards, current, tape
        # The step's graph: a weight first read inside a loop's body or a
        # branch of a cond is gathered in the step, once, in the chain of
        # its collectives, and captured by the body or branch.
        self.graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        self.group_of = {id(shards.variables[i]): g for g, group in enumerate(groups)
                         for i in group}
        self.groups = groups
        self.gathered = []  # the whole weights of each gather so far

    def get_current_value(self, variable):
        value = super().get_current_value(variable)
        g = self.group_of.get(id(variable))
        if value is not None or g is None:
            return value
        earlier = self.gathered[-2] if len(self.gathered) >= 2 else []
        indices = self.groups[g]
        if self.graph is None:
            wholes = self.shards.gather_some(indices, self.current)
        else:
            with self.graph.as_default():
                after = [op for t in earlier for op in t.consumers() if op.graph is self.graph]
                wholes = self.shards.gather_some(indices, self.current, after)
        if self.tape is not None:
            self.tape.watch(wholes)
        for i, whole in zip(indices, wholes):
            self.state_mapping[id(self.shards.variables[i])] = whole
        self.gathered.append(wholes)
        return self.state_mapping[id(variable)]


def layer_groups(model, shards):
    """The indices into shards.variables of each top-level layer's weights
    (of one dtype), in the order of model.layers; a weight of no layer is
    a group of its own."""
    index = {id(v): i for i, v in enumerate(shards.variables)}
    groups, seen = [], set()
    for layer in model.layers:
        by_dtype = {}
        for v in layer.trainable_variables:
            i = index.get(id(v))
            if i is not None and i not in seen:
                seen.add(i)
                by_dtype.setdefault(v.dtype, []).append(i)
        groups += list(by_dtype.values())
    return groups + [[i] for i in range(len(shards.variables)) if i not in seen]


def _layer_groups(model, shards):
    groups = getattr(shards, "layer_groups", None)
    if groups is None:
        groups = shards.layer_groups = layer_groups(model, shards)
    return groups


def run_gathered(model, current, run):
    """`run()` (Keras's test or predict step) on weights gathered a layer
    at a time, as the passes read them (_Gathering)."""
    shards = _shards(model)
    with _Gathering(shards, _layer_groups(model, shards), current) as scope:
        out = run()
    scope.apply()
    return out


def stand_in_outputs(model, x):
    """Zeros shaped as `model`'s outputs on `x` (eager), computed without
    reading a weight: what builds the compiled metrics where their values
    do not matter."""
    spec = model.compute_output_spec(x, training=False)
    return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)

