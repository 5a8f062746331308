/*
 * Collectives of libtnt over MPI, at any number of ranks: allreduce (every
 * dtype, op, algorithm forced through TNT_ALLREDUCE_ALGORITHM, several
 * counts, blocking and non-blocking, in place and out of place), broadcast
 * from every root, allgather, allgatherv with uneven counts (zeros
 * included), reduce-scatter with equal and uneven blocks (and bitwise the
 * allreduce's block under every algorithm), barrier, several requests in flight at once, groups (disjoint
 * subsets, a reversed order, singletons) and invalid arguments. Data are
 * integer valued so that every expected result is exact; a second allreduce
 * pass uses random reals and checks that every rank got the same bits.
 */
#include "mpi_test_util.h"
#include "collectives/collectives.h"

#define NALGOS 5
static const char *const kAlgos[NALGOS] = {"shm", "ring", "rd", "mpi", "rabenseifner"};

/* Ways to call a collective. */
typedef enum mode {
  MODE_BLOCKING = 0,
  MODE_TEST_LOOP = 1, /* tnt_i* and tnt_request_test until done */
  MODE_WAIT = 2,      /* tnt_i* and tnt_request_wait */
  MODE_COUNT
} mode_t_;

static const char *const kModes[MODE_COUNT] = {"blocking", "nonblocking+test", "nonblocking+wait"};

/* Counts every dtype is tested at; float32 also gets kBigCount. */
static const size_t kCounts[] = {0, 1, 7, 1000, 65537};
#define NCOUNTS (sizeof kCounts / sizeof kCounts[0])
static const size_t kBigCount = (size_t)1 << 20;

/* Scratch buffers big enough for every case (kBigCount float32 elements or
 * 65537 int64 ones per rank, times the rank count for gathers). */
typedef struct bufs {
  void *in, *send, *recv, *want;
  size_t bytes;
} bufs_t;

static int g_rank, g_size;
static mt_hashlog_t g_log;

/* Completes a request according to `mode` (not MODE_BLOCKING). */
static tnt_status_t finish_request(tnt_request_t *req, mode_t_ mode) {
  tnt_status_t st = mode == MODE_TEST_LOOP ? mt_test_loop(req, 60.0) : tnt_request_wait(req, -1);
  tnt_request_free(req);
  return st;
}

/*
 * A group of the world ranks `members` (of group g's context) whose
 * algorithm for one kind of collective is forced: groups choose their
 * algorithms from the settings when they are created, so `var`
 * (TNT_ALLREDUCE_ALGORITHM, ...) is set to `name` (NULL: unset) and the
 * settings loaded around the creation, then restored.
 * Collective over the members. forced_group: the same over every rank, in
 * world order.
 */
static tnt_group_t *forced_subgroup(tnt_group_t *g, const int *members, int n, const char *var,
                                    const char *name) {
  const char *was = getenv(var);
  char *saved = was != NULL ? strdup(was) : NULL;
  if (name != NULL) {
    setenv(var, name, 1);
  } else {
    unsetenv(var);
  }
  MT_OK(tnt_settings_load());
  tnt_group_t *forced = NULL;
  tnt_status_t st = tnt_group_create(tnt_group_context(g), members, n, &forced);
  if (st != TNT_OK) mt_fatal("tnt_group_create with %s=%s: %s", var, name, mt_st(st));
  if (saved != NULL) {
    setenv(var, saved, 1);
  } else {
    unsetenv(var);
  }
  free(saved);
  MT_OK(tnt_settings_load());
  return forced;
}

static tnt_group_t *forced_group(tnt_group_t *world, const char *var, const char *name) {
  int *ranks = mt_alloc((size_t)g_size * sizeof *ranks);
  for (int r = 0; r < g_size; r++) ranks[r] = r;
  tnt_group_t *g = forced_subgroup(world, ranks, g_size, var, name);
  free(ranks);
  return g;
}

/* The world with TNT_ALLREDUCE_ALGORITHM=kAlgos[a], for a < NALGOS. */
static tnt_group_t *g_algo_world[NALGOS];

static void make_algo_worlds(tnt_group_t *world) {
  for (int a = 0; a < NALGOS; a++) {
    g_algo_world[a] = forced_group(world, "TNT_ALLREDUCE_ALGORITHM", kAlgos[a]);
  }
}

static uint64_t case_seed(int a, int b, int c, size_t d) {
  return mt_mix64(((uint64_t)a << 48) ^ ((uint64_t)b << 40) ^ ((uint64_t)c << 32) ^ d) % 1000003;
}

/* ---------------------------------------------------------------- basics */

static void test_basics(tnt_context_t *ctx, tnt_group_t *world) {
  mt_set_case("world group and context basics");
  MT_CHECK(world != NULL, "tnt_context_world: expected a group, got NULL");
  MT_CHECK(tnt_group_rank(world) == g_rank, "tnt_group_rank: expected %d, got %d", g_rank,
           tnt_group_rank(world));
  MT_CHECK(tnt_group_size(world) == g_size, "tnt_group_size: expected %d, got %d", g_size,
           tnt_group_size(world));
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
  int lrank, lsize, leaders = 0, leader;
  MPI_Comm_rank(node, &lrank);
  MPI_Comm_size(node, &lsize);
  leader = lrank == 0;
  MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_free(&node);
  MT_CHECK(tnt_group_local_rank(world) == lrank, "tnt_group_local_rank: expected %d, got %d", lrank,
           tnt_group_local_rank(world));
  MT_CHECK(tnt_group_local_size(world) == lsize, "tnt_group_local_size: expected %d, got %d", lsize,
           tnt_group_local_size(world));
  MT_CHECK(tnt_group_num_hosts(world) == leaders, "tnt_group_num_hosts: expected %d, got %d",
           leaders, tnt_group_num_hosts(world));
  const char *env = getenv("TNT_TIMEOUT_S");
  double want = env != NULL && atof(env) > 0 ? atof(env) : 30.0;
  MT_CHECK(fabs(tnt_context_timeout(ctx) - want) < 1e-9, "tnt_context_timeout: expected %g, got %g",
           want, tnt_context_timeout(ctx));
  const char *msg = NULL;
  MT_CHECK(tnt_context_error(ctx, &msg) == TNT_OK, "tnt_context_error: expected TNT_OK, got %s",
           mt_st(tnt_context_error(ctx, &msg)));
  for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
    MT_CHECK(tnt_dtype_size((tnt_dtype_t)d) == mt_dsize((tnt_dtype_t)d),
             "tnt_dtype_size(%s): expected %zu, got %zu", mt_dname((tnt_dtype_t)d),
             mt_dsize((tnt_dtype_t)d), tnt_dtype_size((tnt_dtype_t)d));
    MT_CHECK(strcmp(tnt_dtype_name((tnt_dtype_t)d), mt_dname((tnt_dtype_t)d)) == 0,
             "tnt_dtype_name(%d): expected %s, got %s", d, mt_dname((tnt_dtype_t)d),
             tnt_dtype_name((tnt_dtype_t)d));
  }
  for (int o = 0; o < TNT_OP_COUNT; o++) {
    MT_CHECK(strcmp(tnt_op_name((tnt_op_t)o), mt_oname((tnt_op_t)o)) == 0,
             "tnt_op_name(%d): expected %s, got %s", o, mt_oname((tnt_op_t)o),
             tnt_op_name((tnt_op_t)o));
  }
}

/* ------------------------------------------------------------- allreduce */

/* One allreduce of `count` elements of the prepared input b->in, checked
 * against b->want. */
