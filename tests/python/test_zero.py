"""Sharded data parallelism (tnt.Model(..., zero_stage=1, 2 or 3))
against plain data parallelism on the same ranks.

At stages 1 to 3 each rank updates its part of every variable with the
part's gradient, which is bitwise the allreduce's (stage 1 keeps it from
the allreduce, stages 2 and 3 receive it from a reduce-scatter that
computes each block as the allreduce does); an elementwise optimizer then
computes every element as on the whole tensor. Stage 3's passes run on
weights gathered from the parts, the same values. So the weights and the
losses of stages 1 to 3 equal stage 0's bit for bit, and stage 0 equals serial
Keras within the tolerance of test_training.py. Clipping by norm, Lamb
and Adafactor read whole tensors: their norms and means come from the
parts' sums (see test_norm_clipping_equals_stage_zero_within_rounding,
assert_lamb_within_rounding and assert_adafactor_within_rounding).
"""
import json
import os
import re
import sys

import numpy as np
import pytest

from conftest import ROOT, mpirun_command, run

pytestmark = pytest.mark.ranks

WORKER = os.path.join(ROOT, "tests", "python", "zero_worker.py")
ELEMENTWISE = ["sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw", "adamax", "adagrad",
               "adadelta", "rmsprop", "nadam", "lion", "ftrl"]
CLIPPING = ["sgd_clipnorm", "adam_global_clipnorm"]


def train(tmp_path, python, nranks, *args, env=None):
    out = str(tmp_path)
    run(mpirun_command(nranks, python, WORKER, "--out", out, *args), timeout=900, env=env)
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(nranks)]


def weights(result, case, stage):
    prefix = f"{case}/z{stage}/w"
    return [result[k] for k in sorted(result, key=lambda k: (len(k), k)) if k.startswith(prefix)]


def sharded_stages(result, case):
    """The stages above 0 that `case` was trained at."""
    return sorted({int(k.split("/")[1][1:]) for k in result if k.startswith(f"{case}/z")} - {0})


def assert_bitwise_as_stage_zero(results, cases):
    for case in cases:
        for stage in sharded_stages(results[0], case):
            for r, result in enumerate(results):
                for what in ("loss", "accuracy"):
                    assert np.array_equal(result[f"{case}/z{stage}/{what}"],
                                          result[f"{case}/z0/{what}"]), \
                        f"{case}: rank {r}'s {what} at stage {stage} differs from stage 0's"
                for i, (got, want) in enumerate(zip(weights(result, case, stage),
                                                    weights(result, case, 0))):
                    assert np.array_equal(got, want), \
                        f"{case}: rank {r}'s weight {i} at stage {stage} differs from stage " \
                        f"0's by up to {np.max(np.abs(got - want))}"


def assert_ranks_identical(results):
    for key in results[0]:
        if key.endswith(("slot_bytes", "trainable_bytes", "replicated_bytes")):
            continue
        for r, result in enumerate(results[1:], start=1):
            assert np.array_equal(result[key], results[0][key]), \
                f"{key} differs between rank 0 and rank {r}"


def assert_state_is_sharded(results, cases, groups=None):
    """The slots of the ranks of each group (default: all ranks) at stages
    1 to 3 add up to stage 0's, which every rank of the group holds whole;
    so do the trainable weights at stage 3 (the model's variables hold no
    value there, the parts do), which stages 1 and 2 hold whole."""
    for group in groups or [range(len(results))]:
        for case in cases:
            for what in ("slot_bytes", "trainable_bytes"):
                whole = int(results[group[0]][f"{case}/z0/{what}"])
                for stage in sharded_stages(results[group[0]], case):
                    held = [int(results[r][f"{case}/z{stage}/{what}"]) for r in group]
                    if what == "trainable_bytes" and stage < 3:
                        assert held == [whole] * len(held), (case, stage, held, whole)
                        continue
                    # State that every rank holds whole counts once.
                    replicated = [int(results[r][f"{case}/z{stage}/replicated_bytes"])
                                  if what == "slot_bytes" else 0 for r in group]
                    assert len(set(replicated)) == 1, (case, stage, replicated)
                    assert sum(held) - (len(held) - 1) * replicated[0] == whole, \
                        f"{case}: ranks {list(group)}: stage {stage} {what} {held}, stage 0 {whole}"
                    if whole:
                        assert max(held) < whole, f"{case}: a rank holds every {what}: {held}"


