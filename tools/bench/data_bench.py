"""Input-bound training: does each rank prepare only its share of the data,
and is it never slower than plain Keras?

Two jobs (a matmul `map`, and image augmentation as Keras users write it)
at 1, 2 and 4 ranks, with sharing on and whole, beside plain Keras in one
process: the epoch's wall time and each rank's input CPU time, medians over
interleaved rounds. The method: docs/research/benchmarks.md.

    python3 tools/bench/data_bench.py [--quick] [--rounds 3] [--out bench/results/data_share.jsonl]

Environment as in run_bench.sh: MPIRUN, MPIFLAGS (--mpirun, --mpiflags).
"""
import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

from bench_results import run_job, write_results

SAMPLES, BATCH, MATMULS, WIDTH, CLASSES = 2048, 64, 20, 64, 10
FIT_EPOCHS = 4
INPUT_EPOCHS = 8
IMAGE, CROP = 40, 32
JOBS = {
    "matmul": {"whole": "0", "what": f"{SAMPLES} samples, a `map` of {MATMULS} matmuls of "
               f"{WIDTH} x {WIDTH} per sample, a one-layer model, global batch {BATCH}"},
    "augment": {"whole": "deterministic",
                "what": f"{SAMPLES} images of {IMAGE} x {IMAGE} x 3, shuffled, a parallel "
                f"`map` (AUTOTUNE) of tf.image's random crop to {CROP} x {CROP}, flip, "
                f"brightness and contrast, batch {BATCH}, prefetch (AUTOTUNE), a CNN of 2 "
                "convolutions"},
}


def matmul_job(tf, np, keras):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=SAMPLES).astype(np.int32)
    w = tf.constant((rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32))

    def expensive(features, label):
        h = features[:, None] * features[None, :]  # a WIDTH x WIDTH matrix per sample
        for _ in range(MATMULS):
            h = tf.tanh(h @ w)
        return tf.reduce_mean(h, axis=0), label
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(expensive).batch(BATCH)
    model = keras.Sequential([keras.Input((WIDTH,)),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    return ds, model


def augment_job(tf, np, keras):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(SAMPLES, IMAGE, IMAGE, 3)).astype(np.uint8)
    y = rng.integers(0, CLASSES, size=SAMPLES).astype(np.int32)

    def augment(image, label):
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.random_crop(image, [CROP, CROP, 3])
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 0.2)
        image = tf.image.random_contrast(image, 0.8, 1.2)
        return image, label
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES)
          .map(augment, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
          .prefetch(tf.data.AUTOTUNE))
    model = keras.Sequential([
        keras.Input((CROP, CROP, 3)),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES, activation="softmax")])
    return ds, model


def worker(args):
    """One process of a run: writes WORK/rank<r>.json."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import keras
    rank, size, tnt = 0, 1, None
    if not args.serial:
        import tarantella as tnt
        tnt.init()
        rank, size = tnt.get_rank(), tnt.get_size()
    else:
        keras.utils.set_random_seed(42)
    found = {}
    for job, build in (("matmul", matmul_job), ("augment", augment_job)):
        keras.utils.set_random_seed(1)
        ds, model = build(tf, np, keras)
        if tnt is not None:
            model = tnt.Model(model)
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss="sparse_categorical_crossentropy")
        found[job] = measure_job(args, tf, keras, tnt, ds, model, JOBS[job]["whole"])
    with open(os.path.join(args.work, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "size": size, "jobs": found}, f)
    return 0


def epoch_timer(keras):
    """A Keras callback that records the wall time of every epoch."""
    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)
    return EpochTimes()


def epoch_reader(tf):
    """A function that reads `steps` batches of an iterator in a graph, as
    Keras's train function reads them, and returns their rows."""
    @tf.function
    def read_epoch(iterator, steps):
        rows = tf.constant(0, tf.int64)
        for _ in tf.range(steps):
            batch = next(iterator)
            rows += tf.shape(batch[1], out_type=tf.int64)[0]
        return rows
    return read_epoch


def measure_job(args, tf, keras, tnt, ds, model, whole):
    read_epoch = epoch_reader(tf)
    modes = ["serial"] if tnt is None else ["share", "whole"]

    def use(mode):
        if mode != "serial":
            os.environ["TNT_DATA_SHARE"] = "1" if mode == "share" else whole
            tnt.settings.load()  # settings are read when they are loaded

    def input_pass():
        """(CPU seconds of the first epoch, of the epochs after it, rows of an epoch)."""
        if tnt is None:
            steps = int(ds.cardinality())
            epochs = (iter(ds) for _ in range(INPUT_EPOCHS))
        else:
            mine, steps = tnt.data.across_epochs(tnt.data.distribute(ds))
            one = iter(mine)
            epochs = (one for _ in range(INPUT_EPOCHS))
        seconds = []
        for iterator in epochs:
            start = time.process_time()
            rows = int(read_epoch(iterator, steps))
            seconds.append(time.process_time() - start)
        return seconds[0], statistics.median(seconds[1:]), rows

    def epoch():
        times = epoch_timer(keras)
        model.fit(ds, epochs=FIT_EPOCHS, verbose=0, callbacks=[times])
        return statistics.median(times.seconds[1:])

    for mode in modes:  # warm-up: traces the step, builds the functions
        use(mode)
        input_pass()
        epoch()
    found = {m: {"epoch_s": [], "input_cpu_s": [], "input_cpu_first_s": [], "rows": 0}
             for m in modes}
    for trial in range(args.trials):
        for mode in (modes if trial % 2 == 0 else modes[::-1]):
            use(mode)
            first, cpu, rows = input_pass()
            found[mode]["input_cpu_first_s"].append(first)
            found[mode]["input_cpu_s"].append(cpu)
            found[mode]["rows"] = rows
            found[mode]["epoch_s"].append(epoch())
    return found


