"""The steps of a model at ZeRO stage 3 (shards.py), whose weights are in
the ranks' parts: fit, evaluate and predict run Keras's own passes on the
whole weights, gathered a layer at a time as the passes read them.

A step runs the model inside a ``keras.StatelessScope`` that maps each
trainable variable to a tensor gathered from the parts when the model first
reads it (_Gathering; Shards.gather_some): Keras's ``Variable.value`` reads
the scope's value, so the model computes on the gathered weights as it
would on its variables (the way ``stateless_call`` runs a model). The
training step takes the gradients with respect to those tensors (its
backward pass reads the weights from a second gather, _Regathering),
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
import functools

import keras
import tensorflow as tf

from tarantella import _keras_internals as internals
from tarantella import gradients
from tarantella import log


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
    forward pass reads them (_Gathering) and again for the backward pass
    (_Regathering); the update of the parts as stage 2's."""
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
    regathering = _Regathering(scope, current)
    got = iter(tape.gradient(loss, read))
    grads = [None if w is None else next(got) for w in wholes]
    current.gradient_waves = regathering.waves(grads)
    model.optimizer.apply(grads, shards.variables)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


class _Gathering(_Recording):
    """A _Recording scope in which a trainable weight is gathered from the
    parts when the passes first read it, with the other weights of its
    layer (`groups`: lists of indices into shards.variables; see
    Shards.gather_some). The gathers follow one another in the order of the reads;
    each waits for the ops that read the weights gathered two gathers
    before, so that a layer's weights arrive while the previous layer
    computes. A weight is freed once its last reader has run: at most
    about two layers' weights are whole at once. In training `tape`
    watches them, and the backward pass reads a second gather
    (_Regathering)."""

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
        self.order = []  # the indices of each gather so far
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
        self.order.append(indices)
        self.gathered.append(wholes)
        return self.state_mapping[id(variable)]


class _Regathering:
    """The gathers of a training step's backward pass. The tape makes a
    layer's backward ops read the weights that the forward pass gathered,
    which would keep every layer's weights whole until its backward ops
    have run. Instead, each layer's backward ops read a second gather of
    its weights (the same values: the parts change only after the step's
    gradients), issued while the layer after it computes its backward
    pass; the forward pass's copy is freed once the forward pass has read
    it. The layer gathered last keeps its copy (its backward pass follows
    its forward pass).

    The gathers, the starts of the gradients' reduce-scatters and the
    backward pass's own collectives (a synchronized BatchNormalization's)
    take one order on every rank (GradientReducer.reduce's waves): layer by
    layer in the reverse order of the forward gathers, layer k + 1's gather
    after the starts of the gradients of the layers before k, then the
    backward collectives that layer k's gradients are the first to need,
    then the starts of layer k's. The reduce-scatter follows the forward
    pass's last collective, not the backward pass's. A layer whose backward
    ops feed the gradients of a layer before it (a weight that the model
    reads twice, far apart, as a tied embedding) keeps its copy: its gather
    would wait for itself."""

    def __init__(self, scope, current):
        self.scope, self.current = scope, current
        self.latest = current.latest()
        graph = scope.graph
        self.first = None if graph is None else len(graph.get_operations())

    def waves(self, grads):
        """What the reduce-scatter of `grads` (made by the tape since
        __init__) follows and its waves (Step.gradient_waves), or None
        (executed eagerly, or one layer gathered)."""
        layers = list(zip(self.scope.order, self.scope.gathered))[::-1]
        if self.first is None or len(layers) < 2:
            return None
        made = self.scope.graph.get_operations()[self.first:]
        backward = set(made)
        collectives = [op for op in made if op.type in _COLLECTIVES]  # in their chain's order
        read = {i for indices, _ in layers for i in indices}
        waves, needed = [], set()  # backward ops that the gradients so far need
        for k, (indices, _) in enumerate(layers):
            gather = None
            if k + 1 < len(layers):
                uses = _uses(layers[k + 1][1], backward)
                if uses and not any(op in needed for op, _, _, _ in uses):
                    gather = functools.partial(self._gather, layers[k + 1][0], uses)
            if k == 0:
                indices = indices + [i for i in range(len(grads)) if i not in read]
            gradients.ancestors([grads[i] for i in indices], needed, backward)
            first_needed = [op for op in collectives if op in needed]
            collectives = [op for op in collectives if op not in needed]
            waves.append((indices, gather, first_needed))
        if collectives:  # that no gradient needs: after every start
            waves.append(([], None, collectives))
        log.logger.debug("ZeRO stage 3: the backward pass gathers %d of %d layers again",
                         sum(gather is not None for _, gather, _ in waves), len(layers))
        return [] if self.latest is None else [self.latest], waves

    def _gather(self, indices, uses, after):
        """Gathers the weights `indices` after the ops `after` and makes
        their backward ops `uses` (_uses) read them."""
        # After the starts before it only: the backward pass's collectives
        # may follow it (current.after() is the latest of them).
        wholes = self.scope.shards.gather_some(indices, self.current, after, chained=False)
        converted = {}
        for op, index, j, via in uses:
            whole = wholes[j]
            if via is not None:
                if via not in converted:
                    converted[via] = tf.identity(whole) if via.type == "Identity" else \
                        tf.cast(whole, via.outputs[0].dtype)
                whole = converted[via]
            internals.rewire(op, index, whole)
        return wholes


# The collectives a backward pass may run (step.Step's, in its chain).
_COLLECTIVES = ("TntAllreduce", "TntBroadcast", "TntAllgatherv")


def _uses(wholes, backward):
    """Where the ops `backward` read the tensors `wholes`, directly or
    through a Cast or Identity of the forward pass (a mixed-precision
    layer's reads): [(op, input index, index into wholes, the Cast or
    Identity op or None)]."""
    uses = []

    def readers(tensor, j, via):
        for op in tensor.consumers():
            if op in backward:
                uses.extend((op, index, j, via) for index, t in enumerate(op.inputs)
                            if t.op is tensor.op and t.value_index == tensor.value_index)
            elif via is None and op.type in ("Cast", "Identity"):
                readers(op.outputs[0], j, op)

    for j, whole in enumerate(wholes):
        readers(whole, j, None)
    return uses


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

