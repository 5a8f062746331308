#!/usr/bin/env python3
"""Sharded data parallelism: what a rank holds at ZeRO stages 0 to 3
(the method behind each figure: docs/research/benchmarks.md).

  memory    Adam and SGD with momentum, N = 1, 2, 4 ranks, stages 0 to 3 on
            a dense model of W bytes of weights: each rank's bytes held
            (weights, averaged-gradient buffers, optimizer state) and its
            peak RSS above its base, against the theory and the fusion buffers
  capacity  ranks limited (RLIMIT_DATA, set before the model is built) to
            their base + a multiple of W, Adam: stage 0 must fail for lack
            of memory, stage 2 train

    python3 tools/bench/zero_bench.py memory --json zero.jsonl [--quick]
    python3 tools/bench/zero_bench.py capacity --json zero_capacity.jsonl [--quick]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import bench_results
from bench_results import finish_config, new_config, write_results
from pipeline_bench import (FREED_MEMORY_LEAVES, PeakData, dense_stack, load_rank_files,
                            mpirun_cmd, proc_status_kib, reset_peak_rss, save_rank_file,
                            step_timer, tf_setup)

MIB = 1 << 20
STAGES, RANKS, OPTIMIZERS = (0, 1, 2, 3), (1, 2, 4), ("adam", "momentum")
# Bytes of optimizer state a float32 parameter has: Adam's two moments,
# SGD's momentum.
SLOT_BYTES = {"adam": 8, "momentum": 4}
# How the optimizer is built: by fit, while it traces the training step
# (what a user gets), or before fit (model.optimizer.build).
BUILT_BY_FIT, BUILT_FIRST = "built by fit", "built before fit"
# Memory: MEM_LAYERS dense layers of MEM_WIDTH units on MEM_WIDTH inputs
# (W = 64 MiB of float32 weights; --quick: QUICK_WIDTH, 16 MiB), global
# batch MEM_BATCH: activations are small beside the weights. Beside the
# grid, Adam at the sharded stages with the optimizer built before fit.
MEM_LAYERS, MEM_WIDTH, QUICK_WIDTH, MEM_BATCH = 4, 2048, 1024, 64
# Capacity: CAP_LAYERS dense layers of CAP_WIDTH units (W = 512 MiB) on
# CAP_RANKS ranks, Adam, each rank limited to its base + CAP_BUDGET_W x W.
# --quick (make test): QUICK_CAP_LAYERS of QUICK_CAP_WIDTH (W = 128 MiB),
# limited to the base + QUICK_CAP_BUDGET_W x W, which lies between the
# stages' needs (capacity_need_w): stage 0 must fail by arithmetic, stage 2
# keeps 0.6 W (77 MiB) beyond its need for TensorFlow's step. The room for
# gradient buckets waiting for their reduce-scatter (TNT_FUSION_IN_FLIGHT_MIB)
# is a layer in both: the default, 64 MiB, in the full run;
# QUICK_IN_FLIGHT_MIB in the quick one.
CAP_LAYERS, CAP_WIDTH, CAP_RANKS, CAP_BUDGET_W, CAP_BATCH = 8, 4096, 4, 2.5, 32
# Steps after the first: past the rounds in which the fusion sets time
# overlap on and off (TNT_OVERLAP=auto: 3 + 4 + 1), as a user's fit is.
CAP_STEPS = 8
QUICK_CAP_LAYERS, QUICK_CAP_WIDTH, QUICK_CAP_BUDGET_W, QUICK_IN_FLIGHT_MIB = 8, 2048, 3.1, 16
# Stage 3, given a build function, trains, predicts and saves its weights
# under the base + STAGE3_BUDGET_W x W; --quick: QUICK_STAGE3_BUDGET_W,
# where TensorFlow's step (about 30 MiB) is a larger share of W.
STAGE3_BUDGET_W, QUICK_STAGE3_BUDGET_W = 1.75, 2.0
JOB_ENV = ("TF_CPP_MIN_LOG_LEVEL", *FREED_MEMORY_LEAVES)
SETTINGS_PASSED = ("TNT_FUSION_IN_FLIGHT_MIB",)  # to the jobs, where set


def weights_bytes(layers, width):
    """The float32 weights of `layers` dense layers of `width` units on
    `width` inputs, known before the model is built."""
    return layers * (width * width + width) * 4


def theory_bytes(optimizer, stage, ranks, params):
    """What the theory says a rank holds, float32: weights (4 bytes a
    parameter), averaged gradients (4) and optimizer state (SLOT_BYTES);
    stage 1 keeps 1/N of the state, stage 2 also 1/N of the gradients,
    stage 3 also 1/N of the weights. Adam: 16, 8 + 8/N, 4 + 12/N, 16/N
    bytes a parameter; SGD with momentum: 12, 8 + 4/N, 4 + 8/N, 12/N."""
    slots = SLOT_BYTES[optimizer]
    per = {0: 8 + slots, 1: 8 + slots / ranks, 2: 4 + (4 + slots) / ranks,
           3: (8 + slots) / ranks}[stage]
    return per * params


def fusion_bytes(stage, ranks, params):
    """The most a rank holds at once to move gradients and gathered
    weights (float32, 4 bytes a parameter; none on one rank). Stage 0
    allreduces the gradients in buckets allocated once, for the whole
    gradient (4 P). Stage 1 keeps those, and gathers the updated parts a
    variable at a time (Shards.gather_some), three at most at once,
    counted here as 4 P more. Stage 2 holds its parts of the
    reduce-scatter's buckets (4 P / N) from their reduce-scatter to the
    step's finishes; their whole vectors exist from a bucket's first start
    to the end of its reduce-scatter, at most all at once (4 P: when the
    buckets wait for the network, or TNT_OVERLAP=off; gradients larger
    than TNT_FUSION_IN_FLIGHT_MIB wait for room instead, which the models
    here are not), and are freed before the gathers. Stage 3 holds the
    reduce-scatter's as stage 2 does; it gathers a layer at a time
    (gathered_bytes)."""
    if ranks == 1:
        return 0
    return {0: 4 * params, 1: 8 * params, 2: 4 * params / ranks + 4 * params,
            3: 4 * params / ranks + 4 * params}[stage]


def gathered_bytes(stage, ranks, params, layers):
    """The most weights a stage-3 rank holds gathered at once, of `layers`
    layers of equal size: three layers' (4 P / layers each). The forward
    pass gathers a layer while the one before it computes and frees the
    one before that; the backward pass gathers a layer again while the
    layer after it computes its backward pass, and the last layer keeps
    its forward pass's gather. 0 at the other stages and on one rank."""
    return 4 * params * min(3, layers) / layers if stage == 3 and ranks > 1 else 0


