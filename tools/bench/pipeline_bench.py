#!/usr/bin/env python3
"""Pipeline parallelism: its bubble, its memory, and where it beats data parallelism
(the method behind each figure: docs/research/benchmarks.md).

  bubble       step time of 2 and 3 stages (and interleaved 1F1B, ZB-H1 and
               ZB-H2) against M micro-batches, beside its ideal and the
               schedule's bound
  schedules    every schedule (1F1B, GPipe, interleaved, ZB-H1, ZB-H2, ZBV) on 2
               ranks at M = 2, 4, 8, 16: step, ideal, idle share and bound
               (a table for information, not a stage of make bench)
  memory       each rank's peak RSS for GPipe, 1F1B and interleaved against M
  traced       1F1B's traced step against M: its tracing time, its memory and
               its ops
  capacity     a model too large for a process's memory limit trains on stages
  sim_cluster  pipelined against data-parallel throughput on 2 simulated
               hosts at 1 Gbit/s (root)

    python3 tools/bench/pipeline_bench.py bubble --json pipeline_bubble.jsonl [--quick]
    python3 tools/bench/pipeline_bench.py schedules --json pipeline_schedules.jsonl [--quick]
    python3 tools/bench/pipeline_bench.py memory --json pipeline_memory.jsonl [--quick]
    python3 tools/bench/pipeline_bench.py traced --json pipeline_traced.jsonl [--quick]
    python3 tools/bench/pipeline_bench.py capacity --json pipeline_capacity.jsonl [--quick]
    sudo python3 tools/bench/pipeline_bench.py sim_cluster --json pipeline_sim_cluster.jsonl
"""
import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time

import bench_results
from bench_results import finish_config, new_config, traces_dir, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
MICRO_BATCHES = (1, 2, 4, 8)
# Interleaved 1F1B beside them: 2 ranks of INTERLEAVED_CHUNKS chunks each.
INTERLEAVED_CHUNKS, INTERLEAVED_M = 2, (4, 8)
MEM_INTERLEAVED_M = (2, 4, 8)  # the memory stage's (M a multiple of the 2 ranks)
TRACED_M = (4, 8, 16, 32)  # the traced stage's (1F1B on the memory stage's model)
# The zero-bubble schedules beside them, on 2 and 3 ranks; ZBV on 2 ranks
# of 2 chunks each.
ZERO_BUBBLE, ZERO_BUBBLE_M = ("zb-h1", "zb-h2"), (4, 8)

# Bubble: every stage is LAYERS dense layers of WIDTH units on micro-batches
# of MICRO samples: 14 ms per stage and micro-batch on the reference host, so
# that the fixed cost of a Keras step (its dispatch, the optimizer, the global
# loss: about 4 ms) does not hide the schedule's own cost.
BUBBLE_WIDTH, BUBBLE_LAYERS, BUBBLE_MICRO = 1024, 4, 64

# Memory: a (MEM_POSITIONS x MEM_CHANNELS) activation per sample, made from
# a MEM_CHANNELS input by repetition; every stage holds a small dense layer
# and MEM_TANH elementwise layers whose outputs the backward pass keeps.
MEM_POSITIONS, MEM_CHANNELS, MEM_TANH, MEM_MICRO = 2048, 64, 3, 8
# The memory and capacity stages' environment. TensorFlow's oneDNN allocator
# keeps freed buffers in the process, and glibc serves buffers below its
# dynamic mmap threshold (up to 32 MiB) from a heap that rarely shrinks:
# either way memory freed by one step stays in the RSS and the data size,
# which would then measure the allocators' caches rather than what training
# holds. Without oneDNN and with buffers of 1 MiB and more mapped on their
# own, freed memory returns to the system.
FREED_MEMORY_LEAVES = {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}

# Where pipelining wins: SIM_LAYERS dense layers of SIM_WIDTH units (about
# 48 MiB of float32 weights), cut in the middle; global batch SIM_BATCH in
# SIM_MICRO micro-batches.
SIM_IN, SIM_WIDTH, SIM_OUT, SIM_BATCH, SIM_MICRO = 1024, 2048, 16, 64, 4
SIM_LINK_BPS = 1e9
# The schedules of one stage per rank, each trained in the same job: the
# pipelined throughput is the best one's.
SIM_SCHEDULES = ("1f1b", "gpipe", "zb-h1", "zb-h2")

# Capacity: CAP_LAYERS dense layers of CAP_WIDTH units (512 MiB of float32
# weights, W), cut into CAP_STAGES stages of two layers; each process may
# hold CAP_BUDGET_W x W beyond what it holds before the model is built:
# less than the whole model's weights, so serial Keras, and stages that
# build the whole model first, cannot even build it. Besides its weights a
# stage's step holds the sum of its micro-batches' gradients, a layer's new
# gradients and the optimizer's temporaries (measured: 1.8 W / K above the
# weights with SGD, 3.8 W / K with momentum, the latter one W / K of
# momentums) and TensorFlow's traced step (about 40 MiB, whatever the
# model): W is large enough for that fixed part to stay small beside it.
CAP_WIDTH, CAP_LAYERS, CAP_BATCH, CAP_STAGES, CAP_BUDGET_W = 4096, 8, 32, 4, 0.9
# The memory table: each rank's peak against the number of stages, for
# these optimizers, without a limit (K = 1: serial Keras).
TABLE_STAGES, TABLE_OPTIMIZERS = (1, 2, 4), ("sgd", "adam")
TABLE_NEED_TIMES_WEIGHTS = {"sgd": 2, "adam": 4}  # the whole model's need, in W


# ------------------------------------------------------------------ helpers

def pipeline_schedule():
    """The schedule the pipelined runs use (TNT_PIPELINE_SCHEDULE)."""
    from tarantella import settings
    return settings.get("TNT_PIPELINE_SCHEDULE")


def proc_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def tf_setup():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return tf


def step_timer(keras):
    class StepTimer(keras.callbacks.Callback):
        """Seconds between consecutive batch ends of each fit."""

        def __init__(self):
            super().__init__()
            self.times, self.last = [], None

        def on_train_begin(self, logs=None):
            self.last = None

        def on_train_batch_end(self, batch, logs=None):
            for v in (logs or {}).values():  # the step's results exist: it is over
                keras.ops.convert_to_numpy(v)
            now = time.perf_counter()
            if self.last is not None:
                self.times.append(now - self.last)
            self.last = now

        def take(self):
            out, self.times = self.times, []
            return out
    return StepTimer()


def dense_stack(keras, h, width, layers, prefix):
    for j in range(layers):
        h = keras.layers.Dense(width, activation="tanh", name=f"{prefix}_d{j}")(h)
    return h


