/*
 * Tensor fusion over MPI, at any number of ranks: the bucket plan for
 * thresholds 0, 256 bytes and 64 MiB against the documented rules; several
 * steps in which every rank starts its tensors in its own random order and
 * finishes them in another (both seeded by rank and step), with exact
 * averages on integer-valued data; bitwise determinism on random reals (a
 * second run in different orders gives the same bits, and every rank holds
 * the same bits); a set on a subgroup and a SUM set; and the error cases.
 */
#include "mpi_test_util.h"
#include "fusion/runtime.h"
#include "util/reduce.h"
#include "util/settings.h"

/* The tensor list, in backprop order: float32 mostly, some float16 and
 * float64, sizes from 1 element to 300000. Ids are not indices. */
static const struct {
  size_t count;
  tnt_dtype_t dtype;
} kTensors[] = {
    {1000, TNT_FLOAT32}, {1, TNT_FLOAT32},   {513, TNT_FLOAT16},    {65536, TNT_FLOAT32},
    {2, TNT_FLOAT64},    {17, TNT_FLOAT32},  {300000, TNT_FLOAT32}, {5, TNT_FLOAT16},
    {3, TNT_FLOAT32},    {777, TNT_FLOAT64}, {4097, TNT_FLOAT32},   {100, TNT_FLOAT32},
    {2000, TNT_FLOAT16}, {64, TNT_FLOAT32},  {10000, TNT_FLOAT64},  {123457, TNT_FLOAT32},
    {1, TNT_FLOAT32},    {40, TNT_FLOAT32},  {63, TNT_FLOAT32},     {1, TNT_FLOAT16},
};
#define NT (sizeof kTensors / sizeof kTensors[0])

static const size_t kThresholds[] = {0, 256, (size_t)64 << 20};
#define NTHRESH 3

static int g_rank, g_size;

static uint64_t tensor_id(size_t t) {
  return 1000 + 7 * (uint64_t)t;
}

static void tensor_list(tnt_tensor_info_t *info) {
  for (size_t t = 0; t < NT; t++) {
    info[t].id = tensor_id(t);
    info[t].count = kTensors[t].count;
    info[t].dtype = kTensors[t].dtype;
  }
}

/* The documented planner rules: one open bucket per dtype; a tensor joins
 * the open bucket of its dtype (or opens one); a bucket closes once it
 * holds at least the threshold; buckets are numbered in opening order. */
static size_t plan_model(size_t threshold, long *bucket_of) {
  long open[TNT_DTYPE_COUNT];
  size_t bytes[NT];
  size_t nb = 0;
  for (int d = 0; d < TNT_DTYPE_COUNT; d++) open[d] = -1;
  for (size_t t = 0; t < NT; t++) {
    int d = kTensors[t].dtype;
    if (open[d] < 0) {
      open[d] = (long)nb;
      bytes[nb++] = 0;
    }
    bucket_of[t] = open[d];
    bytes[open[d]] += kTensors[t].count * mt_dsize(kTensors[t].dtype);
    if (bytes[open[d]] >= threshold) open[d] = -1;
  }
  return nb;
}

static void check_plan(tnt_fusion_t *f, size_t threshold) {
  long want[NT];
  size_t nb = plan_model(threshold, want);
  mt_set_case("plan threshold=%zu: tnt_fusion_num_buckets", threshold);
  size_t got_nb = tnt_fusion_num_buckets(f);
  MT_CHECK(got_nb == nb, "expected %zu buckets, got %zu", nb, got_nb);
  if (threshold == 0) {
    MT_CHECK(got_nb == NT, "threshold 0 means one tensor per bucket: expected %zu, got %zu",
             (size_t)NT, got_nb);
  }
  mt_set_case("plan threshold=%zu: tnt_fusion_bucket_of", threshold);
  for (size_t t = 0; t < NT; t++) {
    long got = tnt_fusion_bucket_of(f, tensor_id(t));
    if (got != want[t]) {
      mt_fail((long)t, "bucket of tensor id %" PRIu64 ": expected %ld, got %ld", tensor_id(t),
              want[t], got);
    }
  }
  MT_CHECK(tnt_fusion_bucket_of(f, 999999) == -1, "bucket of unknown id: expected -1, got %ld",
           tnt_fusion_bucket_of(f, 999999));
  MT_CHECK(tnt_fusion_bucket_of(f, tensor_id(0) + 1) == -1,
           "bucket of unknown id %" PRIu64 ": expected -1, got %ld", tensor_id(0) + 1,
           tnt_fusion_bucket_of(f, tensor_id(0) + 1));
}

/* Per-tensor buffers of one step. */
typedef struct tensors {
  void *in[NT];   /* this rank's contribution (kept for checks) */
  void *src[NT];  /* what is passed to start (scribbled afterwards) */
  void *out[NT];  /* what finish writes */
  void *want[NT]; /* the exact expected result (integer runs) */
} tensors_t;

static void tensors_alloc(tensors_t *T) {
  for (size_t t = 0; t < NT; t++) {
    size_t bytes = kTensors[t].count * mt_dsize(kTensors[t].dtype);
    T->in[t] = mt_alloc(bytes);
    T->src[t] = mt_alloc(bytes);
    T->out[t] = mt_alloc(bytes);
    T->want[t] = mt_alloc(bytes);
  }
}

static void tensors_free(tensors_t *T) {
  for (size_t t = 0; t < NT; t++)
    free(T->in[t]), free(T->src[t]), free(T->out[t]), free(T->want[t]);
}

/* The integer base value of element i of tensor t at `step` (small for
 * float16 so that every partial sum stays exact). */
static double base_value(size_t t, size_t i, int step) {
  uint64_t h = mt_mix64(((uint64_t)t << 40) ^ ((uint64_t)step << 32) ^ i);
  if (kTensors[t].dtype == TNT_FLOAT16) return (double)(int64_t)(h % 41) - 20.0;
  return (double)(int64_t)(h % 200001) - 100000.0;
}

/* Offsets that sum to zero over the group, and differ from zero for every
 * rank when the group has more than one member. */
static double offset(int grank, int gsize) {
  if (gsize == 1) return 0.0;
  return grank < gsize - 1 ? (double)(grank + 1) : -(double)(gsize * (gsize - 1) / 2);
}

/*
 * Fills inputs for a step. Integer data (`random_reals` 0): rank g adds
 * offset(g) to a common base, so the average is exactly the base and the
 * sum is gsize times the base. Random reals: independent per rank.
 */
static void fill_step(tensors_t *T, int grank, int gsize, int step, int random_reals, tnt_op_t op) {
  for (size_t t = 0; t < NT; t++) {
    tnt_dtype_t dt = kTensors[t].dtype;
    mt_rng_t rng = mt_rng((uint64_t)g_rank, (uint64_t)step, t);
    for (size_t i = 0; i < kTensors[t].count; i++) {
      if (random_reals) {
        mt_store(dt, T->in[t], i, mt_uniform(&rng) * 4.0);
      } else {
        double b = base_value(t, i, step);
        mt_store(dt, T->in[t], i, b + offset(grank, gsize));
        mt_store(dt, T->want[t], i, op == TNT_SUM ? b * gsize : b);
      }
    }
  }
}

