"""The "At scale (simulated)" section of the benchmark report (report.py):
scale_validation.jsonl, scale.jsonl, scale_reduce_scatter.jsonl and
scale_check.jsonl of tools/research/scale_bench.py, scale_projection.jsonl of project_scale.py, and
the plots scale_allreduce.png and scale_projection.png."""
import math
import os

from report_base import (TARGETS, Target, bw, bytes_str, config_lines, detail, image, limit,
                         load_results, meets, missing_note, not_run_line, table)
from report_plots import save


def layout(r):
    return f"{r['hosts']}x{r['per_host']}"


def link_share(r):
    """What each host sends per second, of its link: algbw * 2(H-1)/H / rate."""
    h = r["hosts"]
    algbw = r["bytes"] / (r["us"] * 1e-6)
    return algbw * 2 * (h - 1) / h / (r["gbit"] * 1e9 / 8)


def validation_part(d, note, targets):
    out = ["### Validation: simulated hosts against the measured ones", ""]
    if d is None:
        targets.append(Target("at scale: validation, simulated / measured busbw at >= "
                                "256 KiB", f"within {limit('scale_validation'):.0%}",
                                note=note))
        return out + [not_run_line([note]), ""]
    res, cfg = d["results"], d["config"]
    links = TARGETS["scale_validation"]["links"]
    measured = cfg["measured"] if isinstance(cfg["measured"], list) else [cfg["measured"]]
    out.append(f"The measured runs of {', '.join(f'`{m}`' for m in measured)} (tnt-bench "
               f"allreduce, libtnt's choice) beside tnt-sim running the same algorithm on as "
               f"many simulated hosts: each "
               f"link at the rate one TCP stream reached in that run, "
               f"{cfg['latency_us_per_link']:g} us per link ({cfg['links_per_route']} links a "
               f"route), copies at the memcpy rate measured at each size. Targets: the "
               f"{', '.join(links)} rows; faster links are CPU-bound on the "
               f"measuring machine (the hosts' ranks and the kernel's TCP share its 2 cores) "
               f"and shown for information; load before = the 1-minute load average before "
               f"the measured run.")
    out.append("")
    for key in sorted({(r["hosts"], r["ranks_per_host"], r["link"]) for r in res}):
        mine = [r for r in res if (r["hosts"], r["ranks_per_host"], r["link"]) == key]
        big = [r for r in mine if r["bytes"] >= TARGETS["scale_validation"]["bytes"]]
        if not big:
            continue
        worst = max(big, key=lambda r: abs(r["ratio"] - 1))
        required = key[2] in links
        ok = meets("scale_validation", abs(worst["ratio"] - 1))
        t = Target(f"at scale: validation, simulated / measured busbw at >= 256 KiB, "
                     f"{key[0]}x{key[1]} {key[2]}", f"within {limit('scale_validation'):.0%}",
                     f"{min(r['ratio'] for r in big):.2f}..{max(r['ratio'] for r in big):.2f}",
                     ok if required else None, family="scale_validation")
        t.note = f"furthest at {bytes_str(worst['bytes'])}"
        if not required:
            t.note = "informational, CPU-bound on the measuring machine; " + t.note
        targets.append(t)

    def load(r):
        la = r.get("measured_loadavg") or {}
        return f"{la['before'][0]:.2f}" if "before" in la else "-"

    rows = [[f"{r['hosts']}x{r['ranks_per_host']}", r["link"], f"{r['sim_gbit']:g}",
             bytes_str(r["bytes"]), r["sim_algorithm"], f"{r['measured_busbw']:.3f}",
             f"{r['sim_busbw']:.3f}", f"{r['ratio']:.2f}", load(r),
             "target" if r["link"] in links else "CPU-bound"] for r in res]
    out.append(table(["layout", "link", "simulated Gbit/s", "bytes", "algorithm",
                        "measured busbw GB/s", "simulated busbw GB/s", "simulated / measured",
                        "load before", "role"], rows))
    out.append("")
    return out