static void allreduce_once(tnt_group_t *g, bufs_t *b, size_t count, tnt_dtype_t dt, tnt_op_t op,
                           mode_t_ mode, int in_place) {
  size_t bytes = count * mt_dsize(dt);
  tnt_status_t st;
  void *dst = in_place ? b->send : b->recv;
  memcpy(b->send, b->in, bytes);
  if (!in_place) mt_fill_sentinel(b->recv, count, dt);
  if (mode == MODE_BLOCKING) {
    st = tnt_allreduce(g, b->send, dst, count, dt, op);
  } else {
    tnt_request_t *req = NULL;
    st = tnt_iallreduce(g, b->send, dst, count, dt, op, &req);
    if (st == TNT_OK) st = finish_request(req, mode);
  }
  if (st != TNT_OK) mt_fatal("allreduce returned %s", mt_st(st));
  mt_compare(dt, dst, b->want, count, "allreduce result");
  if (!in_place) mt_compare(dt, b->send, b->in, count, "allreduce changed its send buffer");
  mt_hashlog_add(&g_log, dst, bytes);
}

static void test_allreduce_exact(bufs_t *b) {
  for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
    tnt_dtype_t dt = (tnt_dtype_t)d;
    for (size_t ci = 0; ci <= NCOUNTS; ci++) {
      if (ci == NCOUNTS && dt != TNT_FLOAT32) continue;
      size_t count = ci < NCOUNTS ? kCounts[ci] : kBigCount;
      for (int o = 0; o < TNT_OP_COUNT; o++) {
        if (!td_pair_runs(d, o)) continue;
        tnt_op_t op = (tnt_op_t)o;
        uint64_t seed = case_seed(1, d, o, count);
        mt_fill(b->in, count, dt, seed, g_rank);
        mt_expected_reduce(b->want, count, dt, op, seed, NULL, g_size);
        for (int a = 0; a < NALGOS; a++) {
          tnt_group_t *g = g_algo_world[a];
          const char *used = tnt_allreduce_algorithm(g, count * mt_dsize(dt));
          for (int m = 0; m < MODE_COUNT; m++) {
            for (int in_place = 0; in_place < 2; in_place++) {
              mt_set_case("allreduce %s %s %s count=%zu %s %s", kAlgos[a], mt_dname(dt),
                          mt_oname(op), count, kModes[m], in_place ? "in-place" : "out-of-place");
              if (m == 0 && in_place == 0) {
                MT_CHECK(used != NULL && strcmp(used, kAlgos[a]) == 0,
                         "tnt_allreduce_algorithm with TNT_ALLREDUCE_ALGORITHM=%s: expected %s, "
                         "got %s",
                         kAlgos[a], kAlgos[a], used != NULL ? used : "NULL");
              }
              allreduce_once(g, b, count, dt, op, (mode_t_)m, in_place);
            }
          }
        }
      }
    }
  }
  mt_hashlog_compare(&g_log, MPI_COMM_WORLD, "allreduce exact");
}

/* Unit roundoff of each floating dtype. */
static double unit_roundoff(tnt_dtype_t dt) {
  switch (dt) {
    case TNT_FLOAT32:
      return ldexp(1.0, -24);
    case TNT_FLOAT64:
      return ldexp(1.0, -53);
    case TNT_FLOAT16:
      return ldexp(1.0, -11);
    default:
      return ldexp(1.0, -8);
  }
}

/* Random real data: results cannot be predicted bitwise, so they are checked
 * against a double-precision reference with a rounding bound, and the hash
 * log proves that every rank got the same bits. */
static void test_allreduce_random(bufs_t *b) {
  static const tnt_dtype_t dts[] = {TNT_FLOAT32, TNT_FLOAT64, TNT_FLOAT16, TNT_BFLOAT16};
  static const size_t counts[] = {1, 1000, 65537};
  double *ref = mt_alloc(65537 * sizeof *ref);
  double *mag = mt_alloc(65537 * sizeof *mag);
  for (int a = 0; a < NALGOS; a++) {
    tnt_group_t *g = g_algo_world[a];
    for (size_t di = 0; di < 4; di++) {
      tnt_dtype_t dt = dts[di];
      for (size_t ci = 0; ci < 3; ci++) {
        size_t count = counts[ci];
        for (int o = 0; o < 2; o++) {
          tnt_op_t op = o == 0 ? TNT_SUM : TNT_AVERAGE;
          mt_set_case("allreduce random %s %s %s count=%zu", kAlgos[a], mt_dname(dt), mt_oname(op),
                      count);
          uint64_t seed = case_seed(2, (int)di, o, count);
          memset(ref, 0, count * sizeof *ref);
          memset(mag, 0, count * sizeof *mag);
          for (int r = 0; r < g_size; r++) {
            mt_rng_t rng = mt_rng(seed, (uint64_t)r, 77);
            for (size_t i = 0; i < count; i++) {
              double v = mt_uniform(&rng) * 8.0;
              if (r == g_rank) mt_store(dt, b->in, i, v);
              mt_store(dt, b->want, 0, v); /* the value as the dtype holds it */
              double held = mt_load(dt, b->want, 0);
              ref[i] += held;
              mag[i] += fabs(held);
            }
          }
          memcpy(b->send, b->in, count * mt_dsize(dt));
          tnt_status_t st = tnt_allreduce(g, b->send, b->recv, count, dt, op);
          if (st != TNT_OK) mt_fatal("allreduce returned %s", mt_st(st));
          double u = unit_roundoff(dt), div = op == TNT_AVERAGE ? g_size : 1;
          for (size_t i = 0; i < count; i++) {
            double want = ref[i] / div;
            double tol = (2.0 * g_size * u * mag[i]) / div + 2.0 * u * fabs(want);
            double got = mt_load(dt, b->recv, i);
            if (!(fabs(got - want) <= tol)) {
              mt_fail((long)i, "expected %.17g (+- %.3g), got %.17g", want, tol, got);
              break;
            }
          }
          mt_hashlog_add(&g_log, b->recv, count * mt_dsize(dt));
        }
      }
    }
  }
  mt_hashlog_compare(&g_log, MPI_COMM_WORLD, "allreduce random");
  free(ref);
  free(mag);
}

/* TNT_ALLREDUCE_ALGORITHM overrides the choice at every size; without it
 * the choice is one of the four names, the same on every rank. */
static void test_algorithm_names(tnt_group_t *world) {
  static const size_t sizes[] = {0, 4, 4096, 262144, (size_t)1 << 26};
  for (int a = 0; a < NALGOS; a++) {
    for (size_t s = 0; s < 5; s++) {
      mt_set_case("tnt_allreduce_algorithm forced=%s bytes=%zu", kAlgos[a], sizes[s]);
      const char *got = tnt_allreduce_algorithm(g_algo_world[a], sizes[s]);
      MT_CHECK(got != NULL && strcmp(got, kAlgos[a]) == 0, "expected %s, got %s", kAlgos[a],
               got != NULL ? got : "NULL");
    }
  }
  tnt_group_t *by_size = forced_group(world, "TNT_ALLREDUCE_ALGORITHM", NULL);
  for (size_t s = 0; s < 5; s++) {
    mt_set_case("tnt_allreduce_algorithm default bytes=%zu", sizes[s]);
    const char *got = tnt_allreduce_algorithm(by_size, sizes[s]);
    int known = 0;
    for (int a = 0; a < NALGOS; a++) known |= got != NULL && strcmp(got, kAlgos[a]) == 0;
    MT_CHECK(known, "expected one of shm, ring, rd, mpi, got %s", got != NULL ? got : "NULL");
    char name[16] = {0};
    if (got != NULL) snprintf(name, sizeof name, "%s", got);
    mt_hashlog_add(&g_log, name, sizeof name);
  }
  /* A group keeps its choice: changing the variable afterwards changes
   * nothing. */
  mt_set_case("tnt_allreduce_algorithm after TNT_ALLREDUCE_ALGORITHM changed");
  const char *before = tnt_allreduce_algorithm(g_algo_world[0], 4);
  setenv("TNT_ALLREDUCE_ALGORITHM", kAlgos[1], 1);
  MT_OK(tnt_settings_load());
  const char *after = tnt_allreduce_algorithm(g_algo_world[0], 4);
  MT_CHECK(strcmp(before, after) == 0, "expected %s to stay, got %s", before, after);
  unsetenv("TNT_ALLREDUCE_ALGORITHM");
  MT_OK(tnt_settings_load());
  MT_OK(tnt_group_destroy(by_size));
  mt_hashlog_compare(&g_log, MPI_COMM_WORLD, "default algorithm choice");
}

