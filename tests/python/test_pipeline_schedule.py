"""Pipeline schedules as data (tarantella/pipeline/schedule.py), without
ranks: the action lists of GPipe, 1F1B, interleaved 1F1B and the
zero-bubble ZB-H1, ZB-H2 and ZBV, the checker that refuses lists that would
deadlock, misorder their passes or exceed their memory bound, the bubble
each schedule allows, and how a stage's W waits for its place in the list."""
import collections

import pytest

from tarantella.pipeline import schedule as S
from tarantella.pipeline.schedule import Action, Schedule, ScheduleError

GRID = [(k, m) for k in (2, 3, 4) for m in (1, 2, 3, 5, 8, 16)]


def passes(schedule, rank, kinds=("F", "B")):
    """Rank's (kind, stage, micro-batch) of its forward and backward passes."""
    return [(a.kind, a.stage, a.micro_batch) for a in schedule.actions[rank]
            if a.kind in kinds]


@pytest.mark.parametrize("k,m", GRID)
def test_one_stage_per_rank_orders(k, m):
    """GPipe: all forwards, then all backwards; 1F1B: K - 1 - s forwards
    ahead, then one forward and one backward (PipeDream-Flush)."""
    gpipe, ofob = S.training("gpipe", k, k, m), S.training("1f1b", k, k, m)
    for s in range(k):
        assert passes(gpipe, s) == [("F", s, i) for i in range(m)] + [("B", s, i)
                                                                       for i in range(m)]
        warmup = min(k - 1 - s, m)
        expected = [("F", s, i) for i in range(warmup)]
        for j in range(m - warmup):
            expected += [("F", s, warmup + j), ("B", s, j)]
        expected += [("B", s, i) for i in range(m - warmup, m)]
        assert passes(ofob, s) == expected
        assert gpipe.held(s) == m
        assert ofob.held(s) == min(k - s, m)


@pytest.mark.parametrize("k,m", GRID)
def test_transfers_surround_the_passes(k, m):
    """Each forward receives before and sends after; each backward the
    other way round; the first stage reads data, the last computes the loss."""
    ranks = S.training("1f1b", k, k, m).actions
    assert ranks[0][:2] == [Action("F", 0, 0), Action("SEND_F", 0, 0)]
    assert ranks[k - 1][:3] == [Action("RECV_F", k - 1, 0), Action("F", k - 1, 0),
                                Action("B", k - 1, 0)]
    for actions in ranks:
        for pos, a in enumerate(actions):
            if a.kind == "B" and a.stage < k - 1:
                assert actions[pos - 1] == Action("RECV_B", a.stage, a.micro_batch)


@pytest.mark.parametrize("ranks,chunks,m", [(2, 2, 2), (2, 2, 4), (2, 2, 8), (2, 3, 4),
                                            (3, 2, 6), (4, 2, 8), (4, 4, 16)])
def test_interleaved(ranks, chunks, m):
    """Rank r runs stages r, r + R, ...; every stage's backwards run in
    micro-batch order (the gradients sum as under 1F1B, so the weights are
    bitwise the same); its bubble is (R - 1) / (v M + R - 1) of a step,
    1F1B's and GPipe's (R - 1) / (M + R - 1)."""
    k = ranks * chunks
    schedule = S.training("interleaved", k, ranks, m)
    for r in range(ranks):
        assert {a.stage for a in schedule.actions[r]} == set(range(r, k, ranks))
        assert schedule.stages_of(r) == list(range(r, k, ranks))
        for s in schedule.stages_of(r):
            for kind in ("F", "B"):
                assert [i for kk, st, i in passes(schedule, r) if (kk, st) == (kind, s)] \
                    == list(range(m))
        assert schedule.held(r) <= schedule.bound[r]
    # Exact: with passes of equal cost the simulated step is a whole number
    # of passes; 1e-12 covers the float sums of at most a few hundred terms.
    assert S.idle_share(schedule) == pytest.approx((ranks - 1) / (chunks * m + ranks - 1),
                                                   abs=1e-12)
    for name in ("1f1b", "gpipe"):
        assert S.idle_share(S.training(name, ranks, ranks, m)) == pytest.approx(
            (ranks - 1) / (m + ranks - 1), abs=1e-12)


ZERO_BUBBLE_GRID = [(name, k, m) for name in ("zb-h1", "zb-h2") for k in (2, 3, 4)
                    for m in range(1, 17)]