def plot(plt, results, res):
    groups = sorted({(r["hosts"], r["per_host"], r["gbit"]) for r in res})
    cols = min(4, len(groups))
    rows_n = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.4 * rows_n), squeeze=False)
    for ax, (hosts, per_host, gbit) in zip(axes.flat, groups):
        for impl, style in (("tnt", "o-"), ("mpi_ompi", "s--"), ("mpi_mpich", "^:")):
            mine = sorted((r for r in res if (r["hosts"], r["per_host"], r["gbit"]) ==
                           (hosts, per_host, gbit) and r["impl"] == impl
                           and r["choice"] in ("auto", "mpi")), key=lambda r: r["bytes"])
            if mine:
                ax.plot([r["bytes"] for r in mine], [r["busbw"] for r in mine], style,
                        ms=3, label={"tnt": "libtnt (auto)", "mpi_ompi": "SMPI ompi",
                                     "mpi_mpich": "SMPI mpich"}[impl])
        ax.axhline(gbit / 8, color="k", lw=1, label="link rate")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{hosts} hosts x {per_host}, {gbit:g} Gbit/s", fontsize=8)
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw GB/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    save(fig, results, "scale_allreduce.png")


def scale_part(d, note, plt, results, targets):
    out = ["### busbw against SMPI's MPI_Allreduce on fat-trees", ""]
    if d is None:
        for name, req in (("libtnt busbw / the better SMPI MPI_Allreduce, every size",
                           f">= {limit('scale_mpi'):.1f}x"),
                          ("link share at >= 64 MiB", f">= {limit('scale_link'):.2f}")):
            targets.append(Target(f"at scale: {name}", req, note=note))
        return out + [not_run_line([note]), ""]
    res, cfg = d["results"], d["config"]
    out += config_lines(cfg, "scale.jsonl")
    runs = [[f"{r['hosts']}x{r['per_host']}", f"{r['gbit']:g}", r["impl"], r["sizes"],
             f"{r['wall_s']:.0f}", r["error"] or ""] for r in d["runs"]]
    detail("scale.json: wall time of each simulation (the machine's 2 cores, shared)",
           [table(["layout", "Gbit/s", "run", "sizes", "wall s", "problem"], runs)])
    problems = [r for r in d["runs"] if r["error"]]
    out.append(f"{len(d['runs'])} simulations, {len(problems)} stopped early or failed "
               "(their wall times: `details.md`).")
    out.append("")
    for key in sorted({(r["hosts"], r["per_host"], r["gbit"]) for r in res}):
        mine = [r for r in res if (r["hosts"], r["per_host"], r["gbit"]) == key]
        tnt = {r["bytes"]: r for r in mine if r["impl"] == "tnt" and r["choice"] == "auto"}
        mpi = {}  # the better of the two selectors at each size
        for r in mine:
            if r["impl"].startswith("mpi") and (r["bytes"] not in mpi or
                                                r["busbw"] > mpi[r["bytes"]]["busbw"]):
                mpi[r["bytes"]] = r
        label = f"{key[0]} hosts x {key[1]}, {key[2]:g} Gbit/s"
        common = sorted(set(tnt) & set(mpi))
        if common:
            ratios = [(tnt[b]["busbw"] / mpi[b]["busbw"], b) for b in common]
            geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
            low, at = min(ratios)
            t = Target(f"at scale: libtnt busbw / the better SMPI MPI_Allreduce, "
                         f"{bytes_str(common[0])}..{bytes_str(common[-1])}, {label}",
                         f">= {limit('scale_mpi'):.1f}x every size",
                         f"geomean {geo:.2f}x, min {low:.2f}x",
                         meets("scale_mpi", low), family="scale")
            t.note = (f"min at {bytes_str(at)} ({tnt[at]['algorithm']} against "
                      f"{mpi[at]['impl']})")
            targets.append(t)
        big = [tnt[b] for b in tnt if b >= TARGETS["scale_link"]["bytes"]]
        if big:
            worst = min(big, key=link_share)
            targets.append(Target(f"at scale: link share at >= 64 MiB, {label}",
                                    f">= {limit('scale_link'):.2f}", f"{link_share(worst):.2f}",
                                    meets("scale_link", link_share(worst)), family="scale",
                                    note=f"lowest at {bytes_str(worst['bytes'])}"))
        else:
            targets.append(Target(f"at scale: link share at >= 64 MiB, {label}",
                                    f">= {limit('scale_link'):.2f}",
                                    note="no size that large was run"))
    if plt is not None and res:
        plot(plt, results, res)
        out += [image("scale_allreduce.png", results), ""]
    rows = []
    for r in sorted(res, key=lambda r: (r["gbit"], r["hosts"], r["per_host"], r["bytes"],
                                        r["impl"], r["choice"])):
        rows.append([layout(r), f"{r['gbit']:g}", bytes_str(r["bytes"]), r["impl"],
                     r["choice"], r["algorithm"], f"{r['us']:.1f}", bw(r["busbw"]),
                     f"{link_share(r):.2f}"])
    detail("scale.json: every simulated allreduce",
           [table(["layout", "Gbit/s", "bytes", "impl", "choice", "algorithm", "us",
                   "busbw GB/s", "link share"], rows)])
    out += [f"Every one of the {len(rows)} simulated allreduces: `details.md`.", ""]
    return out


