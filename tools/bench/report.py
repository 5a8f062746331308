"""The benchmark report: bench/results/summary.md and its plots, from the JSON
that the stages of tools/bench/run_bench.sh wrote.

    python3 tools/bench/report.py [--results bench/results] [--quick]
    python3 tools/bench/report.py --run-info [--results DIR] [--quick]   # run.json only

Reads (each optional; a missing file is reported as "not run"):
  collectives_{allreduce,broadcast,allgather}_{2,4}ranks.json   tnt-bench --json
  overhead.json, fusion_sweep_<model>.json                       fit_bench.py --json
  training.json                                                   train_compare.py
  sim_cluster.json                                                sim_cluster_bench.py
  sim_cluster_allreduce.json                                      sim_cluster_bench.py --allreduce
  sim_cluster_frameworks.json                                     sim_cluster_bench.py --frameworks
  pipeline_{bubble,memory,sim_cluster}.json                       pipeline_bench.py
  scale_validation.json, scale.json, scale_check.json             scale_bench.py (report_scale.py)
  scale_timelines.json, scale_projection.json                     project_scale.py (report_scale.py)
  logs/stages.tsv                                                 how every stage ended
  run.json                                                        commit, host, versions
Writes summary.md and collectives_<collective>.png, fusion_sweep.png,
training_throughput.png, sim_cluster_breakdown.png, sim_cluster_step_vs_bound.png,
sim_cluster_allreduce.png, scale_allreduce.png, scale_projection.png,
pipeline_bubble.png, pipeline_memory.png (a plot only when its data is there). File names never change from run to run.
"""
import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import report_scale
from bench_results import TRACES, traces_dir, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COLLECTIVES = [("allreduce", "MPI_Allreduce"), ("broadcast", "MPI_Bcast"),
               ("allgather", "MPI_Allgather")]
RANKS = [2, 4]
MIB = 1 << 20

# The targets (docs/performance.md).
ALLREDUCE_GEOMEAN_MIN = 1.0
ALLREDUCE_LARGE_MIN = 1.3
LARGE_BYTES = MIB
OVERHEAD_MAX = 0.03
MWMS_MIN = 1.3
HOROVOD_MIN = 1.0
SIM_BOUND_MAX = 1.15
SIM_MWMS_MIN = 2.0  # Tarantella / MWMS throughput on 2 simulated hosts
SIM_E2_MIN = 0.9  # weak scaling E(2), 2 simulated hosts at 10 Gbit/s
SIM_ALLREDUCE_MPI_MIN = 1.0   # tnt / MPI_Allreduce busbw across simulated hosts, every size
SIM_ALLREDUCE_LINK_MIN = 0.9  # share of the shaped link at >= SIM_ALLREDUCE_LINK_BYTES
SIM_ALLREDUCE_LINK_BYTES = 4 * MIB
PIPELINE_BUBBLE_MAX = 1.15   # step time / (K t_alone + (M - 1) t_busy) at M = 8, 2 stages
PIPELINE_BUBBLE_M = 8
PIPELINE_SIM_MIN = 1.5       # pipelined / data-parallel throughput, 2 hosts at 1 Gbit/s
DATA_ONE_RANK_MAX = 1.03     # epoch at 1 rank / plain Keras in one process
DATA_TWO_RANKS_MAX = 1.0     # epoch at 2 ranks / plain Keras in one process
DATA_CPU_MAX = {2: 0.55, 4: 0.3}  # input CPU per rank, shared / whole pipeline
# Not a target but the check behind the default fusion threshold: its step
# time is within this much of the best threshold's.
FUSION_DEFAULT_MAX = 1.03


# ------------------------------------------------------------------ inputs

def load_json(path):
    """(document, None), or (None, why) when missing or unreadable."""
    if not os.path.exists(path):
        return None, "no results"
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"unreadable {os.path.basename(path)}: {e}"


def load_stages(results):
    path = os.path.join(results, "logs", "stages.tsv")
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    # The order of the suite, whatever order a partial rerun appended them in.
    order = ["collectives", "overhead", "fusion", "training", "sim_cluster", "pipeline"]
    rank = lambda name: next((i for i, p in enumerate(order) if name.startswith(p)), len(order))  # noqa: E731
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


def missing_note(stages, why, *names):
    """Why a stage's JSON could not be used: how the stage ended, else why
    the file was unusable."""
    ended = stage_note(stages, *names)
    if ended != "not run":
        return ended
    return "not run" if why == "no results" else why


def open_section(results, stages, targets, fname, stage_names, title=None, goals=(), label="",
                 show_config=True):
    """What every section starts with: its title, then its results file
    `fname` with the file's configuration (unless not `show_config`).
    Returns (lines, doc).
    Without the file doc is None, the lines say why (after `label`) with
    the stages `stage_names`' record, and each (name, required) of `goals`
    is a target that did not run."""
    out = [title, ""] if title else []
    d, why = load_json(os.path.join(results, fname))
    if d is None:
        note = missing_note(stages, why, *stage_names)
        targets.extend(Target(name, req, note=note) for name, req in goals)
        return out + [label + not_run_line([note]), ""], None
    return out + (config_lines(d.get("config")) if show_config else []), d


# ---------------------------------------------------------------- formatting

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


def config_lines(cfg):
    """A stage's configuration: its short entries inline, all of it folded."""
    if not cfg:
        return []
    short = ", ".join(f"{k} {json.dumps(v)}" for k, v in sorted(cfg.items())
                      if len(json.dumps(v)) <= 40)
    return [f"Configuration: {short}.", "", "<details><summary>whole configuration</summary>",
            "", "```json", json.dumps(cfg, indent=1, sort_keys=True), "```", "", "</details>",
            ""]


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def image(name, results):
    return f"![{name}]({name})" if os.path.exists(os.path.join(results, name)) else \
        f"(plot {name} not drawn)"


# What would close a missed target, from the analysis of earlier runs (the
# per-target note gives this run's figures).
NEXT_STEPS = {
    "scale": "libtnt's choice across hosts reads the network (TNT_NETWORK_GBIT, "
             "TNT_NETWORK_LATENCY_US, set by scale_bench from each platform) and the "
             "reduction rate (TNT_REDUCE_GBPS, set by tnt-sim): a run without them chooses "
             "as on a 100 Gbit/s network with CPU reductions, and below 64 KiB loses at 10 and "
             "400 Gbit/s (0.76x and 0.70x), and runs the ring where free reductions make it "
             "the worse choice (docs/performance.md, \"At scale\").",
    "scale_validation": "2x2 and 4x1 run four busy-polling ranks on the measuring machine's "
                        "2 cores, and no host counts itself oversubscribed: below about 4 MiB "
                        "each ring step and shared-memory handoff waits for a scheduler "
                        "slice, which the simulation does not model (a high load before the "
                        "run, in the table, adds other work's). Next: measure on a machine "
                        "with a core per rank and for the kernel's TCP; the 10 Gbit/s rows "
                        "are CPU-bound here and only informational.",
    "allreduce": "where the ratio is low, compare Tarantella's bus bandwidth with the memcpy "
                 "column: on one host the shared-memory allreduce is memory bound, and with "
                 "more ranks than cores every synchronisation waits for a scheduler slice. Next: "
                 "non-temporal copies above the last-level cache, and larger slots (fewer "
                 "rounds) when a host is oversubscribed.",
    "overhead": "on one rank the wrapper adds no ops to the step, so a miss is within the "
                "trials' spread. Next: more trials on a quiet host; TNT_TIMELINE shows where a "
                "step's time goes.",
    "fusion": "on one host the sweep is flat within its noise. Next: sweep on the simulated "
              "cluster, where the number of buckets costs link latency.",
    "training": "the timelines show two costs: (a) little overlap where TensorFlow, with one "
                "inter-op thread, computes bias gradients last, and buckets go out in plan "
                "order, so the bucket that holds the largest kernel waits for them; (b) one "
                "synchronisation per step for exact global metrics. Next: order the buckets by "
                "the readiness measured in the first step (rank 0 broadcasts the order and "
                "every rank replans), an option to aggregate metrics per epoch only, and a "
                "measurement on a quiet host (Tarantella's CPU time per step is the lowest of "
                "the three frameworks).",
    "pipeline": "the bubble table separates the schedule's idle share (the GPipe bound) from "
                "what a step costs beyond it: per-step work outside the stages (the Keras step, "
                "the optimizer, the global loss: about 4 ms on the reference host) and, with "
                "more stages than cores, ranks waiting for a core. A spread of the per-fit "
                "ratios means other work on the host. TNT_TIMELINE shows each stage's "
                "forwards, backwards and transfers. Next: rerun on a quiet host.",
    "data": "a rank pays whole, whatever its share, the epoch's order, its keys and "
            "its 32 micro-batches, and its maps cost a row what the user's cost it, less "
            "tf.data's per-element cost (docs/datasets.md).",
    "sim_allreduce": "the TCP share column is the ceiling: what one TCP stream each way "
                     "carries on the same shaped link, measured in the run. At 1 Gbit/s the "
                     "ring carries what TCP carries and the overlapped hierarchical algorithm "
                     "0.87 to 0.93 of it (its host stages run on 4 ranks sharing 2 cores). At "
                     "10 Gbit/s TCP itself stays below 0.9 of the link (the kernel's work for "
                     "both simulated hosts on the same 2 cores), and libtnt and MPI_Allreduce "
                     "are both bound by the CPU it leaves, their ratio moving around 1 from run "
                     "to run. Next: measure on real hosts.",
    "sim": "the largest gradient's allreduce runs at the link rate (pipelined ring), but it "
           "starts after the forward pass and after small buckets ahead of it that wait for "
           "the other rank, which lags by a few ms (the simulated hosts share the machine's "
           "cores with the kernel's network processing); the reach column is what an exact "
           "step can do. With more ranks than cores (4 hosts, 2x2) every transfer also waits "
           "for a scheduler slice. E(2) compares one rank beside another with a 2-host step "
           "whose compute share is itself slower (the communication's CPU work has no core "
           "of its own). Against MWMS the link (1 Gbit/s) or the shared compute (ResNet, "
           "Transformer) caps the ratio. Next: measure on real hosts.",
}


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


# -------------------------------------------------------------- plotting

def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.rcParams.update({"figure.dpi": 100, "font.size": 9, "svg.hashsalt": "tnt"})
        return plt
    except ImportError:
        return None


def save(fig, results, name):
    # No software or date stamps: the same data gives the same file.
    fig.savefig(os.path.join(results, name), metadata={"Software": None})
    import matplotlib.pyplot as plt
    plt.close(fig)


