/*
 * Collective algorithms over ranks simulated as threads.
 *
 * Every layout (1, 2, 3, 4, 5 and 8 ranks on one host; 2 hosts x 2, 2 x 4,
 * an interleaved 2 x 2, 3 hosts x 1 and an uneven 3 + 1) starts one thread
 * per rank; each builds a communicator over the threads transport with
 * tnt__comm_create and runs every usable algorithm of each table, looked up
 * by name, on the same sequence of calls:
 *  - allreduce for every dtype x op, counts from 0 to several shared-memory
 *    slots (TNT_SHM_SLOT_KB is set to 4 so that vectors are segmented),
 *    out of place and in place;
 *  - broadcast from every root, including messages of several slots;
 *  - allgatherv with uneven (and empty) blocks placed out of rank order;
 *  - reduce-scatter through each allreduce algorithm, whose block must be
 *    the allreduce's bit for bit, and with explicit uneven blocks;
 *  - the barrier.
 * Inputs are small integers, so every sum is exact and the expected result
 * is unique whatever the order of combination: each rank checks its bits
 * against it, which also proves the ranks agree. A separate test reduces
 * non-integer floats, whose bits depend on the order, and compares the
 * ranks' results with each other. Another makes one rank call a different
 * collective than the others and expects TNT_ERR_MISMATCH, not a result.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "transport_threads.h"
#include "util/log.h"
#include "util/reduce.h"
#include "util/types.h"
#include "tnt_test_data.h"

#define MAX_RANKS 8
#define TIMEOUT_S 20.0

/* Ranks report the first failure through this message (per thread). */
typedef struct rank_ctx {
  int rank, size;
  const int *hosts;
  tnt__threads_world_t *world;
  pthread_barrier_t *barrier;
  void *shared; /* per test */
  char error[512];
} rank_ctx_t;

/* FAIL_IF ends the rank's test: for failed calls, after which the ranks
 * may no longer be in step. CHECK records a wrong result and lets the rank
 * go on with the same sequence of calls as its peers, so that one defect
 * does not hide the others. */
#define FAIL_IF(cond, ...)                                \
  do {                                                    \
    if (cond) {                                           \
      snprintf(rc->error, sizeof rc->error, __VA_ARGS__); \
      return -1;                                          \
    }                                                     \
  } while (0)

__attribute__((format(printf, 2, 3))) static void note_error(rank_ctx_t *rc, const char *fmt, ...) {
  if (rc->error[0] != '\0') return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rc->error, sizeof rc->error, fmt, ap);
  va_end(ap);
}

/* Inside a loop: records the first wrong result and leaves the loop. */
#define CHECK_BREAK(cond, ...)   \
  if (!(cond)) {                 \
    note_error(rc, __VA_ARGS__); \
    break;                       \
  } else                         \
    (void)0

typedef int (*rank_fn)(rank_ctx_t *rc, tnt__comm_t *c);

typedef struct layout {
  const char *name;
  int size;
  const int *hosts; /* NULL: one host */
} layout_t;

static const int kHosts2x2[] = {0, 0, 1, 1};
static const int kHosts2x4[] = {0, 0, 0, 0, 1, 1, 1, 1};
static const int kHostsInterleaved[] = {5, 9, 5, 9};
static const int kHosts3p1[] = {0, 0, 0, 1};
static const int kHosts3x1[] = {0, 1, 2};

static const layout_t kLayouts[] = {
    {"1 rank", 1, NULL},
    {"2 ranks", 2, NULL},
    {"3 ranks", 3, NULL},
    {"4 ranks", 4, NULL},
    {"5 ranks", 5, NULL},
    {"8 ranks", 8, NULL},
    {"2 hosts x 2", 4, kHosts2x2},
    {"2 hosts x 4", 8, kHosts2x4},
    {"2 hosts x 2 interleaved", 4, kHostsInterleaved},
    {"3 hosts x 1", 3, kHosts3x1},
    {"3 + 1 ranks on 2 hosts", 4, kHosts3p1},
};
#define NLAYOUTS (sizeof kLayouts / sizeof kLayouts[0])

typedef struct thread_arg {
  rank_ctx_t rc;
  rank_fn fn;
} thread_arg_t;

static void *rank_main(void *p) {
  thread_arg_t *a = p;
  rank_ctx_t *rc = &a->rc;
  tnt__log_set_rank(rc->rank, rc->size, 1);
  tnt__transport_t *t = NULL;
  tnt__comm_t *c = NULL;
  tnt_status_t st = tnt__threads_transport_create(rc->world, rc->rank, &t);
  if (st < 0) {
    snprintf(rc->error, sizeof rc->error, "transport: %s", tnt_status_string(st));
    return NULL;
  }
  st = tnt__comm_create(t, &c);
  if (st < 0) {
    snprintf(rc->error, sizeof rc->error, "comm_create: %s", tnt_status_string(st));
    return NULL;
  }
  a->fn(rc, c);
  tnt__comm_destroy(c);
  return NULL;
}

