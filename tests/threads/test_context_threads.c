/*
 * Whole contexts over ranks simulated as threads: each thread creates its
 * own context with tnt__context_create_with_transport over a threads
 * transport, then uses only the public API, as an application would:
 *  - blocking allreduce (every dtype and op, in place and not), broadcast,
 *    allgather(v) and barrier;
 *  - several non-blocking allreduces in flight at once, waited for in an
 *    order other than submission, and polled with tnt_request_test;
 *  - tensor fusion with thresholds 0, 64 and 1 MiB, over several rounds in
 *    which every rank starts and finishes its tensors in its own random
 *    order;
 *  - point-to-point messages matched by source and tag;
 *  - a sub-group and its collectives.
 * Inputs are small integers, so every expected result is exact. Each
 * context runs an engine thread next to the caller's, which makes this the
 * test that ThreadSanitizer checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "transport_threads.h"
#include "util/log.h"
#include "util/reduce.h"
#include "tnt/tnt.h"
#include "tnt_test_data.h"

#define MAX_RANKS 8

typedef struct rank_arg {
  int rank, size;
  tnt__threads_world_t *world;
  char error[512];
} rank_arg_t;

/* Ends the rank's test with a message (the peers then fail on their own
 * timeouts, or finish if they do not depend on this rank any more). */
#define FAIL_IF(cond, ...)                              \
  do {                                                  \
    if (cond) {                                         \
      snprintf(a->error, sizeof a->error, __VA_ARGS__); \
      return -1;                                        \
    }                                                   \
  } while (0)

#define TRY(call)                                                                        \
  do {                                                                                   \
    tnt_status_t st_ = (call);                                                           \
    FAIL_IF(st_ != TNT_OK, "%s: %s (line %d)", #call, tnt_status_string(st_), __LINE__); \
  } while (0)

/* -------------------------------------------------------------- values */

/* Element i of rank r (a generator of tnt_test_data.h; `arg` is the salt):
 * a small integer (-15 to 15; 0 to 30 for uint8), so that every expected
 * result is exact in every dtype. */
static double value(const void *arg, tnt_dtype_t dt, int r, size_t i) {
  int salt = *(const int *)arg;
  return td_centred(
      dt, (double)((int64_t)((i * 37u + (size_t)r * 11u + (size_t)salt * 5u) % 31u) - 15), 15);
}

static void fill(void *buf, size_t count, tnt_dtype_t dt, int r, int salt) {
  td_fill(dt, buf, count, value, &salt, r);
}

/* The exact reduction over ranks 0..n-1 (or the listed ranks). */
static void expect(void *buf, size_t count, tnt_dtype_t dt, tnt_op_t op, const int *ranks, int n,
                   int salt) {
  td_expected_reduce(dt, op, buf, count, value, &salt, ranks, n);
}

/* ---------------------------------------------------------- collectives */

static int blocking_collectives(rank_arg_t *a, tnt_group_t *g) {
  const int n = tnt_group_size(g), me = tnt_group_rank(g);
  static const size_t kCounts[] = {0, 1, 17, 3001};
  uint8_t *in = malloc(3001 * 8), *out = malloc(3001 * 8), *want = malloc(3001 * 8);
  FAIL_IF(!in || !out || !want, "out of memory");
  for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
    size_t esz = tnt_dtype_size((tnt_dtype_t)dt);
    for (int op = 0; op < TNT_OP_COUNT; op++) {
      for (size_t k = 0; k < sizeof kCounts / sizeof kCounts[0]; k++) {
        size_t count = kCounts[k];
        int salt = dt * 7 + op;
        fill(in, count, (tnt_dtype_t)dt, me, salt);
        expect(want, count, (tnt_dtype_t)dt, (tnt_op_t)op, NULL, n, salt);
        TRY(tnt_allreduce(g, in, out, count, (tnt_dtype_t)dt, (tnt_op_t)op));
        FAIL_IF(memcmp(out, want, count * esz) != 0, "allreduce %s %s count %zu is wrong",
                tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), count);
        /* In place. */
        TRY(tnt_allreduce(g, in, in, count, (tnt_dtype_t)dt, (tnt_op_t)op));
        FAIL_IF(memcmp(in, want, count * esz) != 0, "in-place allreduce %s %s count %zu",
                tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), count);
      }
    }
  }
  /* Broadcast from every root. */
  for (int root = 0; root < n; root++) {
    int32_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = me == root ? root * 1000 + i : -1;
    TRY(tnt_broadcast(g, buf, 1000, TNT_INT32, root));
    for (int i = 0; i < 1000; i++) FAIL_IF(buf[i] != root * 1000 + i, "broadcast from %d", root);
  }
  /* Allgather and allgatherv with uneven counts. */
  int64_t mine[40], all[MAX_RANKS * 40];
  for (int i = 0; i < 40; i++) mine[i] = me * 100 + i;
  TRY(tnt_allgather(g, mine, 40, all, TNT_INT64));
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < 40; i++) FAIL_IF(all[r * 40 + i] != r * 100 + i, "allgather");
  }
  size_t counts[MAX_RANKS], displs[MAX_RANKS], off = 0;
  for (int r = n - 1; r >= 0; r--) {
    counts[r] = (size_t)((r * 13) % 40);
    displs[r] = off;
    off += counts[r];
  }
  memset(all, 0, sizeof all);
  TRY(tnt_allgatherv(g, mine, counts[me], all, counts, displs, TNT_INT64));
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < counts[r]; i++) {
      FAIL_IF(all[displs[r] + i] != r * 100 + (int64_t)i, "allgatherv block of rank %d", r);
    }
  }
  TRY(tnt_barrier(g));
  free(in);
  free(out);
  free(want);
  return 0;
}

