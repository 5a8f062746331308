/*
 * Tagged point-to-point messages of libtnt over MPI, at any number of
 * ranks: a ring with blocking calls (and with non-blocking ones, which
 * also covers messages to self on one rank), pairwise exchanges in both
 * directions at once up to 8 MiB, every rank exchanging with every rank,
 * tags received in another order than sent, several messages on one tag
 * received in sending order, point-to-point traffic in flight across
 * collectives, a group whose ranks differ from world ranks, and invalid
 * arguments. Here libtnt initializes MPI itself, so the test also checks
 * that tnt_context_destroy finalizes it.
 */
#include "mpi_test_util.h"

static int g_rank, g_size;

/* Counts of float32 elements for the size sweeps: up to 3 MiB. */
static const size_t kCounts[] = {0, 1, 1000, 65537, (size_t)3 << 18};
#define NCOUNTS (sizeof kCounts / sizeof kCounts[0])

static void wait_ok(tnt_request_t *req, int use_test, const char *what) {
  tnt_status_t st = use_test ? mt_test_loop(req, 60.0) : tnt_request_wait(req, -1);
  if (st != TNT_OK) mt_fatal("%s: expected TNT_OK, got %s", what, mt_st(st));
  tnt_request_free(req);
}

static int right(int r) {
  return (r + 1) % g_size;
}

static int left(int r) {
  return (r - 1 + g_size) % g_size;
}

/* Blocking ring: even ranks send first, odd ranks receive first, so the
 * ring cannot deadlock even when sends wait for their receiver. */
static void test_ring_blocking(tnt_group_t *w) {
  if (g_size < 2) return;
  float *sbuf = mt_alloc(kCounts[NCOUNTS - 1] * 4), *rbuf = mt_alloc(kCounts[NCOUNTS - 1] * 4);
  float *want = mt_alloc(kCounts[NCOUNTS - 1] * 4);
  for (size_t c = 0; c < NCOUNTS; c++) {
    size_t n = kCounts[c];
    mt_set_case("blocking ring float32 count=%zu", n);
    mt_fill(sbuf, n, TNT_FLOAT32, 100 + c, g_rank);
    mt_fill(want, n, TNT_FLOAT32, 100 + c, left(g_rank));
    mt_fill_sentinel(rbuf, n, TNT_FLOAT32);
    if (g_rank % 2 == 0) {
      MT_OK(tnt_send(w, sbuf, n, TNT_FLOAT32, right(g_rank), 5));
      MT_OK(tnt_recv(w, rbuf, n, TNT_FLOAT32, left(g_rank), 5));
    } else {
      MT_OK(tnt_recv(w, rbuf, n, TNT_FLOAT32, left(g_rank), 5));
      MT_OK(tnt_send(w, sbuf, n, TNT_FLOAT32, right(g_rank), 5));
    }
    mt_compare(TNT_FLOAT32, rbuf, want, n, "message from the left neighbour");
  }
  free(sbuf), free(rbuf), free(want);
}

/* Non-blocking ring in every dtype (on one rank, every message goes to
 * self). */
static void test_ring_nonblocking(tnt_group_t *w) {
  size_t max = kCounts[NCOUNTS - 1] * 8;
  void *sbuf = mt_alloc(max), *rbuf = mt_alloc(max), *want = mt_alloc(max);
  for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
    tnt_dtype_t dt = (tnt_dtype_t)d;
    for (size_t c = 0; c < NCOUNTS; c++) {
      size_t n = kCounts[c];
      for (int order = 0; order < 2; order++) {
        mt_set_case("nonblocking ring %s count=%zu %s", mt_dname(dt), n,
                    order ? "isend first, wait with test" : "irecv first, wait");
        uint64_t seed = 200 + (uint64_t)(d * 16 + (int)c * 2 + order);
        mt_fill(sbuf, n, dt, seed, g_rank);
        mt_fill(want, n, dt, seed, left(g_rank));
        mt_fill_sentinel(rbuf, n, dt);
        tnt_request_t *rs = NULL, *rr = NULL;
        if (order) {
          MT_OK(tnt_isend(w, sbuf, n, dt, right(g_rank), 6, &rs));
          MT_OK(tnt_irecv(w, rbuf, n, dt, left(g_rank), 6, &rr));
        } else {
          MT_OK(tnt_irecv(w, rbuf, n, dt, left(g_rank), 6, &rr));
          MT_OK(tnt_isend(w, sbuf, n, dt, right(g_rank), 6, &rs));
        }
        wait_ok(rr, order, "irecv");
        wait_ok(rs, !order, "isend");
        mt_compare(dt, rbuf, want, n, "message from the left neighbour");
      }
    }
  }
  free(sbuf), free(rbuf), free(want);
}

