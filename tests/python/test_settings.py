"""The Keras layer's view of the settings registry (tarantella.settings):
typed values, one error policy, and no module reading the environment
itself. The registry's parsing is tested in C (tests/unit/test_settings.c),
the launcher's --settings in tests/launcher/test_cli.py."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

from tarantella import settings


@pytest.fixture
def env_settings(monkeypatch):
    """set(NAME=VALUE, ...): these settings for this test."""
    def set_settings(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        settings.load()
    yield set_settings
    monkeypatch.undo()
    settings.load()


def test_values_have_python_types(env_settings):
    env_settings(TNT_TIMEOUT_S="12.5", TNT_DATA_SHARE="0", TNT_RING_DEPTH="4",
                 TNT_FUSION_THRESHOLD_KB="auto", TNT_TIMELINE="", TNT_LOG_LEVEL="warning",
                 TNT_OUTPUT_ON_ALL_DEVICES="yes")
    assert settings.get("TNT_TIMEOUT_S") == 12.5
    assert settings.get("TNT_DATA_SHARE") == "off"
    assert settings.get("TNT_RING_DEPTH") == 4 and isinstance(settings.get("TNT_RING_DEPTH"), int)
    assert settings.get("TNT_FUSION_THRESHOLD_KB") == "auto"
    assert settings.get("TNT_TIMELINE") is None
    assert settings.get("TNT_OUTPUT_ON_ALL_DEVICES") is True
    assert settings.get("TNT_LOG_LEVEL") == "WARNING"
    rows = {s["name"]: s for s in settings.describe()}
    assert rows["TNT_TIMEOUT_S"]["source"] == "environment"
    assert rows["TNT_COMPRESSION"]["source"] == "default"
    assert rows["TNT_COMPRESSION"]["words"] == ("none", "fp16", "bf16")


def test_a_bad_value_raises_naming_what_the_setting_takes(env_settings, monkeypatch):
    from tarantella import TarantellaError
    monkeypatch.setenv("TNT_COMPRESSION", "fp8")
    with pytest.raises(TarantellaError, match=re.escape(
            "TNT_COMPRESSION=fp8 is not a value TNT_COMPRESSION takes: use none, fp16 or bf16 "
            "(default none); fix or unset it")):
        settings.load()


def run_python(code, **env):
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=300)


def test_init_fails_on_a_bad_setting_and_logs_sources_at_debug():
    code = "import tarantella as tnt\ntnt.init()\nprint('ok')\n"
    proc = run_python(code, TNT_OVERLAP="sometimes")
    assert proc.returncode == 1
    assert "TarantellaError: TNT_OVERLAP=sometimes is not a value TNT_OVERLAP takes" in proc.stderr
    proc = run_python(code, TNT_LOG_LEVEL="DEBUG", TNT_TIMEOUT_S="45")
    assert proc.returncode == 0, proc.stderr
    assert "setting TNT_TIMEOUT_S=45 (environment)" in proc.stderr
    assert "setting TNT_COMPRESSION=none (default)" in proc.stderr


def test_no_module_reads_the_environment_itself():
    """Only the registry reads TNT_* variables; _requirements.py reads
    TensorFlow's and Keras's (KERAS_BACKEND, before Keras is imported;
    TF_NUM_INTRAOP_THREADS)."""
    package = os.path.join(ROOT, "python", "tarantella")
    readers = []
    for dirpath, _, names in os.walk(package):
        for name in names:
            if not name.endswith(".py") or name == "_requirements.py":
                continue
            path = os.path.join(dirpath, name)
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if re.search(r"os\.environ|os\.getenv|getenv\(", line):
                        readers.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert readers == []
