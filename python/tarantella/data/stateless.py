"""A map's random ops, made to draw from (seed, a key per sample).

A stateful random op (``tf.random.uniform``, the ``tf.image.random_*``
augmentations) in a ``tf.data`` map gives the k-th sample the process maps
the k-th draw of its stream: which numbers a sample gets depends on how many
samples the same process mapped before. A Keras preprocessing layer
(``RandomFlip``, ``RandomCrop``, ...) draws through a ``SeedGenerator``
whose state variable advances at every call: the same thing.

``rewrite`` copies the map function's graph and replaces each such op by
its stateless counterpart, seeded from the op's own seed (the user's seed,
or the global one ``tnt.init`` sets) and a key per sample that depends on
the epoch and the sample's index in the epoch (``sample_keys``); a
SeedGenerator's state reads become such seeds and its updates are dropped.
The map then gives every sample the same numbers whichever process maps it
and whatever it mapped before, so that N ranks that each map a share of
the samples see exactly the samples one rank sees.
"""
import weakref

import tensorflow as tf

from tarantella.data import _tf_data_internals as tfdi

# Stateful random op -> (stateless op, index at which the seed input goes).
# Their other inputs and attributes are the same, but for the seed attributes
# (dropped) and the output type of RandomUniformInt (Tout there, dtype here).
_STATELESS = {
    "RandomUniform": ("StatelessRandomUniform", 1),
    "RandomUniformInt": ("StatelessRandomUniformInt", 1),
    "RandomStandardNormal": ("StatelessRandomNormal", 1),
    "TruncatedNormal": ("StatelessTruncatedNormal", 1),
    "Multinomial": ("StatelessMultinomial", 2),
}
_READ, _WRITES = "ReadVariableOp", {"AssignVariableOp", "AssignAddVariableOp",
                                    "AssignSubVariableOp"}
_FEED = "tnt_stateless_seed_"


def _is_seed_state(variable):
    """Whether `variable` is the state of a Keras SeedGenerator (Keras names
    it seed_generator_state)."""
    return (variable.name.split("/")[-1].split(":")[0].startswith("seed_generator_state")
            and variable.shape == (2,) and variable.dtype in (tf.int64, tf.int32, tf.uint32))


def _fold(seed, value):
    return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), value)


class Rewritten:
    """A map function whose random draws depend on (seed, a key per sample)
    only: ``seeds(keys)`` gives the seeds of the samples of `keys` (a vector)
    at once, and ``call(element, seeds)`` (one sample's) returns what the
    map returns. Draw d of a sample is seeded with the pair (a number of the
    map's own for that draw, drawn once from the map's key; the sample's
    key): stateless ops hash their seed pair, so that every pair starts its
    own stream. The seeds are made for many samples in one op, off the
    per-sample path, and go along with a sample as one tensor: a light
    augmentation costs about 40 us a sample, and making its seeds per
    sample (3 ops) cost it 5 to 15 % (measured on a rank of 2 in the data
    benchmark's augment job)."""

    def __init__(self, graph_def, inputs, outputs, captured, key, draws, input_structure,
                 output_structure):
        self._graph_def, self._inputs, self._outputs = graph_def, inputs, outputs
        self._captured, self._draws = captured, draws
        self._per_draw = tf.cast(tf.random.experimental.stateless_split(key, len(draws))[:, 0],
                                 tf.int64)
        self._in, self._out = input_structure, output_structure

    def seeds(self, keys):
        """The seeds of the samples whose keys are the vector `keys`:
        [len(keys), draws, 2]."""
        per_draw = tf.broadcast_to(self._per_draw, [tf.size(keys), len(self._draws)])
        return tf.stack([per_draw, tf.broadcast_to(keys[:, None], tf.shape(per_draw))], axis=2)

    @tf.autograph.experimental.do_not_convert
    def call(self, element, seeds):
        flat = tfdi.to_tensor_list(self._in, element)
        # tf.identity brings the captured values (eager tensors, variable
        # handles) into the graph of the map that calls this.
        feed = dict(zip(self._inputs, flat + [tf.identity(c) for c in self._captured]))
        for (name, dtype), seed in zip(self._draws, tf.unstack(seeds, len(self._draws))):
            feed[name] = tf.cast(seed, dtype)
        out = tf.graph_util.import_graph_def(self._graph_def, input_map=feed,
                                             return_elements=self._outputs, name="tnt_map")
        return tfdi.from_tensor_list(self._out, out)