/* Runs `fn` on every rank of `lay`; prints each rank's failure and returns
 * how many ranks failed. */
static int run_layout(const layout_t *lay, rank_fn fn, void *shared) {
  tnt__threads_world_t *world = NULL;
  assert_int_equal(tnt__threads_world_create(lay->size, lay->hosts, &world), TNT_OK);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)lay->size);
  pthread_t th[MAX_RANKS];
  thread_arg_t args[MAX_RANKS];
  for (int r = 0; r < lay->size; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].rc.rank = r;
    args[r].rc.size = lay->size;
    args[r].rc.hosts = lay->hosts;
    args[r].rc.world = world;
    args[r].rc.barrier = &barrier;
    args[r].rc.shared = shared;
    args[r].fn = fn;
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
  }
  for (int r = 0; r < lay->size; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&barrier);
  tnt__threads_world_destroy(world);
  int failed = 0;
  for (int r = 0; r < lay->size; r++) {
    if (args[r].rc.error[0] != '\0') {
      print_error("%s, rank %d: %s\n", lay->name, r, args[r].rc.error);
      failed++;
    }
  }
  return failed;
}

/* Runs `fn` on every layout; fails the test when any rank failed. */
static void run_all_layouts(rank_fn fn, void *shared) {
  int failed = 0;
  for (size_t l = 0; l < NLAYOUTS; l++) failed += run_layout(&kLayouts[l], fn, shared);
  if (failed > 0) fail_msg("%d ranks failed", failed);
}

/* ----------------------------------------------------------- values */

/* Input element i of rank r (a generator of tnt_test_data.h): a small
 * integer, so that sums of up to 8 ranks are exact in every dtype (halves
 * hold integers up to 2048, bfloat16 up to 256, int8 up to 127, uint8 up
 * to 255: their inputs span 31 values, uint8's from 0). */
static double input_value(const void *arg, tnt_dtype_t dt, int r, size_t i) {
  (void)arg;
  int64_t span = (dt == TNT_FLOAT16 || dt == TNT_BFLOAT16) ? 33
                 : (dt == TNT_INT8 || dt == TNT_UINT8)     ? 31
                                                           : 2001;
  return td_centred(dt,
                    (double)((int64_t)((i * 131u + (size_t)r * 977u + (i >> 7) * 7u) %
                                       (size_t)span) -
                             span / 2),
                    (double)(span / 2));
}

/* Counts: empty, tiny, primes, one slot exactly (float32, 4 KiB slots), and
 * several slots. */
static const size_t kCounts[] = {0, 1, 3, 31, 1024, 1031, 4099, 10007};
#define NCOUNTS (sizeof kCounts / sizeof kCounts[0])
#define MAX_COUNT 10007

static const char *const kAllreduceAlgos[] = {"shm", "rd", "ring", "mpi", "hier", "rabenseifner"};
static const char *const kBroadcastAlgos[] = {"shm", "tree"};
static const char *const kAllgathervAlgos[] = {"shm", "ring", "bruck", "rd"};

/* ----------------------------------------------------------- allreduce */

/* Checks one allreduce result against the expected bits; returns 0 and
 * records the first wrong element otherwise. */
static int check_allreduce(rank_ctx_t *rc, const tnt__algo_t *algo, const uint8_t *got,
                           const uint8_t *want, size_t count, tnt_dtype_t dt, tnt_op_t op,
                           int in_place) {
  size_t esz = tnt_dtype_size(dt), i;
  if (td_count_diff(dt, got, want, count, &i) != 0) {
    note_error(rc, "allreduce %s %s %s count %zu%s: element %zu is %g, want %g", algo->name,
               tnt_dtype_name(dt), tnt_op_name(op), count, in_place ? " in place" : "", i,
               tnt__load_value(dt, got, i), tnt__load_value(dt, want, i));
    return 0;
  }
  for (size_t i = 0; i < 64; i++) {
    if (got[count * esz + i] != 0xee) {
      note_error(rc, "allreduce %s %s count %zu wrote past the end", algo->name, tnt_dtype_name(dt),
                 count);
      return 0;
    }
  }
  return 1;
}