def bubble_model(keras, tnt, ranks, chunks=1):
    """`ranks` x `chunks` stages of BUBBLE_LAYERS / `chunks` layers: every
    rank computes BUBBLE_LAYERS layers per micro-batch."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((BUBBLE_WIDTH,), name="x")
    h = inputs
    for s in range(ranks * chunks):
        if s:
            h = tnt.keras.layers.SplitLayer(name=f"cut{s}")(h)
        h = dense_stack(keras, h, BUBBLE_WIDTH, BUBBLE_LAYERS // chunks, f"s{s}")
    return keras.Model(inputs, h, name=f"bubble{ranks}x{chunks}")


def mem_tanh(chunks):
    """The elementwise layers of each of a rank's `chunks` stages: a rank's
    layers split among its chunks (at least one each)."""
    return max(1, MEM_TANH // chunks)


def memory_model(keras, tnt, chunks=1):
    """2 x `chunks` stages of a dense layer and mem_tanh(chunks) tanh layers."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((MEM_CHANNELS,), name="x")
    h = keras.layers.RepeatVector(MEM_POSITIONS, name="expand")(inputs)
    for s in range(2 * chunks):
        if s:
            h = tnt.keras.layers.SplitLayer(name=f"cut{s}")(h)
        h = keras.layers.Dense(MEM_CHANNELS, name=f"s{s}_dense")(h)
        for j in range(mem_tanh(chunks)):
            h = keras.layers.Activation("tanh", name=f"s{s}_tanh{j}")(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(inputs, keras.layers.Dense(8, name="out")(h), name="activations")


def sim_model(keras, tnt):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((SIM_IN,), name="x")
    h = keras.layers.Dense(SIM_WIDTH, activation="relu", name="d0")(inputs)
    h = keras.layers.Dense(SIM_WIDTH, activation="relu", name="d1")(h)
    h = tnt.keras.layers.SplitLayer(name="cut1")(h)
    h = keras.layers.Dense(SIM_WIDTH, activation="relu", name="d2")(h)
    h = keras.layers.Dense(SIM_IN, activation="relu", name="d3")(h)
    return keras.Model(inputs, keras.layers.Dense(SIM_OUT, name="out")(h), name="wide")


def mpirun_cmd(args, ranks, *worker_args, env=(), script=__file__):
    """`script` (this file by default) with `worker_args` on `ranks` ranks
    under args.mpirun, the environment variables `env` passed on."""
    cmd = [args.mpirun] + shlex.split(args.mpiflags) + ["-np", str(ranks)]
    for name in env:
        cmd += ["-x", name]
    return cmd + [sys.executable, os.path.abspath(script)] + list(worker_args)


def run_job(cmd, timeout, env=None):
    """bench_results.run_job, showing the pipeline's INFO lines, errors and
    the workers' summaries."""
    return bench_results.run_job(
        cmd, timeout, lambda line: "INFO: pipeline" in line or "Error" in line or "error" in line
        or line.startswith("worker:"), env=env)


def save_rank_file(work, rank, doc):
    with open(os.path.join(work, f"rank{rank}.json"), "w") as f:
        json.dump(doc, f)


def load_rank_files(work, ranks):
    docs = []
    for r in range(ranks):
        path = os.path.join(work, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                docs.append(json.load(f))
    return docs


# ------------------------------------------------------------------ bubble

def stage_timer(tf, keras):
    """A function that times one stage's forward + backward (weights and
    inputs, as a middle stage of the pipeline computes) on one micro-batch:
    the median of `reps` runs after a warm-up, in seconds."""
    inputs = keras.Input((BUBBLE_WIDTH,))
    stage = keras.Model(inputs, dense_stack(keras, inputs, BUBBLE_WIDTH, BUBBLE_LAYERS, "t"))
    x = tf.random.normal((BUBBLE_MICRO, BUBBLE_WIDTH), seed=1)
    seed = tf.random.normal((BUBBLE_MICRO, BUBBLE_WIDTH), seed=2)

    @tf.function
    def fwd_bwd(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = stage(x, training=True)
        return tape.gradient(y, stage.trainable_variables + [x], output_gradients=seed)

    def measure(reps):
        for _ in range(3):
            fwd_bwd(x)[0].numpy()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fwd_bwd(x)[0].numpy()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return measure


class Turn:
    """Rank 0 works alone while the other ranks sleep (an MPI barrier would
    keep them spinning on the cores): they poll for a file that rank 0
    writes when it is done."""

    def __init__(self, work, rank):
        self.work, self.rank, self.n = work, rank, 0

    def __enter__(self):
        self.n += 1
        self.path = os.path.join(self.work, f"turn{self.n}")
        if self.rank != 0:
            deadline = time.monotonic() + 300
            while not os.path.exists(self.path):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank 0 did not finish its turn {self.n}")
                time.sleep(0.005)
        return self

    def __exit__(self, *exc):
        if self.rank == 0:
            open(self.path, "w").close()
        return False


def bubble_worker(args):
    tf = tf_setup()
    import numpy as np
    import keras
    import tarantella as tnt
    tnt.init()
    k, rank = tnt.get_size(), tnt.get_rank()
    ms = [int(v) for v in args.micro_batches.split(",")]
    rng = np.random.default_rng(0)
    models, data = {}, {}
    for m in ms:
        batch = m * BUBBLE_MICRO
        x = rng.normal(size=(batch * args.steps, BUBBLE_WIDTH)).astype(np.float32)
        y = np.tanh(x[:, ::-1]).copy()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
        model = tnt.Model(bubble_model(keras, tnt, k, args.chunks),
                          parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                          num_micro_batches=m)
        model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
        model.fit(ds.take(2), epochs=1, verbose=0)  # trace and warm up
        models[m], data[m] = model, ds.cache()
    timer = step_timer(keras)
    measure = stage_timer(tf, keras)
    turn = Turn(args.work, rank)
    fits = {m: [] for m in ms}
    for rep in range(args.reps):
        order = ms if rep % 2 == 0 else list(reversed(ms))
        for m in order:
            # t_stage alone, right before the fit it is compared with.
            with turn:
                t_stage = measure(args.stage_reps) if rank == 0 else None
            # t_stage while every rank computes a stage at once, as the
            # stages of a full pipeline do (they share the host's memory
            # system and caches).
            tnt.allreduce(np.zeros(1, np.float32))
            t_busy = measure(args.stage_reps)
            models[m].fit(data[m], epochs=1, verbose=0, callbacks=[timer])
            fits[m].append({"t_stage_s": t_stage, "t_stage_busy_s": t_busy,
                            "step_s": timer.take()})
    save_rank_file(args.work, rank,
                   {"rank": rank, "stages": k, "fits": {str(m): f for m, f in fits.items()}})
    if rank == 0:
        print(f"worker: {k} ranks x {args.chunks} chunks, " + ", ".join(
            f"M={m} {statistics.median(t for f in fs for t in f['step_s']) * 1e3:.1f} ms"
            for m, fs in fits.items()), flush=True)


def timeline_job(args, path, schedule="1f1b", chunks=1):
    """A few steps of `schedule` on 2 ranks (`chunks` stages each) and 4
    micro-batches with TNT_TIMELINE=path (each rank writes path with
    .rank<R>), for report.py's picture."""
    work = tempfile.mkdtemp(prefix="tnt-pipebench-timeline-")
    env = dict(os.environ, TNT_TIMELINE=path, TNT_PIPELINE_SCHEDULE=schedule)
    run_job(mpirun_cmd(args, 2, "--worker", "bubble", "--work", work, "--steps", "3",
                       "--reps", "1", "--stage-reps", "1", "--micro-batches", "4",
                       "--chunks", str(chunks),
                       env=("TF_CPP_MIN_LOG_LEVEL", "TNT_TIMELINE", "TNT_PIPELINE_SCHEDULE")),
            timeout=args.job_timeout, env=env)
    shutil.rmtree(work, ignore_errors=True)


def bubble_rows(k, chunks, fits, ms, schedule=None):
    """The results of one bubble job: K = `k` ranks of `chunks` stages each,
    against the ideal K t_alone / v + (v M - 1) t_busy / v (a chunk's pass
    takes 1 / v of a rank's share), which is GPipe's and 1F1B's with v = 1,
    and the schedule's bound (K - 1) / (v M + K - 1). A zero-bubble
    `schedule`'s ideal is (K - 1) t_alone / (3 v) + M t_busy: the first
    micro-batch's forward through K - 1 ranks' first chunks (a third of a
    chunk's pass: F, B and W cost alike in dense layers), then a slot per
    micro-batch with every rank computing; its bound is the schedule's idle
    share (schedule.py)."""
    from tarantella.pipeline import schedule as schedule_lib
    rows, v = [], chunks
    zero_bubble = schedule in ZERO_BUBBLE + ("zbv",)
    for m in ms:
        fs = [f for f in fits.get(str(m), []) if f["step_s"]]
        if not fs:
            continue
        # Each fit against the stage times taken just before it.
        def ideal(alone, busy):
            if zero_bubble:
                return (k - 1) * alone / (3 * v) + m * busy
            return (k * alone + (v * m - 1) * busy) / v

        def ratios(ideal_of):
            return [statistics.median(f["step_s"]) / ideal_of(f) for f in fs]
        fit_ratios = ratios(lambda f: ideal(f["t_stage_s"], f["t_stage_busy_s"]))
        step = statistics.median(t for f in fs for t in f["step_s"])
        busy = statistics.median(f["t_stage_busy_s"] for f in fs)
        ratio = statistics.median(fit_ratios)
        if zero_bubble:
            bound = ("zero_bubble_bound",
                     schedule_lib.idle_share(schedule_lib.training(schedule, k * v, k, m)))
        else:
            bound = ("gpipe_bound" if v == 1 else "interleaved_bound", (k - 1) / (v * m + k - 1))
        rows.append({
            "stages": k * v, "ranks": k, "chunks": v, "micro_batches": m,
            **({"schedule": schedule} if zero_bubble else {}),
            "micro_batch": BUBBLE_MICRO, "global_batch": m * BUBBLE_MICRO,
            "oversubscribed": k > os.cpu_count(),
            "step_ms": round(step * 1e3, 3),
            "t_stage_ms": round(statistics.median(f["t_stage_s"] for f in fs) * 1e3, 3),
            "t_stage_busy_ms": round(busy * 1e3, 3),
            "ideal_ms": round(step / ratio * 1e3, 3), "ratio_to_ideal": round(ratio, 3),
            "fit_ratios": [round(q, 3) for q in fit_ratios],
            # Less sensitive to other work on the host: the fastest step
            # against the ideal of the fastest stage times.
            "ratio_of_minima": round(min(t for f in fs for t in f["step_s"]) / ideal(
                min(f["t_stage_s"] for f in fs), min(f["t_stage_busy_s"] for f in fs)), 3),
            "ratio_to_alone_ideal": round(statistics.median(
                ratios(lambda f: (v * m + k - 1) * f["t_stage_s"] / v)), 3),
            "ratio_to_busy_ideal": round(statistics.median(
                ratios(lambda f: (v * m + k - 1) * f["t_stage_busy_s"] / v)), 3),
            bound[0]: round(bound[1], 4),
            # The share of the step in which a rank does not compute a
            # micro-batch, at the speed ranks compute side by side.
            "measured_idle_share": round(max(0.0, 1 - m * busy / step), 4),
            "t_stage_fits_ms": [round(f["t_stage_s"] * 1e3, 3) for f in fs],
            "steps": sum(len(f["step_s"]) for f in fs)})
    return rows


def bubble_job(args, k, chunks, ms, steps, reps, stage_reps, schedule):
    """Rank 0's fits of a bubble job, or (None, the job's output)."""
    work = tempfile.mkdtemp(prefix=f"tnt-pipebench-bubble{k}x{chunks}-")
    env = dict(os.environ, TNT_PIPELINE_SCHEDULE=schedule)
    ok, tail = run_job(mpirun_cmd(args, k, "--worker", "bubble", "--work", work,
                                  "--steps", str(steps), "--reps", str(reps),
                                  "--stage-reps", str(stage_reps),
                                  "--micro-batches", ",".join(str(m) for m in ms),
                                  "--chunks", str(chunks),
                                  env=("TF_CPP_MIN_LOG_LEVEL", "TNT_PIPELINE_SCHEDULE")),
                       timeout=args.job_timeout, env=env)
    docs = load_rank_files(work, k)
    shutil.rmtree(work, ignore_errors=True)
    if not ok or not docs:
        return None, tail
    return next(d for d in docs if d["rank"] == 0)["fits"], tail


def bubble(args):
    steps, reps, stage_reps = (10, 3, 15) if args.quick else (20, 5, 30)
    cfg = new_config(
        width=BUBBLE_WIDTH, layers_per_stage=BUBBLE_LAYERS,
        micro_batch=BUBBLE_MICRO, micro_batches=list(MICRO_BATCHES), steps_per_fit=steps,
        fits=reps, stage_reps=stage_reps, quick=bool(args.quick),
        schedule=pipeline_schedule(), optimizer="SGD", loss="mse",
        interleaved=f"K = 2 ranks of v = {INTERLEAVED_CHUNKS} chunks, M = {INTERLEAVED_M}",
        zero_bubble=f"{', '.join(ZERO_BUBBLE)}, K = 2 and 3, M = {ZERO_BUBBLE_M}; zbv, "
                    f"K = 2 ranks of 2 chunks")
    results, interleaved, zero_bubble, problems = [], [], [], cfg["problems"]
    traces = traces_dir(os.path.dirname(os.path.abspath(args.json)))
    for k in (2, 3):
        fits, tail = bubble_job(args, k, 1, MICRO_BATCHES, steps, reps, stage_reps,
                                pipeline_schedule())
        if fits is None:
            problems[f"{k} stages"] = tail[-1500:]
            continue
        if k == 2:
            timeline_job(args, os.path.join(traces, "pipeline_timeline.json"))
        results += bubble_rows(k, 1, fits, MICRO_BATCHES)
    fits, tail = bubble_job(args, 2, INTERLEAVED_CHUNKS, INTERLEAVED_M, steps, reps,
                            stage_reps, "interleaved")
    if fits is None:
        problems["interleaved"] = tail[-1500:]
    else:
        timeline_job(args, os.path.join(traces, "pipeline_timeline_interleaved.json"),
                     "interleaved", INTERLEAVED_CHUNKS)
        interleaved = bubble_rows(2, INTERLEAVED_CHUNKS, fits, INTERLEAVED_M)
    for schedule in ZERO_BUBBLE:
        for k in (2, 3):
            fits, tail = bubble_job(args, k, 1, ZERO_BUBBLE_M, steps, reps, stage_reps,
                                    schedule)
            if fits is None:
                problems[f"{schedule}, {k} stages"] = tail[-1500:]
                continue
            if (schedule, k) == ("zb-h1", 2):
                timeline_job(args, os.path.join(traces, "pipeline_timeline_zb-h1.json"),
                             schedule)
            zero_bubble += bubble_rows(k, 1, fits, ZERO_BUBBLE_M, schedule)
    fits, tail = bubble_job(args, 2, 2, ZERO_BUBBLE_M, steps, reps, stage_reps, "zbv")
    if fits is None:
        problems["zbv"] = tail[-1500:]
    else:
        zero_bubble += bubble_rows(2, 2, fits, ZERO_BUBBLE_M, "zbv")
    write_results(args.json, "pipeline_bubble", {"config": finish_config(cfg), "results": results,
                                                 "interleaved": interleaved,
                                                 "zero_bubble": zero_bubble})
    return 0 if results else 1


# Every schedule, with the chunks a rank runs.
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1),
             ("zbv", 2))
SCHEDULES_M = (2, 4, 8, 16)


def schedules(args):
    """The bubble worker for every schedule of SCHEDULES on 2 ranks at
    SCHEDULES_M micro-batches: one row per schedule and M (bubble_rows),
    printed as a table."""
    steps, reps, stage_reps = (10, 3, 15) if args.quick else (20, 5, 30)
    cfg = new_config(width=BUBBLE_WIDTH, layers_per_stage=BUBBLE_LAYERS,
                     micro_batch=BUBBLE_MICRO, micro_batches=list(SCHEDULES_M), ranks=2,
                     steps_per_fit=steps, fits=reps, stage_reps=stage_reps,
                     quick=bool(args.quick))
    rows = []
    for schedule, chunks in SCHEDULES:
        fits, tail = bubble_job(args, 2, chunks, SCHEDULES_M, steps, reps, stage_reps, schedule)
        if fits is None:
            cfg["problems"][schedule] = tail[-1500:]
            continue
        zero_bubble = schedule if schedule in ZERO_BUBBLE + ("zbv",) else None
        for r in bubble_rows(2, chunks, fits, SCHEDULES_M, zero_bubble):
            r["schedule"] = schedule
            bound = next(r[k] for k in ("zero_bubble_bound", "gpipe_bound", "interleaved_bound")
                         if k in r)
            print(f"{schedule:12s} M = {r['micro_batches']:2d}: step {r['step_ms']:7.1f} ms, "
                  f"ideal {r['ideal_ms']:7.1f} ms ({r['ratio_to_ideal']:.2f}x), idle share "
                  f"{r['measured_idle_share']:.3f}, bound {bound:.3f}", flush=True)
            rows.append(r)
    write_results(args.json, "pipeline_schedules", {"config": finish_config(cfg), "results": rows})
    return 0 if rows else 1


# ------------------------------------------------------------------ memory

def memory_worker(args):
    tf = tf_setup()
    import numpy as np
    import keras
    import tarantella as tnt
    tnt.init()
    rank, m = tnt.get_rank(), args.m
    batch = m * MEM_MICRO
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * args.steps, MEM_CHANNELS)).astype(np.float32)
    y = rng.normal(size=(batch * args.steps, 8)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache()
    chunks = INTERLEAVED_CHUNKS if pipeline_schedule() == "interleaved" else 1
    model = tnt.Model(memory_model(keras, tnt, chunks),
                      parallel_strategy=tnt.ParallelStrategy.PIPELINING, num_micro_batches=m)
    model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
    base_kib = proc_status_kib("VmRSS")
    began = time.perf_counter()
    model.fit(ds.take(1), epochs=1, verbose=0)  # trace and warm up
    first_fit_s = time.perf_counter() - began
    after_warmup_kib = proc_status_kib("VmRSS")
    lifetime_hwm_warmup = proc_status_kib("VmHWM")
    reset = reset_peak_rss()
    timer = step_timer(keras)
    model.fit(ds, epochs=1, verbose=0, callbacks=[timer])
    doc = {"rank": rank, "stage": rank, "micro_batches": m,
           "schedule": pipeline_schedule(),
           "rss_before_fit_kib": base_kib, "rss_after_warmup_kib": after_warmup_kib,
           "peak_warmup_kib": lifetime_hwm_warmup,
           "peak_steps_kib": proc_status_kib("VmHWM") if reset else None,
           "peak_lifetime_kib": max(proc_status_kib("VmHWM"), lifetime_hwm_warmup),
           "peak_reset": reset, "step_s": timer.take(), "first_fit_s": first_fit_s}
    if args.count_ops:
        doc.update(traced_ops(tf, model, ds))
    save_rank_file(args.work, rank, doc)


def traced_ops(tf, model, dataset):
    """The train step traced once more, on its own (after the fits, whose
    memory is measured): the seconds its tracing takes and its ops, those
    of the step's graph and of every function it calls."""
    began = time.perf_counter()
    concrete = tf.function(model.train_step, autograph=False).get_concrete_function(
        dataset.element_spec)
    trace_s = time.perf_counter() - began
    graph = concrete.graph.as_graph_def()
    return {"trace_s": trace_s, "step_graph_ops": len(graph.node),
            "function_ops": sum(len(f.node_def) for f in graph.library.function)}


def activation_mib_per_micro_batch(chunks=1):
    """What a stage keeps of one micro-batch for its backward (float32): its
    input, the dense layer's output and every tanh output."""
    per_sample = MEM_POSITIONS * MEM_CHANNELS * 4 * (2 + mem_tanh(chunks))
    return per_sample * MEM_MICRO / MIB


def memory_jobs(args, configs, steps, problems, *worker_args):
    """Runs the memory worker (with `worker_args`) on 2 ranks for each
    (schedule, M) of `configs`; yields (schedule, M, the ranks' documents
    by stage) of those that ran, records the others in `problems`."""
    for schedule, m in configs:
        work = tempfile.mkdtemp(prefix=f"tnt-pipebench-mem-{schedule}{m}-")
        env = dict(os.environ, TNT_PIPELINE_SCHEDULE=schedule, **FREED_MEMORY_LEAVES)
        ok, tail = run_job(mpirun_cmd(args, 2, "--worker", "memory", "--work", work,
                                      "--steps", str(steps), "--m", str(m), *worker_args,
                                      env=("TF_CPP_MIN_LOG_LEVEL", "TNT_PIPELINE_SCHEDULE",
                                           *FREED_MEMORY_LEAVES)),
                           timeout=args.job_timeout, env=env)
        docs = load_rank_files(work, 2)
        shutil.rmtree(work, ignore_errors=True)
        if not ok or len(docs) < 2:
            problems[f"{schedule} M={m}"] = tail[-1500:]
            continue
        yield schedule, m, sorted(docs, key=lambda d: d["stage"])


def traced_step_mib(doc):
    """What the first fit left in a rank's memory: the traced step."""
    return round((doc["rss_after_warmup_kib"] - doc["rss_before_fit_kib"]) / 1024, 1)


def step_ms(doc):
    return round(statistics.median(doc["step_s"]) * 1e3, 2) if doc["step_s"] else None


def memory(args):
    steps = 2 if args.quick else 4
    cfg = new_config(
        stages=2, micro_batch=MEM_MICRO,
        micro_batches=list(MICRO_BATCHES),
        activation_shape_per_sample=[MEM_POSITIONS, MEM_CHANNELS],
        kept_activations_mib_per_micro_batch=round(activation_mib_per_micro_batch(), 1),
        interleaved=f"2 ranks of {INTERLEAVED_CHUNKS} chunks, M = {MEM_INTERLEAVED_M}",
        interleaved_kept_mib_per_chunk_micro_batch=round(
            activation_mib_per_micro_batch(INTERLEAVED_CHUNKS), 1),
        weights_bytes=2 * (MEM_CHANNELS * MEM_CHANNELS + MEM_CHANNELS) * 4 + (
            MEM_CHANNELS * 8 + 8) * 4,
        steps=steps, quick=bool(args.quick), environment=FREED_MEMORY_LEAVES)
    results, problems = [], cfg["problems"]
    configs = [(s, m) for m in MICRO_BATCHES for s in ("gpipe", "1f1b")]
    configs += [("interleaved", m) for m in MEM_INTERLEAVED_M]
    for schedule, m, docs in memory_jobs(args, configs, steps, problems):
        for d in docs:
            peak = d["peak_steps_kib"] or d["peak_lifetime_kib"]
            results.append({
                "schedule": schedule, "micro_batches": m, "stage": d["stage"],
                "peak_rss_mib": round(peak / 1024, 1),
                "peak_above_base_mib": round((peak - d["rss_before_fit_kib"]) / 1024, 1),
                # What the traced step keeps (its graph, kernels, executor)
                # and what a step holds on top of it while it runs.
                "traced_step_mib": traced_step_mib(d),
                "step_above_traced_mib": round((peak - d["rss_after_warmup_kib"]) / 1024, 1)
                if d["peak_reset"] else None,
                "rss_before_fit_mib": round(d["rss_before_fit_kib"] / 1024, 1),
                "peak_lifetime_mib": round(d["peak_lifetime_kib"] / 1024, 1),
                "peak_of": "training steps (VmHWM reset after the warm-up step)"
                           if d["peak_reset"] else "the whole process (VmHWM)",
                "step_ms": step_ms(d)})
        print(f"memory: {schedule} M={m}: " + ", ".join(
            f"stage {r['stage']} {r['peak_rss_mib']:.0f} MiB (+{r['peak_above_base_mib']:.0f})"
            for r in results[-2:]), flush=True)
    write_results(args.json, "pipeline_memory", {"config": finish_config(cfg), "results": results})
    return 0 if results else 1


def traced(args):
    """1F1B's traced step against M on the memory stage's model: the first
    fit's seconds (tracing, TensorFlow's graph optimization and one step),
    the seconds that tracing the step alone takes, what the first fit
    leaves in memory, and the ops of the step's graph and of the functions
    it calls."""
    ms = (TRACED_M[0], TRACED_M[2]) if args.quick else TRACED_M
    cfg = new_config(stages=2, schedule="1f1b", micro_batch=MEM_MICRO, micro_batches=list(ms),
                     steps=2, quick=bool(args.quick), environment=FREED_MEMORY_LEAVES)
    results = []
    for _, m, docs in memory_jobs(args, [("1f1b", m) for m in ms], 2, cfg["problems"],
                                  "--count-ops"):
        for d in docs:
            results.append({
                "micro_batches": m, "stage": d["stage"],
                "first_fit_s": round(d["first_fit_s"], 2), "step_ms": step_ms(d),
                "trace_s": round(d["trace_s"], 2), "traced_step_mib": traced_step_mib(d),
                "step_graph_ops": d["step_graph_ops"], "function_ops": d["function_ops"]})
        print(f"traced: M={m}: " + ", ".join(
            f"stage {r['stage']} traced in {r['trace_s']:.1f} s, {r['traced_step_mib']:.0f} MiB, "
            f"{r['step_graph_ops'] + r['function_ops']} ops" for r in results[-2:]), flush=True)
    write_results(args.json, "pipeline_traced", {"config": finish_config(cfg), "results": results})
    return 0 if results else 1


# ------------------------------------------------------------------ capacity

def capacity_model(keras, tnt, stages):
    """CAP_LAYERS dense layers, cut into `stages` stages of equal layers."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((CAP_WIDTH,), name="x")
    h = inputs
    for k in range(CAP_LAYERS):
        if k and stages > 1 and k % (CAP_LAYERS // stages) == 0:
            h = tnt.keras.layers.SplitLayer(name=f"cut{k}")(h)
        h = keras.layers.Dense(CAP_WIDTH, activation="tanh", name=f"d{k}")(h)
    return keras.Model(inputs, h, name="large")


def capacity_weights_bytes():
    """The whole model's float32 weights, known before it is built."""
    return CAP_LAYERS * (CAP_WIDTH * CAP_WIDTH + CAP_WIDTH) * 4


class PeakData:
    """The peak of the process's data size (VmData, what RLIMIT_DATA
    limits) above its size at the start, while the block runs, sampled
    every millisecond on a thread: a shorter peak can be missed, so the
    margin under a limit that follows from it is an upper bound. The
    peaks of the block's phases, named by `phase`, are kept apart."""

    def __enter__(self):
        import threading
        self.data0 = proc_status_kib("VmData")
        self.peak, self.done = self.data0, threading.Event()
        self.now, self.phases = "start", {}

        def sample():
            while not self.done.wait(0.001):
                self._see(proc_status_kib("VmData"))
        size = threading.stack_size(256 << 10)  # the stack counts as data too
        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        threading.stack_size(size)
        return self

    def _see(self, kib):
        self.peak = max(self.peak, kib)
        self.phases[self.now] = max(self.phases.get(self.now, kib), kib)

    def phase(self, name):
        """The data size from now on counts toward the phase `name`."""
        self._see(proc_status_kib("VmData"))
        self.now = name

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self._see(proc_status_kib("VmData"))
        self.mib = round((self.peak - self.data0) / 1024, 1)
        self.phases_mib = {k: round((v - self.data0) / 1024, 1) for k, v in self.phases.items()}
        return False


def capacity_worker(args):
    """Builds and trains the large model serially (--stages 0) or on
    --stages K stages, given to tnt.Model built (--form built) or as the
    function that builds it (--form fn), under a memory limit set before
    the model is built; writes whether it trained, the weights it held,
    its peak data size above the start (training, predicting and, for
    stages under a limit, saving a .keras file and a sharded checkpoint),
    the margin left under the limit, and a digest of its stage's weights
    after training."""
    import hashlib
    import resource
    tf_setup()
    import numpy as np
    import keras
    import tarantella as tnt
    from tarantella.pipeline import weights as stage_weights
    pipelined = args.stages > 0
    rank = 0
    if pipelined:
        tnt.init()
        rank = tnt.get_rank()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(CAP_BATCH * 2, CAP_WIDTH)).astype(np.float32)
    # TensorFlow's runtime (thread pools, kernels) starts with a first fit
    # of a tiny model, so that the base below is the runtime's and the
    # limit the model's.
    tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    tiny.compile(optimizer="sgd", loss="mse")
    tiny.fit(x[:8, :4], x[:8, :4], epochs=1, verbose=0)
    del tiny
    weights_bytes = capacity_weights_bytes()
    base_kib = proc_status_kib("VmData")
    allowed = int(args.budget * weights_bytes) if args.budget > 0 else None
    if allowed is not None:
        resource.setrlimit(resource.RLIMIT_DATA,
                           (base_kib * 1024 + allowed, resource.RLIM_INFINITY))
    doc = {"rank": rank, "stages": args.stages, "form": args.form,
           "optimizer": args.optimizer, "weights_mib": round(weights_bytes / MIB, 1),
           "limit_above_base_mib": round(allowed / MIB, 1) if allowed is not None else None,
           "vmdata_base_mib": round(base_kib / 1024, 1)}
    optimizer = {"sgd": lambda: keras.optimizers.SGD(1e-3),
                 "momentum": lambda: keras.optimizers.SGD(1e-3, momentum=0.9),
                 "adam": lambda: keras.optimizers.Adam(1e-4)}[args.optimizer]
    try:
        reset_peak_rss()
        with PeakData() as peak:
            stages = max(args.stages, 1)
            if args.form == "fn" and pipelined:
                model = lambda: capacity_model(keras, tnt, stages)  # noqa: E731
            else:
                model = capacity_model(keras, tnt, stages)
                doc["held_weights_built_mib"] = round(
                    stage_weights.allocated_bytes(model.variables) / MIB, 1)
                doc["vmdata_built_above_base_mib"] = round(
                    (proc_status_kib("VmData") - base_kib) / 1024, 1)
            if pipelined:
                model = tnt.Model(model, parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                                  num_micro_batches=args.m)
            doc["held_weights_mib"] = round(
                stage_weights.allocated_bytes(model.variables) / MIB, 1)
            doc["vmdata_cut_above_base_mib"] = round(
                (proc_status_kib("VmData") - base_kib) / 1024, 1)
            model.compile(optimizer=optimizer(), loss="mse")
            peak.phase("fit")
            model.fit(x, x, batch_size=CAP_BATCH, epochs=1, verbose=0, shuffle=False)
            peak.phase("predict")
            predicted = model.predict(x, batch_size=CAP_BATCH, verbose=0)
            if pipelined and allowed is not None:
                # Both files a pipeline writes without gathering the model,
                # under the same limit (the master writes them).
                peak.phase("save")
                model.save(os.path.join(args.work, "capacity.keras"))
                peak.phase("save_weights")
                model.save_weights(os.path.join(args.work, "capacity.weights.json"))
                doc["saved"] = True
        doc.update(trained=True, predicted=bool(predicted.shape == x.shape),
                   peak_data_above_base_mib=peak.mib,
                   peak_by_phase_above_base_mib=peak.phases_mib,
                   vmdata_after_fit_above_base_mib=round(
                       (proc_status_kib("VmData") - base_kib) / 1024, 1))
        if allowed is not None:
            doc["margin_mib"] = round(allowed / MIB - peak.mib, 1)
        held = model._tnt.pipeline.model.weights if pipelined else model.weights
        digest = hashlib.sha256()
        for w in held:
            # The array's own buffer: a copy would need room the limit leaves not.
            digest.update(memoryview(np.ascontiguousarray(w.numpy())))
        doc["weights_sha256"] = digest.hexdigest()
    except Exception as e:  # the limit shows as TensorFlow's ResourceExhausted or MemoryError
        lines = str(e).splitlines() or [""]
        what = next((line.strip() for line in lines if "OOM" in line), lines[0])
        doc.update(trained=False, error=f"{type(e).__name__}: {what[:300]}")
    save_rank_file(args.work, rank, doc)
    if pipelined and not doc["trained"]:
        os._exit(1)  # the other stages wait for this one: end the job


