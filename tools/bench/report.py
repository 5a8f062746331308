"""The benchmark report: bench/results/summary.md, details.md and the plots,
from the results files (bench_results.py) that the stages of run_bench.sh
wrote, judged against the targets of bench/targets.toml.

    python3 tools/bench/report.py [--results bench/results] [--quick]
    python3 tools/bench/report.py --run-info [--results DIR] [--quick]  # run.jsonl only
    python3 tools/bench/report.py --stages  # each stage and the prefix of its files

A missing results file is reported as not run, with the stage that writes
it. Each benchmark's section is a module beside this one (report_*.py;
tools/research/report_sim.py and report_scale.py), the plots are
report_plots.py's; which stage writes which file: docs/research/benchmarks.md.
"""
import argparse
import os
import platform
import subprocess
import sys
import time

import report_collectives
import report_data
import report_fit
import report_pipeline
import report_reliability
import report_training
import report_zero
from bench_results import module_of, write_results
from report_base import DETAILS, ROOT, STAGES, TARGETS, load_results, load_stages, table
from report_plots import pyplot


def command_line(*cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (p.stdout or p.stderr).strip().splitlines()[0] if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def write_run_info(args):
    path = os.path.join(args.results, "run.jsonl")
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    old, _ = load_results(path)
    if args.rerun and old is not None:
        # Only some stages run again: the run's record stays, with a note.
        info = old["config"]
        info.setdefault("reruns", []).append(
            {"stages": args.rerun, "started_utc": now,
             "load_average_at_start": [round(v, 2) for v in os.getloadavg()]})
    else:
        info = new_run_info(args, now)
    write_results(path, "run", {"config": info})


def new_run_info(args, now):
    info = {
        "started_utc": now,
        "mode": "quick" if args.quick else "full",
        "commit": command_line("git", "-C", ROOT, "rev-parse", "--short", "HEAD"),
        "uncommitted_changes": bool(command_line("git", "-C", ROOT, "status", "--porcelain",
                                                 "--untracked-files=no")),
        "host_cores": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mpi": command_line(args.mpirun, "--version"),
    }
    try:
        import importlib.metadata as md
        info["tensorflow"] = md.version("tensorflow-cpu")
    except Exception:  # noqa: BLE001 - any failure just leaves it out
        pass
    return info


def header(results, stages, quick):
    run, _ = load_results(os.path.join(results, "run.jsonl"))
    info = run["config"] if run else {}
    mode = info.get("mode", "quick" if quick else "full")
    out = ["# Tarantella benchmark results", ""]
    out.append(f"`make bench{' QUICK=1' if mode == 'quick' else ''}` "
               f"({mode} run), started {info.get('started_utc', '?')} UTC, commit "
               f"`{info.get('commit', '?')}`"
               + (" with uncommitted changes" if info.get("uncommitted_changes") else "") + ".")
    load = info.get("load_average_at_start")
    out.append(f"One host: {info.get('host_cores', '?')} cores"
               + (f", load average {load[0]:.2f} at the start" if load else "")
               + f"; {info.get('mpi') or 'MPI ?'}; Python {info.get('python', '?')}, "
               f"TensorFlow {info.get('tensorflow', '?')}.")
    for r in info.get("reruns", []):
        out.append(f"Run again later: {r['stages']}, at {r['started_utc']} UTC (load average "
                   f"{r['load_average_at_start'][0]:.2f}).")
    if mode == "quick":
        out += ["", "A quick run: fewer sizes, steps and trials than the full run; its "
                "figures are indicative only."]
    out.append("")
    return out


def stages_section(stages):
    out = ["## Stages", ""]
    if not stages:
        return out + ["No stage record (logs/stages.tsv); the report was run on its own.", ""]
    rows = [[name, st["status"] if st["status"] == "ok" else f"**{st['status']}**",
             st["rc"], st["seconds"], f"`{st['log']}`"] for name, st in stages.items()]
    return out + [table(["stage", "status", "exit", "seconds", "log"], rows), ""]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--quick", action="store_true", help="the results are of a quick run")
    p.add_argument("--run-info", action="store_true",
                   help="only record the run's environment in run.jsonl (at the start of a run)")
    p.add_argument("--mpirun", default="mpirun", help="with --run-info: the MPI launcher")
    p.add_argument("--rerun", metavar="STAGES",
                   help="with --run-info: only these stages run again; keep the run's record")
    p.add_argument("--stages", action="store_true",
                   help="print each stage of make bench and the prefix of its files")
    args = p.parse_args()
    if args.stages:
        print("\n".join(f"{stage} {prefix}" for stage, prefix in STAGES.items()))
        return 0
    os.makedirs(args.results, exist_ok=True)
    if args.run_info:
        write_run_info(args)
        return 0
    plt = pyplot()
    stages = load_stages(args.results)
    targets = []
    body = []
    sim = module_of("tools/research", "report_sim")
    scale = module_of("tools/research", "report_scale")
    body += report_collectives.section(args.results, stages, plt, targets)
    body += report_fit.overhead_section(args.results, stages, targets)
    body += report_fit.fusion_section(args.results, stages, plt, targets)
    body += report_training.section(args.results, stages, plt, targets)
    body += sim.sim_section(args.results, stages, plt, targets)
    body += sim.sim_allreduce_section(args.results, stages, plt, targets)
    body += sim.sim_frameworks_section(args.results, stages, targets)
    body += report_pipeline.section(args.results, stages, plt, targets)
    body += report_data.section(args.results, stages, targets)
    body += sim.compression_section(args.results, stages, targets)
    body += scale.section(args.results, stages, plt, targets)
    body += report_reliability.section(args.results, stages, targets)
    body += report_zero.section(args.results, stages, targets)
    out = header(args.results, stages, args.quick)
    if plt is None:
        out += ["matplotlib is not installed: no plots (`tools/setup/install_deps.sh bench`).",
                ""]
    counts = {k: sum(1 for t in targets if t.result.strip("*") == k)
              for k in ("PASS", "MISS", "FAILED", "NOT RUN", "N/A")}
    out += ["## Targets", ""]
    out.append(", ".join(f"{v} {k}" for k, v in counts.items() if v) + ".")
    out.append("")
    out.append(table(["target", "required", "measured", "result", "note"],
                     [t.row() for t in targets]))
    out.append("")
    next_steps = TARGETS["next_steps"]
    missed = [f for f in next_steps if any(t.ok is False and t.family == f for t in targets)]
    if missed:
        out += ["### What would close the misses", ""]
        out += [f"- **{f}**: {next_steps[f]}" for f in missed]
        out.append("")
    out += stages_section(stages)
    out += body
    with open(os.path.join(args.results, "summary.md"), "w") as f:
        f.write("\n".join(out).rstrip() + "\n")
    with open(os.path.join(args.results, "details.md"), "w") as f:
        f.write("\n".join(["# Tarantella benchmark details", "",
                           "What summary.md leaves out: whole configurations and tables of "
                           "every run (`make bench` writes this file; the repository keeps "
                           "summary.md only).", "", *DETAILS]).rstrip() + "\n")
    print(f"wrote {os.path.join(args.results, 'summary.md')}: " +
          ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