def capacity_need_w(stage, ranks, layers, in_flight_w):
    """What an Adam rank holds at once at most, in W (the model's float32
    weights, in `layers` layers of equal size), from what Tarantella
    allocates; `in_flight_w`: TNT_FUSION_IN_FLIGHT_MIB in W. Stage 0 (the
    least): the weights, their gradients and the two moments, 4 W (and
    the fusion buckets, W more, allocated whole). Stage 2 (the most): the
    weights (W); the parts the optimizer updates and their two moments
    (3 W / N); the averaged gradients' parts, in libtnt and then in the
    finishes' outputs (W / N); in the backward pass, which waits for the
    reduce-scatter (GradientReducer.reduce's pace), the buckets waiting
    for it (in_flight_w), one being filled and two layers' gradients
    (3 W / layers). Stage 3 (the most): the parts, their moments and the
    reduce-scatter's parts (4 W / N); in the backward pass three layers
    gathered (gathered_bytes), a layer's gradient and its bucket (2 W /
    layers); the finishes' outputs (W / N) exist after the backward pass,
    with no layer gathered. TensorFlow's step (its graph, the temporaries
    of the update) comes on top."""
    if stage == 3:
        return 4 / ranks + max((min(3, layers) + 2) / layers, 1 / ranks)
    return 4.0 if stage == 0 else 1 + 4 / ranks + in_flight_w + 3 / layers


