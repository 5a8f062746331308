"""A healthy run says nothing alarming: the quick start's training (2 ranks,
2 epochs of the first 20,000 Fashion-MNIST images: each epoch's steps, the
evaluation, the end of the job, as in the demo) prints no warning, with stall
warnings made sensitive (TNT_STALL_WARNING_S=1) so that a rank that waits a
second for another is reported and fails this test."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, require_ranks_mark

pytestmark = pytest.mark.ranks

DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="dataset-fashion-mnist is not installed")
def test_demo_training_prints_no_warning(tmp_path):
    require_ranks_mark()
    launcher = shutil.which("tarantella")
    assert launcher, "the tarantella launcher is not on PATH: run `make install` first"
    cmd = [launcher, "--no-gpu", "-n", "2", "--output-on-all-devices", "--log-on-all-devices",
           "--run-dir", str(tmp_path), "--python-interpreter", sys.executable, "--",
           os.path.join(ROOT, "examples", "quick_start.py"), "--epochs", "2",
           "--train_size", "20000"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TNT_STALL_WARNING_S="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert re.search(r"test accuracy 0\.[89]", text), text[-2000:]
    # TensorFlow's import banner too: the launcher applies TF_CPP_MIN_LOG_LEVEL
    # to it on the terminal.
    alarming = [line for line in text.splitlines()
                if re.search(r"warn|still waiting|timed out", line, re.IGNORECASE)]
    assert not alarming, "a healthy run printed:\n" + "\n".join(alarming[:20])
    # Between the epochs, only what Keras prints: Tarantella's decisions
    # (the fusion sets' tuning) are DEBUG lines.
    chatter = [line for line in text.splitlines() if "INFO: fusion" in line]
    assert not chatter, "the progress bar is interleaved with:\n" + "\n".join(chatter)
