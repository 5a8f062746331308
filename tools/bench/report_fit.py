"""The report's sections on fit_bench.py: the framework's overhead on one
rank (overhead*.jsonl) and the fusion threshold sweep (fusion_sweep_*.jsonl).
"""
import os

from report_base import (Target, bytes_str, image, limit, load_results, meets, missing_note,
                         not_run_line, open_section, short_by, stage_note, table)
from report_plots import plot_fusion


def spread(values):
    """(min, max) relative to the median, in percent."""
    med = sorted(values)[len(values) // 2]
    return (min(values) / med - 1) * 100, (max(values) / med - 1) * 100


def overhead_section(results, stages, targets):
    out = ["## 2. Framework overhead, 1 rank", ""]
    for fname, model, label in (("overhead.jsonl", "LeNet-5", ""),
                                ("overhead_small_cnn.jsonl", "the small CNN (three "
                                 "convolutions, a 256-unit dense layer, 32x32x3 inputs)",
                                 " (small CNN)")):
        out += _overhead_model(results, stages, targets, fname, model, label)
    return out


def _overhead_model(results, stages, targets, fname, model, label):
    name = f"1-rank step time{label}, tnt.Model.fit vs plain Keras fit"
    req = f"<= +{limit('overhead') * 100:.0f}%"
    out, d = open_section(results, stages, targets, fname, ["overhead"], goals=[(name, req)],
                          label=f"{model}: ", show_config=False)
    if d is None:
        return out
    ratio, cfg = d["ratio_tnt_keras"], d["config"]
    t = Target(name, req, f"{(ratio - 1) * 100:+.1f}%", meets("overhead", ratio - 1),
               family="overhead")
    ms = {r["run"]: r["ms_per_step"] for r in d["runs"]}
    tr = {r["run"]: r["trials_ms"] for r in d["runs"]}
    if not t.ok:
        lo, hi = spread(tr["keras"])
        t.note = (f"{(ratio - 1 - limit('overhead')) * 100:.1f} points over: "
                  f"{ms['tnt']:.2f} vs {ms['keras']:.2f} ms/step "
                  f"(+{ms['tnt'] - ms['keras']:.2f} ms); Keras' own trials spread "
                  f"{lo:+.1f}%..{hi:+.1f}%")
    targets.append(t)
    out.append(f"{model[0].upper() + model[1:]}, batch {cfg['batch']}, {cfg['steps_per_epoch']} "
               f"steps per epoch, median of {cfg['trials']} interleaved trials. Tarantella never "
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
        if name.startswith("fusion_sweep_") and name.endswith(".jsonl"):
            d, _ = load_results(os.path.join(results, name))
            if d is not None:
                sweeps[d["config"]["model"]] = d
    failed = sorted(s for s, st in stages.items()
                    if s.startswith("fusion_sweep_") and st["status"] != "ok")
    if not sweeps:
        note = stage_note(stages, *failed) if failed else missing_note(stages, "no results",
                                                                       "fusion_sweep")
        targets.append(Target("Default fusion threshold vs best threshold (2 ranks)",
                              f"<= {limit('fusion_default'):.2f}x best", note=note))
        return out + [not_run_line([note]), ""]
    any_doc = next(iter(sweeps.values()))["config"]
    default_kb = any_doc["default_threshold_kb"]
    out.append(f"{any_doc['ranks']} ranks, global batch {any_doc['global_batch']}, "
               f"{any_doc['steps_per_epoch']} steps per epoch, median of {any_doc['trials']} "
               "interleaved trials per threshold; step time relative to the best threshold of "
               "the same model. A threshold of 0 gives one bucket per tensor.")
    out.append("")
    for model, d in sweeps.items():
        rows = d["rows"]
        best = min(rows, key=lambda r: r["ms_per_step"])
        dflt = [r for r in rows if r["threshold_kb"] == default_kb]
        name = f"Default fusion threshold ({default_kb:g} KiB) vs best, {model}, " \
               f"{d['config']['ranks']} ranks"
        req = f"<= {limit('fusion_default'):.2f}x best"
        if not dflt:
            targets.append(Target(name, req, note="default threshold not in the sweep"))
            continue
        rel = dflt[0]["ms_per_step"] / best["ms_per_step"]
        t = Target(name, req, f"{rel:.3f}x", meets("fusion_default", rel), family="fusion")
        if not t.ok:
            lo, hi = spread(dflt[0]["trials_ms"])
            t.note = (f"{short_by(rel, limit('fusion_default'), False)}; best "
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
        cfg = d["config"]
        label = f"{model} ({cfg['tensors']}, {bytes_str(cfg['gradient_bytes'])})"
        rows.append([label] + cells)
    out.append(table(header, rows))
    for s in failed:
        out.append(f"\n- {s}: {stage_note(stages, s)}")
    out.append("")
    return out
