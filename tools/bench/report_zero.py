"""The report's section on zero_bench.py: what a rank holds at ZeRO stages
0 to 3, and what sharding lets train under a memory limit (zero.jsonl,
zero_capacity.jsonl).
"""
from report_base import (TARGETS, Target, detail, f2, limit, meets, open_section,
                         problem_lines, short_by, table)
from report_pipeline import MEMORY_ERRORS

METHOD = "The method: docs/research/benchmarks.md (Sharded data parallelism)."
OPTIMIZER_NAMES = {"adam": "Adam", "momentum": "SGD with momentum"}
BUILT_BY_FIT = "built by fit"  # zero_bench.BUILT_BY_FIT: the rows the targets judge
CAPACITY_TARGET = "ZeRO capacity: under a per-rank limit of 2.5 W above the base, stage 0 " \
                  "fails and stage 2 trains"
STAGE3_CAPACITY_TARGET = "ZeRO capacity: under a per-rank limit of 1.75 W above the base, " \
                         "stage 3 trains, predicts and saves"


def memory_target_name(optimizer, stage):
    gathered = " + gathered block" if stage == 3 else ""
    return (f"ZeRO stage {stage}, {OPTIMIZER_NAMES[optimizer]}: peak per rank <= "
            f"{limit('zero_memory')} x theory + fusion buffers{gathered}, N = 1, 2, 4")


def section(results, stages, targets):
    out = ["## 10. Sharded data parallelism (ZeRO): what a rank holds", ""]
    out += _memory(results, stages, targets)
    out += _capacity(results, stages, targets)
    out += _throughput(results, stages, targets)
    out += _sim_throughput(results, stages, targets)
    out += _at_scale(results, stages, targets)
    return out


def _beside(row):
    """What the targets allow beside the theory: the fusion buffers, and at
    stage 3 the largest block of weights gathered at once."""
    return row["fusion_buffers_mib"] + row.get("gathered_block_mib", 0)


def allowed_mib(row):
    return limit("zero_memory") * row["theory_mib"] + _beside(row)


def over_theory(row):
    """The peak beyond the fusion buffers (and the gathered block), in
    theories: what the target compares with its threshold."""
    return (row["peak_above_base_mib"] - _beside(row)) / row["theory_mib"]


def _n(row):
    return f"{row['ranks']}{' *' if row.get('oversubscribed') else ''}"


