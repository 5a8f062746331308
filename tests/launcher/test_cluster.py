"""Evidence 2: a simulated two-host cluster. Each host is a network
namespace with its own host name and /dev/shm, joined to this machine by a
bridge with link-local addresses on links the test creates; Open MPI
reaches the hosts through sim_cluster.sh as its remote-launch agent.
The quick start trained on 4 ranks across the two hosts must give the same
weights as on 4 ranks of one host, and libtnt's allreduce on 2 hosts x 2
ranks must work in shared memory within each host and over the network
across them. Needs root; skipped otherwise."""
import json
import os
import shutil
import signal
import time
import uuid

import numpy as np
import pytest

from launcher_util import (HERE, QUICK_START, base_env, cluster_env, cluster_skip_reason,
                           kill_leftovers, processes_with, read_status, run_launcher,
                           sim_cluster, start_launcher, wait_for)

PROGRAM = os.path.join(HERE, "rank_program.py")


def bench_path(launcher):
    """tnt-bench of the launcher's build tree, or else the one on PATH."""
    build = os.path.dirname(os.path.dirname(os.path.dirname(launcher)))
    built = os.path.join(build, "tools", "tnt-bench")
    found = built if os.path.exists(built) else shutil.which("tnt-bench")
    if found is None:
        pytest.fail(f"no tnt-bench: build it (make build) beside {launcher}, or install it")
    return found

