"""The timeline (TNT_TIMELINE): two ranks train a few steps through the
launcher; each must leave a well-formed Chrome trace with its steps, its
fusion starts and finish waits, each bucket's allreduce inside its step,
and the other collectives."""
import json
import os

import pytest

from conftest import ROOT, mpirun_command, run

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "timeline_worker.py")
NRANKS = 2
PHASES = {"M", "X", "i", "B", "E"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    import sys
    d = tmp_path_factory.mktemp("timeline")
    path = str(d / "trace.json")
    # Threshold 0: one bucket per tensor, so that every tensor has its allreduce.
    proc = run(mpirun_command(NRANKS, sys.executable, WORKER), timeout=300,
               env={"TNT_TIMELINE": path, "TNT_FUSION_THRESHOLD_KB": "0"})
    facts = {}
    for line in proc.stdout.splitlines():
        if line.startswith("FACTS "):
            f = json.loads(line[len("FACTS "):])
            facts[f["rank"]] = f
    assert sorted(facts) == list(range(NRANKS)), proc.stdout[-4000:]
    assert not os.path.exists(path), "with 2 ranks the name must carry the rank"
    out = {}
    for r in range(NRANKS):
        name = d / f"trace.rank{r}.json"
        assert name.exists(), f"rank {r} wrote no {name.name}: {sorted(os.listdir(d))}"
        text = name.read_text()
        assert text.rstrip().endswith("]"), "a finished run closes the JSON array"
        out[r] = (json.loads(text), facts[r])
    return out


def end_of(e):
    return e["ts"] + e.get("dur", 0.0)


def steps_of(events):
    """[(name, begin, end)] of the step spans, in order."""
    spans, open_ = [], {}
    for e in events:
        if e.get("cat") != "step":
            continue
        if e["ph"] == "B":
            open_[e["name"]] = e["ts"]
        elif e["ph"] == "E":
            spans.append((e["name"], open_.pop(e["name"]), e["ts"]))
    assert not open_, f"steps begun and never ended: {open_}"
    return spans


@pytest.mark.parametrize("rank", range(NRANKS))
def test_events_are_well_formed(traces, rank):
    events, facts = traces[rank]
    assert facts["enabled"] is True
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] in PHASES, e
        assert e["pid"] == rank, e
        assert isinstance(e["tid"], int) and isinstance(e["name"], str) and e["name"], e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] > 0, e
            assert isinstance(e["cat"], str), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    meta = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)]["name"] == f"rank {rank}"
    names = {tid: a["name"] for (n, tid), a in meta.items() if n == "thread_name"}
    used = {e["tid"] for e in events if e["ph"] != "M"}
    assert used <= set(names), f"threads without a name: {used - set(names)}"
    assert "main" in names.values() and "progress" in names.values(), names


@pytest.mark.parametrize("rank", range(NRANKS))
def test_each_thread_is_in_time_order_and_spans_nest(traces, rank):
    events, _ = traces[rank]
    last, stacks = {}, {}
    for e in events:
        if e["ph"] == "M":
            continue
        # A thread writes each event when it happens: a complete event at
        # its end, every other at its time stamp.
        t = end_of(e)
        assert t >= last.get(e["tid"], 0.0) - 0.01, f"out of order on thread {e['tid']}: {e}"
        last[e["tid"]] = t
        stack = stacks.setdefault(e["tid"], [])
        if e["ph"] == "B":
            stack.append(e["name"])
        elif e["ph"] == "E":
            assert stack and stack.pop() == e["name"], f"unmatched end: {e}"
    assert all(not s for s in stacks.values()), stacks


@pytest.mark.parametrize("rank", range(NRANKS))
def test_steps_hold_starts_waits_and_bucket_allreduces(traces, rank):
    events, facts = traces[rank]
    ntensors = facts["tensors"] + 1  # the gradients and the sample count
    steps = steps_of(events)
    assert [s[0] for s in steps] == [f"step {k}" for k in range(facts["steps"])]
    for (_, _, end), (_, begin, _) in zip(steps, steps[1:]):
        assert end <= begin, "steps must not overlap"
    buckets = [e for e in events if e["ph"] == "X" and e["name"].startswith("allreduce bucket")]
    starts = [e for e in events if e["ph"] == "i" and e["name"] == "fusion start"]
    waits = [e for e in events if e["ph"] == "X" and e["name"] == "fusion finish"]
    early = 0
    for name, begin, end in steps:
        def inside(evs):
            return [e for e in evs if begin <= e["ts"] <= end]
        mine = inside(buckets)
        # Every bucket of the step is reduced once, and begins before the
        # step ends: communication is part of the step.
        assert sorted(e["args"]["bucket"] for e in mine) == list(range(ntensors)), name
        for e in mine:
            assert e["name"] == f"allreduce bucket {e['args']['bucket']}"
            assert e["args"]["bytes"] > 0 and e["args"]["algorithm"], e
            assert e["args"]["status"] == 0, e
            assert begin <= e["ts"] < end, (name, e)
        assert sum(e["args"]["bytes"] for e in mine) == facts["gradient_bytes"] + 4
        started = inside(starts)
        assert sorted(e["args"]["tensor"] for e in started) == list(range(ntensors)), name
        assert len(inside(waits)) == ntensors, name
        # Overlap: a bucket's allreduce began while tensors were still
        # being started (backprop still running).
        early += min(e["ts"] for e in mine) < max(e["ts"] for e in started)
    assert early > 0, "no step reduced a bucket before its last tensor started"


@pytest.mark.parametrize("rank", range(NRANKS))
def test_other_collectives_carry_their_bytes(traces, rank):
    events, facts = traces[rank]
    by_name = {}
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "comm":
            by_name.setdefault(e["name"], []).append(e)
    # fit() broadcasts the master's weights after comparing their shapes.
    assert any(e["args"]["bytes"] >= facts["gradient_bytes"] for e in by_name["broadcast"])
    assert by_name["allgather"][0]["args"]["bytes"] > 0
    assert by_name["barrier"][0]["args"]["bytes"] == 0
    assert by_name["allreduce"], "the fusion set's agreement and the metrics are allreduces"
    for group in by_name.values():
        for e in group:
            assert "bytes" in e["args"] and "algorithm" in e["args"], e
