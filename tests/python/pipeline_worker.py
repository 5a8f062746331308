"""Pipelined training, serially (plain Keras) or on the ranks of a Tarantella job.

  pipeline_worker.py CASE --out DIR [--serial] [--stages K] [--replicas R]
                     [--optimizer NAME] [--micro-batches M] [--num-stages K]
                     [--schedule NAME]
  pipeline_worker.py --runs RUN[,RUN...] --out DIR [--serial] [--micro-batches M]
      several trainings in one job, one after another, each into DIR/RUN/;
      RUN is CASE-K-R-OPTIMIZER-VARIANT, VARIANT a schedule or "recompute"
      (1F1B with TNT_PIPELINE_WEIGHT_GRADIENTS=recompute), followed by
      "+fn" for --build-fn, "+recompute" for the schedule with
      TNT_PIPELINE_WEIGHT_GRADIENTS=recompute; --save NAME saves each into
      DIR/RUN/NAME

Cases (every rank writes DIR/rank<r>.npz: per-epoch loss, mae, val_loss,
evaluate's results, predictions, and the weights of the whole model):
  mlp    three dense layers, cut after the first K - 1 of them (regression)
  skip   two tensors cross each cut (a skip connection around the first
         layers of each stage, through its own SplitLayer)
  cls    a classifier (sparse categorical cross-entropy, accuracy), with L2
         regularization on every stage's kernel
  seq    the mlp as a keras.Sequential model
  two    the mlp with a second output on its last stage: two losses, weighted
         (per-output losses in the results as "output_losses")
150 samples in global batches of 20: the replicas and the micro-batches get
unequal shares, and the last batch is partial. With --save PATH the model
is saved after training (the master writes it). With --build-fn the model
is given to tnt.Model as the function that builds it; then every rank also
writes DIR/rank<r>-stage.npz: its stage's weights before training
("init/<path>"; serially, those of a normal build), and the error that
reading a weight of another stage raised after building, fit, evaluate,
predict and save ("guard/<when>").
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
from keras import tree  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import tarantella as tnt  # noqa: E402
from tarantella import settings  # noqa: E402
import stage_guard  # noqa: E402

SAMPLES, BATCH, EPOCHS = 150, 20, 3
CASES = ["mlp", "skip", "cls", "seq", "two"]
Split = tnt.keras.layers.SplitLayer


def data(case):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    if case == "cls":
        y = np.argmax(x @ rng.normal(size=(6, 4)), axis=1).astype(np.int32)
    else:
        y = (np.tanh(x @ rng.normal(size=(6, 3)))).astype(np.float32)
    if case == "two":
        return x, {"out": y, "aux": y[:, :2] * 2.0}
    return x, y


def build(case, stages):
    """The model of `case` cut into `stages` stages. The mlp's layers are
    the same for every number of stages (up to 4): only its cuts move."""
    keras.utils.set_random_seed(11)
    inputs = keras.Input((6,), name="x")
    if case in ("mlp", "seq", "two"):
        layers = []
        for k in range(3):
            layers.append(keras.layers.Dense(12, activation="tanh", name=f"d{k}"))
            if k < stages - 1:
                layers.append(Split(name=f"cut{k + 1}"))
        layers.append(keras.layers.Dense(3, name="out"))
        if case == "seq":
            return keras.Sequential([inputs] + layers, name="seq")
        h = inputs
        for layer in layers[:-1]:
            h = layer(h)
        if case == "two":
            aux = keras.layers.Dense(2, name="aux")(h)
            return keras.Model(inputs, {"out": layers[-1](h), "aux": aux}, name="two")
        return keras.Model(inputs, layers[-1](h), name="mlp")
    reg = keras.regularizers.L2(1e-3) if case == "cls" else None
    h = keras.layers.Dense(12, activation="tanh", kernel_regularizer=reg, name="d0")(inputs)
    skip = keras.layers.Dense(5, name="s0")(inputs) if case == "skip" else None
    for k in range(1, stages):
        h = Split(name=f"cut{k}")(h)
        if skip is not None:
            skip = Split(name=f"cut{k}_skip")(skip)
            h = keras.layers.Concatenate(name=f"join{k}")([h, skip])
            skip = keras.layers.Dense(5, name=f"s{k}")(h)
        h = keras.layers.Dense(12, activation="tanh", kernel_regularizer=reg, name=f"d{k}")(h)
    out = keras.layers.Dense(4 if case == "cls" else 3, name="out")(h)
    return keras.Model(inputs, out, name=f"{case}{stages}")


def optimizer(name):
    return {"adam": lambda: keras.optimizers.Adam(0.01),
            "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
            "rmsprop": lambda: keras.optimizers.RMSprop(0.005)}[name]()


def compile_model(model, case, opt):
    if case == "cls":
        model.compile(optimizer=optimizer(opt), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elif case == "two":
        model.compile(optimizer=optimizer(opt), loss={"out": "mse", "aux": "mae"},
                      loss_weights={"out": 1.0, "aux": 0.5}, metrics={"out": ["mae"]})
    else:
        model.compile(optimizer=optimizer(opt), loss="mse", metrics=["mae"])


def guard(model, when, out):
    """Reads every weight of the other stages of a model given as a build
    function; each read must fail. out["guard/<when>"]: the first error, or
    the weights that were read."""
    if not hasattr(model, "_tnt"):
        return
    read, errors = stage_guard.read_other_stages(tnt, model)
    out[f"guard/{when}"] = np.array(f"read: {read}" if read else
                                    errors[0] if errors else "no other weights")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", nargs="?", choices=CASES)
    p.add_argument("--runs", help="CASE-K-R-OPTIMIZER-VARIANT, comma-separated: one "
                                  "training each, into DIR/<run>/")
    p.add_argument("--out", required=True)
    p.add_argument("--serial", action="store_true")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--micro-batches", type=int, default=3)
    p.add_argument("--schedule", help="tnt.Model's pipeline_schedule (default: "
                                      "TNT_PIPELINE_SCHEDULE's)")
    p.add_argument("--save")
    p.add_argument("--build-fn", action="store_true",
                   help="give tnt.Model the function that builds the model")
    p.add_argument("--num-stages", type=int,
                   help="build the model without SplitLayers and let Tarantella cut it into "
                        "this many stages (num_stages); the cuts go to the results as 'cuts'")
    p.add_argument("--mixed", nargs="?", const="mixed_float16", metavar="POLICY",
                   help="mixed precision (mixed_float16, or the policy named)")
    p.add_argument("--callbacks", metavar="DIR",
                   help="train with ModelCheckpoint (DIR/ckpt-<epoch>.keras), "
                        "ReduceLROnPlateau and EarlyStopping")
    args = p.parse_args()
    if (args.case is None) == (args.runs is None):
        p.error("give a CASE or --runs")
    if args.mixed:
        keras.mixed_precision.set_global_policy(args.mixed)
    if not args.serial:
        tnt.init()
    if args.case:
        return train(args, args.out)
    for spec in args.runs.split(","):
        case, stages, replicas, optimizer, variant = spec.split("-", 4)
        variant, *flags = variant.split("+")
        recompute = variant == "recompute" or "recompute" in flags
        os.environ["TNT_PIPELINE_WEIGHT_GRADIENTS"] = "recompute" if recompute else "accumulate"
        settings.load()
        out = os.path.join(args.out, spec)
        train(argparse.Namespace(**dict(
            vars(args), case=case, stages=int(stages), replicas=int(replicas),
            optimizer=optimizer, schedule=None if variant == "recompute" else variant,
            build_fn=args.build_fn or "fn" in flags,
            save=args.save and os.path.join(out, args.save))), out)


def train(args, out):
    """Builds, trains, evaluates and saves the model as `args` say; writes
    the results to `out`."""
    os.makedirs(out, exist_ok=True)
    x, y = data(args.case)
    stages = 1 if args.num_stages else args.stages
    if args.build_fn:
        model = lambda: build(args.case, stages)  # noqa: E731
    else:
        model = build(args.case, stages)
    rank = 0
    if not args.serial:
        rank = tnt.get_rank()
        strategy = (tnt.ParallelStrategy.ALL if args.replicas > 1
                    else tnt.ParallelStrategy.PIPELINING)
        auto = {"num_stages": args.num_stages} if args.num_stages else {}
        model = tnt.Model(model, parallel_strategy=strategy,
                          num_micro_batches=args.micro_batches,
                          pipeline_schedule=args.schedule, **auto)
    stage_file = {}
    if args.build_fn and args.serial:  # a normal build's weights, to compare with
        model = model()
        stage_file.update({f"init/{v.path}": v.numpy() for v in model.weights})
    elif args.build_fn:
        stage_file.update({f"init/{v.path}": v.numpy() for v in model._tnt.pipeline.model.weights})
        guard(model, "build", stage_file)
    compile_model(model, args.case, args.optimizer)
    callbacks = []
    if args.callbacks:
        callbacks = [
            keras.callbacks.ModelCheckpoint(os.path.join(args.callbacks, "ckpt-{epoch}.keras")),
            # min_delta so large that the rate halves after every epoch.
            keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=10.0),
            keras.callbacks.EarlyStopping("val_loss", patience=5, restore_best_weights=True)]
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x[:50], tree.map_structure(lambda t: t[:50], y)),
                        callbacks=callbacks)
    guard(model, "fit", stage_file)
    metric = {"cls": "accuracy", "two": "out_mae"}.get(args.case, "mae")
    predicted = model.predict(x, batch_size=BATCH, verbose=0)
    if isinstance(predicted, dict):
        predicted = np.concatenate([predicted[k] for k in sorted(predicted)], axis=1)
    results = {"loss": np.array(history.history["loss"]),
               "metric": np.array(history.history[metric]),
               "val_loss": np.array(history.history["val_loss"]),
               "evaluate": np.array(model.evaluate(x, y, batch_size=BATCH, verbose=0)),
               "predict": np.asarray(predicted, np.float32),
               "learning_rate": np.array(history.history.get("learning_rate", []))}
    if args.case == "two":
        results["output_losses"] = np.array(
            [history.history[f"{k}_loss"] for k in ("out", "aux")])
    guard(model, "evaluate and predict", stage_file)
    if args.num_stages and not args.serial:
        results["cuts"] = np.array([",".join(c) for c in model._tnt.pipeline.partition.cut_names])
    for i, w in enumerate(model.get_weights()):
        results[f"w{i}"] = w
    if args.save:
        model.save(args.save)
        guard(model, "save", stage_file)
    if stage_file:
        np.savez(os.path.join(out, f"rank{rank}-stage.npz"), **stage_file)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **results)


if __name__ == "__main__":
    sys.exit(main())
