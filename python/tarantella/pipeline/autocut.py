"""Automatic cutting: where to cut a model without SplitLayers into K
balanced pipeline stages (``tnt.Model(model, num_stages=K)``).

1. Candidates. The model's layers are taken in the order of its functional
   configuration (``get_config()["layers"]``, the order partition.py reads).
   Cutting after the layer at position i is possible when exactly one
   tensor is live there: the output of that layer is the only tensor made
   at or before i (model inputs included) that a later layer still needs,
   and it is not a model output. Such a layer must also be called once and
   return one tensor. Its output is then cut as a SplitLayer's would be
   (``Partition(model, cut_after=names)``).
2. Blocks and their cost. The candidates split the model into blocks (the
   layers from one candidate to the next); every stage is a run of whole
   blocks. The master measures each block's forward and backward time
   (gradients of its weights and of its input) as a traced function, on a
   forward pass of a synthetic batch of BATCH samples (random normal floats,
   integer zeros): one block after the other, each over several repetitions
   after a warm-up; a block's cost is its fastest time (on a busy machine
   noise only adds) less the time of calling an empty traced step. Timing
   blocks rather than single layers, and taking off the call, keeps the sum
   of the blocks close to the whole model's time (the log shows both). A
   model built from a function without its weights (``tnt.Model(build_fn)``)
   has each block's weights allocated while it is timed and freed after, so
   the master never holds more than one block; the whole model is then not
   timed. The model's state (BatchNormalization statistics, dropout seeds)
   is put back as it was, so that training is unchanged. Should a block fail to run on
   synthetic data, the parameter counts stand in for the times (with a
   warning): the cuts stay valid, only their balance is a guess.
3. Choice. The K - 1 cuts minimize the largest stage cost (dynamic
   programming over the blocks); among equally good choices, the one whose
   other stages are most even (smallest sum of squares), then the earliest
   cuts.
4. Agreement. The master measures and chooses; a broadcast gives every
   rank its cuts and the measured costs, so every rank builds the same
   partition. While the master measures, it tells the others every third
   of TNT_TIMEOUT_S that it still does, so that their wait does not time
   out while it measures (each single step, such as tracing one block,
   must take less than that timeout).
"""
import contextlib
import time

import keras
import numpy as np
import tensorflow as tf

from tarantella import _core
from tarantella import _keras_internals as internals
from tarantella import log
from tarantella import runtime
from tarantella.pipeline import partition as partition_lib

BATCH = 32            # samples of the synthetic batch
WARMUP = 2            # untimed calls of every block (the first traces it)
MIN_REPEATS, MAX_REPEATS = 5, 25
BUDGET_S = 3.0        # the timed repetitions of all blocks stop around this


class Plan:
    """The cuts chosen for a model: ``cuts`` the names of the layers after
    which it is cut; ``stage_costs`` each stage's measured forward+backward
    time (milliseconds per batch of BATCH samples), or its parameter count
    when ``measured`` is False; ``whole_cost`` the whole model's time."""

    def __init__(self, cuts, stage_costs, whole_cost, measured):
        # whole_cost: None when the blocks were timed one at a time
        self.cuts = list(cuts)
        self.stage_costs = list(stage_costs)
        self.whole_cost = whole_cost
        self.measured = measured

    @property
    def num_stages(self):
        return len(self.stage_costs)

    def cost_text(self, s):
        c = self.stage_costs[s]
        return (f"measured cost {c:.3f} ms per batch of {BATCH}" if self.measured
                else "cost not measured")


def _graph(model):
    """The functional view, its layer order, each layer's producers, how
    often each layer is called, and the names of the output layers."""
    fm = partition_lib.functional(model)
    config = fm.get_config()
    order, producers, _, uses = partition_lib.graph(config)
    outputs = config["output_layers"]
    if outputs and isinstance(outputs[0], str):
        outputs = [outputs]
    return fm, order, producers, uses, {entry[0] for entry in outputs}