/* Several allreduces in flight, completed out of order. */
static int nonblocking_collectives(rank_arg_t *a, tnt_group_t *g) {
  enum { NREQ = 8, COUNT = 2500 };
  const int n = tnt_group_size(g), me = tnt_group_rank(g);
  float *in = malloc(NREQ * COUNT * sizeof(float)), *out = malloc(NREQ * COUNT * sizeof(float));
  float *want = malloc(COUNT * sizeof(float));
  FAIL_IF(!in || !out || !want, "out of memory");
  for (int round = 0; round < 3; round++) {
    tnt_request_t *req[NREQ];
    for (int k = 0; k < NREQ; k++) {
      fill(in + k * COUNT, COUNT, TNT_FLOAT32, me, k + round);
      tnt_op_t op = (tnt_op_t)(k % TNT_OP_COUNT);
      TRY(tnt_iallreduce(g, in + k * COUNT, out + k * COUNT, COUNT, TNT_FLOAT32, op, &req[k]));
    }
    /* Poll one, then wait for the rest from the last to the first. */
    tnt_status_t st;
    while ((st = tnt_request_test(req[0])) == TNT_IN_PROGRESS) tnt__spin_pause(100);
    FAIL_IF(st != TNT_OK, "request 0: %s", tnt_status_string(st));
    for (int k = NREQ - 1; k >= 0; k--) {
      TRY(tnt_request_wait(req[k], 20.0));
      FAIL_IF(tnt_request_test(req[k]) != TNT_OK, "test after wait");
      tnt_request_free(req[k]);
      expect(want, COUNT, TNT_FLOAT32, (tnt_op_t)(k % TNT_OP_COUNT), NULL, n, k + round);
      FAIL_IF(memcmp(out + k * COUNT, want, COUNT * sizeof(float)) != 0,
              "iallreduce %d of round %d is wrong", k, round);
    }
  }
  /* A request may be freed before it completes. */
  tnt_request_t *early = NULL;
  TRY(tnt_iallreduce(g, in, in, COUNT, TNT_FLOAT32, TNT_SUM, &early));
  tnt_request_free(early);
  TRY(tnt_barrier(g));
  tnt_request_t *b = NULL;
  TRY(tnt_ibarrier(g, &b));
  TRY(tnt_request_wait(b, -1));
  tnt_request_free(b);
  free(in);
  free(out);
  free(want);
  return 0;
}

/* ---------------------------------------------------------------- fusion */

static void shuffle(size_t *order, size_t n, unsigned *seed) {
  for (size_t i = 0; i < n; i++) order[i] = i;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)rand_r(seed) % i;
    size_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
}