@pytest.mark.parametrize("name,k,m", ZERO_BUBBLE_GRID)
def test_zero_bubble(name, k, m):
    """Every F, B and W once, each W after its B on the same rank and a
    stage's W in micro-batch order (so the weight gradients add up as under
    1F1B); ZB-H1 holds 1F1B's K - s micro-batches between F and B, ZB-H2
    at most 2 (K - s) - 1, both at most K - 1 more waiting for W; the lists
    run to their end in the simulator (no deadlock); with M >= K the bubble
    is (K - 1) / (3 M + K - 1) of a step (F, B and W of equal cost), the
    least a step can idle (the last stage waits for the first micro-batch to
    cross K - 1 stages), a third of 1F1B's as M grows."""
    schedule = S.training(name, k, k, m)
    assert schedule.splits_backward
    for s in range(k):
        mine = passes(schedule, s, ("F", "B", "W"))
        assert collections.Counter(mine) == collections.Counter(
            (kind, s, i) for kind in "FBW" for i in range(m))
        for i in range(m):
            assert mine.index(("B", s, i)) < mine.index(("W", s, i))
        assert [i for kind, _, i in mine if kind == "W"] == list(range(m))
        flight = min(k - s if name == "zb-h1" else 2 * (k - s) - 1, m)
        assert schedule.in_flight[s] == flight
        assert schedule.held_in_flight(s) <= flight
        assert schedule.held(s) <= schedule.bound[s] == min(flight + k - 1, m)
        if name == "zb-h1":  # exactly 1F1B's bound
            assert schedule.held_in_flight(s) == S.training("1f1b", k, k, m).held(s)
    position, _ = S._simulate(schedule)
    assert position == [len(actions) for actions in schedule.actions]
    one_f_one_b = S.idle_share(S.training("1f1b", k, k, m))
    share = S.idle_share(schedule)
    assert share < one_f_one_b
    if m >= k:
        assert share == pytest.approx((k - 1) / (3 * m + k - 1), abs=1e-12)


@pytest.mark.parametrize("ranks,m", [(r, m) for r in (2, 3, 4) for m in range(1, 17)])
def test_zbv(ranks, m):
    """ZBV: rank r runs stages r and 2 R - 1 - r (a V); every F, B and W
    once, each W after its B and a stage's W in micro-batch order; a rank
    holds at most 1F1B's rank 0's activations (min(R, M) micro-batches of a
    stage of two chunks: 2 min(R, M) chunk-micro-batches); the lists run to
    their end in the simulator; with M >= R the bubble is (R - 1) / (6 M +
    R - 1) of a step (F, B and W of equal cost), below ZB-H1's on the same
    ranks at every M."""
    k = 2 * ranks
    schedule = S.training("zbv", k, ranks, m)
    assert schedule.splits_backward
    for r in range(ranks):
        assert schedule.stages_of(r) == [r, k - 1 - r]
        mine = passes(schedule, r, ("F", "B", "W"))
        assert collections.Counter(mine) == collections.Counter(
            (kind, s, i) for kind in "FBW" for s in (r, k - 1 - r) for i in range(m))
        for s in (r, k - 1 - r):
            for i in range(m):
                assert mine.index(("B", s, i)) < mine.index(("W", s, i))
            assert [i for kind, t, i in mine if kind == "W" and t == s] == list(range(m))
        assert schedule.held(r) <= schedule.bound[r] == 2 * min(ranks, m)
    position, _ = S._simulate(schedule)
    assert position == [len(actions) for actions in schedule.actions]
    share = S.idle_share(schedule)
    assert share < S.idle_share(S.training("zb-h1", ranks, ranks, m))
    if m >= ranks:
        assert share == pytest.approx((ranks - 1) / (6 * m + ranks - 1), abs=1e-12)


def test_zero_bubble_lists():
    """ZB-H1 on 2 stages and 4 micro-batches: stage 1 runs 1F1B's order with
    each W one micro-batch late; stage 0 fills its wait for the last
    gradients with W passes. ZB-H2 runs one more forward ahead on stage 0."""
    def order(name, s):
        return " ".join(f"{kind}{i}" for kind, _, i in
                        passes(S.training(name, 2, 2, 4), s, ("F", "B", "W")))
    assert order("zb-h1", 0) == "F0 F1 B0 F2 B1 W0 F3 B2 W1 W2 B3 W3"
    assert order("zb-h1", 1) == "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3"
    assert order("zb-h2", 0) == "F0 F1 F2 B0 F3 B1 W0 W1 B2 W2 B3 W3"
    assert S.training("zb-h1", 2, 2, 4).actions[1][:6] == [
        Action("RECV_F", 1, 0), Action("F", 1, 0), Action("B", 1, 0), Action("SEND_B", 1, 0),
        Action("RECV_F", 1, 1), Action("F", 1, 1)]


