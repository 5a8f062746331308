"""Input-bound training: does each rank prepare only its share of the data?

The job: 2048 samples, a `map` of 20 small matmuls per sample (64 x 64
matrices), a one-layer model, global batch 64. At 1, 2 and 4 ranks, each
run measures, with sharing on and off (TNT_DATA_SHARE, alternated inside one process so that
both see the same load):
  epoch_s      wall time of one fit epoch (median of the trials, rank 0)
  input_cpu_s  CPU time of one pass over the rank's distributed dataset
               alone (tnt.data.distribute; median of the trials, per rank)
and serial Keras on the same data as the reference.

    python3 tools/bench/data_bench.py [--quick] [--out bench/results/data_share.json]

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

from bench_results import run_job, write_json

SAMPLES, BATCH, MATMULS, WIDTH, CLASSES = 2048, 64, 20, 64, 10


def dataset(tf, np):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=SAMPLES).astype(np.int32)
    w = tf.constant((rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32))

    def expensive(features, label):
        h = features[:, None] * features[None, :]  # a WIDTH x WIDTH matrix per sample
        for _ in range(MATMULS):
            h = tf.tanh(h @ w)
        return tf.reduce_mean(h, axis=0), label
    return tf.data.Dataset.from_tensor_slices((x, y)).map(expensive).batch(BATCH)


def worker(args):
    """One process of a run: writes WORK/rank<r>.json."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import keras
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size, tnt = 0, 1, None
    if not args.serial:
        import tarantella as tnt
        tnt.init()
        rank, size = tnt.get_rank(), tnt.get_size()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((WIDTH,)),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    if tnt is not None:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    ds = dataset(tf, np)
    modes = ["serial"] if args.serial else ["share", "whole"]

    def use(mode):
        if mode != "serial":
            os.environ["TNT_DATA_SHARE"] = "1" if mode == "share" else "0"

    def input_pass():
        mine = ds if tnt is None else tnt.data.distribute(ds)
        start = time.process_time()
        rows = sum(int(batch[1].shape[0]) for batch in mine)
        return time.process_time() - start, rows

    def epoch():
        start = time.perf_counter()
        model.fit(ds, epochs=1, verbose=0)
        return time.perf_counter() - start

    for mode in modes:  # warm-up: traces the step, builds the functions
        use(mode)
        input_pass()
        epoch()
    found = {m: {"epoch_s": [], "input_cpu_s": [], "rows": 0} for m in modes}
    for trial in range(args.trials):
        for mode in (modes if trial % 2 == 0 else modes[::-1]):
            use(mode)
            cpu, rows = input_pass()
            found[mode]["input_cpu_s"].append(cpu)
            found[mode]["rows"] = rows
            found[mode]["epoch_s"].append(epoch())
    with open(os.path.join(args.work, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "size": size, "modes": found}, f)
    return 0


def measure(args, ranks):
    """Per-mode results of a run on `ranks` ranks (0: serial Keras)."""
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
    for mode in docs[0]["modes"]:
        per_rank = [d["modes"][mode] for d in docs]
        results[mode] = {
            "epoch_s": round(statistics.median(per_rank[0]["epoch_s"]), 4),
            "epoch_s_trials": [round(v, 4) for v in per_rank[0]["epoch_s"]],
            "input_cpu_s": [round(statistics.median(p["input_cpu_s"]), 4) for p in per_rank],
            "rows": [p["rows"] for p in per_rank],
        }
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "bench",
                                                 "results", "data_share.json"))
    p.add_argument("--quick", action="store_true", help="1 and 2 ranks, 2 trials")
    p.add_argument("--trials", type=int)
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
        args.trials = 2 if args.quick else 5
    if args.worker:
        return worker(args)
    ranks = [int(r) for r in (args.ranks or ("1,2" if args.quick else "1,2,4")).split(",")]
    load_before = [round(v, 2) for v in os.getloadavg()]
    serial = measure(args, 0)["serial"]
    runs = []
    for n in ranks:
        found = measure(args, n)
        for mode in ("share", "whole"):
            runs.append({"ranks": n, "share": mode == "share", **found[mode]})
    ratios = {}
    for n in ranks:
        on, off = (next(r for r in runs if r["ranks"] == n and r["share"] == s)
                   for s in (True, False))
        ratios[str(n)] = {
            "input_cpu_share_vs_whole": round(statistics.mean(on["input_cpu_s"]) /
                                              statistics.mean(off["input_cpu_s"]), 3),
            "epoch_share_vs_whole": round(on["epoch_s"] / off["epoch_s"], 3),
            "epoch_share_vs_serial": round(on["epoch_s"] / serial["epoch_s"], 3),
        }
    doc = {"benchmark": "data_share", "samples": SAMPLES, "global_batch": BATCH,
           "map_matmuls": MATMULS, "width": WIDTH, "trials": args.trials,
           "cpus": os.cpu_count(), "load_average_before": load_before,
           "load_average_after": [round(v, 2) for v in os.getloadavg()],
           "serial": serial, "runs": runs, "ratios": ratios}
    out = os.path.abspath(args.out)
    write_json(out, doc)
    print(f"serial Keras: epoch {serial['epoch_s']:.3f} s, input CPU "
          f"{serial['input_cpu_s'][0]:.3f} s")
    for r in runs:
        print(f"{r['ranks']} rank(s), sharing {'on ' if r['share'] else 'off'}: epoch "
              f"{r['epoch_s']:.3f} s, input CPU per rank {r['input_cpu_s']}, rows {r['rows']}")
    print("ratios (share / whole):", json.dumps(ratios))
    print(f"load average before {load_before}, after {doc['load_average_after']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