static int allreduce_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  const size_t maxb = MAX_COUNT * 8;
  /* pristine: this rank's input; want: the expected result for every
   * element (neither depends on the count). */
  uint8_t *pristine = malloc(maxb), *want = malloc(maxb);
  uint8_t *in = malloc(maxb + 64), *out = malloc(maxb + 64);
  int ran = 0;
  FAIL_IF(!pristine || !want || !in || !out, "out of memory");
  FAIL_IF(c->rank != rc->rank || c->size != rc->size, "comm rank %d size %d", c->rank, c->size);
  for (size_t a = 0; a < sizeof kAllreduceAlgos / sizeof kAllreduceAlgos[0]; a++) {
    const tnt__algo_t *algo = tnt__algo_find(TNT__COLL_ALLREDUCE, kAllreduceAlgos[a]);
    FAIL_IF(algo == NULL, "allreduce algorithm %s is not in the table", kAllreduceAlgos[a]);
    if (!algo->usable(c)) continue;
    ran++;
    for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
      size_t esz = tnt_dtype_size((tnt_dtype_t)dt);
      td_fill((tnt_dtype_t)dt, pristine, MAX_COUNT, input_value, NULL, c->rank);
      for (int op = 0; op < TNT_OP_COUNT; op++) {
        if (!td_pair_runs(dt, op)) continue;
        td_expected_reduce((tnt_dtype_t)dt, (tnt_op_t)op, want, MAX_COUNT, input_value, NULL, NULL,
                           c->size);
        for (size_t k = 0; k < NCOUNTS; k++) {
          size_t count = kCounts[k];
          /* The largest count for float32 only, where the fast kernels
           * are; every dtype still crosses slot boundaries with 4099. */
          if (count > 4099 && dt != TNT_FLOAT32) continue;
          for (int in_place = 0; in_place < 2; in_place++) {
            /* A guard after the output catches writes past the end. */
            memcpy(in, pristine, count * esz);
            uint8_t *dst = in_place ? in : out;
            if (!in_place) memset(out, 0xcd, count * esz);
            memset(dst + count * esz, 0xee, 64);
            tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "allreduce test");
            tnt_status_t st =
                algo->fn.allreduce(c, in, dst, count, (tnt_dtype_t)dt, (tnt_op_t)op, &w);
            FAIL_IF(st != TNT_OK, "allreduce %s %s %s count %zu%s: %s", algo->name,
                    tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), count,
                    in_place ? " in place" : "", tnt_status_string(st));
            check_allreduce(rc, algo, dst, want, count, (tnt_dtype_t)dt, (tnt_op_t)op, in_place);
            /* Out of place, the input is left alone. */
            if (!in_place && memcmp(in, pristine, count * esz) != 0) {
              note_error(rc, "allreduce %s %s count %zu changed its input", algo->name,
                         tnt_dtype_name((tnt_dtype_t)dt), count);
            }
          }
        }
      }
    }
  }
  /* The threads transport has no native allreduce, everything else runs
   * somewhere: rd and ring always, shm on one host, hier on like hosts. */
  FAIL_IF(tnt__algo_find(TNT__COLL_ALLREDUCE, "mpi")->usable(c), "mpi usable over threads");
  FAIL_IF(ran < 2, "only %d allreduce algorithms ran", ran);
  FAIL_IF(tnt__algo_find(TNT__COLL_ALLREDUCE, "no-such-algorithm") != NULL, "unknown name found");
  for (size_t bytes = 1; bytes < ((size_t)1 << 26); bytes *= 8) {
    const tnt__algo_t *sel = tnt__algo_select(c, TNT__COLL_ALLREDUCE, bytes);
    FAIL_IF(sel == NULL || !sel->usable(c), "selected allreduce for %zu bytes is not usable",
            bytes);
    /* One rank per host: a ring over the whole vector, not one per segment. */
    FAIL_IF(c->num_hosts > 1 && c->local_size == 1 && strcmp(sel->name, "shm") == 0,
            "shm selected with one rank per host");
  }
  free(pristine);
  free(want);
  free(in);
  free(out);
  return 0;
}

static void test_allreduce(void **state) {
  (void)state;
  run_all_layouts(allreduce_rank, NULL);
}

/* Non-integer floats: the bits depend on the order of combination, and the
 * ranks must still agree bit for bit. Results are compared through a table
 * shared by the threads. */
typedef struct agree_table {
  uint8_t *result[MAX_RANKS];
} agree_table_t;

static int agree_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  agree_table_t *tab = rc->shared;
  const size_t count = 6007;
  for (size_t a = 0; a < sizeof kAllreduceAlgos / sizeof kAllreduceAlgos[0]; a++) {
    const tnt__algo_t *algo = tnt__algo_find(TNT__COLL_ALLREDUCE, kAllreduceAlgos[a]);
    if (algo == NULL || !algo->usable(c)) continue;
    for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
      if (tnt__dtype_is_integer((tnt_dtype_t)dt)) continue;
      for (int op = TNT_SUM; op <= TNT_AVERAGE; op++) {
        size_t esz = tnt_dtype_size((tnt_dtype_t)dt);
        uint8_t *in = malloc(count * esz), *mine = tab->result[c->rank];
        FAIL_IF(in == NULL, "out of memory");
        for (size_t i = 0; i < count; i++) {
          double v = (double)((i * 7919u + (size_t)c->rank * 104729u) % 10007u) / 97.0 - 50.0;
          tnt__store_value((tnt_dtype_t)dt, in, i, v);
        }
        tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "agreement test");
        tnt_status_t st = algo->fn.allreduce(c, in, mine, count, (tnt_dtype_t)dt, (tnt_op_t)op, &w);
        free(in);
        FAIL_IF(st != TNT_OK, "allreduce %s: %s", algo->name, tnt_status_string(st));
        pthread_barrier_wait(rc->barrier);
        int same = memcmp(mine, tab->result[0], count * esz) == 0;
        pthread_barrier_wait(rc->barrier);
        if (!same) {
          note_error(rc, "allreduce %s %s %s: rank %d differs from rank 0", algo->name,
                     tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), c->rank);
        }
      }
    }
  }
  return 0;
}