# A train_step of its own that applies its gradients with optimizer.apply,
# taken from a tape or from a tnt.DistributedGradientTape (whose gradients
# the optimizer then only cuts into parts).
OWN_STEP = [f"{optimizer}:{model}" for model in ("own_step", "own_step_tape")
            for optimizer in ("sgd_momentum", "adam")]
# Gradients with no static shape of their own (train_worker's sequence
# model), weights first read inside a loop and a cond (at stage 3 gathered
# in the step, before them), a tied embedding read again three layers later
# (which stage 3's backward pass cannot gather again).
SEQUENCE = ["adam:sequence", "adam:looped", "adam:tied_far"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The functional model with every optimizer, clipping included, and the
    models of their own train_step: one 2-rank job."""
    return train(tmp_path_factory.mktemp("two-ranks"), sys.executable, 2,
                 "--cases", ",".join(ELEMENTWISE + CLIPPING + OWN_STEP + SEQUENCE))


def test_elementwise_optimizers_are_bitwise_as_stage_zero(two_ranks):
    assert_ranks_identical(two_ranks)
    assert_bitwise_as_stage_zero(two_ranks, ELEMENTWISE + SEQUENCE)
    assert_state_is_sharded(two_ranks, ELEMENTWISE + SEQUENCE)


def test_three_ranks_are_bitwise_as_stage_zero(tmp_path, python):
    """Parts of unequal size, on a Sequential model, with one optimizer of
    each kind of update: momentum, Adam's moments, a square root of
    accumulated squares (Adagrad, RMSprop), a sign (Lion), FTRL's."""
    cases = ["sgd_momentum", "adam", "adagrad", "rmsprop", "lion", "ftrl"]
    trace = str(tmp_path / "trace.json")
    results = train(tmp_path, python, 3, "--model", "sequential",
                    "--cases", ",".join(cases + ["lamb", "adafactor"]),
                    env={"TNT_TIMELINE": trace})
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)
    assert_state_is_sharded(results, cases + ["lamb", "adafactor"])
    assert_lamb_within_rounding(results[0])
    assert_adafactor_within_rounding(results[0])
    # The timeline names each bucket's collective: stages 0 and 1 allreduce
    # buckets, stages 2 and 3 reduce-scatter them; stages 1 to 3 gather the
    # parts a variable (or the small ones together) at a time.
    for r in range(3):
        with open(tmp_path / f"trace.rank{r}.json") as f:
            comm = [e for e in json.load(f) if e["ph"] == "X" and e["cat"] == "comm"]
        buckets = [e for e in comm if "bucket" in e.get("args", {})]
        assert {e["name"].rsplit(" ", 1)[0] for e in buckets} == \
            {"allreduce bucket", "reduce_scatter bucket"}, r
        for e in buckets:
            assert e["name"].endswith(f" bucket {e['args']['bucket']}"), e
        assert any(e["name"] == "allgather" for e in comm), r


def test_a_paced_backward_pass_is_bitwise_as_stage_zero(tmp_path, python):
    """With no room for gradient buckets waiting for their reduce-scatter
    (TNT_FUSION_IN_FLIGHT_MIB=0), stages 2 and 3 pace every backward pass:
    the op that computes a gradient waits for the start of the one before,
    and a start waits for the bucket before it to be reduced. On 3 ranks,
    with synchronized BatchNormalization (collectives in the backward
    pass), a tied embedding read again far away (an op that an earlier
    gradient needs: not held back), weights read in a loop, and gradients
    with no static shape of their own: no cycle, no deadlock, stage 0's
    weights bit for bit."""
    cases = ["adam:norm_dropout", "sgd_momentum:norm_dropout", "adam:tied_far", "adam:looped",
             "adam:sequence", "adam"]
    results = train(tmp_path, python, 3, "--stages", "0,2,3", "--cases", ",".join(cases),
                    env={"TNT_FUSION_IN_FLIGHT_MIB": "0"})
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)
    assert_state_is_sharded(results, cases)


