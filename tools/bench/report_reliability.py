"""The report's section on backup_cost.py and restart_time.py: what backups
cost and how long a restart takes (reliability_*.json).
"""
import statistics

from report_base import Target, limit, meets, open_section, table


def section(results, stages, targets):
    """What BackupAndRestore costs (backup_cost.py) and how long a job takes
    from a rank's death to its next step (restart_time.py)."""
    name = "BackupAndRestore(save_freq=50) step-time cost, quick start, 2 ranks"
    required = f"<= {limit('backup_cost') * 100:.0f} %"
    out, d = open_section(results, stages, targets, "reliability_backup.json",
                          ["reliability_backup"], "## 9. Reliability: backups and restarts",
                          goals=[(name, required)], label="Backup cost: ")
    if d is not None:
        cost = d["estimated_cost"]
        per_backup = statistics.median(d["ms_per_backup"])
        out.append(f"**Backup cost** ({d['ranks']} ranks, global batch {d['global_batch']}, "
                   f"save_freq {d['save_freq']}, {d['steps']} steps per fit): a backup takes "
                   f"{per_backup:.1f} ms on the master (median of {len(d['ms_per_backup'])}), "
                   f"{cost * 100:.1f} % of {d['save_freq']} steps; whole fits with and "
                   "without backups in ABBA rounds: median "
                   f"{d['median_cost'] * 100:+.1f} % (rounds "
                   f"{', '.join(f'{c * 100:+.1f}' for c in d['cost'])} %), which the "
                   "machine's drift between rounds can exceed on a shared machine.")
        out.append("")
        targets.append(Target(name, required, f"{cost * 100:.1f} %", meets("backup_cost", cost),
                              note="a backup's time over save_freq mean step times"))
    out2, r = open_section(results, stages, [], "reliability_restart.json",
                           ["reliability_restart"], label="Restart time: ", show_config=False)
    out += out2
    if r is not None:
        m, cfg = r["median"], r["config"]
        totals = ", ".join(f"{t['total']:.2f}" for t in r["trials"])
        out.append(f"**Restart time**: the {cfg['model']}, {cfg['ranks']} ranks, "
                   f"`--max-restarts 1`, BackupAndRestore(save_freq={cfg['save_freq']}); the "
                   f"last rank is killed after step {cfg['kill_step']}. The trial of the median "
                   f"total of {len(r['trials'])} (totals {totals} s), load average "
                   f"{r['load_average']:.1f} on "
                   f"{r['cpus']} cores. Command: `{r['command']}`.")
        out.append("")
        rows = [["the launcher ends the attempt and starts the next", f"{m['restart']:.2f}"],
                ["TensorFlow's start-up: import (TensorFlow, Keras, Tarantella)",
                 f"{m['import']:.2f}"],
                ["TensorFlow's start-up: tnt.init()", f"{m['init']:.2f}"],
                ["load the data, build, restore the backup, skip the trained batches, "
                 "first step",
                 f"{m['resume']:.2f}"],
                ["**fault to the first step of the next attempt**", f"**{m['total']:.2f}**"]]
        out.append(table(["part (until the last rank is through it)", "s"], rows))
        out.append("")
        out.append(f"TensorFlow's start-up (import + init) is {m['tf_startup']:.2f} s of the "
                   f"{m['total']:.2f} s.")
        out.append("")
    return out
