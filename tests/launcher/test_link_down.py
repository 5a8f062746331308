"""A link that goes down between two simulated hosts (network namespaces,
as in test_cluster.py) in the middle of training: the ranks on both sides
wait for each other until TNT_TIMEOUT_S, fail with an error naming the
peer, and every process of the job ends within the timeout plus 5 s; Open
MPI's own messages about the lost host (and any crash report of its
processes) go to the run directory's mpirun.log, not to the terminal.
Needs root; skipped otherwise."""
import os
import re
import subprocess
import time

import pytest

from launcher_util import (cluster_env, cluster_skip_reason, processes_with, read_status,
                           sim_cluster, start_launcher, wait_for, write_hostfile)

pytestmark = pytest.mark.skipif(cluster_skip_reason() is not None,
                                reason=str(cluster_skip_reason()))

TIMEOUT_S = 10


def test_link_down_ends_the_job_within_the_timeout(launcher, marked):
    marker, d = marked
    with sim_cluster("tnt-lnk", ["a", "b"]) as (hosts, net, _):
        hostfile = write_hostfile(d, hosts)
        env = cluster_env(net, TNT_TIMEOUT_S=str(TIMEOUT_S))
        run_dir = os.path.join(d, "run")
        proc = start_launcher(["--hostfile", hostfile, "--run-dir", run_dir, "--",
                               os.path.join(d, "quick_start.py"), "--epochs", "100"], env=env)
        try:
            assert wait_for(lambda: os.path.exists(os.path.join(run_dir, "rank1.progress")), 240), \
                "training did not start"
            time.sleep(1)
            # The second host's end of its link, on this machine's bridge.
            # (sim_cluster.sh: tntv<ID><N>, N = 3 for the second host).
            link = f"tntv{hosts[1].split('-')[2]}3"
            subprocess.run(["ip", "link", "set", link, "down"], check=True)
            cut, cut_wall = time.monotonic(), time.time()
            out, err = proc.communicate(timeout=120)
            ended = time.monotonic() - cut
        finally:
            if proc.poll() is None:
                proc.kill()
        left = wait_for(lambda: not processes_with(marker), 5)
        gone = time.monotonic() - cut
    print(err)
    for r in range(2):
        status = read_status(run_dir, r) or {}
        print(f"rank {r} ended {float(status.get('end_time', 'nan')) - cut_wall:.1f} s after the "
              f"link went down: {status}")
    print(f"the launcher exited {ended:.1f} s after the link went down; every process was gone "
          f"after {gone:.1f} s")
    assert proc.returncode != 0
    assert left, f"processes left behind: {processes_with(marker)}"
    assert gone <= TIMEOUT_S + 5, f"the job took {gone:.1f} s to end"
    assert re.search(r"rank [01] on host tnt-lnk-\w+-[ab] failed", err), err
    # Open MPI's messages are in the run directory, not on the terminal.
    assert "-" * 74 not in err and "*** Process received signal" not in err, err
    assert os.path.exists(os.path.join(run_dir, "mpirun.log"))
