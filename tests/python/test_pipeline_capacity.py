"""A model whose weights exceed what one process may hold trains, predicts
and is saved on pipeline stages built from a function, each holding its
own stage only.

This is the quick form of the benchmark's capacity stage
(tools/bench/pipeline_bench.py capacity --quick): each process is limited
(RLIMIT_DATA) to its data size before the model is built plus 0.9x the
whole model's weights W (8 dense layers of 4096 units, 512 MiB). Serial
Keras cannot hold the model under that limit: its weights alone are more
than 0.9 W, so it must fail for lack of memory. On 4 stages every rank
must hold exactly its two layers' weights, W / 4, and train, predict and
save the model (a .keras file and a sharded checkpoint, which the master
writes from the stages' values streamed to it) under the same limit. How
much room each rank has left is machine-dependent (TensorFlow's
temporaries) and is what the benchmark reports."""
import os
import sys

import pytest

from conftest import ROOT, load_module, run

BENCH = os.path.join(ROOT, "tools", "bench", "pipeline_bench.py")
bench_results = load_module("tools/bench/bench_results.py")

pytestmark = pytest.mark.ranks

MIB = 1 << 20
MEMORY_ERRORS = ("OOM", "ResourceExhausted", "MemoryError", "bad_alloc")


def test_stages_built_from_a_function_train_a_model_larger_than_the_limit(tmp_path):
    out = tmp_path / "capacity.jsonl"
    run([sys.executable, BENCH, "capacity", "--quick", "--json", str(out)], timeout=900)
    doc = bench_results.read_results(out)
    cfg, runs = doc["config"], {r["run"]: r for r in doc["runs"]}

    def ranks_of(name):
        return [d for d in doc["ranks"] if d["run"] == name]

    assert not runs["serial, limited"]["trained"]
    error = ranks_of("serial, limited")[0]["error"]
    assert any(word in error for word in MEMORY_ERRORS), error

    stages = cfg["stages"]
    name = f"{stages} stages, build_fn, SGD, limited"
    assert runs[name]["trained"], runs[name]
    ranks = ranks_of(name)
    assert [d["rank"] for d in ranks] == list(range(stages))
    # The whole model's float32 weights: dense layers of width x width + width.
    whole = cfg["layers"] * (cfg["width"] * cfg["width"] + cfg["width"]) * 4
    for d in ranks:
        assert d["predicted"] and d["saved"], d
        # Two layers of 4096 x 4096 + 4096 float32 weights, to the 0.1 MiB
        # the benchmark rounds to.
        assert abs(d["held_weights_mib"] - whole / stages / MIB) <= 0.05, d
        assert d["limit_above_base_mib"] < 0.95 * whole / MIB
