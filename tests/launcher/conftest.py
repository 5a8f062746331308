"""Fixtures of the launcher tests."""
import os
import stat
import uuid

import pytest

from launcher_util import HERE, QUICK_START, kill_leftovers, launcher_path, processes_with

PROGRAM = os.path.join(HERE, "rank_program.py")


@pytest.fixture(scope="session")
def launcher():
    path = launcher_path()
    if path is None or not os.path.exists(path):
        pytest.fail("no tarantella launcher: build it (make build) or set TNT_LAUNCHER")
    return path


@pytest.fixture
def fake_mpich(tmp_path):
    """An executable that answers --version like MPICH's mpiexec."""
    path = tmp_path / "mpiexec"
    path.write_text("#!/bin/sh\necho 'HYDRA build details:'\necho '    Version: 4.0'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def fake_sys(tmp_path):
    """Builds a fake /dev and /sys under a root for TNT_SYS_ROOT."""
    def make(gpus=0, numa_nodes=1):
        root = tmp_path / f"sys-{gpus}-{numa_nodes}"
        (root / "dev").mkdir(parents=True)
        (root / "dev" / "nvidiactl").touch()
        for i in range(gpus):
            (root / "dev" / f"nvidia{i}").touch()
        for n in range(numa_nodes):
            node = root / "sys" / "devices" / "system" / "node" / f"node{n}"
            node.mkdir(parents=True)
            (node / "cpulist").write_text(f"{n}\n")
        return str(root)
    return make


@pytest.fixture
def script(tmp_path):
    """Writes a small Python program and returns its path."""
    def make(text, name="prog.py"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return make


@pytest.fixture
def marked(tmp_path):
    """A directory whose unique name appears in the command line of every
    process of a run (launcher, mpirun, wrappers, programs), so that the
    test can tell whether any of them is left."""
    marker = f"tnt-marker-{uuid.uuid4().hex[:12]}"
    d = tmp_path / marker
    d.mkdir()
    with open(PROGRAM) as src:
        (d / "rank_program.py").write_text(src.read())
    os.symlink(QUICK_START, d / "quick_start.py")
    yield marker, str(d)
    leftovers = processes_with(marker)
    kill_leftovers(marker)
    assert not leftovers, f"processes left behind: {leftovers}"