def measure(args, ranks):
    """Per job, per mode results of a run on `ranks` ranks (0: serial Keras)."""
    me = [sys.executable, os.path.abspath(__file__), "--worker", "--trials", str(args.trials)]
    with tempfile.TemporaryDirectory(prefix="tnt-data-bench-") as work:
        me += ["--work", work]
        if ranks == 0:
            cmd, n = me + ["--serial"], 1
        else:
            cmd, n = ([args.mpirun] + shlex.split(args.mpiflags) +
                      ["-np", str(ranks), "-x", "TF_CPP_MIN_LOG_LEVEL"] + me), ranks
        ok, tail = run_job(cmd, args.timeout, lambda line: "dataset:" in line or "rror" in line,
                           last=10)
        if not ok:
            raise SystemExit(f"data_bench: the run on {ranks or 'serial'} rank(s) failed:\n{tail}")
        docs = []
        for r in range(n):
            with open(os.path.join(work, f"rank{r}.json")) as f:
                docs.append(json.load(f))
    results = {}
    for job in docs[0]["jobs"]:
        results[job] = {}
        for mode in docs[0]["jobs"][job]:
            per_rank = [d["jobs"][job][mode] for d in docs]
            results[job][mode] = {
                "epoch_s": statistics.median(per_rank[0]["epoch_s"]),
                "input_cpu_s": [statistics.median(p["input_cpu_s"]) for p in per_rank],
                "input_cpu_first_s": [statistics.median(p["input_cpu_first_s"])
                                      for p in per_rank],
                "rows": [p["rows"] for p in per_rank],
            }
    return results


def median_of_rounds(rounds):
    """One run's figures, the medians over the rounds (per rank for the
    input CPU), with every round's epoch time."""
    return {"epoch_s": round(statistics.median(r["epoch_s"] for r in rounds), 4),
            "epoch_s_rounds": [round(r["epoch_s"], 4) for r in rounds],
            **{key: [round(statistics.median(r[key][k] for r in rounds), 4)
                     for k in range(len(rounds[0][key]))]
               for key in ("input_cpu_s", "input_cpu_first_s")},
            "rows": rounds[0]["rows"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "bench",
                                                 "results", "data_share.jsonl"))
    p.add_argument("--quick", action="store_true", help="1 and 2 ranks, 1 round of 2 trials")
    p.add_argument("--trials", type=int, help="trials per mode in each run (default 2)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 1,2,4)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--mpirun", default=os.environ.get("MPIRUN", "mpirun"))
    default_flags = "--oversubscribe --bind-to none" + (" --allow-run-as-root"
                                                       if os.geteuid() == 0 else "")
    p.add_argument("--mpiflags", default=os.environ.get("MPIFLAGS", default_flags))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serial", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trials is None:
        args.trials = 2
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.worker:
        return worker(args)
    ranks = [int(r) for r in (args.ranks or ("1,2" if args.quick else "1,2,4")).split(",")]
    load = [[round(v, 2) for v in os.getloadavg()]]
    found = {n: [] for n in [0] + ranks}
    for _ in range(args.rounds):
        for n in [0] + ranks:
            found[n].append(measure(args, n))
        load.append([round(v, 2) for v in os.getloadavg()])
    jobs = {}
    for job, spec in JOBS.items():
        serial = median_of_rounds([r[job]["serial"] for r in found[0]])
        runs, ratios = [], {}
        for n in ranks:
            on, off = (median_of_rounds([r[job][m] for r in found[n]]) for m in ("share", "whole"))
            runs += [{"ranks": n, "share": True, **on}, {"ranks": n, "share": False, **off}]
            ratios[str(n)] = {
                "input_cpu_share_vs_whole": round(max(on["input_cpu_s"]) /
                                                  statistics.mean(off["input_cpu_s"]), 3),
                "epoch_share_vs_whole": round(on["epoch_s"] / off["epoch_s"], 3),
                "epoch_share_vs_serial": round(on["epoch_s"] / serial["epoch_s"], 3),
            }
        jobs[job] = {"what": spec["what"], "whole": f"TNT_DATA_SHARE={spec['whole']}",
                     "serial": serial, "runs": runs, "ratios": ratios}
    config = {"samples": SAMPLES, "global_batch": BATCH, "input_epochs": INPUT_EPOCHS,
              "trials": args.trials, "rounds": args.rounds, "cpus": os.cpu_count(),
              "load_average_before": load[0], "load_average_after": load[-1],
              "load_average_rounds": load,
              "jobs": {job: {"what": d["what"], "whole": d["whole"]} for job, d in jobs.items()},
              "command": "python3 tools/bench/data_bench.py " + " ".join(
                  shlex.quote(a) for a in sys.argv[1:])}
    out = os.path.abspath(args.out)
    write_results(out, "data_share", {
        "config": config,
        "serial": [{"job": job, **d["serial"]} for job, d in jobs.items()],
        "runs": [{"job": job, **r} for job, d in jobs.items() for r in d["runs"]],
        "ratios": [{"job": job, "ranks": int(n), **q} for job, d in jobs.items()
                   for n, q in d["ratios"].items()]})
    print(f"load average per round {load}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