# How a stage gets its weight gradients (TNT_PIPELINE_WEIGHT_GRADIENTS).
SUMMED, RECOMPUTED = "accumulate", "recompute"
# A stage's fixed cost: CAP_LAYERS stages of one layer each (W / CAP_LAYERS
# of weights a stage), each process limited to THIN_BUDGET_W x W above its
# base, so the model is 1 / THIN_BUDGET_W times one process's limit.
THIN_BUDGET_W = 0.4
# (name, stages, form, optimizer, limit in W above the base (0: none),
# weight gradients)
CAPACITY_RUNS = [
    ("serial, limited", 0, "built", "sgd", CAP_BUDGET_W, SUMMED),
    (f"{CAP_STAGES} stages, built whole, limited", CAP_STAGES, "built", "sgd", CAP_BUDGET_W,
     SUMMED),
    (f"{CAP_STAGES} stages, build_fn, SGD, limited", CAP_STAGES, "fn", "sgd", CAP_BUDGET_W,
     SUMMED),
    (f"{CAP_STAGES} stages, build_fn, SGD momentum, recomputed weight gradients, limited",
     CAP_STAGES, "fn", "momentum", CAP_BUDGET_W, RECOMPUTED),
    (f"{CAP_STAGES} stages, build_fn, SGD momentum, summed weight gradients, limited",
     CAP_STAGES, "fn", "momentum", CAP_BUDGET_W, SUMMED),
    (f"{CAP_LAYERS} stages, build_fn, SGD, recomputed weight gradients, limited",
     CAP_LAYERS, "fn", "sgd", THIN_BUDGET_W, RECOMPUTED),
    (f"{CAP_LAYERS} stages, build_fn, SGD, summed weight gradients, limited",
     CAP_LAYERS, "fn", "sgd", THIN_BUDGET_W, SUMMED),
    (f"{CAP_STAGES} stages, build_fn, SGD momentum, no limit", CAP_STAGES, "fn", "momentum",
     0, SUMMED),
    (f"{CAP_STAGES} stages, built whole, SGD, no limit", CAP_STAGES, "built", "sgd", 0,
     SUMMED),
]
# Runs under their limit that are not expected to fit, and why.
MAY_EXCEED = {
    CAPACITY_RUNS[4][0]: "a stage holds its weights, their momentums and the sum of its "
                         "micro-batches' gradients (0.75 W), a layer's new gradients "
                         "(0.125 W) and TensorFlow's step: more than 0.9 W",
    CAPACITY_RUNS[6][0]: "a stage holds its weights, the sum of its micro-batches' "
                         "gradients and a micro-batch's new gradients (3 x W / 8 = 0.375 W) "
                         "and TensorFlow's step: more than 0.4 W",
}
# --quick: whether a model larger than the limit trains on stages at all.
QUICK_CAPACITY_RUNS = [CAPACITY_RUNS[0], CAPACITY_RUNS[2]]
TABLE_RUNS = [(f"table: {k} stage(s), {opt}" + (", recomputed" if mode == RECOMPUTED else ""),
               0 if k == 1 else k, "fn" if k > 1 else "built", opt, 0, mode)
              for k in TABLE_STAGES for opt in TABLE_OPTIMIZERS
              for mode in ((SUMMED,) if k == 1 else (SUMMED, RECOMPUTED))]