def plot_collective(plt, results, coll, peer, docs):
    fig, axes = plt.subplots(1, len(RANKS), figsize=(11, 4), sharey=True, squeeze=False)
    for ax, ranks in zip(axes[0], RANKS):
        doc = docs.get(ranks)
        title = f"{ranks} ranks"
        if doc is None:
            ax.set_title(title)
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        if doc.get("oversubscribed"):
            title += f" (oversubscribed: {doc.get('max_ranks_per_host', ranks)} ranks on " \
                     f"{doc.get('cores_per_host', '?')} cores)"
        rows = doc["rows"]
        x = [r["bytes"] for r in rows]
        ax.plot(x, [r["tnt_busbw"] for r in rows], "o-", label="Tarantella (libtnt)")
        ax.plot(x, [r["mpi_busbw"] for r in rows], "s--", label=peer)
        ax.plot(x, [r["memcpy_gbps"] for r in rows], ":", color="grey",
                label="memcpy, 1 process (ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(x[::2])
        ax.set_xticklabels([size_str(v) for v in x[::2]], rotation=45, ha="right")
        ax.set_title(title)
        ax.set_xlabel("message size")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (GB/s)")
    for ax in axes[0]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")
            break
    fig.suptitle(f"{coll}: Tarantella vs {peer}")
    fig.tight_layout()
    save(fig, results, f"collectives_{coll}.png")


def plot_fusion(plt, results, sweeps, default_kb):
    # Thresholds span 0 to megabytes: evenly spaced categories read best.
    ks = sorted({r["threshold_kb"] for d in sweeps.values() for r in d["rows"]})
    pos = {k: i for i, k in enumerate(ks)}
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for model, doc in sweeps.items():
        rows = doc["rows"]
        best = min(r["ms_per_step"] for r in rows)
        ax.plot([pos[r["threshold_kb"]] for r in rows],
                [r["ms_per_step"] / best for r in rows],
                "o-", label=f"{model} (best {best:.1f} ms/step)")
    if default_kb in pos:
        ax.axvline(pos[default_kb], color="grey", ls=":", label=f"default {default_kb:g} KiB")
    ax.set_xticks(range(len(ks)))
    ax.set_xticklabels([f"{k:g}" for k in ks])
    ax.set_xlabel("fusion threshold (KiB; 0 = one bucket per tensor)")
    ax.set_ylabel("step time / best step time")
    ax.set_title(f"Fusion threshold sweep, {next(iter(sweeps.values()))['ranks']} ranks")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save(fig, results, "fusion_sweep.png")


FRAMEWORK_ORDER = ["tarantella", "mwms", "horovod"]


def plot_training(plt, results, doc):
    res = doc["results"]
    models = sorted({r["model"] for r in res})
    ranks = sorted({r["ranks"] for r in res})
    fws = [f for f in FRAMEWORK_ORDER if any(r["framework"] == f for r in res)]
    fws += sorted({r["framework"] for r in res} - set(fws))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    width = 0.8 / max(1, len(fws))
    for ax, model in zip(axes[0], models):
        for i, fw in enumerate(fws):
            ys = []
            for n in ranks:
                hit = [r for r in res if (r["model"], r["framework"], r["ranks"]) == (model, fw, n)]
                ys.append(hit[0]["samples_per_s"] if hit else 0.0)
            ax.bar([k + (i - (len(fws) - 1) / 2) * width for k in range(len(ranks))], ys,
                   width, label=fw)
        labels = []
        for n in ranks:
            over = any(r["oversubscribed"] for r in res if r["ranks"] == n)
            labels.append(str(n) + ("\n(oversubscribed)" if over else ""))
        ax.set_xticks(range(len(ranks)))
        ax.set_xticklabels(labels)
        ax.set_xlabel("ranks")
        ax.set_title(model)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (global)")
    axes[0][0].legend()
    fig.suptitle("Training throughput")
    fig.tight_layout()
    save(fig, results, "training_throughput.png")


def on_off(v):
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def layout_of(r):
    """A simulated-cluster row's layout: "2" (hosts of one rank), "2x2"."""
    per_host = r.get("ranks_per_host", 1)
    return str(r["hosts"]) if per_host == 1 else f"{r['hosts']}x{per_host}"


def hosts_text(r):
    per_host = r.get("ranks_per_host", 1)
    return f"{r['hosts']} hosts" + (f" x {per_host} ranks" if per_host > 1 else "")


def model_of(r):
    """The model of a simulated-cluster row (rows of older runs: LeNet-5)."""
    return r.get("model", "lenet5")


def overlap_of(r):
    """A simulated-cluster row's overlap: on, off or auto (rows of older
    runs: True or False)."""
    v = r.get("overlap")
    return {True: "on", False: "off"}.get(v, v)


def sim_defaults(rows):
    """The rows of the configuration users run: fusion on with the default
    overlap (auto; on in runs from before TNT_OVERLAP=auto)."""
    dflt = "auto" if any(overlap_of(r) == "auto" for r in rows) else "on"
    return [r for r in rows if r.get("fusion") and overlap_of(r) == dflt]


def sim_label(r):
    per_host = r.get("ranks_per_host", 1)
    return (f"{r['hosts']}x{per_host}\n{r['link'].split('_')[0]}\n{model_of(r)}")


def plot_sim(plt, results, doc):
    # The defaults; the table holds the other settings.
    res = sim_defaults(doc["results"])
    x = range(len(res))
    labels = [sim_label(r) for r in res]
    width = max(6.0, 0.6 * len(res))

    def finish(fig, ax, title, name):
        """The labels, legend and grid both bar charts share; saves it."""
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("ms per step")
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        save(fig, results, name)

    fig, ax = plt.subplots(figsize=(width, 4.5))
    compute = [r["compute_ms"] for r in res]
    wait = [r["wait_ms"] for r in res]
    rest = [max(0.0, r["step_ms"] - r["compute_ms"] - r["wait_ms"]) for r in res]
    ax.bar(x, compute, label="compute")
    ax.bar(x, wait, bottom=compute, label="waiting for communication (not overlapped)")
    ax.bar(x, rest, bottom=[c + w for c, w in zip(compute, wait)], label="other")
    ax.plot(x, [r["comm_ms"] for r in res], "k_", markersize=14, mew=2,
            label="communication time (overlapped or not)")
    finish(fig, ax, f"Simulated cluster: step time breakdown, fusion on, overlap "
           f"{overlap_of(res[0]) if res else 'auto'} (hosts x ranks per host, link, model)",
           "sim_cluster_breakdown.png")

    fig, ax = plt.subplots(figsize=(width, 4))
    ax.bar([k - 0.27 for k in x], [r["step_ms"] for r in res], 0.27, label="step time")
    ax.bar(list(x), [r.get("reach_ms") or 0 for r in res], 0.27,
           label="reach (largest gradient ready + its transfer)")
    ax.bar([k + 0.27 for k in x], [r["bound_ms"] for r in res], 0.27,
           label="bound (max of compute and transfer)")
    for k, r in zip(x, res):
        ax.annotate(f"{r['ratio_to_bound']:.2f}", (k - 0.27, r["step_ms"]), ha="center",
                    va="bottom", fontsize=7)
    finish(fig, ax, f"Simulated cluster: step time vs bound (label: step / bound; target <= "
           f"{SIM_BOUND_MAX} with the defaults)", "sim_cluster_step_vs_bound.png")


# ---------------------------------------------------------------- sections

def collectives_section(results, stages, plt, targets):
    out = ["## 1. Collectives against MPI", ""]
    out.append("`tnt-bench` (libtnt's own choice of algorithm) against the MPI collective, "
               "same process, alternating trials, median of 5, every result checked. "
               "Bus bandwidth in GB/s; ratio = Tarantella busbw / MPI busbw; memcpy = one "
               "process copying the same bytes (the ceiling of one host).")
    out.append("")
    for coll, peer in COLLECTIVES:
        docs, notes = {}, {}
        for n in RANKS:
            d, why = load_json(os.path.join(results, f"collectives_{coll}_{n}ranks.json"))
            if d is not None:
                docs[n] = d
            else:
                notes[n] = missing_note(stages, why, f"collectives_{coll}_{n}ranks",
                                        "collectives")
        out.append(f"### {coll} vs {peer}")
        out.append("")
        if coll == "allreduce":
            allreduce_targets(docs, notes, targets)
        if not docs:
            out += [not_run_line(notes.values()), ""]
            continue
        if plt is not None:
            plot_collective(plt, results, coll, peer, docs)
            out += [image(f"collectives_{coll}.png", results), ""]
        for n in RANKS:
            if n in notes:
                out.append(f"- {n} ranks: {notes[n]}")
                continue
            d = docs[n]
            over = " (oversubscribed: %s ranks on %s cores)" % (
                d.get("max_ranks_per_host", n), d.get("cores_per_host", "?")) \
                if d.get("oversubscribed") else ""
            bad = sum(1 for r in d["rows"] if not r["ok"])
            out.append(f"- {n} ranks{over}: ratio geomean **{d['geomean_ratio']:.2f}x**, "
                       f"min {d['min_ratio']:.2f}x; "
                       + ("every result checked ok" if bad == 0 else
                          f"**{bad} sizes gave wrong results**"))
        out.append("")
        sizes = sorted({r["bytes"] for d in docs.values() for r in d["rows"]})
        # tnt-bench names the algorithm of allreduce only ("auto" otherwise).
        named = any(r["algorithm"] != "auto" for d in docs.values() for r in d["rows"])
        header = ["size"]
        for n in RANKS:
            if n in docs:
                tag = f"{n}r" + ("*" if docs[n].get("oversubscribed") else "")
                header += ([f"{tag} algorithm"] if named else []) + [
                    f"{tag} tnt", f"{tag} MPI", f"{tag} ratio"]
        header += ["memcpy", "check"]
        rows = []
        for b in sizes:
            row, memcpy, ok = [size_str(b)], None, True
            for n in RANKS:
                if n not in docs:
                    continue
                hit = [r for r in docs[n]["rows"] if r["bytes"] == b]
                if not hit:
                    row += ["-"] * (4 if named else 3)
                    continue
                r = hit[0]
                row += ([r["algorithm"]] if named else []) + [
                    bw(r["tnt_busbw"]), bw(r["mpi_busbw"]), f"{r['ratio']:.2f}"]
                memcpy = memcpy if memcpy is not None else r["memcpy_gbps"]
                ok = ok and r["ok"]
            rows.append(row + [f2(memcpy, 1), "ok" if ok else "**FAILED**"])
        out.append(table(header, rows))
        if any(d.get("oversubscribed") for d in docs.values()):
            out.append("")
            out.append("\\* oversubscribed: more ranks than cores on the host.")
        out.append("")
    return out


def allreduce_targets(docs, notes, targets):
    for n in RANKS:
        d = docs.get(n)
        over = " (oversubscribed)" if d is not None and d.get("oversubscribed") else ""
        name = f"Allreduce vs MPI_Allreduce, geomean over sizes, {n} ranks{over}"
        if d is None:
            targets.append(Target(name, f">= {ALLREDUCE_GEOMEAN_MIN:.1f}x", note=notes.get(n)))
            continue
        g = d["geomean_ratio"]
        t = Target(name, f">= {ALLREDUCE_GEOMEAN_MIN:.1f}x", f"{g:.2f}x",
                   g >= ALLREDUCE_GEOMEAN_MIN, family="allreduce")
        if not t.ok:
            below = [r for r in d["rows"] if r["ratio"] < 1.0]
            worst = min(d["rows"], key=lambda r: r["ratio"])
            t.note = (f"{short_by(g, ALLREDUCE_GEOMEAN_MIN)}; {len(below)} of {len(d['rows'])} "
                      f"sizes below 1.0x, worst {worst['ratio']:.2f}x at "
                      f"{size_str(worst['bytes'])} ({worst['algorithm']})")
        targets.append(t)
    for n in RANKS:
        d = docs.get(n)
        over = " (oversubscribed)" if d is not None and d.get("oversubscribed") else ""
        name = f"Allreduce vs MPI_Allreduce, min over sizes >= 1 MiB, {n} ranks{over}"
        req = f">= {ALLREDUCE_LARGE_MIN:.1f}x"
        if d is None:
            targets.append(Target(name, req, note=notes.get(n)))
            continue
        large = [r for r in d["rows"] if r["bytes"] >= LARGE_BYTES]
        if not large:
            targets.append(Target(name, req, note="no size >= 1 MiB was run"))
            continue
        worst = min(large, key=lambda r: r["ratio"])
        t = Target(name, req, f"{worst['ratio']:.2f}x at {size_str(worst['bytes'])}",
                   worst["ratio"] >= ALLREDUCE_LARGE_MIN, family="allreduce")
        if not t.ok:
            t.note = (f"{short_by(worst['ratio'], ALLREDUCE_LARGE_MIN)}; at "
                      f"{size_str(worst['bytes'])} ({worst['algorithm']}) Tarantella "
                      f"{worst['tnt_busbw']:.2f} GB/s = "
                      f"{worst['tnt_busbw'] / worst['memcpy_gbps'] * 100:.0f}% of memcpy, "
                      f"MPI {worst['mpi_busbw']:.2f} GB/s")
            if d.get("oversubscribed"):
                t.note += "; ranks oversubscribed"
        targets.append(t)


def spread(values):
    """(min, max) relative to the median, in percent."""
    med = sorted(values)[len(values) // 2]
    return (min(values) / med - 1) * 100, (max(values) / med - 1) * 100


def overhead_section(results, stages, targets):
    out = ["## 2. Framework overhead, 1 rank", ""]
    for fname, model, label in (("overhead.json", "LeNet-5", ""),
                                ("overhead_small_cnn.json", "the small CNN (three "
                                 "convolutions, a 256-unit dense layer, 32x32x3 inputs)",
                                 " (small CNN)")):
        out += _overhead_model(results, stages, targets, fname, model, label)
    return out


def _overhead_model(results, stages, targets, fname, model, label):
    name = f"1-rank step time{label}, tnt.Model.fit vs plain Keras fit"
    req = f"<= +{OVERHEAD_MAX * 100:.0f}%"
    out, d = open_section(results, stages, targets, fname, ["overhead"], goals=[(name, req)],
                          label=f"{model}: ")
    if d is None:
        return out
    ratio = d["ratio_tnt_keras"]
    t = Target(name, req, f"{(ratio - 1) * 100:+.1f}%", ratio - 1 <= OVERHEAD_MAX,
               family="overhead")
    ms, tr = d["ms_per_step"], d["trials_ms"]
    if not t.ok:
        lo, hi = spread(tr["keras"])
        t.note = (f"{(ratio - 1 - OVERHEAD_MAX) * 100:.1f} points over: "
                  f"{ms['tnt']:.2f} vs {ms['keras']:.2f} ms/step "
                  f"(+{ms['tnt'] - ms['keras']:.2f} ms); Keras' own trials spread "
                  f"{lo:+.1f}%..{hi:+.1f}%")
    targets.append(t)
    out.append(f"{model[0].upper() + model[1:]}, batch {d['batch']}, {d['steps_per_epoch']} "
               f"steps per epoch, median of {d['trials']} interleaved trials. Tarantella never "
               "XLA-compiles the step, so the peer that isolates its overhead is Keras with "
               "`jit_compile=False`; Keras' default (`auto`) is shown too.")
    out.append("")
    labels = {"keras": "Keras fit, jit_compile=False", "keras_auto": "Keras fit, jit_compile=auto",
              "tnt": "tnt.Model.fit"}
    rows = []
    for key in ("keras", "keras_auto", "tnt"):
        lo, hi = spread(tr[key])
        rows.append([labels[key], f"{ms[key]:.2f}", f"{lo:+.1f}% .. {hi:+.1f}%",
                     f"{ms['tnt'] / ms[key]:.3f}"])
    out.append(table(["run", "ms/step (median)", "trial spread", "tnt / this"], rows))
    out.append("")
    return out


def fusion_section(results, stages, plt, targets):
    out = ["## 3. Fusion threshold sweep", ""]
    sweeps = {}
    for name in sorted(os.listdir(results)):
        if name.startswith("fusion_sweep_") and name.endswith(".json"):
            d, _ = load_json(os.path.join(results, name))
            if d is not None:
                sweeps[d["model"]] = d
    failed = sorted(s for s, st in stages.items()
                    if s.startswith("fusion_sweep_") and st["status"] != "ok")
    if not sweeps:
        note = stage_note(stages, *failed) if failed else "not run"
        targets.append(Target("Default fusion threshold vs best threshold (2 ranks)",
                              f"<= {FUSION_DEFAULT_MAX:.2f}x best", note=note))
        return out + [not_run_line([note]), ""]
    default_kb = next(iter(sweeps.values())).get("default_threshold_kb", 32)
    any_doc = next(iter(sweeps.values()))
    out.append(f"{any_doc['ranks']} ranks, global batch {any_doc['global_batch']}, "
               f"{any_doc['steps_per_epoch']} steps per epoch, median of {any_doc['trials']} "
               "interleaved trials per threshold; step time relative to the best threshold of the same "
               "model. A threshold of 0 gives one bucket per tensor.")
    out.append("")
    for model, d in sweeps.items():
        rows = d["rows"]
        best = min(rows, key=lambda r: r["ms_per_step"])
        dflt = [r for r in rows if r["threshold_kb"] == default_kb]
        name = f"Default fusion threshold ({default_kb:g} KiB) vs best, {model}, " \
               f"{d['ranks']} ranks"
        req = f"<= {FUSION_DEFAULT_MAX:.2f}x best"
        if not dflt:
            targets.append(Target(name, req, note="default threshold not in the sweep"))
            continue
        rel = dflt[0]["ms_per_step"] / best["ms_per_step"]
        t = Target(name, req, f"{rel:.3f}x", rel <= FUSION_DEFAULT_MAX, family="fusion")
        if not t.ok:
            lo, hi = spread(dflt[0]["trials_ms"])
            t.note = (f"{short_by(rel, FUSION_DEFAULT_MAX, False)}; best "
                      f"{best['threshold_kb']:g} KiB at {best['ms_per_step']:.2f} ms/step; "
                      f"the default's trials spread {lo:+.1f}%..{hi:+.1f}%")
        targets.append(t)
    if plt is not None:
        plot_fusion(plt, results, sweeps, default_kb)
        out += [image("fusion_sweep.png", results), ""]
    thresholds = sorted({r["threshold_kb"] for d in sweeps.values() for r in d["rows"]})
    header = ["model (tensors, gradient bytes)"] + [
        f"{k:g} KiB" + (" (default)" if k == default_kb else "") for k in thresholds]
    rows = []
    for model, d in sweeps.items():
        best = min(r["ms_per_step"] for r in d["rows"])
        by = {r["threshold_kb"]: r["ms_per_step"] for r in d["rows"]}
        cells = []
        for k in thresholds:
            if k not in by:
                cells.append("-")
                continue
            cell = f"{by[k]:.2f} ms ({by[k] / best:.3f}x)"
            cells.append(f"**{cell}**" if by[k] == best else cell)
        label = f"{model} ({d.get('tensors', '?')}, {bytes_str(d['gradient_bytes'])})" \
            if "gradient_bytes" in d else model
        rows.append([label] + cells)
    out.append(table(header, rows))
    for s in failed:
        out.append(f"\n- {s}: {stage_note(stages, s)}")
    out.append("")
    return out


def training_section(results, stages, plt, targets):
    out, d = open_section(
        results, stages, targets, "training.json", ["training"],
        "## 4. Training throughput against other frameworks",
        [("2-rank throughput vs MWMS, per model", f">= {MWMS_MIN:.1f}x"),
         ("2-rank throughput vs Horovod, per model (where it builds)", f">= {HOROVOD_MIN:.1f}x")])
    if d is None:
        return out
    res, errors = d.get("results", []), d.get("errors", {}) or {}
    models = sorted({r["model"] for r in res})

    def pick(model, fw, n):
        hit = [r for r in res if (r["model"], r["framework"], r["ranks"]) == (model, fw, n)]
        return hit[0] if hit else None

    ratio_rows = []
    for model in models or ["(no model)"]:
        tnt = pick(model, "tarantella", 2)
        for peer, need, label in (("mwms", MWMS_MIN, "MWMS"), ("horovod", HOROVOD_MIN, "Horovod")):
            name = f"2-rank throughput vs {label}, {model}"
            req = f">= {need:.1f}x"
            other = pick(model, peer, 2)
            if tnt is None or other is None:
                missing = "Tarantella" if tnt is None else label
                err = errors.get("tarantella" if tnt is None else peer)
                note = f"no 2-rank {missing} result" + (f": {err}" if err else "")
                ok = None
                targets.append(Target(name, req, "n/a" if peer == "horovod" and err else None,
                                      ok, note))
                ratio_rows.append([model, label, "-", f"no 2-rank {missing} result"])
                continue
            q = tnt["samples_per_s"] / other["samples_per_s"]
            t = Target(name, req, f"{q:.2f}x", q >= need, family="training")
            if not t.ok:
                t.note = (f"{short_by(q, need)}; {tnt['samples_per_s']:.0f} vs "
                          f"{other['samples_per_s']:.0f} samples/s, E(2) "
                          f"{f2(tnt.get('efficiency'))} vs {f2(other.get('efficiency'))}")
            targets.append(t)
            ratio_rows.append([model, label, f"{q:.2f}x", t.result])
    if plt is not None and res:
        plot_training(plt, results, d)
        out += [image("training_throughput.png", results), ""]
    out.append("Tarantella / other framework, samples/s at 2 ranks:")
    out.append("")
    out.append(table(["model", "against", "ratio", "result"], ratio_rows))
    out.append("")
    out.append("E(N) = X_N / (N X_1), X = samples/s (weak scaling; all ranks share this "
               "host's cores).")
    out.append("")
    rows = []
    order = {f: i for i, f in enumerate(FRAMEWORK_ORDER)}
    for r in sorted(res, key=lambda r: (r["model"], r["ranks"],
                                        order.get(r["framework"], 99), r["framework"])):
        rows.append([r["model"], r["framework"],
                     f"{r['ranks']}{' *' if r.get('oversubscribed') else ''}",
                     r.get("global_batch", "-"), f"{r['samples_per_s']:.1f}",
                     f2(r.get("step_ms")), f2(r.get("efficiency"))])
    out.append(table(["model", "framework", "ranks", "global batch", "samples/s", "ms/step",
                      "E(N)"], rows))
    if any(r.get("oversubscribed") for r in res):
        out += ["", "\\* oversubscribed: more ranks than cores."]
    if errors:
        out += ["", "Errors:", ""]
        out += [f"- {fw}: {msg}" for fw, msg in sorted(errors.items())]
    out.append("")
    return out


def sim_section(results, stages, plt, targets):
    name = "Simulated cluster with the defaults: step time / bound (worst link)"
    req = f"<= {SIM_BOUND_MAX:.2f}"
    out, d = open_section(results, stages, targets, "sim_cluster.json", ["sim_cluster"],
                          "## 5. Simulated cluster", [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    over = cfg.get("oversubscribed", {}) if isinstance(cfg.get("oversubscribed"), dict) else {}
    # The target is the configuration users run, the defaults; the other
    # configurations are in the table for comparison.
    lapped = sim_defaults(res)
    if not lapped:
        targets.append(Target(name, req, note="no run of the defaults"))
    models = list(dict.fromkeys(model_of(r) for r in res))
    layouts = sorted({layout_of(r) for r in lapped}, key=lambda k: (len(k), k))
    for layout, model in [(lay, m) for lay in layouts for m in models]:
        mine = [r for r in lapped if layout_of(r) == layout and model_of(r) == model]
        if not mine:
            continue
        worst = max(mine, key=lambda r: r["ratio_to_bound"])
        dflt = f"fusion on, overlap {overlap_of(worst)}"
        t = Target(f"Simulated cluster with the defaults, {model}, {hosts_text(worst)}"
                   + (" (oversubscribed)" if over.get(layout) else "")
                   + f": step time / bound ({dflt}), worst link",
                   req, f"{worst['ratio_to_bound']:.3f}", worst["ratio_to_bound"] <= SIM_BOUND_MAX,
                   family="sim")
        t.note = (f"{worst['link']}, fusion {on_off(worst['fusion'])}: "
                  f"{worst['step_ms']:.1f} vs {worst['bound_ms']:.1f} ms")
        if not t.ok:
            t.note = (f"{short_by(worst['ratio_to_bound'], SIM_BOUND_MAX, False)}; " + t.note +
                      f", of which {worst['wait_ms']:.1f} ms waiting for communication; "
                      f"communication {worst['comm_ms']:.1f} ms = "
                      f"{worst['comm_ms'] / worst['bound_ms']:.1f}x the bound, compute "
                      f"{worst['compute_ms']:.1f} ms")
        if worst.get("reach_ms"):
            t.note += (f"; {worst['ratio_to_reach']:.2f}x the reachable "
                       f"{worst['reach_ms']:.1f} ms (largest gradient ready at "
                       f"{worst['ready_ms']:.1f} ms, then its transfer)")
        targets.append(t)
        # The defaults against the fastest other setting.
        slower = []
        for r in mine:
            others = [o["step_ms"] for o in res if (layout_of(o), o["link"], model_of(o)) ==
                      (layout, r["link"], model) and o not in lapped]
            if others:
                slower.append((r["step_ms"] / min(others), r["link"]))
        if slower and not over.get(layout):
            q, link = max(slower)
            targets.append(Target(
                f"Simulated cluster, {model}, {hosts_text(worst)}: the defaults ({dflt}) / "
                "fastest of the other settings, worst link", "<= 1.00", f"{q:.3f}", q <= 1.0,
                note=link, family="sim"))
    for r in d.get("weak_scaling") or []:
        e2, judged = r.get("e2_busy"), "10gbit" in r["link"]
        t = Target(f"Weak scaling E(2), {model_of(r)}, 2 simulated hosts ({r['link']}): one rank "
                   "beside another / 2-host step",
                   f">= {SIM_E2_MIN:.2f}" if judged else "(for information)", f2(e2),
                   (e2 is not None and e2 >= SIM_E2_MIN) if judged else None,
                   family="sim" if judged else None)
        t.note = (f"2-host step {r['step_ms']:.1f} ms, one rank on the per-rank batch "
                  f"{f2(r.get('solo_busy_ms'))} ms beside another, {f2(r.get('solo_alone_ms'))} "
                  f"ms alone (E(2) {f2(r.get('e2_alone'))})")
        targets.append(t)
    if plt is not None and res:
        plot_sim(plt, results, d)
        out += [image("sim_cluster_breakdown.png", results), "",
                image("sim_cluster_step_vs_bound.png", results), ""]
    rows = [[f"{layout_of(r)}{' *' if over.get(layout_of(r)) else ''}", r["link"],
             model_of(r), on_off(r["fusion"]),
             overlap_of(r),
             f2(r["step_ms"]), f2(r["compute_ms"]), f2(r["comm_ms"]), f2(r["wait_ms"]),
             f2(r["bound_ms"]), f"{r['ratio_to_bound']:.3f}", f2(r.get("ready_ms")),
             f2(r.get("reach_ms")), f2(r.get("ratio_to_reach"), 3),
             bytes_str(r["gradient_bytes"]) if "gradient_bytes" in r else "-"] for r in res]
    out.append(table(["hosts", "link", "model", "fusion", "overlap", "step ms", "compute ms",
                      "comm ms", "wait ms", "bound ms", "step / bound", "largest ready ms",
                      "reach ms", "step / reach", "gradients"], rows))
    out += ["", "Bound: max(compute, the transfer of every gradient at the link rate). Reach: "
            "max(compute, when the largest gradient is ready on the last rank + its transfer): "
            "backprop gives a gradient only after the forward pass, so no exact step ends "
            "before that gradient has crossed the link; the bound assumes it could cross "
            "during the forward. Weak scaling E(2): one rank's step on the 2-host run's per-rank "
            "batch (while a second one-rank job computes beside it, as the simulated hosts "
            "share this machine's cores; alone in the note) over the 2-host step."]
    if any(over.values()):
        out += ["", "\\* oversubscribed: more ranks (on all simulated hosts) than cores."]
    tl = d.get("timeline_example")
    if tl:
        out += ["", f"Timeline example: {timeline_link(results, tl)}."]
    out.append("")
    return out


def plot_sim_allreduce(plt, results, res):
    layouts = sorted({(r["hosts"], r["ranks_per_host"]) for r in res})
    links = sorted({r["link"] for r in res}, key=lambda k: next(
        r["link_gbit"] for r in res if r["link"] == k))
    fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4), squeeze=False)
    for ax, link in zip(axes[0], links):
        gbit = next(r["link_gbit"] for r in res if r["link"] == link)
        for hosts, per_host in layouts:
            mine = sorted((r for r in res if r["link"] == link and r["hosts"] == hosts
                           and r["ranks_per_host"] == per_host), key=lambda r: r["bytes"])
            if not mine:
                continue
            # What crosses the link: 2(H-1)/H of the vector per host, in Gbit/s.
            f = 2 * (hosts - 1) / hosts * 8
            x = [r["bytes"] for r in mine]
            line, = ax.plot(x, [r["tnt_algbw"] * f for r in mine], "o-",
                            label=f"Tarantella {hosts}x{per_host}")
            ax.plot(x, [r["mpi_algbw"] * f for r in mine], "s--", color=line.get_color(),
                    alpha=0.6, label=f"MPI_Allreduce {hosts}x{per_host}")
        ax.axhline(gbit, color="k", lw=1, label=f"link rate ({gbit:g} Gbit/s)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message bytes")
        ax.set_ylabel("link bandwidth used, Gbit/s")
        ax.set_title(f"allreduce across 2 simulated hosts, {link}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, results, "sim_cluster_allreduce.png")


def sim_frameworks_section(results, stages, targets):
    """Tarantella against MultiWorkerMirroredStrategy on the simulated hosts
    (sim_cluster_bench.py --frameworks)."""
    name = "Throughput vs MWMS, 2 simulated hosts"
    req = f">= {SIM_MWMS_MIN:.1f}x"
    out, d = open_section(results, stages, targets, "sim_cluster_frameworks.json",
                          ["sim_cluster_frameworks"],
                          "## 5c. Against MultiWorkerMirroredStrategy on simulated hosts",
                          [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    for r in res:
        t = Target(f"{name}, {r['model']}, {r['link']}", req,
                   f"{r['ratio']:.2f}x" if r.get("ratio") else None,
                   r["ratio"] >= SIM_MWMS_MIN if r.get("ratio") else None, family="sim")
        if r.get("ratio") is None:
            t.note = "no result of one framework (see the problems below)"
        else:
            t.note = (f"{r['tarantella_step_ms']:.1f} vs {r['mwms_step_ms']:.1f} ms per step")
        targets.append(t)
    rows = [[r["link"], r["model"], f2(r.get("tarantella_step_ms")), f2(r.get("mwms_step_ms")),
             f2(r.get("ratio"))] for r in res]
    out.append(f"2 hosts x 1 rank, global batch {cfg.get('global_batch')}, the models and "
               "the worker of train_compare.py; MWMS: " + str(cfg.get("mwms")) + ".")
    out.append("")
    out.append(table(["link", "model", "Tarantella ms", "MWMS ms", "throughput ratio"], rows))
    out += problem_lines(cfg)
    out.append("")
    return out


def sim_allreduce_section(results, stages, plt, targets):
    names = [("Allreduce across simulated hosts: busbw / MPI_Allreduce, every size",
              f">= {SIM_ALLREDUCE_MPI_MIN:.1f}"),
             (f"Allreduce across simulated hosts: share of the link at >= "
              f"{bytes_str(SIM_ALLREDUCE_LINK_BYTES)}", f">= {SIM_ALLREDUCE_LINK_MIN:.2f}")]
    out, d = open_section(results, stages, targets, "sim_cluster_allreduce.json",
                          ["sim_cluster_allreduce"], "## 5b. Allreduce across simulated hosts",
                          names)
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    groups = sorted({(r["hosts"], r["ranks_per_host"], r["link_gbit"], r["link"]) for r in res})
    for hosts, per_host, _, link in groups:
        mine = [r for r in res if (r["hosts"], r["ranks_per_host"], r["link"]) ==
                (hosts, per_host, link)]
        label = f"{hosts}x{per_host}, {link}"
        worst = min(mine, key=lambda r: r["ratio"])
        t = Target(f"{names[0][0]} ({label})", names[0][1], f"{worst['ratio']:.2f}",
                   worst["ratio"] >= SIM_ALLREDUCE_MPI_MIN, family="sim_allreduce")
        t.note = f"lowest at {bytes_str(worst['bytes'])} ({worst['algorithm']})"
        targets.append(t)
        large = [r for r in mine if r["bytes"] >= SIM_ALLREDUCE_LINK_BYTES]
        if not large:
            targets.append(Target(f"{names[1][0]} ({label})", names[1][1],
                                  note="no size that large"))
            continue
        low = min(large, key=lambda r: r["link_share"])
        t = Target(f"{names[1][0]} ({label})", names[1][1], f"{low['link_share']:.2f}",
                   low["link_share"] >= SIM_ALLREDUCE_LINK_MIN, family="sim_allreduce")
        t.note = f"lowest at {bytes_str(low['bytes'])}"
        if low.get("tcp_share") is not None:
            t.note += (f"; {low['tcp_share']:.2f} of what TCP alone carries there "
                       f"({cfg['tcp_gbit'][f'{hosts}x{per_host}_{link}']:g} Gbit/s)")
        targets.append(t)
    if plt is not None and res:
        plot_sim_allreduce(plt, results, res)
        out += [image("sim_cluster_allreduce.png", results), ""]
    out.append("`tnt-bench allreduce` (float32 sum, libtnt's choice of algorithm) and "
               "MPI_Allreduce in the same run, on simulated hosts (network namespaces, links "
               "shaped with tc). busbw = algbw * 2(n-1)/n over n ranks; link share = algbw * "
               "2(H-1)/H over H hosts / link rate: what each host must send, per second, of "
               "what its link carries; TCP share = the same over what one TCP stream each "
               "way carries on that link (measured in the same run).")
    out.append("")
    rows = [[f"{r['hosts']}x{r['ranks_per_host']}", r["link"], bytes_str(r["bytes"]),
             r["algorithm"], f"{r['tnt_busbw']:.3f}", f"{r['mpi_busbw']:.3f}",
             f"{r['ratio']:.2f}", f"{r['link_share']:.2f}", f2(r.get("tcp_share"))]
            for r in res]
    out.append(table(["layout", "link", "bytes", "algorithm", "tnt busbw GB/s",
                      "MPI busbw GB/s", "tnt / MPI", "link share", "TCP share"], rows))
    out += problem_lines(cfg)
    out.append("")
    return out


def save_against_m(fig, ax, results, ms, ylabel, title, name):
    """Finishes and saves a pipeline plot whose x axis is the micro-batches
    per step `ms`."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms)
    ax.set_xticklabels([str(m) for m in ms])
    ax.set_xlabel("micro-batches per step (M)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, results, name)


def plot_pipeline_bubble(plt, results, res):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k in sorted({r["stages"] for r in res}):
        mine = sorted((r for r in res if r["stages"] == k), key=lambda r: r["micro_batches"])
        over = " (oversubscribed)" if any(r.get("oversubscribed") for r in mine) else ""
        ms = [r["micro_batches"] for r in mine]
        line, = ax.plot(ms, [r["step_ms"] / (r["micro_batches"] * r["t_stage_ms"]) for r in mine],
                        "o-", label=f"K={k}{over}: step / (M t_stage)")
        ax.plot(ms, [1 / (1 - r["gpipe_bound"]) for r in mine], ":", color=line.get_color(),
                label=f"K={k}: ideal, (M+K-1) / M")
    save_against_m(fig, ax, results, sorted({r["micro_batches"] for r in res}),
                   "step time / useful work of one stage", "Pipeline bubble", "pipeline_bubble.png")


def plot_pipeline_memory(plt, results, res):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for schedule, style in (("gpipe", "s-"), ("1f1b", "o-"), ("interleaved", "^--")):
        for stage in sorted({r["stage"] for r in res}):
            mine = sorted((r for r in res if (r["schedule"], r["stage"]) == (schedule, stage)),
                          key=lambda r: r["micro_batches"])
            if mine:
                ax.plot([r["micro_batches"] for r in mine],
                        [_step_memory(r) for r in mine], style,
                        label=f"{schedule}, {_memory_holder(schedule, stage)}")
    split = all(r.get("step_above_traced_mib") is not None for r in res)
    save_against_m(fig, ax, results, sorted({r["micro_batches"] for r in res}),
                   "a step's peak RSS above the traced step's (MiB)" if split else
                   "peak RSS above the RSS before fit (MiB)",
                   "Pipeline memory per stage: GPipe, 1F1B, interleaved", "pipeline_memory.png")


def plot_pipeline_timeline(plt, results):
    """pipeline_timeline.png: the last training step of the 2-stage 1F1B
    timeline (traces/pipeline_timeline.rank<R>.json), one row per stage.
    Returns whether it drew one."""
    spans = {}
    for rank in (0, 1):
        path = os.path.join(results, TRACES, f"pipeline_timeline.rank{rank}.json")
        d, _ = load_json(path)
        if not d:
            return False
        spans[rank] = sorted((e for e in d if e.get("cat") == "pipeline" and e.get("ph") == "X"),
                             key=lambda e: e["ts"])
    starts = [e["ts"] for e in spans[0] if e["name"] == "forward 0"]
    if not starts:
        return False
    begin = starts[-1]
    ends = [e["ts"] + e["dur"] for r in spans for e in spans[r]
            if e["ts"] >= begin and e["name"].startswith("backward")]
    if not ends:
        return False
    end = max(ends)
    colors = {"forward": "tab:blue", "backward": "tab:orange", "recv": "lightgray"}
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for rank, events in spans.items():
        for e in events:
            if e["ts"] < begin - 1e3 or e["ts"] > end:
                continue
            kind = e["name"].split()[0]
            x0 = (e["ts"] - begin) / 1e3
            ax.broken_barh([(x0, max(e["dur"] / 1e3, 0.01))], (1 - rank - 0.4, 0.8),
                           color=colors.get(kind, "gray"))
            if kind in ("forward", "backward"):
                ax.text(x0 + e["dur"] / 2e3, 1 - rank, ("F" if kind == "forward" else "B")
                        + e["name"].split()[-1], ha="center", va="center", fontsize=7)
    ax.set_yticks([1, 0], ["stage 0", "stage 1"])
    ax.set_xlabel("ms since the step's first forward")
    ax.set_title("One training step, 2 stages, 4 micro-batches, 1F1B "
                 "(blue forward, orange backward, gray waiting to receive)", fontsize=9)
    fig.tight_layout()
    save(fig, results, "pipeline_timeline.png")
    return True


def pipeline_section(results, stages, plt, targets):
    out = ["## 6. Pipeline parallelism", ""]
    out += _pipeline_bubble(results, stages, plt, targets)
    out += _pipeline_memory(results, stages, plt, targets)
    out += _pipeline_capacity(results, stages, targets)
    out += _pipeline_sim(results, stages, targets)
    return out


def problem_lines(cfg):
    """A line for each failed run a benchmark's config records, with the
    last line of its output."""
    out = []
    for key, problem in sorted((cfg.get("problems") or {}).items()):
        last = problem.strip().splitlines()[-1] if problem.strip() else "?"
        out.append(f"\n- {key}: failed ({last})")
    return out


def _pipeline_bubble(results, stages, plt, targets):
    m = PIPELINE_BUBBLE_M
    name = f"Pipeline step time / ideal K t_alone + (M-1) t_busy, 2 stages, M = {m}"
    req = f"<= {PIPELINE_BUBBLE_MAX:.2f}x"
    out, d = open_section(results, stages, targets, "pipeline_bubble.json",
                          ["pipeline_bubble", "pipeline"], "### Bubble", [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    for k in (2, 3):
        hit = [r for r in res if r["stages"] == k and r["micro_batches"] == m]
        over = any(r.get("oversubscribed") for r in res if r["stages"] == k)
        label = name.replace("2 stages", f"{k} stages" + (" (oversubscribed)" if over else ""))
        if not hit:
            problem = (cfg.get("problems") or {}).get(f"{k} stages")
            note = "no result" + (f": {problem.strip().splitlines()[-1]}" if problem else "")
            if k == 2:
                targets.append(Target(label, req, note=note))
            continue
        r = hit[0]
        detail = (f"{r['step_ms']:.1f} vs {r['ideal_ms']:.1f} ms (t_busy "
                  f"{f2(r.get('t_stage_busy_ms'))} ms, t_alone {r['t_stage_ms']:.2f} ms); "
                  f"GPipe bound {r['gpipe_bound']:.3f}, idle share measured "
                  f"{r['measured_idle_share']:.3f}")
        if r.get("ratio_to_alone_ideal") is not None:
            detail += f"; against (M+K-1) t_alone {r['ratio_to_alone_ideal']:.3f}x"
        if k == 2 and not over:
            t = Target(label, req, f"{r['ratio_to_ideal']:.3f}x",
                       r["ratio_to_ideal"] <= PIPELINE_BUBBLE_MAX, family="pipeline")
            t.note = (short_by(r["ratio_to_ideal"], PIPELINE_BUBBLE_MAX, False) + "; "
                      if not t.ok else "") + detail
        else:
            # With more ranks than cores the stages share cores: shown, not judged.
            t = Target(label, "(for information)", f"{r['ratio_to_ideal']:.3f}x",
                       note=detail + ("; more stages than cores" if over else ""))
        targets.append(t)
    out.append(f"Stages of equal cost ({cfg.get('layers_per_stage', '?')} dense layers of "
               f"{cfg.get('width', '?')} units each), micro-batches of "
               f"{cfg.get('micro_batch', '?')} samples (the global batch grows with M), "
               f"schedule {cfg.get('schedule', '?')}, one intra-op thread per rank. t_alone: "
               "one stage's forward + backward on one micro-batch, timed on rank 0 while the "
               "other ranks sleep; t_busy: the same while every rank computes one at once; "
               "both just before each fit. Ideal = K t_alone + (M-1) t_busy, the classic "
               "(M+K-1) t_stage with each slot at the speed it can have: the first "
               "micro-batch passes the K stages one after the other, and each further one "
               "adds a slot in which every stage computes (stages computing at once share the "
               "host's caches and memory, hence t_busy). The GPipe bound "
               "(K-1)/(M+K-1) is the idle share of an ideal step; measured idle share = "
               "1 - M t_busy / step.")
    out.append("")
    if plt is not None and res:
        plot_pipeline_bubble(plt, results, res)
        out += [image("pipeline_bubble.png", results), ""]
    # Drawn from the traces of this run; without them (they are not kept
    # in the repository), the picture the run drew.
    drawn = plt is not None and plot_pipeline_timeline(plt, results)
    if drawn or os.path.exists(os.path.join(results, "pipeline_timeline.png")):
        out += ["The timeline of one step (2 stages, 4 micro-batches, 1F1B; from "
                f"`{TRACES}/pipeline_timeline.rank<R>.json`, written with TNT_TIMELINE):", "",
                image("pipeline_timeline.png", results), ""]
    rows = [[f"{r['stages']}{' *' if r.get('oversubscribed') else ''}", r["micro_batches"],
             f2(r["step_ms"]), f2(r["t_stage_ms"]), f2(r.get("t_stage_busy_ms")),
             f2(r["ideal_ms"]), f"{r['ratio_to_ideal']:.3f}",
             " ".join(f"{q:.2f}" for q in r.get("fit_ratios", [])) or "-",
             f2(r.get("ratio_of_minima"), 3), f2(r.get("ratio_to_alone_ideal"), 3),
             f2(r.get("ratio_to_busy_ideal"), 3), f"{r['gpipe_bound']:.3f}",
             f"{r['measured_idle_share']:.3f}"] for r in res]
    out.append(table(["stages K", "M", "step ms", "t_alone ms", "t_busy ms", "ideal ms",
                      "step / ideal", "per fit", "fastest step / fastest",
                      "step / (M+K-1) t_alone", "step / (M+K-1) t_busy", "GPipe bound",
                      "idle share measured"], rows))
    out += ["", "Per fit: each fit's median step against the ideal of the stage times taken "
            "just before it; a wide spread means other work on the host. Fastest step / "
            "fastest: the fastest step against the ideal of the fastest stage times, less "
            "sensitive to that work. (M+K-1) t_alone is the ideal of stages that would not "
            "slow each other down; (M+K-1) t_busy counts the fill and drain at the slower "
            "speed too."]
    if any(r.get("oversubscribed") for r in res):
        out += ["", "\\* oversubscribed: more stages (one rank each) than cores."]
    inter = d.get("interleaved", [])
    if inter:
        out += ["", "Interleaved 1F1B (`TNT_PIPELINE_SCHEDULE=interleaved`): K ranks of v "
                "chunks each (stages of 1/v the layers, so a rank computes as much per "
                "micro-batch as a stage above); t_alone and t_busy are a rank's share of a "
                "micro-batch; ideal = (K t_alone + (v M - 1) t_busy) / v, bound "
                "(K-1)/(v M+K-1).", ""]
        out.append(table(
            ["ranks K", "chunks v", "M", "step ms", "t_alone ms", "t_busy ms", "ideal ms",
             "step / ideal", "interleaved bound", "idle share measured"],
            [[r["ranks"], r["chunks"], r["micro_batches"], f2(r["step_ms"]),
              f2(r["t_stage_ms"]), f2(r.get("t_stage_busy_ms")), f2(r["ideal_ms"]),
              f"{r['ratio_to_ideal']:.3f}", f"{r['interleaved_bound']:.3f}",
              f"{r['measured_idle_share']:.3f}"] for r in inter]))
    out += problem_lines(cfg)
    out.append("")
    return out


def _growth(low, high):
    return "not run" if low is None or high is None else f"{high - low:+.0f} MiB"


def _memory_holder(schedule, rank):
    """Which stages rank `rank` of the memory stage's 2 ranks holds."""
    return (f"rank {rank}: stages {rank}, {rank + 2}" if schedule == "interleaved"
            else f"rank {rank}: stage {rank}")


def _step_memory(row):
    """What a training step holds above the traced step (results that
    split the two), else its peak above the RSS before fit."""
    held = row.get("step_above_traced_mib")
    return row["peak_above_base_mib"] if held is None else held


def _pipeline_memory(results, stages, plt, targets):
    name = ("Pipeline memory of a step against M, 2 stages: 1F1B flat, GPipe growing "
            "(stage 0)")
    req = "1F1B grows < 1 micro-batch, GPipe > 3, from M = 2 to 8"
    out, d = open_section(results, stages, targets, "pipeline_memory.json",
                          ["pipeline_memory", "pipeline"], "### Memory per stage: GPipe, 1F1B, interleaved",
                          [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    per_mb = cfg.get("kept_activations_mib_per_micro_batch")
    split = all(r.get("step_above_traced_mib") is not None for r in res)
    what = ("peak of the training steps above the RSS after the warm-up step"
            if split else "peak above base")

    def row(schedule, m, stage=0):
        hit = [r for r in res if (r["schedule"], r["micro_batches"], r["stage"]) ==
               (schedule, m, stage)]
        return hit[0] if hit else None

    def peak(schedule, m, stage=0):
        r = row(schedule, m, stage)
        return _step_memory(r) if r else None

    grow = {s: (peak(s, 8), peak(s, 2)) for s in ("1f1b", "gpipe")}
    if per_mb and all(a is not None and b is not None for a, b in grow.values()):
        g1, gg = (grow["1f1b"][0] - grow["1f1b"][1]) / per_mb, \
            (grow["gpipe"][0] - grow["gpipe"][1]) / per_mb
        t = Target(name, req, f"1F1B {g1:+.1f}, GPipe {gg:+.1f} micro-batches",
                   g1 < 1 and gg > 3, family="pipeline")
        t.note = (f"stage 0, {what}, M = 2 -> 8: 1F1B {grow['1f1b'][1]:.0f} -> "
                  f"{grow['1f1b'][0]:.0f} MiB, GPipe {grow['gpipe'][1]:.0f} -> "
                  f"{grow['gpipe'][0]:.0f} MiB; one micro-batch keeps about {per_mb:.0f} MiB")
        targets.append(t)
    else:
        targets.append(Target(name, req, note="no results for M = 2 and 8 of both schedules"))
    name = ("Interleaved 1F1B memory of a step against M, 2 ranks of 2 chunks: flat once every "
            "chunk is busy (rank 0)")
    req = "grows < 1 chunk micro-batch from M = 4 to 8"
    per_chunk = cfg.get("interleaved_kept_mib_per_chunk_micro_batch")
    low, high = peak("interleaved", 4), peak("interleaved", 8)
    if per_chunk and low is not None and high is not None:
        g = (high - low) / per_chunk
        # Rank 0 of R = 2 ranks holds at most 2 (R - 1) + (v - 1) R + 1 = 5
        # chunk micro-batches (docs/pipelining.md), whatever M.
        targets.append(Target(name, req, f"{g:+.1f} chunk micro-batches", g < 1,
                              family="pipeline",
                              note=f"rank 0, {what}, M = 4 -> 8: {low:.0f} -> "
                                   f"{high:.0f} MiB, a chunk micro-batch {per_chunk:.0f} MiB; "
                                   "the schedule holds at most 5 chunk micro-batches at both "
                                   "M; 1F1B's stage 0 over the same M: "
                                   f"{_growth(peak('1f1b', 4), peak('1f1b', 8))}"))
    else:
        targets.append(Target(name, req, note="no interleaved results for M = 4 and 8"))
    if split:
        traced = {s: [row(s, m) for m in (4, 8)] for s in ("1f1b", "interleaved")}
        if all(all(traced[s]) for s in traced):
            def grew(s):
                a, b = traced[s]
                return b["traced_step_mib"] - a["traced_step_mib"]
            targets.append(Target(
                "Traced step's memory against M (the schedule unrolled), rank 0",
                "(for information)", f"{grew('interleaved'):+.1f} MiB",
                None, family="pipeline",
                note=f"the RSS after the warm-up step above the RSS before fit, M = 4 -> 8: "
                     f"interleaved {traced['interleaved'][0]['traced_step_mib']:.0f} -> "
                     f"{traced['interleaved'][1]['traced_step_mib']:.0f} MiB, 1F1B "
                     f"{traced['1f1b'][0]['traced_step_mib']:.0f} -> "
                     f"{traced['1f1b'][1]['traced_step_mib']:.0f} MiB: the traced step's "
                     "passes are unrolled, its graph grows with M"))
    out.append("Two stages, one rank each; a model with large activations (a "
               f"{' x '.join(str(v) for v in cfg.get('activation_shape_per_sample', []))} "
               f"float32 tensor per sample) and {cfg.get('weights_bytes', '?')} bytes of "
               f"weights; micro-batches of {cfg.get('micro_batch', '?')} samples (the global "
               "batch grows with M). Peak RSS (VmHWM) of each rank during the training steps, "
               "a fresh job per schedule and M; above base = peak - RSS before the first fit"
               + ("; of which the traced step keeps the RSS after a warm-up step above the "
                  "RSS before fit (its graph, unrolled, grows with M), and a step holds its "
                  "peak above that (its activations: what the targets judge). " if split
                  else ". ") +
               f"A stage keeps about {per_mb} MiB of activations per micro-batch in flight: "
               "GPipe holds all M, 1F1B at most K - s (2 on stage 0, 1 on stage 1). "
               f"Interleaved: {cfg.get('interleaved', 'not run')}; a chunk keeps about "
               f"{cfg.get('interleaved_kept_mib_per_chunk_micro_batch', '?')} MiB per "
               "micro-batch, and rank r holds at most 2 (R - 1 - r) + (v - 1) R + 1 chunk "
               "micro-batches (5 on rank 0, 3 on rank 1).")
    out.append("")
    if plt is not None and res:
        plot_pipeline_memory(plt, results, res)
        out += [image("pipeline_memory.png", results), ""]
    ms = sorted({r["micro_batches"] for r in res})
    header = ["schedule", "rank: stages"] + [f"M = {m}" for m in ms]
    rows = []
    for schedule in ("gpipe", "1f1b", "interleaved"):
        for stage in sorted({r["stage"] for r in res}):
            cells = []
            for m in ms:
                hit = [r for r in res if (r["schedule"], r["micro_batches"], r["stage"]) ==
                       (schedule, m, stage)]
                cells.append((f"{hit[0]['peak_rss_mib']:.0f} (+{hit[0]['peak_above_base_mib']:.0f}"
                              + (f"; traced step {hit[0]['traced_step_mib']:.0f}, step "
                                 f"+{hit[0]['step_above_traced_mib']:.0f})" if split else ")"))
                             if hit else "-")
            rows.append([schedule, _memory_holder(schedule, stage)] + cells)
    out.append("Peak RSS in MiB (above the RSS before fit" +
               ("; of which the traced step, and the step's peak above it" if split else "")
               + "):")
    out.append("")
    out.append(table(header, rows))
    out += problem_lines(cfg)
    out.append("")
    return out


MEMORY_ERRORS = ("ResourceExhausted", "OOM", "MemoryError", "bad_alloc")


def _memory_failure(run):
    """(failed for lack of memory, its error) of a capacity run."""
    error = " ".join(d.get("error", "") for d in run.get("ranks", []))
    return (not run.get("trained", True) and any(word in error for word in MEMORY_ERRORS),
            error)


def capacity_verdict(res, budget):
    """(met, detail) of the capacity target from pipeline_capacity.json's
    results: met when, under a limit below the whole model's weights, serial
    Keras and the stages given the model built fail for lack of memory,
    every run of stages given the function that builds it trains, and their
    weights end equal to those of the model trained built whole without a
    limit."""
    said, met = [], True
    for key in ("serial, limited", next((k for k in res if "built whole, limited" in k), None)):
        run = res.get(key) or {}
        oom, error = _memory_failure(run)
        what = key.split(",")[0] if key == "serial, limited" else "built whole"
        if run.get("trained", True):
            said.append(f"{what} trains")
        elif oom:
            said.append(f"{what} fails ({error[:50]})")
        else:
            said.append(f"{what} fails, but not for lack of memory: "
                        + (error[:50] or "its job failed without a result"))
        met = met and oom
    by_fn = [(k, r) for k, r in res.items() if "build_fn" in k and k.endswith("limited")
             and isinstance(r, dict)]
    for key, run in by_fn:
        name = key.split(", ", 1)[1].rsplit(", ", 1)[0]
        if run.get("trained"):
            margins = ", ".join(f"{d['margin_mib']:+.0f}" for d in run["ranks"]
                                if d.get("margin_mib") is not None)
            said.append(f"{name} trains (margins {margins or 'not measured'} MiB)")
        else:
            errors = "; ".join(d["error"] for d in run.get("ranks", []) if d.get("error"))
            said.append(f"{name} fails" + (f" ({errors[:50]})" if errors else "")
                        + (f", as it may: {run['may_exceed']}" if run.get("may_exceed") else ""))
            met = met and bool(run.get("may_exceed"))
    equal = res.get("bitwise equal") is True
    said.append("weights equal the unlimited run's" if equal
                else "weights differ from the unlimited run's")
    met = met and bool(by_fn) and equal
    return met, f"limit: the base + {budget}x the whole model's weights; " + "; ".join(said)


CAPACITY_TABLE_TARGET = ("Peak per rank on K stages, against the whole model's need / K "
                         "(SGD, Adam; K = 1, 2, 4)")


def _pipeline_capacity(results, stages, targets):
    name = "Under a memory limit below the model's weights, only stages built by a function train"
    out, d = open_section(results, stages, targets, "pipeline_capacity.json",
                          ["pipeline_capacity", "pipeline"],
                          "### Capacity: a model whose weights do not fit one process",
                          [(name, "yes"), (CAPACITY_TABLE_TARGET, "<= 1.3x")])
    if d is None:
        return out
    cfg, res = d.get("config", {}), d.get("results", {})
    t = Target(name, "yes", family="pipeline")
    t.ok, t.note = capacity_verdict(res, cfg.get("budget_times_weights", "?"))
    t.measured = "yes" if t.ok else "no"
    targets.append(t)
    out.append(f"{cfg.get('layers', '?')} dense layers of {cfg.get('width', '?')} units, "
               f"{cfg.get('stages', '?')} stages. The limit (RLIMIT_DATA) allows each process "
               f"what it holds before the model is built plus "
               f"{cfg.get('budget_times_weights', '?')}x the whole model's weights. A stage "
               "given the function that builds the model holds its own weights only. The "
               "margin is the limit less the peak data size above the base.")
    out.append("")
    rows = []
    for key, r in res.items():
        if not isinstance(r, dict):
            continue
        for doc in r.get("ranks") or [{}]:
            rows.append([key, doc.get("rank", "-"), "yes" if doc.get("trained") else "no",
                         doc.get("held_weights_mib", "-"),
                         doc.get("peak_data_above_base_mib", "-"), doc.get("margin_mib", "-"),
                         (doc.get("error") or ("" if r.get("job_ok") else "the job failed"))[:80]])
    out.append(table(["run", "rank", "trained", "weights held (MiB)",
                      "peak data above base (MiB)", "margin (MiB)", "error"], rows))
    out.append("")
    memory = res.get("memory table")
    if memory:
        limit = cfg.get("table_max_ratio", 1.3)
        t = Target(CAPACITY_TABLE_TARGET, f"<= {limit}x", family="pipeline")
        # The target is the stages' for models that do not fit a rank:
        # with their weight gradients recomputed (serial: one stage).
        judged = [row for row in memory
                  if row["stages"] == 1 or row.get("weight_gradients") == "recompute"]
        ratios = [row["ratio"] for row in judged]
        if judged and None not in ratios:
            t.measured = f"{max(ratios):.2f}x"
            t.ok = all(row["met"] for row in judged)
            worst = max(judged, key=lambda row: row["ratio"])
            summed = [row["ratio"] for row in memory if row["stages"] > 1
                      and row.get("weight_gradients") != "recompute" and row["ratio"]]
            t.note = (f"largest: {worst['optimizer']} on {worst['stages']} stage(s), weight "
                      "gradients recomputed (TNT_PIPELINE_WEIGHT_GRADIENTS=recompute)"
                      + (f"; summed over the micro-batches (the default) up to "
                         f"{max(summed):.2f}x" if summed else ""))
        else:
            t.note = "a run of the table has no peak"
        targets.append(t)
        out.append("Peak data size above the base per rank (the largest rank) without a "
                   "limit, against the whole model's need divided by K (weights and "
                   "gradients, 2 W, with SGD; and the two moments, 4 W, with Adam), and the "
                   "serial run's peak divided by K for comparison; the stages' weight "
                   "gradients summed over the micro-batches (accumulate, the default) or "
                   "recomputed from the whole batch (recompute):")
        out.append("")
        out.append(table(["optimizer", "stages K", "weight gradients", "peak (MiB)",
                          "need / K (MiB)", "ratio", "serial peak / K (MiB)"],
                         [[row["optimizer"], row["stages"],
                           row.get("weight_gradients", "-") if row["stages"] > 1 else "-",
                           row["peak_mib"], row["need_over_k_mib"], row["ratio"],
                           row.get("serial_peak_over_k_mib", "-")] for row in memory]))
        out.append("")
    return out


def _pipeline_sim(results, stages, targets):
    name = "Pipelined / data-parallel throughput, 2 simulated hosts at 1 Gbit/s"
    req = f">= {PIPELINE_SIM_MIN:.1f}x"
    out, d = open_section(results, stages, targets, "pipeline_sim_cluster.json",
                          ["pipeline_sim_cluster", "pipeline"],
                          "### Where pipelining wins: 2 simulated hosts at 1 Gbit/s",
                          [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    by = {r["mode"]: r for r in res}
    q = d.get("ratio_pipeline_to_data")
    if q is None:
        problem = (cfg.get("problems") or {}).get("run", "")
        targets.append(Target(name, req, note="no ratio" + (
            f": {problem.strip().splitlines()[-1]}" if problem.strip() else "")))
    else:
        t = Target(name, req, f"{q:.2f}x", q >= PIPELINE_SIM_MIN, family="pipeline")
        t.note = (f"{by['pipeline']['samples_per_s']:.0f} vs {by['data']['samples_per_s']:.0f} "
                  f"samples/s; {bytes_str(cfg.get('parameter_bytes', 0))} of weights")
        if not t.ok:
            t.note = short_by(q, PIPELINE_SIM_MIN) + "; " + t.note
        targets.append(t)
    out.append(f"Two simulated hosts (network namespaces, one rank each, links shaped to "
               f"1 Gbit/s: `{cfg.get('link_shaping', '?')}`), a model with "
               f"{bytes_str(cfg.get('parameter_bytes', 0))} of float32 weights and small "
               f"activations, global batch {cfg.get('global_batch', '?')}: pipelined (2 stages, "
               f"{cfg.get('micro_batches', '?')} micro-batches) and data-parallel (2 replicas) "
               "trained in turns in the same job. Moving the weights' gradients once over the "
               f"link takes {cfg.get('allreduce_transfer_ms', '?')} ms; the pipeline's "
               f"activations and their gradients {cfg.get('pipeline_transfer_ms', '?')} ms.")
    out.append("")
    rows = [[r["mode"], f2(r["step_ms"]), f"{r['samples_per_s']:.1f}",
             f"{r['step_spread_ms'][0]:.1f} .. {r['step_spread_ms'][1]:.1f}", r["steps"]]
            for r in res]
    out.append(table(["mode", "ms/step", "samples/s", "step range ms", "steps"], rows))
    if q is not None:
        out += ["", f"Pipelined / data-parallel throughput: **{q:.2f}x**."]
    out += problem_lines(cfg)
    out.append("")
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


# --------------------------------------------------------------- run info

def command_line(*cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (p.stdout or p.stderr).strip().splitlines()[0] if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def write_run_info(args):
    path = os.path.join(args.results, "run.json")
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    old, _ = load_json(path)
    if args.rerun and old is not None:
        # Only some stages run again: the run's record stays, with a note.
        old.setdefault("reruns", []).append(
            {"stages": args.rerun, "started_utc": now,
             "load_average_at_start": [round(v, 2) for v in os.getloadavg()]})
        info = old
    else:
        info = new_run_info(args, now)
    write_json(path, info)


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
    info, _ = load_json(os.path.join(results, "run.json"))
    info = info or {}
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


def data_share_section(results, stages, targets):
    """Each rank prepares only its share of the input, and input-bound jobs
    are not slower than plain Keras (data_bench.py)."""
    planned = []
    for job in ("matmul", "augment"):
        data_targets(job, None, planned)
    goals = [(t.name, t.required) for t in planned]
    out, d = open_section(results, stages, targets, "data_share.json", ["data_share"],
                          "## 7. Each rank prepares only its share of the data", goals=goals)
    if d is None:
        return out
    rounds = " ".join(f"{r[0]:.2f}" for r in d["load_average_rounds"])
    out.append(f"Global batch {d['global_batch']}; sharing on and whole alternate in one "
               f"process ({d['trials']} trials each, median), runs of serial Keras and of "
               f"each rank count interleaved in {d['rounds']} round(s), median over the "
               "rounds. Input CPU: an epoch of the rank's distributed dataset alone, read "
               f"as fit reads it (one iterator across {d.get('input_epochs', 4)} epochs, "
               "tnt.data.across_epochs, its batches taken inside a tf.function as Keras's "
               "train function takes them; the epochs after the first; the first epoch's, "
               "which also makes the "
               "iterator, in brackets); plain Keras: an iterator an epoch. On / whole: the "
               "largest rank's against the mean of whole. Load average "
               f"(1 min) at the start and after each round: {rounds} ({d['cpus']} cores). "
               f"Command: `{d['command']}`.")
    out.append("")
    for job, j in d["jobs"].items():
        out.append(f"**{job}**: {j['what']}; whole: `{j['whole']}`. Plain Keras in one "
                   f"process: epoch {j['serial']['epoch_s']:.3f} s (rounds "
                   f"{', '.join(f'{v:.3f}' for v in j['serial']['epoch_s_rounds'])}), input "
                   f"CPU {j['serial']['input_cpu_s'][0]:.3f} s.")
        out.append("")
        rows = []
        for r in j["runs"]:
            ratio = j["ratios"][str(r["ranks"])]
            on = r["share"]
            rows.append([r["ranks"], "on" if on else "whole", f"{r['epoch_s']:.3f}",
                         ", ".join(f"{v:.3f}" for v in r["epoch_s_rounds"]),
                         ", ".join(f"{v:.3f}" for v in r["input_cpu_s"]) + (
                             " (" + ", ".join(f"{v:.3f}" for v in r["input_cpu_first_s"]) + ")"
                             if "input_cpu_first_s" in r else ""),
                         f"{ratio['input_cpu_share_vs_whole']:.2f}" if on else "",
                         f"{ratio['epoch_share_vs_serial']:.2f}" if on else ""])
        out.append(table(["ranks", "sharing", "epoch s", "epoch s per round",
                          "input CPU s per rank", "input CPU on / whole",
                          "epoch / plain Keras"], rows))
        out.append("")
        data_targets(job, j, targets)
    out.append("On 1 rank both rows of the matmul job run the same pipeline; those of the "
               "augment job differ only in how the random numbers are drawn.")
    out.append("")
    return out


def data_targets(job, j, targets, note=None):
    """The targets of one job of the data stage (None: not run)."""
    ratios = {} if j is None else j["ratios"]
    spec = [(f"Input ({job}): 1 rank epoch / plain Keras", "1", "epoch_share_vs_serial",
             DATA_ONE_RANK_MAX),
            (f"Input ({job}): 2 ranks epoch / plain Keras", "2", "epoch_share_vs_serial",
             DATA_TWO_RANKS_MAX)]
    spec += [(f"Input ({job}): {n} ranks input CPU per rank / whole", str(n),
              "input_cpu_share_vs_whole", limit) for n, limit in DATA_CPU_MAX.items()]
    for name, ranks, key, limit in spec:
        if ranks not in ratios:
            targets.append(Target(name, f"<= {limit:.2f}", note=note or "not measured"))
            continue
        v = ratios[ranks][key]
        targets.append(Target(name, f"<= {limit:.2f}", f"{v:.2f}", v <= limit,
                              "" if v <= limit else short_by(v, limit, False), family="data"))


# The step-time cost of BackupAndRestore(save_freq=50) on the quick start
# that training jobs are asked to accept.
BACKUP_COST_MAX = 0.05


def reliability_section(results, stages, targets):
    """What BackupAndRestore costs (backup_cost.py) and how long a job takes
    from a rank's death to its next step (restart_time.py)."""
    name = "BackupAndRestore(save_freq=50) step-time cost, quick start, 2 ranks"
    required = f"<= {BACKUP_COST_MAX * 100:.0f} %"
    out, d = open_section(results, stages, targets, "reliability_backup.json",
                          ["reliability_backup"], "## 9. Reliability: backups and restarts",
                          goals=[(name, required)], label="Backup cost: ")
    if d is not None:
        cost = d["estimated_cost"]
        per_backup = statistics.median(d["ms_per_backup"])
        out.append(f"**Backup cost** ({d['ranks']} ranks, global batch {d['global_batch']}, "
                   f"save_freq {d['save_freq']}, {d['steps']} steps per fit): a backup takes "
                   f"{per_backup:.1f} ms on the master (median of {len(d['ms_per_backup'])}), "
                   f"{cost * 100:.1f} % of {d['save_freq']} steps; whole fits with and "
                   "without backups in ABBA rounds: median "
                   f"{d['median_cost'] * 100:+.1f} % (rounds "
                   f"{', '.join(f'{c * 100:+.1f}' for c in d['cost'])} %), which the "
                   "machine's drift between rounds can exceed on a shared machine.")
        out.append("")
        targets.append(Target(name, required, f"{cost * 100:.1f} %", cost <= BACKUP_COST_MAX,
                              note="a backup's time over save_freq mean step times"))
    out2, r = open_section(results, stages, [], "reliability_restart.json",
                           ["reliability_restart"], label="Restart time: ", show_config=False)
    out += out2
    if r is not None:
        m, cfg = r["median"], r["config"]
        totals = ", ".join(f"{t['total']:.2f}" for t in r["trials"])
        out.append(f"**Restart time**: the {cfg['model']}, {cfg['ranks']} ranks, "
                   f"`--max-restarts 1`, BackupAndRestore(save_freq={cfg['save_freq']}); the "
                   f"last rank is killed after step {cfg['kill_step']}. The trial of the median "
                   f"total of {len(r['trials'])} (totals {totals} s), load average {r['load_average']:.1f} on "
                   f"{r['cpus']} cores. Command: `{r['command']}`.")
        out.append("")
        rows = [["the launcher ends the attempt and starts the next", f"{m['restart']:.2f}"],
                ["TensorFlow's start-up: import (TensorFlow, Keras, Tarantella)",
                 f"{m['import']:.2f}"],
                ["TensorFlow's start-up: tnt.init()", f"{m['init']:.2f}"],
                ["load the data, build, restore the backup, skip the trained batches, "
                 "first step",
                 f"{m['resume']:.2f}"],
                ["**fault to the first step of the next attempt**", f"**{m['total']:.2f}**"]]
        out.append(table(["part (until the last rank is through it)", "s"], rows))
        out.append("")
        out.append(f"TensorFlow's start-up (import + init) is {m['tf_startup']:.2f} s of the "
                   f"{m['total']:.2f} s.")
        out.append("")
    return out


def compression_section(results, stages, targets):
    """Gradient compression and the tuned fusion threshold on the simulated
    hosts (sim_cluster_bench.py --variants), and compression's effect on
    accuracy (compression_accuracy.py)."""
    out, d = open_section(results, stages, targets, "sim_cluster_compression.json",
                          ["sim_cluster_compression"],
                          "## 8. Gradient compression and the tuned fusion threshold",
                          show_config=False)
    if d is not None:
        res = d.get("results", [])
        cfg = d.get("config", {})
        out.append(f"LeNet-5, fusion on, overlap on (but in overlap_off and overlap_auto), "
                   f"per-rank median step over "
                   f"{cfg.get('steps_per_fit')} steps x {cfg.get('fits_per_config')} fits per "
                   f"setting, settings interleaved in one run; load average "
                   f"{cfg.get('load_average_at_start')} at the start, "
                   f"{cfg.get('load_average_at_end')} at the end ({cfg.get('cores')} cores).")
        out.append("")
        base = {(r["hosts"], r["link"]): r["step_ms"] for r in res if r.get("variant") == "none"}
        rows = []
        for r in res:
            ref = base.get((r["hosts"], r["link"]))
            rows.append([r["hosts"], r["link"], r.get("variant", "-"), f2(r["step_ms"]),
                         f"{r['step_ms'] / ref:.2f}" if ref else "-", f2(r["wait_ms"]),
                         f2(r["comm_ms"]), f2(r["bound_ms"]),
                         bytes_str(r["gradient_bytes"]) if "gradient_bytes" in r else "-",
                         r.get("final_loss", "-")])
        out.append(table(["hosts", "link", "setting", "step ms", "step / none", "wait ms",
                          "comm ms", "bound ms", "bytes sent", "final loss"], rows))
        out.append("")
    more, d = open_section(results, stages, targets, "compression_accuracy.json",
                           ["compression_accuracy"], label="Accuracy (compression_accuracy.py): ",
                           show_config=False)
    out += more
    if d is None:
        return out
    cfg = d.get("config", {})
    out.append(f"Accuracy: LeNet-5 on {cfg.get('samples')} Fashion-MNIST samples, "
               f"{cfg.get('ranks')} ranks, global batch {cfg.get('global_batch')}, "
               f"{cfg.get('epochs')} epochs (test accuracy on the 10000 test images).")
    out.append("")
    rows = [[name, r["epochs"][-1]["loss"], r["epochs"][-1]["test_accuracy"]]
            for name, r in d.get("results", {}).items()]
    out.append(table(["compression", "final training loss", "test accuracy"], rows))
    out.append("")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--quick", action="store_true", help="the results are of a quick run")
    p.add_argument("--run-info", action="store_true",
                   help="only record the run's environment in run.json (at the start of a run)")
    p.add_argument("--mpirun", default="mpirun", help="with --run-info: the MPI launcher")
    p.add_argument("--rerun", metavar="STAGES",
                   help="with --run-info: only these stages run again; keep the run's record")
    args = p.parse_args()
    os.makedirs(args.results, exist_ok=True)
    if args.run_info:
        write_run_info(args)
        return 0
    plt = pyplot()
    stages = load_stages(args.results)
    targets = []
    body = []
    body += collectives_section(args.results, stages, plt, targets)
    body += overhead_section(args.results, stages, targets)
    body += fusion_section(args.results, stages, plt, targets)
    body += training_section(args.results, stages, plt, targets)
    body += sim_section(args.results, stages, plt, targets)
    body += sim_allreduce_section(args.results, stages, plt, targets)
    body += sim_frameworks_section(args.results, stages, targets)
    body += pipeline_section(args.results, stages, plt, targets)
    body += data_share_section(args.results, stages, targets)
    body += compression_section(args.results, stages, targets)
    body += report_scale.section(sys.modules[__name__], args.results, stages, plt, targets)
    body += reliability_section(args.results, stages, targets)
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
    missed = [f for f in NEXT_STEPS if any(t.ok is False and t.family == f for t in targets)]
    if missed:
        out += ["### What would close the misses", ""]
        out += [f"- **{f}**: {NEXT_STEPS[f]}" for f in missed]
        out.append("")
    out += stages_section(stages)
    out += body
    with open(os.path.join(args.results, "summary.md"), "w") as f:
        f.write("\n".join(out).rstrip() + "\n")
    print(f"wrote {os.path.join(args.results, 'summary.md')}: " +
          ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
