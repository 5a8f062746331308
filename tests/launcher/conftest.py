"""Fixtures of the launcher tests."""
import os
import stat

import pytest

from launcher_util import launcher_path


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