def _memory(results, stages, targets):
    cases = [(o, s) for o in OPTIMIZER_NAMES for s in (0, 1, 2, 3)]
    required = f"<= {limit('zero_memory')}x"
    out, d = open_section(results, stages, targets, "zero.jsonl", ["zero_memory", "zero"],
                          "### Memory per rank: held bytes and peak against the theory",
                          [(memory_target_name(o, s), required) for o, s in cases])
    if d is None:
        return out
    cfg, rows = d.get("config", {}), d.get("memory", [])
    judged = [r for r in rows if r.get("variant", BUILT_BY_FIT) == BUILT_BY_FIT]
    for optimizer, stage in cases:
        name = memory_target_name(optimizer, stage)
        mine = sorted((r for r in judged if (r["optimizer"], r["zero_stage"]) ==
                       (optimizer, stage)), key=lambda r: r["ranks"])
        if not mine:
            failed = [f"{k}: {v.strip().splitlines()[-1] if v.strip() else '?'}"
                      for k, v in (cfg.get("problems") or {}).items()
                      if k.startswith(f"{optimizer}, ") and f"stage {stage}, " in k]
            targets.append(Target(name, required, note="; ".join(["no result"] + failed)))
            continue
        worst = max(mine, key=over_theory)
        missing = sorted({1, 2, 4} - {r["ranks"] for r in mine})
        ok = all(meets("zero_memory", over_theory(r)) for r in mine) and not missing
        t = Target(name, required, f"{over_theory(worst):.2f}x (N = {_n(worst)})", ok,
                   family="zero")
        over = over_theory(worst) > limit("zero_memory")
        t.note = (short_by(over_theory(worst), limit("zero_memory"), False) + "; "
                  if over else "")
        t.note += "peak / allowed MiB: " + ", ".join(
            f"N = {_n(r)} {r['peak_above_base_mib']:.0f} / {allowed_mib(r):.0f}" for r in mine)
        if missing:
            t.note += f"; no result at N = {', '.join(map(str, missing))}"
        targets.append(t)
    out.append(f"{cfg.get('layers', '?')} dense layers of {cfg.get('width', '?')} units "
               f"(W = {cfg.get('weights_mib', '?')} MiB of float32 weights, P = "
               f"{cfg.get('parameters', '?')} parameters), global batch "
               f"{cfg.get('global_batch', '?')}, a fresh job per row; the rank with the largest "
               "peak of each job. Theory (bytes a parameter): Adam 16, 8 + 8/N, 4 + 12/N; SGD "
               "with momentum 12, 8 + 4/N, 4 + 8/N at stages 0, 1, 2. Fusion buffers, the most "
               "libtnt holds at once: stage 0 the allreduce's buckets (4 P), stage 1 those and "
               "the gather's buckets in flight (8 P), stage 2 its reduce-scatter parts and one "
               "set's buckets in flight (4 P / N + 4 P); none on one rank. Allowed = "
               f"{limit('zero_memory')} x theory + fusion buffers, margin = allowed - peak. "
               "Held: through the variables (weights, the optimizer's variables, the weight "
               "parts that it updates) and the fusion sets (the allreduce's buckets or the "
               "reduce-scatter's parts). The peak (VmHWM above the RSS before the model is "
               "built) is made of what is held, what the first step left beyond it (the traced "
               "step) and a step's own peak above that (gradients as backprop makes them, "
               f"buckets in flight, the optimizer's temporaries). {METHOD}")
    out.append("")
    out.append(table(
        ["optimizer", "N", "stage", "state built", "theory", "fusion", "gathered", "allowed",
         "weights", "gradient buffers", "optimizer state", "weight parts", "held",
         "first step left", "step's own", "peak", "margin",
         "(peak - fusion - gathered) / theory"],
        [[OPTIMIZER_NAMES[r["optimizer"]], _n(r), r["zero_stage"], r.get("variant", "-"),
          f2(r["theory_mib"], 0), f2(r["fusion_buffers_mib"], 0),
          f2(r.get("gathered_block_mib", 0), 0), f2(allowed_mib(r), 0),
          f2(r["held_weights_mib"], 0), f2(r["held_gradient_buffers_mib"], 0),
          f2(r["held_optimizer_state_mib"], 0), f2(r["held_weight_parts_mib"], 0),
          f2(r["held_total_mib"], 0), f2(r["kept_beyond_held_mib"], 0),
          f2(r.get("step_peak_above_kept_mib"), 0), f2(r["peak_above_base_mib"], 0),
          f2(allowed_mib(r) - r["peak_above_base_mib"], 0), f"{over_theory(r):.2f}"]
         for r in rows]))
    out += ["", "MiB per rank. \\* oversubscribed: more ranks than cores (the memory is "
            "measured alike; the steps are slower). Rows \"built before fit\" build the "
            "optimizer with `model.optimizer.build` before `fit` (fit builds it while it "
            "traces the step); the targets judge the rows built by fit."]
    detail("zero.jsonl: every rank", [table(
        ["optimizer", "N", "stage", "state built", "rank", "held", "RSS after the first step",
         "peak", "peak of the first step", "peak of the steps", "peak data size", "step ms"],
        [[r["optimizer"], r["ranks"], r["zero_stage"], r.get("variant", "-"), r["rank"],
          r.get("held_total_mib"), r.get("rss_after_first_step_above_base_mib"),
          r.get("peak_above_base_mib"), r.get("peak_first_step_above_base_mib"),
          r.get("peak_steps_above_base_mib"), r.get("peak_data_above_base_mib"),
          r.get("step_ms")] for r in d.get("ranks", [])])])
    out += problem_lines(cfg)
    out.append("")
    return out


def capacity_verdict(cfg, runs, ranks):
    """(met, detail): met when, limited to the base + 2.5 W at most, stage
    0 fails for lack of memory and stage 2 trains on every rank."""
    said, met = [], True
    for stage in (0, 2):
        run = next((r for r in runs if r["zero_stage"] == stage and r.get("budget_times_weights")),
                   None)
        docs = [d for d in ranks if run is not None and d["run"] == run["run"]]
        errors = "; ".join(d["error"] for d in docs if d.get("error"))
        if run is None:
            said.append(f"stage {stage} not run")
            met = False
        elif stage == 0:
            oom = not run["trained"] and any(w in errors for w in MEMORY_ERRORS)
            said.append("stage 0 trains" if run["trained"] else
                        f"stage 0 fails ({errors[:60]})" if oom else
                        "stage 0 fails, but not for lack of memory: "
                        + (errors[:60] or "its job failed without a result"))
            met = met and oom
        elif run["trained"]:
            margins = ", ".join(f"{d['margin_mib']:+.0f}" for d in docs)
            said.append(f"stage 2 trains (margins {margins} MiB)")
        else:
            said.append(f"stage 2 fails ({errors[:60] or 'its job failed without a result'})")
            met = False
    limit_w = cfg.get("budget_times_weights")
    met = met and limit_w is not None and limit_w <= 2.5
    return met, (f"{cfg.get('ranks', '?')} ranks, W = {cfg.get('weights_mib', '?')} MiB, "
                 f"limit: the base + {limit_w if limit_w is not None else '?'} W; "
                 + "; ".join(said))


