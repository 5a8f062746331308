"""The report's section on pipeline_bench.py: the bubble, memory per stage,
capacity under a memory limit and the simulated 2-host cluster
(pipeline_*.jsonl).
"""
import os

from bench_results import TRACES
from report_base import (TARGETS, Target, bytes_str, f2, image, limit, meets, open_section,
                         problem_lines, short_by, table)
from report_plots import (memory_holder, plot_pipeline_bubble, plot_pipeline_memory,
                          plot_pipeline_timeline, step_memory)

ZB_TIMELINE = "pipeline_timeline_zb-h1"  # the traces (and picture) of ZB-H1's step


METHOD = "The method: docs/research/benchmarks.md (Pipeline parallelism)."


def section(results, stages, plt, targets):
    out = ["## 6. Pipeline parallelism", ""]
    out += _pipeline_bubble(results, stages, plt, targets)
    out += _pipeline_memory(results, stages, plt, targets)
    out += _pipeline_capacity(results, stages, targets)
    out += _pipeline_sim(results, stages, targets)
    return out


def _pipeline_bubble(results, stages, plt, targets):
    m = TARGETS["pipeline_bubble"]["micro_batches"]
    name = f"Pipeline step time / ideal K t_alone + (M-1) t_busy, 2 stages, M = {m}"
    req = f"<= {limit('pipeline_bubble'):.2f}x"
    out, d = open_section(results, stages, targets, "pipeline_bubble.jsonl",
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
                       meets("pipeline_bubble", r["ratio_to_ideal"]), family="pipeline")
            t.note = (short_by(r["ratio_to_ideal"], limit("pipeline_bubble"), False) + "; "
                      if not t.ok else "") + detail
        else:
            # With more ranks than cores the stages share cores: shown, not judged.
            t = Target(label, "(for information)", f"{r['ratio_to_ideal']:.3f}x",
                       note=detail + ("; more stages than cores" if over else ""))
        targets.append(t)
    out.append(f"Stages of equal cost ({cfg.get('layers_per_stage', '?')} dense layers of "
               f"{cfg.get('width', '?')} units each), micro-batches of "
               f"{cfg.get('micro_batch', '?')} samples, schedule {cfg.get('schedule', '?')}. "
               "Ideal = K t_alone + (M-1) t_busy (t_alone: a stage's pass on rank 0 alone, "
               "t_busy: while every rank computes one); the GPipe bound (K-1)/(M+K-1) is the "
               f"idle share of an ideal step. {METHOD}")
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
    drawn = plt is not None and plot_pipeline_timeline(plt, results, ZB_TIMELINE, "ZB-H1")
    if drawn or os.path.exists(os.path.join(results, f"{ZB_TIMELINE}.png")):
        out += ["The same step under ZB-H1 (W: the weight gradients, in the bubbles):", "",
                image(f"{ZB_TIMELINE}.png", results), ""]
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
    if any(r.get("oversubscribed") for r in res):
        out += ["", "\\* oversubscribed: more stages (one rank each) than cores."]
    inter = d.get("interleaved", [])
    if inter:
        out += ["", "Interleaved 1F1B: K ranks of v chunks each; ideal = (K t_alone + "
                "(v M - 1) t_busy) / v, bound (K-1)/(v M+K-1).", ""]
        out.append(table(
            ["ranks K", "chunks v", "M", "step ms", "t_alone ms", "t_busy ms", "ideal ms",
             "step / ideal", "interleaved bound", "idle share measured"],
            [[r["ranks"], r["chunks"], r["micro_batches"], f2(r["step_ms"]),
              f2(r["t_stage_ms"]), f2(r.get("t_stage_busy_ms")), f2(r["ideal_ms"]),
              f"{r['ratio_to_ideal']:.3f}", f"{r['interleaved_bound']:.3f}",
              f"{r['measured_idle_share']:.3f}"] for r in inter]))
    zero = d.get("zero_bubble", [])
    if zero:
        one_f_one_b = {(r["ranks"], r["micro_batches"]): r for r in res}
        out += ["", "Zero-bubble schedules (`pipeline_schedule=\"zb-h1\"`, `\"zb-h2\"`, "
                "`\"zbv\"`) on the same layers: K ranks of v chunks (ZBV: 2 chunks in a V), "
                "ideal = (K-1) t_alone / (3 v) + M t_busy (the first micro-batch's forward "
                "through K-1 ranks' first chunks, a third of a chunk's pass as F, B and W "
                "cost alike here, then a slot per micro-batch with every rank computing); "
                "bound: the schedule's idle share with passes of equal cost; beside them "
                "1F1B's measured idle share and step on the same ranks and M.", ""]
        rows = []
        for r in zero:
            ref = one_f_one_b.get((r["ranks"], r["micro_batches"]), {})
            rows.append([r["schedule"], f"{r['ranks']}{' *' if r.get('oversubscribed') else ''}",
                         r.get("chunks", 1),
                         r["micro_batches"], f2(r["step_ms"]), f2(r["t_stage_ms"]),
                         f2(r.get("t_stage_busy_ms")), f2(r["ideal_ms"]),
                         f"{r['ratio_to_ideal']:.3f}", f"{r['zero_bubble_bound']:.3f}",
                         f"{r['measured_idle_share']:.3f}",
                         f2(ref.get("measured_idle_share"), 3), f2(ref.get("step_ms"))])
        out.append(table(["schedule", "ranks K", "chunks v", "M", "step ms", "t_alone ms",
                          "t_busy ms",
                          "ideal ms", "step / ideal", "bound", "idle share measured",
                          "1F1B idle share", "1F1B step ms"], rows))
    out += problem_lines(cfg)
    out.append("")
    return out


