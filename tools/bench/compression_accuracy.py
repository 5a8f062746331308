#!/usr/bin/env python3
"""What gradient compression does to accuracy: LeNet-5 on Fashion-MNIST.

Trains the same LeNet-5 from the same initial weights on 2 ranks with
TNT_COMPRESSION none, fp16 and bf16 (one launcher run per setting, the
settings in turn) and records, per epoch, the training loss and the test
accuracy, plus the loss every `--every` steps (the loss curves). Writes one
results file with every curve (`make bench STAGES=compression` runs it):

    python3 tools/bench/compression_accuracy.py --epochs 2 --samples 30000 \\
        --out bench/results/compression_accuracy.jsonl

Needs Debian's dataset-fashion-mnist and Tarantella installed (the
`tarantella` launcher on PATH).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_results import finish_config, new_config, write_results

SETTINGS = ["none", "fp16", "bf16"]
GLOBAL_BATCH = 64


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import keras
    import tarantella as tnt
    import bench_models
    import train_compare

    tnt.init()
    x, y = train_compare.arrays("lenet5", GLOBAL_BATCH)
    xt = train_compare._read_idx(os.path.join(train_compare.DATA_DIR,
                                              "t10k-images-idx3-ubyte.gz"))
    yt = train_compare._read_idx(os.path.join(train_compare.DATA_DIR,
                                              "t10k-labels-idx1-ubyte.gz"))
    xt = (xt.astype(np.float32) / 255.0)[..., np.newaxis]
    yt = yt.astype(np.int32)
    if args.samples:
        x, y = x[:args.samples], y[:args.samples]
    keras.utils.set_random_seed(1)
    model = tnt.Model(bench_models.lenet5(keras))
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    curve = []

    class Curve(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch % args.every == 0:
                curve.append(float(logs["loss"]))

    epochs = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        h = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=True, verbose=0,
                      callbacks=[Curve()])
        seconds = time.perf_counter() - t0
        _, acc = model.evaluate(xt, yt, batch_size=1000, verbose=0)
        epochs.append({"epoch": epoch + 1, "loss": round(float(h.history["loss"][-1]), 5),
                       "test_accuracy": round(float(acc), 5), "seconds": round(seconds, 2)})
    if tnt.is_master_rank():
        with open(args.result, "w") as f:
            json.dump({"epochs": epochs, "curve": curve}, f)


def driver(args):
    launcher = shutil.which("tarantella")
    if launcher is None:
        sys.exit("compression_accuracy: the tarantella launcher is not on PATH")
    out = {"config": new_config(model="lenet5", dataset="Fashion-MNIST", ranks=args.ranks,
                                global_batch=GLOBAL_BATCH, epochs=args.epochs,
                                samples=args.samples or 60000, loss_every_steps=args.every,
                                optimizer="SGD(0.01, momentum=0.9)"),
           "epochs": [], "curves": []}
    work = tempfile.mkdtemp(prefix="tnt-compression-")
    for setting in SETTINGS:
        result = os.path.join(work, f"{setting}.json")
        env = dict(os.environ, TNT_COMPRESSION=setting)
        cmd = [launcher, "--no-gpu", "-n", str(args.ranks), "--run-dir",
               os.path.join(work, f"run-{setting}"), "--", sys.executable,
               os.path.abspath(__file__), "--worker", "--result", result, "--epochs",
               str(args.epochs), "--every", str(args.every), "--samples", str(args.samples)]
        subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
        with open(result) as f:
            got = json.load(f)
        out["epochs"] += [{"compression": setting, **e} for e in got["epochs"]]
        out["curves"].append({"compression": setting, "loss": got["curve"]})
        last = got["epochs"][-1]
        print(f"{setting}: final loss {last['loss']:.4f}, test accuracy "
              f"{last['test_accuracy']:.4f}", flush=True)
    finish_config(out["config"])
    if args.out:
        write_results(args.out, "compression_accuracy", out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the results file here")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=0,
                   help="train on the first N samples only (default: all 60000)")
    p.add_argument("--every", type=int, default=20, help="steps between points of the curve")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