def stage3_capacity_verdict(cfg, runs, ranks):
    """(met, detail): met when stage 3, limited to the base + 1.75 W at
    most, trains, predicts and saves on every rank."""
    run = next((r for r in runs if r["zero_stage"] == 3 and r.get("budget_times_weights")),
               None)
    if run is None:
        return False, "stage 3 not run"
    docs = [d for d in ranks if d["run"] == run["run"]]
    limit_w = run["budget_times_weights"]
    done = run["trained"] and len(docs) == cfg.get("ranks") and \
        all(d.get("predicted") and d.get("saved") for d in docs)
    if done:
        said = "stage 3 trains, predicts and saves (margins " + ", ".join(
            f"{d['margin_mib']:+.0f}" for d in docs) + " MiB)"
    else:
        errors = "; ".join(d["error"] for d in docs if d.get("error"))
        said = f"stage 3 fails ({errors[:60] or 'its job failed without a result'})"
    return done and limit_w <= 1.75, (f"{cfg.get('ranks', '?')} ranks, W = "
                                      f"{cfg.get('weights_mib', '?')} MiB, limit: the base + "
                                      f"{limit_w} W; {said}")


def _capacity(results, stages, targets):
    out, d = open_section(results, stages, targets, "zero_capacity.jsonl",
                          ["zero_capacity", "zero"],
                          "### Capacity: what sharding lets train under a memory limit",
                          [(CAPACITY_TARGET, "yes"), (STAGE3_CAPACITY_TARGET, "yes")])
    if d is None:
        return out
    cfg, runs, ranks = d.get("config", {}), d.get("runs", []), d.get("ranks", [])
    t = Target(CAPACITY_TARGET, "yes", family="zero")
    t.ok, t.note = capacity_verdict(cfg, runs, ranks)
    t.measured = "yes" if t.ok else "no"
    targets.append(t)
    t = Target(STAGE3_CAPACITY_TARGET, "yes", family="zero")
    t.ok, t.note = stage3_capacity_verdict(cfg, runs, ranks)
    t.measured = "yes" if t.ok else "no"
    targets.append(t)
    need = cfg.get("need_times_weights", {})
    out.append(f"{cfg.get('layers', '?')} dense layers of {cfg.get('width', '?')} units (W = "
               f"{cfg.get('weights_mib', '?')} MiB), Adam, {cfg.get('ranks', '?')} ranks"
               f"{' (oversubscribed)' if cfg.get('oversubscribed') else ''}, the optimizer "
               "built before fit; each rank limited (RLIMIT_DATA, set before the model is "
               f"built) to its data size then + {cfg.get('budget_times_weights', '?')} W. What "
               f"a rank must hold at once, by arithmetic: stage 0 {need.get('0', '?')} W (the "
               "weights, their gradients, Adam's two moments; the allreduce's buckets, W, "
               f"come on top), stage 2 {need.get('2', '?')} W (the weights, the parts and "
               "their moments, the reduce-scatter's buckets in flight, the zeros its finishes "
               f"are shaped like), stage 3 {need.get('3', '?')} W (the parts, their moments, "
               "the reduce-scatter's parts, three layers gathered, a layer's gradient and its "
               "bucket; limited to the base + "
               f"{cfg.get('stage3_budget_times_weights', '?')} W, built by a function, it also "
               "predicts and saves), TensorFlow's step on top. Margin = the limit - the peak "
               f"data size. {METHOD}")
    out.append("")
    out.append(table(["run", "rank", "trained", "held (MiB)", "peak data above base (MiB)",
                      "margin (MiB)", "error"],
                     [[r["run"], r["rank"], "yes" if r.get("trained") else "no",
                       f2(r.get("held_total_mib"), 1), f2(r.get("peak_data_above_base_mib"), 1),
                       f2(r.get("margin_mib"), 1), (r.get("error") or "")[:80]]
                      for r in ranks]))
    for r in runs:
        if not r.get("job_ok") and r.get("ranks_reported", 0) < cfg.get("ranks", 0):
            said = [line for line in (r.get("tail") or "").splitlines() if line.strip("- ")]
            out.append(f"\n- {r['run']}: {r['ranks_reported']} of {cfg.get('ranks')} ranks "
                       f"reported ({said[-1].strip() if said else 'no output'})")
    out.append("")
    return out