/* Partners 2k and 2k+1 exchange in both directions at once, in three
 * styles, up to 8 MiB. A rank without a partner sits it out. */
static void test_pairwise(tnt_group_t *w) {
  int partner = g_rank ^ 1;
  if (partner >= g_size) return;
  static const size_t counts[] = {1, 4096, (size_t)1 << 19, (size_t)2 << 20};
  size_t max = counts[3];
  float *sbuf = mt_alloc(max * 4), *rbuf = mt_alloc(max * 4), *want = mt_alloc(max * 4);
  for (int c = 0; c < 4; c++) {
    size_t n = counts[c];
    for (int style = 0; style < 3; style++) {
      static const char *const styles[] = {"isend + blocking recv", "irecv + blocking send",
                                           "isend + irecv, wait both"};
      mt_set_case("pairwise exchange with rank %d, %zu bytes, %s", partner, n * 4, styles[style]);
      uint64_t seed = 300 + (uint64_t)(c * 3 + style);
      mt_fill(sbuf, n, TNT_FLOAT32, seed, g_rank);
      mt_fill(want, n, TNT_FLOAT32, seed, partner);
      mt_fill_sentinel(rbuf, n, TNT_FLOAT32);
      double t0 = mt_now();
      tnt_request_t *rs = NULL, *rr = NULL;
      if (style == 0) {
        MT_OK(tnt_isend(w, sbuf, n, TNT_FLOAT32, partner, 7, &rs));
        MT_OK(tnt_recv(w, rbuf, n, TNT_FLOAT32, partner, 7));
        wait_ok(rs, 0, "isend");
      } else if (style == 1) {
        MT_OK(tnt_irecv(w, rbuf, n, TNT_FLOAT32, partner, 7, &rr));
        MT_OK(tnt_send(w, sbuf, n, TNT_FLOAT32, partner, 7));
        wait_ok(rr, 1, "irecv");
      } else {
        MT_OK(tnt_isend(w, sbuf, n, TNT_FLOAT32, partner, 7, &rs));
        MT_OK(tnt_irecv(w, rbuf, n, TNT_FLOAT32, partner, 7, &rr));
        wait_ok(rs, 1, "isend");
        wait_ok(rr, 0, "irecv");
      }
      double dt = mt_now() - t0;
      MT_CHECK(dt < 10.0, "exchange took %.1f s (expected well under 10 s)", dt);
      mt_compare(TNT_FLOAT32, rbuf, want, n, "message from the partner");
    }
  }
  free(sbuf), free(rbuf), free(want);
}

/* Every rank sends 2 MiB to every rank (itself included) and receives from
 * every rank, all requests in flight together. */
static void test_all_to_all(tnt_group_t *w) {
  const size_t n = (size_t)1 << 19;
  mt_set_case("all to all, %zu bytes per pair", n * 4);
  float *sbuf = mt_alloc((size_t)g_size * n * 4), *rbuf = mt_alloc((size_t)g_size * n * 4);
  float *want = mt_alloc(n * 4);
  tnt_request_t **req = mt_alloc(2 * (size_t)g_size * sizeof *req);
  for (int p = 0; p < g_size; p++) {
    mt_fill(sbuf + (size_t)p * n, n, TNT_FLOAT32, 400 + (uint64_t)p, g_rank);
    mt_fill_sentinel(rbuf + (size_t)p * n, n, TNT_FLOAT32);
  }
  for (int k = 0; k < g_size; k++) {
    int p = (g_rank + k) % g_size;
    MT_OK(tnt_irecv(w, rbuf + (size_t)p * n, n, TNT_FLOAT32, p, 8, &req[2 * k]));
    MT_OK(tnt_isend(w, sbuf + (size_t)p * n, n, TNT_FLOAT32, p, 8, &req[2 * k + 1]));
  }
  for (int k = 2 * g_size - 1; k >= 0; k--) wait_ok(req[k], k % 2, "all-to-all request");
  for (int p = 0; p < g_size; p++) {
    mt_set_case("all to all, message from rank %d", p);
    mt_fill(want, n, TNT_FLOAT32, 400 + (uint64_t)g_rank, p);
    mt_compare(TNT_FLOAT32, rbuf + (size_t)p * n, want, n, "received block");
  }
  free(sbuf), free(rbuf), free(want), free(req);
}

