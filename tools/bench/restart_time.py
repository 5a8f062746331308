#!/usr/bin/env python3
"""The time from a rank's death to the first training step of the restarted job.

Runs the quick start with BackupAndRestore under `tarantella --max-restarts
1`, kills the last rank after --kill-step, and splits the time to the next
attempt's first step into restart, import, init and resume; the method:
docs/research/benchmarks.md.

    tools/bench/restart_time.py [--ranks 2] [--trials 3] [--json OUT.jsonl]
"""
import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from bench_results import module_of, write_results  # noqa: E402

PARTS = ("restart", "import", "init", "resume")


def worker(args):
    """One rank of one attempt: trains, kills itself (first attempt, last
    rank, after --kill-step), or records its times (later attempts)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    import tarantella as tnt
    imported = time.time()
    tnt.init()
    initialized = time.time()
    fashion_mnist = module_of("examples", "fashion_mnist")
    DATA_DIR, load_fashion_mnist = fashion_mnist.DATA_DIR, fashion_mnist.load_fashion_mnist
    lenet5_model_generator = module_of("examples", "quick_start").lenet5_model_generator
    attempt = int(os.environ["TNT_RESTART_COUNT"])
    rank, last = tnt.get_rank(), tnt.get_size() - 1

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if attempt == 0 and rank == last and self.steps == args.kill_step:
                with open(os.path.join(args.worker, "fault.json"), "w") as f:
                    json.dump({"fault": time.time()}, f)
                os.kill(os.getpid(), signal.SIGKILL)
            if attempt > 0 and self.steps == 1:
                with open(os.path.join(args.worker, f"rank{rank}.json"), "w") as f:
                    json.dump({"started": STARTED, "imported": imported,
                               "initialized": initialized, "first_step": time.time()}, f)
                self.model.stop_training = True

    keras.utils.set_random_seed(42)
    (x, y), _ = load_fashion_mnist(DATA_DIR)
    batch, steps = 64, args.kill_step + args.save_freq
    data = tf.data.Dataset.from_tensor_slices((x[:batch * steps], y[:batch * steps]))
    data = data.shuffle(batch * steps, seed=42).batch(batch)
    model = tnt.Model(lenet5_model_generator())
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    backup = keras.callbacks.BackupAndRestore(os.path.join(args.worker, "backup"),
                                              save_freq=args.save_freq)
    model.fit(data, epochs=1, verbose=0, callbacks=[Clock(), backup])


def trial(args, directory):
    """Runs one job that fails once; returns the parts' seconds."""
    launcher = shutil.which("tarantella")
    if launcher is None:
        sys.exit("restart_time.py: the tarantella launcher is not on PATH")
    cmd = [launcher, "--no-gpu", "--max-restarts", "1", "-n", str(args.ranks),
           "--run-dir", os.path.join(directory, "run"), "--", sys.executable,
           os.path.abspath(__file__), "--worker", directory, "--kill-step", str(args.kill_step),
           "--save-freq", str(args.save_freq)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0 or "attempt 2 succeeded after 1 restart(s)" not in proc.stderr:
        sys.exit(f"restart_time.py: {' '.join(cmd)} exited with {proc.returncode}:\n"
                 f"{proc.stderr[-4000:]}")
    with open(os.path.join(directory, "fault.json")) as f:
        fault = json.load(f)["fault"]
    ranks = []
    for r in range(args.ranks):
        with open(os.path.join(directory, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    last = {k: max(t[k] for t in ranks) for k in ranks[0]}
    return {"restart": last["started"] - fault, "import": last["imported"] - last["started"],
            "init": last["initialized"] - last["imported"],
            "resume": last["first_step"] - last["initialized"],
            "total": last["first_step"] - fault, "command": " ".join(cmd)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--save-freq", type=int, default=50)
    parser.add_argument("--kill-step", type=int, default=60,
                        help="the step after which the last rank dies (after the backup of "
                             "step save_freq: the resumed fit skips save_freq batches)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--json", help="write the results file here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    runs = []
    for t in range(args.trials):
        directory = tempfile.mkdtemp(prefix="tnt-restart-time-")
        try:
            runs.append(trial(args, directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        print(f"trial {t}: " + ", ".join(f"{k} {runs[-1][k]:.2f} s"
                                         for k in PARTS + ("total",)), flush=True)
    median = sorted(range(len(runs)), key=lambda t: runs[t]["total"])[(len(runs) - 1) // 2]
    middle = runs[median]
    tf_startup = middle["import"] + middle["init"]
    print(f"the median of {len(runs)} trials: fault to the first step of the next attempt "
          f"{middle['total']:.2f} s, of which TensorFlow's start-up (import + init) "
          f"{tf_startup:.2f} s")
    if args.json:
        write_results(args.json, "reliability_restart", {
            "config": {"ranks": args.ranks, "save_freq": args.save_freq,
                       "kill_step": args.kill_step, "trials": args.trials,
                       "model": "quick start (LeNet-5, global batch 64)",
                       "command": runs[0]["command"], "load_average": os.getloadavg()[0],
                       "cpus": os.cpu_count()},
            "trials": [{"trial": t, **{f"{k}_s": r[k] for k in PARTS + ("total",)}}
                       for t, r in enumerate(runs)],
            "median_trial": median, "tf_startup_s": tf_startup})


if __name__ == "__main__":
    main()