def memory_table(results):
    """Per optimizer, number of stages K and way of getting the weight
    gradients, the largest peak of a rank above its base, against the whole
    model's need divided by K: its weights and gradients with SGD (2 W),
    also the two moments with Adam (4 W); and, for comparison, against the
    serial run's peak / K."""
    whole = capacity_weights_bytes() / MIB
    rows = []
    for key, stages, _, opt, _, mode in TABLE_RUNS:
        k = max(stages, 1)
        serial = results.get(f"table: 1 stage(s), {opt}", {}).get("ranks") or [{}]
        serial_peak = serial[0].get("peak_data_above_base_mib")
        need = TABLE_NEED_TIMES_WEIGHTS[opt] * whole
        docs = results.get(key, {}).get("ranks") or []
        peaks = [d.get("peak_data_above_base_mib") for d in docs]
        peak = max(peaks) if peaks and None not in peaks else None
        ratio = round(peak / (need / k), 2) if peak is not None else None
        rows.append({"optimizer": opt, "stages": k, "weight_gradients": mode, "peak_mib": peak,
                     "need_over_k_mib": round(need / k, 1), "ratio": ratio,
                     "serial_peak_over_k_mib": (round(serial_peak / k, 1)
                                                if serial_peak else None)})
    return rows


def capacity_document(cfg, results):
    """The capacity stage's results file: a row per run and per rank of a
    run, the memory table, whether the stages' weights equal the unlimited
    run's."""
    runs = {k: r for k, r in results.items() if k not in ("bitwise equal", "memory table")}
    doc = {"config": cfg,
           "runs": [{"run": k, **{f: v for f, v in r.items() if f != "ranks"}}
                    for k, r in runs.items()],
           "ranks": [{"run": k, **d} for k, r in runs.items() for d in r["ranks"]],
           "memory": results.get("memory table", [])}
    if "bitwise equal" in results:
        doc["bitwise_equal"] = results["bitwise equal"]
    return doc