static int fusion(rank_arg_t *a, tnt_group_t *g) {
  enum { NT = 24 };
  const int n = tnt_group_size(g), me = tnt_group_rank(g);
  static const size_t kThresholds[] = {0, 64, 1 << 20};
  static const tnt_dtype_t kDtypes[] = {TNT_FLOAT32, TNT_FLOAT16, TNT_INT32, TNT_FLOAT32};
  tnt_tensor_info_t info[NT];
  void *data[NT], *result[NT], *want[NT];
  for (size_t i = 0; i < NT; i++) {
    info[i].id = 1000 + i * 7;
    info[i].count = i == 5 ? 0 : (i * 53) % 300 + (i % 3 == 0 ? 1000 : 1);
    info[i].dtype = kDtypes[i % 4];
    size_t bytes = info[i].count * tnt_dtype_size(info[i].dtype) + 1;
    data[i] = malloc(bytes);
    result[i] = malloc(bytes);
    want[i] = malloc(bytes);
    FAIL_IF(!data[i] || !result[i] || !want[i], "out of memory");
  }
  unsigned seed = 12345u + (unsigned)me * 7919u;
  for (size_t th = 0; th < sizeof kThresholds / sizeof kThresholds[0]; th++) {
    for (int op = TNT_SUM; op <= TNT_MAX; op += 1) {
      tnt_fusion_t *f = NULL;
      TRY(tnt_fusion_create(
          g, info, NT,
          &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = kThresholds[th], .op = (tnt_op_t)op}, &f));
      size_t nb = tnt_fusion_num_buckets(f);
      if (kThresholds[th] == 0) FAIL_IF(nb != NT, "threshold 0 gives %zu buckets", nb);
      if (kThresholds[th] == (1 << 20)) FAIL_IF(nb != 3, "1 MiB threshold: %zu buckets", nb);
      for (size_t i = 0; i < NT; i++) {
        long b = tnt_fusion_bucket_of(f, info[i].id);
        FAIL_IF(b < 0 || (size_t)b >= nb, "bucket of tensor %zu", i);
      }
      FAIL_IF(tnt_fusion_bucket_of(f, 1) != -1, "unknown id has a bucket");
      for (int round = 0; round < 3; round++) {
        size_t order[NT];
        shuffle(order, NT, &seed);
        for (size_t k = 0; k < NT; k++) {
          size_t i = order[k];
          fill(data[i], info[i].count, info[i].dtype, me, (int)i + round);
          TRY(tnt_fusion_start(f, info[i].id, data[i]));
          /* The caller's buffer is free as soon as start returns. */
          memset(data[i], 0x7f, info[i].count * tnt_dtype_size(info[i].dtype));
        }
        shuffle(order, NT, &seed);
        for (size_t k = 0; k < NT; k++) {
          size_t i = order[k];
          TRY(tnt_fusion_finish(f, info[i].id, result[i], -1));
          expect(want[i], info[i].count, info[i].dtype, (tnt_op_t)op, NULL, n, (int)i + round);
          FAIL_IF(memcmp(result[i], want[i], info[i].count * tnt_dtype_size(info[i].dtype)),
                  "fusion threshold %zu %s round %d: tensor %zu is wrong", kThresholds[th],
                  tnt_op_name((tnt_op_t)op), round, i);
        }
      }
      /* Finishing a tensor that was not started is out of order. */
      FAIL_IF(tnt_fusion_finish(f, info[0].id, result[0], 1.0) != TNT_ERR_STATE,
              "finish without start");
      TRY(tnt_fusion_destroy(f));
    }
  }
  for (size_t i = 0; i < NT; i++) {
    free(data[i]);
    free(result[i]);
    free(want[i]);
  }
  return 0;
}

/* ---------------------------------------------------------- point to point */

