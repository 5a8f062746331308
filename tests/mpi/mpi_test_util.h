/*
 * Shared helpers for the MPI-launched tests of libtnt: failure reporting
 * that names rank, case, index, expected and got; a watchdog so that no
 * test hangs; element access for every dtype (libtnt's util/values.h, as
 * tnt_test_data.h uses it); deterministic data generators; hashing for
 * cross-rank bitwise comparisons; and a few MPI helpers.
 *
 * Every function is static inline so that each program uses what it needs
 * without unused-function warnings.
 */
#ifndef TNT_TESTS_MPI_TEST_UTIL_H
#define TNT_TESTS_MPI_TEST_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tnt/tnt.h"
#include "tnt_test_data.h"

/* Failures printed per rank before the rest are only counted. */
#define MT_MAX_PRINTED_FAILURES 25
/* Default watchdog in seconds (MT_WATCHDOG_S in the environment overrides). */
#define MT_DEFAULT_WATCHDOG_S 90

/* ------------------------------------------------------------ state */

typedef struct mt_state {
  const char *prog;
  int rank;
  int size;
  long failures;
  tnt_context_t *ctx;
  char case_name[160];
} mt_state_t;

static inline mt_state_t *mt_state(void) {
  static mt_state_t state = {"test", -1, 0, 0, NULL, "startup"};
  return &state;
}

/* Names the case that the following checks belong to (printf format). */
__attribute__((format(printf, 1, 2))) static inline void mt_set_case(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(mt_state()->case_name, sizeof mt_state()->case_name, fmt, ap);
  va_end(ap);
}

static inline const char *mt_case(void) {
  return mt_state()->case_name;
}