def test_stage_3_gathers_layers_again_beside_batch_norm_collectives(tmp_path, python):
    """A synchronized BatchNormalization's backward pass runs collectives
    of its own; stage 3 fits them among the gathers and the reduce-scatter's
    starts, so its backward pass still reads a second gather of the layers
    between the last (which keeps its forward pass's gather) and the first
    (whose backward pass reads no weight: the inputs have no gradient):
    Dense, BatchNormalization, Dense, BatchNormalization, Dense, 3 of 5, as
    the master's debug log counts. The weights are stage 0's."""
    out = str(tmp_path)
    proc = run(mpirun_command(2, python, WORKER, "--out", out, "--model", "norm_dropout",
                              "--stages", "0,3", "--cases", "adam"),
               timeout=900, env={"TNT_LOG_LEVEL": "DEBUG"})
    run_dir = re.search(r"logs in (\S+)", proc.stdout + proc.stderr).group(1)
    with open(os.path.join(run_dir, "rank0.log")) as f:
        said = re.findall(r"the backward pass gathers (\d+) of (\d+) layers again", f.read())
    assert said and all(s == ("3", "5") for s in said), said
    results = [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(2)]
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, ["adam"])


def test_batch_norm_and_dropout_on_four_ranks_are_bitwise_as_stage_zero(tmp_path, python):
    """Synchronized and unsynchronized BatchNormalization and Dropout on 4
    ranks (150 samples in batches of 20: the last batch is uneven, 10
    samples, 2 or 3 a rank): the moving statistics are not the optimizer's,
    the masks are drawn alike at every stage, so the weights, the moving
    statistics among them, are stage 0's bit for bit."""
    cases = ["adam", "sgd_momentum"]
    results = train(tmp_path, python, 4, "--model", "norm_dropout", "--cases", ",".join(cases))
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)
    assert_state_is_sharded(results, cases)


def test_a_build_function_at_stage_3_never_allocates_the_whole_model(tmp_path, python):
    """Given a function that builds the model, stage 3 allocates its weights
    one variable at a time (the master's value broadcast, this rank's part
    kept, the variable freed): no rank holds more than the largest variable
    at once, where stage 0 allocates the whole model; the training is
    stage 0's, bit for bit."""
    results = train(tmp_path, python, 2, "--build-fn", "--stages", "0,3", "--cases", "adam")
    assert_bitwise_as_stage_zero(results, ["adam"])
    assert_state_is_sharded(results, ["adam"])
    final = weights(results[0], "adam", 0)
    whole, largest = sum(w.nbytes for w in final), max(w.nbytes for w in final)
    for r, result in enumerate(results):
        assert int(result["adam/z0/allocated_peak"]) == whole, r
        assert int(result["adam/z3/allocated_peak"]) == largest < whole, r


def test_stage_3_holds_a_few_layers_whole(tmp_path, python):
    """Stage 3 gathers a layer's weights when the passes first read them,
    each gather waiting for the readers of the weights two gathers before,
    and a training step's backward pass gathers them again: 16 dense
    layers of 512 units (L = 1 MiB each, W = 16 L), 2 ranks. The results
    are stage 0's bit for bit, and the most memory the tensors of predict,
    evaluate and a training step took (TensorFlow's allocator's count) is
    at most: a layer being gathered (this rank's part L / 2, the gathered
    vector L, the whole weights L), the two before it (2 L), and in
    training a layer's gradients and the next layer's second gather (3 L);
    the batch's activations are 32 x 512 floats, 64 KiB a layer: under 8 L.
    Bound: W / 2, 8 L. Gathering the whole model took more than W, and so
    did keeping the forward pass's gathers for the backward pass (18 L); at
    stage 0 a step holds the averaged gradients, W.

    Between steps a rank's tensors at stage 3 are its part of the weights,
    W / 2, and what Keras keeps beside the weights at stage 0 too (measured
    there: its tensors less W); bound: that and L (when the parts were
    copied out of the whole weights as slices, they kept the whole
    weights' buffers: W more)."""
    env = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_ENABLE_ONEDNN_OPTS": "0"}
    results = train(tmp_path, python, 2, "--pass-memory", env=env)
    for r, result in enumerate(results):
        whole = int(result["weights_kib"])
        for what in ("predict", "evaluate", "fit"):
            assert np.array_equal(result[f"z3/{what}"], result[f"z0/{what}"]), (r, what)
            peak = int(result[f"z3/{what}_peak_kib"])
            assert peak <= whole / 2, \
                f"rank {r}: {what} took {peak} KiB for tensors, W = {whole} KiB"
        assert int(result["z0/fit_peak_kib"]) >= whole, "stage 0 holds the gradients"
        beside = int(result["z0/held_kib"]) - whole
        held = int(result["z3/held_kib"])
        assert held <= whole / 2 + beside + whole / 16, \
            f"rank {r}: {held} KiB of tensors between steps, W = {whole} KiB"