# ------------------------------------------------------------------ worker

def dense_model(keras, layers, width):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((width,), name="x")
    return keras.Model(inputs, dense_stack(keras, inputs, width, layers, "z"), name="dense")


def make_optimizer(keras, name):
    return {"adam": lambda: keras.optimizers.Adam(1e-4),
            "momentum": lambda: keras.optimizers.SGD(1e-3, momentum=0.9)}[name]()


def nbytes(variables):
    import numpy as np
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


def held_bytes(model):
    """What the rank holds, through the variables and the fusion sets: the
    model's weights (those with a value: at stage 3 the trainable ones are
    in the parts), the optimizer's variables, the parts of the weights
    that it updates (stages 1 to 3), the averaged gradients' buffers of
    the fusion sets (the allreduce's buckets, kept; the reduce-scatter's
    parts, which a step holds from a bucket's reduce-scatter to its
    finishes), and the largest set's vector while in flight (reduce-scatter
    and allgather sets allocate it per round)."""
    import numpy as np
    from tarantella.pipeline.weights import allocated_bytes
    optimizer = model.optimizer
    shards = getattr(optimizer, "_tnt_shards", None)
    reducer = shards.reducer if shards is not None else model._tnt.resources.reducer
    kept = in_flight = 0
    for (mode, signature), fusion in reducer._sets.items():
        sizes = {i: np.dtype(dt).itemsize for i, _, dt in signature}
        count_id = max(sizes) + 1  # the sample count, a float32
        sizes[count_id] = 4
        whole = sum(n * sizes[i] for i, n, _ in signature) + 4
        if mode == "allreduce":
            kept += whole
            continue
        in_flight = max(in_flight, whole)
        if mode == "reduce_scatter":
            kept += sum((hi - lo) * size for i, size in sizes.items()
                        for lo, hi in [fusion.part(i)])
    parts = shards.parts if shards is not None else []
    return {"weights": allocated_bytes(model.weights),
            "optimizer_state": nbytes(optimizer.variables),
            "weight_parts": nbytes(parts), "gradient_buffers": kept,
            "fusion_in_flight": in_flight}


