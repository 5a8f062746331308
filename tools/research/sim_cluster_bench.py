#!/usr/bin/env python3
"""Training on a simulated cluster with shaped links, broken down from the timeline.

Hosts are network namespaces (tests/launcher/sim_cluster.sh) whose links tc
shapes to 1 or 10 Gbit/s; the models of train_compare.py train with every
fusion and overlap setting, each step split into compute, communication and
waiting against its bound. --allreduce: tnt-bench against MPI_Allreduce;
--variants: compression and fusion settings; --frameworks: against MWMS;
--zero: ZeRO stages 1 and 2 against stage 0.
Needs root, iproute2, unshare and Tarantella installed. The method:
docs/research/benchmarks.md; tools/research/README.md.

    sudo python3 tools/research/sim_cluster_bench.py --quick --out quick.jsonl
    sudo python3 tools/research/sim_cluster_bench.py --allreduce --out sim_cluster_allreduce.jsonl
    sudo python3 tools/research/sim_cluster_bench.py --frameworks --out sim_cluster_frameworks.jsonl
    sudo python3 tools/research/sim_cluster_bench.py --zero --out sim_cluster_zero.jsonl
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(ROOT, "tools", "bench")  # the shared helpers and train_compare.py
sys.path.insert(0, BENCH)
import bench_results  # noqa: E402
from bench_results import finish_config, new_config, write_results  # noqa: E402
from step_timeline import breakdown, load_trace, summarize  # noqa: E402
SIM = os.path.join(ROOT, "tests", "launcher", "sim_cluster.sh")

LINKS = {"1gbit_0.1ms": 1e9, "10gbit_0.1ms": 10e9}
DELAY = "0.1ms"
# (fusion, overlap); the first are the defaults.
CONFIGS = [(True, "auto"), (True, "on"), (True, "off"), (False, "on"), (False, "off")]
OVERLAP_ENV = {"on": "1", "off": "0", "auto": "auto"}  # TNT_OVERLAP
WARMUP_STEPS = 10  # before the timed fits: TNT_OVERLAP=auto decides in 8
FUSION_KB = 32  # the default threshold: fusion "on"; 0 is "off"
# --variants: name -> the environment of that variant (overlap on, fusion on).
VARIANTS = {"none": {}, "fp16": {"TNT_COMPRESSION": "fp16"},
            "bf16": {"TNT_COMPRESSION": "bf16"}, "auto": {"TNT_FUSION_THRESHOLD_KB": "auto"},
            "readiness": {"TNT_FUSION_ORDER": "readiness"},
            "overlap_off": {"TNT_OVERLAP": "0"}, "overlap_auto": {"TNT_OVERLAP": "auto"}}
VARIANT_WARMUP_STEPS = 16
GLOBAL_BATCH = 64
# With --allreduce, these (and Open MPI's TCP settings, OMPI_MCA_btl_tcp_*)
# pass from the environment to the ranks and into the results'
# configuration, to measure other settings than the defaults.
TUNING = ("TNT_RING_SEGMENT_KB", "TNT_RING_DEPTH", "TNT_SHM_SLOT_KB")


def tuning():
    """The settings of TUNING and OMPI_MCA_btl_tcp_* set in this environment."""
    return {k: v for k, v in os.environ.items()
            if k in TUNING or k.startswith("OMPI_MCA_btl_tcp_")}


# Cluster.tcp_gbit: one process per host, as one rank of the ring: it
# accepts its peer's stream, connects to the peer, then sends nbytes while a
# thread receives the peer's nbytes into one buffer; it prints the seconds
# until both are done. Two processes on the machine, as for the 2-host
# allreduce (a receiver and a sender per host made four, on 2 cores, and
# measured less than the ring itself carried).
TCP_PROBE_PORT = 5399
TCP_PROBE_BYTES = 256 << 20
TCP_PROBE = f"""
import socket, sys, threading, time
peer, n = sys.argv[1], int(sys.argv[2])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", {TCP_PROBE_PORT}))
srv.listen(1)
print("listening", flush=True)
sys.stdin.readline()  # both listen: go
out = socket.create_connection((peer, {TCP_PROBE_PORT}))
inc, _ = srv.accept()
buf = memoryview(bytearray(1 << 22))
got = 0
def receive():
    global got
    while got < n:
        k = inc.recv_into(buf, min(len(buf), n - got))
        if k == 0:
            return
        got += k
chunk = memoryview(bytes(1 << 22))
t = time.monotonic()
r = threading.Thread(target=receive)
r.start()
for off in range(0, n, len(chunk)):
    out.sendall(chunk[:min(len(chunk), n - off)])
