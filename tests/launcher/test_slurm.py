"""The launcher inside a real Slurm allocation: Debian's slurmctld on this
machine and one slurmd per simulated host (a network namespace of
sim_cluster.sh, with its own host name and /dev/shm), all configured and
kept in a temporary directory, and every daemon killed at the end. Jobs
ask for 2 nodes, and `tarantella -- PROGRAM` without a hostfile must run
the ranks on both, placed as the allocation says, started through Slurm
(Open MPI's mpirun starts its daemons on the other nodes with srun).
Needs root and Slurm (tools/setup/install_deps.sh installs it)."""
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

from launcher_util import (HERE, base_env, cluster_skip_reason, kill_leftovers, launcher_path,
                           processes_with, sim_cluster, wait_for)

PROGRAM = os.path.join(HERE, "rank_program.py")
SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "salloc", "sinfo", "scontrol", "nsenter")
RUNNING_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


def skip_reason():
    reason = cluster_skip_reason()
    if reason is not None:
        return reason
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if missing:
        return (f"{', '.join(missing)} not found (tools/setup/install_deps.sh installs Slurm; "
                "nsenter comes with util-linux)")
    return None


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def slurm_conf(d, hosts, address, port):
    """A cluster of the simulated hosts, 2 CPUs each, without cgroups,
    accounting or authentication (the daemons and the jobs are all root's)."""
    nodes = "\n".join(f"NodeName={host} NodeAddr={address.rsplit('.', 1)[0]}.{i + 2} CPUs=2 "
                      "State=UNKNOWN" for i, host in enumerate(hosts))
    return f"""ClusterName=tnt
SlurmctldHost=tnt-slurmctld({address})
SlurmctldPort={port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
{nodes}
PartitionName=tnt Nodes=ALL Default=YES MaxTime=10 State=UP
"""


def logs(d):
    """The end of every daemon's log, for a failure message."""
    text = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".log") or name.endswith(".out"):
            with open(os.path.join(d, name), errors="replace") as f:
                text.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
    return "\n".join(text)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Slurm on two simulated hosts, named so that Slurm compresses their
    list (tnt-slurm-ID-[1-2]); yields (environment for sbatch and salloc,
    hosts, directory)."""
    d = tmp_path_factory.mktemp("slurm")
    (d / "state").mkdir()
    daemons = []
    with sim_cluster("tnt-slurm", ["1", "2"]) as (hosts, net, address):
        try:
            conf = d / "slurm.conf"
            conf.write_text(slurm_conf(d, hosts, address, free_port()))
            # slurmctld checks that the host it runs on is SlurmctldHost: it
            # runs here, reachable on the hosts' network, under that name.
            with open(d / "slurmctld.out", "w") as out:
                daemons.append(subprocess.Popen(
                    ["unshare", "--uts", "sh", "-c", 'hostname tnt-slurmctld && exec "$@"', "sh",
                     "slurmctld", "-D", "-i", "-f", str(conf)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            for host in hosts:
                (d / f"spool-{host}").mkdir()
                with open(d / f"slurmd-{host}.out", "w") as out:
                    daemons.append(subprocess.Popen(
                        [os.path.join(HERE, "sim_cluster.sh"), "daemon", host, "slurmd", "-D",
                         "-N", host, "-f", str(conf)],
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            env = base_env(
                SLURM_CONF=str(conf),
                # Open MPI talks to the hosts over their network only.
                OMPI_MCA_oob_tcp_if_include=net,
                OMPI_MCA_btl_tcp_if_include=net,
                OMPI_MCA_btl="self,vader,tcp")

            def idle():
                states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env,
                                        capture_output=True, text=True, timeout=10).stdout
                return states.split() == ["idle", "idle"]

            assert wait_for(idle, 60), f"the Slurm nodes did not come up:\n{logs(d)}"
            yield env, hosts, d
        finally:
            # SIGTERM lets slurmctld end its helper (slurmscriptd) too.
            for daemon in daemons:
                daemon.terminate()
            for daemon in daemons:
                try:
                    daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
            # The hosts' processes (slurmstepd and what it started) end with
            # the simulated hosts.


@pytest.fixture
def marked(tmp_path):
    """A directory whose name marks every process of the test's jobs."""
    d = tmp_path / f"tnt-marker-{os.urandom(6).hex()}"
    d.mkdir()
    shutil.copy(PROGRAM, d / "rank_program.py")
    yield d
    gone = wait_for(lambda: not processes_with(d.name), 10)
    leftovers = processes_with(d.name)
    kill_leftovers(d.name)
    assert gone, f"processes left behind: {leftovers}"