static void test_allreduce_ranks_agree(void **state) {
  (void)state;
  agree_table_t tab;
  for (int r = 0; r < MAX_RANKS; r++) tab.result[r] = malloc(6007 * 8);
  run_all_layouts(agree_rank, &tab);
  for (int r = 0; r < MAX_RANKS; r++) free(tab.result[r]);
}

/* ------------------------------------------------------- reduce-scatter */

/* Non-integer floats, whose sums depend on the order of combination: a
 * block that equals the allreduce's bit for bit was combined in its order.
 * Integers as input_value. */
static double noisy_value(const void *arg, tnt_dtype_t dt, int r, size_t i) {
  if (tnt__dtype_is_integer(dt)) return input_value(arg, dt, r, i);
  return (double)((i * 7919u + (size_t)r * 104729u) % 10007u) / 97.0 - 50.0;
}

/* Block q of the counts variant in round k: uneven, some empty, one of
 * several slots. */
static void scatter_bounds(int n, int k, size_t *bounds) {
  bounds[0] = 0;
  for (int q = 0; q < n; q++) {
    size_t len = (size_t)((q * 37 + k * 11) % 50);
    if ((q + k) % 4 == 3) len = 0;
    if (q == n / 2) len = 3001;
    bounds[q + 1] = bounds[q] + len;
  }
}

/* For every usable allreduce algorithm (forced as TNT_ALLREDUCE_ALGORITHM
 * forces it), dtype, op and count (counts below the number of ranks leave
 * blocks empty): block r of tnt__reduce_scatter, out of place and in place,
 * is bitwise the allreduce's elements [lo, hi) of tnt__slice, and nothing
 * past the block is written. Then explicit, uneven blocks (the counts
 * variant) against the exact sums. */