/* A fusion set over the whole tensor list, checked against the model. */
static tnt_fusion_t *make_set(tnt_group_t *g, size_t threshold, tnt_op_t op) {
  tnt_tensor_info_t info[NT];
  tensor_list(info);
  mt_set_case("tnt_fusion_create threshold=%zu op=%s", threshold, mt_oname(op));
  tnt_fusion_t *f = NULL;
  MT_OK(tnt_fusion_create(g, info, NT,
                          &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = threshold, .op = op}, &f));
  if (f == NULL) mt_fatal("tnt_fusion_create succeeded but gave NULL");
  check_plan(f, threshold);
  return f;
}

/* Starts one tensor, then scribbles over the caller's copy (start copies
 * the data, so the buffer is the caller's again at once). */
static void start_one(tnt_fusion_t *f, tensors_t *T, size_t t) {
  size_t bytes = kTensors[t].count * mt_dsize(kTensors[t].dtype);
  memcpy(T->src[t], T->in[t], bytes);
  tnt_status_t st = tnt_fusion_start(f, tensor_id(t), T->src[t]);
  if (st != TNT_OK) mt_fatal("tnt_fusion_start(id %" PRIu64 "): %s", tensor_id(t), mt_st(st));
  memset(T->src[t], 0x5a, bytes);
}

static void finish_one(tnt_fusion_t *f, tensors_t *T, size_t t) {
  mt_fill_sentinel(T->out[t], kTensors[t].count, kTensors[t].dtype);
  tnt_status_t st = tnt_fusion_finish(f, tensor_id(t), T->out[t], -1);
  if (st != TNT_OK) mt_fatal("tnt_fusion_finish(id %" PRIu64 "): %s", tensor_id(t), mt_st(st));
}

/*
 * One step: start every tensor in a random order seeded by (rank, step,
 * salt), finish in another. With `interleave`, finishes are mixed into the
 * starts: a tensor may be finished once every tensor of its bucket and of
 * every earlier bucket has been started here (buckets are submitted in plan
 * order, so finishing earlier would wait on this rank's own later starts).
 */
static void run_step(tnt_fusion_t *f, tensors_t *T, int step, uint64_t salt, int interleave) {
  size_t start_order[NT], finish_order[NT];
  mt_rng_t rng = mt_rng((uint64_t)g_rank, (uint64_t)step, salt);
  mt_shuffle(start_order, NT, &rng);
  mt_shuffle(finish_order, NT, &rng);
  if (!interleave) {
    for (size_t k = 0; k < NT; k++) start_one(f, T, start_order[k]);
    for (size_t k = 0; k < NT; k++) finish_one(f, T, finish_order[k]);
    return;
  }
  size_t nb = tnt_fusion_num_buckets(f);
  size_t *unstarted = mt_alloc(nb * sizeof *unstarted);
  memset(unstarted, 0, nb * sizeof *unstarted);
  for (size_t t = 0; t < NT; t++) unstarted[tnt_fusion_bucket_of(f, tensor_id(t))]++;
  int finished[NT] = {0};
  size_t nfinished = 0;
  for (size_t k = 0; k <= NT; k++) {
    if (k < NT) {
      size_t t = start_order[k];
      start_one(f, T, t);
      unstarted[tnt_fusion_bucket_of(f, tensor_id(t))]--;
    }
    /* The first bucket with an unstarted member bounds what may finish. */
    size_t ready = 0;
    while (ready < nb && unstarted[ready] == 0) ready++;
    for (size_t j = 0; j < NT; j++) {
      size_t t = finish_order[j];
      if (finished[t] || (size_t)tnt_fusion_bucket_of(f, tensor_id(t)) >= ready) continue;
      if (k < NT && mt_next(&rng) % 3 != 0) continue; /* finish some now, some later */
      finish_one(f, T, t);
      finished[t] = 1;
      nfinished++;
    }
  }
  free(unstarted);
  if (nfinished != NT) mt_fatal("interleaved step finished %zu of %zu tensors", nfinished, NT);
}

/* Exact check of an integer step; `what` names the run. */
static void check_exact(tensors_t *T, const char *what) {
  for (size_t t = 0; t < NT; t++) {
    char label[160];
    snprintf(label, sizeof label, "%s: tensor id %" PRIu64, what, tensor_id(t));
    mt_compare(kTensors[t].dtype, T->out[t], T->want[t], kTensors[t].count, label);
  }
}

/* Averages with exact integer data, several steps, on group g. */
static void test_averages(tnt_group_t *g, const char *gname, tnt_op_t op, int steps,
                          const size_t *thresholds, int nthresh) {
  tensors_t T;
  tensors_alloc(&T);
  for (int k = 0; k < nthresh; k++) {
    tnt_fusion_t *f = make_set(g, thresholds[k], op);
    for (int step = 0; step < steps; step++) {
      int interleave = step % 2;
      mt_set_case("%s %s threshold=%zu step=%d %s", gname, mt_oname(op), thresholds[k], step,
                  interleave ? "interleaved" : "start all, then finish all");
      fill_step(&T, tnt_group_rank(g), tnt_group_size(g), step, 0, op);
      run_step(f, &T, step, 1, interleave);
      check_exact(&T, mt_oname(op));
    }
    mt_set_case("%s tnt_fusion_destroy threshold=%zu", gname, thresholds[k]);
    MT_OK(tnt_fusion_destroy(f));
  }
  tensors_free(&T);
}

/* Random reals: a run of `steps` steps, hashing every result. */
static void determinism_run(tnt_group_t *g, size_t threshold, int steps, int run, uint64_t *hashes,
                            mt_hashlog_t *log) {
  tensors_t T;
  tensors_alloc(&T);
  tnt_fusion_t *f = make_set(g, threshold, TNT_AVERAGE);
  int n = tnt_group_size(g);
  for (int step = 0; step < steps; step++) {
    mt_set_case("determinism threshold=%zu run=%d step=%d", threshold, run, step);
    fill_step(&T, 0, n, step, 1, TNT_AVERAGE);
    run_step(f, &T, step, 100 + (uint64_t)run, (step + run) % 2);
    for (size_t t = 0; t < NT; t++) {
      tnt_dtype_t dt = kTensors[t].dtype;
      size_t bytes = kTensors[t].count * mt_dsize(dt);
      hashes[(size_t)step * NT + t] = mt_hash(T.out[t], bytes, 0);
      mt_set_case("determinism threshold=%zu run=%d step=%d tensor id %" PRIu64, threshold, run,
                  step, tensor_id(t));
      mt_hashlog_add(log, T.out[t], bytes);
      /* The first elements against a double-precision reference. */
      double u = dt == TNT_FLOAT16   ? ldexp(1.0, -11)
                 : dt == TNT_FLOAT32 ? ldexp(1.0, -24)
                                     : ldexp(1.0, -53);
      size_t m = kTensors[t].count < 16 ? kTensors[t].count : 16;
      double sum[16] = {0}, mag[16] = {0};
      for (int r = 0; r < n; r++) {
        mt_rng_t rng = mt_rng((uint64_t)r, (uint64_t)step, t);
        for (size_t i = 0; i < m; i++) {
          uint8_t held[8];
          mt_store(dt, held, 0, mt_uniform(&rng) * 4.0);
          sum[i] += mt_load(dt, held, 0);
          mag[i] += fabs(mt_load(dt, held, 0));
        }
      }
      for (size_t i = 0; i < m; i++) {
        double want = sum[i] / n, got = mt_load(dt, T.out[t], i);
        double tol = 2.0 * u * (mag[i] + fabs(want));
        if (!(fabs(got - want) <= tol)) {
          mt_fail((long)i, "average: expected %.17g (+- %.3g), got %.17g", want, tol, got);
          break;
        }
      }
    }
  }
  mt_set_case("determinism threshold=%zu run=%d: tnt_fusion_destroy", threshold, run);
  MT_OK(tnt_fusion_destroy(f));
  tensors_free(&T);
}