/* Tag t carries a message of its own length whose elements encode t. */
static size_t tag_count(int tag) {
  return tag == 3 ? (size_t)3 << 17 : 100 + 37 * (size_t)(tag % 1000);
}

/* Messages to the right neighbour on nine tags, sent in increasing tag
 * order and received in decreasing order with blocking receives. */
static void test_tags_out_of_order(tnt_group_t *w) {
  static const int tags[] = {0, 1, 2, 3, 4, 5, 6, 7, 32767};
  enum { NTAGS = 9 };
  int32_t *sbuf[NTAGS], *rbuf[NTAGS];
  tnt_request_t *rs[NTAGS];
  mt_set_case("tags out of order: isend in tag order");
  for (int k = 0; k < NTAGS; k++) {
    size_t n = tag_count(tags[k]);
    sbuf[k] = mt_alloc(n * 4);
    rbuf[k] = mt_alloc(n * 4);
    for (size_t i = 0; i < n; i++)
      sbuf[k][i] = tags[k] * 10000 + (g_rank % 10) * 1000 + (int32_t)(i % 1000);
    MT_OK(tnt_isend(w, sbuf[k], n, TNT_INT32, right(g_rank), tags[k], &rs[k]));
  }
  for (int k = NTAGS - 1; k >= 0; k--) {
    size_t n = tag_count(tags[k]);
    mt_set_case("tags out of order: blocking recv of tag %d", tags[k]);
    MT_OK(tnt_recv(w, rbuf[k], n, TNT_INT32, left(g_rank), tags[k]));
    for (size_t i = 0; i < n; i++) {
      int32_t want = tags[k] * 10000 + (left(g_rank) % 10) * 1000 + (int32_t)(i % 1000);
      if (rbuf[k][i] != want) {
        mt_fail((long)i, "expected %d, got %d", want, rbuf[k][i]);
        break;
      }
    }
  }
  for (int k = 0; k < NTAGS; k++) {
    mt_set_case("tags out of order: wait for isend of tag %d", tags[k]);
    wait_ok(rs[k], k % 2, "isend");
    free(sbuf[k]), free(rbuf[k]);
  }
}

/* Six messages of different lengths on one tag arrive in sending order. */
static void test_same_tag_order(tnt_group_t *w) {
  enum { NMSG = 6 };
  int64_t *sbuf[NMSG], *rbuf[NMSG];
  tnt_request_t *rs[NMSG], *rr[NMSG];
  for (int k = 0; k < NMSG; k++) {
    size_t n = 10 + (size_t)k * (k == 4 ? 100000 : 3);
    sbuf[k] = mt_alloc(n * 8);
    rbuf[k] = mt_alloc(n * 8);
    for (size_t i = 0; i < n; i++)
      sbuf[k][i] = (int64_t)k << 40 | (int64_t)g_rank << 20 | (int64_t)i;
  }
  mt_set_case("one tag, six messages: isend all, then irecv all");
  for (int k = 0; k < NMSG; k++) {
    size_t n = 10 + (size_t)k * (k == 4 ? 100000 : 3);
    MT_OK(tnt_isend(w, sbuf[k], n, TNT_INT64, right(g_rank), 9, &rs[k]));
  }
  for (int k = 0; k < NMSG; k++) {
    size_t n = 10 + (size_t)k * (k == 4 ? 100000 : 3);
    MT_OK(tnt_irecv(w, rbuf[k], n, TNT_INT64, left(g_rank), 9, &rr[k]));
  }
  for (int k = NMSG - 1; k >= 0; k--) {
    wait_ok(rr[k], k % 2, "irecv");
    wait_ok(rs[k], (k + 1) % 2, "isend");
  }
  for (int k = 0; k < NMSG; k++) {
    size_t n = 10 + (size_t)k * (k == 4 ? 100000 : 3);
    mt_set_case("one tag, message %d of %d", k, NMSG);
    for (size_t i = 0; i < n; i++) {
      int64_t want = (int64_t)k << 40 | (int64_t)left(g_rank) << 20 | (int64_t)i;
      if (rbuf[k][i] != want) {
        mt_fail((long)i,
                "expected 0x%" PRIx64 ", got 0x%" PRIx64 " (messages matched out of order?)",
                (uint64_t)want, (uint64_t)rbuf[k][i]);
        break;
      }
    }
    free(sbuf[k]), free(rbuf[k]);
  }
}