/* ------------------------------------------------------------- broadcast */

static void broadcast_once(tnt_group_t *g, bufs_t *b, size_t count, tnt_dtype_t dt, int root,
                           int root_world, uint64_t seed, mode_t_ mode) {
  size_t bytes = count * mt_dsize(dt);
  mt_fill(b->want, count, dt, seed, root_world);
  if (tnt_group_rank(g) == root) {
    memcpy(b->recv, b->want, bytes);
  } else {
    mt_fill_sentinel(b->recv, count, dt);
  }
  tnt_status_t st;
  if (mode == MODE_BLOCKING) {
    st = tnt_broadcast(g, b->recv, count, dt, root);
  } else {
    tnt_request_t *req = NULL;
    st = tnt_ibroadcast(g, b->recv, count, dt, root, &req);
    if (st == TNT_OK) st = finish_request(req, mode);
  }
  if (st != TNT_OK) mt_fatal("broadcast returned %s", mt_st(st));
  mt_compare(dt, b->recv, b->want, count, "broadcast result");
}

/*
 * Broadcast and allgather(v) algorithms can be forced too, through
 * TNT_BROADCAST_ALGORITHM and TNT_ALLGATHER_ALGORITHM (documented with the
 * algorithm tables in src/collectives/collectives.h; "auto" chooses by
 * size), read when a group is created. The public API cannot report the
 * choice, so these only make sure that every algorithm is exercised.
 */
static const char *const kBcastAlgos[] = {"auto", "tree", "shm"};
static void test_broadcast_roots(tnt_group_t *world, bufs_t *b, const char *algo);
static const char *const kGatherAlgos[] = {"auto", "ring", "shm", "bruck", "rd"};

static void test_broadcast(tnt_group_t *world, bufs_t *b) {
  for (int a = 0; a < 3; a++) {
    tnt_group_t *g = forced_group(world, "TNT_BROADCAST_ALGORITHM", kBcastAlgos[a]);
    test_broadcast_roots(g, b, kBcastAlgos[a]);
    MT_OK(tnt_group_destroy(g));
  }
}

static void test_broadcast_roots(tnt_group_t *world, bufs_t *b, const char *algo) {
  for (int root = 0; root < g_size; root++) {
    for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
      tnt_dtype_t dt = (tnt_dtype_t)d;
      for (size_t ci = 0; ci <= NCOUNTS; ci++) {
        if (ci == NCOUNTS && dt != TNT_FLOAT32) continue;
        size_t count = ci < NCOUNTS ? kCounts[ci] : kBigCount;
        for (int m = 0; m < MODE_COUNT; m++) {
          if (ci == NCOUNTS && m != MODE_BLOCKING) continue;
          mt_set_case("broadcast %s root=%d %s count=%zu %s", algo, root, mt_dname(dt), count,
                      kModes[m]);
          broadcast_once(world, b, count, dt, root, root, case_seed(3, d, root, count), (mode_t_)m);
        }
      }
    }
  }
}

/* ------------------------------------------------------------- allgather */

/* Group rank j's world rank. */
static int member(const int *members, int j) {
  return members != NULL ? members[j] : j;
}

static void allgather_once(tnt_group_t *g, const int *members, bufs_t *b, size_t count,
                           tnt_dtype_t dt, uint64_t seed, mode_t_ mode) {
  int n = tnt_group_size(g);
  size_t es = mt_dsize(dt);
  mt_fill(b->in, count, dt, seed, g_rank);
  memcpy(b->send, b->in, count * es);
  for (int j = 0; j < n; j++) {
    mt_fill((uint8_t *)b->want + (size_t)j * count * es, count, dt, seed, member(members, j));
  }
  mt_fill_sentinel(b->recv, (size_t)n * count, dt);
  tnt_status_t st;
  if (mode == MODE_BLOCKING) {
    st = tnt_allgather(g, b->send, count, b->recv, dt);
  } else {
    tnt_request_t *req = NULL;
    st = tnt_iallgather(g, b->send, count, b->recv, dt, &req);
    if (st == TNT_OK) st = finish_request(req, mode);
  }
  if (st != TNT_OK) mt_fatal("allgather returned %s", mt_st(st));
  mt_compare(dt, b->recv, b->want, (size_t)n * count, "allgather result");
  mt_compare(dt, b->send, b->in, count, "allgather changed its send buffer");
}

static void test_allgather(tnt_group_t *world, bufs_t *b) {
  for (int a = 0; a < 3; a++) {
    tnt_group_t *g = forced_group(world, "TNT_ALLGATHER_ALGORITHM", kGatherAlgos[a]);
    for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
      tnt_dtype_t dt = (tnt_dtype_t)d;
      for (size_t ci = 0; ci < NCOUNTS; ci++) {
        for (int m = 0; m < MODE_COUNT; m++) {
          mt_set_case("allgather %s %s count=%zu %s", kGatherAlgos[a], mt_dname(dt), kCounts[ci],
                      kModes[m]);
          allgather_once(g, NULL, b, kCounts[ci], dt, case_seed(4, d, m, kCounts[ci]),
                         (mode_t_)m);
        }
      }
    }
    mt_set_case("allgather %s float32 count=%zu blocking", kGatherAlgos[a], kBigCount / 4);
    allgather_once(g, NULL, b, kBigCount / 4, TNT_FLOAT32, 99, MODE_BLOCKING);
    MT_OK(tnt_group_destroy(g));
  }
}

/* Patterns of per-rank counts for allgatherv. */
static size_t pattern_count(int pattern, int r, int n) {
  switch (pattern) {
    case 0:
      return r % 3 == 1 ? 0 : 1 + (size_t)r * 513; /* uneven, zeros from rank 1 */
    case 1:
      return r == n - 1 ? 1000 : 0; /* only the last rank */
    case 2:
      return 65537 - (size_t)r * 1000; /* large, uneven */
    case 3:
      return 0; /* nothing at all */
    default:
      return (size_t)(r % 2) * 7; /* odd ranks only */
  }
}
#define NPATTERNS 5

/* Allgatherv with counts by `pattern`; `reversed` places the blocks in
 * reverse rank order with gaps of 3 elements that must stay untouched. */
