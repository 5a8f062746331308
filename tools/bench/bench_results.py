"""How the benchmark scripts of this folder record a run.

Every results file carries the same stamps in its config (the host's cores,
the load average at the start and at the end, the time taken, and the runs
that failed with the end of their output) and is written the same way: whole
or not at all, as compact JSON with one result row per line, so that
bench/results stays small and a rerun's diff reads row by row.

Traces (TNT_TIMELINE files) and other raw series go to <results>/traces/,
which git ignores: `make bench` writes them again.
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


def print_problems(config):
    """The failed runs and the load average, after a script's table."""
    for key, problem in config.get("problems", {}).items():
        print(f"problem: {key}: {problem}")
    print(f"load average {config['load_average_at_start']} at the start, "
          f"{config['load_average_at_end']} at the end ({config['cores']} cores)")


def dumps(doc, indent=""):
    """JSON with a line per entry of a dict and per item of a list that
    holds containers; a row (a dict inside a list) and a list of plain
    values each stay on one line."""
    inner = indent + " "
    if isinstance(doc, dict) and doc:
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in doc.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(doc, list) and any(isinstance(v, (dict, list)) for v in doc):
        items = [inner + json.dumps(v) for v in doc]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(doc)


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


def write_json(path, doc):
    """Writes `doc` to `path` (whole file or nothing) in dumps' form."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(dumps(doc) + "\n")
    os.replace(tmp, path)