# The sizes of the reduce-scatter table.
REDUCE_SCATTER_SIZES = (4 << 10, 16 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def reduce_scatter_part(d, note):
    out = ["### Reduce-scatter against SMPI's MPI_Reduce_scatter_block", ""]
    if d is None:
        return out + [not_run_line([note]), ""]
    res = d["results"]
    out += config_lines(d["config"], "scale_reduce_scatter.jsonl")
    out.append("libtnt's reduce-scatter (equal blocks, the allreduce's choice for the whole "
               "vector) against the better of SMPI's two selectors at each size; speedup = "
               "SMPI's time / libtnt's (-: SMPI not simulated at that size). busbw here = "
               "bytes / time * (n-1)/n.")
    out.append("")
    rows = []
    for key in sorted({(r["hosts"], r["per_host"], r["gbit"]) for r in res}):
        mine = [r for r in res if (r["hosts"], r["per_host"], r["gbit"]) == key]
        tnt = {r["bytes"]: r for r in mine if r["impl"] == "tnt" and r["choice"] == "auto"}
        mpi = {}
        for r in mine:
            if r["impl"].startswith("mpi") and (r["bytes"] not in mpi or
                                                r["us"] < mpi[r["bytes"]]["us"]):
                mpi[r["bytes"]] = r
        for b in (b for b in REDUCE_SCATTER_SIZES if b in tnt):
            m = mpi.get(b)
            rows.append([f"{key[0]}x{key[1]}", f"{key[2]:g}", bytes_str(b), tnt[b]["algorithm"],
                         f"{tnt[b]['us']:.1f}", f"{m['us']:.1f} ({m['impl']})" if m else "-",
                         f"{m['us'] / tnt[b]['us']:.2f}x" if m else "-"])
    out.append(table(["layout", "Gbit/s", "bytes", "libtnt algorithm", "libtnt us",
                      "better SMPI us", "speedup"], rows))
    out.append("")
    detail("scale_reduce_scatter.json: every simulated reduce-scatter",
           [table(["layout", "Gbit/s", "bytes", "impl", "choice", "algorithm", "us",
                   "busbw GB/s"],
                  [[layout(r), f"{r['gbit']:g}", bytes_str(r["bytes"]), r["impl"], r["choice"],
                    r["algorithm"], f"{r['us']:.1f}", bw(r["busbw"])]
                   for r in sorted(res, key=lambda r: (r["gbit"], r["hosts"], r["per_host"],
                                                       r["bytes"], r["impl"]))])])
    return out


def plot_projection(plt, results, res):
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for model in sorted({r["model"] for r in res}):
        for speedup, style in ((1, "o-"), (100, "s--")):
            mine = sorted((r for r in res if r["model"] == model and r["mode"] ==
                           "data-parallel" and r["compute_speedup"] == speedup),
                          key=lambda r: r["hosts"])
            if mine:
                ax.plot([r["hosts"] for r in mine], [r["E"] for r in mine], style, ms=3,
                        label=f"{model}, compute {speedup}x")
    e_min = limit("scale_projection")
    ax.axhline(e_min, color="k", lw=1, label=f"target {e_min:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hosts (one rank each)")
    ax.set_ylabel("projected E(N)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, results, "scale_projection.png")


def projection_part(d, note, plt, results, targets):
    out = ["### Training at scale, projected", ""]
    hosts = TARGETS["scale_projection"]["hosts"]
    name = f"at scale: projected E({hosts}), ResNet, 100 Gbit/s"
    if d is None:
        targets.append(Target(name, f">= {limit('scale_projection'):.1f}", note=note))
        return out + [not_run_line([note]), ""]
    res = d["results"]
    out += config_lines(d["config"], "scale_projection.jsonl")
    out.append("Step time from each model's measured timeline (when each fusion bucket is "
               "submitted) and libtnt's simulated allreduce of each bucket on N hosts "
               "(`tools/research/project_scale.py`); E(N) = compute / step at the same samples "
               "per rank. Hybrid: K pipeline stages x N/K replicas.")
    out.append("")
    best = {}
    for r in res:
        k = (r["model"], r["compute_speedup"], r["hosts"])
        if k not in best or r["E"] > best[k]["E"]:
            best[k] = r
    rows = [[r["model"], f"{r['compute_speedup']}x", r["hosts"], r["mode"], r["stages"],
             f"{r['step_ms']:.3f}", f"{r['E']:.3f}",
             "yes" if best[(r["model"], r["compute_speedup"], r["hosts"])] is r else ""]
            for r in sorted(res, key=lambda r: (r["model"], r["compute_speedup"], r["hosts"],
                                                r["stages"]))]
    out.append("compute: the measured step's compute, and divided by 10 and 100 (devices that "
               "much faster on the same network).")
    out.append("")
    out.append(table(["model", "compute", "hosts", "mode", "stages", "step ms", "E(N)",
                        "chosen"], rows))
    out.append("")
    if d.get("check_2_hosts"):
        out.append("The same projection of the measured 2-host runs, from their measured "
                   "allreduce times:")
        out.append("")
        out.append(table(["model", "link", "projected step ms", "measured step ms",
                            "projected / measured"],
                           [[c["model"], c["link"], f"{c['projected_step_ms']:.2f}",
                             f"{c['measured_step_ms']:.2f}", f"{c['ratio']:.2f}"]
                            for c in d["check_2_hosts"]]))
        out.append("")
    resnet = best.get(("resnet", 1, hosts))
    if resnet is None:
        targets.append(Target(name, f">= {limit('scale_projection'):.1f}",
                                note=f"no simulated allreduce at {hosts} hosts"))
    else:
        targets.append(Target(name, f">= {limit('scale_projection'):.1f}", f"{resnet['E']:.3f}",
                                meets("scale_projection", resnet["E"]), family="scale",
                                note=f"{resnet['mode']}; with compute 10x / 100x faster: "
                                     + " / ".join(f"{best[('resnet', f, hosts)]['E']:.3f}"
                                                  for f in (10, 100)
                                                  if ("resnet", f, hosts) in best)))
    if plt is not None and res:
        plot_projection(plt, results, res)
        out += [image("scale_projection.png", results), ""]
    return out


def check_part(d, note, targets):
    out = ["### Correctness at scale", ""]
    name = "at scale: simulated allreduce = the serial sum in its documented order"
    if d is None:
        targets.append(Target(name, "every layout", note=note))
        return out + [not_run_line([note]), ""]
    res = d["results"]
    out.append("`tnt-sim --check` on each layout (`scale_bench.py --check`): exact sums checked "
               "on every rank, non-integer sums bit for bit against the serial sum in the order "
               "each algorithm's file documents, the same bits on every rank "
               f"({d['config']['cases']}).")
    out.append("")
    out.append(table(["layout", "ranks", "algorithms", "results", "ok", "wall s"],
                       [[r["layout"], r["ranks"], r["algorithms"], r["results"],
                         "yes" if r["ok"] else f"**no**: {r['error']}", f"{r['wall_s']:.0f}"]
                        for r in res]))
    out.append("")
    bad = [r["layout"] for r in res if not r["ok"]]
    targets.append(Target(name, "every layout",
                            f"{len(res) - len(bad)} of {len(res)} layouts, up to "
                            f"{max(r['ranks'] for r in res)} ranks", not bad, family="scale",
                            note=("failed: " + ", ".join(bad)) if bad else ""))
    return out


def section(results, stages, plt, targets):
    out = ["## At scale (simulated)", "",
           "libtnt's own allreduce code on clusters simulated by SimGrid (tnt-sim, "
           "tools/research/scale_bench.py; docs/research/scale-study.md)."
           " busbw = bytes / time * 2(n-1)/n over n ranks; link share = algbw * 2(H-1)/H "
           "over H hosts / link rate.", ""]

    def load(fname):
        d, why = load_results(os.path.join(results, fname))
        return d, missing_note(stages, why, fname, fname.removesuffix(".jsonl"), "scale")
    out += validation_part(*load("scale_validation.jsonl"), targets)
    out += scale_part(*load("scale.jsonl"), plt, results, targets)
    out += reduce_scatter_part(*load("scale_reduce_scatter.jsonl"))
    out += check_part(*load("scale_check.jsonl"), targets)
    out += projection_part(*load("scale_projection.jsonl"), plt, results, targets)
    return out