def capacity(args):
    env = dict(os.environ, **FREED_MEMORY_LEAVES,
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    cfg = new_config(
        layers=CAP_LAYERS, width=CAP_WIDTH, batch=CAP_BATCH,
        stages=CAP_STAGES, budget_times_weights=CAP_BUDGET_W,
        thin_budget_times_weights=THIN_BUDGET_W, quick=bool(args.quick),
        environment=FREED_MEMORY_LEAVES)
    results = {}
    runs = QUICK_CAPACITY_RUNS if args.quick else CAPACITY_RUNS + TABLE_RUNS
    for key, stages, form, optimizer, budget, weight_gradients in runs:
        work = tempfile.mkdtemp(prefix="tnt-pipebench-cap-")
        worker = ["--worker", "capacity", "--work", work, "--m", str(2 * max(stages, 1)),
                  "--stages", str(stages), "--form", form, "--optimizer", optimizer,
                  "--budget", str(budget)]
        job_env = dict(env, TNT_PIPELINE_WEIGHT_GRADIENTS=weight_gradients)
        if stages == 0:
            cmd, ranks = [sys.executable, os.path.abspath(__file__)] + worker, 1
        else:
            cmd = mpirun_cmd(args, stages, *worker, env=(
                "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "MALLOC_MMAP_THRESHOLD_",
                "TNT_PIPELINE_WEIGHT_GRADIENTS"))
            ranks = stages
        ok, tail = run_job(cmd, timeout=args.job_timeout, env=job_env)
        docs = load_rank_files(work, ranks)
        shutil.rmtree(work, ignore_errors=True)
        results[key] = {"job_ok": ok, "ranks": docs, "weight_gradients": weight_gradients,
                        "budget_times_weights": budget or None,
                        "trained": len(docs) == ranks and all(d["trained"] for d in docs),
                        "tail": "" if ok else tail[-1500:]}
        if key in MAY_EXCEED:
            results[key]["may_exceed"] = MAY_EXCEED[key]
        print(f"capacity: {key}: trained={results[key]['trained']}: " + "; ".join(
            d.get("error", f"held {d.get('held_weights_mib')} MiB of weights, peak "
                           f"{d.get('peak_data_above_base_mib')} MiB data above the base"
                  + (f", margin {d.get('margin_mib')} MiB" if budget else ""))
            for d in docs), flush=True)
    if not args.quick:
        reference = results[CAPACITY_RUNS[-1][0]]["ranks"]
        limited_sgd = results[CAPACITY_RUNS[2][0]]["ranks"]
        results["bitwise equal"] = (
            len(reference) == len(limited_sgd) == CAP_STAGES
            and all(a.get("weights_sha256") is not None
                    and a.get("weights_sha256") == b.get("weights_sha256")
                    for a, b in zip(reference, limited_sgd)))
        results["memory table"] = memory_table(results)
    write_results(args.json, "pipeline_capacity", capacity_document(finish_config(cfg), results))
    return 0


# ------------------------------------------------------------- sim cluster

def sim_worker(args):
    tf = tf_setup()
    import numpy as np
    import keras
    import tarantella as tnt
    from tarantella import _core
    tnt.init()
    rank = tnt.get_rank()
    rng = np.random.default_rng(0)
    n = SIM_BATCH * args.steps
    x = rng.normal(size=(n, SIM_IN)).astype(np.float32)
    y = rng.normal(size=(n, SIM_OUT)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(SIM_BATCH, drop_remainder=True).cache()
    models = {}
    for name, schedule in [(f"pipeline, {s}", s) for s in SIM_SCHEDULES] + [("data", None)]:
        if schedule is None:
            model = tnt.Model(sim_model(keras, tnt), parallel_strategy=tnt.ParallelStrategy.DATA)
        else:
            model = tnt.Model(sim_model(keras, tnt),
                              parallel_strategy=tnt.ParallelStrategy.PIPELINING,
                              num_micro_batches=SIM_MICRO, pipeline_schedule=schedule)
        model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
        model.fit(ds.take(2), epochs=1, verbose=0)  # trace and warm up
        models[name] = model
    params = int(sum(np.prod(w.shape) for w in models["data"].trainable_weights))
    timer = step_timer(keras)
    times = {name: [] for name in models}
    for rep in range(args.reps):
        order = list(models) if rep % 2 == 0 else list(reversed(list(models)))
        for name in order:
            models[name].fit(ds, epochs=1, verbose=0, callbacks=[timer])
            times[name] += timer.take()
    save_rank_file(args.work, rank, {"rank": rank, "hosts": _core.num_hosts(),
                                     "ranks": tnt.get_size(), "parameters": params,
                                     "step_s": times})
    if rank == 0:
        print(f"worker: {tnt.get_size()} ranks on {_core.num_hosts()} hosts, {params} "
              "parameters; " + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms/step"
                                         for k, v in times.items()), flush=True)


def sim_cluster(args):
    scb = bench_results.module_of("tools/research", "sim_cluster_bench")
    scb.require_cluster_tools("pipeline_bench sim_cluster")
    steps, reps = (4, 2) if args.quick else (8, 3)
    work = tempfile.mkdtemp(prefix="tnt-pipebench-sim-")
    cfg = new_config(
        hosts=2, ranks_per_host=1, link="1gbit_0.1ms",
        global_batch=SIM_BATCH, micro_batches=SIM_MICRO, schedules=list(SIM_SCHEDULES),
        layers=[SIM_IN, SIM_WIDTH, SIM_WIDTH, "cut", SIM_WIDTH, SIM_IN, SIM_OUT],
        steps_per_fit=steps, fits_per_mode=reps, optimizer="SGD", quick=bool(args.quick))
    results = []
    cluster = scb.Cluster(2)
    try:
        cfg["link_shaping"] = cluster.shape(SIM_LINK_BPS)
        if "netem" not in cfg["link_shaping"]:
            cfg["added_delay"] = "none: this kernel has no netem qdisc (rate-limited with tbf only)"
        hostfile = cluster.hostfile(work)
        env = cluster.env()
        cmd = [shutil.which("tarantella"), "--hostfile", hostfile, "--n-per-node", "1",
               "--no-gpu", "--run-dir", os.path.join(work, "run"), "--python-interpreter",
               sys.executable, "--", os.path.abspath(__file__), "--worker", "sim_cluster",
               "--work", work, "--steps", str(steps), "--reps", str(reps)]
        ok, tail = run_job(cmd, timeout=args.job_timeout, env=env)
        if not ok:
            cluster.kill_processes()
            cfg["problems"]["run"] = tail[-1500:]
        docs = load_rank_files(work, 2)
        if docs:
            d0 = next(d for d in docs if d["rank"] == 0)
            cfg["hosts_seen"] = d0["hosts"]
            cfg["parameters"] = d0["parameters"]
            cfg["parameter_bytes"] = d0["parameters"] * 4
            for mode, ts in d0["step_s"].items():
                if not ts:
                    continue
                step = statistics.median(ts)
                results.append({"mode": mode, "step_ms": round(step * 1e3, 2),
                                "samples_per_s": round(SIM_BATCH / step, 2), "steps": len(ts),
                                "step_spread_ms": [round(min(ts) * 1e3, 2),
                                                   round(max(ts) * 1e3, 2)]})
    finally:
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)
    data = next((r for r in results if r["mode"] == "data"), None)
    piped = [r for r in results if r["mode"].startswith("pipeline")]
    best = max(piped, key=lambda r: r["samples_per_s"], default=None)
    ratio = best["samples_per_s"] / data["samples_per_s"] if best and data else None
    if best is not None:
        cfg["best_schedule"] = best["mode"].split(", ")[1]
    # What the data-parallel step must move: a ring allreduce of the gradients.
    if "parameter_bytes" in cfg:
        cfg["allreduce_transfer_ms"] = round(cfg["parameter_bytes"] * 8 / SIM_LINK_BPS * 1e3, 1)
        cut = SIM_BATCH // SIM_MICRO * SIM_WIDTH * 4 * 2 * SIM_MICRO
        cfg["pipeline_transfer_ms"] = round(cut * 8 / SIM_LINK_BPS * 1e3, 1)
    write_results(args.json, "pipeline_sim_cluster",
                  {"config": finish_config(cfg), "results": results,
                   "ratio_pipeline_to_data": round(ratio, 3) if ratio else None})
    return 0 if ratio else 1


