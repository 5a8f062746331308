"""Data-parallel training throughput: Tarantella against MultiWorkerMirroredStrategy and Horovod.

The same models (LeNet-5, a small ResNet, a Transformer encoder; a dense
stack for the ZeRO comparison) on
1, 2 and 4 ranks of this host, at a fixed per-rank batch (weak scaling),
runs interleaved across frameworks; every run checks that its ranks end
with the same weights. `--baselines` adds serial Keras 3 and tf-keras runs.
The method: docs/research/benchmarks.md.

    python3 tools/bench/train_compare.py --out bench/results/training.jsonl
    python3 tools/bench/train_compare.py --quick           # 2 ranks only, fewer steps
    python3 tools/bench/train_compare.py --models lenet5 --ranks 2 --frameworks tarantella,mwms
    python3 tools/bench/train_compare.py --models lenet5,transformer,dense --ranks 2 \
        --frameworks tarantella,tarantella-zero1,tarantella-zero2,tarantella-zero3  # ZeRO
"""
import argparse
import concurrent.futures
import gzip
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import bench_models
from bench_results import write_results

SCRIPT = os.path.abspath(__file__)
DATA_DIR = "/usr/share/datasets/fashion-mnist"
MODELS = ("lenet5", "resnet", "transformer")
# tarantella-zeroS: tnt.Model(..., zero_stage=S).
FRAMEWORKS = ("tarantella", "tarantella-zero1", "tarantella-zero2", "tarantella-zero3", "mwms",
              "horovod")
DENSE_LAYERS, DENSE_WIDTH = 4, 1024
SEQ_LEN, VOCAB, D_MODEL, HEADS, FF, LAYERS = 64, 2000, 128, 4, 256, 2
NUM_CLASSES = 10

# Warm-up and timed steps per model: (warm-up, timed full, timed --quick).
# The timed section lasts a few seconds on one 2-core host.
STEPS = {"lenet5": (5, 80, 30), "resnet": (5, 30, 12), "transformer": (5, 40, 15),
         "dense": (5, 40, 15)}

# Horovod's latest release as it builds against TensorFlow 2.21.
HOROVOD_BUILD_NOTE = (
    "horovod 0.28.1 does not build against TensorFlow 2.21 as released: "
    "horovod/tensorflow/xla_mpi_ops.cc: fatal error: highwayhash/arch_specific.h: No such file "
    "or directory (TF's headers include XLA headers it does not ship); built from the sdist "
    "with xla_mpi_ops.cc (XLA ops, unused here) left out of horovod/tensorflow/CMakeLists.txt, "
    "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1, pip install "
    "--no-build-isolation --no-deps")

# ====================================================================== worker
# One process of one framework's run. Imports TensorFlow, so the driver
# below never does.

def _threads(cores, ranks):
    return max(1, cores // ranks)


def _set_threads(tf, cores, ranks):
    tf.config.threading.set_intra_op_parallelism_threads(_threads(cores, ranks))
    tf.config.threading.set_inter_op_parallelism_threads(1)


def lenet5(K):
    return bench_models.lenet5(K, NUM_CLASSES)


def resnet(K):
    """ResNet-style CNN for 32x32x3: a stride-2 stem and three residual
    blocks of 32, 64 and 128 channels (16x16, 8x8, 4x4)."""
    def conv_bn(x, channels, kernel, stride, relu):
        x = K.layers.Conv2D(channels, kernel, strides=stride, padding="same",
                            use_bias=False)(x)
        x = K.layers.BatchNormalization()(x)
        return K.layers.ReLU()(x) if relu else x

    def block(x, channels, stride):
        y = conv_bn(x, channels, 3, stride, True)
        y = conv_bn(y, channels, 3, 1, False)
        shortcut = x
        if stride != 1 or x.shape[-1] != channels:
            shortcut = conv_bn(x, channels, 1, stride, False)
        return K.layers.ReLU()(K.layers.Add()([y, shortcut]))

    inputs = K.Input(shape=(32, 32, 3))
    x = conv_bn(inputs, 32, 3, 2, True)
    x = block(x, 32, 1)
    x = block(x, 64, 2)
    x = block(x, 128, 2)
    x = K.layers.GlobalAveragePooling2D()(x)
    return K.Model(inputs, K.layers.Dense(NUM_CLASSES, activation="softmax")(x))


def transformer(K):
    """Post-LayerNorm Transformer encoder over token ids, mean-pooled into
    a classifier; learned position embeddings."""
    class PositionEmbedding(K.layers.Layer):
        def build(self, input_shape):
            self.table = self.add_weight(
                name="positions", shape=(input_shape[1], input_shape[2]),
                initializer=K.initializers.RandomNormal(stddev=0.02))

        def call(self, x):
            return x + self.table

    inputs = K.Input(shape=(SEQ_LEN,), dtype="int32")
    x = K.layers.Embedding(VOCAB, D_MODEL)(inputs)
    x = PositionEmbedding()(x)
    for _ in range(LAYERS):
        a = K.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS)(x, x)
        x = K.layers.LayerNormalization()(K.layers.Add()([x, a]))
        f = K.layers.Dense(FF, activation="relu")(x)
        f = K.layers.Dense(D_MODEL)(f)
        x = K.layers.LayerNormalization()(K.layers.Add()([x, f]))
    x = K.layers.GlobalAveragePooling1D()(x)
    return K.Model(inputs, K.layers.Dense(NUM_CLASSES, activation="softmax")(x))


