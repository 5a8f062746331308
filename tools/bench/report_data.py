"""The report's section on data_bench.py: input-bound training with each
rank preparing its share of the data (data_share.jsonl).
"""

from report_base import Target, limit, meets, open_section, short_by, table


def section(results, stages, targets):
    """Each rank prepares only its share of the input, and input-bound jobs
    are not slower than plain Keras (data_bench.py)."""
    planned = []
    for job in ("matmul", "augment"):
        data_targets(job, None, planned)
    goals = [(t.name, t.required) for t in planned]
    out, d = open_section(results, stages, targets, "data_share.jsonl", ["data_share"],
                          "## 7. Each rank prepares only its share of the data", goals=goals,
                          show_config=False)
    if d is None:
        return out
    d, jobs = d["config"], jobs_of(d)
    rounds = " ".join(f"{r[0]:.2f}" for r in d["load_average_rounds"])
    out.append(f"Global batch {d['global_batch']}; sharing on and whole alternate in one "
               f"process ({d['trials']} trials each, median), serial Keras and each rank count "
               f"interleaved in {d['rounds']} round(s), median over the rounds; input CPU: "
               "the epochs after the first of one iterator (the first's in brackets); on / "
               "whole: the largest rank's against the mean of whole. Load average (1 min) at "
               f"the start and after each round: {rounds} ({d['cpus']} cores). Command: "
               f"`{d['command']}`. The method: docs/research/data-sharing.md.")
    out.append("")
    for job, j in jobs.items():
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
    return out


def jobs_of(d):
    """Per job of data_share.jsonl: what it is, its serial run, its runs
    and its ratios by rank count."""
    return {job: dict(spec, serial=next(r for r in d["serial"] if r["job"] == job),
                      runs=[r for r in d["runs"] if r["job"] == job],
                      ratios={str(r["ranks"]): r for r in d["ratios"] if r["job"] == job})
            for job, spec in d["config"]["jobs"].items()}


def data_targets(job, j, targets, note=None):
    """The targets of one job of the data stage (None: not run)."""
    ratios = {} if j is None else j["ratios"]
    spec = [(f"Input ({job}): 1 rank epoch / plain Keras", "1", "epoch_share_vs_serial",
             "data_one_rank", limit("data_one_rank")),
            (f"Input ({job}): 2 ranks epoch / plain Keras", "2", "epoch_share_vs_serial",
             "data_two_ranks", limit("data_two_ranks"))]
    spec += [(f"Input ({job}): {n} ranks input CPU per rank / whole", n,
              "input_cpu_share_vs_whole", "data_cpu", most)
             for n, most in limit("data_cpu").items()]
    for name, ranks, field, key, most in spec:
        if ranks not in ratios:
            targets.append(Target(name, f"<= {most:.2f}", note=note or "not measured"))
            continue
        v = ratios[ranks][field]
        ok = meets(key, v, most)
        targets.append(Target(name, f"<= {most:.2f}", f"{v:.2f}", ok,
                              "" if ok else short_by(v, most, False), family="data"))
