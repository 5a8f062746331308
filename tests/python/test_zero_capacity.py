"""Sharded data parallelism trains, under a per-rank memory limit that plain
data parallelism cannot meet, a model on the same ranks.

This is the quick form of the benchmark's capacity mode
(tools/bench/zero_bench.py capacity --quick): 8 dense layers of 2048 units
(W = 128 MiB of float32 weights), Adam, 4 ranks, each limited (RLIMIT_DATA)
to its data size before the model is built plus 3.1 W. At stage 0 a rank
holds the weights, their gradients and Adam's two moments, 4 W, more than
the limit: it must fail for lack of memory. At stage 2 a rank holds the
weights (W), the quarter of them that it updates and their two moments
(3 W / 4), its quarter of the averaged gradients (W / 4), and in the
backward pass, which waits for the reduce-scatter, the buckets waiting
for it (TNT_FUSION_IN_FLIGHT_MIB, 16 MiB here: W / 8), one being filled
and two layers' gradients (3 W / 8): 2.5 W at most, which leaves 0.6 W
(77 MiB) for TensorFlow's step; it must train (the peak measured 2.6 W
on the reference host; a backward pass that runs ahead of the
reduce-scatter holds every gradient at once, and took 3.3 to 3.6 W).

Stage 3, given a build function, is limited to 2 W: it holds a quarter of
the weights, their two moments and its quarter of the averaged gradients
(W), and in the backward pass three layers gathered at once (3 W / 8), a
layer's gradient and its bucket (2 W / 8): 1.625 W, which leaves 0.375 W
(48 MiB) for TensorFlow's step (the peak measured 1.6 W on the reference
host); it must train, predict and save its weights.
"""
import os
import sys

import pytest

from conftest import ROOT, load_module, run

BENCH = os.path.join(ROOT, "tools", "bench", "zero_bench.py")
bench_results = load_module("tools/bench/bench_results.py")

pytestmark = pytest.mark.ranks

MIB = 1 << 20
MEMORY_ERRORS = ("OOM", "ResourceExhausted", "MemoryError", "bad_alloc", "out of memory")


def test_stages_2_and_3_train_where_stage_0_cannot(tmp_path):
    out = tmp_path / "zero_capacity.jsonl"
    run([sys.executable, BENCH, "capacity", "--quick", "--json", str(out)], timeout=600)
    doc = bench_results.read_results(out)
    cfg, runs = doc["config"], {r["zero_stage"]: r for r in doc["runs"]}
    ranks, budget, need = cfg["ranks"], cfg["budget_times_weights"], cfg["need_times_weights"]
    # The limit lies between the stages' needs, by arithmetic.
    assert need["2"] + 0.5 < budget < need["0"], cfg
    assert need["3"] + 0.25 < cfg["stage3_budget_times_weights"] < need["2"], cfg

    def ranks_of(stage):
        return [d for d in doc["ranks"] if d["run"] == runs[stage]["run"]]

    assert not runs[0]["trained"], runs[0]
    errors = [d["error"] for d in ranks_of(0) if not d["trained"]]
    assert errors and all(any(w in e for w in MEMORY_ERRORS) for e in errors), errors

    assert runs[2]["trained"], runs[2]
    docs = ranks_of(2)
    assert sorted(d["rank"] for d in docs) == list(range(ranks))
    # The float32 weights of dense layers of width x width + width.
    whole = cfg["layers"] * (cfg["width"] * cfg["width"] + cfg["width"]) * 4 / MIB
    for d in docs:
        # Every rank holds the whole weights and a quarter of everything
        # else (the parts follow the fusion buckets' blocks: a quarter to a
        # few KiB), to the 0.01 MiB the benchmark rounds to.
        assert abs(d["held_weights_mib"] - whole) <= 0.01, d
        assert abs(d["held_weight_parts_mib"] - whole / ranks) <= 0.02, d
        assert abs(d["held_gradient_buffers_mib"] - whole / ranks) <= 0.02, d
        assert abs(d["held_optimizer_state_mib"] - 2 * whole / ranks) <= 0.04, d
        assert d["limit_above_base_mib"] == round(budget * whole, 1)
        assert d["margin_mib"] > 0, d
    # The parts of the ranks make up the model.
    assert abs(sum(d["held_weight_parts_mib"] for d in docs) - whole) <= 0.05

    assert runs[3]["trained"], runs[3]
    docs = ranks_of(3)
    assert sorted(d["rank"] for d in docs) == list(range(ranks))
    for d in docs:
        # The weights are the parts alone.
        assert d["held_weights_mib"] == 0, d
        assert abs(d["held_weight_parts_mib"] - whole / ranks) <= 0.02, d
        assert abs(d["held_optimizer_state_mib"] - 2 * whole / ranks) <= 0.04, d
        assert d["limit_above_base_mib"] == round(cfg["stage3_budget_times_weights"] * whole, 1)
        assert d["margin_mib"] > 0 and d["predicted"] and d["saved"], d
