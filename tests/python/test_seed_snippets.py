"""The original documentation's snippets run under Tarantella with Keras 3
on 2 ranks, or fail with a message that says what to write instead."""
import os

import pytest

from conftest import ROOT, mpirun_command, run

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "seed_snippets_worker.py")

RUN = ["ranks", "history on the master only", "global batch from micro-batch size",
       "tnt_micro_batch_size", "save and load", "model_from_config", "Model.from_config",
       "to_json and model_from_json", "clone_model", "restore from config and weights",
       "save_weights and load_weights", "ModelCheckpoint with .keras", "save on all devices",
       "reproducibility"]
# Snippets Keras 3 cannot run as written: the message says what to write.
FAIL = {
    "save to a path without suffix": "Invalid filepath extension for saving. Please add either "
                                     "a `.keras` extension",
    "save_model without suffix": "Invalid filepath extension for saving",
    "to_yaml": "to_yaml() is gone from Keras 3: use model.to_json()",
    "model_from_yaml": "model_from_yaml() is gone from Keras 3: save the architecture with "
                       "model.to_json()",
    "ModelCheckpoint as documented": "unexpected keyword argument 'options'",
    "ModelCheckpoint without options": "The filepath provided must end in `.keras`",
}


@pytest.fixture(scope="module")
def output(tmp_path_factory, python=None):
    import sys
    out = tmp_path_factory.mktemp("snippets")
    proc = run(mpirun_command(2, sys.executable, WORKER, str(out)), timeout=900)
    return proc.stdout.splitlines()


@pytest.mark.parametrize("name", RUN)
def test_snippet_runs(name, output):
    for rank_line in (x for x in output if x.endswith(f" {name}") or f" {name}:" in x):
        assert rank_line == f"ok {name}", rank_line
    assert output.count(f"ok {name}") == 2, f"{name}: not ok on both ranks: {output}"


@pytest.mark.parametrize("name", sorted(FAIL))
def test_snippet_fails_saying_what_to_write(name, output):
    errors = [x for x in output if x.startswith(f"error {name}:")]
    assert len(errors) == 2, f"{name}: expected an error on both ranks: {output}"
    for line in errors:
        assert FAIL[name] in line, line
