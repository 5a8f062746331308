#!/usr/bin/env python3
"""Training at scale, projected: step time and weak-scaling efficiency E(N)
from measured timelines and simulated allreduces.

--measure: each model of train_compare.py trains on 2 ranks with
TNT_TIMELINE; each step's compute, its buckets' sizes and readiness.
--project: those buckets reduced on N = 2 ... 1024 simulated hosts (the
allreduce times of scale.json), data-parallel and hybrid with pipeline
stages, with a check against the measured 2-host runs. The model and what
it leaves out: docs/research/benchmarks.md.

    python3 tools/research/project_scale.py --measure --out bench/results/scale_timelines.jsonl
    python3 tools/research/project_scale.py --project --out bench/results/scale_projection.jsonl
"""
import argparse
import glob
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "bench", "results")

sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
from bench_results import read_results, write_results  # noqa: E402
from step_timeline import load_trace, spans, union_ms  # noqa: E402

MODELS = ("lenet5", "resnet", "transformer")
PER_RANK_BATCH = 32
HOSTS = (2, 8, 64, 256, 1024)
GBIT = 100.0
STAGES = (2, 4)          # hybrid: pipeline stages
MICRO_BATCHES = 8        # hybrid: micro-batches per step
# The measured compute, and the same step on devices 10 and 100 times
# faster (the same network): where communication starts to show.
SPEEDUPS = (1, 10, 100)
CHECK_LINK = "10gbit_0.1ms"


# ------------------------------------------------------------- measure


def step_profile(events):
    """Per step of one rank's trace: (compute_ms, [(ready_ms, bytes)])."""
    steps = spans(events, "step")
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["ph"] == "X" and e["name"] == "fusion finish"]
    subs = [(e["ts"], e["args"]["bucket"], e["args"]["bytes"]) for e in events
            if e["ph"] == "i" and e["name"] == "bucket submitted"]
    out = []
    for _, sb, se in steps:
        mine = sorted((t, b, n) for t, b, n in subs if sb <= t < se)
        if not mine:
            continue
        compute = (se - sb) / 1e3 - union_ms(waits, sb, se)
        out.append((compute, [((t - sb) / 1e3, n) for t, _, n in mine]))
    return out


def profile(trace_files, skip):
    """The model's profile from its ranks' traces, the first `skip` steps
    left out (tracing and tuning)."""
    ranks = []
    for path in trace_files:
        steps = step_profile(load_trace(path))[skip:]
        if not steps:
            sys.exit(f"project_scale: no timed steps with buckets in {path}")
        nb = statistics.mode(len(b) for _, b in steps)
        steps = [s for s in steps if len(s[1]) == nb]
        compute = statistics.median(c for c, _ in steps)
        buckets = [(statistics.median(s[1][i][0] for s in steps), steps[0][1][i][1])
                   for i in range(nb)]
        ranks.append((compute, buckets))
    compute = statistics.fmean(c for c, _ in ranks)
    nb = len(ranks[0][1])
    buckets = [{"ready_ms": round(statistics.fmean(r[1][i][0] for r in ranks), 3),
                "bytes": ranks[0][1][i][1]} for i in range(nb)]
    # Readiness after the compute ends is a measuring artefact (a bucket
    # submitted while the rank waited): it cannot be later than the compute.
    for b in buckets:
        b["ready_ms"] = min(b["ready_ms"], compute)
    return {"compute_ms": round(compute, 3),
            "tail_ms": round(compute - max(b["ready_ms"] for b in buckets), 3),
            "gradient_bytes": sum(b["bytes"] for b in buckets), "buckets": buckets}