def _growth(low, high):
    return "not run" if low is None or high is None else f"{high - low:+.0f} MiB"


def _pipeline_memory(results, stages, plt, targets):
    name = ("Pipeline memory of a step against M, 2 stages: 1F1B flat, GPipe growing "
            "(stage 0)")
    req = (f"1F1B grows < {limit('pipeline_memory_1f1b')} micro-batch, "
           f"GPipe > {limit('pipeline_memory_gpipe')}, from M = 2 to 8")
    out, d = open_section(results, stages, targets, "pipeline_memory.jsonl",
                          ["pipeline_memory", "pipeline"],
                          "### Memory per stage: GPipe, 1F1B, interleaved", [(name, req)])
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
        return step_memory(r) if r else None

    grow = {s: (peak(s, 8), peak(s, 2)) for s in ("1f1b", "gpipe")}
    if per_mb and all(a is not None and b is not None for a, b in grow.values()):
        g1, gg = (grow["1f1b"][0] - grow["1f1b"][1]) / per_mb, \
            (grow["gpipe"][0] - grow["gpipe"][1]) / per_mb
        t = Target(name, req, f"1F1B {g1:+.1f}, GPipe {gg:+.1f} micro-batches",
                   meets("pipeline_memory_1f1b", g1) and meets("pipeline_memory_gpipe", gg),
                   family="pipeline")
        t.note = (f"stage 0, {what}, M = 2 -> 8: 1F1B {grow['1f1b'][1]:.0f} -> "
                  f"{grow['1f1b'][0]:.0f} MiB, GPipe {grow['gpipe'][1]:.0f} -> "
                  f"{grow['gpipe'][0]:.0f} MiB; one micro-batch keeps about {per_mb:.0f} MiB")
        targets.append(t)
    else:
        targets.append(Target(name, req, note="no results for M = 2 and 8 of both schedules"))
    name = ("Interleaved 1F1B memory of a step against M, 2 ranks of 2 chunks: flat once every "
            "chunk is busy (rank 0)")
    req = f"grows < {limit('pipeline_memory_interleaved')} chunk micro-batch from M = 4 to 8"
    per_chunk = cfg.get("interleaved_kept_mib_per_chunk_micro_batch")
    low, high = peak("interleaved", 4), peak("interleaved", 8)
    if per_chunk and low is not None and high is not None:
        g = (high - low) / per_chunk
        # Rank 0 of R = 2 ranks holds at most 2 (R - 1) + (v - 1) R + 1 = 5
        # chunk micro-batches (docs/pipelining.md), whatever M.
        targets.append(Target(name, req, f"{g:+.1f} chunk micro-batches",
                              meets("pipeline_memory_interleaved", g),
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
                meets("pipeline_traced_memory", grew("interleaved")), family="pipeline",
                note=f"the RSS after the warm-up step above the RSS before fit, M = 4 -> 8: "
                     f"interleaved {traced['interleaved'][0]['traced_step_mib']:.0f} -> "
                     f"{traced['interleaved'][1]['traced_step_mib']:.0f} MiB, 1F1B "
                     f"{traced['1f1b'][0]['traced_step_mib']:.0f} -> "
                     f"{traced['1f1b'][1]['traced_step_mib']:.0f} MiB: the traced step's "
                     "passes are unrolled, its graph grows with M"))
    out.append("Two stages, one rank each, a model with large activations and small "
               f"weights, micro-batches of {cfg.get('micro_batch', '?')} samples; peak RSS "
               "(VmHWM) of each rank during the training steps, a fresh job per schedule and "
               f"M. A stage keeps about {per_mb} MiB per micro-batch in flight: GPipe all M, "
               "1F1B at most K - s; an interleaved chunk about "
               f"{cfg.get('interleaved_kept_mib_per_chunk_micro_batch', '?')} MiB. {METHOD}")
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
            rows.append([schedule, memory_holder(schedule, stage)] + cells)
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