def candidates(model):
    """The names of the layers after which `model` can be cut, in order."""
    fm, order, producers, uses, outputs = _graph(model)
    position = {n: i for i, n in enumerate(order)}
    last_use = {n: -1 for n in order}
    for n in order:
        for p in producers[n]:
            last_use[p] = max(last_use[p], position[n])
    for n in outputs:
        last_use[n] = len(order)  # needed to the end
    found, live = [], set()
    for i, n in enumerate(order):
        live = {p for p in live if last_use[p] > i}
        if last_use[n] > i:
            live.add(n)
        if live != {n} or n in outputs or uses[n] != 1:
            continue
        layer = fm.get_layer(n)
        if isinstance(layer, keras.layers.InputLayer):
            continue
        try:
            out = internals.output_in_graph(fm, layer)
        except (AttributeError, ValueError):
            continue
        if len(tf.nest.flatten(out)) != 1:
            continue
        found.append(n)
    return found


def balance(costs, num_stages):
    """Splits the blocks of `costs` (in order) into `num_stages` non-empty
    runs with the smallest largest sum. Among the splits that reach it, the
    one with the smallest sum of squared stage costs (the other stages as
    even as they can be), and of those the earliest last cut (recursively).
    Returns the K - 1 indices j: cut after block j."""
    n, k = len(costs), num_stages
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} blocks into {k} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def run(a, b):  # cost of blocks a..b-1
        return prefix[b] - prefix[a]

    inf = float("inf")
    # worst[s][i]: the smallest largest sum of blocks 0..i-1 in s runs.
    worst = [[inf] * (n + 1) for _ in range(k + 1)]
    worst[0][0] = 0.0
    for s in range(1, k + 1):
        for i in range(s, n + 1):
            worst[s][i] = min(max(worst[s - 1][j], run(j, i)) for j in range(s - 1, i))
    bound = worst[k][n]
    # squares[s][i]: the smallest sum of squares of blocks 0..i-1 in s runs
    # of at most `bound`; start[s][i]: where its last run starts.
    squares = [[inf] * (n + 1) for _ in range(k + 1)]
    start = [[0] * (n + 1) for _ in range(k + 1)]
    squares[0][0] = 0.0
    for s in range(1, k + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                if run(j, i) <= bound and squares[s - 1][j] + run(j, i) ** 2 < squares[s][i]:
                    squares[s][i], start[s][i] = squares[s - 1][j] + run(j, i) ** 2, j
    cuts, i = [], n
    for s in range(k, 1, -1):
        i = start[s][i]
        cuts.append(i - 1)
    return cuts[::-1]


def _synthetic(fm):
    """A batch of BATCH samples for each input of `fm`."""
    rng = np.random.default_rng(0)  # a generator of its own: no global seed moves
    batch = []
    for t in fm.inputs:
        shape = (BATCH,) + tuple(d if d is not None else 8 for d in t.shape[1:])
        dtype = tf.as_dtype(t.dtype)
        if dtype.is_floating:
            batch.append(tf.constant(rng.standard_normal(shape).astype(np.float32), dtype=dtype))
        else:
            batch.append(tf.zeros(shape, dtype=dtype))
    return batch


def _step(block, watch_inputs):
    """A traced forward and backward pass of `block`; returns a scalar that
    depends on every gradient, so that reading it waits for all of them."""
    @tf.function
    def step(inputs):
        with tf.GradientTape() as tape:
            sources = ([x for x in tf.nest.flatten(inputs) if x.dtype.is_floating]
                       if watch_inputs else [])
            for x in sources:
                tape.watch(x)
            outputs = [o for o in tf.nest.flatten(block(inputs, training=True))
                       if o.dtype.is_floating]
            loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in outputs]
                            + [tf.constant(0.0)])
        grads = tape.gradient(loss, list(block.trainable_variables) + sources,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads] + [loss])
    return step


class _Nothing:
    """A block without layers: its step costs what calling a step costs."""
    trainable_variables = ()

    def __call__(self, x, training=None):
        return tf.identity(x)


