"""A training step's parts, read from TNT_TIMELINE traces: the steps of each
configuration span, the time waited for and spent in allreduces, when the
largest gradient was ready. Shared by sim_cluster_bench.py and
project_scale.py."""
import json
import statistics


def load_trace(path):
    """The events of a trace file; a file cut short by a crash lacks the
    closing bracket (and may end in a partial line)."""
    text = open(path).read().rstrip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        lines = text.splitlines()
        while lines:
            try:
                return json.loads("\n".join(lines).rstrip().rstrip(",") + "\n]")
            except json.JSONDecodeError:
                lines.pop()
        raise


def union_ms(intervals, lo, hi):
    """Length in ms of the union of [a, b) intervals (µs) clipped to [lo, hi)."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, end = 0.0, lo
    for a, b in clipped:
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total / 1e3


def spans(events, cat, keep_open=False):
    """[(name, begin, end)] of the B/E spans of category `cat`; with
    keep_open, a span a cut-short run never ended lasts to the end."""
    out, open_ = [], {}
    for e in events:
        if e.get("cat") != cat:
            continue
        if e["ph"] == "B":
            open_[e["name"]] = e["ts"]
        elif e["ph"] == "E" and e["name"] in open_:
            out.append((e["name"], open_.pop(e["name"]), e["ts"]))
    if keep_open:
        out += [(name, ts, float("inf")) for name, ts in open_.items()]
    return out


def is_bucket(e):
    """Whether `e` is a fusion bucket's collective: an allreduce, or at ZeRO
    stages a reduce_scatter or allgather, of bucket B."""
    return e["ph"] == "X" and e.get("cat") == "comm" and "bucket" in e.get("args", {})


def breakdown(events, nhosts):
    """Per configuration name: lists of per-step values of one rank."""
    configs = spans(events, "config", keep_open=True)
    steps = spans(events, "step")
    buckets = [(e["ts"], e["ts"] + e["dur"], e["args"]["bytes"]) for e in events
               if is_bucket(e)]
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e["ph"] == "X" and e["name"] == "fusion finish"]
    starts = [(e["ts"], e["args"]["bytes"]) for e in events
              if e["ph"] == "i" and e["name"] == "fusion start"]
    out = {}
    for cname, cb, ce in configs:
        rows = out.setdefault(cname, {"step": [], "wait": [], "comm": [], "bytes": [],
                                      "bus": [], "bus_s": [], "ready": [], "largest": []})
        for _, sb, se in steps:
            if not (cb <= sb and se <= ce):
                continue
            mine = [b for b in buckets if sb <= b[0] < se]
            rows["step"].append((se - sb) / 1e3)
            rows["wait"].append(union_ms(waits, sb, se))
            rows["comm"].append(union_ms([(a, b) for a, b, _ in mine], sb, se))
            rows["bytes"].append(sum(n for _, _, n in mine))
            ready = [(n, t) for t, n in starts if sb <= t < se]
            if ready:
                n, t = max(ready, key=lambda r: (r[0], -r[1]))
                rows["ready"].append((t - sb) / 1e3)
                rows["largest"].append(n)
            for a, b, n in mine:
                rows["bus"].append(2 * (nhosts - 1) / nhosts * n)
                rows["bus_s"].append((b - a) / 1e6)
    return out


def summarize(per_rank, nhosts, link_bps, configs, losses=None):
    """One result row per configuration, (name, fields) of `configs`, from the
    ranks' breakdowns."""
    results = []
    for cname, fields in configs:
        ranks = [b[cname] for b in per_rank if cname in b and b[cname]["step"]]
        if not ranks:
            continue

        def avg_median(key):
            return statistics.fmean(statistics.median(r[key]) for r in ranks)

        step, wait, comm = avg_median("step"), avg_median("wait"), avg_median("comm")
        grad_bytes = int(statistics.median(ranks[0]["bytes"]))
        compute = step - wait
        transfer = 2 * (nhosts - 1) / nhosts * grad_bytes * 8 / link_bps * 1e3
        bound = max(compute, transfer)
        ready = None
        if ranks and all(len(r["ready"]) == len(ranks[0]["ready"]) > 0 for r in ranks):
            # The steps of all ranks, in order: each step's last rank.
            ready = statistics.median(max(t) for t in zip(*(r["ready"] for r in ranks)))
        elif any(r["ready"] for r in ranks):
            ready = max(statistics.median(r["ready"]) for r in ranks if r["ready"])
        reach = None
        if ready is not None:
            largest = statistics.median(ranks[0]["largest"])
            reach = max(compute, ready + 2 * (nhosts - 1) / nhosts * largest * 8 / link_bps * 1e3)
        bus_bytes = sum(sum(r["bus"]) for r in ranks)
        bus_s = sum(sum(r["bus_s"]) for r in ranks)
        results.append(fields | {
            "step_ms": round(step, 3), "compute_ms": round(compute, 3),
            "comm_ms": round(comm, 3), "wait_ms": round(wait, 3),
            "transfer_ms": round(transfer, 3), "bound_ms": round(bound, 3),
            "ratio_to_bound": round(step / bound, 3), "gradient_bytes": grad_bytes,
            "ready_ms": round(ready, 3) if ready is not None else None,
            "reach_ms": round(reach, 3) if reach is not None else None,
            "ratio_to_reach": round(step / reach, 3) if reach else None,
            "allreduce_busbw_gbit": round(bus_bytes * 8 / bus_s / 1e9, 3) if bus_s else None,
            "steps": sum(len(r["step"]) for r in ranks)})
        if losses and cname in losses:
            results[-1]["final_loss"] = round(losses[cname], 5)
    return results