def capacity_runs(d):
    """pipeline_capacity.jsonl's runs by name, each with its ranks' rows,
    beside "bitwise equal" and "memory table"."""
    res = {r["run"]: dict(r, ranks=[x for x in d.get("ranks", []) if x["run"] == r["run"]])
           for r in d.get("runs", [])}
    if "bitwise_equal" in d:
        res["bitwise equal"] = d["bitwise_equal"]
    if d.get("memory"):
        res["memory table"] = d["memory"]
    return res


def capacity_verdict(res, budget):
    """(met, detail) of the capacity target from the runs of
    capacity_runs: met when, under a limit below the whole model's weights, serial
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
        name = key.rsplit(", ", 1)[0]
        if run.get("budget_times_weights", budget) != budget:
            name += f" under the base + {run['budget_times_weights']}x"
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
    out, d = open_section(results, stages, targets, "pipeline_capacity.jsonl",
                          ["pipeline_capacity", "pipeline"],
                          "### Capacity: a model whose weights do not fit one process",
                          [(name, "yes"),
                           (CAPACITY_TABLE_TARGET, f"<= {limit('pipeline_capacity_table')}x")])
    if d is None:
        return out
    cfg, res = d.get("config", {}), capacity_runs(d)
    t = Target(name, "yes", family="pipeline")
    t.ok, t.note = capacity_verdict(res, cfg.get("budget_times_weights", "?"))
    t.measured = "yes" if t.ok else "no"
    targets.append(t)
    out.append(f"{cfg.get('layers', '?')} dense layers of {cfg.get('width', '?')} units, "
               f"{cfg.get('stages', '?')} stages, each process limited (RLIMIT_DATA) to what "
               f"it holds before the model is built plus {cfg.get('budget_times_weights', '?')}"
               f"x the whole model's weights (the runs of one layer a stage: plus "
               f"{cfg.get('thin_budget_times_weights', '?')}x); margin = the limit - the peak. "
               f"{METHOD}")
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
        most = limit("pipeline_capacity_table")
        t = Target(CAPACITY_TABLE_TARGET, f"<= {most}x", family="pipeline")
        # The target is the stages' for models that do not fit a rank:
        # with their weight gradients recomputed (serial: one stage).
        judged = [row for row in memory
                  if row["stages"] == 1 or row.get("weight_gradients") == "recompute"]
        ratios = [row["ratio"] for row in judged]
        if judged and None not in ratios:
            t.measured = f"{max(ratios):.2f}x"
            t.ok = all(meets("pipeline_capacity_table", q) for q in ratios)
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
        out.append("The largest rank's peak without a limit against the whole model's need / "
                   "K (2 W with SGD, 4 W with Adam), weight gradients summed (accumulate) or "
                   "recomputed:")
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
    req = f">= {limit('pipeline_sim'):.1f}x"
    out, d = open_section(results, stages, targets, "pipeline_sim_cluster.jsonl",
                          ["pipeline_sim_cluster", "pipeline"],
                          "### Where pipelining wins: 2 simulated hosts at 1 Gbit/s",
                          [(name, req)])
    if d is None:
        return out
    res, cfg = d.get("results", []), d.get("config", {})
    data = next((r for r in res if r["mode"] == "data"), None)
    best = max((r for r in res if r["mode"].startswith("pipeline")),
               key=lambda r: r["samples_per_s"], default=None)
    q = d.get("ratio_pipeline_to_data")
    if q is None:
        problem = (cfg.get("problems") or {}).get("run", "")
        targets.append(Target(name, req, note="no ratio" + (
            f": {problem.strip().splitlines()[-1]}" if problem.strip() else "")))
    else:
        t = Target(name, req, f"{q:.2f}x", meets("pipeline_sim", q), family="pipeline")
        t.note = (f"{best['samples_per_s']:.0f} ({best['mode']}) vs "
                  f"{data['samples_per_s']:.0f} samples/s; "
                  f"{bytes_str(cfg.get('parameter_bytes', 0))} of weights")
        if not t.ok:
            t.note = short_by(q, limit("pipeline_sim")) + "; " + t.note
        targets.append(t)
    out.append(f"Two simulated hosts at 1 Gbit/s, {bytes_str(cfg.get('parameter_bytes', 0))} "
               f"of weights, global batch {cfg.get('global_batch', '?')}: pipelined (2 stages, "
               f"{cfg.get('micro_batches', '?')} micro-batches, each schedule of one stage per "
               "rank, the fastest judged) against data-parallel; the "
               f"gradients' allreduce moves {cfg.get('allreduce_transfer_ms', '?')} ms of "
               f"traffic, the pipeline {cfg.get('pipeline_transfer_ms', '?')} ms. {METHOD}")
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