static void test_determinism(tnt_group_t *world) {
  enum { STEPS = 2 };
  mt_hashlog_t log = {0};
  uint64_t first[STEPS * NT], second[STEPS * NT];
  for (int k = 0; k < NTHRESH; k++) {
    determinism_run(world, kThresholds[k], STEPS, 0, first, &log);
    determinism_run(world, kThresholds[k], STEPS, 1, second, &log);
    mt_set_case("determinism threshold=%zu: run 0 against run 1", kThresholds[k]);
    for (size_t j = 0; j < STEPS * NT; j++) {
      if (first[j] != second[j]) {
        mt_fail((long)j,
                "step %zu tensor id %" PRIu64
                ": run 1 gave other bits than run 0: expected hash "
                "0x%" PRIx64 ", got 0x%" PRIx64,
                j / NT, tensor_id(j % NT), first[j], second[j]);
      }
    }
  }
  mt_hashlog_compare(&log, MPI_COMM_WORLD, "determinism");
  mt_hashlog_free(&log);
}

/* ---------------------------------------------------------------- errors */

/*
 * One bucket of two tensors (21, 22): a tensor cannot start its next round
 * before every member of its bucket has finished; finishing a member whose
 * bucket still misses a local start cannot succeed and must return (an
 * error, or a timeout after the given 0.5 s) instead of hanging; the set
 * stays usable afterwards. It runs on a context of its own with a 3 s
 * timeout, so that a call that waits instead of returning at once costs
 * little.
 */
static void test_bucket_rounds(void) {
  tnt_tensor_info_t info[2] = {{21, 10, TNT_FLOAT32}, {22, 20, TNT_FLOAT32}};
  tnt_fusion_t *f = NULL;
  tnt_config_t config = {3.0};
  tnt_context_t *ctx = NULL;
  mt_set_case("fusion rounds: tnt_context_create with a 3 s timeout");
  MT_OK(tnt_context_create(&config, &ctx));
  tnt_group_t *world = tnt_context_world(ctx);
  mt_set_case("fusion rounds: tnt_fusion_create, one bucket of two tensors");
  MT_OK(tnt_fusion_create(
      world, info, 2, &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 1 << 20, .op = TNT_AVERAGE}, &f));
  MT_CHECK(tnt_fusion_num_buckets(f) == 1, "expected 1 bucket, got %zu", tnt_fusion_num_buckets(f));
  float a[10], b[20], a_out[10], b_out[20];
  for (int i = 0; i < 10; i++) a[i] = (float)(3 * i);
  for (int i = 0; i < 20; i++) b[i] = (float)(i - 7);

  mt_set_case("fusion rounds: finish while the bucket misses a local start");
  MT_OK(tnt_fusion_start(f, 21, a));
  double t0 = mt_now();
  tnt_status_t st = tnt_fusion_finish(f, 21, a_out, 0.5);
  double dt = mt_now() - t0;
  MT_CHECK(st == TNT_ERR_STATE || st == TNT_ERR_TIMEOUT,
           "expected TNT_ERR_STATE or TNT_ERR_TIMEOUT, got %s", mt_st(st));
  MT_CHECK(dt < 2.0, "the call took %.2f s; expected at most about the 0.5 s timeout", dt);

  mt_set_case("fusion rounds: the bucket completes once every member started");
  MT_OK(tnt_fusion_start(f, 22, b));
  MT_OK(tnt_fusion_finish(f, 21, a_out, -1));
  mt_compare(TNT_FLOAT32, a_out, a, 10, "average of tensor 21");

  /* tnt_fusion_start "returns at once"; TNT_ERR_STATE is the code for a
   * call out of order. */
  mt_set_case("fusion rounds: start of the next round before the bucket finished");
  t0 = mt_now();
  MT_EXPECT_ST(tnt_fusion_start(f, 21, a), TNT_ERR_STATE);
  dt = mt_now() - t0;
  MT_CHECK(dt < 1.0, "tnt_fusion_start took %.2f s; expected it to return at once", dt);
  MT_OK(tnt_fusion_finish(f, 22, b_out, -1));
  mt_compare(TNT_FLOAT32, b_out, b, 20, "average of tensor 22");

  mt_set_case("fusion rounds: the next round");
  MT_OK(tnt_fusion_start(f, 22, b));
  MT_OK(tnt_fusion_start(f, 21, a));
  MT_OK(tnt_fusion_finish(f, 22, b_out, -1));
  MT_OK(tnt_fusion_finish(f, 21, a_out, -1));
  mt_compare(TNT_FLOAT32, a_out, a, 10, "average of tensor 21, second round");
  mt_compare(TNT_FLOAT32, b_out, b, 20, "average of tensor 22, second round");
  MT_OK(tnt_fusion_destroy(f));
  MT_OK(tnt_context_destroy(ctx));
}