# ------------------------------------------------------------------ main

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?",
                   choices=["bubble", "schedules", "memory", "traced", "capacity",
                            "sim_cluster"])
    p.add_argument("--json", help="write the results file here")
    p.add_argument("--quick", action="store_true", help="fewer steps and fits")
    p.add_argument("--mpirun", default=os.environ.get("MPIRUN", "mpirun"))
    p.add_argument("--mpiflags", default=os.environ.get("MPIFLAGS", "--oversubscribe --bind-to none"
                                                        + (" --allow-run-as-root"
                                                           if os.geteuid() == 0 else "")))
    p.add_argument("--job-timeout", type=int, default=400,
                   help="most seconds one MPI job may take (default 400)")
    p.add_argument("--worker", choices=["bubble", "memory", "capacity", "sim_cluster"],
                   help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--reps", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--m", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--stages", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--form", choices=["built", "fn"], default="built", help=argparse.SUPPRESS)
    p.add_argument("--optimizer", default="sgd", help=argparse.SUPPRESS)
    p.add_argument("--stage-reps", type=int, default=30, help=argparse.SUPPRESS)
    p.add_argument("--micro-batches", default="1,2,4,8", help=argparse.SUPPRESS)
    p.add_argument("--chunks", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--count-ops", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        {"bubble": bubble_worker, "memory": memory_worker, "capacity": capacity_worker,
         "sim_cluster": sim_worker}[args.worker](args)
        return 0
    if not args.mode or not args.json:
        p.error("give a mode (bubble, schedules, memory, traced, capacity, sim_cluster) and "
                "--json PATH")
    bench_results.stop_on_signals()
    try:
        return {"bubble": bubble, "schedules": schedules, "memory": memory, "traced": traced,
                "capacity": capacity, "sim_cluster": sim_cluster}[args.mode](args)
    finally:
        if args.mode == "sim_cluster":
            scb = bench_results.module_of("tools/research", "sim_cluster_bench")
            scb.Cluster.down_all()


if __name__ == "__main__":
    sys.exit(main())