def _worst_case(name, required, key, cases, ratios):
    """The throughput target `name` (bench/targets.toml's `key`) judged on
    the worst of `ratios` ({case: a stage's throughput over stage 0's}); not
    run while a case of `cases` has none."""
    t = Target(name, required, family="zero")
    missing = [c for c in cases if c not in ratios]
    if missing or not cases:
        t.note = "no result for " + (", ".join(missing) or "any model")
    else:
        worst = min(ratios, key=ratios.get)
        t.measured = f"{ratios[worst]:.2f}x ({worst})"
        t.ok = meets(key, ratios[worst])
        t.note = ", ".join(f"{c} {v:.2f}x" for c, v in sorted(ratios.items()))
    return t


# The throughput target of each sharded stage (bench/targets.toml).
THROUGHPUT_TARGET = {1: "zero_throughput", 2: "zero_throughput", 3: "zero3_throughput"}


def throughput_goals(where, stages=(1, 2, 3)):
    """(name, required, target key) of the throughput targets of `stages`
    on `where`."""
    goals = []
    for s in stages:
        required = f">= {limit(THROUGHPUT_TARGET[s])}x"
        goals.append((f"ZeRO stage {s}: throughput {required} stage 0's (each model, {where})",
                      required, THROUGHPUT_TARGET[s]))
    return goals


def _throughput(results, stages, targets):
    goals = throughput_goals("2 ranks")
    out, d = open_section(results, stages, targets, "zero_throughput.jsonl",
                          ["zero_throughput", "zero"],
                          "### Throughput against stage 0", [g[:2] for g in goals])
    if d is None:
        return out
    rows = {(r["model"], r["framework"]): r for r in d.get("results", [])}
    models = sorted({m for m, _ in rows})
    ratios = {}
    for model in models:
        base = rows.get((model, "tarantella"))
        for stage in (1, 2, 3):
            mine = rows.get((model, f"tarantella-zero{stage}"))
            if base and mine:
                ratios[model, stage] = (mine["median_samples_per_s"]
                                        / base["median_samples_per_s"])
    for (name, required, key), stage in zip(goals, (1, 2, 3)):
        targets.append(_worst_case(name, required, key, models,
                                   {m: r for (m, s), r in ratios.items() if s == stage}))
    out.append("tools/bench/train_compare.py's models (LeNet-5 on Fashion-MNIST, the "
               "Transformer encoder, a dense stack of 4 layers of 1024 units) on 2 ranks of "
               "this host, SGD with momentum, the runs of a model interleaved; median step of "
               f"the timed section, every run's ranks checked to agree. {METHOD}")
    out.append("")
    out.append(table(["model", "parameters", "stage 0 samples/s", "stage 1", "stage 2",
                      "stage 3", "stage 1 / 0", "stage 2 / 0", "stage 3 / 0"],
                     [[m, rows.get((m, "tarantella"), {}).get("params", "-")]
                      + [f2(rows.get((m, fw), {}).get("median_samples_per_s"), 1)
                         for fw in ("tarantella", "tarantella-zero1", "tarantella-zero2",
                                    "tarantella-zero3")]
                      + [f2(ratios.get((m, s)), 2) for s in (1, 2, 3)] for m in models]))
    out.append("")
    return out


def _sim_throughput(results, stages, targets):
    goals = throughput_goals("2 simulated hosts")
    out, d = open_section(results, stages, targets, "sim_cluster_zero.jsonl",
                          ["sim_cluster_zero"],
                          "### Throughput against stage 0 on 2 simulated hosts",
                          [g[:2] for g in goals])
    if d is None:
        return out
    rows = d.get("results", [])
    for (name, required, target), stage in zip(goals, (1, 2, 3)):
        key = f"stage{stage}_over_stage0"
        targets.append(_worst_case(name, required, target,
                                   [f"{r['model']} {r['link']}" for r in rows],
                                   {f"{r['model']} {r['link']}": r[key] for r in rows
                                    if r.get(key)}))
    out.append("The same models on 2 hosts of one rank each (network namespaces, links shaped "
               "by tc; tools/research/sim_cluster_bench.py --zero), global batch "
               f"{d.get('config', {}).get('global_batch', '?')}; throughput over stage 0's = "
               f"stage 0's median step / the stage's. {METHOD}")
    out.append("")
    out.append(table(["link", "model", "stage 0 ms", "stage 1 ms", "stage 2 ms", "stage 3 ms",
                      "stage 1 / 0", "stage 2 / 0", "stage 3 / 0"],
                     [[r["link"], r["model"]]
                      + [f2(r.get(f"{fw}_step_ms"), 1) for fw in
                         ("tarantella", "tarantella-zero1", "tarantella-zero2",
                          "tarantella-zero3")]
                      + [f2(r.get(f"stage{s}_over_stage0"), 2) for s in (1, 2, 3)]
                      for r in rows]))
    out += problem_lines(d.get("config", {}))
    out.append("")
    return out