def assert_lamb_within_rounding(result):
    """Lamb scales a variable's update u by ratio = |w| / |u|, norms of
    the whole variable, which stages 1 to 3 add up from the 3 ranks' parts
    (the Sequential model's kernels of 192 and 128 elements are cut across
    ranks here: from each part's own norms the weights differ by about
    1e-2). A sum of n positive squares in any order is within (n - 1) u of
    the exact one (u = 2**-24, n the largest variable's 192 elements), so
    the two orders' sums within 2 (n - 1) u; a norm, their square root,
    (n - 1) u; the ratio of two norms 2 (n - 1) u. An element moves by lr *
    ratio * |u_i| <= lr * |w| a step, so a step's updates differ by at most
    lr * |w| * 2 (n - 1) u. |w| grows by at most a factor (1 + lr) a step,
    so before the last of S steps it was at most |w_S| / (1 - lr)**S. After
    S = 16 steps (lr = 0.01) the weights may differ by S times a step's
    bound, twice that to allow for the differences' own effect on later
    gradients."""
    steps, n, u, lr = 2 * 8, 12 * 16, 2.0 ** -24, 0.01
    final = weights(result, "lamb", 0)
    norm = max(float(np.linalg.norm(w)) for w in final) / (1 - lr) ** steps
    bound = 2 * steps * lr * norm * 2 * (n - 1) * u
    for stage in sharded_stages(result, "lamb"):
        for got, want in zip(weights(result, "lamb", stage), final):
            assert np.max(np.abs(got - want)) <= bound, (stage, np.max(np.abs(got - want)), bound)


def assert_adafactor_within_rounding(result):
    """Adafactor reads sums over whole variables, which stages 1 to 3 add
    up from the 3 ranks' parts in another order than stage 0's: its
    factored moments r and c (means of squared gradients over a kernel's
    rows and columns), the root mean squares of the variable and of the
    update. Each is a sum of at most n positive terms (n = 192, the
    largest variable), so the two orders agree within 2 (n - 1) u (u =
    2**-24). Relatively: r and c within 2 (n - 1) u (a moving average of
    such means stays within it), v = r / mean(r) x c within 6 (n - 1) u,
    u_t = g / sqrt(v) within 3 (n - 1) u, its root mean square within
    (2 (n - 1) u + 6 (n - 1) u) / 2 = 4 (n - 1) u, u_t clipped by it within
    7 (n - 1) u, and the step alpha_t = lr x max(eps_2, rms(w)), whose root
    mean square is within (n - 1) u, brings the update to 8 (n - 1) u. An
    update's element is at most lr x max(eps_2, |w|_max) x sqrt(n) (the
    clipped u_t has a root mean square of at most clip_threshold = 1), so
    |w|_max shrinks by at most a factor (1 - lr sqrt(n)) a step and before
    the last of S steps was at most |w_S|_max / (1 - lr sqrt(n))**S. After
    S = 16 steps the weights may differ by S times 8 (n - 1) u times the
    largest update, twice that to allow for the differences' own effect on
    later gradients. (Each part's own sums instead would move the weights
    by about 2e-2.)"""
    final = weights(result, "adafactor", 0)
    bound = adafactor_bound(final, steps=2 * 8)
    for stage in sharded_stages(result, "adafactor"):
        for got, want in zip(weights(result, "adafactor", stage), final):
            assert np.max(np.abs(got - want)) <= bound, (stage, np.max(np.abs(got - want)), bound)


def adafactor_bound(final, steps, n=12 * 16, lr=0.01, eps_2=1e-3, u=2.0 ** -24):
    """How far Adafactor's weights at stages 1 to 3 may be from stage 0's
    `final` weights after `steps` steps (assert_adafactor_within_rounding
    derives it; n: the largest variable's elements)."""
    largest = max(eps_2, max(float(np.max(np.abs(w))) for w in final)
                  / (1 - lr * np.sqrt(n)) ** steps)
    return 2 * steps * 8 * (n - 1) * u * lr * largest * np.sqrt(n)


def test_a_train_step_of_its_own_is_bitwise_as_stage_zero(two_ranks):
    assert_bitwise_as_stage_zero(two_ranks, OWN_STEP)