/* The same value on every rank of the world. */
static int same_everywhere(uint64_t v) {
  uint64_t lo = v, hi = v;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/*
 * A set that tunes its threshold: exact averages in every round while the
 * plan changes; the candidates in the documented order; the master's
 * choice on every rank although the other ranks time the candidates the
 * other way round; then the same plan everywhere. A round lasts from a
 * rank's first start to its last finish: a rank that sleeps before its
 * starts keeps its own round short and makes the others wait, one that
 * sleeps between its starts and finishes makes its own round long (the
 * sleeps, 0.2 s, dwarf the scheduling noise of a loaded machine). Rank 0
 * is fast with the first candidate only, the others with the last only.
 */
static void test_tuned(tnt_group_t *world) {
  enum { WARMUP = TNT__TUNER_WARMUP, TRIED = 10, DECIDING = 1 };
  tnt_tensor_info_t info[NT];
  tensor_list(info);
  tensors_t T;
  tensors_alloc(&T);
  mt_set_case("tuned fusion: tnt_fusion_create");
  tnt_fusion_t *f = NULL;
  tnt_fusion_options_t opt = {.size = sizeof opt, .threshold_bytes = 7, .op = TNT_AVERAGE, .tune_threshold = 1};
  MT_OK(tnt_fusion_create(world, info, NT, &opt, &f));
  if (f == NULL) mt_fatal("tnt_fusion_create failed");
  static const size_t kb[5] = {32, 128, 512, 2048, 8192};
  for (int step = 0; step < WARMUP + TRIED + DECIDING + 2; step++) {
    mt_set_case("tuned fusion step %d", step);
    const int c = step < WARMUP ? 0 : step < WARMUP + TRIED ? (step - WARMUP) % 5 : -1;
    if (c >= 0 && tnt_fusion_threshold(f) != kb[c] * 1024) {
      mt_fail(-1, "threshold %zu bytes, want %zu KiB", tnt_fusion_threshold(f), kb[c]);
    }
    fill_step(&T, g_rank, g_size, step, 0, TNT_AVERAGE);
    const int tried = step >= WARMUP && step < WARMUP + TRIED;
    if (tried && ((c == 0 && g_rank == 0) || (c == 4 && g_rank != 0))) mt_sleep(0.2);
    size_t order[NT];
    mt_rng_t rng = mt_rng((uint64_t)g_rank, (uint64_t)step, 3);
    mt_shuffle(order, NT, &rng);
    for (size_t k = 0; k < NT; k++) start_one(f, &T, order[k]);
    if (tried && ((c >= 1 && c <= 3) || (c == 4 && g_size == 1))) mt_sleep(0.2);
    mt_shuffle(order, NT, &rng);
    for (size_t k = 0; k < NT; k++) finish_one(f, &T, order[k]);
    check_exact(&T, "tuned");
  }
  mt_set_case("tuned fusion: the choice");
  if (tnt_fusion_threshold(f) != 32 * 1024) {
    mt_fail(-1, "kept %zu bytes, want the master's fastest, 32 KiB", tnt_fusion_threshold(f));
  }
  uint64_t h = tnt_fusion_num_buckets(f);
  for (size_t t = 0; t < NT; t++) h = mt_mix64(h ^ (uint64_t)tnt_fusion_bucket_of(f, tensor_id(t)));
  if (!same_everywhere(h)) mt_fail(-1, "the ranks hold different plans");
  MT_OK(tnt_fusion_destroy(f));
  tensors_free(&T);
}

/*
 * Overlap off: with every tensor but the last started, no bucket is
 * reduced (a finish of the first tensor times out), where overlap on
 * reduces the first bucket; once the last tensor starts, every bucket is
 * reduced and the averages are exact. Then a set that tunes its overlap
 * keeps the master's faster plan on every rank: rank 0 is slow with
 * overlap on and the other ranks with overlap off (sleeps as in
 * test_tuned), and the master's choice, off, holds everywhere.
 */
static void test_overlap(tnt_group_t *world) {
  tnt_tensor_info_t info[NT];
  tensor_list(info);
  tensors_t T;
  tensors_alloc(&T);
  for (int off = 0; off < 2; off++) {
    mt_set_case("overlap %s: tnt_fusion_create", off ? "off" : "on");
    tnt_fusion_t *f = NULL;
    tnt_fusion_options_t opt = {.size = sizeof opt,
        .op = TNT_AVERAGE, .overlap = off ? TNT_FUSION_OVERLAP_OFF : TNT_FUSION_OVERLAP_ON};
    MT_OK(tnt_fusion_create(world, info, NT, &opt, &f));
    if (f == NULL) mt_fatal("tnt_fusion_create failed");
    if (tnt_fusion_overlaps(f) != !off) mt_fail(-1, "tnt_fusion_overlaps says %d", !off);
    for (int step = 0; step < 3; step++) {
      mt_set_case("overlap %s step %d", off ? "off" : "on", step);
      fill_step(&T, g_rank, g_size, step, 0, TNT_AVERAGE);
      for (size_t t = 0; t + 1 < NT; t++) start_one(f, &T, t);
      tnt_status_t st = tnt_fusion_finish(f, tensor_id(0), T.out[0], off ? 0.3 : 30.0);
      if (st != (off ? TNT_ERR_TIMEOUT : TNT_OK)) {
        mt_fail(-1, "the first tensor's finish before the last start: %s, want %s", mt_st(st),
                off ? "a timeout (no bucket reduced yet)" : "success");
      }
      start_one(f, &T, NT - 1);
      for (size_t t = off ? 0 : 1; t < NT; t++) finish_one(f, &T, t);
      check_exact(&T, off ? "overlap off" : "overlap on");
    }
    MT_OK(tnt_fusion_destroy(f));
  }

  enum { WARMUP = TNT__TUNER_WARMUP, TRIED = 4, DECIDING = 1 };
  mt_set_case("tuned overlap: tnt_fusion_create");
  tnt_fusion_t *f = NULL;
  tnt_fusion_options_t opt = {.size = sizeof opt,
      .threshold_bytes = 256, .op = TNT_AVERAGE, .overlap = TNT_FUSION_OVERLAP_TUNE};
  MT_OK(tnt_fusion_create(world, info, NT, &opt, &f));
  if (f == NULL) mt_fatal("tnt_fusion_create failed");
  for (int step = 0; step < WARMUP + TRIED + DECIDING + 2; step++) {
    mt_set_case("tuned overlap step %d", step);
    const int c = step < WARMUP ? 0 : step < WARMUP + TRIED ? (step - WARMUP) % 2 : -1;
    if (c >= 0 && tnt_fusion_overlaps(f) != (c == 0)) {
      mt_fail(-1, "overlap %s in a round of candidate %d", tnt_fusion_overlaps(f) ? "on" : "off",
              c);
    }
    if (tnt_fusion_threshold(f) != 256) mt_fail(-1, "threshold %zu", tnt_fusion_threshold(f));
    fill_step(&T, g_rank, g_size, step, 0, TNT_AVERAGE);
    const int tried = step >= WARMUP && step < WARMUP + TRIED;
    for (size_t t = 0; t < NT; t++) start_one(f, &T, t);
    if (tried && ((c == 0 && g_rank == 0) || (c == 1 && g_rank != 0))) mt_sleep(0.2);
    for (size_t t = 0; t < NT; t++) finish_one(f, &T, t);
    check_exact(&T, "tuned overlap");
  }
  mt_set_case("tuned overlap: the choice");
  if (tnt_fusion_overlaps(f)) mt_fail(-1, "kept overlap on, want the master's faster, off");
  if (!same_everywhere((uint64_t)tnt_fusion_overlaps(f))) mt_fail(-1, "the ranks differ");
  MT_OK(tnt_fusion_destroy(f));
  tensors_free(&T);
}

/*
 * Buckets in readiness order: in round 0 the master starts the tensors in
 * the reverse of the list, the other ranks in orders of their own; from
 * round 2 on, with one tensor per bucket, bucket k holds the master's k-th
 * tensor on every rank, and with a threshold every rank holds the same
 * plan. Exact averages throughout.
 */
static void test_readiness_order(tnt_group_t *world) {
  static const size_t thresholds[2] = {0, 256};
  tnt_tensor_info_t info[NT];
  tensor_list(info);
  tensors_t T;
  tensors_alloc(&T);
  for (int k = 0; k < 2; k++) {
    mt_set_case("readiness order threshold=%zu: tnt_fusion_create", thresholds[k]);
    tnt_fusion_t *f = NULL;
    tnt_fusion_options_t opt = {.size = sizeof opt,
        .threshold_bytes = thresholds[k], .op = TNT_AVERAGE, .order = TNT_FUSION_ORDER_READINESS};
    MT_OK(tnt_fusion_create(world, info, NT, &opt, &f));
    if (f == NULL) mt_fatal("tnt_fusion_create failed");
    for (int step = 0; step < 4; step++) {
      mt_set_case("readiness order threshold=%zu step %d", thresholds[k], step);
      fill_step(&T, g_rank, g_size, step, 0, TNT_AVERAGE);
      size_t order[NT];
      mt_rng_t rng = mt_rng((uint64_t)g_rank, (uint64_t)step, 5);
      mt_shuffle(order, NT, &rng);
      if (step == 0 && g_rank == 0) {
        for (size_t t = 0; t < NT; t++) order[t] = NT - 1 - t;
      }
      for (size_t j = 0; j < NT; j++) start_one(f, &T, order[j]);
      mt_shuffle(order, NT, &rng);
      for (size_t j = 0; j < NT; j++) finish_one(f, &T, order[j]);
      check_exact(&T, "readiness order");
    }
    uint64_t h = tnt_fusion_num_buckets(f);
    for (size_t t = 0; t < NT; t++) {
      const long b = tnt_fusion_bucket_of(f, tensor_id(t));
      h = mt_mix64(h ^ (uint64_t)b);
      if (thresholds[k] == 0 && b != (long)(NT - 1 - t)) {
        mt_fail((long)t, "tensor %zu is in bucket %ld, want %zu (the master's order)", t, b,
                NT - 1 - t);
      }
    }
    if (!same_everywhere(h)) mt_fail(-1, "the ranks hold different plans");
    MT_OK(tnt_fusion_destroy(f));
  }
  tensors_free(&T);
}

/*
 * Compressed transfers: float32 tensors reduced over a 16-bit wire agree
 * with the exact average within the wire type's rounding (one rounding of
 * each input and of each partial result), differ from it somewhere (so the
 * compression happened), and are bitwise identical on every rank; a
 * float64 tensor in the same set travels exactly.
 */
static void test_compressed(tnt_group_t *world) {
  static const size_t counts[4] = {1000, 1, 70001, 33};
  static const tnt_dtype_t wires[2] = {TNT_FLOAT16, TNT_BFLOAT16};
  tnt_tensor_info_t info[4];
  for (int t = 0; t < 4; t++)
    info[t] = (tnt_tensor_info_t){500 + (uint64_t)t, counts[t], TNT_FLOAT32};
  info[3].dtype = TNT_FLOAT64;
  for (int w = 0; w < 2; w++) {
    mt_set_case("compressed fusion, %s wire", mt_dname(wires[w]));
    tnt_fusion_t *f = NULL;
    tnt_fusion_options_t opt = {.size = sizeof opt, .threshold_bytes = 4096, .op = TNT_AVERAGE, .wire_dtype = wires[w]};
    MT_OK(tnt_fusion_create(world, info, 4, &opt, &f));
    if (f == NULL) mt_fatal("tnt_fusion_create failed");
    void *in[4], *out[4];
    for (int t = 0; t < 4; t++) {
      const size_t esz = mt_dsize(info[t].dtype);
      in[t] = mt_alloc(counts[t] * esz);
      out[t] = mt_alloc(counts[t] * esz);
      mt_rng_t g = mt_rng(77, (uint64_t)g_rank, (uint64_t)t);
      for (size_t i = 0; i < counts[t]; i++) mt_store(info[t].dtype, in[t], i, mt_uniform(&g));
    }
    for (int t = 3; t >= 0; t--) MT_OK(tnt_fusion_start(f, info[t].id, in[t]));
    for (int t = 0; t < 4; t++) MT_OK(tnt_fusion_finish(f, info[t].id, out[t], -1));
    /* Inputs in [-1, 1): partial sums stay below the group size. */
    const double unit = wires[w] == TNT_FLOAT16 ? 1.0 / 2048 : 1.0 / 256;
    const double tol = 2.0 * g_size * unit;
    double worst = 0.0, diff = 0.0;
    uint64_t h = 0;
    for (int t = 0; t < 4; t++) {
      const double tt = info[t].dtype == TNT_FLOAT64 ? 1e-12 : tol;
      mt_rng_t gs[64];
      for (int r = 0; r < g_size && r < 64; r++) gs[r] = mt_rng(77, (uint64_t)r, (uint64_t)t);
      for (size_t i = 0; i < counts[t]; i++) {
        double want = 0.0;
        for (int r = 0; r < g_size && r < 64; r++) want += mt_uniform(&gs[r]);
        want /= g_size;
        const double got = mt_load(info[t].dtype, out[t], i), e = fabs(got - want);
        if (!(e <= tt)) {
          mt_fail((long)i, "tensor %d: %.9g, the exact average is %.9g (tolerance %.3g)", t, got,
                  want, tt);
          break;
        }
        if (info[t].dtype == TNT_FLOAT32 && e > diff) diff = e;
        if (e > worst) worst = e;
      }
      h = mt_hash(out[t], counts[t] * mt_dsize(info[t].dtype), h);
    }
    if (diff == 0.0) mt_fail(-1, "every float32 result is exact: the wire did not compress");
    if (!same_everywhere(h)) mt_fail(-1, "the ranks got different bits");
    if (g_rank == 0) printf("compressed %s: largest error %.3g\n", mt_dname(wires[w]), worst);
    for (int t = 0; t < 4; t++) {
      free(in[t]);
      free(out[t]);
    }
    MT_OK(tnt_fusion_destroy(f));
  }
}

/*
 * Scaling where libtnt copies: rank r starts each tensor scaled by its
 * weight n_r = r + 1 and finishes it divided by N = sum n_r, which must give
 * bitwise what the caller computing x * n_r before the start and sum / N
 * after the finish gives (the gradient path's weighted average), for
 * float32 (also over a float16 wire), float64 and float16 tensors.
 */
static void test_scaled(tnt_group_t *world) {
  static const tnt_dtype_t wires[2] = {TNT_FLOAT32, TNT_FLOAT16};
  static const size_t counts[3] = {1003, 17, 4096};
  tnt_tensor_info_t info[3] = {{900, counts[0], TNT_FLOAT32}, {901, counts[1], TNT_FLOAT64},
                               {902, counts[2], TNT_FLOAT16}};
  const double weight = g_rank + 1, total = (double)g_size * (g_size + 1) / 2;
  for (int w = 0; w < 2; w++) {
    mt_set_case("scaled start and finish, %s wire", mt_dname(wires[w]));
    tnt_fusion_t *scaled = NULL, *plain = NULL;
    tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;
    opt.threshold_bytes = 4096;
    opt.op = TNT_SUM;
    opt.wire_dtype = wires[w];
    MT_OK(tnt_fusion_create(world, info, 3, &opt, &scaled));
    MT_OK(tnt_fusion_create(world, info, 3, &opt, &plain));
    for (int t = 0; t < 3; t++) {
      const size_t n = counts[t], esz = mt_dsize(info[t].dtype);
      void *x = mt_alloc(n * esz), *xs = mt_alloc(n * esz), *got = mt_alloc(n * esz),
           *want = mt_alloc(n * esz);
      mt_rng_t g = mt_rng(91, (uint64_t)g_rank, (uint64_t)t);
      for (size_t i = 0; i < n; i++) mt_store(info[t].dtype, x, i, mt_uniform(&g));
      /* The caller's way: scale before the start, divide after the finish. */
      tnt__copy_scaled(xs, info[t].dtype, x, info[t].dtype, n, weight, 0);
      MT_OK(tnt_fusion_start(plain, info[t].id, xs));
      MT_OK(tnt_fusion_start_scaled(scaled, info[t].id, x, weight));
      /* xs is free again: the start copied it. */
      MT_OK(tnt_fusion_finish(plain, info[t].id, xs, -1));
      tnt__copy_scaled(want, info[t].dtype, xs, info[t].dtype, n, total, 1);
      MT_OK(tnt_fusion_finish_scaled(scaled, info[t].id, got, total, -1));
      if (memcmp(got, want, n * esz) != 0) {
        mt_fail(-1, "tensor %d (%s): scaled in libtnt differs from scaled by the caller", t,
                mt_dname(info[t].dtype));
      }
      free(x);
      free(xs);
      free(got);
      free(want);
    }
    MT_OK(tnt_fusion_destroy(scaled));
    MT_OK(tnt_fusion_destroy(plain));
  }
}

/* A set over the whole tensor list in `mode`, AVERAGE. */
static tnt_fusion_t *mode_set(tnt_group_t *g, size_t threshold, tnt_dtype_t wire,
                              tnt_fusion_mode_t mode) {
  tnt_tensor_info_t info[NT];
  tensor_list(info);
  tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;
  opt.threshold_bytes = threshold;
  opt.op = TNT_AVERAGE;
  opt.wire_dtype = wire;
  opt.mode = mode;
  tnt_fusion_t *f = NULL;
  MT_OK(tnt_fusion_create(g, info, NT, &opt, &f));
  if (f == NULL) mt_fatal("tnt_fusion_create (mode %d) failed", (int)mode);
  return f;
}

/*
 * The reduce-scatter and allgather modes against the allreduce mode, for
 * every threshold and wire dtype, on random reals over two rounds (the
 * second scaled): the three sets have the same plan and the same parts,
 * which partition every tensor over the ranks; the reduce-scatter's parts
 * are bitwise the allreduce's elements there; gathering them gives the
 * allreduce's whole tensors bitwise; and between rounds the two new modes
 * hold no whole bucket.
 */
static void test_modes(tnt_group_t *world) {
  static const tnt_dtype_t wires[3] = {TNT_FLOAT32, TNT_FLOAT16, TNT_BFLOAT16};
  tensors_t T;
  tensors_alloc(&T);
  void *part[NT];
  size_t lo[NT], hi[NT];
  for (size_t t = 0; t < NT; t++) part[t] = mt_alloc(kTensors[t].count * mt_dsize(kTensors[t].dtype));
  for (size_t k = 0; k < NTHRESH; k++) {
    for (int w = 0; w < 3; w++) {
      mt_set_case("fusion modes threshold=%zu, %s wire", kThresholds[k], mt_dname(wires[w]));
      tnt_fusion_t *ar = mode_set(world, kThresholds[k], wires[w], TNT_FUSION_MODE_ALLREDUCE);
      tnt_fusion_t *rs = mode_set(world, kThresholds[k], wires[w], TNT_FUSION_MODE_REDUCE_SCATTER);
      tnt_fusion_t *ag = mode_set(world, kThresholds[k], TNT_FLOAT32, TNT_FUSION_MODE_ALLGATHER);
      MT_CHECK(tnt_fusion_num_buckets(rs) == tnt_fusion_num_buckets(ar) &&
                   tnt_fusion_num_buckets(ag) == tnt_fusion_num_buckets(ar),
               "the modes planned different buckets");
      for (size_t t = 0; t < NT; t++) {
        const uint64_t id = tensor_id(t);
        size_t l2, h2, l3, h3;
        MT_OK(tnt_fusion_part(ar, id, &lo[t], &hi[t]));
        MT_OK(tnt_fusion_part(rs, id, &l2, &h2));
        MT_OK(tnt_fusion_part(ag, id, &l3, &h3));
        MT_CHECK(tnt_fusion_bucket_of(rs, id) == tnt_fusion_bucket_of(ar, id) &&
                     tnt_fusion_bucket_of(ag, id) == tnt_fusion_bucket_of(ar, id),
                 "tensor %zu: the modes put it in different buckets", t);
        MT_CHECK(l2 == lo[t] && h2 == hi[t] && l3 == lo[t] && h3 == hi[t],
                 "tensor %zu: parts [%zu, %zu), [%zu, %zu) and [%zu, %zu) differ", t, lo[t],
                 hi[t], l2, h2, l3, h3);
        MT_CHECK(lo[t] <= hi[t] && hi[t] <= kTensors[t].count, "tensor %zu: part [%zu, %zu)", t,
                 lo[t], hi[t]);
        /* The ranks' parts tile the tensor. */
        unsigned long long mine = hi[t] - lo[t], sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        MT_CHECK(sum == kTensors[t].count, "tensor %zu: parts of %llu elements in all, not %zu",
                 t, sum, kTensors[t].count);
      }
      for (int step = 0; step < 2; step++) {
        const double scale = step == 0 ? 1.0 : 3.0, divisor = step == 0 ? 1.0 : 5.0;
        fill_step(&T, g_rank, g_size, 10 + step + (int)k * 3 + w * 17, 1, TNT_AVERAGE);
        for (size_t t = NT; t-- > 0;) MT_OK(tnt_fusion_start_scaled(ar, tensor_id(t), T.in[t], scale));
        for (size_t t = NT; t-- > 0;) MT_OK(tnt_fusion_start_scaled(rs, tensor_id(t), T.in[t], scale));
        for (size_t t = 0; t < NT; t++) {
          const tnt_dtype_t dt = kTensors[t].dtype;
          const size_t esz = mt_dsize(dt);
          MT_OK(tnt_fusion_finish_scaled(ar, tensor_id(t), T.out[t], divisor, -1));
          mt_fill_sentinel(part[t], kTensors[t].count, dt);
          MT_OK(tnt_fusion_finish_scaled(rs, tensor_id(t), part[t], divisor, -1));
          mt_compare(dt, part[t], (uint8_t *)T.out[t] + lo[t] * esz, hi[t] - lo[t],
                     "the reduce-scatter's part against the allreduce");
          /* Nothing is written past the part. */
          MT_CHECK(hi[t] == kTensors[t].count ||
                       ((uint8_t *)part[t])[(hi[t] - lo[t]) * esz] == 0xa5,
                   "tensor %zu: the reduce-scatter wrote past its part", t);
        }
        /* Gathering the parts (scaled by 2 and back: exact) gives the
         * allreduce's tensors. */
        for (size_t t = 0; t < NT; t++) {
          MT_OK(tnt_fusion_start_scaled(ag, tensor_id(t), part[t], step == 0 ? 1.0 : 2.0));
        }
        for (size_t t = NT; t-- > 0;) {
          mt_fill_sentinel(T.want[t], kTensors[t].count, kTensors[t].dtype);
          MT_OK(tnt_fusion_finish_scaled(ag, tensor_id(t), T.want[t], step == 0 ? 1.0 : 2.0, -1));
          mt_compare(kTensors[t].dtype, T.want[t], T.out[t], kTensors[t].count,
                     "the allgather of the parts against the allreduce");
        }
        for (size_t b = 0; b < rs->plan.nbuckets; b++) {
          MT_CHECK(rs->buckets[b].buf == NULL && ag->buckets[b].buf == NULL,
                   "bucket %zu holds its whole vector between rounds", b);
        }
      }
      MT_OK(tnt_fusion_destroy(ar));
      MT_OK(tnt_fusion_destroy(rs));
      MT_OK(tnt_fusion_destroy(ag));
    }
  }
  for (size_t t = 0; t < NT; t++) free(part[t]);
  tensors_free(&T);
}

static void test_errors(tnt_context_t *ctx, tnt_group_t *world) {
  const tnt_status_t E = TNT_ERR_INVALID_ARG;
  tnt_tensor_info_t info[3] = {{11, 10, TNT_FLOAT32}, {12, 20, TNT_FLOAT32}, {13, 5, TNT_FLOAT64}};
  tnt_fusion_t *f = NULL;

  mt_set_case("fusion options: size");
  /* A caller built against an older tnt.h, whose struct ends before
   * `overlap`: libtnt reads only its bytes and gives overlap its default. */
  struct {
    tnt_fusion_options_t opt;
    int garbage[4];
  } old = {{.size = offsetof(tnt_fusion_options_t, overlap), .op = TNT_AVERAGE}, {7, 7, 7, 7}};
  memset(&old.opt.overlap, 0x7f, sizeof old.opt.overlap);
  MT_OK(tnt_fusion_create(world, info, 3, &old.opt, &f));
  MT_CHECK(tnt_fusion_overlaps(f), "a shorter struct must leave overlap at its default (on)");
  MT_OK(tnt_fusion_destroy(f));
  f = NULL;
  MT_EXPECT_ST(tnt_fusion_create(world, info, 3, &(tnt_fusion_options_t){.op = TNT_AVERAGE}, &f),
               E);
  if (strstr(tnt_last_error(), "set it to sizeof(tnt_fusion_options_t)") == NULL) {
    mt_fail(-1, "a missing size should say what to set, got: %s", tnt_last_error());
  }
  MT_EXPECT_ST(tnt_fusion_create(world, info, 3,
                                 &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t) + 8},
                                 &f),
               E);

  mt_set_case("fusion errors: tnt_fusion_create");
  MT_EXPECT_ST(
      tnt_fusion_create(NULL, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_AVERAGE}, &f),
      E);
  MT_EXPECT_ST(
      tnt_fusion_create(world, NULL, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_AVERAGE}, &f),
      E);
  MT_EXPECT_ST(
      tnt_fusion_create(world, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_OP_COUNT}, &f),
      E);
  MT_EXPECT_ST(
      tnt_fusion_create(world, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_AVERAGE}, NULL),
      E);
  MT_EXPECT_ST(
      tnt_fusion_create(world, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .op = TNT_AVERAGE, .tune_threshold = 2}, &f),
      E);
  if (strstr(tnt_last_error(), "tune_threshold") == NULL) {
    mt_fail(-1, "a bad tune_threshold should be named, got: %s", tnt_last_error());
  }
  MT_EXPECT_ST(tnt_fusion_create(
                   world, info, 3,
                   &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .op = TNT_AVERAGE, .overlap = TNT_FUSION_OVERLAP_COUNT},
                   &f),
               E);
  if (strstr(tnt_last_error(), "TNT_FUSION_OVERLAP_TUNE") == NULL) {
    mt_fail(-1, "a bad overlap should name the choices, got: %s", tnt_last_error());
  }
  MT_EXPECT_ST(
      tnt_fusion_create(world, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .op = TNT_AVERAGE, .wire_dtype = TNT_INT32}, &f),
      E);
  if (strstr(tnt_last_error(), "float16 or bfloat16") == NULL) {
    mt_fail(-1, "a bad wire_dtype should name the accepted ones, got: %s", tnt_last_error());
  }
  /* The reduce-scatter and allgather modes need a fixed plan. */
  static const struct {
    tnt_fusion_mode_t mode;
    int tune;
    tnt_fusion_order_t order;
    const char *named;
  } kModeCases[] = {
      {TNT_FUSION_MODE_REDUCE_SCATTER, 1, TNT_FUSION_ORDER_LIST, "tune_threshold"},
      {TNT_FUSION_MODE_ALLGATHER, 0, TNT_FUSION_ORDER_READINESS, "TNT_FUSION_ORDER_LIST"},
      {TNT_FUSION_MODE_COUNT, 0, TNT_FUSION_ORDER_LIST, "TNT_FUSION_MODE_REDUCE_SCATTER"},
  };
  for (size_t k = 0; k < sizeof kModeCases / sizeof kModeCases[0]; k++) {
    tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;
    opt.mode = kModeCases[k].mode;
    opt.tune_threshold = kModeCases[k].tune;
    opt.order = kModeCases[k].order;
    MT_EXPECT_ST(tnt_fusion_create(world, info, 3, &opt, &f), E);
    if (strstr(tnt_last_error(), kModeCases[k].named) == NULL) {
      mt_fail((long)k, "the mode's error should name %s, got: %s", kModeCases[k].named,
              tnt_last_error());
    }
  }
  info[1].id = 11; /* duplicate id */
  MT_EXPECT_ST(
      tnt_fusion_create(world, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_AVERAGE}, &f),
      E);
  info[1].id = 12;
  info[2].dtype = TNT_DTYPE_COUNT;
  MT_EXPECT_ST(
      tnt_fusion_create(world, info, 3,
                        &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_AVERAGE}, &f),
      E);
  info[2].dtype = TNT_FLOAT64;

  MT_OK(tnt_fusion_create(world, info, 3,
                          &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_AVERAGE}, &f));
  float a[10], a_out[10], b[20], b_out[20];
  double c[5], c_out[5];
  for (int i = 0; i < 10; i++) a[i] = (float)(i + g_rank);
  for (int i = 0; i < 20; i++) b[i] = (float)(2 * i);
  for (int i = 0; i < 5; i++) c[i] = (double)(i * g_size);

  mt_set_case("fusion errors: unknown ids and NULL buffers");
  MT_CHECK(tnt_fusion_num_buckets(f) == 3, "threshold 0: expected 3 buckets, got %zu",
           tnt_fusion_num_buckets(f));
  MT_CHECK(tnt_fusion_bucket_of(f, 14) == -1, "bucket of unknown id 14: expected -1, got %ld",
           tnt_fusion_bucket_of(f, 14));
  MT_EXPECT_ST(tnt_fusion_start(f, 14, a), E);
  MT_EXPECT_ST(tnt_fusion_finish(f, 14, a_out, 1.0), E);
  MT_EXPECT_ST(tnt_fusion_start(f, 11, NULL), E);
  MT_EXPECT_ST(tnt_fusion_start(NULL, 11, a), E);
  MT_EXPECT_ST(tnt_fusion_finish(NULL, 11, a_out, 1.0), E);
  size_t plo, phi;
  MT_EXPECT_ST(tnt_fusion_part(f, 14, &plo, &phi), E);
  MT_EXPECT_ST(tnt_fusion_part(f, 11, NULL, &phi), E);
  MT_EXPECT_ST(tnt_fusion_part(NULL, 11, &plo, &phi), E);

  mt_set_case("fusion errors: finish before start");
  double t0 = mt_now();
  MT_EXPECT_ST(tnt_fusion_finish(f, 11, a_out, 2.0), TNT_ERR_STATE);
  double dt = mt_now() - t0;
  MT_CHECK(dt < 1.0, "finish before start took %.2f s: expected an immediate TNT_ERR_STATE", dt);

  mt_set_case("fusion errors: start twice, finish with NULL, finish twice");
  MT_OK(tnt_fusion_start(f, 11, a));
  MT_EXPECT_ST(tnt_fusion_start(f, 11, a), TNT_ERR_STATE);
  MT_EXPECT_ST(tnt_fusion_finish(f, 11, NULL, 1.0), E);
  MT_OK(tnt_fusion_finish(f, 11, a_out, -1));
  for (int i = 0; i < 10; i++) {
    float want = (float)i + (float)(g_size - 1) / 2.0f;
    if (a_out[i] != want) {
      mt_fail(i, "average of tensor 11: expected %g, got %g", (double)want, (double)a_out[i]);
      break;
    }
  }
  MT_EXPECT_ST(tnt_fusion_finish(f, 11, a_out, 1.0), TNT_ERR_STATE);

  mt_set_case("fusion errors: the set still works afterwards");
  MT_OK(tnt_fusion_start(f, 13, c));
  MT_OK(tnt_fusion_start(f, 12, b));
  MT_OK(tnt_fusion_start(f, 11, a));
  MT_OK(tnt_fusion_finish(f, 12, b_out, -1));
  MT_OK(tnt_fusion_finish(f, 13, c_out, -1));
  MT_OK(tnt_fusion_finish(f, 11, a_out, -1));
  for (int i = 0; i < 20; i++) {
    if (b_out[i] != b[i]) {
      mt_fail(i, "average of tensor 12: expected %g, got %g", (double)b[i], (double)b_out[i]);
      break;
    }
  }
  for (int i = 0; i < 5; i++) {
    if (c_out[i] != c[i]) {
      mt_fail(i, "average of tensor 13: expected %g, got %g", c[i], c_out[i]);
      break;
    }
  }
  MT_OK(tnt_fusion_destroy(f));
  test_bucket_rounds();
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  MT_CHECK(cst == TNT_OK, "tnt_context_error after the error cases: expected TNT_OK, got %s (%s)",
           mt_st(cst), msg != NULL ? msg : "");
}

