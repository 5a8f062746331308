#!/usr/bin/env python3
"""Plain and sharded data parallelism (zero_stage 0-3) of real model sizes,
projected to 8-1024 simulated hosts at a published device's step time.

project_scale.py projects the benchmark's small models at this machine's
CPU step times. This projects two models users train on accelerators:
ResNet-50 (25.6 M parameters) and a GPT of 1.3 B parameters (GPT-3 XL's
shape: 24 blocks of width 2048, a vocabulary of 50257, tied embeddings).

--measure: each model trains 2 ranks here (zero_stage=0, TNT_TIMELINE) and
the traces give, for every variable, when its gradient started its fusion
bucket, as a share of the step's compute. ResNet-50 runs whole, on 96 x 96
images; the GPT runs at 1/8 of its width (256) with the vocabulary and the
sequence (128) cut so that the head's and the attention's shares of a
block's work are the real model's (V / (12 l h) and s / (6 h) as in
Narayanan et al., SC'21), and each variable's bytes are scaled to the
real model's (x 64 for a matrix, x 8 for a vector: every dimension x 8).

--project: the step of a rank on N hosts (one rank a host, fat-trees at
100 and 400 Gbit/s) at a published step time of the device, the gradients
ready at the measured shares of it, in fusion buckets of 25 MiB (PyTorch
DDP's bucket_cap_mb), each bucket's collective timed by the simulated
libtnt (scale_bench.py's runs of allreduce, reduce-scatter and
allgather), the buckets one after another from their readiness
(project_scale.step_ms). What each zero_stage moves, as Tarantella runs it:
stage 0 allreduces the buckets during the backward pass; stage 1 as well,
and gathers the updated parts after the update; stage 2 reduce-scatters
during the backward pass and gathers after the update; stage 3 gathers the
whole weights before the forward pass and reduce-scatters during the
backward pass. Neither gather overlaps compute (a layer-at-a-time gather
would overlap the forward pass: E_gather_behind_forward is the bound of
one that hides behind the compute until the first gradient is ready).
E(N) = compute / step. Each case also with the gradients in 16 bits
(TNT_COMPRESSION=bf16: half their bytes; the gathered weights travel
whole).

    for c in allreduce reduce_scatter allgather; do
      python3 tools/research/scale_bench.py --scale --impls tnt --collective $c \
        --hosts 8,64,256,512,1024 --per-host 1 --gbit 100,400 --max 16M \
        --out bench/results/scale_zero_$c.jsonl
    done
    python3 tools/research/project_zero.py --measure --out bench/results/scale_zero_timelines.jsonl
    python3 tools/research/project_zero.py --project --out bench/results/scale_zero_projection.jsonl

(make bench STAGES=scale runs the same; beyond 16 MiB a collective's time
grows at the rate of its 16 MiB run.)

Device step times (a rank's compute, per-rank batch):
  ResNet-50, 256 images: V100 1270 images/s (NVIDIA DeepLearningExamples,
  TensorFlow ResNet-50 v1.5, mixed precision and XLA, the README's figure
  as quoted in its issue 837) and A100 2600 images/s (pytorch-image-models
  issue 1491, AMP, channels-last).
  GPT 1.3 B, 8 sequences of 1024: 62.4 TFLOP/s sustained by Megatron-LM
  v1.0's 1.2 B-parameter GPT-2 on one V100 (NVIDIA ADLR, "MegatronLM's
  Supercharged V1.0", 2020), the step's FLOPs by Narayanan et al.'s count
  (72 B s l h^2 (1 + s/(6h) + V/(12 l h)), no recomputation).
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
sys.path.insert(0, HERE)
from bench_results import read_results, write_results  # noqa: E402
from project_scale import curves, step_ms  # noqa: E402
from step_timeline import load_trace, spans, union_ms  # noqa: E402

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
# --project's inputs: --measure's results and scale_bench.py's runs of each
# collective (see the module's documentation), in --results.
INPUTS = {"timelines": "scale_zero_timelines.jsonl",
          **{c: f"scale_zero_{c}.jsonl" for c in COLLECTIVES}}
BUCKET_BYTES = 25 * 2**20
# TNT_COMPRESSION: the factor by which it narrows the gradients' bytes.
COMPRESSIONS = {"none": 1, "bf16": 2}
GBITS = (100.0, 400.0)
STAGES = (0, 1, 2, 3)
GPT = {"layers": 24, "width": 2048, "vocab": 50257, "seq": 1024, "batch": 8, "heads": 16}
SHRINK = 8  # the measured GPT's width, vocabulary and sequence: the real ones / SHRINK


def gpt_step_ms(tflops):
    """The 1.3 B GPT's step at `tflops` sustained (Narayanan et al.'s count)."""
    b, s, layers, h, v = GPT["batch"], GPT["seq"], GPT["layers"], GPT["width"], GPT["vocab"]
    flops = 72 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    return flops / (tflops * 1e12) * 1e3


MODELS = {
    "resnet50": {"per_rank_batch": 256, "scale": 1,
                 "devices": {"V100": 256 / 1270 * 1e3, "A100": 256 / 2600 * 1e3}},
    "gpt1.3b": {"per_rank_batch": GPT["batch"], "scale": SHRINK,
                "devices": {"V100": gpt_step_ms(62.4)}},
}


# ------------------------------------------------------------- the worker


def build(name):
    import keras
    L = keras.layers
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(96, 96, 3), classes=1000)
    d, seq = GPT["width"] // SHRINK, GPT["seq"] // SHRINK
    vocab, heads = GPT["vocab"] // SHRINK, GPT["heads"]

    class Causal(L.Layer):
        """Self-attention of `heads` heads over the fused q, k, v."""

        def call(self, qkv):
            ops = keras.ops
            q, k, v = ops.split(qkv, 3, axis=-1)

            def split(t):
                return ops.transpose(ops.reshape(t, (-1, seq, heads, d // heads)), (0, 2, 1, 3))

            q, k, v = split(q), split(k), split(v)
            att = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / (d // heads) ** 0.5
            mask = ops.triu(ops.ones((seq, seq)), k=1) * -1e9
            out = ops.matmul(ops.softmax(att + mask, axis=-1), v)
            return ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, seq, d))

    class TiedHead(L.Layer):
        def __init__(self, embedding):
            super().__init__()
            self.embedding = embedding

        def call(self, x):
            return keras.ops.matmul(x, keras.ops.transpose(self.embedding.embeddings))

    tokens = keras.Input((seq,), dtype="int32")
    embed = L.Embedding(vocab, d)
    x = embed(tokens) + L.Embedding(seq, d)(keras.ops.arange(seq))
    for _ in range(GPT["layers"]):
        a = Causal()(L.Dense(3 * d)(L.LayerNormalization()(x)))
        x = x + L.Dense(d)(a)
        m = L.Dense(4 * d, activation="gelu")(L.LayerNormalization()(x))
        x = x + L.Dense(d)(m)
    logits = TiedHead(embed)(L.LayerNormalization()(x))
    return keras.Model(tokens, logits)


def worker(args):
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    import keras
    import tarantella as tnt
    model = build(args.model)
    n = args.per_rank_batch * tnt.get_size() * args.steps
    rng = np.random.default_rng(0)
    if args.model == "resnet50":
        x = rng.random((n, 96, 96, 3), dtype=np.float32)
        y = rng.integers(0, 1000, n)
    else:
        seq, vocab = GPT["seq"] // SHRINK, GPT["vocab"] // SHRINK
        x = rng.integers(0, vocab, (n, seq)).astype(np.int32)
        y = rng.integers(0, vocab, (n, seq))
    model = tnt.Model(model)
    model.compile(keras.optimizers.SGD(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=args.model != "resnet50"))
    model.fit(x, y, batch_size=args.per_rank_batch * tnt.get_size(), epochs=1, verbose=0)
    if tnt.get_rank() == 0:
        with open(args.variables, "w") as f:
            json.dump([{"path": v.path, "shape": list(v.shape)}
                       for v in model.trainable_variables], f)
    return 0


# ------------------------------------------------------------- measure


def readiness(events, skip):
    """Per step of one rank's trace, the first `skip` left out: (compute_ms,
    {tensor id: ms from the step's start to when its gradient was ready})."""
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["ph"] == "X" and e["name"] == "fusion finish"]
    starts = [(e["ts"], e["args"]["tensor"]) for e in events
              if e["ph"] == "i" and e["name"] == "fusion start"]
    out = []
    for _, sb, se in spans(events, "step")[skip:]:
        mine = {t: (ts - sb) / 1e3 for ts, t in starts if sb <= ts < se}
        if not mine:
            continue
        # A start op runs when TensorFlow gets to it, which may be long
        # after its gradient exists; backprop computes the gradients in
        # order (the highest id first), so a gradient exists by the time any
        # later one has started.
        ready, earliest = {}, float("inf")
        for t in sorted(mine):
            earliest = min(earliest, mine[t])
            ready[t] = earliest
        out.append(((se - sb) / 1e3 - union_ms(waits, sb, se), ready))
    return out