def worker(args):
    """Builds, compiles and trains the dense model at --zero-stage on every
    rank (with --predict-save, then predicts a batch and saves the weights),
    under a data-size limit of --budget x W above the base when given;
    writes the bytes held, the peaks above the base (RSS and data size)
    and, under a limit, the margin left, or the error."""
    import resource
    tf_setup()
    import numpy as np
    import keras
    import tarantella as tnt
    tnt.init()
    rank, ranks = tnt.get_rank(), tnt.get_size()
    x = np.random.default_rng(0).normal(
        size=(args.batch * (args.steps + 1), args.width)).astype(np.float32)
    # TensorFlow's runtime (thread pools, kernels) starts with a first fit
    # of a tiny model, so that the base is the runtime's and the rest the
    # model's (as pipeline_bench.py's capacity).
    tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    tiny.compile(optimizer="sgd", loss="mse")
    tiny.fit(x[:8, :4], x[:8, :4], epochs=1, verbose=0)
    del tiny
    whole = weights_bytes(args.layers, args.width)
    base_rss, base_data = proc_status_kib("VmRSS"), proc_status_kib("VmData")
    allowed = int(args.budget * whole) if args.budget > 0 else None
    if allowed is not None:
        resource.setrlimit(resource.RLIMIT_DATA,
                           (base_data * 1024 + allowed, resource.RLIM_INFINITY))
    doc = {"rank": rank, "ranks": ranks, "zero_stage": args.zero_stage,
           "optimizer": args.optimizer, "variant": args.variant,
           "weights_mib": round(whole / MIB, 2), "rss_base_mib": round(base_rss / 1024, 1),
           "vmdata_base_mib": round(base_data / 1024, 1),
           "limit_above_base_mib": round(allowed / MIB, 1) if allowed is not None else None}
    timer = step_timer(keras)

    def above_base(kib):
        return round((kib - base_rss) / 1024, 1)
    try:
        reset_peak_rss()
        with PeakData() as peak:
            # Built by tnt.Model (a build function): at stage 3 no rank
            # allocates the whole model.
            model = tnt.Model(lambda: dense_model(keras, args.layers, args.width),
                              zero_stage=args.zero_stage)
            model.compile(optimizer=make_optimizer(keras, args.optimizer), loss="mse")
            if args.variant == BUILT_FIRST:
                model.optimizer.build(model.trainable_variables)
            # The first step traces it, broadcasts the master's weights and
            # (built by fit) builds the optimizer's state.
            peak.phase("first_step")
            first = x[:args.batch]
            model.fit(first, first, batch_size=args.batch, epochs=1, verbose=0, shuffle=False)
            peak_first, after_first = proc_status_kib("VmHWM"), proc_status_kib("VmRSS")
            reset = reset_peak_rss()
            peak.phase("steps")
            rest = x[args.batch:]
            model.fit(rest, rest, batch_size=args.batch, epochs=1, verbose=0, shuffle=False,
                      callbacks=[timer])
            peak_steps = proc_status_kib("VmHWM")
            if args.predict_save:
                peak.phase("predict_save")
                doc["predicted"] = bool(np.isfinite(model.predict(first, verbose=0)).all())
                model.save_weights(os.path.join(args.work, "capacity.weights.h5"))
                doc["saved"] = True
        held = held_bytes(model)
        doc.update({f"held_{k}_mib": round(v / MIB, 2) for k, v in held.items()})
        held_total = sum(v for k, v in held.items() if k != "fusion_in_flight") / MIB
        doc.update(
            trained=True, held_total_mib=round(held_total, 2),
            peak_above_base_mib=above_base(max(peak_first, peak_steps) if reset else peak_steps),
            peak_first_step_above_base_mib=above_base(peak_first),
            peak_steps_above_base_mib=above_base(peak_steps) if reset else None,
            rss_after_first_step_above_base_mib=above_base(after_first),
            # What the peak is made of beyond what is held: what the first
            # step left (the traced step), and a step's own peak above that.
            kept_beyond_held_mib=round(above_base(after_first) - held_total, 1),
            step_peak_above_kept_mib=round((peak_steps - after_first) / 1024, 1)
            if reset else None,
            peak_data_above_base_mib=peak.mib,
            **{f"peak_data_{k}_above_base_mib": v for k, v in peak.phases_mib.items()},
            step_ms=round(statistics.median(timer.take()) * 1e3, 1))
        if allowed is not None:
            doc["margin_mib"] = round(allowed / MIB - peak.mib, 1)
    except Exception as e:  # the limit shows as ResourceExhausted, MemoryError or libtnt's
        lines = str(e).splitlines() or [""]
        what = next((line.strip() for line in lines if "OOM" in line or "memory" in line),
                    lines[0])
        what = what[what.find("OOM"):] if "OOM" in what else what  # not TensorFlow's op path
        doc.update(trained=False, error=f"{type(e).__name__}: {what[:300]}")
    save_rank_file(args.work, rank, doc)
    if not doc["trained"] and ranks > 1:
        os._exit(1)  # the other ranks wait for this one: end the job


