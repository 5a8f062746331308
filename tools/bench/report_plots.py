"""The plots of the benchmark report (report.py): one function per plot,
each writing a PNG into the results folder; no software or date stamps, so
the same data gives the same file.
"""
import json
import os

from bench_results import TRACES
from report_base import limit, size_str


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


RANKS = [2, 4]


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
        cfg = doc["config"]
        if cfg.get("oversubscribed"):
            title += f" (oversubscribed: {cfg.get('max_ranks_per_host', ranks)} ranks on " \
                     f"{cfg.get('cores_per_host', '?')} cores)"
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
    ax.set_title(f"Fusion threshold sweep, {next(iter(sweeps.values()))['config']['ranks']} ranks")
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


def sim_defaults(rows):
    """The rows of the configuration users run: fusion on, overlap auto."""
    return [r for r in rows if r["fusion"] and r["overlap"] == "auto"]


def sim_label(r):
    return f"{r['hosts']}x{r['ranks_per_host']}\n{r['link'].split('_')[0]}\n{r['model']}"


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
    finish(fig, ax, "Simulated cluster: step time breakdown, fusion on, overlap "
           "auto (hosts x ranks per host, link, model)",
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
           f"{limit('sim_bound')} with the defaults)", "sim_cluster_step_vs_bound.png")


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


def memory_holder(schedule, rank):
    """Which stages rank `rank` of the memory stage's 2 ranks holds."""
    return (f"rank {rank}: stages {rank}, {rank + 2}" if schedule == "interleaved"
            else f"rank {rank}: stage {rank}")


def step_memory(row):
    """What a training step holds above the traced step (results that
    split the two), else its peak above the RSS before fit."""
    held = row.get("step_above_traced_mib")
    return row["peak_above_base_mib"] if held is None else held


def plot_pipeline_memory(plt, results, res):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for schedule, style in (("gpipe", "s-"), ("1f1b", "o-"), ("interleaved", "^--")):
        for stage in sorted({r["stage"] for r in res}):
            mine = sorted((r for r in res if (r["schedule"], r["stage"]) == (schedule, stage)),
                          key=lambda r: r["micro_batches"])
            if mine:
                ax.plot([r["micro_batches"] for r in mine],
                        [step_memory(r) for r in mine], style,
                        label=f"{schedule}, {memory_holder(schedule, stage)}")
    split = all(r.get("step_above_traced_mib") is not None for r in res)
    save_against_m(fig, ax, results, sorted({r["micro_batches"] for r in res}),
                   "a step's peak RSS above the traced step's (MiB)" if split else
                   "peak RSS above the RSS before fit (MiB)",
                   "Pipeline memory per stage: GPipe, 1F1B, interleaved", "pipeline_memory.png")


def plot_pipeline_timeline(plt, results, name="pipeline_timeline", schedule="1F1B"):
    """<name>.png: the last training step of a 2-stage timeline of
    `schedule` (traces/<name>.rank<R>.json), one row per stage. Returns
    whether it drew one."""
    spans = {}
    for rank in (0, 1):
        path = os.path.join(results, TRACES, f"{name}.rank{rank}.json")
        if not os.path.exists(path):
            return False
        with open(path) as f:
            d = json.load(f)
        spans[rank] = sorted((e for e in d if e.get("cat") == "pipeline" and e.get("ph") == "X"),
                             key=lambda e: e["ts"])
    starts = [e["ts"] for e in spans[0] if e["name"] == "forward 0"]
    if not starts:
        return False
    begin = starts[-1]
    ends = [e["ts"] + e["dur"] for r in spans for e in spans[r]
            if e["ts"] >= begin and e["name"].split()[0] in ("backward", "weight")]
    if not ends:
        return False
    end = max(ends)
    colors = {"forward": "tab:blue", "backward": "tab:orange", "weight": "tab:green",
              "recv": "lightgray"}
    letters = {"forward": "F", "backward": "B", "weight": "W"}
    split = any(e["name"].startswith("weight") for r in spans for e in spans[r])
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for rank, events in spans.items():
        for e in events:
            if e["ts"] < begin - 1e3 or e["ts"] > end:
                continue
            kind = e["name"].split()[0]
            x0 = (e["ts"] - begin) / 1e3
            ax.broken_barh([(x0, max(e["dur"] / 1e3, 0.01))], (1 - rank - 0.4, 0.8),
                           color=colors.get(kind, "gray"))
            if kind in letters:
                ax.text(x0 + e["dur"] / 2e3, 1 - rank, letters[kind] + e["name"].split()[-1],
                        ha="center", va="center", fontsize=7)
    ax.set_yticks([1, 0], ["stage 0", "stage 1"])
    ax.set_xlabel("ms since the step's first forward")
    legend = ("blue forward, orange backward, " + ("green weight gradients, " if split else "")
              + "gray waiting to receive")
    title = f"One training step, 2 stages, 4 micro-batches, {schedule}"
    # Two lines where the legend names W too.
    ax.set_title(title + ("\n" if split else " ") + f"({legend})", fontsize=9)
    fig.tight_layout()
    save(fig, results, f"{name}.png")
    return True