def measure(model, cuts, tick=lambda: None, hold=None):
    """Forward+backward milliseconds of each block between `cuts` (layer
    names, in order) and of the whole model (None when `hold` is given), on
    a synthetic batch, less the cost of calling a traced function (measured
    on an empty one, and given as the third result); the model's state is
    left as it was. `hold(variables)`: a context within which `variables`
    hold values, for a model built without allocating its weights: each
    block is then allocated, timed and freed in turn, so that no more than
    one block's weights are held at once. `tick` is called between the
    steps of the work (plan() keeps the other ranks informed from it)."""
    fm = partition_lib.functional(model)
    ends = [internals.output_in_graph(fm, fm.get_layer(n)) for n in cuts]
    blocks = []
    for b in range(len(cuts) + 1):
        # Named, so that Keras's automatic names (counted per process) stay
        # the same on the master as on the other ranks.
        blocks.append(keras.Model(fm.input if b == 0 else ends[b - 1],
                                  fm.output if b == len(cuts) else ends[b],
                                  name=f"tnt_autocut_block_{b}"))
    quiet = tf.get_logger().level
    tf.get_logger().setLevel("ERROR")  # one traced step per block: no retracing warnings
    try:
        batch = tf.nest.pack_sequence_as(fm.input, _synthetic(fm))
        feed, ms = batch, []
        budget = BUDGET_S / (len(blocks) + (1 if hold is None else 0))
        for b, block in enumerate(blocks):
            with (hold or contextlib.nullcontext)(block.variables), _state_kept(block):
                ms.append(_time(_step(block, b > 0), feed, tick, budget))
                if b + 1 < len(blocks):
                    feed = tf.convert_to_tensor(block(feed, training=False))
            tick()
        whole = None
        if hold is None:
            with _state_kept(fm):
                whole = _time(_step(fm, False), batch, tick, budget)
        call = _time(_step(_Nothing(), True), tf.zeros((BATCH, 1)), tick, budget)
    finally:
        tf.get_logger().setLevel(quiet)
    return ([max(0.0, t - call) for t in ms],
            None if whole is None else max(0.0, whole - call), call)


@contextlib.contextmanager
def _state_kept(block):
    """Puts back `block`'s non-trainable state (BatchNormalization
    statistics, seeds) as it was, so that training is unchanged."""
    state = list(block.non_trainable_variables)
    saved = [v.numpy() for v in state]
    try:
        yield
    finally:
        for v, value in zip(state, saved):
            v.assign(value)


def _time(step, x, tick, budget):
    """The fastest of the timed calls of `step` on `x`, in milliseconds
    (on a busy machine noise only adds), after WARMUP untimed ones (the
    first traces it); repeats MIN_REPEATS times at least, and stops after
    `budget` seconds or MAX_REPEATS."""
    for _ in range(WARMUP):
        step(x).numpy()
        tick()
    times, started = [], time.perf_counter()
    for r in range(MAX_REPEATS):
        t0 = time.perf_counter()
        step(x).numpy()
        times.append(time.perf_counter() - t0)
        tick()
        if r + 1 >= MIN_REPEATS and time.perf_counter() - started > budget:
            break
    return 1000.0 * min(times)


def _parameters(model, cuts):
    """Parameters of each block between `cuts` (plus one: none is free)."""
    fm = partition_lib.functional(model)
    order = [c["name"] for c in fm.get_config()["layers"]]
    bounds = [order.index(n) for n in cuts] + [len(order) - 1]
    counts, start = [], 0
    for end in bounds:
        counts.append(1 + sum(int(np.prod(w.shape)) for n in order[start:end + 1]
                              for w in fm.get_layer(n).weights))
        start = end + 1
    return counts


