"""How the benchmarks record their results: one schema for every file.

A results file, <name>.jsonl, holds one JSON object a line:
  {"bench": B, "config": {...}}   what ran and how, with the run's stamps
  {"bench": B, "table": T, <case fields>, "metric": M, "value": V, "unit": U}
                                  one measurement of the case in table T
  {"bench": B, "metric": M, "value": V, "unit": U}   a figure of the whole run
The case fields (CASE_FIELDS: ranks, bytes, hosts, link, model, ...) say
what was measured; the unit follows from the metric's name (unit_of). A
value is a number, or the list of a repeated measurement's trials, or a
string (an algorithm chosen, an error). In Python a results file is a
document {"config": {...}, T: [rows], M: V} (write_results, read_results).
Traces and other raw series go to <results>/traces/, which git ignores.
"""
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

TRACES = "traces"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_of(folder, name):
    """The module `name` of the source tree's `folder`: tools/research (the
    research benchmarks, which the report and the pipeline benchmark use) or
    examples (the quick start's model and data)."""
    path = os.path.join(ROOT, folder)
    if path not in sys.path:
        sys.path.append(path)
    return importlib.import_module(name)


def traces_dir(results):
    """<results>/traces, created when missing."""
    path = os.path.join(results, TRACES)
    os.makedirs(path, exist_ok=True)
    return path


def load_average():
    return round(os.getloadavg()[0], 2)


def stop_on_signals():
    """Turns SIGTERM and SIGHUP into KeyboardInterrupt, so that a stopped
    benchmark still runs its `finally` clauses (ends its jobs, takes its
    simulated cluster down)."""
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)


def new_config(**fields):
    """A results file's config: `fields`, then the stamps of the run's
    start. Record a failed run in config["problems"][name] (the end of its
    output); finish_config adds the stamps of the end."""
    return {**fields, "cores": os.cpu_count(), "load_average_at_start": load_average(),
            "problems": {}, "started_s": time.monotonic()}


def finish_config(config):
    """Adds the time taken and the load average at the end (drops the
    monotonic start, which means nothing in a file)."""
    config["elapsed_s"] = round(time.monotonic() - config.pop("started_s"), 1)
    config["load_average_at_end"] = load_average()
    return config


def print_results(doc):
    """Prints a results document: a line per row of each table, the
    figures, the failed runs and the load average."""
    def text(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list):
            return "[" + " ".join(text(x) for x in v[:8]) + (" ..." if len(v) > 8 else "") + "]"
        return str(v)
    for key, value in doc.items():
        if key == "config":
            continue
        if isinstance(value, list) and all(isinstance(r, dict) for r in value):
            for row in value:
                print(f"{key}: " + ", ".join(f"{k} {text(v)}" for k, v in row.items()
                                            if not isinstance(v, dict)))
        else:
            print(f"{key}: {text(value)}")
    config = doc.get("config") or {}
    for key, problem in config.get("problems", {}).items():
        print(f"problem: {key}: {problem}")
    if "load_average_at_end" in config:
        print(f"load average {config['load_average_at_start']} at the start, "
              f"{config['load_average_at_end']} at the end ({config['cores']} cores)")


def run_job(cmd, timeout, shown, env=None, last=40):
    """Runs a job (an MPI job, a launcher) in a session of its own, killed
    with all its processes after `timeout` seconds; prints the command and
    the last `last` lines of its output for which `shown(line)` holds.
    Returns (ok, the end of its output)."""
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        return False, f"timed out after {timeout:.0f} s\n" + (out or "")[-2000:]
    keep = [line for line in out.splitlines() if shown(line)]
    sys.stdout.write("\n".join(keep[-last:]) + ("\n" if keep else ""))
    sys.stdout.flush()
    return proc.returncode == 0, out[-3000:]


CASE_FIELDS = frozenset((
    "bytes", "ranks", "hosts", "per_host", "ranks_per_host", "layout", "link", "gbit", "model",
    "framework", "keras", "fusion", "overlap", "variant", "compression", "impl", "choice",
    "stages", "stage", "chunks", "micro_batches", "schedule", "mode", "compute_speedup",
    "threshold_kb", "optimizer", "weight_gradients", "run", "rank", "job", "share", "round",
    "trial", "epoch", "bucket", "zero_stage", "variable", "device"))
# The unit of a metric: the first word of its name that is one of these
# (samples_per_s: samples/s); none for ratios, counts and names.
UNITS = {"ms": "ms", "us": "us", "s": "s", "seconds": "s", "mib": "MiB", "bytes": "B",
         "gbps": "GB/s", "busbw": "GB/s", "algbw": "GB/s", "gbit": "Gbit/s"}


def unit_of(metric):
    if metric.endswith("samples_per_s"):
        return "samples/s"
    return next((UNITS[w] for w in metric.split("_") if w in UNITS), "")


def records(bench, doc):
    """The lines of a results file: `doc`'s config, each row of each table
    (a list of dicts) as one record per metric, every other entry as a
    figure of the whole run."""
    out = [{"bench": bench, "config": doc.get("config") or {}}]
    for key, value in doc.items():
        if key == "config" or value == []:
            continue
        if not (isinstance(value, list) and all(isinstance(r, dict) for r in value)):
            out.append({"bench": bench, "metric": key, "value": value, "unit": unit_of(key)})
            continue
        seen = set()
        for row in value:
            case = {k: v for k, v in row.items() if k in CASE_FIELDS}
            ident = json.dumps(case, sort_keys=True)
            if ident in seen:
                raise ValueError(f"{bench}: two rows of {key} measure the same case {ident}")
            seen.add(ident)
            if len(case) == len(row):
                raise ValueError(f"{bench}: a row of {key} with no measurement: {ident}")
            out += [{"bench": bench, "table": key, **case, "metric": k, "value": v,
                     "unit": unit_of(k)} for k, v in row.items() if k not in CASE_FIELDS]
    return out


def write_results(path, bench, doc):
    """Prints the document `doc` of benchmark `bench` and writes it to
    `path` (whole file or nothing; no file when `path` is None)."""
    print_results(doc)
    if not path:
        return
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records(bench, doc))
    os.replace(tmp, path)


def read_results(path):
    """The document of the results file `path`: its config, its tables'
    rows (each case's fields and metrics, in the file's order) and its
    figures."""
    doc, rows = {}, {}
    with open(path) as f:
        for line in filter(str.strip, f):
            r = json.loads(line)
            if "config" in r:
                doc["config"] = r["config"]
            elif "table" in r:
                case = {k: v for k, v in r.items()
                        if k not in ("bench", "table", "metric", "value", "unit")}
                key = (r["table"], json.dumps(case, sort_keys=True))
                if key not in rows:
                    rows[key] = case
                    doc.setdefault(r["table"], []).append(case)
                rows[key][r["metric"]] = r["value"]
            else:
                doc[r["metric"]] = r["value"]
    return doc


def from_tnt_bench(src, dst):
    """tnt-bench's --json document `src` as the results file `dst`."""
    with open(src) as f:
        d = json.load(f)
    figures = ("min_ratio", "geomean_ratio")
    doc = {"config": {k: v for k, v in d.items() if k != "rows" and k not in figures},
           "rows": d["rows"], **{k: d[k] for k in figures}}
    write_results(dst, f"tnt-bench {d['collective']}", doc)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--from-tnt-bench":
        sys.exit("usage: bench_results.py --from-tnt-bench TNT_BENCH_JSON RESULTS_JSONL")
    from_tnt_bench(sys.argv[2], sys.argv[3])
