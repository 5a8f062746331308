"""The benchmark report (tools/bench/report.py) on small hand-made results
files (tools/bench/bench_results.py): every target gets PASS, MISS, FAILED
or NOT RUN as its figures say, and missing stages do not stop the report."""
import os
import subprocess
import sys

from conftest import ROOT, load_module

REPORT = os.path.join(ROOT, "tools", "bench", "report.py")
bench_results = load_module("tools/bench/bench_results.py")


def collective(path, coll, ranks, ratios, oversubscribed=False):
    rows = []
    for i, q in enumerate(ratios):
        b = 4096 << (2 * i)
        rows.append({"bytes": b, "algorithm": "shm" if coll == "allreduce" else "auto",
                     "tnt_us": 10.0, "tnt_algbw": q, "tnt_busbw": q, "mpi_us": 10.0 * q,
                     "mpi_algbw": 1.0, "mpi_busbw": 1.0, "ratio": q, "memcpy_gbps": 50.0,
                     "iters": 5, "ok": True})
    geo = 1.0
    for q in ratios:
        geo *= q
    write(path, {"config": {"collective": coll, "ranks": ranks, "dtype": "float32", "hosts": 1,
                            "max_ranks_per_host": ranks, "cores_per_host": 2,
                            "oversubscribed": oversubscribed},
                 "rows": rows, "min_ratio": min(ratios), "geomean_ratio": geo ** (1 / len(ratios))})


def write(path, doc):
    bench_results.write_results(path, os.path.basename(path), doc)