static int point_to_point(rank_arg_t *a, tnt_group_t *g) {
  const int n = tnt_group_size(g), me = tnt_group_rank(g);
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  /* Blocking ring: send first (eager sends complete at once here). */
  int32_t token = me * 10, got = -1;
  TRY(tnt_send(g, &token, 1, TNT_INT32, right, 7));
  TRY(tnt_recv(g, &got, 1, TNT_INT32, left, 7));
  FAIL_IF(got != left * 10, "ring token %d from %d", got, left);
  /* Non-blocking: several messages on two tags, received tag by tag in
   * reverse, each tag in order. */
  enum { M = 5 };
  int64_t sv[2][M], rv[2][M];
  tnt_request_t *sreq[2][M], *rreq[2][M];
  for (int tag = 0; tag < 2; tag++) {
    for (int k = 0; k < M; k++) {
      sv[tag][k] = me * 1000 + tag * 100 + k;
      TRY(tnt_isend(g, &sv[tag][k], 1, TNT_INT64, right, 100 + tag, &sreq[tag][k]));
    }
  }
  for (int tag = 1; tag >= 0; tag--) {
    for (int k = 0; k < M; k++) {
      TRY(tnt_irecv(g, &rv[tag][k], 1, TNT_INT64, left, 100 + tag, &rreq[tag][k]));
    }
  }
  for (int tag = 0; tag < 2; tag++) {
    for (int k = M - 1; k >= 0; k--) {
      TRY(tnt_request_wait(rreq[tag][k], -1));
      TRY(tnt_request_wait(sreq[tag][k], -1));
      tnt_request_free(rreq[tag][k]);
      tnt_request_free(sreq[tag][k]);
      FAIL_IF(rv[tag][k] != left * 1000 + tag * 100 + k, "p2p tag %d message %d", tag, k);
    }
  }
  /* A receive posted long before its message, with collectives in between:
   * the collectives must not wait for it. */
  double big[500], expect_big = (double)left;
  for (int i = 0; i < 500; i++) big[i] = 0;
  tnt_request_t *late = NULL;
  TRY(tnt_irecv(g, big, 500, TNT_FLOAT64, left, 9, &late));
  int32_t x = 1, sum = 0;
  TRY(tnt_allreduce(g, &x, &sum, 1, TNT_INT32, TNT_SUM));
  FAIL_IF(sum != n, "allreduce between p2p");
  double mine[500];
  for (int i = 0; i < 500; i++) mine[i] = (double)me;
  TRY(tnt_send(g, mine, 500, TNT_FLOAT64, right, 9));
  TRY(tnt_request_wait(late, -1));
  tnt_request_free(late);
  FAIL_IF(big[0] != expect_big || big[499] != expect_big, "late receive");
  /* Invalid tags and peers are refused without effect. */
  FAIL_IF(tnt_send(g, &x, 1, TNT_INT32, right, 32768) != TNT_ERR_INVALID_ARG, "tag 32768");
  FAIL_IF(tnt_send(g, &x, 1, TNT_INT32, n, 0) != TNT_ERR_INVALID_ARG, "peer n");
  return 0;
}

/* ------------------------------------------------------------- sub-group */

static int sub_group(rank_arg_t *a, tnt_context_t *ctx) {
  const int n = a->size, me = a->rank;
  if (n < 2) return 0;
  /* The odd ranks and the even ranks, each listed in reverse order. */
  int list[MAX_RANKS], m = 0;
  for (int r = n - 1; r >= 0; r--) {
    if (r % 2 == me % 2) list[m++] = r;
  }
  tnt_group_t *sub = NULL;
  TRY(tnt_group_create(ctx, list, m, &sub));
  FAIL_IF(tnt_group_size(sub) != m, "sub-group size");
  FAIL_IF(list[tnt_group_rank(sub)] != me, "sub-group rank");
  int64_t in[100], out[100], want[100];
  fill(in, 100, TNT_INT64, me, 3);
  expect(want, 100, TNT_INT64, TNT_SUM, list, m, 3);
  TRY(tnt_allreduce(sub, in, out, 100, TNT_INT64, TNT_SUM));
  FAIL_IF(memcmp(out, want, sizeof out) != 0, "sub-group allreduce");
  TRY(tnt_barrier(sub));
  TRY(tnt_group_destroy(sub));
  return 0;
}

/* ------------------------------------------------------ the error contract */

/* tnt_last_error is "" after a success and names the failing call after a
 * failure, never an earlier failure of another call. */
