"""The report's sections on sim_cluster_bench.py: training on the simulated
cluster, the allreduce across simulated hosts, against MWMS, and gradient
compression (sim_cluster*.jsonl, compression_accuracy.jsonl).
"""

from report_base import (TARGETS, Target, bytes_str, f2, image, limit, meets, open_section,
                         problem_lines, short_by, table, timeline_link)
from report_plots import plot_sim, plot_sim_allreduce, sim_defaults


def on_off(v):
    return "on" if v else "off"


def layout_of(r):
    """A simulated-cluster row's layout: "2" (hosts of one rank), "2x2"."""
    per_host = r["ranks_per_host"]
    return str(r["hosts"]) if per_host == 1 else f"{r['hosts']}x{per_host}"


def hosts_text(r):
    per_host = r["ranks_per_host"]
    return f"{r['hosts']} hosts" + (f" x {per_host} ranks" if per_host > 1 else "")


def sim_section(results, stages, plt, targets):
    name = "Simulated cluster with the defaults: step time / bound (worst link)"
    req = f"<= {limit('sim_bound'):.2f}"
    out, d = open_section(results, stages, targets, "sim_cluster.jsonl", ["sim_cluster"],
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
    models = list(dict.fromkeys(r["model"] for r in res))
    layouts = sorted({layout_of(r) for r in lapped}, key=lambda k: (len(k), k))
    for layout, model in [(lay, m) for lay in layouts for m in models]:
        mine = [r for r in lapped if layout_of(r) == layout and r["model"] == model]
        if not mine:
            continue
        worst = max(mine, key=lambda r: r["ratio_to_bound"])
        dflt = f"fusion on, overlap {worst['overlap']}"
        t = Target(f"Simulated cluster with the defaults, {model}, {hosts_text(worst)}"
                   + (" (oversubscribed)" if over.get(layout) else "")
                   + f": step time / bound ({dflt}), worst link",
                   req, f"{worst['ratio_to_bound']:.3f}",
                   meets("sim_bound", worst["ratio_to_bound"]),
                   family="sim")
        t.note = (f"{worst['link']}, fusion {on_off(worst['fusion'])}: "
                  f"{worst['step_ms']:.1f} vs {worst['bound_ms']:.1f} ms")
        if not t.ok:
            t.note = (f"{short_by(worst['ratio_to_bound'], limit('sim_bound'), False)}; " + t.note +
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
            others = [o["step_ms"] for o in res if (layout_of(o), o["link"], o["model"]) ==
                      (layout, r["link"], model) and o not in lapped]
            if others:
                slower.append((r["step_ms"] / min(others), r["link"]))
        if slower and not over.get(layout):
            q, link = max(slower)
            targets.append(Target(
                f"Simulated cluster, {model}, {hosts_text(worst)}: the defaults ({dflt}) / "
                "fastest of the other settings, worst link", f"<= {limit('sim_defaults'):.2f}",
                f"{q:.3f}", meets("sim_defaults", q),
                note=link, family="sim"))
    for r in d.get("weak_scaling") or []:
        e2 = r.get("e2_busy")
        judged = any(link in r["link"] for link in TARGETS["sim_e2"]["links"])
        t = Target(f"Weak scaling E(2), {r['model']}, 2 simulated hosts ({r['link']}): one rank "
                   "beside another / 2-host step",
                   f">= {limit('sim_e2'):.2f}" if judged else "(for information)", f2(e2),
                   (e2 is not None and meets("sim_e2", e2)) if judged else None,
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
             r["model"], on_off(r["fusion"]),
             r["overlap"],
             f2(r["step_ms"]), f2(r["compute_ms"]), f2(r["comm_ms"]), f2(r["wait_ms"]),
             f2(r["bound_ms"]), f"{r['ratio_to_bound']:.3f}", f2(r.get("ready_ms")),
             f2(r.get("reach_ms")), f2(r.get("ratio_to_reach"), 3),
             bytes_str(r["gradient_bytes"]) if "gradient_bytes" in r else "-"] for r in res]
    out.append(table(["hosts", "link", "model", "fusion", "overlap", "step ms", "compute ms",
                      "comm ms", "wait ms", "bound ms", "step / bound", "largest ready ms",
                      "reach ms", "step / reach", "gradients"], rows))
    out += ["", "Bound: max(compute, every gradient's transfer at the link rate); reach: "
            "max(compute, the largest gradient ready on the last rank + its transfer). "
            "The method: docs/research/simulated-cluster.md."]
    if any(over.values()):
        out += ["", "\\* oversubscribed: more ranks (on all simulated hosts) than cores."]
    tl = cfg.get("timeline_example")
    if tl:
        out += ["", f"Timeline example: {timeline_link(results, tl)}."]
    out.append("")
    return out


def sim_allreduce_section(results, stages, plt, targets):
    link_bytes = TARGETS["sim_allreduce_link"]["bytes"]
    names = [("Allreduce across simulated hosts: busbw / MPI_Allreduce, every size",
              f">= {limit('sim_allreduce_mpi'):.1f}"),
             (f"Allreduce across simulated hosts: share of the link at >= "
              f"{bytes_str(link_bytes)}", f">= {limit('sim_allreduce_link'):.2f}")]
    out, d = open_section(results, stages, targets, "sim_cluster_allreduce.jsonl",
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
                   meets("sim_allreduce_mpi", worst["ratio"]), family="sim_allreduce")
        t.note = f"lowest at {bytes_str(worst['bytes'])} ({worst['algorithm']})"
        targets.append(t)
        large = [r for r in mine if r["bytes"] >= link_bytes]
        if not large:
            targets.append(Target(f"{names[1][0]} ({label})", names[1][1],
                                  note="no size that large"))
            continue
        low = min(large, key=lambda r: r["link_share"])
        t = Target(f"{names[1][0]} ({label})", names[1][1], f"{low['link_share']:.2f}",
                   meets("sim_allreduce_link", low["link_share"]), family="sim_allreduce")
        t.note = f"lowest at {bytes_str(low['bytes'])}"
        t.note += (f"; {low['tcp_share']:.2f} of what TCP alone carries there "
                   f"({cfg['tcp_gbit'][f'{hosts}x{per_host}_{link}']:g} Gbit/s)")
        targets.append(t)
    if plt is not None and res:
        plot_sim_allreduce(plt, results, res)
        out += [image("sim_cluster_allreduce.png", results), ""]
    out.append("`tnt-bench allreduce` against MPI_Allreduce in the same run on simulated "
               "hosts; link share = algbw * 2(H-1)/H / link rate, TCP share = the same over "
               "what one TCP stream each way carries there (docs/research/communication.md).")
    out.append("")
    rows = [[f"{r['hosts']}x{r['ranks_per_host']}", r["link"], bytes_str(r["bytes"]),
             r["algorithm"], f"{r['tnt_busbw']:.3f}", f"{r['mpi_busbw']:.3f}",
             f"{r['ratio']:.2f}", f"{r['link_share']:.2f}", f"{r['tcp_share']:.2f}"]
            for r in res]
    out.append(table(["layout", "link", "bytes", "algorithm", "tnt busbw GB/s",
                      "MPI busbw GB/s", "tnt / MPI", "link share", "TCP share"], rows))
    out += problem_lines(cfg)
    out.append("")
    return out


def sim_frameworks_section(results, stages, targets):
    """Tarantella against MultiWorkerMirroredStrategy on the simulated hosts
    (sim_cluster_bench.py --frameworks)."""
    name = "Throughput vs MWMS, 2 simulated hosts"
    req = f">= {limit('sim_mwms'):.1f}x"
    out, d = open_section(results, stages, targets, "sim_cluster_frameworks.jsonl",
                          ["sim_cluster_frameworks"],
                          "## 5c. Against MultiWorkerMirroredStrategy on simulated hosts",
                          [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    for r in res:
        t = Target(f"{name}, {r['model']}, {r['link']}", req,
                   f"{r['ratio']:.2f}x" if r.get("ratio") else None,
                   meets("sim_mwms", r["ratio"]) if r.get("ratio") else None, family="sim")
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


def compression_section(results, stages, targets):
    """Gradient compression and the tuned fusion threshold on the simulated
    hosts (sim_cluster_bench.py --variants), and compression's effect on
    accuracy (compression_accuracy.py)."""
    out, d = open_section(results, stages, targets, "sim_cluster_compression.jsonl",
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
    more, d = open_section(results, stages, targets, "compression_accuracy.jsonl",
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
    last = {}  # each setting's last epoch
    for r in d.get("epochs", []):
        last[r["compression"]] = r
    rows = [[name, r["loss"], r["test_accuracy"]] for name, r in last.items()]
    out.append(table(["compression", "final training loss", "test accuracy"], rows))
    out.append("")
    return out