def report(results):
    proc = subprocess.run([sys.executable, REPORT, "--results", str(results), "--quick"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return (results / "summary.md").read_text()


def target_row(summary, start):
    rows = [line for line in summary.splitlines() if line.startswith("| " + start)]
    assert rows, f"no target row starting with {start!r} in\n{summary}"
    return rows[0]


def test_report_states_every_target(tmp_path):
    # sizes 4K, 16K, 64K, 256K, 1M, 4M: the two largest are >= 1 MiB
    collective(tmp_path / "collectives_allreduce_2ranks.jsonl", "allreduce", 2,
               [2.0, 2.0, 2.0, 2.0, 1.5, 1.4])
    collective(tmp_path / "collectives_allreduce_4ranks.jsonl", "allreduce", 4,
               [2.0, 2.0, 2.0, 2.0, 1.1, 1.4], oversubscribed=True)
    write(tmp_path / "overhead.jsonl", {
        "config": {"model": "lenet5", "ranks": 1, "batch": 64, "steps_per_epoch": 64,
                   "trials": 3},
        "runs": [{"run": "keras", "ms_per_step": 10.0, "trials_ms": [10.0, 9.9, 10.1]},
                 {"run": "keras_auto", "ms_per_step": 11.0, "trials_ms": [11.0] * 3},
                 {"run": "tnt", "ms_per_step": 10.5, "trials_ms": [10.5] * 3}],
        "ratio_tnt_keras": 1.05, "ratio_tnt_keras_auto": 10.5 / 11.0})
    write(tmp_path / "fusion_sweep_deep_mlp.jsonl", {
        "config": {"model": "deep_mlp", "ranks": 2, "global_batch": 64, "steps_per_epoch": 64,
                   "trials": 3, "default_threshold_kb": 32, "tensors": 50,
                   "gradient_bytes": 1926184},
        "rows": [{"threshold_kb": k, "ms_per_step": t, "trials_ms": [t] * 3}
                 for k, t in ((0.0, 11.0), (32.0, 10.1), (1024.0, 10.0))]})
    res = [{"model": "m", "framework": fw, "ranks": n, "oversubscribed": False,
            "global_batch": 64 * n, "samples_per_s": sps, "step_ms": 64 * n / sps * 1e3,
            "efficiency": None}
           for fw, n, sps in (("tarantella", 1, 100.0), ("tarantella", 2, 150.0),
                              ("mwms", 1, 100.0), ("mwms", 2, 100.0))]
    write(tmp_path / "training.jsonl", {
        "config": {"quick": True, "errors": {"horovod": "horovod is not installed"}},
        "results": res})
    os.makedirs(tmp_path / "logs")
    (tmp_path / "logs" / "stages.tsv").write_text(
        "stage\tstatus\trc\tseconds\tlog\n"
        "sim_cluster\ttimeout\t124\t900\tlogs/sim_cluster.log\n")

    summary = report(tmp_path)

    assert "| PASS |" in target_row(summary, "Allreduce vs MPI_Allreduce, geomean over sizes, 2")
    assert "1.40x at 4 MiB | PASS" in target_row(summary, "Allreduce vs MPI_Allreduce, min "
                                                          "over sizes >= 1 MiB, 2 ranks")
    row = target_row(summary, "Allreduce vs MPI_Allreduce, min over sizes >= 1 MiB, 4 ranks "
                              "(oversubscribed)")
    assert "1.10x at 1 MiB | **MISS**" in row and "0.20x short" in row
    row = target_row(summary, "1-rank step time")
    assert "+5.0%" in row and "**MISS**" in row and "2.0 points over" in row
    assert "| PASS |" in target_row(summary, "Default fusion threshold")
    assert "1.50x | PASS" in target_row(summary, "2-rank throughput vs MWMS, m")
    row = target_row(summary, "2-rank throughput vs Horovod, m")
    assert "N/A" in row and "horovod is not installed" in row
    row = target_row(summary, "Simulated cluster")
    assert "**FAILED**" in row and "stage timeout" in row
    # each missed kind of target gets its next step, and only those
    closing = summary.split("### What would close the misses", 1)[1].split("\n## ", 1)[0]
    assert "- **allreduce**:" in closing and "- **overhead**:" in closing
    assert "**training**" not in closing and "**fusion**" not in closing
    # the stages without results are reported, not fatal, with the stage to run
    assert ("### broadcast vs MPI_Bcast\n\nNot run: no results; run "
            "`make bench STAGES=collectives`.") in summary


def test_report_without_any_results(tmp_path):
    summary = report(tmp_path)
    assert "NOT RUN" in summary and "PASS" not in summary
    assert "What would close the misses" not in summary
    # each target names the stage that writes its results
    assert "run `make bench STAGES=scale`" in target_row(summary, "at scale: projected")
    assert "run `make bench STAGES=fusion`" in target_row(summary, "Default fusion threshold")
    assert "run `make bench STAGES=zero`" in target_row(summary, "ZeRO capacity")


def test_report_pipeline_section(tmp_path):
    bubble = [{"stages": k, "ranks": k, "chunks": 1, "micro_batches": m, "micro_batch": 64,
               "global_batch": 64 * m,
               "oversubscribed": k == 3, "step_ms": 10.0 * q * (m + k - 1),
               "t_stage_ms": 10.0, "ideal_ms": 10.0 * (m + k - 1), "ratio_to_ideal": q,
               "fit_ratios": [q, q], "ratio_of_minima": q, "gpipe_bound": (k - 1) / (m + k - 1),
               "measured_idle_share": 0.2, "steps": 20}
              for k, q in ((2, 1.10), (3, 1.40)) for m in (1, 2, 4, 8)]
    interleaved = [{"stages": 4, "ranks": 2, "chunks": 2, "micro_batches": m, "step_ms": 30.0,
                    "t_stage_ms": 10.0, "t_stage_busy_ms": 12.0, "ideal_ms": 25.0,
                    "ratio_to_ideal": 1.2, "interleaved_bound": 1 / (2 * m + 1),
                    "measured_idle_share": 0.1} for m in (4, 8)]
    zero_bubble = [{"schedule": s, "stages": 2, "ranks": 2, "chunks": 1, "micro_batches": m,
                    "step_ms": 20.0, "t_stage_ms": 10.0, "t_stage_busy_ms": 12.0,
                    "ideal_ms": 19.0, "ratio_to_ideal": 1.05,
                    "zero_bubble_bound": 1 / (3 * m + 1), "measured_idle_share": 0.05}
                   for s in ("zb-h1", "zb-h2") for m in (4, 8)]
    zero_bubble += [{"schedule": "zbv", "stages": 4, "ranks": 2, "chunks": 2, "micro_batches": 8,
                     "step_ms": 18.0, "t_stage_ms": 10.0, "t_stage_busy_ms": 12.0,
                     "ideal_ms": 17.0, "ratio_to_ideal": 1.06, "zero_bubble_bound": 1 / 49,
                     "measured_idle_share": 0.03}]
    write(tmp_path / "pipeline_bubble.jsonl", {"config": {"quick": True}, "results": bubble,
                                               "interleaved": interleaved,
                                               "zero_bubble": zero_bubble})
    # The traced step grows 10 MiB per micro-batch; what a step holds above
    # it is the schedule's: the targets judge the latter.
    memory = [{"schedule": s, "micro_batches": m, "stage": st, "peak_rss_mib": 600.0 + grow,
               "peak_above_base_mib": grow + 10.0 * m, "rss_before_fit_mib": 500.0,
               "traced_step_mib": 10.0 * m, "step_above_traced_mib": grow}
              for s, ms in (("gpipe", (1, 2, 4, 8)), ("1f1b", (1, 2, 4, 8)),
                            ("interleaved", (2, 4, 8)))
              for m in ms for st in (0, 1)
              for grow in [40.0 * (m if s == "gpipe" else min(m, 2 - st))]]
    write(tmp_path / "pipeline_memory.jsonl", {
        "config": {"kept_activations_mib_per_micro_batch": 40.0,
                   "interleaved_kept_mib_per_chunk_micro_batch": 24.0}, "results": memory})
    os.makedirs(tmp_path / "logs")
    (tmp_path / "logs" / "stages.tsv").write_text(
        "stage\tstatus\trc\tseconds\tlog\n"
        "pipeline_sim_cluster\tnot run\t-\t0\tneeds root (network namespaces, tc)\n")

    summary = report(tmp_path)

    row = target_row(summary,
                     "Pipeline step time / ideal K t_alone + (M-1) t_busy, 2 stages, M = 8")
    assert "1.100x | PASS" in row
    row = target_row(summary, "Pipeline step time / ideal K t_alone + (M-1) t_busy, 3 stages "
                              "(oversubscribed)")
    assert "1.400x | N/A" in row
    row = target_row(summary, "Pipeline memory of a step against M")
    assert "1F1B +0.0, GPipe +6.0 micro-batches | PASS" in row
    row = target_row(summary, "Interleaved 1F1B memory of a step against M")
    assert "+0.0 chunk micro-batches | PASS" in row
    row = target_row(summary, "Traced step's memory against M")
    assert "+40.0 MiB | N/A" in row and "interleaved 40 -> 80 MiB" in row
    row = target_row(summary, "Pipelined / data-parallel throughput")
    assert "NOT RUN" in row and "needs root" in row
    assert "## 6. Pipeline parallelism" in summary
    assert "| 2 | 2 | 8 | 30.00 | 10.00 | 12.00 | 25.00 | 1.200 | 0.059 | 0.100 |" in summary
    # Each zero-bubble row beside 1F1B's on the same ranks and M.
    assert ("| zb-h1 | 2 | 1 | 8 | 20.00 | 10.00 | 12.00 | 19.00 | 1.050 | 0.040 | 0.050 "
            "| 0.200 | 99.00 |") in summary
    # ZBV's 4 stages on 2 ranks, beside 1F1B's on the same 2 ranks.
    assert ("| zbv | 2 | 2 | 8 | 18.00 | 10.00 | 12.00 | 17.00 | 1.060 | 0.020 | 0.030 "
            "| 0.200 | 99.00 |") in summary


def test_report_data_share_section(tmp_path):
    def run(job, n, share, epoch, cpu):
        return {"job": job, "ranks": n, "share": share, "epoch_s": epoch,
                "epoch_s_rounds": [epoch] * 3, "input_cpu_s": [cpu] * n, "rows": [2048 // n] * n}

    def ratios(job, n, cpu, epoch_vs_whole, epoch_vs_serial):
        return {"job": job, "ranks": n, "input_cpu_share_vs_whole": cpu,
                "epoch_share_vs_whole": epoch_vs_whole, "epoch_share_vs_serial": epoch_vs_serial}
    jobs = ("matmul", "augment")  # augment: 1 rank slower than plain Keras
    write(tmp_path / "data_share.jsonl", {
        "config": {"global_batch": 64, "trials": 2, "rounds": 3, "cpus": 2,
                   "load_average_rounds": [[1.5, 1, 1], [2.5, 1, 1]], "command": "data_bench.py",
                   "jobs": {job: {"what": "a job", "whole": "TNT_DATA_SHARE=0"} for job in jobs}},
        "serial": [{"job": job, "epoch_s": 0.5, "epoch_s_rounds": [0.5] * 3, "input_cpu_s": [0.4],
                    "rows": [2048]} for job in jobs],
        "runs": [run(job, *r) for job in jobs
                 for r in ((1, True, 0.51, 0.4), (1, False, 0.5, 0.4), (2, True, 0.3, 0.25),
                           (2, False, 0.6, 0.5))],
        "ratios": [ratios(job, 1, 1.0, 1.02, 1.02 if job == "matmul" else 1.1) for job in jobs]
        + [ratios(job, 2, 0.5, 0.5, 0.6) for job in jobs]})
    summary = report(tmp_path)
    section = summary[summary.index("## 7. Each rank prepares only its share"):]
    assert "| 2 | on | 0.300 | 0.300, 0.300, 0.300 | 0.250, 0.250 | 0.50 | 0.60 |" in section
    assert "after each round: 1.50 2.50 (2 cores)" in section
    assert "| 1.02 | PASS" in target_row(summary, "Input (matmul): 1 rank epoch / plain Keras")
    assert "| 1.10 | **MISS**" in target_row(summary, "Input (augment): 1 rank epoch / plain Keras")
    assert "| 0.50 | PASS" in target_row(summary, "Input (matmul): 2 ranks input CPU per rank")
    assert "NOT RUN" in target_row(summary, "Input (matmul): 4 ranks input CPU per rank")
    empty = report(tmp_path / "empty")
    assert "Not run: no results; run `make bench STAGES=data_share`." in empty.split("## 7.")[1]
    assert "NOT RUN" in target_row(empty, "Input (augment): 2 ranks epoch / plain Keras")


def test_report_sim_allreduce_section(tmp_path):
    rows = []
    for hosts, per_host, ratio, share in ((2, 1, 1.2, 0.85), (2, 2, 0.9, 0.95)):
        for b in (4096, 4 << 20):
            rows.append({"hosts": hosts, "ranks_per_host": per_host, "link": "1gbit_0.1ms",
                         "link_gbit": 1.0, "link_share": share if b >= 4 << 20 else 0.1,
                         "bytes": b, "algorithm": "ring", "tnt_us": 10.0, "tnt_algbw": 0.1,
                         "tnt_busbw": 0.1, "mpi_us": 12.0, "mpi_algbw": 0.08,
                         "mpi_busbw": 0.08, "ratio": ratio, "memcpy_gbps": 5.0, "iters": 5,
                         "ok": True})
            rows[-1]["tcp_share"] = round(rows[-1]["link_share"] / 0.95, 4)
    write(tmp_path / "sim_cluster_allreduce.jsonl",
          {"config": {"load_average_at_start": 1.0,
                      "tcp_gbit": {"2x1_1gbit_0.1ms": 0.95, "2x2_1gbit_0.1ms": 0.95}},
           "results": rows})
    summary = report(tmp_path)
    mpi = "Allreduce across simulated hosts: busbw / MPI_Allreduce, every size"
    link = "Allreduce across simulated hosts: share of the link at >= 4 MiB"
    assert "| 1.20 | PASS" in target_row(summary, f"{mpi} (2x1, 1gbit_0.1ms)")
    assert "| 0.90 | **MISS**" in target_row(summary, f"{mpi} (2x2, 1gbit_0.1ms)")
    assert "| 0.85 | **MISS**" in target_row(summary, f"{link} (2x1, 1gbit_0.1ms)")
    assert ("0.89 of what TCP alone carries there (0.95 Gbit/s)"
            in target_row(summary, f"{link} (2x1, 1gbit_0.1ms)"))
    assert "| 0.95 | PASS" in target_row(summary, f"{link} (2x2, 1gbit_0.1ms)")
    assert "| 2x1 | 1gbit_0.1ms | 4 MiB | ring | 0.100 | 0.080 | 1.20 | 0.85 | 0.89 |" in summary
    assert "| 2x2 | 1gbit_0.1ms | 4 MiB | ring | 0.100 | 0.080 | 0.90 | 0.95 | 1.00 |" in summary
    closing = summary.split("### What would close the misses", 1)[1].split("\n## ", 1)[0]
    assert "- **sim_allreduce**:" in closing


def capacity_result(serial_error, whole_error, fn_errors, equal=True, more=()):
    """pipeline_capacity.jsonl: under the limit, serial Keras failing with
    `serial_error` (None: it trains), 4 stages given the model built failing
    with `whole_error`, and 4 stages given its build function failing with
    `fn_errors` per rank (None: the rank trains); `equal`: their weights
    equal the unlimited run's; `more`: (name, run, ranks) of further runs."""
    runs, ranks = [], []

    def run(name, errors):
        for rank, error in enumerate(errors):
            doc = {"run": name, "rank": rank, "weights_mib": 128.1, "limit_above_base_mib": 115.3}
            if error is None:
                doc.update(trained=True, held_weights_mib=32.0, peak_data_above_base_mib=70.0,
                           margin_mib=45.0 - 10 * rank)
            else:
                doc.update(trained=False, error=error)
            ranks.append(doc)
        runs.append({"run": name, "job_ok": all(e is None for e in errors),
                     "trained": all(e is None for e in errors), "tail": ""})
    run("serial, limited", [serial_error])
    run("4 stages, built whole, limited", [whole_error] * 4)
    run("4 stages, build_fn, SGD, limited", fn_errors)
    run("4 stages, build_fn, SGD momentum, limited", [None] * 4)
    run("4 stages, built whole, SGD, no limit", [None] * 4)
    for name, r, rank_rows in more:
        runs.append(dict(r, run=name))
        ranks.extend(dict(d, run=name) for d in rank_rows)
    return {"config": {"budget_times_weights": 0.9, "stages": 4}, "runs": runs, "ranks": ranks,
            "bitwise_equal": equal}


def test_report_capacity_target(tmp_path):
    name = "Under a memory limit below the model's weights, only stages built by a function train"
    oom = "ResourceExhaustedError: OOM when allocating tensor with shape[2048,2048]"
    fine = [None] * 4
    cases = [
        # serial and the model built whole fail for lack of memory, the
        # stages built by a function train and end equal: met
        (oom, oom, fine, True, "| yes | PASS |",
         ["serial fails (ResourceExhaustedError: OOM", "built whole fails (Resource",
          "build_fn, SGD trains (margins +45, +35, +25, +15 MiB)",
          "weights equal the unlimited run's", "+ 0.9x the whole model's weights"]),
        # a stage built by a function runs out of memory too
        (oom, oom, [None, "MemoryError: std::bad_alloc", None, None], True,
         "| no | **MISS** |", ["build_fn, SGD fails (MemoryError"]),
        # serial failing for another reason does not show the limit works
        ("ValueError: bad input", oom, fine, True, "| no | **MISS** |",
         ["serial fails, but not for lack of memory: ValueError"]),
        # the model built whole training under the limit: the limit is too loose
        (oom, None, fine, True, "| no | **MISS** |", ["built whole trains"]),
        # trained, but not to the same weights
        (oom, oom, fine, False, "| no | **MISS** |", ["weights differ from the unlimited"]),
    ]
    for serial_error, whole_error, fn_errors, equal, verdict, details in cases:
        write(tmp_path / "pipeline_capacity.jsonl",
              capacity_result(serial_error, whole_error, fn_errors, equal))
        row = target_row(report(tmp_path), name)
        assert verdict in row, row
        for detail in details:
            assert detail in row, (detail, row)


def test_report_sim_frameworks_and_weak_scaling(tmp_path):
    write(tmp_path / "sim_cluster_frameworks.jsonl", {
        "config": {"global_batch": 64, "mwms": "MWMS"},
        "results": [{"link": "10gbit_0.1ms", "model": "lenet5", "tarantella_step_ms": 25.0,
                     "mwms_step_ms": 55.0, "ratio": 2.2},
                    {"link": "1gbit_0.1ms", "model": "resnet", "tarantella_step_ms": 40.0,
                     "mwms_step_ms": 50.0, "ratio": 1.25},
                    {"link": "1gbit_0.1ms", "model": "transformer", "tarantella_step_ms": 40.0}]})
    write(tmp_path / "sim_cluster.jsonl", {
        "config": {}, "results": [],
        "weak_scaling": [{"link": "10gbit_0.1ms", "model": "lenet5", "step_ms": 20.0,
                          "solo_alone_ms": 16.0, "solo_busy_ms": 18.5, "e2_alone": 0.8,
                          "e2_busy": 0.925},
                         {"link": "1gbit_0.1ms", "model": "lenet5", "step_ms": 60.0,
                          "solo_alone_ms": 16.0, "solo_busy_ms": 18.0, "e2_alone": 0.267,
                          "e2_busy": 0.3}]})
    summary = report(tmp_path)
    mwms = "Throughput vs MWMS, 2 simulated hosts"
    assert "| 2.20x | PASS" in target_row(summary, f"{mwms}, lenet5, 10gbit_0.1ms")
    assert "| 1.25x | **MISS**" in target_row(summary, f"{mwms}, resnet, 1gbit_0.1ms")
    # A model one framework did not train is not run, not a pass.
    assert "| - | NOT RUN" in target_row(summary, f"{mwms}, transformer, 1gbit_0.1ms")
    e2 = "Weak scaling E(2), lenet5, 2 simulated hosts"
    assert "| >= 0.90 | 0.93 | PASS" in target_row(summary, f"{e2} (10gbit_0.1ms)")
    assert "| (for information) | 0.30 | N/A" in target_row(summary, f"{e2} (1gbit_0.1ms)")


def test_report_sim_targets_judge_the_defaults(tmp_path):
    # The defaults (fusion on, overlap auto) are judged against the bound
    # and against the fastest other setting.
    def row(fusion, overlap, step):
        return {"hosts": 2, "ranks_per_host": 1, "link": "10gbit_0.1ms", "model": "lenet5",
                "fusion": fusion, "overlap": overlap, "step_ms": step, "compute_ms": 20.0,
                "comm_ms": 4.0, "wait_ms": 2.0, "transfer_ms": 4.0, "bound_ms": 20.0,
                "ratio_to_bound": step / 20.0, "gradient_bytes": 4 << 20}
    others = [row(True, "on", 24.0), row(True, "off", 22.5), row(False, "on", 26.0),
              row(False, "off", 23.0)]
    cases = [([row(True, "auto", 22.0)] + others, "1.100", "0.978"),
             ([row(True, "auto", 25.0)] + others, "1.250", "1.111")]
    for rows, bound, other in cases:
        write(tmp_path / "sim_cluster.jsonl", {"config": {}, "results": rows})
        summary = report(tmp_path)
        t = target_row(summary, "Simulated cluster with the defaults, lenet5")
        assert "step time / bound (fusion on, overlap auto), worst link" in t
        assert f"| {bound} |" in t
        t = target_row(summary, "Simulated cluster, lenet5, 2 hosts: the defaults")
        assert "the defaults (fusion on, overlap auto) / fastest" in t
        assert f"| {other} |" in t and ("PASS" if other < "1" else "**MISS**") in t


def test_sim_cluster_breakdown_finds_when_the_largest_gradient_is_ready():
    """The simulated cluster's reachable step (tools/research/step_timeline.py):
    the largest gradient's readiness on each step's later rank, plus its
    transfer."""
    sim = load_module("tools/research/step_timeline.py")
    defaults = [("config fusion=1 overlap=auto", {"fusion": True, "overlap": "auto"})]

    def trace(ready_us):
        ev = [{"name": "config fusion=1 overlap=auto", "cat": "config", "ph": "B", "ts": 0}]
        for i, r in enumerate(ready_us):
            t0 = 100_000 * (i + 1)
            ev += [{"name": f"step {i}", "cat": "step", "ph": "B", "ts": t0},
                   {"name": "fusion start", "ph": "i", "ts": t0 + 1_000, "args": {"bytes": 8}},
                   {"name": "fusion start", "ph": "i", "ts": t0 + r,
                    "args": {"bytes": 1_000_000}},
                   {"name": "fusion finish", "ph": "X", "ts": t0 + 30_000, "dur": 20_000},
                   {"name": "allreduce bucket 0", "ph": "X", "ts": t0 + r, "dur": 10_000,
                    "args": {"bytes": 1_000_008}},
                   {"name": f"step {i}", "cat": "step", "ph": "E", "ts": t0 + 60_000}]
        ev.append({"name": "config fusion=1 overlap=auto", "cat": "config", "ph": "E",
                   "ts": 10_000_000})
        return ev

    ranks = [sim.breakdown(trace([10_000, 20_000, 12_000]), 2),
             sim.breakdown(trace([15_000, 11_000, 30_000]), 2)]
    row, = sim.summarize(ranks, 2, 1e9, defaults)
    # Later rank per step: 15, 20, 30 ms; median 20 ms. 1 MB at 1 Gbit/s
    # over 2 hosts: 8 ms; compute = 60 - 20 = 40 ms.
    assert row["ready_ms"] == 20.0
    assert row["compute_ms"] == 40.0
    assert row["reach_ms"] == 40.0
    ranks = [sim.breakdown(trace([35_000] * 3), 2)] * 2
    row, = sim.summarize(ranks, 2, 1e9, defaults)
    assert row["reach_ms"] == 43.0 and row["ratio_to_reach"] == round(60 / 43, 3)


def test_report_reliability_section(tmp_path):
    """The backup cost is judged from a backup's time over save_freq steps
    (2.5 ms per 50 steps of 1 ms: 5 %, at the limit), and the restart time
    is split into its parts, TensorFlow's start-up apart."""
    backup = {"config": {"ranks": 2, "global_batch": 64, "save_freq": 50, "steps": 100},
              "rounds": [{"round": 0, "ms_per_step_without": 1.0, "ms_per_step_with": 1.1,
                          "cost": 0.1},
                         {"round": 1, "ms_per_step_without": 1.0, "ms_per_step_with": 0.9,
                          "cost": -0.1}],
              "median_cost": 0.0, "backup_ms": [2.0, 2.5, 9.0], "estimated_cost": 0.05}
    write(tmp_path / "reliability_backup.jsonl", backup)
    write(tmp_path / "reliability_restart.jsonl", {
        "config": {"ranks": 2, "save_freq": 50, "kill_step": 60, "trials": 2,
                   "model": "quick start (LeNet-5, global batch 64)",
                   "command": "restart_time.py", "load_average": 1.0, "cpus": 2},
        "trials": [{"trial": 0, "restart_s": 2.0, "import_s": 5.0, "init_s": 1.0, "resume_s": 3.0,
                    "total_s": 11.0},
                   {"trial": 1, "restart_s": 9.0, "import_s": 9.0, "init_s": 9.0,
                    "resume_s": 9.0, "total_s": 36.0}],
        "median_trial": 0, "tf_startup_s": 6.0})
    summary = report(tmp_path)
    row = target_row(summary, "BackupAndRestore(save_freq=50) step-time cost")
    assert "| 5.0 % | PASS |" in row, row
    assert "a backup takes 2.5 ms on the master (median of 3)" in summary
    assert "| **fault to the first step of the next attempt** | **11.00** |" in summary
    assert "TensorFlow's start-up (import + init) is 6.00 s of the 11.00 s." in summary
    write(tmp_path / "reliability_backup.jsonl", dict(backup, estimated_cost=0.06))
    assert "| 6.0 % | **MISS** |" in target_row(report(tmp_path), "BackupAndRestore")


def test_report_capacity_run_that_may_exceed_and_the_table_of_recomputed_stages(tmp_path):
    """A run under the limit that the benchmark expects to exceed (summed
    weight gradients with momentum) does not fail the target, and says why;
    the memory table's target is judged on the stages with recomputed weight
    gradients, the summed ones shown beside."""
    oom = "ResourceExhaustedError: OOM when allocating tensor with shape[2048,2048]"
    exceeds = {"job_ok": False, "trained": False, "tail": "", "may_exceed": "0.75 W and more"}
    result = capacity_result(oom, oom, [None] * 4, True, more=[(
        "4 stages, build_fn, SGD momentum, summed weight gradients, limited", exceeds,
        [{"rank": 0, "trained": False, "error": oom}])])

    def row(k, mode, ratio):
        return {"optimizer": "sgd", "stages": k, "weight_gradients": mode, "peak_mib": 1.0,
                "need_over_k_mib": 1.0, "ratio": ratio}
    result["memory"] = [row(1, "accumulate", 0.7), row(4, "accumulate", 1.42),
                        row(4, "recompute", 1.21)]
    write(tmp_path / "pipeline_capacity.jsonl", result)
    summary = report(tmp_path)
    capacity = target_row(summary, "Under a memory limit below the model's weights, only "
                                   "stages built by a function train")
    assert "| yes | PASS |" in capacity and "as it may: 0.75 W and more" in capacity, capacity
    table = target_row(summary, "Peak per rank on K stages")
    assert "| 1.21x | PASS |" in table and "up to 1.42x" in table, table
    result["memory"][2]["ratio"] = 1.35
    write(tmp_path / "pipeline_capacity.jsonl", result)
    assert "| 1.35x | **MISS** |" in target_row(report(tmp_path), "Peak per rank on K stages")


def test_report_capacity_run_under_a_limit_of_its_own(tmp_path):
    """A run limited otherwise than the configuration's budget (the stages
    of one layer each under 0.4 W) says its limit beside its verdict."""
    oom = "ResourceExhaustedError: OOM when allocating tensor with shape[2048,2048]"
    thin = "8 stages, build_fn, SGD, recomputed weight gradients, limited"
    trained = {"job_ok": True, "trained": True, "tail": "", "budget_times_weights": 0.4}
    rows = [{"rank": r, "trained": True, "held_weights_mib": 64.0,
             "peak_data_above_base_mib": 160.0, "margin_mib": 44.8 - r} for r in range(8)]
    write(tmp_path / "pipeline_capacity.jsonl",
          capacity_result(oom, oom, [None] * 4, True, more=[(thin, trained, rows)]))
    row = target_row(report(tmp_path), "Under a memory limit below the model's weights")
    assert "| yes | PASS |" in row, row
    assert ("8 stages, build_fn, SGD, recomputed weight gradients under the base + 0.4x "
            "trains (margins +45, +44") in row, row
    failed = dict(trained, job_ok=False, trained=False)
    write(tmp_path / "pipeline_capacity.jsonl", capacity_result(
        oom, oom, [None] * 4, True, more=[(thin, failed, [{"rank": 0, "trained": False,
                                                            "error": "MemoryError: "}])]))
    row = target_row(report(tmp_path), "Under a memory limit below the model's weights")
    assert "| no | **MISS** |" in row and "under the base + 0.4x fails (MemoryError" in row, row


def test_report_zero_throughput_on_two_ranks(tmp_path):
    """Stages 1 and 2 are judged against 1.0x stage 0's throughput, stage 3
    against its own 0.85x, each on its worst model."""
    def rows(model, *rates):
        return [{"model": model, "framework": fw, "median_samples_per_s": rate, "params": 10}
                for fw, rate in zip(("tarantella", "tarantella-zero1", "tarantella-zero2",
                                     "tarantella-zero3"), rates)]
    write(tmp_path / "zero_throughput.jsonl", {
        "config": {}, "results": rows("lenet5", 100.0, 101.0, 99.0, 86.0)
        + rows("dense", 100.0, 102.0, 103.0, 90.0)})
    summary = report(tmp_path)
    two = target_row(summary, "ZeRO stage 2: throughput >= 1.0x stage 0's (each model, 2 ranks)")
    assert "| 0.99x (lenet5) | **MISS** |" in two, two
    three = target_row(summary, "ZeRO stage 3: throughput >= 0.85x stage 0's (each model, 2 r")
    assert "| 0.86x (lenet5) | PASS |" in three, three
    assert "| lenet5 | 10 | 100.0 | 101.0 | 99.0 | 86.0 | 1.01 | 0.99 | 0.86 |" in summary


def test_report_zero_on_simulated_hosts(tmp_path):
    """Each stage's throughput over stage 0's on 2 simulated hosts is judged
    on its worst model and link; a model without a result is not a pass."""
    def row(link, model, s0, s1, s2, s3):
        out = {"link": link, "model": model, "tarantella_step_ms": s0,
               "tarantella-zero1_step_ms": s1, "tarantella-zero2_step_ms": s2,
               "tarantella-zero3_step_ms": s3}
        for stage, ms in ((1, s1), (2, s2), (3, s3)):
            if s0 and ms:
                out[f"stage{stage}_over_stage0"] = round(s0 / ms, 3)
        return out
    write(tmp_path / "sim_cluster_zero.jsonl", {
        "config": {"global_batch": 64},
        "results": [row("1gbit_0.1ms", "dense", 100.0, 125.0, 98.0, 115.0),
                    row("10gbit_0.1ms", "dense", 40.0, 39.0, 38.0, 50.0)]})
    summary = report(tmp_path)
    one = target_row(summary, "ZeRO stage 1: throughput >= 1.0x stage 0's (each model, 2 sim")
    assert "| 0.80x (dense 1gbit_0.1ms) | **MISS** |" in one, one
    two = target_row(summary, "ZeRO stage 2: throughput >= 1.0x stage 0's (each model, 2 sim")
    assert "| 1.02x (dense 1gbit_0.1ms) | PASS |" in two, two
    # stage 3's own threshold: 0.87x passes 0.85, 0.80x misses it
    three = target_row(summary, "ZeRO stage 3: throughput >= 0.85x stage 0's (each model, 2 s")
    assert "| 0.80x (dense 10gbit_0.1ms) | **MISS** |" in three, three
    assert "| 1gbit_0.1ms | dense | 100.0 | 125.0 | 98.0 | 115.0 | 0.80 | 1.02 | 0.87 |" \
        in summary
    write(tmp_path / "sim_cluster_zero.jsonl", {
        "config": {}, "results": [row("1gbit_0.1ms", "lenet5", 10.0, None, 9.0, 9.5)]})
    one = target_row(report(tmp_path), "ZeRO stage 1: throughput >= 1.0x stage 0's (each "
                                       "model, 2 sim")
    assert "NOT RUN" in one and "no result for lenet5 1gbit_0.1ms" in one, one


def test_report_zero_at_scale(tmp_path):
    """The projection's targets judge the worst device at their hosts and
    link, and name the faster link's figure beside it."""
    def row(model, device, gbit, hosts, stage, e):
        return {"model": model, "device": device, "gbit": gbit, "hosts": hosts,
                "zero_stage": stage, "compression": "none", "compute_ms": 100.0,
                "step_ms": 100.0 / e, "E": e}
    rows = [row("resnet50", "V100", 100.0, 512, 0, 0.95),
            row("resnet50", "A100", 100.0, 512, 0, 0.88),
            row("resnet50", "A100", 400.0, 512, 0, 0.97),
            row("gpt1.3b", "V100", 100.0, 256, 2, 0.86),
            row("gpt1.3b", "V100", 100.0, 256, 0, 0.9),
            dict(row("gpt1.3b", "V100", 100.0, 256, 0, 0.95), compression="bf16"),
            dict(row("gpt1.3b", "V100", 100.0, 256, 2, 0.99), compression="bf16")]
    write(tmp_path / "scale_zero_projection.jsonl", {"config": {"bucket_bytes": 25 * 2**20},
                                                     "results": rows})
    summary = report(tmp_path)
    resnet = target_row(summary, "at scale: resnet50 zero_stage 0, projected E(512), 100 Gbit/s")
    assert "| 0.880 | **MISS** | A100; at 400 Gbit/s 0.970 |" in resnet, resnet
    gpt = target_row(summary, "at scale: gpt1.3b zero_stage 2, projected E(256), 100 Gbit/s")
    assert "| 0.860 | PASS |" in gpt, gpt
    assert ("| gpt1.3b | V100 | 100 | 256 | 100.0 | 111.1 | 0.900 | - | 0.860 | - | 0.950 | "
            "0.990 | - |") in summary


def zero_memory_row(optimizer, ranks, stage, theory, fusion, peak, variant="built by fit"):
    return {"optimizer": optimizer, "ranks": ranks, "zero_stage": stage, "variant": variant,
            "oversubscribed": ranks > 2, "rank_of_peak": 0, "theory_mib": theory,
            "fusion_buffers_mib": fusion, "held_weights_mib": 64.0,
            "held_gradient_buffers_mib": fusion, "held_optimizer_state_mib": 32.0,
            "held_weight_parts_mib": 16.0, "held_total_mib": 128.0, "kept_beyond_held_mib": 20.0,
            "step_peak_above_kept_mib": 50.0, "peak_above_base_mib": peak}


def test_report_zero_memory_section(tmp_path):
    """A stage meets its target when at every N its peak is at most 1.2 x
    the theory + the fusion buffers (+ at stage 3 the largest block of
    weights gathered at once); the rows of an optimizer built before fit
    are shown, not judged."""
    rows = [zero_memory_row("adam", n, 0, 256.0, 64.0 if n > 1 else 0.0, peak)
            for n, peak in ((1, 300.0), (2, 371.0), (4, 360.0))]
    # stage 2 at N = 4: 1.2 x 112 + 80 = 214.4 MiB allowed; 250 is over
    rows += [zero_memory_row("adam", n, 2, theory, fusion, peak)
             for n, theory, fusion, peak in ((1, 256.0, 0.0, 300.0), (2, 160.0, 96.0, 280.0),
                                             (4, 112.0, 80.0, 250.0))]
    rows.append(zero_memory_row("adam", 4, 2, 112.0, 80.0, 200.0, variant="built before fit"))
    # stage 3: 1.2 x theory + fusion + the gathered block; at N = 2 1.2 x 64 +
    # 96 + 64 = 236.8 MiB allowed
    rows += [dict(zero_memory_row("adam", n, 3, theory, fusion, peak), gathered_block_mib=block)
             for n, theory, fusion, block, peak in ((1, 256.0, 0.0, 0.0, 300.0),
                                                    (2, 64.0, 96.0, 64.0, 230.0),
                                                    (4, 32.0, 80.0, 64.0, 180.0))]
    write(tmp_path / "zero.jsonl", {"config": {"layers": 4, "width": 2048, "weights_mib": 64.0,
                                               "parameters": 16785408, "global_batch": 64},
                                    "memory": rows})
    summary = report(tmp_path)
    row = target_row(summary, "ZeRO stage 0, Adam: peak per rank")
    assert "| 1.20x (N = 2) | PASS |" in row and "N = 2 371 / 371" in row, row
    row = target_row(summary, "ZeRO stage 2, Adam: peak per rank")
    assert "| 1.52x (N = 4 *) | **MISS** |" in row and "N = 4 * 250 / 214" in row, row
    assert "| NOT RUN | no result |" in target_row(summary, "ZeRO stage 1, Adam")
    assert "| Adam | 4 * | 2 | built before fit | 112 | 80 | 0 | 214 |" in summary
    row = target_row(summary, "ZeRO stage 3, Adam: peak per rank")
    assert "+ gathered block" in row and "| PASS |" in row and "N = 2 230 / 237" in row, row
    assert "| Adam | 2 | 3 | built by fit | 64 | 96 | 64 | 237 |" in summary
    closing = summary.split("### What would close the misses", 1)[1].split("\n## ", 1)[0]
    assert "- **zero**:" in closing


def zero_capacity_result(stage0_errors, stage2_errors, stage3_errors=(None,) * 4,
                         stage3_budget=1.75, budget=2.5):
    """zero_capacity.jsonl of 4 ranks: each rank's error at stages 0, 2 and
    3 under the limit (None: it trains, and at stage 3 predicts and
    saves)."""
    runs, ranks = [], []
    for stage, errors, limit in ((0, stage0_errors, budget), (2, stage2_errors, budget),
                                 (3, stage3_errors, stage3_budget)):
        name = f"stage {stage}, limited to the base + {limit} W"
        for rank, error in enumerate(errors):
            doc = {"run": name, "rank": rank, "zero_stage": stage, "ranks": 4}
            doc.update({"trained": True, "held_total_mib": 256.1, "margin_mib": 30.0 + rank,
                        "peak_data_above_base_mib": 466.0} if error is None else
                       {"trained": False, "error": error})
            if stage == 3 and error is None:
                doc.update(predicted=True, saved=True)
            ranks.append(doc)
        runs.append({"run": name, "zero_stage": stage, "budget_times_weights": limit,
                     "trained": all(e is None for e in errors),
                     "job_ok": all(e is None for e in errors), "ranks_reported": 4, "tail": ""})
    return {"config": {"ranks": 4, "weights_mib": 128.1, "budget_times_weights": budget,
                       "stage3_budget_times_weights": stage3_budget,
                       "need_times_weights": {"0": 4.0, "2": 2.5, "3": 1.625}},
            "runs": runs, "ranks": ranks}


def test_report_zero_capacity_target(tmp_path):
    oom = "TntNoMemoryError: Fusion failed: TNT_ERR_NO_MEMORY: out of memory"
    cases = [
        # stage 0 runs out of memory, stage 2 trains: met
        ([oom] * 4, [None] * 4, 2.5, "| yes | PASS |",
         ["stage 0 fails (TntNoMemoryError", "stage 2 trains (margins +30, +31, +32, +33 MiB)",
          "limit: the base + 2.5 W"]),
        # stage 2 runs out of memory too
        ([oom] * 4, [None, oom, None, None], 2.5, "| no | **MISS** |", ["stage 2 fails (TntNo"]),
        # stage 0 failing for another reason does not show the limit works
        (["ValueError: bad input"] * 4, [None] * 4, 2.5, "| no | **MISS** |",
         ["stage 0 fails, but not for lack of memory: ValueError"]),
        # stage 0 training: the limit is too loose
        ([None] * 4, [None] * 4, 2.5, "| no | **MISS** |", ["stage 0 trains"]),
        # trained under a looser limit than the target's (make test's quick run)
        ([oom] * 4, [None] * 4, 3.1, "| no | **MISS** |", ["limit: the base + 3.1 W"]),
    ]
    for stage0, stage2, budget, verdict, details in cases:
        write(tmp_path / "zero_capacity.jsonl", zero_capacity_result(stage0, stage2,
                                                                     budget=budget))
        row = target_row(report(tmp_path), "ZeRO capacity: under a per-rank limit of 2.5")
        assert verdict in row, row
        for text in details:
            assert text in row, (text, row)


def test_report_zero_stage_3_capacity_target(tmp_path):
    oom = "TntNoMemoryError: Fusion failed: TNT_ERR_NO_MEMORY: out of memory"
    name = "stage 3 trains, predicts and saves"
    cases = [
        # every rank trains, predicts and saves under 1.75 W: met
        ((None,) * 4, 1.75, "| yes | PASS |",
         [f"{name} (margins +30, +31, +32, +33 MiB)", "limit: the base + 1.75 W"]),
        # a rank runs out of memory
        ((None, oom, None, None), 1.75, "| no | **MISS** |", ["stage 3 fails (TntNo"]),
        # trained under a looser limit than the target's (make test's quick run)
        ((None,) * 4, 2.0, "| no | **MISS** |", ["limit: the base + 2.0 W"]),
    ]
    for errors, budget, verdict, details in cases:
        write(tmp_path / "zero_capacity.jsonl",
              zero_capacity_result([oom] * 4, [None] * 4, errors, budget))
        row = target_row(report(tmp_path), "ZeRO capacity: under a per-rank limit of 1.75")
        assert verdict in row, row
        for text in details:
            assert text in row, (text, row)


def test_report_pipeline_on_simulated_hosts_judges_the_fastest_schedule(tmp_path):
    def row(mode, samples):
        return {"mode": mode, "step_ms": 64e3 / samples, "samples_per_s": samples, "steps": 24,
                "step_spread_ms": [1.0, 2.0]}
    write(tmp_path / "pipeline_sim_cluster.jsonl", {
        "config": {"global_batch": 64, "micro_batches": 4, "parameter_bytes": 48 << 20,
                   "best_schedule": "zb-h1"},
        "results": [row("pipeline, 1f1b", 700.0), row("pipeline, zb-h1", 737.0),
                    row("data", 137.0)],
        "ratio_pipeline_to_data": 5.38})
    summary = report(tmp_path)
    row_ = target_row(summary, "Pipelined / data-parallel throughput, 2 simulated hosts")
    assert "| 5.38x | PASS |" in row_ and "737 (pipeline, zb-h1) vs 137 samples/s" in row_, row_
    assert "| pipeline, 1f1b | 91.43 | 700.0 |" in summary