def rewrite(map_dataset, ordinal):
    """(Rewritten, []) for a map whose stateful ops are all random ops with a
    stateless counterpart or Keras seed generators, else (None, the types of
    the stateful ops that cannot be rewritten). `ordinal`, the map's place
    in the pipeline, keeps two maps' draws apart."""
    function, input_structure, output_structure = tfdi.map_function(map_dataset)
    graph = function.graph
    graph_def = graph.as_graph_def()
    seed_states = {id(v.handle): v for v in graph.variables if _is_seed_state(v)}
    state_of = {inner.op.name: seed_states[id(outer)] for outer, inner in graph.captures
                if id(outer) in seed_states}
    stuck = set()
    for fn in graph_def.library.function:
        stuck |= {n.op + " in a tf.cond or loop" for n in fn.node_def
                  if n.op in _STATELESS or n.op in _WRITES or n.op == _READ}
    by_name = {op.name: op for op in graph.get_operations()}
    # The map's key: its place in the pipeline and the seeds of its draws
    # (each op's seed attributes: the user's seed or the global one; a
    # seed generator's state).
    key = tf.constant([0, ordinal], tf.int64)
    draws, feeds = [], []
    for node in graph_def.node:
        op = by_name[node.name]
        if node.op in _STATELESS:
            name = f"{_FEED}{len(feeds)}"
            feeds.append(name)
            key = _fold(_fold(key, node.attr["seed"].i), node.attr["seed2"].i)
            draws.append((name + ":0", tf.int64))
            stateless, at = _STATELESS[node.op]
            inputs = list(node.input)
            inputs.insert(at, name)
            del node.input[:]
            node.input.extend(inputs)
            node.op = stateless
            for attr in ("seed", "seed2"):
                del node.attr[attr]
            if "Tout" in node.attr:
                node.attr["dtype"].CopyFrom(node.attr["Tout"])
                del node.attr["Tout"]
            node.attr["Tseed"].type = tf.int64.as_datatype_enum
        elif node.op in (_WRITES | {_READ}) and node.input[0].split(":")[0] in state_of:
            variable = state_of[node.input[0].split(":")[0]]
            if node.op == _READ:
                for value in variable.numpy():
                    key = _fold(key, int(value))
                draws.append((node.name + ":0", variable.dtype))
            else:  # the state's update: dropped, its inputs kept as control inputs
                inputs = ["^" + i.split(":")[0] if not i.startswith("^") else i
                          for i in node.input if i.split(":")[0] not in state_of]
                del node.input[:]
                node.input.extend(inputs)
                node.op = "NoOp"
                node.attr.clear()
        elif op.op_def.is_stateful and node.op not in tfdi.HARMLESS_STATEFUL:
            stuck.add(node.op)
    if stuck:
        return None, sorted(stuck)
    for name in feeds:
        feed = graph_def.node.add()
        feed.name, feed.op = name, "Placeholder"
        feed.attr["dtype"].type = tf.int64.as_datatype_enum
    inputs = [t.name for t in graph.inputs]
    outputs = [t.name for t in graph.outputs]
    return Rewritten(graph_def, inputs, outputs, function.captured_inputs, key, draws,
                     input_structure, output_structure), []


# Per dataset given by the user: the stream of per-sample keys its shares
# draw from (kept, so that an epoch of a later fit draws other numbers).
_keys = weakref.WeakKeyDictionary()

KEYS_AT_ONCE = 1024
_SAMPLE_KEY_SEED = 27182818  # an op seed, next to the global seed


def sample_keys(given):
    """An endless dataset of the keys of the samples, in vectors of
    KEYS_AT_ONCE: another sequence at every iteration (epoch), the same on
    every rank; the k-th sample of an epoch gets its k-th key whatever the
    number of ranks. A key of the epoch (Dataset.random, which draws
    another sequence at every iteration, from the global seed that tnt.init
    sets and this op seed) seeds each vector (one op, where a random element
    a sample would cost each its own element)."""
    try:
        keys = _keys.get(given)
    except TypeError:
        keys = None
    if keys is None:
        keys = tf.data.Dataset.random(seed=_SAMPLE_KEY_SEED, rerandomize_each_iteration=True).map(
            lambda key: tf.random.stateless_uniform(
                [KEYS_AT_ONCE], tf.stack([key, _SAMPLE_KEY_SEED]), minval=None, maxval=None,
                dtype=tf.int64))
        try:
            _keys[given] = keys
        except TypeError:
            pass
    return keys