static void allgatherv_once(tnt_group_t *g, const int *members, bufs_t *b, int pattern,
                            int reversed, tnt_dtype_t dt, uint64_t seed, mode_t_ mode) {
  int n = tnt_group_size(g), me = tnt_group_rank(g);
  size_t es = mt_dsize(dt);
  size_t *counts = mt_alloc((size_t)n * sizeof *counts);
  size_t *displs = mt_alloc((size_t)n * sizeof *displs);
  size_t pos = 0;
  for (int k = 0; k < n; k++) {
    int j = reversed ? n - 1 - k : k;
    counts[j] = pattern_count(pattern, j, n);
    displs[j] = pos;
    pos += counts[j] + (reversed ? 3 : 0);
  }
  size_t total = pos;
  mt_fill_sentinel(b->want, total, dt);
  for (int j = 0; j < n; j++) {
    mt_fill((uint8_t *)b->want + displs[j] * es, counts[j], dt, seed, member(members, j));
  }
  mt_fill(b->in, counts[me], dt, seed, g_rank);
  memcpy(b->send, b->in, counts[me] * es);
  mt_fill_sentinel(b->recv, total, dt);
  tnt_status_t st;
  if (mode == MODE_BLOCKING) {
    st = tnt_allgatherv(g, b->send, counts[me], b->recv, counts, displs, dt);
  } else {
    tnt_request_t *req = NULL;
    st = tnt_iallgatherv(g, b->send, counts[me], b->recv, counts, displs, dt, &req);
    /* counts and displs are copied by the call: scribble over them. */
    memset(counts, 0xff, (size_t)n * sizeof *counts);
    memset(displs, 0xff, (size_t)n * sizeof *displs);
    if (st == TNT_OK) st = finish_request(req, mode);
  }
  if (st != TNT_OK) mt_fatal("allgatherv returned %s", mt_st(st));
  mt_compare(dt, b->recv, b->want, total, "allgatherv result (gaps must keep the sentinel)");
  free(counts);
  free(displs);
}

static void test_allgatherv(tnt_group_t *world, bufs_t *b) {
  for (int a = 0; a < 3; a++) {
    tnt_group_t *g = forced_group(world, "TNT_ALLGATHER_ALGORITHM", kGatherAlgos[a]);
    for (int p = 0; p < NPATTERNS; p++) {
      for (int reversed = 0; reversed < 2; reversed++) {
        for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
          for (int m = 0; m < MODE_COUNT; m++) {
            mt_set_case("allgatherv %s pattern=%d %s %s %s", kGatherAlgos[a], p,
                        reversed ? "reversed+gaps" : "packed", mt_dname((tnt_dtype_t)d), kModes[m]);
            allgatherv_once(g, NULL, b, p, reversed, (tnt_dtype_t)d,
                            case_seed(5, p * 2 + reversed, d, (size_t)m), (mode_t_)m);
          }
        }
      }
    }
    MT_OK(tnt_group_destroy(g));
  }
}

/* -------------------------------------------------------- reduce-scatter */

/* One reduce-scatter of integer data: equal blocks of `count` (pattern < 0,
 * tnt_reduce_scatter) or the blocks of allgatherv's `pattern`
 * (tnt_reduce_scatterv), checked against the exact reduction; nothing past
 * the block is written and the send buffer stays as it was. */
static void reduce_scatter_once(tnt_group_t *g, bufs_t *b, size_t count, int pattern,
                                tnt_dtype_t dt, tnt_op_t op, uint64_t seed, mode_t_ mode) {
  const size_t es = mt_dsize(dt);
  size_t *counts = mt_alloc((size_t)g_size * sizeof *counts);
  size_t total = 0, lo = 0;
  for (int r = 0; r < g_size; r++) {
    counts[r] = pattern < 0 ? count : pattern_count(pattern, r, g_size);
    if (r < g_rank) lo += counts[r];
    total += counts[r];
  }
  const size_t mine = counts[g_rank];
  mt_fill(b->in, total, dt, seed, g_rank);
  mt_expected_reduce(b->want, total, dt, op, seed, NULL, g_size);
  memcpy(b->send, b->in, total * es);
  mt_fill_sentinel(b->recv, mine + 16, dt);
  tnt_status_t st;
  if (mode == MODE_BLOCKING) {
    st = pattern < 0 ? tnt_reduce_scatter(g, b->send, b->recv, count, dt, op)
                     : tnt_reduce_scatterv(g, b->send, b->recv, counts, dt, op);
  } else {
    tnt_request_t *req = NULL;
    st = pattern < 0 ? tnt_ireduce_scatter(g, b->send, b->recv, count, dt, op, &req)
                     : tnt_ireduce_scatterv(g, b->send, b->recv, counts, dt, op, &req);
    /* The counts are copied by the call: scribble over them. */
    memset(counts, 0xff, (size_t)g_size * sizeof *counts);
    if (st == TNT_OK) st = finish_request(req, mode);
  }
  if (st != TNT_OK) mt_fatal("reduce-scatter returned %s", mt_st(st));
  mt_compare(dt, b->recv, (uint8_t *)b->want + lo * es, mine, "reduce-scatter block");
  for (size_t i = 0; i < 16 * es; i++) {
    if (((uint8_t *)b->recv)[mine * es + i] != 0xa5) {
      mt_fail((long)i, "reduce-scatter wrote past its block of %zu elements", mine);
      break;
    }
  }
  mt_compare(dt, b->send, b->in, total, "reduce-scatter changed its send buffer");
  free(counts);
}

/* Under every forced allreduce algorithm and the choice by size. Then
 * random reals cut as tnt__slice cuts them (a fusion set's parts): every
 * block is bitwise the allreduce's elements there. */
static void test_reduce_scatter(tnt_group_t *world, bufs_t *b) {
  static const size_t counts[] = {0, 1, 7, 1000};
  for (int a = -1; a < NALGOS; a++) {
    tnt_group_t *g = a < 0 ? world : g_algo_world[a];
    const char *name = a < 0 ? "auto" : kAlgos[a];
    for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
      const tnt_dtype_t dt = (tnt_dtype_t)d;
      for (size_t ci = 0; ci <= 4; ci++) {
        if (ci == 4 && dt != TNT_FLOAT32) continue;
        const size_t count = ci < 4 ? counts[ci] : kBigCount / (size_t)g_size + 3;
        for (int o = 0; o < TNT_OP_COUNT; o++) {
          if (!td_pair_runs(d, o)) continue;
          for (int m = 0; m < MODE_COUNT; m++) {
            mt_set_case("reduce-scatter %s %s %s count=%zu %s", name, mt_dname(dt),
                        mt_oname((tnt_op_t)o), count, kModes[m]);
            reduce_scatter_once(g, b, count, -1, dt, (tnt_op_t)o, case_seed(6, d, o, count),
                                (mode_t_)m);
          }
        }
      }
    }
    static const tnt_dtype_t vdts[] = {TNT_FLOAT32, TNT_INT32, TNT_FLOAT16};
    for (int p = 0; p < NPATTERNS; p++) {
      for (size_t di = 0; di < 3; di++) {
        for (int m = 0; m < MODE_COUNT; m++) {
          mt_set_case("reduce-scatterv %s pattern=%d %s %s", name, p, mt_dname(vdts[di]),
                      kModes[m]);
          reduce_scatter_once(g, b, 0, p, vdts[di], p % 2 ? TNT_AVERAGE : TNT_SUM,
                              case_seed(7, p, (int)di, (size_t)m), (mode_t_)m);
        }
      }
    }
    static const tnt_dtype_t rdts[] = {TNT_FLOAT32, TNT_FLOAT64, TNT_FLOAT16, TNT_BFLOAT16};
    static const size_t rcounts[] = {1, 1000, 65537};
    size_t *blocks = mt_alloc(((size_t)g_size + 1) * sizeof *blocks);
    for (size_t di = 0; di < 4; di++) {
      const tnt_dtype_t dt = rdts[di];
      const size_t es = mt_dsize(dt);
      for (size_t ci = 0; ci < 3; ci++) {
        const size_t count = rcounts[ci];
        for (int o = 0; o < 2; o++) {
          const tnt_op_t op = o == 0 ? TNT_SUM : TNT_AVERAGE;
          mt_set_case("reduce-scatter %s bitwise the allreduce, %s %s count=%zu", name,
                      mt_dname(dt), mt_oname(op), count);
          mt_rng_t rng = mt_rng(case_seed(8, (int)di, o, count), (uint64_t)g_rank, 5);
          for (size_t i = 0; i < count; i++) mt_store(dt, b->in, i, mt_uniform(&rng) * 8.0);
          MT_OK(tnt_allreduce(g, b->in, b->want, count, dt, op));
          tnt__slice_bounds(count, es, g_size, blocks);
          const size_t start = blocks[g_rank];
          for (int r = 0; r < g_size; r++) blocks[r] = blocks[r + 1] - blocks[r];
          MT_OK(tnt_reduce_scatterv(g, b->in, b->recv, blocks, dt, op));
          mt_compare(dt, b->recv, (uint8_t *)b->want + start * es, blocks[g_rank],
                     "reduce-scatter block against the allreduce");
        }
      }
    }
    free(blocks);
  }
}

