"""Pipeline and hybrid parallelism against serial Keras.

2 stages on 2 ranks, 3 stages on 3 ranks, 2 stages x 2 replicas on 4 ranks:
per-epoch loss, metrics, validation loss, evaluate and predict equal plain
Keras training with the same global batch (1e-5 loss, 1e-4 weights), with
several optimizers, skip connections across cuts, regularization, unequal
micro-batches and a partial last batch; every rank ends with identical
weights; a model of two outputs also has each output's loss as serial
Keras has it (every schedule trains 1F1B's weights bitwise:
test_pipeline_schedules.py). A pipelined model
saves a plain Keras file that loads on one rank and predicts the same. Bad
models and settings fail with errors that say what to change, and a killed
stage ends the job like a killed data-parallel rank."""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run
from test_training import assert_ranks_identical, load

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "pipeline_worker.py")
HERE = os.path.dirname(os.path.abspath(__file__))

# (case, stages, replicas, optimizer, variant): the variant is a schedule,
# or "recompute": 1F1B with TNT_PIPELINE_WEIGHT_GRADIENTS=recompute.
CONFIGS = [
    ("mlp", 2, 1, "adam", "1f1b"),
    ("skip", 2, 1, "rmsprop", "1f1b"),
    ("cls", 3, 1, "rmsprop", "1f1b"),
    ("mlp", 2, 2, "adam", "1f1b"),
    ("cls", 2, 2, "sgd", "gpipe"),
    ("seq", 2, 1, "sgd", "recompute"),
    ("skip", 3, 1, "adam", "recompute"),
    ("cls", 3, 1, "rmsprop", "recompute"),
    ("mlp", 2, 2, "adam", "recompute"),
    ("two", 2, 2, "adam", "1f1b"),
    ("two", 3, 1, "sgd", "recompute"),
]


_serial = {}


def serial_runs(tmp_path_factory, keys):
    """Serial Keras's results of each (case, stages, optimizer) of `keys`,
    computed once a session, those not computed yet in one process."""
    missing = sorted(set(keys) - set(_serial))
    if missing:
        d = str(tmp_path_factory.mktemp("serial"))
        specs = [f"{case}-{stages}-1-{optimizer}-1f1b" for case, stages, optimizer in missing]
        run([sys.executable, WORKER, "--serial", "--runs", ",".join(specs), "--out", d])
        for key, spec in zip(missing, specs):
            _serial[key] = load(os.path.join(d, spec), 1)[0]
    return [_serial[key] for key in keys]


def serial_run(tmp_path_factory, case, stages, optimizer):
    return serial_runs(tmp_path_factory, [(case, stages, optimizer)])[0]


