"""Runs the Python cases of the bad-input matrix in one process per rank.

Importing TensorFlow costs seconds, so the independent cases share one
process: each case's code runs in a namespace of its own, and its outcome
is what the case would give as a program of its own: the exception (type
and message) and the exit status an uncaught exception gives (1), or 0.

Usage: bad_input_worker.py CASES.json OUT_DIR
CASES.json holds [{"id": ..., "code": ..., "init": bool}, ...]; the cases
run in that order (those with init false first: they run before
tnt.init()). Rank r appends one JSON line per case to OUT_DIR/rank<r>.jsonl,
and a "start" line before it, so that a hang names its case.
"""
import json
import os
import sys
import tempfile
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tarantella as tnt  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)


def make_data(n, seed=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=n).astype(np.int32)
    return x, y


def make_model(width=8, seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(4, activation="softmax")])


def compiled(width=8):
    model = tnt.Model(make_model(width))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def rank_from_env():
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def main():
    cases_path, out_dir = sys.argv[1], sys.argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    rank = rank_from_env()
    work = tempfile.mkdtemp(prefix=f"bad-input-r{rank}-", dir=out_dir)
    shared = os.path.join(out_dir, "shared")
    os.makedirs(shared, exist_ok=True)
    x, y = make_data(40)
    base = {"np": np, "tf": tf, "keras": keras, "tnt": tnt, "x": x, "y": y,
            "ds": tf.data.Dataset.from_tensor_slices((x, y)), "make_data": make_data,
            "make_model": make_model, "compiled": compiled, "work": work, "shared": shared,
            "os": os}
    with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a") as out:
        def emit(**record):
            out.write(json.dumps(record) + "\n")
            out.flush()

        for case in sorted(cases, key=lambda c: c["init"]):
            emit(id=case["id"], event="start")
            if case["init"]:
                tnt.init()
            outcome = {"exit": 0, "type": None, "message": ""}
            try:
                exec(compile(case["code"], f"<case {case['id']}>", "exec"), dict(base))
            except SystemExit as e:
                code = e.code
                outcome = {"exit": code if isinstance(code, int) else (0 if code is None else 1),
                           "type": "SystemExit", "message": "" if code is None else str(code)}
            except BaseException as e:  # noqa: B902 -- the case's outcome, whatever it is
                outcome = {"exit": 1, "type": type(e).__name__, "message": str(e),
                           "traceback": traceback.format_exc()[-3000:]}
            emit(id=case["id"], event="end", **outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