def profile(model, trace_files, variables, skip):
    """Every variable's gradient readiness as a share of the compute (the
    median over steps and ranks) and its bytes in the real model."""
    steps = [s for path in trace_files for s in readiness(load_trace(path), skip)]
    if not steps:
        sys.exit(f"project_zero: {model}: no timed steps in {trace_files}")
    scale = MODELS[model]["scale"]
    rows = []
    for i, v in enumerate(variables):
        shares = [min(ready[i] / compute, 1.0) for compute, ready in steps if i in ready]
        elements = 1
        for dim in v["shape"]:
            elements *= dim * scale
        rows.append({"variable": i, "path": v["path"], "bytes": 4 * elements,
                     "ready_share": round(statistics.median(shares), 4)})
    return {"model": model, "steps": len(steps),
            "compute_ms": round(statistics.median(c for c, _ in steps), 3)}, rows


def measure(args):
    tnt = shutil.which("tarantella")
    if tnt is None:
        sys.exit("project_zero: `tarantella` is not on PATH (make install)")
    models, variables = [], []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as d:
            trace, names = os.path.join(d, "trace.json"), os.path.join(d, "variables.json")
            cmd = [tnt, "--no-gpu", "-n", "2", "--run-dir", os.path.join(d, "run"),
                   "-x", f"TNT_TIMELINE={trace}", "TNT_OVERLAP=on", "TF_CPP_MIN_LOG_LEVEL=2",
                   "--", sys.executable, os.path.abspath(__file__), "worker", "--model", model,
                   "--per-rank-batch", str(args.per_rank_batch), "--steps",
                   str(args.steps + args.skip), "--variables", names]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            files = sorted(glob.glob(os.path.join(d, "trace.rank*.json")))
            if p.returncode != 0 or len(files) != 2:
                sys.exit(f"project_zero: {model}: exit {p.returncode}, traces {files}\n"
                         f"{p.stderr[-3000:]}")
            head, rows = profile(model, files, json.load(open(names)), args.skip)
            models.append(head)
            variables += [{"model": model, **r} for r in rows]
            print(f"{model}: {len(rows)} variables, {sum(r['bytes'] for r in rows) / 2**20:.0f} "
                  f"MiB of real gradients, measured step compute {head['compute_ms']} ms",
                  flush=True)
    config = {"ranks": 2, "per_rank_batch_measured": args.per_rank_batch,
              "steps": args.steps, "skipped_steps": args.skip, "gpt": GPT, "shrink": SHRINK}
    return {"config": config, "models": models, "variables": variables}