/* --------------------------------------------------------------- barrier */

/* Rank r arrives r * 40 ms late; nobody may leave before the last arrived.
 * CLOCK_MONOTONIC is shared by the processes of one host; across hosts
 * only the ordering within one host is meaningful, so the check uses the
 * node communicator. */
static void barrier_once(tnt_group_t *g, MPI_Comm comm, mode_t_ mode) {
  int me = tnt_group_rank(g);
  mt_sleep(0.04 * me);
  double t_in = mt_now();
  tnt_status_t st;
  if (mode == MODE_BLOCKING) {
    st = tnt_barrier(g);
  } else {
    tnt_request_t *req = NULL;
    st = tnt_ibarrier(g, &req);
    if (st == TNT_OK) st = finish_request(req, mode);
  }
  double t_out = mt_now();
  if (st != TNT_OK) mt_fatal("barrier returned %s", mt_st(st));
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  double last_in = mt_max_over(t_in, node), first_out = mt_min_over(t_out, node);
  MPI_Comm_free(&node);
  MT_CHECK(first_out >= last_in,
           "a rank left the barrier %.6f s before the last one entered (expected >= 0 s)",
           last_in - first_out);
}

static void test_barrier(tnt_group_t *world) {
  for (int m = 0; m < MODE_COUNT; m++) {
    mt_set_case("barrier %s", kModes[m]);
    barrier_once(world, MPI_COMM_WORLD, (mode_t_)m);
  }
}

/* ---------------------------------------------- several requests in flight */

/* Submits five different collectives, then completes them in reverse order
 * (the engine runs them in submission order). */
static void test_in_flight(tnt_group_t *world) {
  mt_set_case("five requests in flight, completed in reverse order");
  const size_t n = 4099;
  float *a_in = mt_alloc(n * 4), *a_out = mt_alloc(n * 4), *a_want = mt_alloc(n * 4);
  int64_t *d_buf = mt_alloc(n * 8), *d_want = mt_alloc(n * 8);
  int32_t *b_buf = mt_alloc(n * 4), *b_want = mt_alloc(n * 4);
  uint16_t *c_in = mt_alloc(n * 2), *c_out = mt_alloc(n * 2 * (size_t)g_size);
  uint16_t *c_want = mt_alloc(n * 2 * (size_t)g_size);
  mt_fill(a_in, n, TNT_FLOAT32, 11, g_rank);
  mt_expected_reduce(a_want, n, TNT_FLOAT32, TNT_SUM, 11, NULL, g_size);
  mt_fill(b_want, n, TNT_INT32, 12, g_size - 1);
  if (g_rank == g_size - 1) {
    memcpy(b_buf, b_want, n * 4);
  } else {
    mt_fill_sentinel(b_buf, n, TNT_INT32);
  }
  mt_fill(c_in, n, TNT_BFLOAT16, 13, g_rank);
  for (int r = 0; r < g_size; r++) mt_fill(c_want + (size_t)r * n, n, TNT_BFLOAT16, 13, r);
  mt_fill(d_buf, n, TNT_INT64, 14, g_rank);
  mt_expected_reduce(d_want, n, TNT_INT64, TNT_MAX, 14, NULL, g_size);
  tnt_request_t *req[5] = {NULL, NULL, NULL, NULL, NULL};
  MT_OK(tnt_iallreduce(world, a_in, a_out, n, TNT_FLOAT32, TNT_SUM, &req[0]));
  MT_OK(tnt_ibroadcast(world, b_buf, n, TNT_INT32, g_size - 1, &req[1]));
  MT_OK(tnt_iallgather(world, c_in, n, c_out, TNT_BFLOAT16, &req[2]));
  MT_OK(tnt_iallreduce(world, d_buf, d_buf, n, TNT_INT64, TNT_MAX, &req[3]));
  MT_OK(tnt_ibarrier(world, &req[4]));
  for (int k = 4; k >= 0; k--) {
    tnt_status_t st = k % 2 ? tnt_request_wait(req[k], -1) : mt_test_loop(req[k], 60.0);
    if (st != TNT_OK) mt_fatal("request %d of 5: expected TNT_OK, got %s", k, mt_st(st));
    tnt_request_free(req[k]);
  }
  mt_compare(TNT_FLOAT32, a_out, a_want, n, "iallreduce float32 sum");
  mt_compare(TNT_INT32, b_buf, b_want, n, "ibroadcast int32");
  mt_compare(TNT_BFLOAT16, c_out, c_want, n * (size_t)g_size, "iallgather bfloat16");
  mt_compare(TNT_INT64, d_buf, d_want, n, "iallreduce int64 max in place");

  /* A request freed before it completes is released by the engine; the
   * next collective still matches. */
  mt_set_case("request freed before completion");
  tnt_request_t *early = NULL;
  MT_OK(tnt_iallreduce(world, a_in, a_out, n, TNT_FLOAT32, TNT_SUM, &early));
  tnt_request_free(early);
  MT_OK(tnt_allreduce(world, d_want, d_buf, n, TNT_INT64, TNT_MIN));
  mt_compare(TNT_INT64, d_buf, d_want, n, "allreduce after a freed request");
  free(a_in), free(a_out), free(a_want), free(b_buf), free(b_want);
  free(c_in), free(c_out), free(c_want), free(d_buf), free(d_want);
}

/*
 * A wait that times out leaves the request valid: rank 0 joins an allreduce
 * 1.5 s late; the others first see TNT_IN_PROGRESS from tnt_request_test and
 * TNT_ERR_TIMEOUT from a 0.2 s tnt_request_wait, then wait again and get
 * the right result, and the context stays healthy.
 */
static void test_wait_timeout(tnt_context_t *ctx, tnt_group_t *world) {
  if (g_size < 2) return;
  mt_set_case("tnt_request_wait timing out while rank 0 is late");
  int64_t in = g_rank + 1, out = -1;
  if (g_rank == 0) mt_sleep(1.5);
  tnt_request_t *req = NULL;
  MT_OK(tnt_iallreduce(world, &in, &out, 1, TNT_INT64, TNT_SUM, &req));
  if (g_rank != 0) {
    tnt_status_t st = tnt_request_test(req);
    MT_CHECK(st == TNT_IN_PROGRESS, "tnt_request_test: expected TNT_IN_PROGRESS, got %s",
             mt_st(st));
    double t0 = mt_now();
    st = tnt_request_wait(req, 0.2);
    double dt = mt_now() - t0;
    MT_CHECK(st == TNT_ERR_TIMEOUT, "tnt_request_wait(0.2 s): expected TNT_ERR_TIMEOUT, got %s",
             mt_st(st));
    MT_CHECK(dt >= 0.15 && dt < 1.2, "tnt_request_wait(0.2 s) returned after %.3f s", dt);
  }
  MT_OK(tnt_request_wait(req, -1));
  tnt_request_free(req);
  int64_t want = (int64_t)g_size * (g_size + 1) / 2;
  MT_CHECK(out == want, "allreduce after a timed-out wait: expected %" PRId64 ", got %" PRId64,
           want, out);
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  MT_CHECK(cst == TNT_OK, "tnt_context_error after a timed-out wait: expected TNT_OK, got %s (%s)",
           mt_st(cst), msg != NULL ? msg : "");
}