/* Buckets of the reduce-scatter set `f` that hold their whole vector:
 * being filled, or submitted and not yet reduced. */
static size_t whole_vectors_held(tnt_fusion_t *f) {
  size_t held = 0;
  pthread_mutex_lock(&f->mu);
  for (size_t b = 0; b < f->plan.nbuckets; b++) {
    const tnt__bucket_t *bk = &f->buckets[b];
    held += bk->buf != NULL ||
            (bk->req != NULL && tnt__request_test(bk->req) == TNT_IN_PROGRESS);
  }
  pthread_mutex_unlock(&f->mu);
  return held;
}

/*
 * The reduce-scatter's whole vectors in flight (TNT_FUSION_IN_FLIGHT_MIB):
 * the master starts every tensor while the other ranks sleep, so none of
 * its buckets can be reduced before they start theirs. With no room
 * (0 bytes), a start that needs a new vector waits for the bucket before
 * it: the master never holds more than one whole vector, and its starts
 * last until the others have started. With room for every bucket, it
 * holds all of them. The parts are the allreduce's either way, and
 * between rounds the set holds neither whole vectors nor parts.
 */
static void test_in_flight(tnt_group_t *world) {
  if (g_size < 2) return;
  tensors_t T;
  tensors_alloc(&T);
  void *part[NT];
  for (size_t t = 0; t < NT; t++) part[t] = mt_alloc(kTensors[t].count * mt_dsize(kTensors[t].dtype));
  const double sleep_s = 0.3;
  for (int room = 0; room < 2; room++) {
    mt_set_case("in flight: %s", room ? "room for every bucket" : "no room");
    tnt_fusion_t *ar = mode_set(world, 0, TNT_FLOAT32, TNT_FUSION_MODE_ALLREDUCE);
    tnt_tensor_info_t info[NT];
    tensor_list(info);
    tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;
    opt.op = TNT_AVERAGE;
    opt.mode = TNT_FUSION_MODE_REDUCE_SCATTER;
    opt.overlap = TNT_FUSION_OVERLAP_ON; /* buckets go as soon as they are full */
    tnt_fusion_t *rs = NULL;
    MT_OK(tnt_fusion_create(world, info, NT, &opt, &rs));
    if (rs == NULL) mt_fatal("tnt_fusion_create (reduce-scatter) failed");
    MT_CHECK(rs->in_flight_bytes ==
                 (size_t)(tnt__setting_number(TNT__S_FUSION_IN_FLIGHT_MIB) * 1048576.0),
             "the set's room is not TNT_FUSION_IN_FLIGHT_MIB's");
    rs->in_flight_bytes = room ? SIZE_MAX : 0;
    fill_step(&T, g_rank, g_size, 40 + room, 1, TNT_AVERAGE);
    for (size_t t = NT; t-- > 0;) MT_OK(tnt_fusion_start(ar, tensor_id(t), T.in[t]));
    if (g_rank != 0) mt_sleep(sleep_s);
    size_t most = 0;
    const double began = mt_now();
    for (size_t t = 0; t < NT; t++) { /* in plan order: each bucket goes when started */
      MT_OK(tnt_fusion_start(rs, tensor_id(t), T.in[t]));
      most = TNT__MAX(most, whole_vectors_held(rs));
    }
    const double took = mt_now() - began;
    if (g_rank == 0 && room) {
      MT_CHECK(most == rs->plan.nbuckets, "the master held %zu whole vectors at most, not all %zu",
               most, rs->plan.nbuckets);
    } else if (g_rank == 0) {
      MT_CHECK(most == 1, "the master held %zu whole vectors at once, with no room", most);
      MT_CHECK(took > sleep_s / 2, "the master's starts took %.3f s: none waited", took);
    }
    for (size_t t = 0; t < NT; t++) {
      size_t lo, hi;
      MT_OK(tnt_fusion_part(rs, tensor_id(t), &lo, &hi));
      MT_OK(tnt_fusion_finish(ar, tensor_id(t), T.out[t], -1));
      MT_OK(tnt_fusion_finish(rs, tensor_id(t), part[t], -1));
      mt_compare(kTensors[t].dtype, part[t],
                 (uint8_t *)T.out[t] + lo * mt_dsize(kTensors[t].dtype), hi - lo,
                 "the reduce-scatter's part against the allreduce");
    }
    for (size_t b = 0; b < rs->plan.nbuckets; b++) {
      MT_CHECK(rs->buckets[b].buf == NULL && rs->buckets[b].part == NULL,
               "bucket %zu holds memory between rounds", b);
    }
    MT_OK(tnt_fusion_destroy(ar));
    MT_OK(tnt_fusion_destroy(rs));
  }
  for (size_t t = 0; t < NT; t++) free(part[t]);
  tensors_free(&T);
}

