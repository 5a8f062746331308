"""A small rank program for the launcher tests (no TensorFlow, so it starts
at once): reports what the launcher gave it, then fails or waits on demand.

    rank_program.py [--fail-rank R] [--code C] [--raise-rank R] [--kill-rank R] [--sleep S]
                    [--pin] [--where] [--progress] [--only-before-restart K]

--progress records a completed training step as Tarantella's Keras layer does
(in TNT_PROGRESS_FILE) and prints TNT_RESTART_COUNT; with
--only-before-restart K the program fails, raises, kills or sleeps as asked
only in the first K attempts of a job (TNT_RESTART_COUNT < K).
"""
import argparse
import os
import signal
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--raise-rank", type=int, default=-1)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--code", type=int, default=3)
parser.add_argument("--progress", action="store_true")
parser.add_argument("--only-before-restart", type=int, default=None)
parser.add_argument("--sleep", type=float, default=0)
parser.add_argument("--pin", action="store_true")
parser.add_argument("--where", action="store_true",
                    help="print the host and the names of the processes this one runs under")
args = parser.parse_args()


def ancestors():
    """The command names of the parent, its parent, ... up to the first process."""
    names = []
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        names.append(stat[stat.index("(") + 1:stat.rindex(")")])
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return names


rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
print(f"rank {rank} of {size}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
      f" FOO={os.environ.get('FOO')!r} TNT_LOG_LEVEL={os.environ.get('TNT_LOG_LEVEL')!r}")
print(f"[tnt {rank}/{size}] WARNING: library message from rank {rank}", file=sys.stderr)
print(f"plain stderr from rank {rank}", file=sys.stderr)
if args.where:
    print(f"rank {rank} of {size} on {socket.gethostname()} under {','.join(ancestors())}")
if args.pin:
    with open("/proc/self/numa_maps") as f:
        policies = {line.split()[1] for line in f if len(line.split()) > 1}
    print(f"rank {rank} cpus {sorted(os.sched_getaffinity(0))} policies {sorted(policies)}")
restart = int(os.environ["TNT_RESTART_COUNT"])
if args.progress:
    print(f"rank {rank} attempt with TNT_RESTART_COUNT={restart}")
    with open(os.environ["TNT_PROGRESS_FILE"], "w") as f:
        f.write("a step completed\n")
sys.stdout.flush()
if args.only_before_restart is not None and restart >= args.only_before_restart:
    args.fail_rank = args.raise_rank = args.kill_rank = -1
    args.sleep = 0
if rank == args.kill_rank:
    os.kill(os.getpid(), signal.SIGKILL)
if rank == args.fail_rank:
    print(f"rank {rank} is failing on purpose", file=sys.stderr)
    sys.exit(args.code)
if rank == args.raise_rank:
    raise RuntimeError(f"rank {rank} raised on purpose")
time.sleep(args.sleep)
print(f"rank {rank} done")
