"""Pipeline schedules as data (tarantella/pipeline/schedule.py), without
ranks: the action lists of GPipe, 1F1B and interleaved 1F1B, the checker
that refuses lists that would deadlock, misorder their passes or exceed
their memory bound, and the bubble each schedule allows."""
import pytest

from tarantella.pipeline import schedule as S
from tarantella.pipeline.schedule import Action, Schedule, ScheduleError

GRID = [(k, m) for k in (2, 3, 4) for m in (1, 2, 3, 5, 8, 16)]


def passes(schedule, rank):
    """Rank's (kind, stage, micro-batch) of its forward and backward passes."""
    return [(a.kind, a.stage, a.micro_batch) for a in schedule.actions[rank]
            if a.kind in ("F", "B")]


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


def test_tags_are_unique_between_each_pair_of_ranks():
    """Two chunks of one rank send to the same rank: their tags differ;
    with one stage per rank they stay 2 i (+ 1 backward)."""
    schedule = S.training("interleaved", 4, 2, 4)
    seen = {}
    for actions in schedule.actions:
        for a in actions:
            if a.kind.startswith("SEND"):
                peer, tag = schedule.transfer(a)
                key = (schedule.rank_of(a.stage), peer, tag)
                assert key not in seen, (a, seen.get(key))
                seen[key] = a
                # The receive names the same transfer from the other side.
                recv = Action("RECV" + a.kind[4:], a.stage + (1 if a.kind == "SEND_F" else -1),
                              a.micro_batch)
                assert schedule.transfer(recv) == (schedule.rank_of(a.stage), tag)
    one = S.training("1f1b", 3, 3, 5)
    assert [one.transfer(Action(kind, 1, i)) for i in range(5)
            for kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B")] == \
        [(peer, 2 * i + b) for i in range(5) for peer, b in ((2, 0), (0, 0), (0, 1), (2, 1))]


def test_inference():
    schedule = S.inference(4, 2, 3)
    assert passes(schedule, 0) == [("F", 0, i) for i in range(3)] + [("F", 2, i)
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


def test_bad_shapes_say_what_to_change():
    with pytest.raises(ScheduleError, match="multiple of the 2 ranks"):
        S.training("interleaved", 4, 2, 3)
    with pytest.raises(ScheduleError, match="num_stages=3 must be a multiple of the 2 ranks"):
        S.training("interleaved", 3, 2, 4)
    with pytest.raises(ScheduleError, match="use the interleaved schedule"):
        S.training("1f1b", 4, 2, 4)
    with pytest.raises(ScheduleError, match="transfer tag exceeds 32767"):
        S.training("interleaved", 4, 2, 8194)