/* A receive stays posted while collectives run (point-to-point traffic is
 * independent of collectives), and a non-blocking barrier stays in flight
 * while messages move. */
static void test_p2p_across_collectives(tnt_group_t *w) {
  mt_set_case("irecv pending across a blocking allreduce");
  int32_t in = -1, out = 7 * g_rank, one = g_rank, sum = 0;
  tnt_request_t *rr = NULL, *rs = NULL, *rb = NULL;
  MT_OK(tnt_irecv(w, &in, 1, TNT_INT32, left(g_rank), 99, &rr));
  MT_OK(tnt_allreduce(w, &one, &sum, 1, TNT_INT32, TNT_SUM));
  MT_CHECK(sum == g_size * (g_size - 1) / 2, "allreduce: expected %d, got %d",
           g_size * (g_size - 1) / 2, sum);
  MT_OK(tnt_isend(w, &out, 1, TNT_INT32, right(g_rank), 99, &rs));
  wait_ok(rr, 0, "irecv");
  wait_ok(rs, 1, "isend");
  MT_CHECK(in == 7 * left(g_rank), "message: expected %d, got %d", 7 * left(g_rank), in);

  mt_set_case("messages while a non-blocking barrier is in flight");
  MT_OK(tnt_ibarrier(w, &rb));
  in = -1;
  MT_OK(tnt_irecv(w, &in, 1, TNT_INT32, left(g_rank), 98, &rr));
  MT_OK(tnt_send(w, &out, 1, TNT_INT32, right(g_rank), 98));
  wait_ok(rr, 1, "irecv");
  wait_ok(rb, 0, "ibarrier");
  MT_CHECK(in == 7 * left(g_rank), "message: expected %d, got %d", 7 * left(g_rank), in);
}

/* In the reversed group, group rank j is world rank size-1-j: messages are
 * addressed by group rank. */
static void test_group_ranks(tnt_context_t *ctx) {
  int *list = mt_alloc((size_t)g_size * sizeof *list);
  for (int j = 0; j < g_size; j++) list[j] = g_size - 1 - j;
  mt_set_case("reversed group: tnt_group_create");
  tnt_group_t *g = NULL;
  MT_OK(tnt_group_create(ctx, list, g_size, &g));
  int me = tnt_group_rank(g);
  MT_CHECK(me == g_size - 1 - g_rank, "tnt_group_rank: expected %d, got %d", g_size - 1 - g_rank,
           me);
  mt_set_case("reversed group: ring by group rank");
  int32_t out[3] = {g_rank, me, 12345}, in[3] = {-1, -1, -1};
  tnt_request_t *rr = NULL;
  MT_OK(tnt_irecv(g, in, 3, TNT_INT32, left(me), 11, &rr));
  MT_OK(tnt_send(g, out, 3, TNT_INT32, right(me), 11));
  wait_ok(rr, 0, "irecv");
  int src = left(me);
  MT_CHECK(in[0] == list[src] && in[1] == src && in[2] == 12345,
           "message from group rank %d: expected {%d, %d, 12345}, got {%d, %d, %d}", src, list[src],
           src, in[0], in[1], in[2]);
  MT_OK(tnt_group_destroy(g));
  free(list);
}