def pipelined_runs(tmp_path_factory, ranks, specs, *args, timeout=600):
    """The worker's runs `specs` (CASE-K-R-OPTIMIZER-VARIANT) trained one
    after another in one job of `ranks` ranks, with `args` added: each
    run's results on every rank, by its spec."""
    d = str(tmp_path_factory.mktemp(f"pipelined-{ranks}"))
    run(mpirun_command(ranks, sys.executable, WORKER, "--runs", ",".join(specs), "--out", d,
                       *args), timeout=timeout)
    return {spec: load(os.path.join(d, spec), ranks) for spec in specs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every configuration's results (pipelined, on every rank), computed
    once for the tests below: one job per number of ranks."""
    out = {}
    for ranks in sorted({stages * replicas for _, stages, replicas, _, _ in CONFIGS}):
        configs = {"-".join(map(str, c)): c for c in CONFIGS if c[1] * c[2] == ranks}
        results = pipelined_runs(tmp_path_factory, ranks, list(configs))
        out.update({c: results[spec] for spec, c in configs.items()})
    serial_runs(tmp_path_factory, [(case, stages, opt) for case, stages, _, opt, _ in CONFIGS])
    return out


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
def test_pipeline_equals_serial(config, runs, tmp_path_factory):
    case, stages, _, optimizer, _ = config
    want = serial_run(tmp_path_factory, case, stages, optimizer)
    results = runs[config]
    assert_ranks_identical(results)
    assert_matches_serial(results[0], want, config)


def assert_matches_serial(got, want, what):
    """A pipelined run's results (pipeline_worker.py) against serial Keras's:
    per-epoch loss, metric, validation loss and evaluate within 1e-5,
    predictions and every weight within 1e-4."""
    for key in ("loss", "metric", "val_loss", "evaluate", "output_losses"):
        if key not in want:  # output_losses: models of several outputs
            continue
        assert np.allclose(got[key], want[key], rtol=0, atol=1e-5), \
            f"{what}: {key} {got[key]} differs from serial {want[key]}"
    assert got["predict"].shape == want["predict"].shape
    assert np.abs(got["predict"] - want["predict"]).max() < 1e-4
    weights = [k for k in want if k.startswith("w")]
    assert weights and len(weights) == len([k for k in got if k.startswith("w")])
    for key in weights:
        diff = np.abs(got[key] - want[key]).max()
        assert diff < 1e-4, f"{what}: weight {key} differs from serial by {diff}"
    # The figures behind the tolerances (pytest -s shows them).
    print(f"{what}: largest difference from serial Keras: loss "
          f"{np.abs(np.subtract(got['loss'], want['loss'])).max():.2e}, weights "
          f"{max(np.abs(got[k] - want[k]).max() for k in weights):.2e}")


def test_saved_pipeline_loads_on_one_rank_and_in_other_pipelines(tmp_path, python):
    """Saved from 2 stages: plain Keras loads it and predicts what the
    pipeline predicted; its weights load into the same model cut into 3
    stages (on 3 ranks) and into 2 replicas of the 2-stage pipeline."""
    path = str(tmp_path / "pipelined.keras")
    out = str(tmp_path / "trained")
    run(mpirun_command(2, python, WORKER, "mlp", "--out", out, "--stages", "2", "--save", path),
        timeout=600)
    trained = load(out, 2)[0]
    check = str(tmp_path / "check.py")
    with open(check, "w") as f:
        f.write(f"""
import sys
sys.path.insert(0, {HERE!r})
import numpy as np, keras
import tarantella  # registers SplitLayer
from pipeline_worker import data
model = keras.saving.load_model({path!r})
x, _ = data("mlp")
np.save({str(tmp_path / "loaded.npy")!r}, model.predict(x, batch_size=20, verbose=0))
model.save_weights({str(tmp_path / "w.weights.h5")!r})
""")
    run([python, check])
    loaded = np.load(str(tmp_path / "loaded.npy"))
    assert np.abs(loaded - trained["predict"]).max() < 1e-5

    reload = str(tmp_path / "reload.py")
    with open(reload, "w") as f:
        f.write(f"""
import sys
sys.path.insert(0, {HERE!r})
import numpy as np, keras
import tarantella as tnt
from pipeline_worker import build, data
tnt.init()
stages = int(sys.argv[1]); replicas = tnt.get_size() // stages
model = tnt.Model(build("mlp", stages), num_micro_batches=2,
                  parallel_strategy=tnt.ParallelStrategy.ALL)
model.load_weights({str(tmp_path / "w.weights.h5")!r})
x, _ = data("mlp")
p = model.predict(x, batch_size=20, verbose=0)
np.save({str(tmp_path)!r} + f"/p{{stages}}x{{replicas}}.rank{{tnt.get_rank()}}.npy", p)
""")
    run(mpirun_command(3, python, reload, "3"), timeout=600)
    run(mpirun_command(4, python, reload, "2"), timeout=600)
    for name, n in (("p3x1", 3), ("p2x2", 4)):
        for r in range(n):
            p = np.load(str(tmp_path / f"{name}.rank{r}.npy"))
            assert np.abs(p - trained["predict"]).max() < 1e-5, f"{name} rank {r}"


ERRORS = {
    "no_split": ("PIPELINING", "has no SplitLayer"),
    "crossing": ("PIPELINING", "may only cross a cut through a SplitLayer"),
    "two_inputs": ("PIPELINING", "a SplitLayer cuts one tensor"),
    "empty_stage": ("PIPELINING", "holds no layer"),
    "micro_batches": ("PIPELINING", "num_micro_batches=0 must be a whole number"),
    "ranks": ("PIPELINING", "run exactly 2 ranks"),
    "ranks_all": ("ALL", "do not divide the 3 ranks"),
    "subclassed": ("PIPELINING", "is not a functional or Sequential model"),
    "custom_step": ("PIPELINING", "a pipeline runs its own train_step"),
    "data_with_micro_batches": ("DATA", "num_micro_batches applies to pipelined models only"),
    "custom_loop": ("PIPELINING", "a pipeline trains through the model's own fit"),
    "recompute_dropout": ("PIPELINING", "layer 'drop' (Dropout) draws random numbers"),
    "recompute_batch_norm": ("PIPELINING",
                             "layer 'norm' (BatchNormalization) normalizes with batch statistics"),
}

ERROR_SCRIPT = r"""
import os
import sys
import keras
import tarantella as tnt
tnt.init()
S = tnt.keras.layers.SplitLayer


class Sub(keras.Model):
    def __init__(self):
        super().__init__()
        self.d = keras.layers.Dense(2)

    def call(self, x):
        return self.d(S()(x))


class Custom(keras.Model):
    def train_step(self, data):
        return super().train_step(data)


def build(case):
    i = keras.Input((4,))
    a = keras.layers.Dense(3)(i)
    if case == "no_split":
        return keras.Model(i, keras.layers.Dense(2)(a))
    if case == "crossing":
        return keras.Model(i, keras.layers.Add()([a, keras.layers.Dense(3)(S()(a))]))
    if case == "two_inputs":
        return keras.Model(i, keras.layers.Dense(2)(S()([a, a])))
    if case == "empty_stage":
        return keras.Model(i, keras.layers.Dense(2)(S()(S()(a))))
    if case == "recompute_dropout":
        a = keras.layers.Dropout(0.5, name="drop")(a)
    if case == "recompute_batch_norm":
        a = keras.layers.BatchNormalization(name="norm")(a)
    if case == "subclassed":
        m = Sub()
        m(keras.ops.zeros((1, 4)))
        return m
    out = keras.layers.Dense(2)(S()(a))
    return Custom(i, out) if case == "custom_step" else keras.Model(i, out)


def attempt(case, strategy):
    kwargs = {"num_micro_batches": 0} if case == "micro_batches" else (
        {"num_micro_batches": 4} if case == "data_with_micro_batches" else {})
    recompute = case.startswith("recompute")
    if recompute:
        os.environ["TNT_PIPELINE_WEIGHT_GRADIENTS"] = "recompute"
        tnt.settings.load()
    try:
        model = tnt.Model(build(case), parallel_strategy=strategy, **kwargs)
    finally:
        if recompute:
            del os.environ["TNT_PIPELINE_WEIGHT_GRADIENTS"]
            tnt.settings.load()
    if case == "custom_loop":
        import tensorflow as tf
        with tnt.DistributedGradientTape(tf.GradientTape()) as tape:
            loss = tf.reduce_sum(model(tf.zeros((2, 4))))
        tape.gradient(loss, model.trainable_variables)


for arg in sys.argv[1:]:
    case, strategy = arg.split(":")
    try:
        attempt(case, getattr(tnt.ParallelStrategy, strategy))
        print(f"CASE {case}: no error")
    except (tnt.TarantellaError, ValueError) as e:
        print(f"CASE {case}: ERROR: " + str(e).replace("\n", " "))
"""


@pytest.fixture(scope="module")
def error_outputs(tmp_path_factory):
    """Every error case, run in one job per number of ranks it needs."""
    script = tmp_path_factory.mktemp("bad") / "bad.py"
    script.write_text(ERROR_SCRIPT)
    ranks = {"ranks": 1, "ranks_all": 3}
    out = {}
    for nranks in sorted(set(ranks.values()) | {2}):
        cases = [f"{c}:{ERRORS[c][0]}" for c in sorted(ERRORS) if ranks.get(c, 2) == nranks]
        proc = run(mpirun_command(nranks, sys.executable, str(script), *cases), timeout=300,
                   env={"TF_CPP_MIN_LOG_LEVEL": "2"})
        for line in proc.stdout.splitlines():
            if line.startswith("CASE "):
                case, _, said = line[5:].partition(": ")
                out.setdefault(case, said)
    return out


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_pipelines_fail_clearly(case, error_outputs):
    said = error_outputs.get(case)
    assert said is not None and said.startswith("ERROR: "), f"{case}: {said}"
    assert ERRORS[case][1] in said, f"{case}: the error does not say {ERRORS[case][1]!r}: {said}"


def test_killed_stage_ends_the_job(tmp_path):
    from test_faults import kill_trial
    kill_trial(2, 1, 3, tmp_path / "trial", extra=("--pipeline",))


def test_timeline_shows_the_schedule(tmp_path, python):
    """With TNT_TIMELINE, each stage's trace holds a span for every forward
    and backward of every micro-batch, in the schedule's order (1F1B), and
    the transfers between them."""
    import json
    trace = str(tmp_path / "trace.json")
    run(mpirun_command(2, python, WORKER, "mlp", "--out", str(tmp_path / "out"),
                       "--stages", "2", "--micro-batches", "3"),
        timeout=600, env={"TNT_TIMELINE": trace})
    want = {0: ["forward 0", "forward 1", "backward 0", "forward 2", "backward 1", "backward 2"],
            1: ["forward 0", "backward 0", "forward 1", "backward 1", "forward 2", "backward 2"]}
    for rank in (0, 1):
        with open(str(tmp_path / f"trace.rank{rank}.json")) as f:
            events = [e for e in json.load(f) if e.get("cat") == "pipeline"]
        spans = [e["name"] for e in sorted(events, key=lambda e: e["ts"])
                 if e["ph"] == "X" and e["name"].split()[0] in ("forward", "backward")]
        assert spans[:6] == want[rank], f"rank {rank}: {spans[:6]}"
        names = {e["name"] for e in events}
        peer = "activations" if rank == 1 else "gradients"
        assert {f"recv {peer} {i}" for i in range(3)} <= names, sorted(names)


MIXED = [("mixed_float16", (1e-4, 2e-4, 1e-2), "1f1b"),
         ("mixed_bfloat16", (1e-3, 5e-3, 5e-2), "1f1b"),
         ("mixed_float16", (1e-4, 2e-4, 1e-2), "recompute")]


@pytest.fixture(scope="module")
def mixed_runs(tmp_path_factory):
    """Per (policy, variant): serial Keras's results and the pipelined
    ones on each rank; one serial process and one job per policy."""
    out = {}
    for policy in sorted({policy for policy, _, _ in MIXED}):
        variants = [variant for p, _, variant in MIXED if p == policy]
        specs = [f"mlp-2-1-adam-{variant}" for variant in variants]
        ds = str(tmp_path_factory.mktemp(f"serial-{policy}"))
        run([sys.executable, WORKER, "mlp", "--serial", "--out", ds, "--stages", "2",
             "--mixed", policy])
        results = pipelined_runs(tmp_path_factory, 2, specs, "--mixed", policy)
        out.update({(policy, variant): (load(ds, 1)[0], results[spec])
                    for variant, spec in zip(variants, specs)})
    return out


@pytest.mark.parametrize("policy,tol,variant", MIXED)
def test_mixed_precision_on_two_stages(policy, tol, variant, mixed_runs):
    """16-bit activations and gradients cross the cut; with mixed_float16
    the stages scale the loss alike and skip non-finite steps together
    (also when they recompute their weight gradients: the recomputed
    objective is scaled as the passes' were). 16-bit arithmetic on
    micro-batches rounds differently from whole batches, so the bounds
    (loss, weights, outputs) are those of the 16-bit type and of its
    accumulation in float32."""
    want, results = mixed_runs[(policy, variant)]
    assert_ranks_identical(results)
    got = results[0]
    assert np.allclose(got["loss"], want["loss"], rtol=0, atol=tol[0]), (got["loss"], want["loss"])
    for key in (k for k in want if k.startswith("w")):
        assert np.abs(got[key] - want[key]).max() < tol[1], key
    assert np.abs(got["predict"] - want["predict"]).max() < tol[2]


def test_callbacks_on_a_pipeline(tmp_path_factory, python):
    """ModelCheckpoint writes the whole model (every stage) each epoch;
    ReduceLROnPlateau and EarlyStopping(restore_best_weights) decide on
    every rank as serial Keras does."""
    ds, dp = (str(tmp_path_factory.mktemp(n)) for n in ("cb-serial", "cb"))
    cs, cp = (str(tmp_path_factory.mktemp(n)) for n in ("ckpt-serial", "ckpt"))
    run([python, WORKER, "cls", "--serial", "--out", ds, "--stages", "3", "--callbacks", cs])
    run(mpirun_command(3, python, WORKER, "cls", "--out", dp, "--stages", "3", "--callbacks",
                       cp), timeout=600)
    want, results = load(ds, 1)[0], load(dp, 3)
    assert_ranks_identical(results)
    got = results[0]
    assert len(want["learning_rate"]) == 3 and want["learning_rate"][-1] < want["learning_rate"][0]
    assert np.allclose(got["learning_rate"], want["learning_rate"], rtol=1e-6)
    assert np.allclose(got["loss"], want["loss"], rtol=0, atol=1e-5)
    for key in (k for k in want if k.startswith("w")):
        assert np.abs(got[key] - want[key]).max() < 1e-4, key
    check = str(tmp_path_factory.mktemp("check") / "check.py")
    with open(check, "w") as f:
        f.write(f"""
import numpy as np, keras
import tarantella  # registers SplitLayer
for epoch in (1, 2, 3):
    a = keras.saving.load_model({cs!r} + f"/ckpt-{{epoch}}.keras").get_weights()
    b = keras.saving.load_model({cp!r} + f"/ckpt-{{epoch}}.keras").get_weights()
    assert len(a) == len(b) > 0
    worst = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    assert worst < 1e-4, (epoch, worst)
print("checkpoints agree")
""")
    assert "checkpoints agree" in run([python, check]).stdout


DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="dataset-fashion-mnist is not installed")
def test_pipelining_example_runs_quietly(tmp_path, python):
    """examples/pipelining.py on 2 ranks: it trains, evaluates, saves a file
    plain Keras loads, and prints no warning."""
    path = str(tmp_path / "mlp.keras")
    proc = run(mpirun_command(2, python, os.path.join(ROOT, "examples", "pipelining.py"),
                              "--train_size", "4096", "--epochs", "1", "--save", path),
               timeout=600, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    out = proc.stdout + proc.stderr
    assert "test accuracy" in proc.stdout
    noisy = [line for line in out.splitlines() if "WARNING" in line or "warn" in line.lower()]
    assert not noisy, "\n".join(noisy)
    check = f"import keras, tarantella; print(keras.saving.load_model({path!r}).count_params())"
    assert int(run([python, "-c", check]).stdout.split()[-1]) > 2_000_000