int main(int argc, char **argv) {
  mt_init("test_fusion_mpi", &argc, &argv, 1);
  tnt_config_t config = {0.0}; /* the timeout comes from TNT_TIMEOUT_S */
  tnt_context_t *ctx = mt_context(&config);
  tnt_group_t *world = tnt_context_world(ctx);
  if (world == NULL) mt_fatal("tnt_context_world returned NULL");
  g_rank = mt_state()->rank;
  g_size = mt_state()->size;
  double t0 = mt_now();

  test_averages(world, "world", TNT_AVERAGE, 4, kThresholds, NTHRESH);
  static const size_t small[] = {256};
  test_averages(world, "world", TNT_SUM, 1, small, 1);
  if (g_rank == 0) printf("averages: %.1f s\n", mt_now() - t0);

  /* The same on the even ranks (average divides by the group size). */
  int evens[64], n = 0;
  for (int r = 0; r < g_size && n < 64; r += 2) evens[n++] = r;
  if (g_rank % 2 == 0) {
    tnt_group_t *g = NULL;
    mt_set_case("tnt_group_create even ranks");
    MT_OK(tnt_group_create(ctx, evens, n, &g));
    test_averages(g, "even ranks", TNT_AVERAGE, 2, small, 1);
    MT_OK(tnt_group_destroy(g));
  }

  double t = mt_now();
  test_determinism(world);
  if (g_rank == 0) printf("determinism: %.1f s\n", mt_now() - t);
  test_compressed(world);
  test_scaled(world);
  t = mt_now();
  test_modes(world);
  test_in_flight(world);
  if (g_rank == 0) printf("modes: %.1f s\n", mt_now() - t);
  test_tuned(world);
  test_overlap(world);
  test_readiness_order(world);
  test_errors(ctx, world);

  mt_set_case("teardown");
  MT_OK(tnt_context_destroy(ctx));
  mt_state()->ctx = NULL;
  if (g_rank == 0) printf("total: %.1f s\n", mt_now() - t0);
  int rc = mt_verdict();
  MPI_Finalize();
  return rc;
}