r.join()
if got < n:  # a thread's exit would not end the process: say it here
    sys.exit(f"tcp probe: the peer closed after {{got}} of {{n}} bytes")
print(time.monotonic() - t, flush=True)
"""


# ---------------------------------------------------------------- worker


def config_name(fusion, overlap):
    return f"config fusion={int(fusion)} overlap={overlap}"


def configs(variants):
    """(timeline span name, the row's identifying fields, environment) of
    every configuration that a run compares."""
    if variants:
        return [(f"config variant={v}", {"variant": v, "fusion": True, "overlap": "on"},
                 {"TNT_FUSION_THRESHOLD_KB": str(FUSION_KB), "TNT_OVERLAP": "1",
                  "TNT_COMPRESSION": "none", "TNT_FUSION_ORDER": "list"} | env)
                for v, env in VARIANTS.items()]
    return [(config_name(f, o), {"fusion": f, "overlap": o},
             {"TNT_FUSION_THRESHOLD_KB": str(FUSION_KB if f else 0),
              "TNT_OVERLAP": OVERLAP_ENV[o]}) for f, o in CONFIGS]


def worker(args):
    """One rank: builds a model per configuration, then trains them in
    turns, each fit inside a "config ..." span of the timeline."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import keras
    import tarantella as tnt
    from tarantella import _core

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tnt.init()
    import train_compare  # the models and data of the framework comparison
    x, y = train_compare.arrays(args.model, args.global_batch)
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).repeat()
          .batch(args.global_batch, drop_remainder=True).take(args.steps).cache())
    models, losses = {}, {}
    todo = configs(args.variants)
    warmup = ds.repeat().take(VARIANT_WARMUP_STEPS if args.variants else WARMUP_STEPS)
    for name, _, env in todo:
        # The environment is read when the training step is traced (the first fit).
        os.environ.update(env)
        keras.utils.set_random_seed(1)
        model = tnt.Model(train_compare.BUILDERS[args.model](keras))
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        model.fit(warmup, epochs=1, verbose=0)  # trace and warm up
        models[name] = model
    grad_bytes = int(sum(np.prod(w.shape) * 4 for w in models[todo[0][0]].trainable_weights))
    for rep in range(args.reps):
        for name, _, _ in (todo if rep % 2 == 0 else list(reversed(todo))):
            _core.timeline_begin(name, "config")
            history = models[name].fit(ds, epochs=1, verbose=0)
            _core.timeline_end(name, "config")
            losses[name] = float(history.history["loss"][-1])
    if tnt.is_master_rank() and args.loss_out:
        with open(args.loss_out, "w") as f:
            json.dump(losses, f)
    if tnt.is_master_rank():
        print(f"worker: {tnt.get_size()} ranks on {_core.num_hosts()} hosts, gradient bytes "
              f"{grad_bytes}", flush=True)


# ---------------------------------------------------------------- cluster


# tbf's burst. tc demands at least rate / HZ, HZ read from /proc/net/psched:
# 1e9 here (tbf's watchdog is a high-resolution timer, not the kernel's
# 250 Hz tick), so that bound is under a byte and a packet is the floor:
# TCP hands veth GSO packets of up to 64 KiB, and tbf splits longer ones,
# which costs the rate (TCP both ways at 1 Gbit/s: 0.34-0.82 Gbit/s with
# bursts of 1.5 to 67 KB). Tokens past the burst are lost while the
# watchdog wakes late: 64 KiB + 115 us of traffic carried 0.94, + 200 us
# 0.955, as much as 256 KiB did. A full bucket passes at the veth's speed:
# with 256 KiB a 256 KiB allreduce of 2 hosts x 2 ranks sent 1.07x its
# link's rate. 64 KiB + 200 us: 90 KB at 1 Gbit/s, 315 KB at 10 (a 4 ms
# tick carries 500 KB and 5 MB).
TBF_GSO_BYTES = 64 * 1024
TBF_WAKEUP_S = 200e-6


def tbf_burst(link_bps):
    """The tbf burst in bytes of a link of `link_bps` bits per second."""
    return TBF_GSO_BYTES + int(link_bps / 8 * TBF_WAKEUP_S)


