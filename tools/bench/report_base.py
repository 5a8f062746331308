"""The generic part of the benchmark report (report.py): the results files
and how each stage ended, the targets of bench/targets.toml, and the
formatting every section shares.
"""
import csv
import json
import operator
import os
import shutil
import tomllib

from bench_results import TRACES, read_results, traces_dir


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20

# The targets, their thresholds and what each stands for.
TARGETS_FILE = os.path.join(ROOT, "bench", "targets.toml")
CHECKS = {">=": operator.ge, "<=": operator.le, "<": operator.lt, ">": operator.gt}


def load_targets(path=TARGETS_FILE):
    with open(path, "rb") as f:
        return tomllib.load(f)


TARGETS = load_targets()

# The stages of `make bench` (run_bench.sh --only STAGE), in the suite's
# order, with the prefix of the results files each writes.
STAGES = {"collectives": "collectives_", "overhead": "overhead", "fusion": "fusion_sweep",
          "training": "training", "sim_cluster": "sim_cluster", "pipeline": "pipeline_",
          "data_share": "data_share", "scale": "scale", "reliability": "reliability_",
          "compression": "compression_", "zero": "zero"}

# What summary.md leaves out (whole configurations, tables of every run):
# report.py writes it to details.md.
DETAILS = []


def limit(key):
    """The threshold of target `key` in bench/targets.toml."""
    return TARGETS[key]["threshold"]


def meets(key, value, threshold=None):
    """Whether `value` meets target `key` (against `threshold` instead of the
    file's where given); None for a target that is only informational."""
    spec = TARGETS[key]
    if not spec["required"]:
        return None
    return CHECKS[spec["check"]](value, spec["threshold"] if threshold is None else threshold)


def load_results(path):
    """(the results file's document, None), or (None, why) when missing or
    unreadable."""
    if not os.path.exists(path):
        return None, "no results"
    try:
        return read_results(path), None
    except (OSError, ValueError) as e:
        return None, f"unreadable {os.path.basename(path)}: {e}"


def load_stages(results):
    path = os.path.join(results, "logs", "stages.tsv")
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    # The order of the suite, whatever order a partial rerun appended them in.
    order = list(STAGES.items())
    rank = lambda name: next((i for i, stage in enumerate(order) if name.startswith(stage)),  # noqa: E731
                             len(order))
    return {row["stage"]: row for row in sorted(rows, key=lambda r: rank(r["stage"]))}


def stage_note(stages, *names):
    """Why a stage's results are missing, from how it ended."""
    for name in names:
        st = stages.get(name)
        if st is None:
            continue
        if st["status"] == "not run":
            return f"not run: {st['log']}"
        if st["status"] != "ok":
            return f"stage {st['status']} (rc {st['rc']}, {st['log']})"
    return "not run"


def missing_note(stages, why, fname, *names):
    """Why the results file `fname` could not be used: how the stages
    `names` ended, else why the file was unusable, else the stage that
    writes it."""
    ended = stage_note(stages, *names)
    if ended != "not run":
        return ended
    if why != "no results":
        return why
    stage = next(s for s, prefix in STAGES.items() if fname.startswith(prefix))
    return f"no results; run `make bench STAGES={stage}`"


def open_section(results, stages, targets, fname, stage_names, title=None, goals=(), label="",
                 show_config=True):
    """What every section starts with: its title, then its results file
    `fname` with the file's configuration (unless not `show_config`).
    Returns (lines, doc).
    Without the file doc is None, the lines say why (after `label`) with
    the stages `stage_names`' record, and each (name, required) of `goals`
    is a target that did not run."""
    out = [title, ""] if title else []
    d, why = load_results(os.path.join(results, fname))
    if d is None:
        note = missing_note(stages, why, fname, *stage_names)
        targets.extend(Target(name, req, note=note) for name, req in goals)
        return out + [label + not_run_line([note]), ""], None
    return out + (config_lines(d.get("config"), fname) if show_config else []), d