static int reduce_scatter_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  const size_t maxb = MAX_COUNT * 8;
  uint8_t *in = malloc(maxb), *full = malloc(maxb), *scratch = malloc(maxb);
  uint8_t *block = malloc(maxb + 64), *want = malloc(maxb);
  size_t bounds[MAX_RANKS + 1];
  FAIL_IF(!in || !full || !scratch || !block || !want, "out of memory");
  const tnt__algo_choice_t chosen = c->algos[TNT__COLL_ALLREDUCE];
  const int me = c->rank;
  for (size_t a = 0; a < sizeof kAllreduceAlgos / sizeof kAllreduceAlgos[0]; a++) {
    const tnt__algo_t *algo = tnt__algo_find(TNT__COLL_ALLREDUCE, kAllreduceAlgos[a]);
    if (!algo->usable(c)) continue;
    c->algos[TNT__COLL_ALLREDUCE] = tnt__algo_only(algo);
    for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
      const size_t esz = tnt_dtype_size((tnt_dtype_t)dt);
      for (int op = 0; op < TNT_OP_COUNT; op++) {
        if (!td_pair_runs(dt, op)) continue;
        for (size_t k = 0; k < NCOUNTS; k++) {
          const size_t count = kCounts[k];
          if (count > 4099 && dt != TNT_FLOAT32) continue;
          td_fill((tnt_dtype_t)dt, in, count, noisy_value, NULL, me);
          tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "reduce-scatter test");
          tnt_status_t st =
              algo->fn.allreduce(c, in, full, count, (tnt_dtype_t)dt, (tnt_op_t)op, &w);
          FAIL_IF(st != TNT_OK, "allreduce %s: %s", algo->name, tnt_status_string(st));
          tnt__slice_bounds(count, esz, c->size, bounds);
          const size_t lo = bounds[me], hi = bounds[me + 1];
          for (int in_place = 0; in_place < 2; in_place++) {
            memcpy(scratch, in, count * esz);
            uint8_t *dst = in_place ? scratch + lo * esz : block;
            if (!in_place) memset(block + (hi - lo) * esz, 0xee, 64);
            const char *ran = NULL;
            w = tnt__wait_ctx(TIMEOUT_S, "reduce-scatter test");
            st = tnt__reduce_scatter(c, scratch, dst, count, NULL, (tnt_dtype_t)dt, (tnt_op_t)op,
                                     &w, &ran);
            FAIL_IF(st != TNT_OK, "reduce-scatter %s %s %s count %zu: %s", algo->name,
                    tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), count,
                    tnt_status_string(st));
            FAIL_IF(ran == NULL || strcmp(ran, algo->name) != 0, "reduce-scatter ran %s, not %s",
                    ran ? ran : "nothing", algo->name);
            size_t i;
            if (td_count_diff((tnt_dtype_t)dt, dst, full + lo * esz, hi - lo, &i) != 0) {
              note_error(rc, "reduce-scatter %s %s %s count %zu%s: element %zu of [%zu, %zu) is "
                         "%g, the allreduce's %g",
                         algo->name, tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op),
                         count, in_place ? " in place" : "", lo + i, lo, hi,
                         tnt__load_value((tnt_dtype_t)dt, dst, i),
                         tnt__load_value((tnt_dtype_t)dt, full, lo + i));
            }
            for (size_t g = 0; !in_place && g < 64; g++) {
              CHECK_BREAK(block[(hi - lo) * esz + g] == 0xee,
                          "reduce-scatter %s count %zu wrote past its block", algo->name, count);
            }
          }
        }
      }
    }
    /* The counts variant: explicit blocks, exact integer sums. */
    for (int k = 0; k < 3; k++) {
      scatter_bounds(c->size, k, bounds);
      const size_t total = bounds[c->size], lo = bounds[me], hi = bounds[me + 1];
      const tnt_dtype_t kDtypes[] = {TNT_FLOAT32, TNT_FLOAT64, TNT_INT32, TNT_FLOAT16};
      for (size_t d = 0; d < sizeof kDtypes / sizeof kDtypes[0]; d++) {
        const tnt_dtype_t dt = kDtypes[d];
        const size_t esz = tnt_dtype_size(dt);
        for (int op = TNT_SUM; op <= TNT_AVERAGE; op++) {
          td_fill(dt, scratch, total, input_value, NULL, me);
          td_expected_reduce(dt, (tnt_op_t)op, want, total, input_value, NULL, NULL, c->size);
          tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "reduce-scatter test");
          tnt_status_t st =
              tnt__reduce_scatter(c, scratch, block, total, bounds, dt, (tnt_op_t)op, &w, NULL);
          FAIL_IF(st != TNT_OK, "reduce-scatter %s with counts: %s", algo->name,
                  tnt_status_string(st));
          size_t i;
          if (td_count_diff(dt, block, want + lo * esz, hi - lo, &i) != 0) {
            note_error(rc, "reduce-scatter %s %s %s with counts, round %d: element %zu of [%zu, "
                       "%zu) is %g, want %g",
                       algo->name, tnt_dtype_name(dt), tnt_op_name((tnt_op_t)op), k, i, lo, hi,
                       tnt__load_value(dt, block, i), tnt__load_value(dt, want + lo * esz, i));
          }
        }
      }
    }
  }
  c->algos[TNT__COLL_ALLREDUCE] = chosen;
  /* Unforced, the reduce-scatter runs the allreduce's choice by size. */
  for (size_t bytes = 4; bytes < ((size_t)1 << 26); bytes *= 16) {
    const char *ran = NULL;
    tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "reduce-scatter test");
    const size_t count = TNT__MIN(bytes / 4, (size_t)MAX_COUNT);
    FAIL_IF(tnt__reduce_scatter(c, scratch, block, count, NULL, TNT_FLOAT32, TNT_SUM, &w, &ran) !=
                TNT_OK,
            "reduce-scatter of %zu floats failed", count);
    FAIL_IF(strcmp(ran, tnt__algo_select(c, TNT__COLL_ALLREDUCE, count * 4)->name) != 0,
            "reduce-scatter of %zu floats ran %s", count, ran);
  }
  free(in);
  free(full);
  free(scratch);
  free(block);
  free(want);
  return 0;
}

static void test_reduce_scatter(void **state) {
  (void)state;
  run_all_layouts(reduce_scatter_rank, NULL);
}

/* ----------------------------------------------------------- broadcast */

static uint8_t bcast_byte(int root, size_t i) {
  return (uint8_t)(i * 29u + (size_t)root * 101u + (i >> 8));
}