def run_worker_job(args, ranks, stage, optimizer, variant, layers, width, batch, steps,
                   budget=0.0, predict_save=False):
    """The worker on `ranks` ranks, a fresh job (a peak never goes down);
    returns (the job ended well, its ranks' documents, its output's end)."""
    work = tempfile.mkdtemp(prefix=f"tnt-zerobench-{stage}-{ranks}-")
    env = dict(os.environ, **FREED_MEMORY_LEAVES,
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    cmd = mpirun_cmd(args, ranks, "--worker", "--work", work, "--zero-stage", str(stage),
                     "--optimizer", optimizer, "--variant", variant, "--layers", str(layers),
                     "--width", str(width), "--batch", str(batch), "--steps", str(steps),
                     "--budget", str(budget), *(["--predict-save"] if predict_save else []),
                     env=JOB_ENV + tuple(n for n in SETTINGS_PASSED if n in os.environ),
                     script=__file__)
    ok, tail = bench_results.run_job(
        cmd, args.job_timeout, lambda line: "Error" in line or "ZeRO stage" in line, env=env)
    docs = sorted(load_rank_files(work, ranks), key=lambda d: d["rank"])
    shutil.rmtree(work, ignore_errors=True)
    return ok, docs, tail


# ------------------------------------------------------------------ memory

def memory_row(optimizer, ranks, stage, variant, params, docs):
    """A row of the memory table: the figures of the rank with the largest
    peak, beside the theory and the fusion buffers."""
    worst = max(docs, key=lambda d: d["peak_above_base_mib"])
    return {"optimizer": optimizer, "ranks": ranks, "zero_stage": stage, "variant": variant,
            "oversubscribed": ranks > os.cpu_count(), "rank_of_peak": worst["rank"],
            "theory_mib": round(theory_bytes(optimizer, stage, ranks, params) / MIB, 1),
            "fusion_buffers_mib": round(fusion_bytes(stage, ranks, params) / MIB, 1),
            "gathered_block_mib": round(gathered_bytes(stage, ranks, params, MEM_LAYERS) / MIB, 1),
            **{k: v for k, v in worst.items()
               if k.startswith(("held_", "peak_", "kept_", "step_", "rss_after"))}}


def memory(args):
    width = QUICK_WIDTH if args.quick else MEM_WIDTH
    steps = 2 if args.quick else 4
    whole = weights_bytes(MEM_LAYERS, width)
    params = whole // 4
    cfg = new_config(
        layers=MEM_LAYERS, width=width, parameters=params, weights_mib=round(whole / MIB, 2),
        global_batch=MEM_BATCH, steps=steps, optimizers=list(OPTIMIZERS), ranks=list(RANKS),
        zero_stages=list(STAGES), quick=bool(args.quick), environment=FREED_MEMORY_LEAVES,
        fusion_threshold_kb=os.environ.get("TNT_FUSION_THRESHOLD_KB", "32 (the default)"),
        peak="VmHWM above the RSS before the model is built (after a tiny fit started "
             "TensorFlow's runtime), over building, the first step and the steps after it")
    jobs = [(o, n, s, BUILT_BY_FIT) for o in OPTIMIZERS for n in RANKS for s in STAGES]
    jobs += [("adam", n, s, BUILT_FIRST) for n in RANKS if n > 1 for s in STAGES if s]
    rows, per_rank, problems = [], [], cfg["problems"]
    for optimizer, ranks, stage, variant in jobs:
        ok, docs, tail = run_worker_job(args, ranks, stage, optimizer, variant, MEM_LAYERS,
                                        width, MEM_BATCH, steps)
        key = f"{optimizer}, {ranks} ranks, stage {stage}, {variant}"
        if not ok or len(docs) < ranks or not all(d["trained"] for d in docs):
            problems[key] = tail[-1500:]
            continue
        per_rank += docs
        rows.append(memory_row(optimizer, ranks, stage, variant, params, docs))
        r = rows[-1]
        print(f"memory: {key}: held {r['held_total_mib']:.0f} MiB, peak "
              f"{r['peak_above_base_mib']:.0f} MiB above the base (theory "
              f"{r['theory_mib']:.0f} + fusion {r['fusion_buffers_mib']:.0f})", flush=True)
    write_results(args.json, "zero", {"config": finish_config(cfg), "memory": rows,
                                      "ranks": per_rank})
    return 0 if rows else 1


# ------------------------------------------------------------------ capacity

def capacity(args):
    layers, width = (QUICK_CAP_LAYERS, QUICK_CAP_WIDTH) if args.quick else (CAP_LAYERS, CAP_WIDTH)
    budget = QUICK_CAP_BUDGET_W if args.quick else CAP_BUDGET_W
    stage3_budget = QUICK_STAGE3_BUDGET_W if args.quick else STAGE3_BUDGET_W
    ranks, whole = CAP_RANKS, weights_bytes(layers, width)
    if args.quick:
        os.environ["TNT_FUSION_IN_FLIGHT_MIB"] = str(QUICK_IN_FLIGHT_MIB)
    from tarantella import settings  # as the jobs read it
    in_flight = settings.get("TNT_FUSION_IN_FLIGHT_MIB") * MIB
    cfg = new_config(
        layers=layers, width=width, weights_mib=round(whole / MIB, 2), ranks=ranks,
        optimizer="adam", global_batch=CAP_BATCH, budget_times_weights=budget,
        stage3_budget_times_weights=stage3_budget, in_flight_mib=in_flight / MIB,
        need_times_weights={str(s): round(capacity_need_w(s, ranks, layers, in_flight / whole), 3)
                            for s in (0, 2, 3)},
        theory_times_weights={str(s): theory_bytes("adam", s, ranks, 1) / 4 for s in (0, 2, 3)},
        variant=BUILT_FIRST, quick=bool(args.quick), environment=FREED_MEMORY_LEAVES,
        oversubscribed=ranks > os.cpu_count())
    runs = [(0, budget), (2, budget), (3, stage3_budget)] + ([] if args.quick else [(2, 0.0)])
    rows, per_rank = [], []
    for stage, limit in runs:
        t0 = time.monotonic()
        ok, docs, tail = run_worker_job(args, ranks, stage, "adam", BUILT_FIRST, layers, width,
                                        CAP_BATCH, CAP_STEPS, limit, predict_save=stage == 3)
        run = f"stage {stage}, " + (f"limited to the base + {limit} W" if limit else "no limit")
        trained = len(docs) == ranks and all(d["trained"] for d in docs)
        rows.append({"run": run, "zero_stage": stage, "budget_times_weights": limit or None,
                     "trained": trained, "job_ok": ok, "ranks_reported": len(docs),
                     "seconds": round(time.monotonic() - t0, 1),
                     "tail": "" if ok else tail[-1500:]})
        per_rank += [dict(d, run=run) for d in docs]
        print(f"capacity: {run}: trained={trained}: " + "; ".join(
            f"rank {d['rank']}: " + (d.get("error") or (
                f"held {d['held_total_mib']} MiB, peak data {d['peak_data_above_base_mib']} MiB"
                + (f", margin {d['margin_mib']} MiB" if limit else "")
                + (", predicted and saved" if d.get("saved") else ""))) for d in docs),
            flush=True)
    write_results(args.json, "zero_capacity", {"config": finish_config(cfg), "runs": rows,
                                               "ranks": per_rank})
    return 0


# ------------------------------------------------------------------ main

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", choices=["memory", "capacity"])
    p.add_argument("--json", help="write the results file here")
    p.add_argument("--quick", action="store_true", help="smaller models, fewer steps")
    p.add_argument("--mpirun", default=os.environ.get("MPIRUN", "mpirun"))
    p.add_argument("--mpiflags", default=os.environ.get("MPIFLAGS", "--oversubscribe --bind-to none"
                                                        + (" --allow-run-as-root"
                                                           if os.geteuid() == 0 else "")))
    p.add_argument("--job-timeout", type=int, default=900,
                   help="most seconds one MPI job may take (default 900)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--zero-stage", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--optimizer", default="adam", help=argparse.SUPPRESS)
    p.add_argument("--variant", default=BUILT_BY_FIT, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=MEM_LAYERS, help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=MEM_WIDTH, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=MEM_BATCH, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--predict-save", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    if not args.mode or not args.json:
        p.error("give a mode (memory, capacity) and --json PATH")
    bench_results.stop_on_signals()
    return {"memory": memory, "capacity": capacity}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