def where(stdout):
    """{rank: (host, [names of the processes it runs under])} of rank_program.py --where."""
    found = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) == 8 and words[0] == "rank" and words[4] == "on" and words[6] == "under":
            found[int(words[1])] = (words[5], words[7].split(","))
    return found


def check_placement(ranks, hosts, local_host):
    """Ranks 0, 1 on the first host and 2, 3 on the second; a rank on a host
    other than the launcher's runs under Open MPI's daemon, which srun
    started through slurmd (slurmstepd) there."""
    assert sorted(ranks) == [0, 1, 2, 3], ranks
    for rank, (host, under) in ranks.items():
        assert host == hosts[rank // 2], ranks
        if host != local_host:
            assert "orted" in under and "slurmstepd" in under, (rank, under)


def test_sbatch_runs_ranks_on_the_nodes_of_the_allocation(launcher, slurm, marked):
    env, hosts, d = slurm
    job = marked / "job.sh"
    job.write_text(f"#!/bin/sh\nexec {launcher_path()} --output-on-all-devices "
                   f"--run-dir {marked}/run -- {marked}/rank_program.py --where\n")
    job.chmod(0o755)
    start = time.monotonic()
    # 4 tasks on 2 nodes: Slurm gives 2 to each, in SLURM_TASKS_PER_NODE.
    proc = subprocess.run(["sbatch", "--parsable", "-N", "2", "-n", "4", "--time", "2",
                           "-o", str(marked / "out"), "-e", str(marked / "err"), str(job)],
                          env=env, capture_output=True, text=True, timeout=30, cwd=marked)
    assert proc.returncode == 0, f"{proc.stderr}\n{logs(d)}"
    job_id = proc.stdout.strip()

    def finished():
        """The job's record once it ended (sbatch --wait polls only every few seconds)."""
        show = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                              capture_output=True, text=True, timeout=10).stdout
        state = re.search(r"JobState=(\S+)", show)
        return show if state and state.group(1) not in RUNNING_STATES else None

    record = wait_for(finished, 150)
    elapsed = time.monotonic() - start
    out = (marked / "out").read_text() if (marked / "out").exists() else ""
    err = (marked / "err").read_text() if (marked / "err").exists() else ""
    assert record is not None and "JobState=COMPLETED" in record and "ExitCode=0:0" in record, \
        f"{record}\n{out}\n{err}\n{logs(d)}"
    print(f"sbatch job of 4 ranks: {elapsed:.1f} s")
    # The batch script runs on the first node, and so does the launcher.
    check_placement(where(out), hosts, hosts[0])
    # The launcher says where its hosts came from: the allocation's list, as
    # Slurm compressed it, and its tasks per node.
    prefix = hosts[0][:-1]
    assert (f"tarantella: hosts from the Slurm allocation, job {job_id}: "
            f"SLURM_JOB_NODELIST={prefix}[1-2]; 2 rank(s) per node from "
            f"SLURM_TASKS_PER_NODE=2(x2)\n") in err, err
    assert "tarantella: 4 ranks on 2 hosts (2 per host), on the CPU" in err, err


def test_salloc_with_more_ranks_per_node_than_tasks(launcher, slurm, marked):
    """The launcher outside the nodes (as on a login node), with
    --n-per-node above the allocation's 1 task per node."""
    env, hosts, d = slurm
    proc = subprocess.run(["salloc", "-N", "2", "--ntasks-per-node", "1", "--time", "2",
                           launcher_path(), "--n-per-node", "2", "--output-on-all-devices",
                           "--run-dir", str(marked / "run"), "--",
                           str(marked / "rank_program.py"), "--where"],
                          env=env, capture_output=True, text=True, timeout=150, cwd=marked,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs(d)}"
    check_placement(where(proc.stdout), hosts, None)
    assert "tarantella: 4 ranks on 2 hosts (2 per host), on the CPU" in proc.stderr
    assert f"SLURM_JOB_NODELIST={hosts[0][:-1]}[1-2]\n" in proc.stderr, proc.stderr


def test_under_srun_is_refused(launcher, slurm, marked):
    """Under srun every task would start a whole run, and the task variables
    describe the step: a clear message instead."""
    env, hosts, d = slurm
    proc = subprocess.run(["salloc", "-N", "2", "-n", "2", "--time", "2", "srun", "-N", "1", "-n",
                           "1", launcher_path(), "--run-dir", str(marked / "run"), "--",
                           str(marked / "rank_program.py")],
                          env=env, capture_output=True, text=True, timeout=60, cwd=marked,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, f"{proc.stdout}\n{proc.stderr}"
    assert ("tarantella: error: tarantella runs in a Slurm job step (SLURM_STEP_ID=0: under "
            "srun)") in proc.stderr, proc.stderr
    assert not os.path.exists(marked / "run")