static int broadcast_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  (void)rc;
  static const size_t kBytes[] = {0, 1, 13, 4096, 4097, 3 * 4096 + 5, 40000};
  uint8_t *buf = malloc(40000 + 64);
  FAIL_IF(buf == NULL, "out of memory");
  for (size_t a = 0; a < sizeof kBroadcastAlgos / sizeof kBroadcastAlgos[0]; a++) {
    const tnt__algo_t *algo = tnt__algo_find(TNT__COLL_BROADCAST, kBroadcastAlgos[a]);
    FAIL_IF(algo == NULL, "broadcast algorithm %s is not in the table", kBroadcastAlgos[a]);
    if (!algo->usable(c)) continue;
    for (int root = 0; root < c->size; root++) {
      for (size_t k = 0; k < sizeof kBytes / sizeof kBytes[0]; k++) {
        size_t bytes = kBytes[k];
        for (size_t i = 0; i < bytes + 64; i++) {
          buf[i] = c->rank == root && i < bytes ? bcast_byte(root, i) : 0xee;
        }
        tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "broadcast test");
        tnt_status_t st = algo->fn.broadcast(c, buf, bytes, root, &w);
        FAIL_IF(st != TNT_OK, "broadcast %s root %d %zu bytes: %s", algo->name, root, bytes,
                tnt_status_string(st));
        for (size_t i = 0; i < bytes; i++) {
          CHECK_BREAK(buf[i] == bcast_byte(root, i), "broadcast %s root %d %zu bytes: byte %zu",
                      algo->name, root, bytes, i);
        }
        for (size_t i = bytes; i < bytes + 64; i++) {
          CHECK_BREAK(buf[i] == 0xee, "broadcast %s wrote past the end", algo->name);
        }
      }
    }
  }
  FAIL_IF(!tnt__algo_find(TNT__COLL_BROADCAST, "tree")->usable(c), "tree not usable");
  free(buf);
  return 0;
}

static void test_broadcast(void **state) {
  (void)state;
  run_all_layouts(broadcast_rank, NULL);
}

/* ---------------------------------------------------------- allgatherv */

/* Rank r's block, in round k: uneven sizes (some empty, some several
 * slots), placed in reverse rank order with gaps between blocks. */
static void gather_layout(int n, int k, size_t *counts, size_t *displs, size_t *total) {
  for (int r = 0; r < n; r++) {
    counts[r] = (size_t)((r * 37 + k * 11) % 50);
    if ((r + k) % 4 == 3) counts[r] = 0;
    if (k == 2 && r == n / 2) counts[r] = 9000; /* beyond two 4 KiB slots */
  }
  size_t off = 3;
  for (int r = n - 1; r >= 0; r--) {
    displs[r] = off;
    off += counts[r] + 5;
  }
  *total = off;
}

static uint8_t gather_byte(int r, size_t i, int k) {
  return (uint8_t)(r * 53 + (int)i * 3 + k + 1);
}

static int allgatherv_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  (void)rc;
  size_t counts[MAX_RANKS], displs[MAX_RANKS], total;
  uint8_t *send = malloc(9000), *recv = malloc(20000);
  FAIL_IF(send == NULL || recv == NULL, "out of memory");
  for (size_t a = 0; a < sizeof kAllgathervAlgos / sizeof kAllgathervAlgos[0]; a++) {
    const tnt__algo_t *algo = tnt__algo_find(TNT__COLL_ALLGATHERV, kAllgathervAlgos[a]);
    FAIL_IF(algo == NULL, "allgatherv algorithm %s is not in the table", kAllgathervAlgos[a]);
    if (!algo->usable(c)) continue;
    for (int k = 0; k < 4; k++) {
      gather_layout(c->size, k, counts, displs, &total);
      for (size_t i = 0; i < counts[c->rank]; i++) send[i] = gather_byte(c->rank, i, k);
      memset(recv, 0xee, total + 64);
      /* Round 3 gathers in place: the block already sits at its spot. */
      const void *src = send;
      if (k == 3) {
        memcpy(recv + displs[c->rank], send, counts[c->rank]);
        src = recv + displs[c->rank];
      }
      tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "allgatherv test");
      tnt_status_t st = algo->fn.allgatherv(c, src, recv, counts, displs, &w);
      FAIL_IF(st != TNT_OK, "allgatherv %s round %d: %s", algo->name, k, tnt_status_string(st));
      for (int r = 0; r < c->size; r++) {
        for (size_t i = 0; i < counts[r]; i++) {
          CHECK_BREAK(recv[displs[r] + i] == gather_byte(r, i, k),
                      "allgatherv %s round %d: byte %zu of rank %d's block", algo->name, k, i, r);
        }
      }
      /* The gaps between blocks are untouched. */
      size_t covered = 0;
      for (size_t i = 0; i < total + 64; i++) {
        int inside = 0;
        for (int r = 0; r < c->size; r++) inside |= i >= displs[r] && i < displs[r] + counts[r];
        if (!inside) {
          covered++;
          CHECK_BREAK(recv[i] == 0xee, "allgatherv %s round %d wrote byte %zu outside the blocks",
                      algo->name, k, i);
        }
      }
      FAIL_IF(covered == 0, "no gaps checked");
    }
  }
  free(send);
  free(recv);
  return 0;
}

static void test_allgatherv(void **state) {
  (void)state;
  run_all_layouts(allgatherv_rank, NULL);
}

/* ------------------------------------------------------------- barrier */

typedef struct barrier_state {
  _Atomic int arrived;
} barrier_state_t;