/* ----------------------------------------------------------------- groups */

/*
 * Runs the collectives on group `g` whose group rank j is world rank
 * members[j]; `gcomm` is an MPI communicator of the same members in the
 * same order (for expected host counts and the hash comparison).
 */
static void group_suite(tnt_group_t *g, const int *members, int n, MPI_Comm gcomm,
                        const char *gname, bufs_t *b) {
  int me = -1;
  for (int j = 0; j < n; j++) {
    if (members[j] == g_rank) me = j;
  }
  mt_set_case("group %s: ranks", gname);
  MT_CHECK(tnt_group_rank(g) == me, "tnt_group_rank: expected %d, got %d", me, tnt_group_rank(g));
  MT_CHECK(tnt_group_size(g) == n, "tnt_group_size: expected %d, got %d", n, tnt_group_size(g));
  MPI_Comm node;
  MPI_Comm_split_type(gcomm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int lrank, lsize, leader, leaders = 0;
  MPI_Comm_rank(node, &lrank);
  MPI_Comm_size(node, &lsize);
  leader = lrank == 0;
  MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, gcomm);
  MPI_Comm_free(&node);
  MT_CHECK(tnt_group_local_rank(g) == lrank, "tnt_group_local_rank: expected %d, got %d", lrank,
           tnt_group_local_rank(g));
  MT_CHECK(tnt_group_local_size(g) == lsize, "tnt_group_local_size: expected %d, got %d", lsize,
           tnt_group_local_size(g));
  MT_CHECK(tnt_group_num_hosts(g) == leaders, "tnt_group_num_hosts: expected %d, got %d", leaders,
           tnt_group_num_hosts(g));

  static const tnt_dtype_t dts[] = {TNT_FLOAT32, TNT_INT32, TNT_FLOAT16, TNT_INT64};
  static const size_t counts[] = {7, 1000, 65537};
  for (int a = 0; a < NALGOS; a++) {
    tnt_group_t *ga = forced_subgroup(g, members, n, "TNT_ALLREDUCE_ALGORITHM", kAlgos[a]);
    for (int di = 0; di < 4; di++) {
      for (int ci = 0; ci < 3; ci++) {
        for (int o = 0; o < TNT_OP_COUNT; o++) {
          tnt_dtype_t dt = dts[di];
          tnt_op_t op = (tnt_op_t)o;
          size_t count = counts[ci];
          uint64_t seed = case_seed(6, di * 8 + o, a, count);
          mt_set_case("group %s: allreduce %s %s %s count=%zu", gname, kAlgos[a], mt_dname(dt),
                      mt_oname(op), count);
          const char *used = tnt_allreduce_algorithm(ga, count * mt_dsize(dt));
          MT_CHECK(used != NULL && strcmp(used, kAlgos[a]) == 0,
                   "tnt_allreduce_algorithm: expected %s, got %s", kAlgos[a],
                   used != NULL ? used : "NULL");
          mt_fill(b->in, count, dt, seed, g_rank);
          mt_expected_reduce(b->want, count, dt, op, seed, members, n);
          allreduce_once(ga, b, count, dt, op, (mode_t_)((o + ci) % MODE_COUNT), (o + a) % 2);
        }
      }
    }
    MT_OK(tnt_group_destroy(ga));
  }
  for (int m = 0; m < MODE_COUNT; m++) {
    tnt_group_t *gb = forced_subgroup(g, members, n, "TNT_BROADCAST_ALGORITHM", kBcastAlgos[m]);
    for (int root = 0; root < n; root++) {
      mt_set_case("group %s: broadcast %s root=%d (world %d) %s", gname, kBcastAlgos[m], root,
                  members[root], kModes[m]);
      broadcast_once(gb, b, 1000 + (size_t)root, TNT_FLOAT64, root, members[root],
                     case_seed(7, root, m, 0), (mode_t_)m);
    }
    MT_OK(tnt_group_destroy(gb));
  }
  for (int m = 0; m < MODE_COUNT; m++) {
    tnt_group_t *gg = forced_subgroup(g, members, n, "TNT_ALLGATHER_ALGORITHM", kGatherAlgos[m]);
    mt_set_case("group %s: allgather %s %s", gname, kGatherAlgos[m], kModes[m]);
    allgather_once(gg, members, b, 777, TNT_INT32, case_seed(8, m, 0, 0), (mode_t_)m);
    for (int p = 0; p < NPATTERNS; p++) {
      mt_set_case("group %s: allgatherv %s pattern=%d %s", gname, kGatherAlgos[m], p, kModes[m]);
      allgatherv_once(gg, members, b, p, m % 2, TNT_FLOAT16, case_seed(9, p, m, 0), (mode_t_)m);
    }
    MT_OK(tnt_group_destroy(gg));
    mt_set_case("group %s: barrier %s", gname, kModes[m]);
    barrier_once(g, gcomm, (mode_t_)m);
  }
  mt_hashlog_compare(&g_log, gcomm, gname);
}

/* Creates the tnt group of `members` on the ranks listed (only they call
 * tnt_group_create). */
static tnt_group_t *make_group(tnt_context_t *ctx, const int *members, int n, const char *gname) {
  mt_set_case("group %s: tnt_group_create", gname);
  tnt_group_t *g = NULL;
  MT_OK(tnt_group_create(ctx, members, n, &g));
  if (g == NULL) mt_fatal("tnt_group_create succeeded but gave a NULL group");
  return g;
}

static void test_groups(tnt_context_t *ctx, tnt_group_t *world, bufs_t *b) {
  int *members = mt_alloc((size_t)g_size * sizeof *members);

  /* Even and odd world ranks: two disjoint groups working at the same time.
   * Each then has a group collective and a world collective in flight
   * together. The MPI communicator of each group is split first, so that no
   * MPI collective over the world waits behind a group's work. */
  int parity = g_rank % 2, n = 0;
  for (int r = parity; r < g_size; r += 2) members[n++] = r;
  const char *gname = parity == 0 ? "even ranks" : "odd ranks";
  MPI_Comm gcomm;
  MPI_Comm_split(MPI_COMM_WORLD, parity, g_rank, &gcomm);
  tnt_group_t *g = make_group(ctx, members, n, gname);
  group_suite(g, members, n, gcomm, gname, b);
  MPI_Comm_free(&gcomm);
  mt_set_case("group %s: group and world requests in flight together", gname);
  int32_t gv = g_rank, gsum = 0, wv = g_rank, wsum = 0, want_g = 0;
  for (int j = 0; j < n; j++) want_g += members[j];
  tnt_request_t *rg = NULL, *rw = NULL;
  MT_OK(tnt_iallreduce(g, &gv, &gsum, 1, TNT_INT32, TNT_SUM, &rg));
  MT_OK(tnt_iallreduce(world, &wv, &wsum, 1, TNT_INT32, TNT_SUM, &rw));
  MT_OK(tnt_request_wait(rw, -1));
  MT_OK(tnt_request_wait(rg, -1));
  tnt_request_free(rw);
  tnt_request_free(rg);
  MT_CHECK(gsum == want_g, "group sum: expected %d, got %d", want_g, gsum);
  MT_CHECK(wsum == g_size * (g_size - 1) / 2, "world sum: expected %d, got %d",
           g_size * (g_size - 1) / 2, wsum);
  mt_set_case("group %s: tnt_group_destroy", gname);
  MT_OK(tnt_group_destroy(g));

  /* Every rank, listed in reverse: group rank j is world rank size-1-j. */
  for (int j = 0; j < g_size; j++) members[j] = g_size - 1 - j;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - 1 - g_rank, &gcomm);
  tnt_group_t *rev = make_group(ctx, members, g_size, "reversed");
  group_suite(rev, members, g_size, gcomm, "reversed", b);
  MPI_Comm_free(&gcomm);
  mt_set_case("group reversed: tnt_group_destroy");
  MT_OK(tnt_group_destroy(rev));

  /* Every rank alone: reductions are the identity (average divides by 1). */
  members[0] = g_rank;
  mt_set_case("group singleton: tnt_group_create");
  tnt_group_t *one = NULL;
  MT_OK(tnt_group_create(ctx, members, 1, &one));
  for (int o = 0; o < TNT_OP_COUNT; o++) {
    mt_set_case("group singleton: allreduce float32 %s", mt_oname((tnt_op_t)o));
    mt_fill(b->in, 1000, TNT_FLOAT32, 21, g_rank);
    mt_expected_reduce(b->want, 1000, TNT_FLOAT32, (tnt_op_t)o, 21, members, 1);
    allreduce_once(one, b, 1000, TNT_FLOAT32, (tnt_op_t)o, MODE_BLOCKING, o % 2);
  }
  mt_set_case("group singleton: allgather");
  allgather_once(one, members, b, 100, TNT_INT64, 22, MODE_WAIT);
  MT_OK(tnt_group_destroy(one));
  g_log.n = 0; /* the singleton results differ by rank by design */
  free(members);
}

