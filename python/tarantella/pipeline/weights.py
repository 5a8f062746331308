"""Pipeline stages that hold only their own weights.

A rank of stage s allocates the variables of stage s only; every other
stage's variables have no value on it. ``build_deferred(build_fn)`` builds a
model without allocating any weight (Keras's
``StatelessScope(initialize_variables=False)`` leaves a variable made with
an initializer unallocated); ``hold_stages`` then allocates this rank's stages,
each variable with its own initializer (so a stage starts bitwise equal to
the same stage of a normal build with the same seed), and frees the weights
of a model that was built whole.

A variable of another stage keeps a guard as its initializer: Keras reads
the initializer of a variable without a value whenever the value is read.
While Keras infers shapes symbolically (``compute_output_spec``) the guard
stands for the value with a symbolic tensor; anywhere else it raises an
error that names the weight and its stage, rather than returning a fresh
initializer draw. The variables are also taken out of Keras's list of
pending variables, which Keras would otherwise allocate when the next
top-level StatelessScope ends (its own shape inference has one).
"""
import contextlib

import keras
import tensorflow as tf

from tarantella import _keras_internals as internals
from tarantella import runtime


class _NotHeld:
    """The initializer of a variable of a stage that this rank does not
    hold (see the module's description)."""

    def __init__(self, path, stage, held):
        """`held`: the stages this rank holds."""
        self.path, self.stage, self.held = path, stage, held

    def __call__(self, shape, dtype=None):
        if internals.in_shape_inference():
            return tf.zeros(shape, dtype)
        raise runtime.TarantellaError(
            f"the weight {self.path} belongs to pipeline stage {self.stage}, which rank "
            f"{runtime.get_rank()} does not hold (it holds {_stages(self.held)} only): read it on "
            f"a rank of stage {self.stage}, or read the whole model with model.get_weights() "
            "(collective: every rank of the pipeline gathers all stages for it)")


def _stages(stages):
    return (f"stage {stages[0]}" if len(stages) == 1
            else "stages " + ", ".join(str(s) for s in stages))


def build_deferred(build_fn):
    """(model, variables): the model that `build_fn()` returns, built with
    the allocation of its weights deferred, and the variables it made,
    none of them allocated and none left on Keras's pending list."""
    before = {id(v) for v in internals.pending_variables()}
    try:
        with keras.StatelessScope(initialize_variables=False):
            model = build_fn()
    except ValueError as e:
        layer = _innermost_layer(e.__traceback__)
        if "stateless scope" not in str(e) or layer is None:
            raise
        raise runtime.TarantellaError(
            f"layer '{layer.name}' ({type(layer).__name__}) cannot be built without allocating "
            f"its weights ({str(e).splitlines()[0]}): a pipelined model built by a function "
            "allocates each stage's weights only on the ranks of that stage. Make the layer "
            "create its weights with add_weight(shape=..., initializer=...) (a keras."
            "initializers.Constant(array) for fixed values), or build the model and pass "
            "the model itself to tnt.Model (every rank then builds it whole first)") from e
    pending = internals.pending_variables()
    made = [v for v in pending if id(v) not in before]
    pending[:] = [v for v in pending if id(v) in before]
    if not isinstance(model, keras.Model):
        raise TypeError(f"the function given to tnt.Model returned a "
                        f"{type(model).__name__}; it must return a keras.Model (functional "
                        "or Sequential)")
    return model, made


def _innermost_layer(traceback):
    """The innermost keras layer whose method is on `traceback`, or None."""
    found = None
    while traceback is not None:
        candidate = traceback.tb_frame.f_locals.get("self")
        if isinstance(candidate, keras.layers.Layer):
            found = candidate
        traceback = traceback.tb_next
    return found


def allocate_all(variables):
    """Allocates every unallocated variable of `variables` (a model built
    by build_deferred that is not cut into stages)."""
    for v in variables:
        if not internals.is_allocated(v):
            internals.allocate(v)


@contextlib.contextmanager
def allocated_meanwhile(variables):
    """Within it, the unallocated ones of `variables` hold their
    initializers' values (automatic cutting times the whole model);
    afterwards they are unallocated again, with the same initializers, so
    that a stage allocated later starts as a normal build would."""
    waiting = [(v, internals.initializer(v)) for v in variables
               if not internals.is_allocated(v)]
    try:
        for v, _ in waiting:
            internals.allocate(v)
        yield
    finally:
        for v, init in waiting:
            internals.unallocate(v, init)


def hold_stages(stage_models, stages, deferred=()):
    """Makes this rank hold the stages `stages` of `stage_models` (the
    Keras models of the stages) only: allocates their unallocated
    variables, and frees and guards those of every other stage. `deferred`:
    variables made by build_deferred, those outside every stage are
    allocated too. Returns the variables of the other stages, with their
    stage."""
    own = [v for s in stages for v in stage_models[s].variables]
    others, seen = [], {id(v) for v in own}
    for s, m in enumerate(stage_models):
        if s in stages:
            continue
        for v in m.variables:
            if id(v) not in seen:
                seen.add(id(v))
                others.append((v, s))
    allocate_all(own)
    allocate_all([v for v in deferred if id(v) not in seen])
    for v, s in others:
        internals.unallocate(v, _NotHeld(v.path, s, stages))
    return others


def allocated_bytes(variables):
    """The bytes of the values that `variables` hold on this rank."""
    total = 0
    for v in variables:
        if internals.is_allocated(v):
            total += int(tf.size(v.value)) * tf.as_dtype(v.dtype).size
    return total


class Whole:
    """``with whole():`` every variable of the other stages holds a value
    (their owners' when `fill`, else zeros to be overwritten) while it
    lasts, and is freed again at the end; nested uses share the outermost
    one's values. Collective when `fill` (`fill_from_owners` runs then)."""

    def __init__(self, others, held_stage, fill_from_owners):
        self.others = others  # [(variable, its stage)], from hold_stages
        self.held_stage = held_stage  # the stages this rank holds
        self.fill_from_owners = fill_from_owners
        self.depth = 0

    @contextlib.contextmanager
    def __call__(self, fill=True):
        self.depth += 1
        try:
            if self.depth == 1:
                for v, _ in self.others:
                    internals.allocate(v, keras.initializers.Zeros())
                if fill:
                    self.fill_from_owners()
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                for v, s in self.others:
                    internals.unallocate(v, _NotHeld(v.path, s, self.held_stage))