static void test_invalid(tnt_group_t *w) {
  const tnt_status_t E = TNT_ERR_INVALID_ARG;
  float buf[4] = {0};
  tnt_request_t *req = NULL;
  mt_set_case("invalid arguments: send and recv");
  MT_EXPECT_ST(tnt_send(NULL, buf, 4, TNT_FLOAT32, 0, 1), E);
  MT_EXPECT_ST(tnt_send(w, NULL, 4, TNT_FLOAT32, 0, 1), E);
  MT_EXPECT_ST(tnt_send(w, buf, 4, TNT_DTYPE_COUNT, 0, 1), E);
  MT_EXPECT_ST(tnt_send(w, buf, 4, TNT_FLOAT32, -1, 1), E);
  MT_EXPECT_ST(tnt_send(w, buf, 4, TNT_FLOAT32, g_size, 1), E);
  MT_EXPECT_ST(tnt_send(w, buf, 4, TNT_FLOAT32, 0, -1), E);
  MT_EXPECT_ST(tnt_send(w, buf, 4, TNT_FLOAT32, 0, 32768), E);
  MT_EXPECT_ST(tnt_recv(w, NULL, 4, TNT_FLOAT32, 0, 1), E);
  MT_EXPECT_ST(tnt_recv(w, buf, 4, (tnt_dtype_t)-1, 0, 1), E);
  MT_EXPECT_ST(tnt_recv(w, buf, 4, TNT_FLOAT32, g_size, 1), E);
  MT_EXPECT_ST(tnt_recv(w, buf, 4, TNT_FLOAT32, -1, 1), E);
  MT_EXPECT_ST(tnt_recv(w, buf, 4, TNT_FLOAT32, 0, 32768), E);
  mt_set_case("invalid arguments: isend and irecv");
  MT_EXPECT_ST(tnt_isend(w, buf, 4, TNT_FLOAT32, 0, 1, NULL), E);
  MT_EXPECT_ST(tnt_isend(w, buf, 4, TNT_FLOAT32, g_size, 1, &req), E);
  MT_EXPECT_ST(tnt_isend(w, buf, 4, TNT_FLOAT32, 0, -5, &req), E);
  MT_EXPECT_ST(tnt_irecv(w, buf, 4, TNT_FLOAT32, 0, 1, NULL), E);
  MT_EXPECT_ST(tnt_irecv(w, NULL, 4, TNT_FLOAT32, 0, 1, &req), E);
  MT_EXPECT_ST(tnt_irecv(w, buf, 4, TNT_FLOAT32, 0, 40000, &req), E);
}

int main(int argc, char **argv) {
  mt_init("test_p2p_mpi", &argc, &argv, 0);
  int initialized = 1;
  MPI_Initialized(&initialized);
  if (initialized) {
    fprintf(stderr, "[test_p2p_mpi] FATAL: MPI initialized before tnt_context_create\n");
    return 1;
  }
  tnt_config_t config = {25.0};
  tnt_context_t *ctx = mt_context(&config);
  g_rank = mt_state()->rank;
  g_size = mt_state()->size;
  mt_set_case("MPI initialized by tnt_context_create");
  int provided = 0;
  MPI_Initialized(&initialized);
  MPI_Query_thread(&provided);
  MT_CHECK(initialized, "MPI_Initialized after tnt_context_create: expected 1, got 0");
  MT_CHECK(provided == MPI_THREAD_MULTIPLE, "thread level: expected %d, got %d",
           MPI_THREAD_MULTIPLE, provided);
  MT_CHECK(fabs(tnt_context_timeout(ctx) - 25.0) < 1e-9,
           "tnt_context_timeout with config 25 s: expected 25, got %g", tnt_context_timeout(ctx));
  tnt_group_t *w = tnt_context_world(ctx);
  if (w == NULL) mt_fatal("tnt_context_world returned NULL");
  double t0 = mt_now();

  test_ring_blocking(w);
  test_ring_nonblocking(w);
  test_pairwise(w);
  test_all_to_all(w);
  test_tags_out_of_order(w);
  test_same_tag_order(w);
  test_p2p_across_collectives(w);
  test_group_ranks(ctx);
  test_invalid(w);

  mt_set_case("teardown");
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  MT_CHECK(cst == TNT_OK, "tnt_context_error at the end: expected TNT_OK, got %s (%s)", mt_st(cst),
           msg != NULL ? msg : "");
  if (g_rank == 0) printf("total: %.1f s\n", mt_now() - t0);
  /* MPI is still needed for the verdict; tnt_context_destroy finalizes it. */
  int rc = mt_verdict();
  tnt_status_t st = tnt_context_destroy(ctx);
  mt_state()->ctx = NULL;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (st != TNT_OK || !finalized) {
    fprintf(stderr,
            "[test_p2p_mpi] FAIL rank %d: case 'teardown': tnt_context_destroy returned %s and "
            "MPI_Finalized is %d (expected TNT_OK and 1)\n",
            g_rank, mt_st(st), finalized);
    rc = 1;
  }
  return rc;
}