/* ------------------------------------------------------ invalid arguments */

static void test_invalid(tnt_context_t *ctx, tnt_group_t *w) {
  double t0 = mt_now();
  float buf[64] = {0}, out[64 * 8] = {0};
  size_t counts[8] = {0}, displs[8] = {0};
  tnt_request_t *req = NULL;
  const tnt_dtype_t bad_dt[] = {TNT_DTYPE_COUNT, (tnt_dtype_t)-1, (tnt_dtype_t)1000};
  const tnt_op_t bad_op[] = {TNT_OP_COUNT, (tnt_op_t)-1};
  const tnt_status_t E = TNT_ERR_INVALID_ARG;
  for (int r = 0; r < g_size && r < 8; r++) counts[r] = 1, displs[r] = (size_t)r;

  mt_set_case("invalid arguments: allreduce");
  MT_EXPECT_ST(tnt_allreduce(NULL, buf, out, 4, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_allreduce(w, NULL, out, 4, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_allreduce(w, buf, NULL, 4, TNT_FLOAT32, TNT_SUM), E);
  for (int k = 0; k < 3; k++) MT_EXPECT_ST(tnt_allreduce(w, buf, out, 4, bad_dt[k], TNT_SUM), E);
  for (int k = 0; k < 2; k++) MT_EXPECT_ST(tnt_allreduce(w, buf, out, 4, TNT_INT32, bad_op[k]), E);
  MT_EXPECT_ST(tnt_iallreduce(w, buf, out, 4, TNT_FLOAT32, TNT_SUM, NULL), E);
  MT_EXPECT_ST(tnt_iallreduce(w, NULL, out, 4, TNT_FLOAT32, TNT_SUM, &req), E);
  MT_EXPECT_ST(tnt_iallreduce(w, buf, out, 4, TNT_FLOAT32, bad_op[0], &req), E);

  mt_set_case("invalid arguments: broadcast");
  MT_EXPECT_ST(tnt_broadcast(NULL, buf, 4, TNT_FLOAT32, 0), E);
  MT_EXPECT_ST(tnt_broadcast(w, NULL, 4, TNT_FLOAT32, 0), E);
  MT_EXPECT_ST(tnt_broadcast(w, buf, 4, TNT_FLOAT32, -1), E);
  MT_EXPECT_ST(tnt_broadcast(w, buf, 4, TNT_FLOAT32, g_size), E);
  MT_EXPECT_ST(tnt_broadcast(w, buf, 4, bad_dt[0], 0), E);
  MT_EXPECT_ST(tnt_ibroadcast(w, buf, 4, TNT_FLOAT32, g_size, &req), E);
  MT_EXPECT_ST(tnt_ibroadcast(w, buf, 4, TNT_FLOAT32, 0, NULL), E);

  mt_set_case("invalid arguments: allgather and allgatherv");
  MT_EXPECT_ST(tnt_allgather(w, NULL, 4, out, TNT_FLOAT32), E);
  MT_EXPECT_ST(tnt_allgather(w, buf, 4, NULL, TNT_FLOAT32), E);
  MT_EXPECT_ST(tnt_allgather(w, buf, 4, out, bad_dt[1]), E);
  MT_EXPECT_ST(tnt_iallgather(w, buf, 4, out, TNT_FLOAT32, NULL), E);
  MT_EXPECT_ST(tnt_allgatherv(w, buf, 1, out, NULL, displs, TNT_FLOAT32), E);
  MT_EXPECT_ST(tnt_allgatherv(w, buf, 1, out, counts, NULL, TNT_FLOAT32), E);
  MT_EXPECT_ST(tnt_allgatherv(w, NULL, 1, out, counts, displs, TNT_FLOAT32), E);
  MT_EXPECT_ST(tnt_allgatherv(w, buf, 1, NULL, counts, displs, TNT_FLOAT32), E);
  MT_EXPECT_ST(tnt_allgatherv(w, buf, 1, out, counts, displs, bad_dt[2]), E);
  MT_EXPECT_ST(tnt_allgatherv(w, buf, 2, out, counts, displs, TNT_FLOAT32), E); /* != counts[r] */
  MT_EXPECT_ST(tnt_iallgatherv(w, buf, 1, out, counts, displs, TNT_FLOAT32, NULL), E);

  mt_set_case("invalid arguments: reduce-scatter");
  MT_EXPECT_ST(tnt_reduce_scatter(NULL, out, buf, 1, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_reduce_scatter(w, NULL, buf, 1, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_reduce_scatter(w, out, NULL, 1, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_reduce_scatter(w, out, buf, 1, bad_dt[0], TNT_SUM), E);
  MT_EXPECT_ST(tnt_reduce_scatter(w, out, buf, 1, TNT_FLOAT32, bad_op[1]), E);
  MT_EXPECT_ST(tnt_ireduce_scatter(w, out, buf, 1, TNT_FLOAT32, TNT_SUM, NULL), E);
  MT_EXPECT_ST(tnt_reduce_scatterv(w, out, buf, NULL, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_reduce_scatterv(w, NULL, buf, counts, TNT_FLOAT32, TNT_SUM), E);
  MT_EXPECT_ST(tnt_ireduce_scatterv(w, out, buf, counts, TNT_FLOAT32, TNT_SUM, NULL), E);
  counts[g_size - 1] = SIZE_MAX / 4;
  MT_EXPECT_ST(tnt_reduce_scatterv(w, out, buf, counts, TNT_FLOAT32, TNT_SUM), E);
  counts[g_size - 1] = 1;

  mt_set_case("invalid arguments: barrier and requests");
  MT_EXPECT_ST(tnt_barrier(NULL), E);
  MT_EXPECT_ST(tnt_ibarrier(w, NULL), E);
  MT_EXPECT_ST(tnt_request_test(NULL), E);
  MT_EXPECT_ST(tnt_request_wait(NULL, 1.0), E);
  tnt_request_free(NULL);

  mt_set_case("invalid arguments: tnt_group_create");
  tnt_group_t *g = NULL;
  int list[10];
  for (int j = 0; j < 10; j++) list[j] = j < g_size ? j : 0;
  MT_EXPECT_ST(tnt_group_create(NULL, list, g_size, &g), E);
  MT_EXPECT_ST(tnt_group_create(ctx, NULL, 1, &g), E);
  MT_EXPECT_ST(tnt_group_create(ctx, list, 0, &g), E);
  MT_EXPECT_ST(tnt_group_create(ctx, list, -1, &g), E);
  MT_EXPECT_ST(tnt_group_create(ctx, list, g_size, NULL), E);
  list[0] = g_rank, list[1] = g_size; /* out of range */
  MT_EXPECT_ST(tnt_group_create(ctx, list, 2, &g), E);
  list[1] = -1;
  MT_EXPECT_ST(tnt_group_create(ctx, list, 2, &g), E);
  list[1] = g_rank; /* duplicate */
  MT_EXPECT_ST(tnt_group_create(ctx, list, 2, &g), E);
  for (int j = 0; j <= g_size && j < 10; j++) list[j] = j < g_size ? j : g_size - 1;
  MT_EXPECT_ST(tnt_group_create(ctx, list, g_size + 1, &g), E); /* too many, so a duplicate */

  mt_set_case("invalid arguments: dtype and op names");
  MT_CHECK(tnt_dtype_size(TNT_DTYPE_COUNT) == 0, "tnt_dtype_size(invalid): expected 0, got %zu",
           tnt_dtype_size(TNT_DTYPE_COUNT));
  MT_CHECK(strcmp(tnt_dtype_name((tnt_dtype_t)-1), "invalid") == 0,
           "tnt_dtype_name(-1): expected invalid, got %s", tnt_dtype_name((tnt_dtype_t)-1));
  MT_CHECK(strcmp(tnt_op_name(TNT_OP_COUNT), "invalid") == 0,
           "tnt_op_name(TNT_OP_COUNT): expected invalid, got %s", tnt_op_name(TNT_OP_COUNT));
  for (int s = TNT_ERR_INTERNAL; s <= TNT_IN_PROGRESS; s++) {
    MT_CHECK(tnt_status_string((tnt_status_t)s) != NULL, "tnt_status_string(%d): got NULL", s);
  }

  mt_set_case("invalid arguments: context still healthy afterwards");
  double elapsed = mt_now() - t0;
  MT_CHECK(elapsed < 5.0, "invalid-argument calls took %.1f s (expected immediate returns)",
           elapsed);
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  MT_CHECK(cst == TNT_OK, "tnt_context_error: expected TNT_OK, got %s (%s)", mt_st(cst),
           msg != NULL ? msg : "");
  int32_t one = 1, sum = 0;
  MT_OK(tnt_allreduce(w, &one, &sum, 1, TNT_INT32, TNT_SUM));
  MT_CHECK(sum == g_size, "allreduce after invalid calls: expected %d, got %d", g_size, sum);
}

/* A second context alongside the first (its own communicator, engine and
 * shared memory), then a third after the second was destroyed. */
static void test_second_context(tnt_group_t *world) {
  for (int round = 0; round < 2; round++) {
    mt_set_case("second context, round %d: tnt_context_create", round);
    tnt_config_t config = {15.0};
    tnt_context_t *ctx2 = NULL;
    MT_OK(tnt_context_create(&config, &ctx2));
    tnt_group_t *w2 = tnt_context_world(ctx2);
    MT_CHECK(fabs(tnt_context_timeout(ctx2) - 15.0) < 1e-9,
             "tnt_context_timeout: expected 15, got %g", tnt_context_timeout(ctx2));
    mt_set_case("second context, round %d: allreduces on both contexts in flight", round);
    const size_t n = 70000;
    float *a = mt_alloc(n * 4), *b = mt_alloc(n * 4), *c = mt_alloc(n * 4);
    float *want = mt_alloc(n * 4);
    mt_fill(a, n, TNT_FLOAT32, 31, g_rank);
    memcpy(c, a, n * 4);
    mt_expected_reduce(want, n, TNT_FLOAT32, TNT_SUM, 31, NULL, g_size);
    tnt_request_t *r1 = NULL, *r2 = NULL;
    MT_OK(tnt_iallreduce(w2, a, b, n, TNT_FLOAT32, TNT_SUM, &r2));
    MT_OK(tnt_iallreduce(world, c, c, n, TNT_FLOAT32, TNT_SUM, &r1));
    MT_OK(tnt_request_wait(r1, -1));
    MT_OK(tnt_request_wait(r2, -1));
    tnt_request_free(r1);
    tnt_request_free(r2);
    mt_compare(TNT_FLOAT32, b, want, n, "second context's allreduce");
    mt_compare(TNT_FLOAT32, c, want, n, "first context's allreduce");
    mt_set_case("second context, round %d: tnt_context_destroy", round);
    MT_OK(tnt_context_destroy(ctx2));
    int finalized = 1;
    MPI_Finalized(&finalized);
    MT_CHECK(!finalized, "destroying a context finalized MPI that the test had initialized");
    free(a), free(b), free(c), free(want);
  }
}

int main(int argc, char **argv) {
  mt_init("test_collectives_mpi", &argc, &argv, 1);
  tnt_context_t *ctx = mt_context(NULL);
  tnt_group_t *world = tnt_context_world(ctx);
  g_rank = mt_state()->rank;
  g_size = mt_state()->size;
  double t0 = mt_now();

  bufs_t b;
  size_t per_rank = kBigCount * 4;
  if (65537 * 8 > per_rank) per_rank = 65537 * 8;
  b.bytes = per_rank * (size_t)g_size + 4096;
  b.in = mt_alloc(b.bytes);
  b.send = mt_alloc(b.bytes);
  b.recv = mt_alloc(b.bytes);
  b.want = mt_alloc(b.bytes);

  if (world == NULL) mt_fatal("tnt_context_world returned NULL");
  test_basics(ctx, world);
  double t = mt_now();
  make_algo_worlds(world);
  test_allreduce_exact(&b);
  if (g_rank == 0) printf("allreduce exact: %.1f s\n", mt_now() - t);
  t = mt_now();
  test_allreduce_random(&b);
  test_algorithm_names(world);
  if (g_rank == 0) printf("allreduce random and names: %.1f s\n", mt_now() - t);
  t = mt_now();
  test_broadcast(world, &b);
  test_allgather(world, &b);
  test_allgatherv(world, &b);
  if (g_rank == 0) printf("broadcast, allgather(v): %.1f s\n", mt_now() - t);
  t = mt_now();
  test_reduce_scatter(world, &b);
  if (g_rank == 0) printf("reduce-scatter: %.1f s\n", mt_now() - t);
  t = mt_now();
  test_barrier(world);
  test_in_flight(world);
  test_wait_timeout(ctx, world);
  if (g_rank == 0) printf("barrier, requests in flight: %.1f s\n", mt_now() - t);
  t = mt_now();
  test_groups(ctx, world, &b);
  test_invalid(ctx, world);
  test_second_context(world);
  if (g_rank == 0) printf("groups and invalid arguments: %.1f s\n", mt_now() - t);

  mt_set_case("teardown");
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  MT_CHECK(cst == TNT_OK, "tnt_context_error at the end: expected TNT_OK, got %s (%s)", mt_st(cst),
           msg != NULL ? msg : "");
  MT_OK(tnt_context_destroy(ctx));
  mt_state()->ctx = NULL;
  int finalized = 1;
  MPI_Finalized(&finalized);
  MT_CHECK(!finalized, "tnt_context_destroy finalized MPI that the test had initialized");
  if (g_rank == 0) printf("total: %.1f s\n", mt_now() - t0);
  int rc = mt_verdict();
  mt_hashlog_free(&g_log);
  free(b.in), free(b.send), free(b.recv), free(b.want);
  MPI_Finalize();
  return rc;
}
