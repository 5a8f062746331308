"""Pipeline schedules: the order in which a stage runs the forward (F) and
backward (B) passes of its micro-batches.

Both schedules run the backward passes in micro-batch order, so gradients
accumulate in the same order and give bitwise identical weights; they differ
in when the backward passes run, hence in memory:

* GPipe: all M forwards, then all M backwards; a stage holds the
  activations of all M micro-batches.
* 1F1B (PipeDream-Flush, the default): stage s of K runs K - 1 - s forwards
  ahead, then alternates one forward and one backward; it holds at most
  K - s micro-batches' activations.

Both have the same bubble, (K - 1) / (M + K - 1) of a step. Sends never block
(the ops post them), and every stage receives in the order its neighbours
send, so no schedule can deadlock.
"""

from tarantella import settings

def name_from_settings():
    """TNT_PIPELINE_SCHEDULE: 1f1b (the default) or gpipe."""
    return settings.get("TNT_PIPELINE_SCHEDULE")


def training(name, stage, num_stages, num_micro_batches):
    """[("F", i) | ("B", i)] for one training step of `stage`."""
    m = num_micro_batches
    if name == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(num_stages - 1 - stage, m)
    ops = [("F", i) for i in range(warmup)]
    for j in range(m - warmup):
        ops += [("F", warmup + j), ("B", j)]
    ops += [("B", i) for i in range(m - warmup, m)]
    return ops


def inference(num_micro_batches):
    """The forwards of an evaluation step."""
    return [("F", i) for i in range(num_micro_batches)]


def in_flight(ops):
    """The most micro-batches whose activations `ops` hold at once."""
    held = most = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most