def dense(K):
    """DENSE_LAYERS ReLU layers of DENSE_WIDTH units (4.2 M parameters): the
    optimizer's update is a large part of its step."""
    inputs = K.Input(shape=(DENSE_WIDTH,))
    x = inputs
    for _ in range(DENSE_LAYERS):
        x = K.layers.Dense(DENSE_WIDTH, activation="relu")(x)
    return K.Model(inputs, K.layers.Dense(NUM_CLASSES, activation="softmax")(x))


BUILDERS = {"lenet5": lenet5, "resnet": resnet, "transformer": transformer, "dense": dense}


def _read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    import numpy as np
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def arrays(model, global_batch):
    """(x, y) of the model: Fashion-MNIST's training set, or synthetic data
    of 16 global batches (the same on every rank and for every framework)."""
    import numpy as np
    if model == "lenet5":
        x = _read_idx(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"))
        y = _read_idx(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"))
        return (x.astype(np.float32) / 255.0)[..., np.newaxis], y.astype(np.int32)
    rng = np.random.default_rng(0)
    n = 16 * global_batch
    y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
    if model == "resnet":
        return rng.random((n, 32, 32, 3), dtype=np.float32), y
    if model == "dense":
        return rng.random((n, DENSE_WIDTH), dtype=np.float32), y
    return rng.integers(0, VOCAB, size=(n, SEQ_LEN)).astype(np.int32), y


def _timer_callback(K, warmup, stamps, cpu):
    """Stamps the end of every step from the last warm-up step on, and the
    CPU time of the whole process (all its threads) at the first and last."""
    class StepTimer(K.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch >= warmup - 1:
                stamps.append(time.perf_counter())
                cpu[1 if cpu else 0:] = [time.process_time()]  # [first, latest]
    return StepTimer()


def _compile(K, model):
    model.compile(optimizer=K.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)


def worker(args):
    """Trains args.model with args.framework on this rank; rank 0 writes
    the timing of the timed section to args.result."""
    began = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    _set_threads(tf, args.cores, args.ranks)
    if args.keras == "tf-keras":
        import tf_keras as K
    else:
        import keras as K

    if args.framework == "mwms":
        # The strategy configures collectives, which must precede any op.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    global_batch = args.per_rank_batch * args.ranks
    steps_per_epoch = args.warmup + args.steps
    x, y = arrays(args.model, global_batch)
    # Keep the data in memory and cycle over it: input costs are alike and small.
    base = tf.data.Dataset.from_tensor_slices((x, y))

    if args.framework == "serial":
        # Plain Keras in one process: the baseline without any distribution.
        size, rank = 1, 0
        K.utils.set_random_seed(1)
        model = BUILDERS[args.model](K)
        _compile(K, model)
        ds = base.batch(global_batch, drop_remainder=True).repeat().prefetch(2)
        extra = []
    elif args.framework.startswith("tarantella"):
        import tarantella as tnt
        tnt.init()
        size, rank = tnt.get_size(), tnt.get_rank()
        K.utils.set_random_seed(1)
        stage = int(args.framework[-1]) if "zero" in args.framework else 0
        model = tnt.Model(BUILDERS[args.model](K), zero_stage=stage)
        _compile(K, model)
        ds = base.batch(global_batch, drop_remainder=True).repeat().prefetch(2)
        extra = []
    elif args.framework == "mwms":
        size = strategy.num_replicas_in_sync
        rank = strategy.cluster_resolver.task_id
        K.utils.set_random_seed(1)
        with strategy.scope():
            model = BUILDERS[args.model](K)
            _compile(K, model)
        # The strategy splits every global batch among the workers.
        ds = base.batch(global_batch, drop_remainder=True).repeat().prefetch(2)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = ds.with_options(opts)
        extra = []
    else:
        import horovod.tensorflow.keras as hvd
        hvd.init()
        size, rank = hvd.size(), hvd.rank()
        K.utils.set_random_seed(1)
        model = BUILDERS[args.model](K)
        opt = hvd.DistributedOptimizer(K.optimizers.SGD(learning_rate=0.01, momentum=0.9))
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], jit_compile=False)
        # Horovod leaves sharding to the user: each rank takes its own share.
        ds = (base.shard(size, rank).batch(args.per_rank_batch, drop_remainder=True)
              .repeat().prefetch(2))
        # Horovod 0.28's Keras callbacks predate Keras 3: BroadcastGlobalVariablesCallback
        # fails on its variables (no .ref()), so they are broadcast directly, and
        # MetricAverageCallback fails with either Keras (keras.backend.constant is gone),
        # so metrics stay per rank, as with MultiWorkerMirroredStrategy's logs.
        if args.keras == "keras3":
            import horovod.tensorflow as hvd_tf
            hvd_tf.broadcast_variables([v.value for v in model.variables], root_rank=0)
            extra = []
        else:
            extra = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if size != args.ranks:
        raise RuntimeError(f"{args.framework} sees {size} ranks, expected {args.ranks}")

    stamps, cpu = [], []
    fit_began = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=steps_per_epoch, verbose=0,
              callbacks=extra + [_timer_callback(K, args.warmup, stamps, cpu)])
    # Every rank's weights, summed per variable: the driver checks that the
    # ranks agree, i.e. that gradients really were averaged (get_weights:
    # at zero_stage=3 the ranks hold parts, which it gathers).
    import numpy as np
    sums = [float(np.sum(np.asarray(w, dtype=np.float64))) for w in model.get_weights()]
    with open(f"{args.result}.rank{rank}", "w") as f:
        json.dump(sums, f)
    if rank == 0:
        steps = [b - a for a, b in zip(stamps, stamps[1:])]
        with open(args.result, "w") as f:
            json.dump({"seconds": stamps[-1] - stamps[0], "steps": len(steps),
                       "median_step_s": sorted(steps)[len(steps) // 2],
                       # CPU seconds rank 0 spent per timed step (compute, waiting, input).
                       "cpu_step_s": (cpu[1] - cpu[0]) / len(steps),
                       "global_batch": global_batch,
                       # From the worker's start to fit, and fit's warm-up steps.
                       "setup_s": fit_began - began, "warmup_s": stamps[0] - fit_began,
                       "params": int(model.count_params()),
                       "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                       "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()},
                      f)


# ====================================================================== driver

def _version(dist):
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("localhost", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _decisive(text, limit=600):
    """The lines of a failed run's output that say why: the last exception
    line, with the source line before it, or else the last lines."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    noise = ("oneDNN", "absl::InitializeLog", "cpu_feature_guard", "rebuild TensorFlow")
    lines = [line for line in lines if not any(n in line for n in noise)]
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        head = line.split(":")[0].strip()
        if head.endswith(("Error", "Exception")) or line.startswith(("error:", "ERROR:")):
            where = [lines[j].strip() for j in range(max(0, i - 2), i)
                     if lines[j].strip().startswith("File ")]
            what = line.strip()
            if what.endswith(("{", "(", "[")):
                # A message that prints a value over many lines: keep its last line.
                tail = [t.strip() for t in lines[i + 1:] if t.startswith(("}", ")", "]"))]
                what += " ... " + tail[-1] if tail else ""
            return " | ".join(where[-1:] + [what])[:limit]
    return " | ".join(lines[-3:])[:limit]


def _kill(procs):
    """Ends the process groups this driver started (each run is a session)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _wait_all(procs, timeout):
    """Waits for every process; on a failure or the timeout ends the rest.
    Returns None on success, or why not."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            _kill(procs)
            return f"exit status {failed[0]}"
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            _kill(procs)
            return f"timed out after {timeout} s"
        time.sleep(0.1)


def _disagreement(result, ranks, rtol=1e-4):
    """Why the ranks' trained weights differ (None if they agree): data
    parallelism must end every step with the same weights on every rank."""
    sums = []
    for r in range(ranks):
        try:
            with open(f"{result}.rank{r}") as f:
                sums.append(json.load(f))
        except OSError:
            return f"rank {r} wrote no weight checksums"
    for r in range(1, ranks):
        for i, (a, b) in enumerate(zip(sums[0], sums[r])):
            if abs(a - b) > rtol * max(1.0, abs(a)):
                return (f"ranks 0 and {r} end with different weights (variable {i}: sums "
                        f"{a:.6g} and {b:.6g}): gradients are not averaged")
    return None


class Driver:
    def __init__(self, args):
        self.args = args
        self.cores = len(os.sched_getaffinity(0))
        self.tmp = tempfile.mkdtemp(prefix="train_compare-")
        self.keras_for = dict.fromkeys(FRAMEWORKS, "keras3")
        self.errors = {}
        self.notes = {}

    def env(self, ranks, keras):
        env = dict(os.environ)
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["OMP_NUM_THREADS"] = str(_threads(self.cores, ranks))
        env.pop("TF_CONFIG", None)
        if keras == "tf-keras":
            env["TF_USE_LEGACY_KERAS"] = "1"
        else:
            env.pop("TF_USE_LEGACY_KERAS", None)
        return env

    def worker_args(self, framework, model, ranks, keras, warmup, steps, result):
        return ["worker", "--framework", framework, "--model", model, "--ranks", str(ranks),
                "--cores", str(self.cores), "--per-rank-batch", str(self.args.per_rank_batch),
                "--warmup", str(warmup), "--steps", str(steps), "--keras", keras,
                "--result", result]

    def launch(self, framework, model, ranks, keras, warmup, steps, timeout):
        """Runs one framework's training on `ranks` processes. Returns
        (worker result dict, None) or (None, error message)."""
        run_dir = tempfile.mkdtemp(prefix=f"{framework}-{model}-{ranks}-", dir=self.tmp)
        result = os.path.join(run_dir, "result.json")
        wargs = self.worker_args(framework, model, ranks, keras, warmup, steps, result)
        env = self.env(ranks, keras)
        procs, logs = [], []
        try:
            if framework == "mwms":
                ports = _free_ports(ranks)
                cluster = {"worker": [f"localhost:{p}" for p in ports]}
                for i in range(ranks):
                    wenv = dict(env, TF_CONFIG=json.dumps(
                        {"cluster": cluster, "task": {"type": "worker", "index": i}}))
                    logs.append(os.path.join(run_dir, f"worker{i}.log"))
                    with open(logs[-1], "w") as log:
                        procs.append(subprocess.Popen(
                            [sys.executable, SCRIPT] + wargs, env=wenv, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True))
            else:
                if framework == "serial":
                    cmd = [sys.executable, SCRIPT] + wargs
                elif framework.startswith("tarantella"):
                    cmd = ["tarantella", "--no-gpu", "-n", str(ranks), "--run-dir", run_dir,
                           "--", SCRIPT] + wargs
                else:
                    # As the tarantella launcher starts ranks: unbound, oversubscribed
                    # when ranks outnumber cores.
                    cmd = ["mpirun", "--allow-run-as-root", "-np", str(ranks),
                           "--oversubscribe", "--bind-to", "none",
                           sys.executable, SCRIPT] + wargs
                logs.append(os.path.join(run_dir, "launcher.log"))
                with open(logs[-1], "w") as log:
                    procs.append(subprocess.Popen(cmd, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT,
                                                  start_new_session=True))
            why = _wait_all(procs, timeout)
        finally:
            _kill(procs)
        if why is None and os.path.exists(result):
            with open(result) as f:
                out = json.load(f)
            why = _disagreement(result, ranks)
            if why is None:
                return out, None
            return None, why
        text = ""
        for path in logs + [os.path.join(run_dir, f"rank{r}.log") for r in range(ranks)]:
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f.read() + "\n"
        return None, f"{why or 'no result'}: {_decisive(text)}"

    def probe(self, framework, keras):
        """A 2-rank LeNet-5 run of 2 steps: does `framework` train with `keras`,
        and end with the same weights on both ranks?"""
        _, err = self.launch(framework, "lenet5", 2, keras, 1, 1, self.args.timeout)
        return err

    def choose_keras(self):
        """Keras 3 where a framework trains with it, else tf-keras. The
        Keras 3 probes of MWMS and Horovod run side by side."""
        have_tf_keras = importlib.util.find_spec("tf_keras") is not None
        if "horovod" in self.frameworks and importlib.util.find_spec("horovod") is None:
            self.errors["horovod"] = "horovod is not installed" + (
                ": " + self.args.horovod_note if self.args.horovod_note else "")
            self.frameworks.remove("horovod")
        probed = [fw for fw in ("mwms", "horovod") if fw in self.frameworks]
        if "mwms" in probed and self.args.mwms_keras != "auto":
            self.keras_for["mwms"] = self.args.mwms_keras
            self.notes["mwms"] = f"{self.args.mwms_keras} chosen with --mwms-keras"
            probed.remove("mwms")
        with concurrent.futures.ThreadPoolExecutor(max(1, len(probed))) as pool:
            errs = dict(zip(probed, pool.map(lambda fw: self.probe(fw, "keras3"), probed)))
        why = {"mwms": "Keras 3 fit under MultiWorkerMirroredStrategy fails",
               "horovod": "horovod.tensorflow.keras with Keras 3 fails"}
        for fw, err in errs.items():
            if err is None:
                self.notes[fw] = "trains with Keras 3"
            elif have_tf_keras:
                self.keras_for[fw] = "tf-keras"
                self.notes[fw] = f"{why[fw]} ({err}); using tf-keras (TF_USE_LEGACY_KERAS=1)"
            else:
                self.errors[fw] = (f"{why[fw]} ({err}) and tf-keras is not installed "
                                   "(pip install --no-deps tf-keras)")
                self.frameworks.remove(fw)
        if "horovod" in self.frameworks and _version("horovod") == "0.28.1":
            self.notes["horovod_build"] = HOROVOD_BUILD_NOTE

    def run(self):
        a = self.args
        self.frameworks = [f for f in FRAMEWORKS if f in a.frameworks.split(",")]
        models = [m for m in a.models.split(",")]
        ranks = [int(r) for r in a.ranks.split(",")]
        started = time.monotonic()
        self.choose_keras()
        print(f"{self.cores} cores; frameworks {', '.join(self.frameworks)}; "
              f"keras: {self.keras_for}", flush=True)
        for fw, msg in self.errors.items():
            print(f"  {fw} skipped: {msg}", flush=True)

        results, baselines, failures = [], [], []
        cell = 0
        for model in models:
            warmup, full, quick = STEPS[model]
            steps = a.steps or (quick if a.quick else full)
            for n in ranks:
                # (framework, keras) of this cell, in an order rotating by cell.
                runs = [(fw, self.keras_for[fw]) for fw in self.frameworks]
                if a.baselines and n == 1:
                    runs += [("serial", "keras3"), ("serial", "tf-keras")]
                k = cell % len(runs) if runs else 0
                cell += 1
                for fw, keras in runs[k:] + runs[:k]:
                    label = f"{fw} ({keras})" if fw == "serial" else fw
                    load = round(os.getloadavg()[0], 2)
                    t0 = time.monotonic()
                    out, err = self.launch(fw, model, n, keras, warmup, steps, a.timeout)
                    took = time.monotonic() - t0
                    if err:
                        failures.append({"model": model, "framework": label, "ranks": n,
                                         "error": err})
                        print(f"  {model:11s} {label:10s} {n} ranks  FAILED ({took:.0f} s): "
                              f"{err}", flush=True)
                        continue
                    sps = out["global_batch"] * out["steps"] / out["seconds"]
                    row = {
                        "model": model, "framework": fw, "ranks": n,
                        "oversubscribed": n > self.cores, "global_batch": out["global_batch"],
                        "samples_per_s": sps, "step_ms": out["seconds"] / out["steps"] * 1e3,
                        "efficiency": None,
                        # Robust to bursts of load from other processes.
                        "median_step_ms": out["median_step_s"] * 1e3,
                        "median_samples_per_s": out["global_batch"] / out["median_step_s"],
                        "loadavg_before": load,
                        # CPU time of rank 0's process per step: its work, waits that spin.
                        "rank0_cpu_ms_per_step": round(out["cpu_step_s"] * 1e3, 2),
                        "params": out["params"], "run_s": round(took, 1),
                        "setup_s": round(out["setup_s"], 2),
                        "warmup_s": round(out["warmup_s"], 2),
                        "intra_op_threads": out["intra_op_threads"],
                        "inter_op_threads": out["inter_op_threads"]}
                    if fw == "serial":
                        row["keras"] = keras
                        del row["efficiency"]
                        baselines.append(row)
                    else:
                        results.append(row)
                    print(f"  {model:11s} {label:10s} {n} ranks  {sps:9.1f} samples/s "
                          f"{row['step_ms']:8.2f} ms/step  (run {took:.0f} s)", flush=True)
        # E(N) = X_N / (N * X_1), per framework and model.
        one = {(r["model"], r["framework"]): r["samples_per_s"] for r in results
               if r["ranks"] == 1}
        for r in results:
            base = one.get((r["model"], r["framework"]))
            if base:
                r["efficiency"] = r["samples_per_s"] / (r["ranks"] * base)
        for f in failures:
            msg = f"{f['model']} on {f['ranks']} ranks: {f['error']}"
            if f["framework"] not in FRAMEWORKS:
                continue
            self.errors[f["framework"]] = (self.errors[f["framework"]] + "; " + msg
                                           if f["framework"] in self.errors else msg)

        config = self.config(models, ranks, time.monotonic() - started)
        doc = {"config": dict(config, errors=self.errors, failures=failures),
               "results": results, "baselines": baselines}
        write_results(a.out, "training", doc)
        if not a.keep_logs:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"logs in {self.tmp}")

    def config(self, models, ranks, seconds):
        a = self.args
        return {
            "host": platform.node(), "cores": self.cores, "quick": a.quick,
            "models": models, "ranks": ranks, "frameworks": self.frameworks,
            "per_rank_batch": a.per_rank_batch,
            "global_batch": {str(n): a.per_rank_batch * n for n in ranks},
            "warmup_steps": {m: STEPS[m][0] for m in models},
            "timed_steps": {m: a.steps or STEPS[m][2 if a.quick else 1] for m in models},
            "intra_op_threads": {str(n): _threads(self.cores, n) for n in ranks},
            "inter_op_threads": 1,
            "jit_compile": False,
            "optimizer": "SGD(learning_rate=0.01, momentum=0.9)",
            "mwms_keras": self.keras_for["mwms"],
            "horovod_keras": (self.keras_for["horovod"] if "horovod" in self.frameworks
                              else None),
            "mwms_communication": "RING (CommunicationImplementation.RING)",
            "notes": self.notes,
            "versions": {"python": platform.python_version(),
                         "tensorflow": _version("tensorflow-cpu") or _version("tensorflow"),
                         "keras": _version("keras"), "tf_keras": _version("tf-keras"),
                         "horovod": _version("horovod"), "tarantella": _version("tarantella")},
            "wall_s": round(seconds, 1),
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        }


def main():
    if sys.argv[1:2] == ["worker"]:
        w = argparse.ArgumentParser(prog="train_compare.py worker",
                                    description="one rank of one run (started by the driver)")
        w.add_argument("--framework", choices=FRAMEWORKS + ("serial",), required=True)
        w.add_argument("--model", choices=list(BUILDERS), required=True)
        w.add_argument("--ranks", type=int, required=True)
        w.add_argument("--cores", type=int, required=True)
        w.add_argument("--per-rank-batch", type=int, required=True)
        w.add_argument("--warmup", type=int, required=True)
        w.add_argument("--steps", type=int, required=True)
        w.add_argument("--keras", choices=["keras3", "tf-keras"], required=True)
        w.add_argument("--result", required=True)
        worker(w.parse_args(sys.argv[2:]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", metavar="PATH", help="write the results file to PATH")
    p.add_argument("--quick", action="store_true", help="2 ranks only, fewer timed steps")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--frameworks", default="tarantella,mwms,horovod",
                   help=f"comma-separated, of {', '.join(FRAMEWORKS)}")
    p.add_argument("--ranks", help="comma-separated rank counts (default 1,2,4; --quick 2)")
    p.add_argument("--per-rank-batch", type=int, default=64)
    p.add_argument("--steps", type=int, help="timed steps of every model (default: per model)")
    p.add_argument("--timeout", type=int, default=300, help="seconds any one run may last")
    p.add_argument("--mwms-keras", choices=["auto", "keras3", "tf-keras"], default="auto",
                   help="Keras of the MWMS runs (auto: Keras 3 if a probe trains, else tf-keras)")
    p.add_argument("--baselines", action="store_true",
                   help="also time serial Keras 3 and tf-keras (1 process) for every model")
    p.add_argument("--horovod-note", help="why Horovod is missing, for the results")
    p.add_argument("--keep-logs", action="store_true", help="keep every run's logs")
    args = p.parse_args()
    if args.ranks is None:
        args.ranks = "2" if args.quick else "1,2,4"
    Driver(args).run()


if __name__ == "__main__":
    main()