# ------------------------------------------------------------- project


def buckets(variables, compute_ms):
    """libtnt's plan (src/fusion/planner.h) of the gradients in backprop
    order, BUCKET_BYTES each: [{ready_ms, bytes}], ready when its last
    member is."""
    out, open_ = [], None
    for v in sorted(variables, key=lambda v: -v["variable"]):
        if open_ is None:
            open_ = {"ready_ms": 0.0, "bytes": 0}
            out.append(open_)
        open_["bytes"] += v["bytes"]
        open_["ready_ms"] = max(open_["ready_ms"], v["ready_share"] * compute_ms)
        if open_["bytes"] >= BUCKET_BYTES:
            open_ = None
    return out


def stage_step(stage, prof, allreduce, reduce_scatter, allgather, narrowing=1, hidden=0.0):
    """A rank's step (ms) at `stage`, from the profile's buckets and the
    collectives' curves; the gradients' bytes divided by `narrowing` (2:
    TNT_COMPRESSION's 16 bits), the gathered weights' whole, `hidden` ms of
    the gather behind compute."""
    gather = max(0.0, sum(allgather.ms(b["bytes"]) for b in prof["buckets"]) - hidden)
    if stage == 0:
        return step_ms(prof, allreduce, share=narrowing)
    if stage == 1:
        return step_ms(prof, allreduce, share=narrowing) + gather
    return step_ms(prof, reduce_scatter, share=narrowing) + gather