def size_str(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1024)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def bytes_str(b):
    """Exact sizes as '4 KiB', others as '1.84 MiB'."""
    if b < 1024 or any(b >= n and b % n == 0 for n in (1 << 30, MIB, 1024)):
        return size_str(b)
    for unit, n in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1024)):
        if b >= n:
            return f"{b / n:.2f} {unit}"
    return f"{b} B"


def bw(v):
    """A bandwidth in GB/s, with the decimals that small ones need."""
    if v is None:
        return "-"
    return f"{v:.2f}" if v >= 1 else f"{v:.3f}" if v >= 0.01 else f"{v:.5f}"


def f2(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def not_run_line(notes):
    """'Not run.' or 'Not run: why.'"""
    why = sorted(set(n for n in notes if n and n != "not run"))
    return "Not run" + (": " + "; ".join(why) if why else "") + "."


def config_lines(cfg, fname):
    """The configuration of results file `fname`: its short entries, and
    the whole of it in details.md."""
    if not cfg:
        return []
    short = ", ".join(f"{k} {json.dumps(v)}" for k, v in sorted(cfg.items())
                      if len(json.dumps(v)) <= 40)
    detail(f"{fname}: whole configuration",
           ["```json", json.dumps(cfg, indent=1, sort_keys=True), "```"])
    return [f"Configuration: {short} (all of it: `details.md`).", ""]


def detail(title, lines):
    """A part of details.md: `lines` under the heading `title`."""
    DETAILS.extend([f"## {title}", "", *lines, ""])


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def image(name, results):
    return f"![{name}]({name})" if os.path.exists(os.path.join(results, name)) else \
        f"(plot {name} not drawn)"


class Target:
    """One row of the targets table."""

    def __init__(self, name, required, measured=None, ok=None, note="", family=None):
        self.name, self.required, self.measured, self.ok, self.note = \
            name, required, measured, ok, note
        self.family = family  # a key of NEXT_STEPS

    @property
    def result(self):
        if self.ok is None and self.measured is None:
            # stage_note's wording for a stage that ran and failed
            return "**FAILED**" if (self.note or "").startswith("stage ") else "NOT RUN"
        if self.ok is None:
            return "N/A"
        return "PASS" if self.ok else "**MISS**"

    def row(self):
        return [self.name, self.required, "-" if self.measured is None else self.measured,
                self.result, self.note or ""]


def short_by(measured, required, higher_is_better=True):
    """How far a measured figure is from its target, as text."""
    if higher_is_better:
        gap = required - measured
        return f"{gap:.2f}x short ({gap / required * 100:.0f}% below {required:.2f}x)"
    gap = measured - required
    return f"{gap:.3f} over ({gap / required * 100:.0f}% above {required:.2f})"


def problem_lines(cfg):
    """A line for each failed run a benchmark's config records, with the
    last line of its output."""
    out = []
    for key, problem in sorted((cfg.get("problems") or {}).items()):
        last = problem.strip().splitlines()[-1] if problem.strip() else "?"
        out.append(f"\n- {key}: failed ({last})")
    return out


TIMELINE_COPY_MAX = 4 << 20


def timeline_link(results, path):
    """Keeps a copy of the example timeline among the traces (under a fixed
    name) when it is small enough; returns how to refer to it."""
    src = path if os.path.isabs(path) else os.path.join(results, path)
    name = f"{TRACES}/sim_cluster_timeline" + (".json.gz" if src.endswith(".gz") else ".json")
    dst = os.path.join(results, name)
    if os.path.isfile(src) and os.path.getsize(src) <= TIMELINE_COPY_MAX:
        if os.path.abspath(src) != os.path.abspath(dst):
            traces_dir(results)
            shutil.copyfile(src, dst)
    if os.path.isfile(dst):
        return (f"[{name}]({name}) (load it in chrome://tracing or Perfetto; `make bench` "
                "writes it, the repository does not keep it)")
    return f"`{path}`" + ("" if os.path.exists(src) else " (no longer there)")
