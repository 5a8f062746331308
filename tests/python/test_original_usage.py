"""Code written for the original Tarantella runs: its call forms (the
original's test suite, in Keras 3 spelling), each a test here; the launcher's
`-x A=1 B=2` is in tests/launcher (test_cli.py, test_launcher_options.c)."""
import os
import sys

import pytest

from conftest import ROOT, mpirun_command, run

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "original_usage_worker.py")


# The modes of each job, run one after another in one launch (lazy_init
# first: it starts the runtime without tnt.init()).
JOBS = {1: "save_uncompiled,one_stage:PIPELINING,wrap,from_config_twice",
        2: "lazy_init,strategy,one_stage:ALL,callbacks,sequential,split_save"}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Per number of ranks: the job's stdout lines and its whole output;
    both write into one folder, "files"."""
    out = tmp_path_factory.mktemp("files")
    done = {}
    for nranks, modes in JOBS.items():
        proc = run(mpirun_command(nranks, sys.executable, WORKER, modes, str(out)), timeout=600)
        done[nranks] = proc.stdout.splitlines(), proc.stdout + proc.stderr
    done["files"] = out
    return done


def has(lines, expected, count=1):
    found = [line for line in lines if expected in line]
    assert len(found) == count, f"{expected!r} in {len(found)} lines, not {count}: {lines}"


def test_positional_strategy_and_num_pipeline_stages(jobs):
    lines, text = jobs[2]
    has(lines, "positional DATA trained True", 2)
    has(lines, "num_pipeline_stages as micro-batches 4", 2)
    has(lines, "pipelined loss finite True", 2)
    assert "num_pipeline_stages=4 taken as num_micro_batches" in text


def test_model_without_split_layers_is_one_stage(jobs):
    lines, text = jobs[2]
    has(lines, "ALL one stage pipelined False", 2)
    has(lines, "ALL one stage trained, same on every rank True", 2)
    assert "has no SplitLayer: it is one pipeline stage, trained data-parallel on 2" in text
    lines, _ = jobs[1]
    has(lines, "PIPELINING one stage trained, same on every rank True")


def test_explicit_progbar_prints_once_and_fit_returns_the_users_history(jobs):
    lines, _ = jobs[2]
    # verbose=2: one line per epoch, as plain Keras prints, on each of the 2
    # ranks (the test shows every rank's output); a duplicated bar made 4.
    for epoch in (1, 2, 3):
        has(lines, f"Epoch {epoch}/3", 2)
    assert sum(1 for line in lines if "step - loss:" in line) == 6, lines
    has(lines, "fit returned the user's History True ['loss'] 3", 2)


@pytest.mark.parametrize("nranks", [1, 3])
def test_the_originals_collectives_suite(nranks, python):
    """The original's tensor_allreducer/broadcaster/allgatherer tests
    (original_collectives_cases.py), run by pytest on every rank."""
    cases = os.path.join(ROOT, "tests", "python", "original_collectives_cases.py")
    # Without conftest.py, whose session fixture makes a temporary folder:
    # the ranks' pytest sessions would share (and clean up) pytest's
    # temporary root with each other and with this session.
    proc = run(mpirun_command(nranks, python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "--noconftest", cases), timeout=600)
    summaries = [line for line in proc.stdout.splitlines() if " passed" in line]
    assert len(summaries) == nranks and all(
        "failed" not in line and "error" not in line for line in summaries), proc.stdout[-3000:]


def test_save_before_compile_and_pipelined_cuts_load_in_plain_keras(jobs):
    lines, _ = jobs[1]
    has(lines, "saved before compile")
    lines, _ = jobs[2]
    has(lines, "reloaded stages 2 cut ['tnt_split_cut']", 2)
    has(lines, "reloaded same predictions True", 2)
    plain = run([sys.executable, WORKER, "plain_load", str(jobs["files"])]).stdout.splitlines()
    has(plain, "uncompiled loaded Functional same predictions True ['InputLayer', 'Dense', "
               "'Dense']")
    has(plain, "piped loaded Functional same predictions True ['InputLayer', 'Dense', "
               "'Identity', 'Dense']")
    has(plain, "tarantella imported False")


def test_tnt_sequential(jobs):
    lines, _ = jobs[2]
    has(lines, "tnt.Sequential is Sequential True True", 2)
    has(lines, "from_config is Sequential True", 2)
    has(lines, "Sequential trained, same on every rank True", 2)


def test_wrapping_leaves_the_users_model_and_round_trips_through_keras(jobs):
    lines, _ = jobs[1]
    for kind, cls in (("Functional", "Functional"), ("Sequential", "Sequential"),
                      ("Subclassed", "Subclassed")):
        has(lines, f"{kind} user model unchanged True")
        has(lines, f"{kind} wrapped thrice True 3")
        has(lines, f"{kind} shares the weights True")
        for how in ("type(w).from_config", "tnt.Model.from_config", "tnt clone_model",
                    "tnt model_from_json"):
            has(lines, f"{kind} {how} {cls} True True True")
        # Keras's own clone_model rebuilds a Functional model through its
        # class (a tnt.Model again), a Sequential or subclassed one as the
        # plain Keras class, as for any subclass of those.
        has(lines, f"{kind} keras clone_model {cls} True {kind == 'Functional'} True")
        has(lines, f"{kind} keras model_from_json plain True")
        has(lines, f"{kind} after fit user model uncompiled True same predictions True")


def test_from_config_leaves_its_argument_and_can_be_called_twice(jobs):
    lines, _ = jobs[1]
    for kind in ("Functional", "Sequential", "Subclassed"):
        has(lines, f"{kind} tnt.Model.from_config twice True True")
        has(lines, f"{kind} tnt.models.model_from_config twice True True")
    for kind in ("Functional", "Sequential"):
        has(lines, f"{kind} type(w).from_config twice True True")
    has(lines, "Sequential tnt.Sequential.from_config twice True True")


def test_init_is_optional(jobs):
    lines, _ = jobs[2]
    has(lines, "size 2 rank 0")
    has(lines, "size 2 rank 1")
    has(lines, "trained without tnt.init() True", 2)