class Cluster:
    """Simulated hosts, always removed again (also on errors and signals)."""

    live = []

    def __init__(self, nhosts):
        self.id = uuid.uuid4().hex[:6]
        self.hosts = [f"tnt-sb-{self.id}-{k}" for k in range(nhosts)]
        self.octet = free_octet()
        Cluster.live.append(self)
        up = run_checked([SIM, "up", self.id, str(self.octet)] + self.hosts, timeout=60)
        if up.returncode != 0:
            raise RuntimeError(f"cannot create the simulated cluster:\n{up.stderr}")
        self.net = f"169.254.{self.octet}.0/24"

    def hostfile(self, work):
        """A hostfile of these hosts in `work`; its path."""
        path = os.path.join(work, "hostfile")
        with open(path, "w") as f:
            f.write("\n".join(self.hosts) + "\n")
        return path

    def env(self, launcher=True, **extra):
        """The environment of a job on these hosts: a clean one (this
        machine's variables would describe this host), with Open MPI's
        settings for the tarantella launcher when `launcher`, and `extra`."""
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
               "TF_CPP_MIN_LOG_LEVEL": "3", "TNT_TIMEOUT_S": "120"}
        env |= {k: os.environ[k] for k in ("LANG", "PYENV_VERSION", "PYENV_ROOT")
                if k in os.environ}
        if launcher:
            env |= {"OMPI_MCA_plm_rsh_agent": f"{SIM} agent",
                    "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
                    "OMPI_MCA_oob_tcp_if_include": self.net,
                    "OMPI_MCA_btl_tcp_if_include": self.net, "OMPI_MCA_btl": "self,vader,tcp"}
        return env | extra

    def shape(self, link_bps):
        """Shapes every host's outgoing link; returns what was applied."""
        rate = f"{int(link_bps / 1e6)}mbit"
        burst = tbf_burst(link_bps)
        netem = ["netem", "delay", DELAY, "rate", rate, "limit", "100000"]
        # A queue of a few ms, like a switch port's, rather than a deep one
        # that would hold control messages behind bulk data.
        tbf = ["tbf", "rate", rate, "burst", str(burst), "latency", "5ms"]
        applied = None
        for qdisc in (netem, tbf):
            ok = True
            for host in self.hosts:
                r = run_checked(["ip", "netns", "exec", host, "tc", "qdisc", "replace", "dev",
                                 "eth0", "root"] + qdisc, timeout=20)
                ok = ok and r.returncode == 0
            if ok:
                applied = " ".join(qdisc)
                break
        if applied is None:
            raise RuntimeError("tc could not shape the links (neither netem nor tbf)")
        return applied

    def address(self, k):
        """The address of host k on the cluster's network (sim_cluster.sh)."""
        return f"169.254.{self.octet}.{k + 2}"

    def tcp_gbit(self, nbytes=TCP_PROBE_BYTES):
        """What TCP itself carries between hosts 0 and 1 on the shaped links:
        one stream each way at once, `nbytes` each, each host's sending and
        receiving in one process (TCP_PROBE), in Gbit/s of payload (the
        slower host): the ceiling for any library's link share, below the
        link rate by the TCP, IP and Ethernet headers and by what the
        kernel's TCP work can keep up with on this machine."""
        probes = [subprocess.Popen(["ip", "netns", "exec", self.hosts[k], sys.executable, "-c",
                                    TCP_PROBE, self.address(1 - k), str(nbytes)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                  for k in (0, 1)]
        try:
            for p in probes:  # each prints a line once it listens
                p.stdout.readline()
            for p in probes:
                p.stdin.write("go\n")
                p.stdin.flush()
            secs = [float(p.communicate(timeout=120)[0]) for p in probes]
            return round(nbytes * 8 / max(secs) / 1e9, 3)
        finally:
            for p in probes:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def kill_processes(self):
        for host in self.hosts:
            pids = run_checked(["ip", "netns", "pids", host], timeout=10).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def down(self):
        self.kill_processes()
        run_checked([SIM, "down", self.id] + self.hosts, timeout=60)
        if self in Cluster.live:
            Cluster.live.remove(self)

    @classmethod
    def down_all(cls):
        for c in list(cls.live):
            try:
                c.down()
            except Exception as e:  # cleanup goes on with the others
                print(f"sim_cluster_bench: cleanup of {c.id}: {e}", file=sys.stderr)


def run_checked(cmd, timeout, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")


def free_octet():
    used = run_checked(["ip", "-4", "addr"], timeout=10).stdout
    for _ in range(200):
        octet = random.randint(16, 250)
        if f"169.254.{octet}." not in used:
            return octet
    raise RuntimeError("no free link-local network for the simulated cluster")


def launch(cluster, work, steps, reps, timeout, algorithm, variants=False, model="lenet5",
           per_host=1):
    """Runs the worker, `per_host` ranks on every host, for at most `timeout`
    seconds; returns the trace files and what went wrong (None: nothing). A
    run that times out or fails still leaves the traces it wrote so far."""
    hostfile = cluster.hostfile(work)
    env = cluster.env(TNT_TIMELINE=os.path.join(work, "trace.json"),
                      TNT_ALLREDUCE_ALGORITHM=algorithm)
    cmd = [shutil.which("tarantella"), "--hostfile", hostfile, "--n-per-node", str(per_host),
           "--no-gpu", "--run-dir", os.path.join(work, "run"), "--python-interpreter",
           sys.executable, "--", os.path.abspath(__file__), "--worker", "--model", model,
           "--steps", str(steps), "--reps", str(reps),
           "--loss-out", os.path.join(work, "losses.json")] + (["--variants"] if variants else [])
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    problem = None
    try:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            problem = f"failed with status {proc.returncode}: {err.strip()[-600:]}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        # Open MPI's daemons leave the launcher's session: end what runs on the hosts.
        cluster.kill_processes()
        proc.communicate(timeout=30)
        problem = f"timed out after {timeout:.0f} s (the results use the steps traced so far)"
    files = [os.path.join(work, f"trace.rank{r}.json")
             for r in range(len(cluster.hosts) * per_host)]
    files = [f for f in files if os.path.exists(f)]
    return files, problem




def require_cluster_tools(program):
    """Exits with the reason when the simulated cluster cannot be set up:
    it needs root and ip, tc, unshare and the tarantella launcher."""
    if os.geteuid() != 0:
        sys.exit(f"{program}: needs root (network namespaces and tc)")
    for tool in ("ip", "tc", "unshare", "tarantella"):
        if shutil.which(tool) is None:
            sys.exit(f"{program}: {tool} is not on PATH")


def proc_loadavg():
    """/proc/loadavg: the 1, 5 and 15 minute load averages."""
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run_tnt_bench(cluster, work, per_host, args, timeout):
    """tnt-bench allreduce on every host, `per_host` ranks each (consecutive
    ranks share a host); returns its JSON and what went wrong (None: nothing)."""
    hostfile = cluster.hostfile(work)
    out = os.path.join(work, "tnt_bench.json")
    env = cluster.env(TNT_ALLREDUCE_ALGORITHM=args.algorithm,
                      **tuning())
    cmd = [shutil.which("tarantella"), "--hostfile", hostfile, "--n-per-node", str(per_host),
           "--no-gpu", "--run-dir", os.path.join(work, "run"), "--", args.tnt_bench, "allreduce",
           "--min", "4K", "--max", args.max, "--json", out]
    r = run_checked(cmd, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                    start_new_session=True)
    if r.returncode == 124:
        cluster.kill_processes()
    with open(os.path.join(work, "tnt_bench.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    problem = None if r.returncode == 0 else (
        f"tnt-bench failed with status {r.returncode}: {(r.stdout + r.stderr).strip()[-600:]}")
    try:
        with open(out) as f:
            return json.load(f), problem
    except (OSError, ValueError) as e:
        return None, problem or f"no results from tnt-bench: {e}"


def layouts_of(text, option):
    """(hosts, ranks per host) of each item of `text` ("2,2x2"), the value
    of `option`."""
    layouts = []
    for item in text.split(","):
        try:
            h, _, p = item.partition("x")
            layouts.append((int(h), int(p or 1)))
        except ValueError:
            sys.exit(f"sim_cluster_bench: {option} {item!r}: give H (hosts of one rank) or HxP "
                     "(hosts of P ranks)")
    return layouts


def links_of(text):
    """The links named in `text` ("1gbit_0.1ms,10gbit_0.1ms"), each a key
    of LINKS."""
    links = text.split(",")
    for link in links:
        if link not in LINKS:
            sys.exit(f"sim_cluster_bench: unknown link {link}; choose from {sorted(LINKS)}")
    return links


def allreduce_driver(args):
    require_cluster_tools("sim_cluster_bench --allreduce")
    if not args.tnt_bench or not os.access(args.tnt_bench, os.X_OK):
        sys.exit(f"sim_cluster_bench: no tnt-bench at {args.tnt_bench!r}; give --tnt-bench PATH")
    layouts, links = layouts_of(args.layouts, "--layouts"), links_of(args.links)
    keep = os.path.abspath(args.keep_dir) if args.keep_dir else tempfile.mkdtemp(
        prefix="tnt-simbench-")
    config = new_config(
        tnt_bench=args.tnt_bench, max_bytes=args.max, allreduce_algorithm=args.algorithm,
        tuning=tuning(), tcp_probe_bytes=TCP_PROBE_BYTES, links={}, tcp_gbit={}, loadavg={},
        # A run under `nice -n -15` keeps its hosts' cores from other work
        # on the machine: the niceness it ran at.
        niceness=os.nice(0))
    results = []
    for nhosts, per_host in layouts:
        cluster = Cluster(nhosts)
        try:
            for link in links:
                applied = cluster.shape(LINKS[link])
                config["links"][link] = applied
                key = f"{nhosts}x{per_host}_{link}"
                tcp = config["tcp_gbit"][key] = cluster.tcp_gbit()
                work = os.path.join(keep, key)
                os.makedirs(work, exist_ok=True)
                t0 = time.monotonic()
                before = proc_loadavg()
                data, problem = run_tnt_bench(cluster, work, per_host, args, args.timeout)
                # Other work on the machine shares its cores with the hosts:
                # the load around each run tells a disturbed one.
                config["loadavg"][key] = {"before": before, "after": proc_loadavg()}
                if problem:
                    config["problems"][key] = problem
                for row in (data or {}).get("rows", []):
                    share = row["tnt_algbw"] * 2 * (nhosts - 1) / nhosts * 8e9 / LINKS[link]
                    results.append({"hosts": nhosts, "ranks_per_host": per_host, "link": link,
                                    "link_gbit": LINKS[link] / 1e9,
                                    "link_share": round(share, 4),
                                    "tcp_share": round(share * LINKS[link] / 1e9 / tcp, 4)}
                                   | row)
                print(f"sim_cluster_bench: {nhosts} hosts x {per_host}, {link} ({applied}): "
                      f"{time.monotonic() - t0:.0f} s{'; ' + problem if problem else ''}",
                      file=sys.stderr, flush=True)
        finally:
            cluster.down()
    finish_config(config)
    write_results(args.out, "sim_cluster_allreduce", {"config": config, "results": results})


def wait_jobs(procs, timeout, what=""):
    """Waits for the processes (started with stderr piped, each in a session
    of its own) until `timeout` seconds from now, killing those still
    running then; returns the first thing that went wrong, or None."""
    problem = None
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0 and problem is None:
                problem = f"{what}exit status {proc.returncode}: {err.strip()[-400:]}"
        except subprocess.TimeoutExpired:
            problem = problem or f"{what}timed out after {timeout} s"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return problem


def solo_steps(work, model, steps, reps, jobs, timeout):
    """The median step time (ms) of a one-rank job that trains on the 2-host
    run's per-rank batch, with `jobs` such jobs at once (each its own
    process, no network): the first job's, and what went wrong (None)."""
    procs, traces = [], []
    for j in range(jobs):
        trace = os.path.join(work, f"solo{jobs}_{j}.json")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TNT_TIMELINE=trace)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
             "--steps", str(steps), "--reps", str(reps), "--global-batch", str(GLOBAL_BATCH // 2)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True))
        traces.append(trace)
    problem = wait_jobs(procs, timeout, "one-rank job: ")
    if problem:
        return None, problem
    rows = breakdown(load_trace(traces[0]), 1).get(config_name(*CONFIGS[0]), {})
    return (statistics.median(rows["step"]), None) if rows.get("step") else (None, "no steps")


def weak_scaling(results, solo):
    """E(2) per model and link from the 2-host rows of the defaults and the
    one-rank step times, solo[model][alone|busy]."""
    out = []
    for r in results:
        if ((r["hosts"], r["ranks_per_host"]) == (2, 1)
                and (r["fusion"], r["overlap"]) == CONFIGS[0] and r["model"] in solo):
            row = {"model": r["model"], "link": r["link"], "step_ms": r["step_ms"]}
            for key, ms in solo[r["model"]].items():
                if ms:
                    row[f"solo_{key}_ms"] = round(ms, 3)
                    row[f"e2_{key}"] = round(ms / r["step_ms"], 3)
            out.append(row)
    return out


def framework_run(cluster, work, framework, model, steps, timeout):
    """One train_compare.py training of `model` by `framework` on the
    cluster's hosts, one rank each: (rank 0's result, None) or (None, why)."""
    os.makedirs(work, exist_ok=True)
    result = os.path.join(work, "result.json")
    n = len(cluster.hosts)
    wargs = [os.path.join(BENCH, "train_compare.py"), "worker", "--framework", framework,
             "--model", model, "--ranks", str(n), "--cores", str(n),
             "--per-rank-batch", str(GLOBAL_BATCH // 2), "--warmup", "3", "--steps", str(steps),
             "--keras", "tf-keras" if framework == "mwms" else "keras3", "--result", result]
    procs = []
    if framework == "mwms":
        env = cluster.env(launcher=False, OMP_NUM_THREADS="1", TF_USE_LEGACY_KERAS="1")
        port = 23000 + random.randint(0, 2000)
        workers = [f"169.254.{cluster.octet}.{k + 2}:{port}" for k in range(n)]
        for k, host in enumerate(cluster.hosts):
            wenv = dict(env, TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": k}}))
            procs.append(subprocess.Popen(
                [SIM, "agent", host, " ".join([sys.executable] + wargs)], env=wenv,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True, start_new_session=True))
    else:
        env = cluster.env(OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [shutil.which("tarantella"), "--hostfile", cluster.hostfile(work), "--n-per-node", "1",
             "--no-gpu", "--run-dir", os.path.join(work, "run"), "--python-interpreter",
             sys.executable, "--"] + wargs, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True))
    problem = wait_jobs(procs, timeout)
    cluster.kill_processes()
    if problem is None and not os.path.exists(result):
        problem = "no result"
    if problem is None:
        import train_compare  # the ranks must end with the same weights
        problem = train_compare._disagreement(result, n)
    if problem:
        return None, problem
    with open(result) as f:
        return json.load(f), None


# The models of train_compare.py that every mode here trains.
MODELS = ("lenet5", "resnet", "transformer")
# --zero: ZeRO stages 1 to 3 against stage 0 (train_compare.py's
# frameworks), on its CNN, its Transformer and its dense stack.
ZERO_MODELS = ("lenet5", "transformer", "dense")
ZERO_FRAMEWORKS = ("tarantella", "tarantella-zero1", "tarantella-zero2", "tarantella-zero3")


def compare_driver(args, frameworks, models, **described):
    """`frameworks` (train_compare.py's) on 2 simulated hosts, one rank
    each, for `models` on every link of --links: (the configuration, with
    `described` in it; a row per link and model with each framework's
    median step)."""
    require_cluster_tools("sim_cluster_bench")
    links = links_of(args.links)
    steps = 6 if args.quick else 20
    keep = os.path.abspath(args.keep_dir) if args.keep_dir else tempfile.mkdtemp(
        prefix="tnt-simbench-fw-")
    config = new_config(
        hosts=2, ranks_per_host=1, global_batch=GLOBAL_BATCH, timed_steps=steps, warmup_steps=3,
        models=list(models), frameworks=list(frameworks), **described,
        statistic="median step time of rank 0 over the timed steps (train_compare.py)",
        links={})
    results = []
    cluster = Cluster(2)
    try:
        for link in links:
            config["links"][link] = cluster.shape(LINKS[link])
            for model in models:
                row = {"link": link, "model": model}
                # A rotating order, so that a trend in the machine's load
                # hits every framework alike.
                turn = len(results) % len(frameworks)
                for fw in frameworks[turn:] + frameworks[:turn]:
                    t0 = time.monotonic()
                    out, problem = framework_run(
                        cluster, os.path.join(keep, f"{link}_{model}_{fw}"), fw, model, steps,
                        args.timeout)
                    row[f"{fw}_step_ms"] = None if problem else round(
                        out["median_step_s"] * 1e3, 3)
                    if problem:
                        config["problems"][f"{link} {model} {fw}"] = problem
                    print(f"sim_cluster_bench: {model} {fw} {link}: "
                          f"{time.monotonic() - t0:.0f} s{'; ' + problem if problem else ''}",
                          file=sys.stderr, flush=True)
                results.append(row)
    finally:
        cluster.down()
    finish_config(config)
    return config, results


def frameworks_driver(args):
    """Tarantella against MultiWorkerMirroredStrategy on 2 simulated hosts."""
    config, results = compare_driver(
        args, ("tarantella", "mwms"), MODELS,
        mwms="tf.distribute.MultiWorkerMirroredStrategy, tf-keras, RING")
    for row in results:
        if row["tarantella_step_ms"] and row["mwms_step_ms"]:
            row["ratio"] = round(row["mwms_step_ms"] / row["tarantella_step_ms"], 3)
    write_results(args.out, "sim_cluster_frameworks", {"config": config, "results": results})


def zero_driver(args):
    """ZeRO stages 1 to 3 against stage 0 on 2 simulated hosts: the
    throughput of each stage over stage 0's (stage 0's step / the stage's)."""
    config, results = compare_driver(
        args, ZERO_FRAMEWORKS, ZERO_MODELS, optimizer="SGD with momentum (train_compare.py)")
    for row in results:
        base = row["tarantella_step_ms"]
        for stage in (1, 2, 3):
            mine = row[f"tarantella-zero{stage}_step_ms"]
            if base and mine:
                row[f"stage{stage}_over_stage0"] = round(base / mine, 3)
    write_results(args.out, "sim_cluster_zero", {"config": config, "results": results})


def layout_label(nhosts, per_host):
    """"2" for 2 hosts of one rank each, "2x2" for 2 hosts of 2 ranks."""
    return str(nhosts) if per_host == 1 else f"{nhosts}x{per_host}"


def run_config(args, cluster, keep, layout, link, model, applied, steps, reps, left, todo,
               cost, config, results):
    """Trains `model` on the cluster as it is shaped now, `layout` =
    (hosts, ranks per host), adds its rows to `results`; returns a trace
    file of the run (None if it wrote none)."""
    nhosts, per_host = layout
    label = layout_label(nhosts, per_host)
    work = os.path.join(keep, f"{label}hosts_{link}_{model}")
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    # Each run's time limit is its share of what is left of the budget,
    # by its expected cost (4 hosts and slow links take longest).
    share = left * cost(layout, link, model) / sum(cost(*r) for r in todo)
    todo.remove((layout, link, model))
    limit = min(args.timeout, max(90.0, share))
    files, problem = launch(cluster, work, steps, reps, limit, args.algorithm, args.variants,
                            model, per_host)
    key = f"{label}hosts_{link}_{model}"
    try:
        per_rank = [breakdown(load_trace(f), nhosts) for f in files]
    except (OSError, ValueError) as e:
        per_rank, problem = [], f"{problem or ''} unreadable trace: {e}".strip()
    if len(files) < nhosts * per_host:
        problem = (f"{problem or ''} traces of {len(files)} of {nhosts * per_host} "
                   "ranks").strip()
    try:
        with open(os.path.join(work, "losses.json")) as f:
            losses = json.load(f)
    except (OSError, ValueError):
        losses = None
    named = [(name, fields) for name, fields, _ in configs(args.variants)]
    for row in summarize(per_rank, nhosts, LINKS[link], named, losses):
        row.update({"hosts": nhosts, "ranks_per_host": per_host, "link": link, "model": model,
                    "link_shaping": applied, "complete": problem is None})
        results.append({k: row[k] for k in ("hosts", "ranks_per_host", "link", "model")} | row)
    if problem:
        config["problems"][key] = problem
    print(f"sim_cluster_bench: {nhosts} hosts x {per_host}, {link} ({applied}), {model}: "
          f"{time.monotonic() - t0:.0f} s (limit {limit:.0f} s)"
          f"{'; ' + problem if problem else ''}", file=sys.stderr, flush=True)
    return files[0] if files and problem is None else None


def driver(args):
    require_cluster_tools("sim_cluster_bench")
    layouts, links = layouts_of(args.hosts, "--hosts"), links_of(args.links)
    steps, reps = (4, 1) if args.quick else (args.steps, args.reps)
    budget = args.budget if args.budget else (200 if args.quick else 840) * len(
        args.models.split(","))
    keep = os.path.abspath(args.keep_dir) if args.keep_dir else tempfile.mkdtemp(
        prefix="tnt-simbench-")
    os.makedirs(keep, exist_ok=True)
    ncores = os.cpu_count()
    models = args.models.split(",")
    for model in models:
        if model not in MODELS:
            sys.exit(f"sim_cluster_bench: unknown model {model}; choose from "
                     f"{', '.join(MODELS)}")
    config = new_config(
        models=models, global_batch=GLOBAL_BATCH, steps_per_fit=steps, fits_per_config=reps,
        fusion_threshold_kb_on=FUSION_KB, fusion_threshold_kb_off=0, overlap=OVERLAP_ENV,
        defaults=CONFIGS[0], layouts=[layout_label(*lay) for lay in layouts],
        quick=bool(args.quick), statistic="per-rank median over steps, mean over ranks",
        oversubscribed={layout_label(h, p): h * p > ncores for h, p in layouts}, links={},
        allreduce_algorithm=args.algorithm, variants=VARIANTS if args.variants else None,
        budget_s=budget)
    results, example = [], None
    start = time.monotonic()
    todo = [(lay, link, m) for lay in layouts for link in links for m in models]

    def cost(layout, link, model):
        ranks = layout[0] * layout[1]
        return ranks * ranks * (3 if LINKS[link] < 5e9 else 1)

    for layout in layouts:
        cluster = Cluster(layout[0])
        try:
            for link in links:
                applied = cluster.shape(LINKS[link])
                config["links"][link] = applied
                for model in models:
                    example = run_config(args, cluster, keep, layout, link, model, applied,
                                         steps, reps, budget - (time.monotonic() - start),
                                         todo, cost, config, results) or example
        finally:
            cluster.down()
    scaling = []
    if (2, 1) in layouts and not args.variants:
        # Weak scaling of the models the issue names: LeNet-5 and ResNet.
        solo = {}
        for model in [m for m in models if m in ("lenet5", "resnet")]:
            work = os.path.join(keep, f"1host_{model}")
            os.makedirs(work, exist_ok=True)
            solo[model] = {}
            for key, jobs in (("alone", 1), ("busy", 2)):
                solo[model][key], problem = solo_steps(work, model, steps, reps, jobs,
                                                       args.timeout)
                if problem:
                    config["problems"][f"1host_{model}_{key}"] = problem
        scaling = weak_scaling(results, solo)
    finish_config(config)
    config["added_delay"] = DELAY if all("netem" in v for v in config["links"].values()) else (
        "none: this kernel has no netem qdisc (links are rate-limited with tbf only)")
    config["timeline_example"] = example
    write_results(args.out, "sim_cluster_compression" if args.variants else "sim_cluster",
                  {"config": config, "results": results, "weak_scaling": scaling})
    if any("netem" not in v for v in config["links"].values()):
        print("note: this kernel has no netem qdisc; links are rate-limited with tbf and get no "
              "added delay (the link labels keep the 0.1ms of the intended setup)")
    over = [label for label, o in config["oversubscribed"].items() if o]
    if over:
        print(f"note: the layouts {', '.join(over)} have more ranks than the {ncores} cores: "
              "oversubscribed, compute is slower and noisier than on a real cluster")
    print(f"timeline example: {example}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the results file here")
    p.add_argument("--quick", action="store_true",
                   help="4 steps x 1 fit per configuration, 200 s budget")
    p.add_argument("--hosts", default="2,4,2x2",
                   help="layouts: H (hosts of one rank) or HxP (hosts of P ranks), "
                        "comma-separated (default 2,4,2x2)")
    p.add_argument("--links", default=",".join(LINKS), help="link kinds (default both)")
    p.add_argument("--steps", type=int, default=10, help="steps per fit (default 10)")
    p.add_argument("--reps", type=int, default=3, help="fits per configuration (default 3)")
    p.add_argument("--timeout", type=int, default=600,
                   help="most seconds one run may take (default 600)")
    p.add_argument("--budget", type=int,
                   help="seconds for all runs together (default 840, quick 200); each run "
                        "gets a share, and one that runs out is cut short")
    p.add_argument("--algorithm", default="auto",
                   help="TNT_ALLREDUCE_ALGORITHM of the ranks (default auto: libtnt's choice)")
    p.add_argument("--keep-dir", help="where traces and logs go (default: a new temp dir)")
    p.add_argument("--allreduce", action="store_true",
                   help="measure tnt-bench allreduce against MPI_Allreduce instead of training")
    p.add_argument("--layouts", default="2x1,2x2,4x1",
                   help="with --allreduce: HOSTSxRANKS per host, comma-separated "
                        "(default 2x1,2x2,4x1)")
    p.add_argument("--tnt-bench", default=shutil.which("tnt-bench"),
                   help="with --allreduce: the tnt-bench program (default: the one on PATH)")
    p.add_argument("--max", default="64M",
                   help="with --allreduce: the largest message (default 64M; quick 4M)")
    p.add_argument("--variants", action="store_true",
                   help="compare none, fp16, bf16 (TNT_COMPRESSION), an auto threshold and "
                        "readiness order, all with overlap and fusion on, instead of fusion and "
                        "overlap on/off")
    p.add_argument("--frameworks", action="store_true",
                   help="compare Tarantella with MultiWorkerMirroredStrategy (tf-keras) on 2 "
                        "hosts, for the models of train_compare.py")
    p.add_argument("--zero", action="store_true",
                   help="compare ZeRO stages 1 and 2 with stage 0 on 2 hosts, for LeNet-5, "
                        "the Transformer and the dense stack of train_compare.py")
    p.add_argument("--loss-out", help=argparse.SUPPRESS)
    p.add_argument("--global-batch", type=int, default=GLOBAL_BATCH, help=argparse.SUPPRESS)
    p.add_argument("--models", default=",".join(MODELS),
                   help="models of train_compare.py to train (default all three)")
    p.add_argument("--model", default="lenet5", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    bench_results.stop_on_signals()
    try:
        if args.allreduce:
            if args.quick:
                args.max = "4M"
            allreduce_driver(args)
        elif args.frameworks:
            frameworks_driver(args)
        elif args.zero:
            zero_driver(args)
        else:
            driver(args)
    finally:
        Cluster.down_all()


if __name__ == "__main__":
    main()