#define EXPECT_ERROR(call, want_st, fragment)                                                 \
  do {                                                                                        \
    tnt_status_t st_ = (call);                                                                \
    const char *why_ = tnt_last_error();                                                      \
    FAIL_IF(st_ != (want_st), "%s: expected %s, got %s", #call, tnt_status_string(want_st),   \
            tnt_status_string(st_));                                                          \
    FAIL_IF(strstr(why_, (fragment)) == NULL, "%s: tnt_last_error() is \"%s\", not about %s", \
            #call, why_, (fragment));                                                         \
  } while (0)

static int error_contract(rank_arg_t *a, tnt_context_t *ctx, tnt_group_t *g) {
  const int n = a->size;
  int32_t x = 1;
  /* Each failure explains itself, also after an unrelated one. */
  EXPECT_ERROR(tnt_group_create(ctx, NULL, 1, NULL), TNT_ERR_INVALID_ARG, "tnt_group_create");
  EXPECT_ERROR(tnt_send(g, &x, 1, TNT_INT32, 0, 32768), TNT_ERR_INVALID_ARG, "tag 32768");
  FAIL_IF(strstr(tnt_last_error(), "tnt_group_create") != NULL, "stale message: %s",
          tnt_last_error());
  EXPECT_ERROR(tnt_broadcast(g, &x, 1, TNT_INT32, n), TNT_ERR_INVALID_ARG, "root=");
  EXPECT_ERROR(tnt_fusion_start(NULL, 1, &x), TNT_ERR_INVALID_ARG, "tnt_fusion_start");
  EXPECT_ERROR(tnt_fusion_finish(NULL, 1, &x, -1), TNT_ERR_INVALID_ARG, "tnt_fusion_finish");
  EXPECT_ERROR(tnt_request_wait(NULL, -1), TNT_ERR_INVALID_ARG, "tnt_request_wait");
  EXPECT_ERROR(tnt_timeline_event(NULL, NULL, 'i'), TNT_ERR_INVALID_ARG, "tnt_timeline_event");
  EXPECT_ERROR(tnt_algorithm_info("reduce", 0, NULL, NULL), TNT_ERR_INVALID_ARG, "reduce");
  EXPECT_ERROR(tnt_iallreduce(g, &x, &x, 1, TNT_INT32, TNT_SUM, NULL), TNT_ERR_INVALID_ARG,
               "req is NULL");
  /* A success clears the message; queries leave it. */
  TRY(tnt_barrier(g));
  FAIL_IF(tnt_last_error()[0] != '\0', "after a success: \"%s\"", tnt_last_error());
  EXPECT_ERROR(tnt_allreduce(g, &x, &x, 1, TNT_DTYPE_COUNT, TNT_SUM), TNT_ERR_INVALID_ARG, "dtype");
  (void)tnt_group_size(g);
  (void)tnt_status_string(TNT_ERR_TIMEOUT);
  FAIL_IF(strstr(tnt_last_error(), "dtype") == NULL, "a query changed the message: \"%s\"",
          tnt_last_error());
  /* Fusion errors that used to log nothing. */
  tnt_tensor_info_t info = {7, 4, TNT_FLOAT32};
  tnt_fusion_t *f = NULL;
  TRY(tnt_fusion_create(g, &info, 1, &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_SUM},
                        &f));
  float buf[4] = {0};
  EXPECT_ERROR(tnt_fusion_start(f, 7, NULL), TNT_ERR_INVALID_ARG, "data is NULL");
  EXPECT_ERROR(tnt_fusion_start(f, 8, buf), TNT_ERR_INVALID_ARG, "tensor id 8");
  EXPECT_ERROR(tnt_fusion_finish(f, 7, buf, -1), TNT_ERR_STATE, "was not started");
  tnt_tensor_info_t got;
  FAIL_IF(!tnt_fusion_tensor(f, 7, &got) || got.count != 4 || got.dtype != TNT_FLOAT32,
          "tnt_fusion_tensor of tensor 7");
  FAIL_IF(tnt_fusion_tensor(f, 8, NULL), "tnt_fusion_tensor of an unknown id");
  TRY(tnt_fusion_destroy(f));
  /* Ranks that disagree on a fusion set get TNT_ERR_MISMATCH, each. */
  if (n > 1) {
    info.count = 4 + (size_t)a->rank;
    EXPECT_ERROR(tnt_fusion_create(
                     g, &info, 1, &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 0, .op = TNT_SUM}, &f),
                 TNT_ERR_MISMATCH, "disagree");
  }
  /* Every algorithm has a name and a description. */
  const char *name = NULL, *description = NULL;
  TRY(tnt_algorithm_info("allreduce", 0, &name, &description));
  FAIL_IF(name == NULL || description == NULL || description[0] == '\0', "algorithm 0");
  EXPECT_ERROR(tnt_algorithm_info("broadcast", 99, &name, NULL), TNT_ERR_INVALID_ARG, "99");
  const char *msg = NULL;
  FAIL_IF(tnt_context_error(ctx, &msg) != TNT_OK, "argument errors failed the context: %s", msg);
  return 0;
}

