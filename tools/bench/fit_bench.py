"""Training-step benchmarks of the Keras layer (ratios measured in one run).

overhead   1 rank: tnt.Model.fit against plain keras fit, same model, data
           and settings, trials interleaved.
sweep      N ranks (under mpirun): fit step time for each fusion threshold,
           trials interleaved.

    python3 tools/bench/fit_bench.py overhead [--json overhead.json]
    mpirun -np 2 python3 tools/bench/fit_bench.py sweep --thresholds 0,8,32,128,1024,65536

--json PATH also writes the results file (rank 0 only; bench_results.py).
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402
import bench_models  # noqa: E402
import bench_results  # noqa: E402
from tarantella import settings  # noqa: E402


def lenet5():
    return bench_models.lenet5(keras)


def deep_mlp():
    """Many small tensors: where the number of buckets matters most."""
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Flatten()(inputs)
    for _ in range(24):
        x = keras.layers.Dense(128, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


def small_cnn():
    """Three convolutions and a 256-unit dense layer on 32x32x3 images: a
    step short enough that per-step framework costs show."""
    inputs = keras.Input(shape=(32, 32, 3))
    x = inputs
    for filters in (32, 64, 64):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


MODELS = {"lenet5": lenet5, "deep_mlp": deep_mlp, "small_cnn": small_cnn}


def data(n, batch, name="lenet5"):
    rng = np.random.default_rng(0)
    shape = MODELS[name]().input_shape[1:]
    x = rng.random((n,) + tuple(shape), dtype=np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache()


def step_time(model, ds, steps):
    """Seconds per step of one epoch, after a warm-up epoch."""
    model.fit(ds, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(ds, epochs=1, verbose=0)
    return (time.perf_counter() - start) / steps


def build(wrap, jit_compile="auto", name="lenet5"):
    keras.utils.set_random_seed(1)
    model = MODELS[name]()
    if wrap:
        model = tnt.Model(model)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=jit_compile)
    return model


def write_results(path, bench, doc):
    """Prints the results on rank 0 and writes them to `path` (if given)."""
    if tnt.is_master_rank():
        bench_results.write_results(path, bench, doc)


def ms(values):
    return [round(v * 1e3, 4) for v in values]


def overhead(args):
    """tnt.Model never XLA-compiles the step, so the peer that isolates the
    framework's own overhead is Keras with jit_compile=False; Keras with its
    default ("auto") is shown too, as what a user would otherwise run."""
    steps = args.samples // args.batch
    ds = data(args.samples, args.batch, args.model)
    models = {"keras": build(False, False, args.model),
              "keras_auto": build(False, "auto", args.model),
              "tnt": build(True, name=args.model)}
    times = {name: [] for name in models}
    for trial in range(args.trials):
        order = list(models.items())
        if trial % 2:
            order.reverse()
        for name, model in order:
            times[name].append(step_time(model, ds, steps))
    med = {name: statistics.median(t) for name, t in times.items()}
    write_results(args.json, "overhead", {
        "config": {"model": args.model, "ranks": tnt.get_size(), "batch": args.batch,
                   "steps_per_epoch": steps, "trials": args.trials},
        "runs": [{"run": name, "ms_per_step": round(med[name] * 1e3, 4),
                  "trials_ms": ms(times[name])} for name in models],
        "ratio_tnt_keras": med["tnt"] / med["keras"],
        "ratio_tnt_keras_auto": med["tnt"] / med["keras_auto"],
    })


def sweep(args):
    steps = args.samples // args.batch
    ds = data(args.samples, args.batch, args.model)
    thresholds = [float(v) for v in args.thresholds.split(",")]
    models = [build(True, name=args.model) for _ in thresholds]
    times = [[] for _ in thresholds]
    # Trials are interleaved, in an order that rotates from trial to trial,
    # so that noise from other work hits every threshold alike. The
    # threshold is read when a model's step is first traced (its first fit).
    for trial in range(args.trials):
        for k in range(len(thresholds)):
            i = (k + trial) % len(thresholds)
            os.environ["TNT_FUSION_THRESHOLD_KB"] = str(thresholds[i])
            settings.load()
            times[i].append(step_time(models[i], ds, steps))
    rows = [(kb, statistics.median(t), t) for kb, t in zip(thresholds, times)]
    weights = MODELS[args.model]().trainable_weights
    write_results(args.json, "fusion_sweep", {
        "config": {
            "model": args.model, "ranks": tnt.get_size(), "global_batch": args.batch,
            "steps_per_epoch": steps, "trials": args.trials,
            "default_threshold_kb": float(next(s["default"] for s in settings.describe()
                                               if s["name"] == "TNT_FUSION_THRESHOLD_KB")),
            "tensors": len(weights),
            "gradient_bytes": int(sum(np.prod(w.shape) * 4 for w in weights))},
        "rows": [{"threshold_kb": kb, "ms_per_step": round(t * 1e3, 4), "trials_ms": ms(tr)}
                 for kb, t, tr in rows],
    })


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["overhead", "sweep"])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--thresholds", default="0,8,32,128,1024,65536")
    p.add_argument("--model", choices=sorted(MODELS), default="lenet5",
                   help="model to train")
    p.add_argument("--json", metavar="PATH", help="also write the results file (rank 0)")
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tnt.init()
    overhead(args) if args.mode == "overhead" else sweep(args)


if __name__ == "__main__":
    main()
