"""A plan's maps, run on a rank's rows: one function for a row, and a
micro-batch's rows mapped in one call."""
import tensorflow as tf

from tarantella.data import _tf_data_internals as tfdi


def maps_of_a_row(plan):
    """One function that maps a row as the plan's maps do, one after the
    other: it takes (the row's seeds, the row) where some of them draw random
    numbers (each such map draws from its own seeds), else the row."""
    calls, nth = [], 0
    for step in plan.moved:
        if tfdi.kind(step) not in tfdi.MAP:
            continue
        if id(step) in plan.random:
            calls.append((plan.random[id(step)].call, nth))
            nth += 1
        else:
            calls.append((tfdi.map_call(step), None))

    def maps(element):
        seeds, row = element if plan.random else ((), element)
        for call, k in calls:
            row = call(row) if k is None else call(row, seeds[k])
        return row
    return maps


def element(components):
    """An element as tf.data passes its components to a function."""
    return components[0] if len(components) == 1 else components


# The most ops a micro-batch's map holds to map its rows one after the other
# in its body (its rows times the ops of the maps), without a loop: each
# iterator instantiates the map's function anew (see map_rows).
_UNROLLED_OPS = 4096


def map_rows(row_maps, rows, mapped, width, ops):
    """`row_maps` applied to each row of the batched `rows` (a row maps to
    `mapped`, a structure of TensorSpecs; the maps hold `ops` ops), the
    results batched: each row goes through the same ops as alone. A step of
    a loop (tf.map_fn) costs a row about half of what the augment
    benchmark's maps cost it (on 2 ranks, 14 us against 33 us), so a batch
    of its usual `width` rows is mapped one row after the other in the
    map's body, where that stays within _UNROLLED_OPS; a shorter one (the
    partial last batch) or a wider one in a loop."""
    def unrolled():
        out = [row_maps(tf.nest.map_structure(lambda t: t[i], rows)) for i in range(width)]
        return tf.nest.map_structure(lambda *rows: tf.stack(rows), *out)

    def looped():
        return tf.map_fn(row_maps, rows, fn_output_signature=mapped)
    if width * ops > _UNROLLED_OPS:
        return looped()
    return tf.cond(tf.shape(tf.nest.flatten(rows)[0])[0] == width, unrolled, looped)