def _at_scale_goal(key, model):
    spec = TARGETS[key]
    return (f"at scale: {model} zero_stage {spec['zero_stage']}, projected E({spec['hosts']}), "
            f"{spec['gbit']:g} Gbit/s", f">= {limit(key):.2f}")


def _at_scale(results, stages, targets):
    goals = [("zero_at_scale_resnet", "resnet50"), ("zero_at_scale_gpt", "gpt1.3b")]
    out, d = open_section(results, stages, targets, "scale_zero_projection.jsonl", ["scale"],
                          "### At scale: ResNet-50 and a 1.3 B GPT, projected",
                          [_at_scale_goal(k, m) for k, m in goals])
    if d is None:
        return out
    rows = d.get("results", [])
    for key, model in goals:
        name, required = _at_scale_goal(key, model)
        spec = TARGETS[key]
        rows_none = [r for r in rows if r.get("compression", "none") == "none"]
        mine = [r for r in rows_none if r["model"] == model and r["hosts"] == spec["hosts"]
                and r["gbit"] == spec["gbit"] and r["zero_stage"] == spec["zero_stage"]]
        if not mine:
            targets.append(Target(name, required, note=f"no projection at {spec['hosts']} hosts"))
            continue
        worst = min(mine, key=lambda r: r["E"])
        faster = [r for r in rows_none if r["model"] == model and r["hosts"] == spec["hosts"]
                  and r["gbit"] != spec["gbit"] and r["zero_stage"] == spec["zero_stage"]
                  and r["device"] == worst["device"]]
        note = f"{worst['device']}" + "".join(f"; at {r['gbit']:g} Gbit/s {r['E']:.3f}"
                                              for r in faster)
        targets.append(Target(name, required, f"{worst['E']:.3f}", meets(key, worst["E"]),
                              family="scale", note=note))
    out.append("Each model's gradients ready when its measured timeline says (2 ranks here, "
               "stage 0), stretched to a published device's step, in fusion buckets of "
               f"{d.get('config', {}).get('bucket_bytes', 0) / 2**20:.0f} MiB; each bucket's "
               "allreduce, reduce-scatter or allgather timed by libtnt simulated on the "
               "fat-tree (one rank a host); E(N) = compute / step. Stages 1 and 2 gather the "
               "updated parts after the update, stage 3 before the forward pass, neither "
               "overlapped (`tools/research/project_zero.py`, which cites the step times).")
    out.append("")
    cases = sorted({(r["model"], r["device"], r["gbit"], r["hosts"]) for r in rows})
    by = {(r["model"], r["device"], r["gbit"], r["hosts"], r["zero_stage"],
           r.get("compression", "none")): r for r in rows}

    def e(case, stage, compression="none", key="E"):
        r = by.get(case + (stage, compression))
        return "-" if r is None or r.get(key) is None else f2(r[key], 3)

    out.append("E with bf16: the gradients in 16 bits (TNT_COMPRESSION=bf16), the gathered "
               "weights whole. Gather hidden: the bound of stage 2 with a gather that "
               "overlapped the forward pass (not built: a layer-at-a-time gather).")
    out.append("")
    out.append(table(["model", "device", "Gbit/s", "hosts", "compute ms", "stage 0 step ms",
                      "E stage 0", "E stage 1", "E stage 2", "E stage 3", "E stage 0, bf16",
                      "E stage 2, bf16", "E stage 2, gather hidden"],
                     [[m, dev, f"{g:g}", h, f2(by[(m, dev, g, h, 0, "none")]["compute_ms"], 1),
                       f2(by[(m, dev, g, h, 0, "none")]["step_ms"], 1)]
                      + [e((m, dev, g, h), s) for s in (0, 1, 2, 3)]
                      + [e((m, dev, g, h), s, "bf16") for s in (0, 2)]
                      + [e((m, dev, g, h), 2, key="E_gather_behind_forward")]
                      for m, dev, g, h in cases]))
    out.append("")
    return out