def test_tags_are_unique_between_each_pair_of_ranks():
    """Two chunks of one rank send to the same rank: their tags differ;
    with one stage per rank they stay 2 i (+ 1 backward)."""
    for schedule in (S.training("interleaved", 4, 2, 4), S.training("zbv", 6, 3, 4)):
        seen = {}
        for actions in schedule.actions:
            for a in actions:
                if a.kind.startswith("SEND"):
                    peer, tag = schedule.transfer(a)
                    key = (schedule.rank_of(a.stage), peer, tag)
                    assert key not in seen, (a, seen.get(key))
                    seen[key] = a
                    # The receive names the same transfer from the other side.
                    recv = Action("RECV" + a.kind[4:],
                                  a.stage + (1 if a.kind == "SEND_F" else -1), a.micro_batch)
                    assert schedule.transfer(recv) == (schedule.rank_of(a.stage), tag)
    one = S.training("1f1b", 3, 3, 5)
    assert [one.transfer(Action(kind, 1, i)) for i in range(5)
            for kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B")] == \
        [(peer, 2 * i + b) for i in range(5) for peer, b in ((2, 0), (0, 0), (0, 1), (2, 1))]


def test_inference():
    schedule = S.inference(S.training("interleaved", 4, 2, 4))
    assert passes(schedule, 0) == [("F", 0, i) for i in range(4)] + [("F", 2, i)
                                                                      for i in range(4)]
    # The ranks of a V: stages 0 and 3 on rank 0, 1 and 2 on rank 1.
    schedule = S.inference(S.training("zbv", 4, 2, 3))
    assert passes(schedule, 0) == [("F", 0, i) for i in range(3)] + [("F", 3, i)
                                                                      for i in range(3)]
    assert passes(schedule, 1) == [("F", 1, i) for i in range(3)] + [("F", 2, i)
                                                                      for i in range(3)]


def handmade(actions, bound, k=2, m=2):
    return Schedule("handmade", k, k, m, [[Action(*a) for a in r] for r in actions], bound)


def test_checker_finds_a_deadlock():
    """Stage 0 waits for micro-batch 0's gradients before it sends micro-batch
    1; stage 1 runs both forwards before the backwards: each waits for the other."""
    schedule = handmade([[("F", 0, 0), ("SEND_F", 0, 0), ("RECV_B", 0, 0), ("B", 0, 0),
                          ("F", 0, 1), ("SEND_F", 0, 1), ("RECV_B", 0, 1), ("B", 0, 1)],
                         [("RECV_F", 1, 0), ("F", 1, 0), ("RECV_F", 1, 1), ("F", 1, 1),
                          ("B", 1, 0), ("SEND_B", 1, 0), ("B", 1, 1), ("SEND_B", 1, 1)]],
                        [2, 2])
    with pytest.raises(ScheduleError, match=r"deadlocks at action 0RECV_B0 of rank 0 "
                                            r".*rank 1 waits at 1RECV_F1 for 0SEND_F1"):
        S.check(schedule, training=True)


def test_checker_finds_the_memory_bound_exceeded():
    good = S.training("gpipe", 2, 2, 3)
    tight = Schedule("gpipe", 2, 2, 3, good.actions, [2, 3])
    with pytest.raises(ScheduleError, match=r"action 0F2 of rank 0 \(gpipe schedule\) holds 3 "
                                            r"micro-batches' activations, more than the "
                                            r"schedule's bound 2"):
        S.check(tight, training=True)


def test_checker_finds_misordered_missing_and_foreign_actions():
    good = S.training("1f1b", 2, 2, 2).actions
    swapped = [list(good[0]), list(good[1])]
    i = swapped[0].index(Action("B", 0, 0))
    swapped[0][i - 1], swapped[0][i] = swapped[0][i], swapped[0][i - 1]
    with pytest.raises(ScheduleError, match=r"action 0B0 of rank 0 .* comes before 0RECV_B0"):
        S.check(Schedule("1f1b", 2, 2, 2, swapped, [2, 1]), training=True)
    with pytest.raises(ScheduleError, match=r"action 1SEND_B1 is missing from rank 1's list"):
        S.check(Schedule("1f1b", 2, 2, 2, [good[0], good[1][:-1]], [2, 1]), training=True)
    with pytest.raises(ScheduleError, match=r"action 1F0 of rank 0 .* not an action of this"):
        S.check(Schedule("1f1b", 2, 2, 2, [good[0] + [Action("F", 1, 0)], good[1]], [2, 1]),
                training=True)


def test_checker_finds_misplaced_weight_passes():
    good = S.training("zb-h1", 2, 2, 2).actions
    early = [list(good[0]), list(good[1])]
    w = early[1].index(Action("W", 1, 0))
    early[1].insert(0, early[1].pop(w))
    with pytest.raises(ScheduleError, match=r"action 1W0 of rank 1 .* comes before 1B0"):
        S.check(Schedule("zb-h1", 2, 2, 2, early, [2, 2], [2, 1]), training=True)
    swapped = [list(good[0]), list(good[1])]
    a, b = swapped[1].index(Action("W", 1, 0)), swapped[1].index(Action("W", 1, 1))
    swapped[1][a], swapped[1][b] = swapped[1][b], swapped[1][a]
    with pytest.raises(ScheduleError, match=r"action 1W1 of rank 1 .* adds the weight "
                                            r"gradients of micro-batch 1 before those of "
                                            r"micro-batch 0"):
        S.check(Schedule("zb-h1", 2, 2, 2, swapped, [2, 2], [2, 1]), training=True)
    with pytest.raises(ScheduleError, match=r"action 1W1 is missing from rank 1's list"):
        S.check(Schedule("zb-h1", 2, 2, 2, [good[0], [a for a in good[1] if a !=
                                                      Action("W", 1, 1)]], [2, 2], [2, 1]),
                training=True)
    with pytest.raises(ScheduleError, match=r"holds 2 micro-batches' activations between F "
                                            r"and B, more than the schedule's bound 1"):
        S.check(Schedule("zb-h1", 2, 2, 2, good, [2, 2], [1, 1]), training=True)


def test_weight_pass_waits_for_its_place():
    """A backward's weight gradients are computed by ops that B's gradient
    built; W gives the ops that compute them alone (not the input
    gradients) a control input, so all of W waits for the actions before
    it, and the gradients are bitwise those of one backward."""
    import numpy as np
    import tensorflow as tf
    import keras
    from tarantella import _keras_internals as internals
    from tarantella.pipeline import stage

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                              keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(3)])
    x, dy = tf.random.stateless_normal((7, 6), (1, 2)), tf.random.stateless_normal((7, 3), (3, 4))

    @tf.function
    def step(split):
        inputs = tf.identity(x)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = model(inputs)
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        sources = list(model.trainable_variables) + [inputs]
        got = tape.gradient(out, sources, output_gradients=dy)
        w_grads, in_grads = got[:-1], got[-1:]
        if split:
            roots = stage._weight_only_roots(graph, first, w_grads, in_grads)
            # Every op of the weight gradients alone: the kernels'
            # products and the biases' sums.
            assert sorted(op.type for op in roots) == ["BiasAddGrad"] * 3 + ["MatMul"] * 3
            with tf.control_dependencies(in_grads):
                marker = tf.timestamp()
            internals.hold_back(roots, [marker])
            assert all(marker.op in op.control_inputs for op in roots)
        return got

    for a, b in zip(step(False), step(True)):
        assert np.array_equal(a.numpy(), b.numpy())


def test_bad_shapes_say_what_to_change():
    with pytest.raises(ScheduleError, match="multiple of the 2 ranks"):
        S.training("interleaved", 4, 2, 3)
    with pytest.raises(ScheduleError, match="num_stages=3 must be a multiple of the 2 ranks"):
        S.training("interleaved", 3, 2, 4)
    with pytest.raises(ScheduleError, match="use the interleaved schedule"):
        S.training("1f1b", 4, 2, 4)
    with pytest.raises(ScheduleError, match="transfer tag exceeds 32767"):
        S.training("interleaved", 4, 2, 8194)
    with pytest.raises(ScheduleError, match="the zb-h1 schedule runs one stage per rank"):
        S.training("zb-h1", 4, 2, 4)
    with pytest.raises(ScheduleError, match="num_stages=6 must be twice the 2 ranks"):
        S.training("zbv", 6, 2, 4)
