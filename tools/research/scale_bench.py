#!/usr/bin/env python3
"""At scale, simulated: libtnt's allreduce on SimGrid clusters (tnt-sim under smpirun).

  --validate  the simulated allreduce against the one measured on the
              network-namespace cluster (sim_cluster_allreduce.jsonl)
  --scale     libtnt's choice against SMPI's MPI_Allreduce (Open MPI and
              MPICH selectors) on fat-trees of 8 to 1024 hosts;
              with --collective reduce_scatter, libtnt's reduce-scatter
              against SMPI's MPI_Reduce_scatter_block; with --collective
              allgather, libtnt's allgather against MPI_Allgather
  --check     every algorithm's sum checked on each layout

  python3 tools/research/scale_bench.py --validate --out bench/results/scale_validation.jsonl
  python3 tools/research/scale_bench.py --scale --hosts 8,64,256,1024 --per-host 1,8 \\
      --gbit 100 --out bench/results/scale.jsonl
  python3 tools/research/scale_bench.py --scale --collective reduce_scatter --hosts 8,64 \
      --per-host 1 --gbit 100 --out bench/results/scale_reduce_scatter.jsonl

The simulation is deterministic: one run per configuration. The method:
docs/research/benchmarks.md.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
from bench_results import read_results, write_results  # noqa: E402
GEN_PLATFORM = os.path.join(ROOT, "src", "sim", "gen_platform.sh")
SMPI_CFG = ["--cfg=smpi/privatization:no", "--cfg=smpi/simulate-computation:no",
            "--cfg=smpi/shared-malloc:global", "--log=root.thresh:warning",
            # The platform's links are the network: no SMPI corrections of
            # latency and bandwidth by message size (its defaults are
            # calibrated for one particular cluster).
            "--cfg=smpi/lat-factor:0:1", "--cfg=smpi/bw-factor:0:1"]
# The measured runs had no added delay (tbf only); one way across the
# namespaces, TCP and MPI took about 20 us: tnt-bench's 4 KiB allreduce of 2
# ranks at 10 Gbit/s (one exchange) took 24.5 us, of which 4.4 us are the
# bytes at 7.38 Gbit/s. The simulated route has 2 links of half that each.
VALIDATE_LAT_US = 10.0
# The simulated link carries what one TCP stream each way carried in the
# measured run (the probe of sim_cluster_bench), whose ACKs already crossed
# the links then. SimGrid's cross-traffic would charge them again, 5 % of
# each flow on the reverse direction: 2 hosts exchanging at 0.955 Gbit/s
# got 0.907 (0.950 of the link) with it, 0.953 without.
VALIDATE_CFG = ["--cfg=network/crosstraffic:0"]
# --scale compares the networks' use only: SMPI's MPI_Allreduce reduces and
# copies for free in the simulation, so libtnt's copies and reductions are
# free too (tnt-sim --copy-gbps 0), and tnt-sim tells libtnt's choice so.
SCALE_COPY_GBPS = 0.0


def find_sim(build):
    path = os.path.join(build, "src", "sim", "tnt-sim.so")
    if not os.path.exists(path):
        sys.exit(f"scale_bench: no {path}: build with SimGrid (libsimgrid-dev) installed")
    return path


def hostfile(dirname, counts):
    """A hostfile with counts[h] lines of host h."""
    path = os.path.join(dirname, "hosts")
    with open(path, "w") as f:
        for h, k in enumerate(counts):
            f.write(f"host{h}\n" * k)
    return path


def layout_counts(spec):
    """Ranks per host of a layout: HxP, or counts joined by '+'."""
    if "x" in spec:
        h, p = spec.split("x")
        return [int(p)] * int(h)
    return [int(k) for k in spec.split("+")]


def check(args, sim):
    """tnt-sim --check on each layout: exact sums on every rank, the other
    sums bit for bit against the serial sum in each algorithm's documented
    order, the same bits on every rank."""
    out = []
    for spec in args.layouts.split(","):
        counts = layout_counts(spec)
        with tempfile.TemporaryDirectory() as d:
            plat = os.path.join(d, "p.xml")
            # The platforms come in sizes up to 32, 64, 256 and 1024 hosts;
            # a layout uses the first hosts of the smallest that holds it.
            size = next(n for n in (len(counts), 64, 256, 1024) if n >= len(counts) and
                        (n <= 32 or n in (64, 256, 1024)))
            write_platform(plat, size, 100, 1)
            cmd = ["smpirun", "-np", str(sum(counts)), "-platform", plat, "-hostfile",
                   hostfile(d, counts), *SMPI_CFG, sim, "--check", "--algos", args.algos]
            start = time.monotonic()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
                ok, why = p.returncode == 0, (p.stderr.strip().splitlines() or [""])[-1]
                lines = [line for line in p.stdout.splitlines() if line.strip()]
            except subprocess.TimeoutExpired:
                ok, why, lines = False, f"stopped after {args.run_timeout:g} s", []
        out.append({"layout": spec, "hosts": len(counts), "ranks": sum(counts),
                    "algorithms": args.algos, "results": len(lines), "ok": ok,
                    "error": None if ok else why, "wall_s": round(time.monotonic() - start, 1)})
        print(json.dumps(out[-1]), flush=True)
    return {"config": {"cases": "src/sim/sim_check.h", "platform": "fat-tree, 100 Gbit/s"},
            "results": out}


def network_env(platform):
    """libtnt is told the simulated network, as a user tells it theirs
    (TNT_NETWORK_GBIT, TNT_NETWORK_LATENCY_US): the platform's link rate,
    and the latency from one host to another under one switch (two links)."""
    with open(platform) as f:
        text = f.read()
    gbit = re.search(r'\bbw="([0-9.]+)Gbps"', text).group(1)
    lat_us = float(re.search(r'\blat="([0-9.]+)us"', text).group(1))
    return {"TNT_NETWORK_GBIT": gbit, "TNT_NETWORK_LATENCY_US": f"{2 * lat_us:g}"}


def run_sim(sim, platform, hosts, per_host, args, extra_cfg=(), timeout=None):
    """Runs tnt-sim --bench; returns (rows, wall seconds, error or None). A
    run stopped at `timeout` keeps the sizes it finished."""
    env = dict(os.environ, **network_env(platform))
    with tempfile.TemporaryDirectory() as d:
        cmd = ["smpirun", "-np", str(hosts * per_host), "-platform", platform, "-hostfile",
               hostfile(d, [per_host] * hosts), *SMPI_CFG, *extra_cfg, sim, "--bench", *args]
        start = time.monotonic()
        with open(os.path.join(d, "out"), "w+") as out, open(os.path.join(d, "err"), "w+") as err:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, env=env)
            try:
                rc, why = p.wait(timeout=timeout), None
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # smpirun and the simulation it started
                rc, why = p.wait(), f"stopped after {timeout:g} s of wall time"
            wall = time.monotonic() - start
            out.seek(0)
            err.seek(0)
            rows = [json.loads(line) for line in out if line.startswith("{")]
            if why is None and rc != 0:
                why = (err.read().strip().splitlines() or [f"exit status {rc}"])[-1]
        return rows, wall, why


def write_platform(path, hosts, gbit, lat_us):
    """A fat-tree of `hosts` hosts, links of `gbit` Gbit/s and `lat_us` us."""
    with open(path, "w") as f:
        subprocess.run([GEN_PLATFORM, "--hosts", str(hosts), "--gbit", str(gbit),
                        "--lat-us", str(lat_us)], stdout=f, check=True)
    return path


def measured_rows(paths):
    """The rows of the measured runs in `paths`, each layout and link from
    the first file that has it, with that file's link rates (tcp_gbit), its
    shaping and the load average around the run."""
    rows, tcp, seen = [], {}, set()
    for path in paths:
        measured = read_results(path)
        cfg = measured["config"]
        keys = set()
        for r in measured["results"]:
            key = f"{r['hosts']}x{r['ranks_per_host']}_{r['link']}"
            if key in seen:
                continue
            keys.add(key)
            load = cfg.get("loadavg", {}).get(key) or {
                "start": cfg.get("load_average_at_start"), "end": cfg.get("load_average_at_end")}
            rows.append(dict(r, key=key, measured_file=os.path.relpath(path, ROOT),
                             shaping=cfg["links"][r["link"]], loadavg=load))
            tcp[key] = cfg["tcp_gbit"][key]
        seen |= keys
    return rows, tcp


def validate(args, sim):
    rows_in, tcp = measured_rows(args.measured)
    out = []
    with tempfile.TemporaryDirectory() as d:
        for r in rows_in:
            key = r["key"]
            plat = os.path.join(d, f"{key}.xml")
            if not os.path.exists(plat):
                write_platform(plat, r["hosts"], tcp[key], VALIDATE_LAT_US)
            size = str(r["bytes"])
            # The algorithm the measured run ran: its libtnt was not told the
            # network (TNT_NETWORK_GBIT), so on 4 hosts it chose the ring
            # where the simulated one, told, chooses Rabenseifner's; the
            # validation compares the time of the same algorithm.
            rows, wall, err = run_sim(sim, plat, r["hosts"], r["ranks_per_host"],
                                      ["--algos", r["algorithm"], "--min", size, "--max", size,
                                       "--copy-gbps", f"{r['memcpy_gbps']:.3f}"],
                                      VALIDATE_CFG)
            if err or not rows:
                sys.exit(f"scale_bench: {key} {size} B: {err or 'no result'}")
            s = rows[0]
            out.append({"hosts": r["hosts"], "ranks_per_host": r["ranks_per_host"],
                        "link": r["link"], "sim_gbit": tcp[key], "bytes": r["bytes"],
                        "measured_algorithm": r["algorithm"], "sim_algorithm": s["algorithm"],
                        "measured_busbw": r["tnt_busbw"], "sim_busbw": s["busbw"],
                        "ratio": s["busbw"] / r["tnt_busbw"], "copy_gbps": r["memcpy_gbps"],
                        "measured_file": r["measured_file"], "shaping": r["shaping"],
                        "measured_loadavg": r["loadavg"], "wall_s": round(wall, 2)})
            print(json.dumps(out[-1]), flush=True)
    config = {"measured": [os.path.relpath(m, ROOT) for m in args.measured],
              "latency_us_per_link": VALIDATE_LAT_US, "links_per_route": 2,
              "link_gbit": tcp, "smpi_cfg": SMPI_CFG + VALIDATE_CFG}
    return {"config": config, "results": out}


def scale(args, sim):
    out, runs = [], []
    algos = ["auto"] + [a for a in args.algos.split(",") if a and a != "auto"]
    collective = ["--collective", args.collective]
    platforms = tempfile.TemporaryDirectory()
    for gbit in args.gbit.split(","):
        for hosts in (int(h) for h in args.hosts.split(",")):
            # 1 us a link at 10 Gbit/s (Ethernet switches), 0.5 us at 100
            # and 400 Gbit/s (InfiniBand-class switches and NICs).
            plat = write_platform(os.path.join(platforms.name, f"fattree_{hosts}_{gbit}g.xml"),
                                  hosts, gbit, 1 if gbit == "10" else 0.5)
            for per_host in (int(p) for p in args.per_host.split(",")):
                jobs = [("tnt", ["--algos", ",".join(algos), "--copy-gbps",
                                 str(SCALE_COPY_GBPS)], [])]
                jobs += [(f"mpi_{sel}", ["--mpi"], [f"--cfg=smpi/coll-selector:{sel}"])
                         for sel in ("ompi", "mpich")]
                jobs = [j for j in jobs if j[0] in args.impls.split(",")]
                for impl, a, cfg in jobs:
                    rows, wall, err = run_sim(sim, plat, hosts, per_host,
                                              a + collective + ["--min", args.min, "--max",
                                                                args.max, "--iters", "1"],
                                              cfg, args.run_timeout)
                    for r in rows:
                        r.update(impl=impl, gbit=float(gbit),
                                 per_host=per_host)
                        out.append(r)
                    run = {"impl": impl, "hosts": hosts, "per_host": per_host,
                           "gbit": float(gbit), "wall_s": round(wall, 1), "sizes": len(rows),
                           "error": err}
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    platforms.cleanup()
    config = {"platforms": "src/sim/gen_platform.sh",
              "collective": args.collective, "copy_gbps": SCALE_COPY_GBPS, "smpi_cfg": SMPI_CFG}
    return {"config": config, "runs": runs, "results": out}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--validate", action="store_true")
    mode.add_argument("--scale", action="store_true")
    mode.add_argument("--check", action="store_true",
                      help="correctness on --layouts (exact and ordered sums)")
    p.add_argument("--layouts", default="64x1,100x1,256x1,1024x1,5+1+8+3+2+7+4+6+1+2",
                   help="with --check: HxP or ranks per host joined by '+', comma-separated")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--measured", action="append",
                   help="with --validate: a results file of sim_cluster_bench.py --allreduce; "
                        "again for more, each layout and link taken from the first that has "
                        "it (default bench/results/sim_cluster_allreduce.jsonl)")
    p.add_argument("--hosts", default="8,64,256,1024")
    p.add_argument("--per-host", default="1,8")
    p.add_argument("--gbit", default="100")
    p.add_argument("--algos", default="", help="fixed algorithms besides auto, e.g. ring,rd")
    p.add_argument("--min", default="4K")
    p.add_argument("--max", default="256M")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="wall seconds per simulation; the sizes done by then are kept")
    p.add_argument("--out", required=True)
    p.add_argument("--collective", choices=("allreduce", "reduce_scatter", "allgather"),
                   default="allreduce",
                   help="with --scale: the collective timed (reduce_scatter: against "
                        "MPI_Reduce_scatter_block; allgather: against MPI_Allgather, the "
                        "bytes gathered in all)")
    p.add_argument("--impls", default="tnt,mpi_ompi,mpi_mpich",
                   help="with --scale: which of tnt, mpi_ompi, mpi_mpich to simulate")
    p.add_argument("--append", action="store_true",
                   help="with --scale: add to the runs and results already in --out, "
                        "replacing those of the same implementation and layout")
    args = p.parse_args()
    args.measured = args.measured or [
        os.path.join(ROOT, "bench", "results", "sim_cluster_allreduce.jsonl")]
    sim = find_sim(args.build)
    if args.check:
        args.algos = args.algos or "rd,rabenseifner,auto"
        result = check(args, sim)
        write_results(args.out, "scale_check", result)
        return 0 if all(r["ok"] for r in result["results"]) else 1
    result = validate(args, sim) if args.validate else scale(args, sim)
    if args.append and os.path.exists(args.out):
        old = read_results(args.out)
        new = {(r["impl"], r["hosts"], r["per_host"], r["gbit"]) for r in result["runs"]}
        keep = [r for r in old.get("runs", [])
                if (r["impl"], r["hosts"], r["per_host"], r["gbit"]) not in new]
        kept = [r for r in old.get("results", [])
                if (r["impl"], r["hosts"], r["per_host"], r["gbit"])
                not in new]
        result["runs"] = keep + result["runs"]
        result["results"] = kept + result["results"]
    write_results(args.out, "scale_validation" if args.validate else "scale", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