def test_every_reader_of_the_weights_sees_stage_zeros(tmp_path, python):
    """Fit's validation, a callback reading the weights after every batch,
    train_on_batch after a fit, a predict of fewer samples than a batch and
    the final weights see stage 0's values, bit for bit: every step's
    updated parts are gathered before anything reads the weights (at stage
    3, by the steps that read them)."""
    cases = ["sgd_momentum", "adam"]
    results = train(tmp_path, python, 2, "--readers", "--cases", ",".join(cases))
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)
    for case in cases:
        for stage in (1, 2, 3):
            for what in ("val_loss", "batch_sums", "predict"):
                assert np.array_equal(results[0][f"{case}/z{stage}/{what}"],
                                      results[0][f"{case}/z0/{what}"]), (case, stage, what)
        assert len(results[0][f"{case}/z0/batch_sums"]) == 8  # 150 samples, batches of 20


def test_mixed_precision_is_bitwise_as_stage_zero(tmp_path, python):
    # Lamb's and Adafactor's allreduces run in the LossScaleOptimizer's
    # branch of finite gradients, beside the step's other collectives.
    cases = ["sgd_momentum", "adam"]
    results = train(tmp_path, python, 2, "--mixed",
                    "--cases", ",".join(cases + ["lamb", "adafactor"]))
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)
    assert_state_is_sharded(results, cases + ["lamb", "adafactor"])
    assert_lamb_within_rounding(results[0])
    assert_adafactor_within_rounding(results[0])


def test_compressed_gradients_are_bitwise_as_stage_zero(tmp_path, python):
    # TNT_COMPRESSION narrows the gradients on the wire, at every stage
    # alike; the weights gathered from the parts travel whole.
    cases = ["sgd_momentum", "adam"]
    results = train(tmp_path, python, 2, "--cases", ",".join(cases),
                    env={"TNT_COMPRESSION": "bf16"})
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)


def test_norm_clipping_equals_stage_zero_within_rounding(two_ranks):
    assert_clipping_within_rounding(two_ranks, CLIPPING)


def assert_clipping_within_rounding(results, cases):
    """A norm is the square root of a sum of n squares; stage 0 adds a
    tensor's squares in one order, stages 1 to 3 add each part's and then
    the parts'. All terms are positive, so either sum is within (n - 1) u
    of the exact one (u = 2**-24, float32; n the elements of the largest
    variable, 12 x 16) and the two within 2 (n - 1) u of each other; the
    square root halves that, and the clipping factor (clip / norm) carries
    it into the update, relatively. Every update here is below 1 (SGD's is
    at most lr * clip = 0.005 an element, Adam's about lr = 0.01), so after
    S steps the weights may differ by S (n - 1) u, twice that to allow for
    the differences' own effect on later gradients."""
    steps, n, u = 2 * 8, 12 * 16, 2.0 ** -24
    for case in cases:
        for stage in sharded_stages(results[0], case):
            for got, want in zip(weights(results[0], case, stage), weights(results[0], case, 0)):
                assert np.max(np.abs(got - want)) <= 2 * steps * (n - 1) * u, case


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "mixed"])
def test_pipeline_replicas_shard_each_stage(tmp_path, python, mixed):
    """ParallelStrategy.ALL on 2 stages x 2 replicas: each stage's two
    replicas (ranks s and s + 2) shard its optimizer state, bitwise as stage
    0 (the stage's gradients averaged over its replicas, as at stage 0).
    float32: 1F1B on the Functional model, norm clipping on the Sequential
    one (equal within rounding, as data-parallel). Mixed precision: ZB-H1 on
    the Sequential model, whose loss scale decides from every replica's
    parts."""
    if mixed:
        cases = ["adam", "sgd_momentum"]
        results = train(tmp_path, python, 4, "--pipeline", "2", "--schedule", "zb-h1",
                        "--model", "sequential", "--mixed", "--cases", ",".join(cases))
    else:
        cases = ["adam", "sgd_momentum", "rmsprop"]
        clipping = [f"{c}:sequential" for c in CLIPPING]
        results = train(tmp_path, python, 4, "--pipeline", "2",
                        "--cases", ",".join(cases + clipping + ["adafactor"]))
        assert_clipping_within_rounding(results, clipping)
        assert_adafactor_within_rounding(results[0])
        assert_state_is_sharded(results, ["adafactor"], groups=[(0, 2), (1, 3)])
    assert_ranks_identical(results)
    assert_bitwise_as_stage_zero(results, cases)
    assert_state_is_sharded(results, cases, groups=[(0, 2), (1, 3)])