/* No rank leaves barrier k before every rank has entered it. */
static int barrier_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  barrier_state_t *bs = rc->shared;
  for (int k = 1; k <= 50; k++) {
    atomic_fetch_add(&bs->arrived, 1);
    tnt__wait_ctx_t w = tnt__wait_ctx(TIMEOUT_S, "barrier test");
    tnt_status_t st = tnt__barrier(c, &w);
    FAIL_IF(st != TNT_OK, "barrier %d: %s", k, tnt_status_string(st));
    int seen = atomic_load(&bs->arrived);
    FAIL_IF(seen < k * c->size, "left barrier %d after only %d arrivals", k, seen);
    /* A second barrier keeps the fast ranks from counting the next round
     * before the slow ones have looked. */
    st = tnt__barrier(c, &w);
    FAIL_IF(st != TNT_OK, "barrier %d (second): %s", k, tnt_status_string(st));
  }
  return 0;
}

static void test_barrier(void **state) {
  (void)state;
  int failed = 0;
  for (size_t l = 0; l < NLAYOUTS; l++) {
    barrier_state_t bs;
    atomic_init(&bs.arrived, 0);
    failed += run_layout(&kLayouts[l], barrier_rank, &bs);
  }
  if (failed > 0) fail_msg("%d ranks failed", failed);
}

/* ------------------------------------------------------------ mismatch */

/* The last rank deviates from what the others call. */
typedef enum mismatch_kind {
  MM_COUNT,     /* allreduce of one element more */
  MM_DTYPE,     /* allreduce of float64 instead of float32 */
  MM_OP,        /* allreduce with max instead of sum */
  MM_BARRIER,   /* a barrier instead of the allreduce */
  MM_BROADCAST, /* the others broadcast from rank 0, it allreduces */
  MM_SCATTER,   /* a reduce-scatter of the same vector instead of the allreduce */
  MM_KINDS
} mismatch_kind_t;

typedef struct mismatch_case {
  mismatch_kind_t kind;
  const char *algo; /* allreduce algorithm */
  _Atomic int mismatches;
} mismatch_case_t;

static tnt_status_t mismatch_call(tnt__comm_t *c, const tnt__algo_t *algo, tnt__coll_sig_t sig,
                                  double *buf, const tnt__wait_ctx_t *w0) {
  tnt__wait_ctx_t w = *w0;
  w.sig = &sig;
  switch (sig.kind) {
    case TNT__COLL_ALLREDUCE:
      return algo->fn.allreduce(c, buf, buf, sig.count, (tnt_dtype_t)sig.dtype, (tnt_op_t)sig.op,
                                &w);
    case TNT__COLL_BARRIER: return tnt__barrier(c, &w);
    case TNT__COLL_REDUCE_SCATTER: {
      size_t bounds[MAX_RANKS + 1];
      tnt__slice_bounds(sig.count, tnt_dtype_size((tnt_dtype_t)sig.dtype), c->size, bounds);
      return algo->reduce_scatter(c, buf, bounds, (tnt_dtype_t)sig.dtype, (tnt_op_t)sig.op, &w);
    }
    default: {
      const tnt__algo_t *b = tnt__algo_find(TNT__COLL_BROADCAST, "shm");
      return b->fn.broadcast(c, buf, sig.count * tnt_dtype_size((tnt_dtype_t)sig.dtype), sig.root,
                             &w);
    }
  }
}

static int mismatch_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  mismatch_case_t *mc = rc->shared;
  const tnt__algo_t *algo = tnt__algo_find(TNT__COLL_ALLREDUCE, mc->algo);
  double buf[2048] = {0};
  tnt__coll_sig_t sig = {.count = 1000, .kind = TNT__COLL_ALLREDUCE, .dtype = TNT_FLOAT32,
                         .op = TNT_SUM, .set = 1};
  if (mc->kind == MM_BROADCAST) sig = (tnt__coll_sig_t){.count = 1000, .kind = TNT__COLL_BROADCAST,
                                                        .dtype = TNT_FLOAT32, .set = 1};
  if (rc->rank == rc->size - 1) {
    switch (mc->kind) {
      case MM_COUNT: sig.count += 1; break;
      case MM_DTYPE: sig.dtype = TNT_FLOAT64; break;
      case MM_OP: sig.op = TNT_MAX; break;
      case MM_BARRIER: sig = (tnt__coll_sig_t){.kind = TNT__COLL_BARRIER, .set = 1}; break;
      case MM_SCATTER: sig.kind = TNT__COLL_REDUCE_SCATTER; break;
      default:
        sig = (tnt__coll_sig_t){.count = 1000, .kind = TNT__COLL_ALLREDUCE, .dtype = TNT_FLOAT32,
                                .op = TNT_SUM, .set = 1};
        break;
    }
  }
  /* Short: ranks that never hear from a failed peer time out. */
  tnt__wait_ctx_t w = tnt__wait_ctx(0.5, "mismatch test");
  tnt_status_t st = mismatch_call(c, algo, sig, buf, &w);
  if (st == TNT_ERR_MISMATCH) {
    atomic_fetch_add(&mc->mismatches, 1);
  } else {
    /* In the broadcast case the others all broadcast alike and read only
     * the root: their broadcast is whole. */
    FAIL_IF(mc->kind != MM_BROADCAST && st == TNT_OK, "a mismatched call (case %d, %s) succeeded",
            (int)mc->kind, mc->algo);
  }
  return 0;
}