def measure(args):
    tnt = shutil.which("tarantella")
    if tnt is None:
        sys.exit("project_scale: `tarantella` is not on PATH (make install)")
    out = {"config": {"per_rank_batch": PER_RANK_BATCH, "ranks": 2, "hosts": 1,
                      "overlap": "on", "steps": args.steps, "skipped_steps": args.skip,
                      "load_average_at_start": round(os.getloadavg()[0], 2)},
           "models": {}}
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "trace.json")
            cmd = [tnt, "--no-gpu", "-n", "2", "--run-dir", os.path.join(d, "run"),
                   "-x", f"TNT_TIMELINE={trace}", "TNT_OVERLAP=on", "OMP_NUM_THREADS=1",
                   "TF_CPP_MIN_LOG_LEVEL=2", "--",
                   os.path.join(ROOT, "tools", "bench", "train_compare.py"), "worker",
                   "--framework", "tarantella",
                   "--model", model, "--ranks", "2", "--cores", "2",
                   "--per-rank-batch", str(PER_RANK_BATCH), "--warmup", "3",
                   "--steps", str(args.steps), "--keras", "keras3",
                   "--result", os.path.join(d, "result.json")]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            files = sorted(glob.glob(os.path.join(d, "trace.rank*.json")))
            if p.returncode != 0 or len(files) != 2:
                sys.exit(f"project_scale: {model}: exit {p.returncode}, traces {files}\n"
                         f"{p.stderr[-2000:]}")
            out["models"][model] = profile(files, args.skip)
            m = out["models"][model]
            print(f"{model}: compute {m['compute_ms']} ms, {len(m['buckets'])} buckets, "
                  f"{m['gradient_bytes']} bytes, tail {m['tail_ms']} ms", flush=True)
    out["config"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    return out


# ------------------------------------------------------------- project


class Curve:
    """Allreduce time (ms) by bytes from (bytes, us) points: log-log
    interpolation inside, the largest point's rate beyond, the smallest
    point's time below."""

    def __init__(self, points):
        self.p = sorted(points)
        if len(self.p) < 2:
            raise ValueError("a curve needs two sizes")

    def ms(self, n):
        p = self.p
        if n <= p[0][0]:
            return p[0][1] / 1e3
        if n >= p[-1][0]:
            return p[-1][1] * n / p[-1][0] / 1e3
        for (b0, t0), (b1, t1) in zip(p, p[1:]):
            if b0 <= n <= b1:
                f = math.log(n / b0) / math.log(b1 / b0)
                return math.exp(math.log(t0) + f * math.log(t1 / t0)) / 1e3
        raise AssertionError


def step_ms(prof, curve, stretch=1.0, share=1):
    """The projected step: buckets reduced one after another from their
    submission (each of 1/`share` of its bytes, times stretched by
    `stretch`)."""
    compute = prof["compute_ms"] * stretch
    done = 0.0
    for b in prof["buckets"]:
        done = max(b["ready_ms"] * stretch, done) + curve.ms(b["bytes"] / share)
    return max(compute, done + prof["tail_ms"] * stretch)


def curves(scale, gbit=GBIT):
    """{hosts: Curve} of libtnt's choice (auto), one rank per host, `gbit`
    Gbit/s."""
    pts = {}
    for r in scale["results"]:
        if (r["impl"] == "tnt" and r.get("choice") == "auto" and r["per_host"] == 1
                and r["gbit"] == gbit):
            pts.setdefault(r["hosts"], []).append((r["bytes"], r["us"]))
    return {h: Curve(p) for h, p in pts.items() if len(p) >= 2}


def two_host_rows(measured_steps):
    """{model: the measured 2-host run (10 Gbit/s, one rank per host, the
    defaults)}."""
    return {r["model"]: r for r in measured_steps["results"]
            if r["hosts"] == 2 and r["ranks_per_host"] == 1 and r["link"] == CHECK_LINK
            and r["fusion"] is True and r["overlap"] == "auto"}


def scaled(prof, compute_ms):
    """The profile stretched to a step of `compute_ms`."""
    f = compute_ms / prof["compute_ms"]
    return dict(prof, compute_ms=compute_ms, tail_ms=prof["tail_ms"] * f,
                buckets=[dict(b, ready_ms=b["ready_ms"] * f) for b in prof["buckets"]])


def check_two_hosts(profiles, measured, measured_allreduce):
    """The projection of the measured 2-host runs from their measured
    allreduce times, beside the step they measured."""
    pts = [(r["bytes"], r["tnt_us"]) for r in measured_allreduce["results"]
           if r["hosts"] == 2 and r["ranks_per_host"] == 1 and r["link"] == CHECK_LINK]
    if len(pts) < 2:
        return []
    curve, rows = Curve(pts), []
    for model, r in measured.items():
        if model in profiles:
            proj = step_ms(profiles[model], curve)
            rows.append({"model": model, "link": CHECK_LINK, "projected_step_ms":
                         round(proj, 3), "measured_step_ms": r["step_ms"],
                         "ratio": round(proj / r["step_ms"], 3)})
    return rows


def timeline_document(out):
    """The results file of --measure: a row per model, a row per bucket."""
    return {"config": out["config"],
            "models": [{"model": m, **{k: v for k, v in p.items() if k != "buckets"}}
                       for m, p in out["models"].items()],
            "buckets": [{"model": m, "bucket": i, **b} for m, p in out["models"].items()
                        for i, b in enumerate(p["buckets"])]}


def profiles_of(timelines):
    """{model: its profile} from the results file of --measure."""
    return {r["model"]: dict({k: v for k, v in r.items() if k != "model"},
                             buckets=[{"ready_ms": b["ready_ms"], "bytes": b["bytes"]}
                                      for b in timelines["buckets"] if b["model"] == r["model"]])
            for r in timelines["models"]}


def project(args):
    timelines = profiles_of(read_results(args.timelines))
    by_hosts = curves(read_results(args.scale))
    measured, allreduce = {}, None
    if os.path.exists(args.measured_steps) and os.path.exists(args.measured_allreduce):
        measured = two_host_rows(read_results(args.measured_steps))
        allreduce = read_results(args.measured_allreduce)
    # The timelines were taken on a machine busy with other work: their
    # shape is kept, their length is that of the measured 2-host run's
    # compute where there is one.
    profiles = {m: scaled(p, measured[m]["compute_ms"]) if m in measured else p
                for m, p in timelines.items()}
    rows = []
    for model, measured_prof in profiles.items():
        for speedup in SPEEDUPS:
            prof = scaled(measured_prof, measured_prof["compute_ms"] / speedup)
            base = {"model": model, "compute_speedup": speedup}
            for n in sorted(by_hosts):
                s = step_ms(prof, by_hosts[n])
                rows.append(base | {"hosts": n, "mode": "data-parallel", "stages": 1,
                                    "step_ms": round(s, 4),
                                    "E": round(prof["compute_ms"] / s, 4)})
                for k in STAGES:
                    if n % k or n // k not in by_hosts:
                        continue
                    bubble = (MICRO_BATCHES + k - 1) / MICRO_BATCHES
                    s = step_ms(prof, by_hosts[n // k], stretch=bubble / k, share=k)
                    rows.append(base | {"hosts": n, "mode": "hybrid", "stages": k,
                                        "micro_batches": MICRO_BATCHES, "step_ms": round(s, 4),
                                        "E": round(prof["compute_ms"] / (k * s), 4)})
    check = check_two_hosts(profiles, measured, allreduce) if allreduce else []
    config = {"timelines": os.path.relpath(args.timelines, ROOT),
              "allreduce": os.path.relpath(args.scale, ROOT) + ": libtnt's choice, 1 rank per "
              f"host, {GBIT:g} Gbit/s", "micro_batches": MICRO_BATCHES,
              "compute_ms": {m: round(p["compute_ms"], 3) for m, p in profiles.items()}}
    return {"config": config, "results": rows, "check_2_hosts": check}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--measure", action="store_true")
    mode.add_argument("--project", action="store_true")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=10, help="first steps of a trace left out")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--timelines", default=os.path.join(RESULTS, "scale_timelines.jsonl"))
    p.add_argument("--scale", default=os.path.join(RESULTS, "scale.jsonl"))
    p.add_argument("--measured-steps", default=os.path.join(RESULTS, "sim_cluster.jsonl"))
    p.add_argument("--measured-allreduce",
                   default=os.path.join(RESULTS, "sim_cluster_allreduce.jsonl"))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.measure:
        write_results(args.out, "scale_timelines", timeline_document(measure(args)))
    else:
        write_results(args.out, "scale_projection", project(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
