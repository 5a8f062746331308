"""The report's section on tnt-bench (tnt_bench.c): libtnt's collectives
against MPI's, collectives_<collective>_<N>ranks.jsonl.
"""
import os

from report_base import (TARGETS, Target, bw, f2, image, limit, load_results, meets, missing_note,
                         not_run_line, short_by, size_str, table)
from report_plots import RANKS, plot_collective


COLLECTIVES = [("allreduce", "MPI_Allreduce"), ("broadcast", "MPI_Bcast"),
               ("allgather", "MPI_Allgather")]


def section(results, stages, plt, targets):
    out = ["## 1. Collectives against MPI", ""]
    out.append("`tnt-bench` (libtnt's own choice of algorithm) against the MPI collective, "
               "same process, alternating trials, median of 5, every result checked. "
               "Bus bandwidth in GB/s; ratio = Tarantella busbw / MPI busbw; memcpy = one "
               "process copying the same bytes (the ceiling of one host).")
    out.append("")
    for coll, peer in COLLECTIVES:
        docs, notes = {}, {}
        for n in RANKS:
            d, why = load_results(os.path.join(results, f"collectives_{coll}_{n}ranks.jsonl"))
            if d is not None:
                docs[n] = d
            else:
                notes[n] = missing_note(stages, why, f"collectives_{coll}_{n}ranks.jsonl",
                                        f"collectives_{coll}_{n}ranks", "collectives")
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
            d, cfg = docs[n], docs[n]["config"]
            over = " (oversubscribed: %s ranks on %s cores)" % (
                cfg.get("max_ranks_per_host", n), cfg.get("cores_per_host", "?")) \
                if cfg.get("oversubscribed") else ""
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
                tag = f"{n}r" + ("*" if docs[n]["config"].get("oversubscribed") else "")
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
        if any(d["config"].get("oversubscribed") for d in docs.values()):
            out.append("")
            out.append("\\* oversubscribed: more ranks than cores on the host.")
        out.append("")
    return out


def allreduce_targets(docs, notes, targets):
    for n in RANKS:
        d = docs.get(n)
        over = " (oversubscribed)" if d is not None and d["config"].get("oversubscribed") else ""
        name = f"Allreduce vs MPI_Allreduce, geomean over sizes, {n} ranks{over}"
        if d is None:
            targets.append(Target(name, f">= {limit('allreduce_geomean'):.1f}x", note=notes.get(n)))
            continue
        g = d["geomean_ratio"]
        t = Target(name, f">= {limit('allreduce_geomean'):.1f}x", f"{g:.2f}x",
                   meets("allreduce_geomean", g), family="allreduce")
        if not t.ok:
            below = [r for r in d["rows"] if r["ratio"] < 1.0]
            worst = min(d["rows"], key=lambda r: r["ratio"])
            t.note = (f"{short_by(g, limit('allreduce_geomean'))}; {len(below)} of "
                      f"{len(d['rows'])} "
                      f"sizes below 1.0x, worst {worst['ratio']:.2f}x at "
                      f"{size_str(worst['bytes'])} ({worst['algorithm']})")
        targets.append(t)
    for n in RANKS:
        d = docs.get(n)
        over = " (oversubscribed)" if d is not None and d["config"].get("oversubscribed") else ""
        name = f"Allreduce vs MPI_Allreduce, min over sizes >= 1 MiB, {n} ranks{over}"
        req = f">= {limit('allreduce_large'):.1f}x"
        if d is None:
            targets.append(Target(name, req, note=notes.get(n)))
            continue
        large = [r for r in d["rows"] if r["bytes"] >= TARGETS["allreduce_large"]["bytes"]]
        if not large:
            targets.append(Target(name, req, note="no size >= 1 MiB was run"))
            continue
        worst = min(large, key=lambda r: r["ratio"])
        t = Target(name, req, f"{worst['ratio']:.2f}x at {size_str(worst['bytes'])}",
                   meets("allreduce_large", worst["ratio"]), family="allreduce")
        if not t.ok:
            t.note = (f"{short_by(worst['ratio'], limit('allreduce_large'))}; at "
                      f"{size_str(worst['bytes'])} ({worst['algorithm']}) Tarantella "
                      f"{worst['tnt_busbw']:.2f} GB/s = "
                      f"{worst['tnt_busbw'] / worst['memcpy_gbps'] * 100:.0f}% of memcpy, "
                      f"MPI {worst['mpi_busbw']:.2f} GB/s")
            if d["config"].get("oversubscribed"):
                t.note += "; ranks oversubscribed"
        targets.append(t)