class _Heartbeat:
    """While the master measures, the other ranks wait in a broadcast,
    bounded by libtnt's timeout (TNT_TIMEOUT_S). So the master broadcasts
    "still measuring" every third of that timeout (a one-word broadcast)
    and "done" at the end; the others receive until "done". A single step
    of the work (tracing one block) must still fit in the timeout."""

    def __init__(self):
        self.interval = max(0.5, _core.timeout() / 3)
        self.last = time.monotonic()
        self.error = None

    def _send(self, flag):
        try:
            runtime.broadcast_arrays([np.array([flag], dtype=np.int64)])
        except Exception as e:
            self.error = e
            raise

    def __call__(self):
        if time.monotonic() - self.last > self.interval:
            self._send(0)
            self.last = time.monotonic()

    def done(self):
        self._send(1)

    def wait(self):
        while int(runtime.broadcast_arrays([np.zeros(1, dtype=np.int64)])[0][0]) == 0:
            pass


def plan(model, num_stages, hold=None):
    """The Plan for `model` in `num_stages` stages, the same on every rank
    (collective: every rank calls it). `hold`: see measure()."""
    found = candidates(model)
    if len(found) + 1 < num_stages:
        most = (f"at most {len(found) + 1} stages are possible: pass num_stages={len(found) + 1}"
                " or less, " if found else "it cannot be cut automatically at all: ")
        raise runtime.TarantellaError(
            f"model '{model.name}' cannot be cut automatically into {num_stages} stages: it "
            f"has {len(found)} point(s) where a single tensor crosses from one layer to the "
            f"rest ({', '.join(found) if found else 'none'}), so {most}or place "
            "tnt.keras.layers.SplitLayer() on the tensors to cut yourself (several "
            "SplitLayers at one cut carry several tensors, e.g. skip connections)")
    costs = np.zeros(len(found) + 1, dtype=np.float64)
    header = np.zeros(2, dtype=np.float64)  # measured?, whole model's cost
    chosen = np.zeros(num_stages - 1, dtype=np.int64)
    beat = _Heartbeat()
    if runtime.is_master_rank():
        try:
            blocks, whole, _ = measure(model, found, beat, hold)
            costs[:], header[:] = blocks, (1.0, np.nan if whole is None else whole)
        except Exception as e:  # noqa: BLE001  the cuts must not depend on a timing
            if beat.error is not None:
                raise
            log.logger.warning(
                "automatic cutting: measuring model '%s' on synthetic data failed (%s: %s); "
                "balancing the stages' parameter counts instead", model.name,
                type(e).__name__, e)
            costs[:] = _parameters(model, found)
        chosen[:] = balance(list(costs), num_stages)
        beat.done()
    else:
        beat.wait()
    chosen, costs, header = runtime.broadcast_arrays([chosen, costs, header])
    bounds = [-1] + [int(j) for j in chosen] + [len(costs) - 1]
    stage_costs = [float(sum(costs[bounds[s] + 1:bounds[s + 1] + 1]))
                   for s in range(num_stages)]
    whole = float(header[1]) if header[0] and not np.isnan(header[1]) else None
    result = Plan([found[j] for j in chosen], stage_costs, whole, bool(header[0]))
    if result.measured:
        log.logger.info(
            "pipeline: automatic cutting of model '%s' into %d stages after %s, from %d "
            "possible cuts; forward+backward per batch of %d: stages %s ms; the blocks "
            "between possible cuts sum to %.3f ms, %s", model.name, num_stages,
            ", ".join(result.cuts), len(found), BATCH,
            ", ".join(f"{c:.3f}" for c in stage_costs), sum(costs),
            f"the whole model takes {whole:.3f} ms" if whole is not None else
            "timed one block at a time (the model's weights are not all allocated)")
    else:
        log.logger.info("pipeline: automatic cutting of model '%s' into %d stages after %s "
                        "(balancing parameter counts %s)", model.name, num_stages,
                        ", ".join(result.cuts), ", ".join(str(int(c)) for c in stage_costs))
    return result


def choose_cuts(model, num_stages):
    """Names of the num_stages - 1 layers after which `model` is cut."""
    return plan(model, num_stages).cuts