pytestmark = pytest.mark.skipif(cluster_skip_reason() is not None,
                                reason=str(cluster_skip_reason()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two simulated hosts; yields (hostfile, environment for the launcher, hosts)."""
    with sim_cluster("tnt-sim", ["a", "b"]) as (hosts, net, _):
        d = tmp_path_factory.mktemp("cluster")
        hostfile = d / "hostfile"
        hostfile.write_text(f"# the simulated cluster\n{hosts[0]}\n\n{hosts[1]}  # second host\n")
        yield str(hostfile), cluster_env(net), hosts


@pytest.fixture
def marked(tmp_path):
    marker = f"tnt-marker-{uuid.uuid4().hex[:12]}"
    d = tmp_path / marker
    d.mkdir()
    shutil.copy(PROGRAM, d / "rank_program.py")
    os.symlink(QUICK_START, d / "quick_start.py")
    yield marker, str(d)
    leftovers = processes_with(marker)
    kill_leftovers(marker)
    assert not leftovers, f"processes left behind: {leftovers}"


def test_ranks_are_placed_on_both_hosts(launcher, cluster, marked):
    hostfile, env, hosts = cluster
    marker, d = marked
    proc = run_launcher(["--hostfile", hostfile, "--n-per-node", "2", "--output-on-all-devices",
                         "--run-dir", os.path.join(d, "run"), "--", "sh", "-c",
                         "echo rank $OMPI_COMM_WORLD_RANK on $(hostname)"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert lines == [f"rank 0 on {hosts[0]}", f"rank 1 on {hosts[0]}",
                     f"rank 2 on {hosts[1]}", f"rank 3 on {hosts[1]}"], proc.stdout
    assert "4 ranks on 2 hosts (2 per host), on the CPU" in proc.stderr


def test_quick_start_on_two_hosts_equals_one_host(launcher, cluster, marked):
    hostfile, env, hosts = cluster
    marker, d = marked
    args = ["--", os.path.join(d, "quick_start.py"), "--train_size", "2000", "--epochs", "1"]
    two = os.path.join(d, "two_hosts")
    start = time.monotonic()
    proc = run_launcher(["--hostfile", hostfile, "--n-per-node", "2", "--log-level", "DEBUG",
                         "--log-on-all-devices", "--run-dir", two] + args +
                        ["--save_weights", os.path.join(d, "two.npz")], env=env, timeout=300)
    two_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(4 ranks, global batch 64)") == 1, proc.stdout
    # Open MPI and libtnt see two hosts of two ranks each.
    for r in range(4):
        log = open(os.path.join(two, f"rank{r}.log")).read()
        assert f"rank {r} of 4, local rank {r % 2} of 2" in log, log
        assert read_status(two, r)["host"] == hosts[r // 2]
    # One host acting as two (TNT_SPLIT_HOSTS=2: ranks 0-1 and 2-3) runs the
    # same hierarchical allreduce, so every gradient is summed in the same
    # order, (x0 + x1) + (x2 + x3): the only difference left is where the
    # ranks run and what carries their bytes (shared memory and TCP across
    # two network namespaces, or shared memory and MPI on one host), which
    # must not change a bit. (With the default algorithms, one host would
    # sum in another order, ((x0 + x1) + x2) + x3, and the weights would
    # differ by rounding amplified over the training steps, by an amount
    # that depends on the CPU's kernels: no tolerance derived from the
    # reduction alone bounds that.)
    one = os.path.join(d, "one_host")
    start = time.monotonic()
    proc = run_launcher(["-n", "4", "--log-level", "DEBUG", "--run-dir", one] + args +
                        ["--save_weights", os.path.join(d, "one.npz")],
                        env=base_env(TF_CPP_MIN_LOG_LEVEL="3", TNT_SPLIT_HOSTS="2"),
                        timeout=300)
    one_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    a = np.load(os.path.join(d, "two.npz"))
    b = np.load(os.path.join(d, "one.npz"))
    assert list(a.keys()) == list(b.keys())
    worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    print(f"two hosts {two_s:.1f} s, one host {one_s:.1f} s, largest weight difference {worst:g}")
    for run_dir in (two, one):
        log = open(os.path.join(run_dir, "rank0.log")).read()
        assert "context ready: 4 ranks on 2 hosts" in log, log
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_rank_killed_on_a_remote_host(launcher, cluster, marked):
    hostfile, env, hosts = cluster
    marker, d = marked
    run_dir = os.path.join(d, "run")
    proc = start_launcher(["--hostfile", hostfile, "--n-per-node", "2", "--run-dir", run_dir,
                           "--", os.path.join(d, "rank_program.py"), "--sleep", "300"], env=env)
    try:
        ok = wait_for(lambda: all((read_status(run_dir, r) or {}).get("pid", "0") != "0"
                                  for r in range(4)), 60)
        assert ok, "the ranks did not start"
        os.kill(int(read_status(run_dir, 3)["pid"]), signal.SIGKILL)
        start = time.monotonic()
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"launcher exited {elapsed:.1f} s after the kill")
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert elapsed < 30, f"the launcher took {elapsed:.0f} s"
    assert f"rank 3 on host {hosts[1]} failed: it was killed by signal 9" in err, err
    assert wait_for(lambda: not processes_with(marker), 10), processes_with(marker)


def test_two_ranks_per_host_share_memory_within_and_use_the_network_across(launcher, cluster,
                                                                           marked):
    """libtnt groups the ranks by host (MPI's shared-memory split, which
    the namespaces keep apart) and chooses its hierarchical allreduce: a
    shared-memory reduction within each host and a ring across the hosts.
    tnt-bench checks every result exactly; small slots make the vector take
    three segments, the last a partial one. The four ranks know that they
    share one machine's cores."""
    hostfile, env, hosts = cluster
    marker, d = marked
    run_dir = os.path.join(d, "run")
    results = os.path.join(d, "bench.json")
    start = time.monotonic()
    proc = run_launcher(["--hostfile", hostfile, "--n-per-node", "2", "--log-level", "DEBUG",
                         "--log-on-all-devices", "-x", "TNT_SHM_SLOT_KB=16", "--run-dir", run_dir,
                         "--", bench_path(launcher), "allreduce", "--min", "40K", "--max", "40K",
                         "--iters", "1", "--json", results], env=env, timeout=180)
    print(f"tnt-bench on 2 hosts x 2 ranks: {time.monotonic() - start:.1f} s")
    # tnt-bench exits 1 when a result was wrong, 3 when libtnt failed.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(results) as f:
        bench = json.load(f)
    assert (bench["ranks"], bench["hosts"], bench["max_ranks_per_host"]) == (4, 2, 2), bench
    rows = bench["rows"]
    assert [row["bytes"] for row in rows] == [40960], rows
    assert all(row["ok"] for row in rows), rows
    # Across hosts that each hold several ranks libtnt chooses "hier": the
    # shared-memory reduction within a host, the ring among the hosts'
    # leaders, the shared-memory broadcast ("shm" alone is for one host).
    assert {row["algorithm"] for row in rows} == {"hier"}, rows
    for r in range(4):
        with open(os.path.join(run_dir, f"rank{r}.log")) as f:
            log = f.read()
        assert f"[tnt {r}/4] DEBUG: context ready: 4 ranks on 2 hosts" in log, log
        # The hosts are namespaces of one machine: their ranks share its
        # cores, and count so when they choose how to wait.
        assert f"[tnt {r}/4] DEBUG: 4 ranks share this machine's" in log, log
        assert "shared memory is not available" not in log, log
        assert read_status(run_dir, r)["host"] == hosts[r // 2]