static inline double mt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void mt_sleep(double seconds) {
  struct timespec ts;
  ts.tv_sec = (time_t)seconds;
  ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ------------------------------------------------------------ reporting */

/* Records a failure of the current case at element `index` (-1: none). The
 * message should say what was expected and what was got. */
__attribute__((format(printf, 2, 3))) static inline void mt_fail(long index, const char *fmt, ...) {
  mt_state_t *s = mt_state();
  s->failures++;
  if (s->failures > MT_MAX_PRINTED_FAILURES) {
    if (s->failures == MT_MAX_PRINTED_FAILURES + 1) {
      fprintf(stderr, "[%s] rank %d: further failures are counted but not printed\n", s->prog,
              s->rank);
    }
    return;
  }
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (index >= 0) {
    fprintf(stderr, "[%s] FAIL rank %d: case '%s', index %ld: %s\n", s->prog, s->rank, s->case_name,
            index, msg);
  } else {
    fprintf(stderr, "[%s] FAIL rank %d: case '%s': %s\n", s->prog, s->rank, s->case_name, msg);
  }
  fflush(stderr);
}

/* Ends the whole job at once: for failures after which ranks could no
 * longer agree on the sequence of collectives (and would otherwise hang). */
__attribute__((format(printf, 1, 2), noreturn)) static inline void mt_fatal(const char *fmt, ...) {
  mt_state_t *s = mt_state();
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *why = NULL;
  tnt_status_t cst = s->ctx != NULL ? tnt_context_error(s->ctx, &why) : TNT_OK;
  fprintf(stderr, "[%s] FATAL rank %d: case '%s': %s (context: %s%s%s)\n", s->prog, s->rank,
          s->case_name, msg, tnt_status_string(cst), why != NULL ? ", " : "",
          why != NULL ? why : "");
  fflush(stderr);
  fflush(stdout);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

static inline const char *mt_st(tnt_status_t st) {
  return tnt_status_string(st);
}

/* A libtnt call that must succeed; anything else ends the job. */
#define MT_OK(expr)                                                                      \
  do {                                                                                   \
    tnt_status_t mt_st_ = (expr);                                                        \
    if (mt_st_ != TNT_OK) mt_fatal("%s: expected TNT_OK, got %s", #expr, mt_st(mt_st_)); \
  } while (0)

/* A libtnt call that must return `want` (e.g. TNT_ERR_INVALID_ARG). */
#define MT_EXPECT_ST(expr, want)                                                 \
  do {                                                                           \
    tnt_status_t mt_st_ = (expr);                                                \
    if (mt_st_ != (want))                                                        \
      mt_fail(-1, "%s: expected %s, got %s", #expr, mt_st(want), mt_st(mt_st_)); \
  } while (0)

/* A plain condition. */
#define MT_CHECK(cond, ...)                \
  do {                                     \
    if (!(cond)) mt_fail(-1, __VA_ARGS__); \
  } while (0)

/* ------------------------------------------------------------ watchdog */

static inline void mt_watchdog_handler(int sig) {
  (void)sig;
  mt_state_t *s = mt_state();
  char msg[400];
  int n =
      snprintf(msg, sizeof msg, "[%s] FATAL rank %d: watchdog expired in case '%s' (a call hung)\n",
               s->prog, s->rank, s->case_name);
  if (n > 0) {
    ssize_t w = write(STDERR_FILENO, msg, (size_t)n);
    (void)w;
  }
  _exit(2);
}

/* Arms the watchdog: the process ends with a message naming the current
 * case if it is still running after `seconds`. */
static inline void mt_watchdog(unsigned seconds) {
  const char *env = getenv("MT_WATCHDOG_S");
  if (env != NULL && atoi(env) > 0) seconds = (unsigned)atoi(env);
  signal(SIGALRM, mt_watchdog_handler);
  alarm(seconds);
}

/* ------------------------------------------------------------ setup */

/* Initializes MPI (when `init_mpi`; otherwise libtnt is expected to do it)
 * and the test state. Call before anything else. */
static inline void mt_init(const char *prog, int *argc, char ***argv, int init_mpi) {
  mt_state_t *s = mt_state();
  s->prog = prog;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (init_mpi) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      fprintf(stderr, "[%s] FATAL: MPI_Init_thread failed\n", prog);
      exit(1);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      fprintf(stderr, "[%s] FATAL: MPI gives thread level %d, libtnt needs MULTIPLE\n", prog,
              provided);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s->size);
  }
  mt_watchdog(MT_DEFAULT_WATCHDOG_S);
}

/* Creates the context (and reads rank/size from MPI when libtnt initialized
 * it). */
static inline tnt_context_t *mt_context(const tnt_config_t *config) {
  mt_state_t *s = mt_state();
  mt_set_case("tnt_context_create");
  tnt_context_t *ctx = NULL;
  tnt_status_t st = tnt_context_create(config, &ctx);
  if (st != TNT_OK || ctx == NULL) {
    fprintf(stderr, "[%s] FATAL: tnt_context_create: %s\n", s->prog, mt_st(st));
    exit(1);
  }
  s->ctx = ctx;
  MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s->size);
  return ctx;
}

/* Sums the failures of every rank (MPI must still be usable); rank 0 prints
 * the verdict. Returns the process exit status. */
static inline int mt_verdict(void) {
  mt_state_t *s = mt_state();
  long total = 0;
  MPI_Allreduce(&s->failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (s->rank == 0) {
    if (total == 0) {
      printf("[%s] PASS on %d rank(s)\n", s->prog, s->size);
    } else {
      printf("[%s] FAILED: %ld failure(s) on %d rank(s)\n", s->prog, total, s->size);
    }
  }
  return total == 0 ? 0 : 1;
}

/* ------------------------------------------------------------ dtypes */

/* Element access is libtnt's (util/values.h) and the shared test data of
 * tests/common; these names keep the MPI programs' mt_ vocabulary. */
static inline size_t mt_dsize(tnt_dtype_t dt) {
  return td_dsize(dt);
}

static inline void mt_store(tnt_dtype_t dt, void *buf, size_t i, double v) {
  tnt__store_value(dt, buf, i, v);
}

static inline double mt_load(tnt_dtype_t dt, const void *buf, size_t i) {
  return tnt__load_value(dt, buf, i);
}

/* The raw bits of element `i`, for messages. */
static inline uint64_t mt_bits(tnt_dtype_t dt, const void *buf, size_t i) {
  uint64_t b = 0;
  size_t es = mt_dsize(dt);
  memcpy(&b, (const uint8_t *)buf + i * es, es);
  return b;
}

static inline int mt_is_int(tnt_dtype_t dt) {
  return dt == TNT_INT32 || dt == TNT_INT64 || dt == TNT_INT8 || dt == TNT_INT16 ||
         dt == TNT_UINT8;
}

static inline const char *mt_dname(tnt_dtype_t dt) {
  static const char *names[TNT_DTYPE_COUNT] = {"float32", "float64", "float16",
                                               "bfloat16", "int32",   "int64",
                                               "int8",    "int16",   "uint8"};
  return (int)dt >= 0 && dt < TNT_DTYPE_COUNT ? names[dt] : "invalid";
}

static inline const char *mt_oname(tnt_op_t op) {
  static const char *names[TNT_OP_COUNT] = {"sum", "average", "min", "max"};
  return (int)op >= 0 && op < TNT_OP_COUNT ? names[op] : "invalid";
}

/* Fills `count` elements with a byte pattern that no generator produces. */
static inline void mt_fill_sentinel(void *buf, size_t count, tnt_dtype_t dt) {
  memset(buf, 0xa5, count * mt_dsize(dt));
}

/*
 * Compares `count` elements bitwise. On a difference it reports the first
 * differing index with expected and got (value and bits) and how many
 * elements differ. Returns 1 when equal.
 */
static inline int mt_compare(tnt_dtype_t dt, const void *got, const void *want, size_t count,
                             const char *what) {
  size_t first;
  size_t ndiff = td_count_diff(dt, got, want, count, &first);
  if (ndiff == 0) return 1;
  mt_fail((long)first,
          "%s (%s, %zu elements): expected %.17g (bits 0x%" PRIx64 "), got %.17g (bits 0x%" PRIx64
          "); %zu element(s) differ",
          what, mt_dname(dt), count, mt_load(dt, want, first), mt_bits(dt, want, first),
          mt_load(dt, got, first), mt_bits(dt, got, first), ndiff);
  return 0;
}

/* ------------------------------------------------------------ data */

static inline uint64_t mt_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/*
 * The integer-valued element `i` that rank `r` contributes under `seed`.
 * Ranges keep every sum over up to 8 ranks exact in the dtype: |v| <= 30
 * for float16 and bfloat16 (sums <= 240 < 256), about one million for
 * float32, float64 and int32, and int64 adds multiples of 2^36 so that the
 * upper word matters; |v| <= 15 for int8 (sums <= 120 < 128), |v| <= 4000
 * for int16 (<= 32000 < 32768) and 0 <= v <= 31 for uint8 (<= 248 < 256).
 */
static inline double mt_value(uint64_t seed, int r, size_t i, tnt_dtype_t dt) {
  uint64_t h = (uint64_t)i * 0x9e3779b1u + (uint64_t)(r + 1) * 0x85ebca77u + seed * 0xc2b2ae3du;
  h ^= h >> 15;
  h *= 0x2c1b3c6dull;
  h ^= h >> 12;
  switch (dt) {
    case TNT_FLOAT16:
    case TNT_BFLOAT16:
      return (double)(int64_t)(h % 61) - 30.0;
    case TNT_INT64:
      return (double)((int64_t)(h % 2000001) - 1000000) +
             (double)((int64_t)((h >> 32) % 7) - 3) * 68719476736.0;
    case TNT_INT8:
      return (double)(int64_t)(h % 31) - 15.0;
    case TNT_INT16:
      return (double)(int64_t)(h % 8001) - 4000.0;
    case TNT_UINT8:
      return (double)(h % 32);
    default:
      return (double)((int64_t)(h % 2000001) - 1000000);
  }
}

/* mt_value as a generator of the shared test data; `arg` is the seed. */
static inline double mt_value_of_seed(const void *arg, tnt_dtype_t dt, int r, size_t i) {
  return mt_value(*(const uint64_t *)arg, r, i, dt);
}

/* Fills buf[0..count-1] with rank r's contribution. */
static inline void mt_fill(void *buf, size_t count, tnt_dtype_t dt, uint64_t seed, int r) {
  td_fill(dt, buf, count, mt_value_of_seed, &seed, r);
}

/*
 * The exact result of reducing mt_value over the `n` contributors
 * ranks[0..n-1] (NULL: 0..n-1) with `op`, stored into want[0..count-1]
 * (AVERAGE rounds as td_store_average says).
 */
static inline void mt_expected_reduce(void *want, size_t count, tnt_dtype_t dt, tnt_op_t op,
                                      uint64_t seed, const int *ranks, int n) {
  td_expected_reduce(dt, op, want, count, mt_value_of_seed, &seed, ranks, n);
}

/* A small seeded generator (splitmix64). */
typedef struct mt_rng {
  uint64_t s;
} mt_rng_t;

static inline mt_rng_t mt_rng(uint64_t a, uint64_t b, uint64_t c) {
  mt_rng_t g = {mt_mix64(mt_mix64(mt_mix64(a) ^ b) ^ c)};
  return g;
}

static inline uint64_t mt_next(mt_rng_t *g) {
  g->s += 0x9e3779b97f4a7c15ull;
  return mt_mix64(g->s);
}

/* Uniform in [-1, 1). */
static inline double mt_uniform(mt_rng_t *g) {
  return (double)(mt_next(g) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* perm[0..n-1] = a uniformly random permutation of 0..n-1. */
static inline void mt_shuffle(size_t *perm, size_t n, mt_rng_t *g) {
  for (size_t i = 0; i < n; i++) perm[i] = i;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(mt_next(g) % i);
    size_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
}

/* ------------------------------------------------------------ hashing */

static inline uint64_t mt_hash(const void *buf, size_t bytes, uint64_t h) {
  const uint8_t *p = buf;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = mt_mix64(h ^ w);
  }
  uint64_t w = 0;
  if (i < bytes) {
    memcpy(&w, p + i, bytes - i);
    h = mt_mix64(h ^ w ^ 0xff);
  }
  return mt_mix64(h ^ bytes);
}

/*
 * A log of result hashes, one per case, to prove that every rank of a
 * communicator got bitwise identical results: record on every rank in the
 * same order, then compare once with mt_hashlog_compare.
 */
typedef struct mt_hashlog {
  size_t n, cap;
  uint64_t *hash;
  char (*name)[96];
} mt_hashlog_t;

static inline void mt_hashlog_add(mt_hashlog_t *log, const void *buf, size_t bytes) {
  if (log->n == log->cap) {
    log->cap = log->cap ? 2 * log->cap : 256;
    log->hash = realloc(log->hash, log->cap * sizeof *log->hash);
    log->name = realloc(log->name, log->cap * sizeof *log->name);
    if (log->hash == NULL || log->name == NULL) mt_fatal("out of memory in the hash log");
  }
  log->hash[log->n] = mt_hash(buf, bytes, 0);
  /* Case names are truncated to the log's width on purpose. */
  const char *name = mt_case();
  size_t len = strnlen(name, sizeof log->name[0] - 1);
  memcpy(log->name[log->n], name, len);
  log->name[log->n][len] = '\0';
  log->n++;
}

/* Collective over `comm`: every rank must have logged the same cases with
 * the same hashes. Reports the first case that differs from rank 0's, and
 * empties the log. */
static inline void mt_hashlog_compare(mt_hashlog_t *log, MPI_Comm comm, const char *section) {
  int crank, csize;
  MPI_Comm_rank(comm, &crank);
  MPI_Comm_size(comm, &csize);
  unsigned long long n = log->n, nmin = 0, nmax = 0;
  MPI_Allreduce(&n, &nmin, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  MPI_Allreduce(&n, &nmax, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  mt_set_case("%s: cross-rank hash comparison", section);
  if (nmin != nmax) {
    mt_fail(-1, "ranks logged different numbers of results: expected %llu, got %llu..%llu", nmax,
            nmin, nmax);
    log->n = 0;
    return;
  }
  uint64_t *root = malloc((n ? n : 1) * sizeof *root);
  if (root == NULL) mt_fatal("out of memory");
  if (n > 0) memcpy(root, log->hash, n * sizeof *root);
  MPI_Bcast(root, (int)n, MPI_UINT64_T, 0, comm);
  for (size_t i = 0; i < n; i++) {
    if (root[i] != log->hash[i]) {
      mt_fail((long)i,
              "results of case '%s' differ between ranks: expected hash 0x%" PRIx64
              " (rank 0), got 0x%" PRIx64,
              log->name[i], root[i], log->hash[i]);
      break;
    }
  }
  free(root);
  log->n = 0;
}

static inline void mt_hashlog_free(mt_hashlog_t *log) {
  free(log->hash);
  free(log->name);
  memset(log, 0, sizeof *log);
}

/* ------------------------------------------------------------ requests */

/* Polls `req` with tnt_request_test until done (at most `limit_s`). Returns
 * the final status; a request that never finishes ends the job. */
static inline tnt_status_t mt_test_loop(tnt_request_t *req, double limit_s) {
  double t0 = mt_now();
  unsigned polls = 0;
  for (;;) {
    tnt_status_t st = tnt_request_test(req);
    if (st != TNT_IN_PROGRESS) return st;
    if (++polls % 64 == 0 && mt_now() - t0 > limit_s) {
      mt_fatal("tnt_request_test still says TNT_IN_PROGRESS after %.1f s", limit_s);
    }
    sched_yield();
  }
}

/* Elementwise max over `comm` of a double (timing checks). */
static inline double mt_max_over(double v, MPI_Comm comm) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm);
  return out;
}

static inline double mt_min_over(double v, MPI_Comm comm) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MIN, comm);
  return out;
}

static inline void *mt_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (p == NULL) mt_fatal("out of memory (%zu bytes)", bytes);
  return p;
}

#endif