def project(args):
    paths = {k: os.path.join(args.results, name) for k, name in INPUTS.items()}
    timelines = read_results(paths["timelines"])
    coll = {c: read_results(paths[c]) for c in COLLECTIVES}
    rows = []
    for head in timelines["models"]:
        model = head["model"]
        variables = [v for v in timelines["variables"] if v["model"] == model]
        for device, compute in MODELS[model]["devices"].items():
            bk = buckets(variables, compute)
            prof = {"compute_ms": compute, "buckets": bk,
                    "tail_ms": compute - max(b["ready_ms"] for b in bk)}
            forward = min(b["ready_ms"] for b in bk)
            for gbit in GBITS:
                c = {k: curves(v, gbit) for k, v in coll.items()}
                hosts = sorted(set(c["allreduce"]) & set(c["reduce_scatter"])
                               & set(c["allgather"]))
                for n in hosts:
                    for stage in STAGES:
                        for compression, narrowing in COMPRESSIONS.items():
                            curves_n = (c["allreduce"][n], c["reduce_scatter"][n],
                                        c["allgather"][n])
                            s = stage_step(stage, prof, *curves_n, narrowing)
                            # The bound of a gather that overlaps the forward
                            # pass (until the first gradient is ready).
                            bound = stage_step(stage, prof, *curves_n, narrowing, forward)
                            rows.append({"model": model, "device": device, "gbit": gbit,
                                         "hosts": n, "zero_stage": stage,
                                         "compression": compression,
                                         "compute_ms": round(compute, 3),
                                         "step_ms": round(s, 3), "E": round(compute / s, 4),
                                         "E_gather_behind_forward": round(compute / bound, 4)})
                            print(json.dumps(rows[-1]), flush=True)
    config = {"inputs": sorted(INPUTS.values()),
              "bucket_bytes": BUCKET_BYTES,
              "device_step_ms": {m: {d: round(t, 3) for d, t in spec["devices"].items()}
                                 for m, spec in MODELS.items()},
              "gradient_bytes": {h["model"]: sum(v["bytes"] for v in timelines["variables"]
                                                 if v["model"] == h["model"])
                                 for h in timelines["models"]}}
    return {"config": config, "results": rows}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        w = argparse.ArgumentParser(prog="project_zero.py worker")
        w.add_argument("--model", choices=list(MODELS), required=True)
        w.add_argument("--per-rank-batch", type=int, required=True)
        w.add_argument("--steps", type=int, required=True)
        w.add_argument("--variables", required=True)
        return worker(w.parse_args(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--measure", action="store_true")
    mode.add_argument("--project", action="store_true")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--per-rank-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--skip", type=int, default=3, help="first steps of a trace left out")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--results", default=RESULTS,
                   help="--project: where " + ", ".join(INPUTS.values()) + " are")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.measure:
        doc = measure(args)
        write_results(args.out, "scale_zero_timelines", doc)
    else:
        write_results(args.out, "scale_zero_projection", project(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