/* On one host every rank that waits for the deviating rank reports the
 * mismatch: in the allreduce and barrier cases all of them; in the
 * broadcast case the deviating rank (the others complete a whole broadcast
 * from rank 0). The network algorithms see it when a message has the wrong
 * size: at least one rank reports it, and none returns a result. */
static void test_mismatch(void **state) {
  (void)state;
  int failed = 0;
  for (size_t l = 0; l < NLAYOUTS; l++) {
    const layout_t *lay = &kLayouts[l];
    if (lay->size < 2) continue;
    for (int k = 0; k < MM_KINDS; k++) {
      for (size_t a = 0; a < 3; a++) { /* shm, rd, ring */
        const int shm = a == 0;
        if (!shm && k != MM_COUNT && k != MM_DTYPE) continue; /* same sizes: unseen */
        if (shm && lay->hosts != NULL) continue;
        if (!shm && lay->hosts != NULL && l != NLAYOUTS - 1) continue; /* one multi-host case */
        mismatch_case_t mc = {.kind = (mismatch_kind_t)k, .algo = kAllreduceAlgos[a]};
        atomic_init(&mc.mismatches, 0);
        failed += run_layout(lay, mismatch_rank, &mc);
        const int want = shm && k != MM_BROADCAST ? lay->size : 1;
        if (atomic_load(&mc.mismatches) < want) {
          print_error("%s, case %d, %s: %d ranks reported the mismatch, expected %d\n", lay->name,
                      k, mc.algo, atomic_load(&mc.mismatches), want);
          failed++;
        }
      }
    }
  }
  if (failed > 0) fail_msg("%d failures", failed);
}

/* -------------------------------------------------------- communicators */

/* The communicator describes the layout: local ranks and sizes, hosts,
 * shared memory on a single host, a cross transport for like hosts. */
static int comm_shape_rank(rank_ctx_t *rc, tnt__comm_t *c) {
  int n = rc->size, me = rc->rank;
  int my_host = rc->hosts ? rc->hosts[me] : 0;
  int local_rank = 0, local_size = 0, hosts_seen[MAX_RANKS], nhosts = 0;
  for (int r = 0; r < n; r++) {
    int h = rc->hosts ? rc->hosts[r] : 0, seen = 0;
    for (int j = 0; j < nhosts; j++) seen |= hosts_seen[j] == h;
    if (!seen) hosts_seen[nhosts++] = h;
    if (h == my_host) {
      if (r < me) local_rank++;
      local_size++;
    }
  }
  FAIL_IF(c->num_hosts != nhosts, "num_hosts %d, want %d", c->num_hosts, nhosts);
  FAIL_IF(c->local_rank != local_rank || c->local_size != local_size,
          "local rank %d/%d, want %d/%d", c->local_rank, c->local_size, local_rank, local_size);
  FAIL_IF(c->node == NULL || c->node->size != local_size || c->node->num_hosts != 1,
          "node transport wrong");
  FAIL_IF(c->shm == NULL, "no shared memory on a host");
  FAIL_IF(c->shm_slot_bytes != 4096, "slot of %zu bytes with TNT_SHM_SLOT_KB=4", c->shm_slot_bytes);
  /* Hosts are alike when each has as many members as this one. */
  int like = 1;
  for (int j = 0; j < nhosts; j++) {
    int members = 0;
    for (int r = 0; r < n; r++) members += (rc->hosts ? rc->hosts[r] : 0) == hosts_seen[j];
    like &= members == local_size;
  }
  FAIL_IF((c->cross != NULL) != (nhosts > 1 && like), "cross transport %s",
          c->cross ? "present" : "missing");
  if (c->cross != NULL) {
    FAIL_IF(c->cross->size != nhosts || c->cross->num_hosts != nhosts, "cross transport shape");
  }
  return 0;
}

static void test_comm_shape(void **state) {
  (void)state;
  run_all_layouts(comm_shape_rank, NULL);
}

int main(void) {
  /* Small slots, so that vectors of a few thousand elements take several
   * segments; set before any thread reads the environment. */
  setenv("TNT_SHM_SLOT_KB", "4", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_comm_shape),
      cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_allreduce_ranks_agree),
      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_allgatherv),
      cmocka_unit_test(test_barrier),
      cmocka_unit_test(test_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
