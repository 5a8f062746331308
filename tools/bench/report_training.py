"""The report's section on train_compare.py: training throughput against
other frameworks (training.jsonl).
"""

from report_base import Target, f2, image, limit, meets, open_section, short_by, table
from report_plots import FRAMEWORK_ORDER, plot_training


def section(results, stages, plt, targets):
    out, d = open_section(
        results, stages, targets, "training.jsonl", ["training"],
        "## 4. Training throughput against other frameworks",
        [("2-rank throughput vs MWMS, per model", f">= {limit('training_mwms'):.1f}x"),
         ("2-rank throughput vs Horovod, per model (where it builds)",
          f">= {limit('training_horovod'):.1f}x")])
    if d is None:
        return out
    res, errors = d.get("results", []), d["config"].get("errors") or {}
    models = sorted({r["model"] for r in res})

    def pick(model, fw, n):
        hit = [r for r in res if (r["model"], r["framework"], r["ranks"]) == (model, fw, n)]
        return hit[0] if hit else None

    ratio_rows = []
    for model in models or ["(no model)"]:
        tnt = pick(model, "tarantella", 2)
        for peer, label in (("mwms", "MWMS"), ("horovod", "Horovod")):
            need = limit(f"training_{peer}")
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
            t = Target(name, req, f"{q:.2f}x", meets(f"training_{peer}", q), family="training")
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
