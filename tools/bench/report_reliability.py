"""The report's section on backup_cost.py and restart_time.py: what backups
cost and how long a restart takes (reliability_*.jsonl).
"""
import statistics

from report_base import Target, limit, meets, open_section, table


def section(results, stages, targets):
    """What BackupAndRestore costs (backup_cost.py) and how long a job takes
    from a rank's death to its next step (restart_time.py)."""
    name = "BackupAndRestore(save_freq=50) step-time cost, quick start, 2 ranks"
    required = f"<= {limit('backup_cost') * 100:.0f} %"
    out, d = open_section(results, stages, targets, "reliability_backup.jsonl",
                          ["reliability_backup"], "## 9. Reliability: backups and restarts",
                          goals=[(name, required)], label="Backup cost: ", show_config=False)
    if d is not None:
        cost, cfg = d["estimated_cost"], d["config"]
        per_backup = statistics.median(d["backup_ms"])
        rounds = ", ".join(f"{r['cost'] * 100:+.1f}" for r in d["rounds"])
        out.append(f"**Backup cost** ({cfg['ranks']} ranks, global batch {cfg['global_batch']}, "
                   f"save_freq {cfg['save_freq']}, {cfg['steps']} steps per fit): a backup "
                   f"takes {per_backup:.1f} ms on the master (median of {len(d['backup_ms'])}), "
                   f"{cost * 100:.1f} % of {cfg['save_freq']} steps; whole fits with and "
                   "without backups in ABBA rounds: median "
                   f"{d['median_cost'] * 100:+.1f} % (rounds "
                   f"{rounds} %), which the "
                   "machine's drift between rounds can exceed on a shared machine.")
        out.append("")
        targets.append(Target(name, required, f"{cost * 100:.1f} %", meets("backup_cost", cost),
                              note="a backup's time over save_freq mean step times"))
    out2, r = open_section(results, stages, [], "reliability_restart.jsonl",
                           ["reliability_restart"], label="Restart time: ", show_config=False)
    out += out2
    if r is not None:
        m = next(t for t in r["trials"] if t["trial"] == r["median_trial"])
        cfg = r["config"]
        totals = ", ".join(f"{t['total_s']:.2f}" for t in r["trials"])
        out.append(f"**Restart time**: the {cfg['model']}, {cfg['ranks']} ranks, "
                   f"`--max-restarts 1`, BackupAndRestore(save_freq={cfg['save_freq']}); the "
                   f"last rank is killed after step {cfg['kill_step']}. The trial of the median "
                   f"total of {len(r['trials'])} (totals {totals} s), load average "
                   f"{cfg['load_average']:.1f} on "
                   f"{cfg['cpus']} cores. Command: `{cfg['command']}`.")
        out.append("")
        rows = [["the launcher ends the attempt and starts the next", f"{m['restart_s']:.2f}"],
                ["TensorFlow's start-up: import (TensorFlow, Keras, Tarantella)",
                 f"{m['import_s']:.2f}"],
                ["TensorFlow's start-up: tnt.init()", f"{m['init_s']:.2f}"],
                ["load the data, build, restore the backup, skip the trained batches, "
                 "first step",
                 f"{m['resume_s']:.2f}"],
                ["**fault to the first step of the next attempt**", f"**{m['total_s']:.2f}**"]]
        out.append(table(["part (until the last rank is through it)", "s"], rows))
        out.append("")
        out.append(f"TensorFlow's start-up (import + init) is {r['tf_startup_s']:.2f} s of the "
                   f"{m['total_s']:.2f} s.")
        out.append("")
    return out