/* ------------------------------------------------------------------ ranks */

static int rank_body(rank_arg_t *a) {
  tnt__transport_t *t = NULL;
  tnt_context_t *ctx = NULL;
  tnt_config_t config = {.timeout_s = 20.0};
  TRY(tnt__threads_transport_create(a->world, a->rank, &t));
  TRY(tnt__context_create_with_transport(t, &config, &ctx));
  tnt_group_t *g = tnt_context_world(ctx);
  FAIL_IF(tnt_group_rank(g) != a->rank || tnt_group_size(g) != a->size, "world rank/size");
  FAIL_IF(tnt_context_timeout(ctx) != 20.0, "timeout");
  const char *msg = NULL;
  int rc = blocking_collectives(a, g);
  if (rc == 0) rc = nonblocking_collectives(a, g);
  if (rc == 0) rc = fusion(a, g);
  if (rc == 0) rc = point_to_point(a, g);
  if (rc == 0) rc = sub_group(a, ctx);
  if (rc == 0) rc = error_contract(a, ctx, g);
  if (rc == 0) {
    FAIL_IF(tnt_context_error(ctx, &msg) != TNT_OK, "context failed: %s", msg);
    TRY(tnt_barrier(g));
  }
  tnt_status_t st = tnt_context_destroy(ctx);
  if (rc == 0) FAIL_IF(st != TNT_OK, "destroy: %s", tnt_status_string(st));
  return rc;
}

static void *rank_main(void *p) {
  rank_arg_t *a = p;
  tnt__log_set_rank(a->rank, a->size, 1);
  rank_body(a);
  return NULL;
}

static void run_world(int size, const int *hosts) {
  tnt__threads_world_t *world = NULL;
  assert_int_equal(tnt__threads_world_create(size, hosts, &world), TNT_OK);
  pthread_t th[MAX_RANKS];
  rank_arg_t args[MAX_RANKS];
  for (int r = 0; r < size; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].rank = r;
    args[r].size = size;
    args[r].world = world;
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
  }
  for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
  tnt__threads_world_destroy(world);
  int failed = 0;
  for (int r = 0; r < size; r++) {
    if (args[r].error[0] != '\0') {
      print_error("%d ranks, rank %d: %s\n", size, r, args[r].error);
      failed++;
    }
  }
  if (failed > 0) fail_msg("%d of %d ranks failed", failed, size);
}

static void test_one_rank(void **state) {
  (void)state;
  run_world(1, NULL);
}

static void test_four_ranks_one_host(void **state) {
  (void)state;
  run_world(4, NULL);
}

static void test_three_ranks(void **state) {
  (void)state;
  run_world(3, NULL);
}

static void test_two_hosts(void **state) {
  (void)state;
  static const int hosts[4] = {0, 0, 1, 1};
  run_world(4, hosts);
}

int main(void) {
  /* Small shared-memory slots, so that messages take several segments. */
  setenv("TNT_SHM_SLOT_KB", "4", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_rank),
      cmocka_unit_test(test_four_ranks_one_host),
      cmocka_unit_test(test_three_ranks),
      cmocka_unit_test(test_two_hosts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
