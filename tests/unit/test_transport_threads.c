/*
 * Tests of the threads transport (src/transport/transport_threads.c) on its
 * own, without collectives.
 *
 * Sends are eager, so one thread may play several ranks: the ordering tests
 * drive every rank from the main thread, which makes each interleaving
 * deterministic. The remaining tests run one pthread per rank and check
 * that concurrent traffic, splits and shared memory behave (these also run
 * under ThreadSanitizer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "transport_threads.h"

/* ------------------------------------------------------------- helpers */

/* Transports for every rank of a fresh world, all owned by the caller. */
static tnt__threads_world_t *make_world(int size, const int *hosts, tnt__transport_t **t) {
  tnt__threads_world_t *w = NULL;
  assert_int_equal(tnt__threads_world_create(size, hosts, &w), TNT_OK);
  for (int r = 0; r < size; r++) {
    assert_int_equal(tnt__threads_transport_create(w, r, &t[r]), TNT_OK);
    assert_int_equal(t[r]->rank, r);
    assert_int_equal(t[r]->size, size);
  }
  return w;
}

static void free_world(tnt__threads_world_t *w, tnt__transport_t **t, int size) {
  for (int r = 0; r < size; r++) t[r]->ops->destroy(t[r]);
  tnt__threads_world_destroy(w);
}

static void send_int(tnt__transport_t *t, tnt__channel_t ch, int value, int peer, int tag) {
  tnt__xreq_t req = {.active = 0};
  assert_int_equal(t->ops->isend(t, ch, &value, sizeof value, peer, tag, &req), TNT_OK);
  /* Eager: complete at once, and the buffer may change right away. */
  int done = 0;
  assert_int_equal(t->ops->test(t, &req, &done), TNT_OK);
  assert_true(done);
  assert_false(req.active);
}

static int test_once(tnt__transport_t *t, tnt__xreq_t *req) {
  int done = 0;
  assert_int_equal(t->ops->test(t, req, &done), TNT_OK);
  return done;
}

static int recv_int(tnt__transport_t *t, tnt__channel_t ch, int peer, int tag) {
  int value = -1;
  tnt__xreq_t req = {.active = 0};
  assert_int_equal(t->ops->irecv(t, ch, &value, sizeof value, peer, tag, &req), TNT_OK);
  assert_true(req.active && req.is_recv && req.peer == peer);
  assert_true(test_once(t, &req));
  return value;
}

/* ---------------------------------------------------- world and hosts */

static void test_world_layout(void **state) {
  (void)state;
  tnt__transport_t *t[5];
  int hosts[5] = {7, 7, 3, 7, 9};
  tnt__threads_world_t *w = make_world(5, hosts, t);
  int expect[5] = {0, 0, 1, 0, 2};
  for (int r = 0; r < 5; r++) {
    assert_int_equal(t[r]->num_hosts, 3);
    assert_memory_equal(t[r]->host_of, expect, sizeof expect);
    for (int i = 0; i < 5; i++) assert_int_equal(t[r]->world_ranks[i], i);
    assert_string_equal(t[r]->ops->name, "threads");
    assert_null(t[r]->ops->native_allreduce);
    /* More than one host: no shared memory. */
    tnt__shm_t *shm = NULL;
    assert_int_equal(t[r]->ops->shm_alloc(t[r], 64, &shm), TNT_ERR_UNSUPPORTED);
  }
  free_world(w, t, 5);

  w = make_world(3, NULL, t);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(t[r]->num_hosts, 1);
    for (int i = 0; i < 3; i++) assert_int_equal(t[r]->host_of[i], 0);
  }
  free_world(w, t, 3);

  /* Invalid arguments. */
  tnt__threads_world_t *bad = NULL;
  assert_int_equal(tnt__threads_world_create(0, NULL, &bad), TNT_ERR_INVALID_ARG);
  assert_int_equal(tnt__threads_world_create(2, NULL, NULL), TNT_ERR_INVALID_ARG);
  assert_int_equal(tnt__threads_world_create(2, NULL, &w), TNT_OK);
  tnt__transport_t *x = NULL;
  assert_int_equal(tnt__threads_transport_create(w, 2, &x), TNT_ERR_INVALID_ARG);
  assert_int_equal(tnt__threads_transport_create(w, -1, &x), TNT_ERR_INVALID_ARG);
  tnt__threads_world_destroy(w);
  tnt__threads_world_destroy(NULL);
}

/* The world may go before its transports: they keep what they use. */
static void test_world_destroyed_first(void **state) {
  (void)state;
  tnt__transport_t *t[2];
  tnt__threads_world_t *w = make_world(2, NULL, t);
  tnt__threads_world_destroy(w);
  send_int(t[0], TNT__CH_COLL, 42, 1, 0);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 0, 0), 42);
  t[0]->ops->destroy(t[0]);
  t[1]->ops->destroy(t[1]);
}

/* ------------------------------------------------------------ matching */

static void test_fifo_by_source_and_tag(void **state) {
  (void)state;
  tnt__transport_t *t[3];
  tnt__threads_world_t *w = make_world(3, NULL, t);
  /* Ranks 1 and 2 send interleaved streams on two tags to rank 0. */
  for (int i = 0; i < 4; i++) {
    send_int(t[1], TNT__CH_COLL, 100 + i, 0, 5);
    send_int(t[2], TNT__CH_COLL, 200 + i, 0, 5);
    send_int(t[1], TNT__CH_COLL, 300 + i, 0, 6);
  }
  /* Receiving in another order of keys still gives each key's messages in
   * the order they were sent. */
  for (int i = 0; i < 4; i++) assert_int_equal(recv_int(t[0], TNT__CH_COLL, 1, 6), 300 + i);
  assert_int_equal(recv_int(t[0], TNT__CH_COLL, 2, 5), 200);
  for (int i = 0; i < 4; i++) assert_int_equal(recv_int(t[0], TNT__CH_COLL, 1, 5), 100 + i);
  for (int i = 1; i < 4; i++) assert_int_equal(recv_int(t[0], TNT__CH_COLL, 2, 5), 200 + i);
  /* Nothing is left: a new receive waits. */
  int v = 0;
  tnt__xreq_t req = {.active = 0};
  assert_int_equal(t[0]->ops->irecv(t[0], TNT__CH_COLL, &v, sizeof v, 1, 5, &req), TNT_OK);
  assert_false(test_once(t[0], &req));
  send_int(t[2], TNT__CH_COLL, 7, 0, 5); /* other source: no match */
  send_int(t[1], TNT__CH_COLL, 8, 0, 4); /* other tag: no match */
  assert_false(test_once(t[0], &req));
  send_int(t[1], TNT__CH_COLL, 9, 0, 5);
  assert_true(test_once(t[0], &req));
  assert_int_equal(v, 9);
  assert_int_equal(recv_int(t[0], TNT__CH_COLL, 2, 5), 7);
  assert_int_equal(recv_int(t[0], TNT__CH_COLL, 1, 4), 8);
  free_world(w, t, 3);
}

/* Receives posted before the sends are matched in posting order, whatever
 * order they are tested in. */
static void test_posted_receives_in_order(void **state) {
  (void)state;
  tnt__transport_t *t[2];
  tnt__threads_world_t *w = make_world(2, NULL, t);
  int v[3] = {0, 0, 0};
  tnt__xreq_t req[3] = {{.active = 0}, {.active = 0}, {.active = 0}};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, &v[i], sizeof(int), 0, 1, &req[i]),
                     TNT_OK);
  }
  assert_false(test_once(t[1], &req[2]));
  send_int(t[0], TNT__CH_COLL, 10, 1, 1);
  send_int(t[0], TNT__CH_COLL, 11, 1, 1);
  assert_true(test_once(t[1], &req[1]));
  assert_false(test_once(t[1], &req[2]));
  assert_true(test_once(t[1], &req[0]));
  assert_int_equal(v[0], 10);
  assert_int_equal(v[1], 11);
  send_int(t[0], TNT__CH_COLL, 12, 1, 1);
  assert_true(test_once(t[1], &req[2]));
  assert_int_equal(v[2], 12);
  /* Testing a completed request again just says done. */
  assert_true(test_once(t[1], &req[2]));
  free_world(w, t, 2);
}

static void test_channels_do_not_mix(void **state) {
  (void)state;
  tnt__transport_t *t[2];
  tnt__threads_world_t *w = make_world(2, NULL, t);
  send_int(t[0], TNT__CH_COLL, 1, 1, 3);
  send_int(t[0], TNT__CH_P2P, 2, 1, 3);
  send_int(t[0], TNT__CH_COLL, 3, 1, 3);
  assert_int_equal(recv_int(t[1], TNT__CH_P2P, 0, 3), 2);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 0, 3), 1);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 0, 3), 3);
  /* A pending p2p receive ignores collective traffic. */
  int v = 0;
  tnt__xreq_t req = {.active = 0};
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_P2P, &v, sizeof v, 0, 3, &req), TNT_OK);
  send_int(t[0], TNT__CH_COLL, 4, 1, 3);
  assert_false(test_once(t[1], &req));
  send_int(t[0], TNT__CH_P2P, 5, 1, 3);
  assert_true(test_once(t[1], &req));
  assert_int_equal(v, 5);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 0, 3), 4);
  /* Messages to oneself work too. */
  send_int(t[1], TNT__CH_P2P, 6, 1, 0);
  assert_int_equal(recv_int(t[1], TNT__CH_P2P, 1, 0), 6);
  free_world(w, t, 2);
}

static void test_sizes_and_errors(void **state) {
  (void)state;
  tnt__transport_t *t[2];
  tnt__threads_world_t *w = make_world(2, NULL, t);
  tnt__xreq_t req = {.active = 0};
  /* Zero-byte messages, with NULL buffers. */
  assert_int_equal(t[0]->ops->isend(t[0], TNT__CH_COLL, NULL, 0, 1, 9, &req), TNT_OK);
  assert_true(test_once(t[0], &req));
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, NULL, 0, 0, 9, &req), TNT_OK);
  assert_true(test_once(t[1], &req));
  /* A large message arrives intact. */
  size_t n = 1 << 20;
  unsigned char *big = malloc(n), *got = calloc(1, n);
  for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 7 + 3);
  assert_int_equal(t[0]->ops->isend(t[0], TNT__CH_COLL, big, n, 1, 2, &req), TNT_OK);
  memset(big, 0, n); /* the copy was taken at isend */
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, got, n, 0, 2, &req), TNT_OK);
  assert_true(test_once(t[1], &req));
  for (size_t i = 0; i < n; i++) assert_int_equal(got[i], (unsigned char)(i * 7 + 3));
  /* A message of another size than the receive is a mismatch, shorter or
   * longer, and the receive buffer keeps what it had. */
  int pair[2] = {-1, -1}, one = 0, done = 0;
  send_int(t[0], TNT__CH_COLL, 77, 1, 2);
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, pair, sizeof pair, 0, 2, &req), TNT_OK);
  assert_int_equal(t[1]->ops->test(t[1], &req, &done), TNT_ERR_MISMATCH);
  assert_false(req.active);
  assert_int_equal(pair[0], -1);
  assert_int_equal(t[0]->ops->isend(t[0], TNT__CH_COLL, pair, sizeof pair, 1, 2, &req), TNT_OK);
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, &one, sizeof one, 0, 2, &req), TNT_OK);
  assert_int_equal(t[1]->ops->test(t[1], &req, &done), TNT_ERR_MISMATCH);
  assert_false(req.active);
  assert_int_equal(one, 0);
  /* Invalid peers and channels. */
  assert_int_equal(t[0]->ops->isend(t[0], TNT__CH_COLL, &one, 4, 2, 0, &req), TNT_ERR_INVALID_ARG);
  assert_int_equal(t[0]->ops->irecv(t[0], TNT__CH_COLL, &one, 4, -1, 0, &req), TNT_ERR_INVALID_ARG);
  assert_int_equal(t[0]->ops->isend(t[0], (tnt__channel_t)2, &one, 4, 1, 0, &req),
                   TNT_ERR_INVALID_ARG);
  assert_int_equal(t[0]->ops->isend(t[0], TNT__CH_COLL, NULL, 4, 1, 0, &req), TNT_ERR_INVALID_ARG);
  free(big);
  free(got);
  free_world(w, t, 2);
}

static void test_cancel(void **state) {
  (void)state;
  tnt__transport_t *t[2];
  tnt__threads_world_t *w = make_world(2, NULL, t);
  int a = 0, b = 0;
  tnt__xreq_t ra = {.active = 0}, rb = {.active = 0};
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, &a, sizeof a, 0, 1, &ra), TNT_OK);
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, &b, sizeof b, 0, 1, &rb), TNT_OK);
  t[1]->ops->cancel(t[1], &ra);
  assert_false(ra.active);
  t[1]->ops->cancel(t[1], &ra); /* cancelling twice is harmless */
  /* The cancelled receive no longer takes messages: the next one goes to b. */
  send_int(t[0], TNT__CH_COLL, 5, 1, 1);
  assert_true(test_once(t[1], &rb));
  assert_int_equal(b, 5);
  assert_int_equal(a, 0);
  /* Cancelling a receive that was already matched drops its message. */
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, &a, sizeof a, 0, 1, &ra), TNT_OK);
  send_int(t[0], TNT__CH_COLL, 6, 1, 1);
  send_int(t[0], TNT__CH_COLL, 7, 1, 1);
  t[1]->ops->cancel(t[1], &ra);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 0, 1), 7);
  /* Cancelling a send is a no-op; its message was delivered. */
  tnt__xreq_t rs = {.active = 0};
  int v = 8;
  assert_int_equal(t[0]->ops->isend(t[0], TNT__CH_COLL, &v, sizeof v, 1, 1, &rs), TNT_OK);
  t[0]->ops->cancel(t[0], &rs);
  assert_false(rs.active);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 0, 1), 8);
  /* A pending receive and queued messages left at destroy are freed. */
  assert_int_equal(t[1]->ops->irecv(t[1], TNT__CH_COLL, &a, sizeof a, 0, 99, &ra), TNT_OK);
  send_int(t[1], TNT__CH_COLL, 1, 0, 1);
  free_world(w, t, 2);
}

/* --------------------------------------------------------------- split */

static void test_split_single_thread(void **state) {
  (void)state;
  tnt__transport_t *t[4], *s[4] = {NULL}, *s2[4] = {NULL};
  int hosts[4] = {1, 0, 1, 0};
  tnt__threads_world_t *w = make_world(4, hosts, t);
  /* Ranks 3 and 1, in that order: transport rank = position in the list. */
  int list[2] = {3, 1};
  assert_int_equal(t[3]->ops->split(t[3], list, 2, &s[3]), TNT_OK);
  /* The first member may talk before the second has joined. */
  send_int(s[3], TNT__CH_COLL, 31, 1, 0);
  assert_int_equal(t[1]->ops->split(t[1], list, 2, &s[1]), TNT_OK);
  for (int r = 1; r <= 3; r += 2) {
    assert_int_equal(s[r]->size, 2);
    assert_int_equal(s[r]->world_ranks[0], 3);
    assert_int_equal(s[r]->world_ranks[1], 1);
    /* Both on world host 1 (index 1 in the world): one host, renumbered 0. */
    assert_int_equal(s[r]->num_hosts, 1);
    assert_int_equal(s[r]->host_of[0], 0);
    assert_int_equal(s[r]->host_of[1], 0);
  }
  assert_int_equal(s[3]->rank, 0);
  assert_int_equal(s[1]->rank, 1);
  assert_int_equal(recv_int(s[1], TNT__CH_COLL, 0, 0), 31);
  /* A second split over the same list is a different sub-world, paired
   * with the second call of each member. */
  assert_int_equal(t[1]->ops->split(t[1], list, 2, &s2[1]), TNT_OK);
  assert_int_equal(t[3]->ops->split(t[3], list, 2, &s2[3]), TNT_OK);
  send_int(s2[3], TNT__CH_COLL, 32, 1, 0);
  send_int(s[3], TNT__CH_COLL, 33, 1, 0);
  send_int(t[3], TNT__CH_COLL, 34, 1, 0);
  assert_int_equal(recv_int(s2[1], TNT__CH_COLL, 0, 0), 32);
  assert_int_equal(recv_int(s[1], TNT__CH_COLL, 0, 0), 33);
  assert_int_equal(recv_int(t[1], TNT__CH_COLL, 3, 0), 34);
  /* Host numbering of a split that spans both hosts starts at its first
   * member's host. */
  tnt__transport_t *m[4] = {NULL};
  int mixed[3] = {1, 2, 0};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(t[mixed[i]]->ops->split(t[mixed[i]], mixed, 3, &m[i]), TNT_OK);
    assert_int_equal(m[i]->rank, i);
    assert_int_equal(m[i]->num_hosts, 2);
    assert_int_equal(m[i]->host_of[0], 0); /* world rank 1: world host 1 */
    assert_int_equal(m[i]->host_of[1], 1); /* world rank 2: world host 0 */
    assert_int_equal(m[i]->host_of[2], 1); /* world rank 0: world host 0 */
  }
  /* A split of a split. */
  tnt__transport_t *mm[2] = {NULL};
  int sub[2] = {2, 1};
  assert_int_equal(m[2]->ops->split(m[2], sub, 2, &mm[0]), TNT_OK);
  assert_int_equal(m[1]->ops->split(m[1], sub, 2, &mm[1]), TNT_OK);
  assert_int_equal(mm[0]->world_ranks[0], 0);
  assert_int_equal(mm[0]->world_ranks[1], 2);
  assert_int_equal(mm[1]->rank, 1);
  assert_int_equal(mm[0]->num_hosts, 1);
  send_int(mm[1], TNT__CH_P2P, 55, 0, 1);
  assert_int_equal(recv_int(mm[0], TNT__CH_P2P, 1, 1), 55);
  /* Invalid lists: caller missing, duplicates, out of range, empty. */
  tnt__transport_t *x = NULL;
  int missing[1] = {2}, dup[2] = {0, 0}, range[2] = {0, 4};
  assert_int_equal(t[0]->ops->split(t[0], missing, 1, &x), TNT_ERR_INVALID_ARG);
  assert_int_equal(t[0]->ops->split(t[0], dup, 2, &x), TNT_ERR_INVALID_ARG);
  assert_int_equal(t[0]->ops->split(t[0], range, 2, &x), TNT_ERR_INVALID_ARG);
  assert_int_equal(t[0]->ops->split(t[0], list, 0, &x), TNT_ERR_INVALID_ARG);
  for (int i = 0; i < 2; i++) mm[i]->ops->destroy(mm[i]);
  for (int i = 0; i < 3; i++) m[i]->ops->destroy(m[i]);
  for (int r = 1; r <= 3; r += 2) {
    s[r]->ops->destroy(s[r]);
    s2[r]->ops->destroy(s2[r]);
  }
  free_world(w, t, 4);
}

/* ------------------------------------------------------- multi-threaded */

#define NT 8

typedef struct rank_arg {
  tnt__threads_world_t *world;
  int rank;
  int size;
  pthread_barrier_t *barrier;
  void *shared; /* per test */
} rank_arg_t;

static void run_ranks(int size, const int *hosts, void *(*fn)(void *), void *shared) {
  tnt__threads_world_t *w = NULL;
  assert_int_equal(tnt__threads_world_create(size, hosts, &w), TNT_OK);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)size);
  pthread_t th[NT];
  rank_arg_t args[NT];
  for (int r = 0; r < size; r++) {
    args[r] = (rank_arg_t){w, r, size, &barrier, shared};
    assert_int_equal(pthread_create(&th[r], NULL, fn, &args[r]), 0);
  }
  for (int r = 0; r < size; r++) {
    void *res = NULL;
    pthread_join(th[r], &res);
    /* Each thread returns NULL on success or a static failure message. */
    if (res != NULL) fail_msg("rank %d: %s", r, (const char *)res);
  }
  pthread_barrier_destroy(&barrier);
  tnt__threads_world_destroy(w);
}

/* cmocka's asserts longjmp on the main thread only, so threads check with
 * this and report the first failure through their return value. */
#define CHECK(cond)                                 \
  do {                                              \
    if (!(cond)) return (void *)("failed: " #cond); \
  } while (0)

static int wait_nb(tnt__transport_t *t, tnt__xreq_t *req) {
  for (unsigned it = 0;; it++) {
    int done = 0;
    if (t->ops->test(t, req, &done) < 0) return -1;
    if (done) return 0;
    sched_yield();
  }
}

/* Every rank exchanges many messages of varying sizes with every other
 * rank, on both channels and several tags, receives posted in advance or
 * late; contents identify sender, tag and sequence number. */
static void *all_to_all_rank(void *p) {
  rank_arg_t *a = p;
  tnt__transport_t *t = NULL;
  CHECK(tnt__threads_transport_create(a->world, a->rank, &t) == TNT_OK);
  enum { ROUNDS = 40, MAXLEN = 300 };
  int n = a->size;
  int *rbuf = malloc((size_t)n * 2 * MAXLEN * sizeof(int));
  int *sbuf = malloc(MAXLEN * sizeof(int));
  tnt__xreq_t *req = calloc((size_t)n * 2, sizeof *req);
  CHECK(rbuf != NULL && sbuf != NULL && req != NULL);
  for (int round = 0; round < ROUNDS; round++) {
    int tag = round % 3;
    int post_first = (round + a->rank) % 2;
    for (int phase = 0; phase < 2; phase++) {
      if (phase == post_first) {
        for (int peer = 0; peer < n; peer++) {
          for (int ch = 0; ch < 2; ch++) {
            int len = 1 + (peer * 31 + a->rank * 7 + round * 13 + ch) % MAXLEN;
            int *dst = rbuf + (peer * 2 + ch) * MAXLEN;
            CHECK(t->ops->irecv(t, (tnt__channel_t)ch, dst, (size_t)len * sizeof(int), peer, tag,
                                &req[peer * 2 + ch]) == TNT_OK);
          }
        }
      } else {
        for (int peer = 0; peer < n; peer++) {
          for (int ch = 1; ch >= 0; ch--) {
            int len = 1 + (a->rank * 31 + peer * 7 + round * 13 + ch) % MAXLEN;
            for (int i = 0; i < len; i++) sbuf[i] = ((a->rank * 2 + ch) * 1000 + round) * 1000 + i;
            tnt__xreq_t s = {.active = 0};
            CHECK(t->ops->isend(t, (tnt__channel_t)ch, sbuf, (size_t)len * sizeof(int), peer, tag,
                                &s) == TNT_OK);
            CHECK(wait_nb(t, &s) == 0);
          }
        }
      }
    }
    /* Complete in reverse order of posting. */
    for (int k = 2 * n - 1; k >= 0; k--) CHECK(wait_nb(t, &req[k]) == 0);
    for (int peer = 0; peer < n; peer++) {
      for (int ch = 0; ch < 2; ch++) {
        int len = 1 + (peer * 31 + a->rank * 7 + round * 13 + ch) % MAXLEN;
        int *got = rbuf + (peer * 2 + ch) * MAXLEN;
        for (int i = 0; i < len; i++) CHECK(got[i] == ((peer * 2 + ch) * 1000 + round) * 1000 + i);
      }
    }
  }
  free(rbuf);
  free(sbuf);
  free(req);
  t->ops->destroy(t);
  return NULL;
}

static void test_threads_all_to_all(void **state) {
  (void)state;
  for (int size = 1; size <= NT; size *= 2) run_ranks(size, NULL, all_to_all_rank, NULL);
  run_ranks(3, NULL, all_to_all_rank, NULL);
}

/* Concurrent splits: every rank joins the even/odd halves twice and the
 * whole world once, and each sub-world carries a token around its ring
 * while the others do the same. */
static void *split_rank(void *p) {
  rank_arg_t *a = p;
  tnt__transport_t *t = NULL, *half[2] = {NULL, NULL}, *all = NULL;
  CHECK(tnt__threads_transport_create(a->world, a->rank, &t) == TNT_OK);
  int n = a->size, list[NT], m = 0;
  for (int r = a->rank % 2; r < n; r += 2) list[m++] = r;
  int everyone[NT];
  for (int r = 0; r < n; r++) everyone[r] = n - 1 - r; /* reversed order */
  for (int k = 0; k < 2; k++) CHECK(t->ops->split(t, list, m, &half[k]) == TNT_OK);
  CHECK(t->ops->split(t, everyone, n, &all) == TNT_OK);
  CHECK(all->rank == n - 1 - a->rank);
  tnt__transport_t *subs[3] = {half[0], half[1], all};
  for (int iter = 0; iter < 20; iter++) {
    for (int k = 0; k < 3; k++) {
      tnt__transport_t *s = subs[k];
      int next = (s->rank + 1) % s->size, prev = (s->rank + s->size - 1) % s->size;
      int token = s->rank * 100 + k * 10000 + iter, got = -1;
      tnt__xreq_t rr = {.active = 0}, sr = {.active = 0};
      CHECK(s->ops->irecv(s, TNT__CH_COLL, &got, sizeof got, prev, 0, &rr) == TNT_OK);
      CHECK(s->ops->isend(s, TNT__CH_COLL, &token, sizeof token, next, 0, &sr) == TNT_OK);
      CHECK(wait_nb(s, &sr) == 0 && wait_nb(s, &rr) == 0);
      CHECK(got == prev * 100 + k * 10000 + iter);
    }
  }
  for (int k = 0; k < 2; k++) half[k]->ops->destroy(half[k]);
  all->ops->destroy(all);
  t->ops->destroy(t);
  return NULL;
}

static void test_threads_split(void **state) {
  (void)state;
  run_ranks(NT, NULL, split_rank, NULL);
  run_ranks(5, NULL, split_rank, NULL);
  run_ranks(1, NULL, split_rank, NULL);
}

/* Shared memory: every rank sees the same zeroed, aligned regions; what a
 * rank writes into its region is visible to the others after a barrier.
 * Ranks of one host of a two-host world
 * get shared memory through a split. */
static void *shm_rank(void *p) {
  rank_arg_t *a = p;
  tnt__transport_t *t = NULL, *node = NULL;
  CHECK(tnt__threads_transport_create(a->world, a->rank, &t) == TNT_OK);
  tnt__transport_t *use = t;
  if (t->num_hosts > 1) {
    tnt__shm_t *none = NULL;
    CHECK(t->ops->shm_alloc(t, 128, &none) == TNT_ERR_UNSUPPORTED);
    int list[NT], m = 0;
    for (int r = 0; r < t->size; r++) {
      if (t->host_of[r] == t->host_of[t->rank]) list[m++] = r;
    }
    CHECK(t->ops->split(t, list, m, &node) == TNT_OK);
    CHECK(node->num_hosts == 1);
    use = node;
  }
  size_t sizes[3] = {1000, 64, 4096};
  tnt__shm_t *shm[3] = {NULL, NULL, NULL};
  for (int k = 0; k < 3; k++) {
    CHECK(use->ops->shm_alloc(use, sizes[k], &shm[k]) == TNT_OK);
    CHECK(shm[k]->nranks == use->size && shm[k]->bytes == sizes[k]);
    for (int r = 0; r < use->size; r++) {
      CHECK(((uintptr_t)shm[k]->base[r] & 63u) == 0);
      if (r > 0) CHECK(shm[k]->base[r] >= shm[k]->base[r - 1] + sizes[k]);
    }
    for (size_t i = 0; i < sizes[k]; i++) CHECK(shm[k]->base[use->rank][i] == 0);
  }
  /* Everyone has checked the zeroes before anyone writes. */
  pthread_barrier_wait(a->barrier);
  for (int k = 0; k < 3; k++) {
    memset(shm[k]->base[use->rank], (use->rank + 1) * (k + 1), sizes[k]);
  }
  pthread_barrier_wait(a->barrier);
  /* Pointers agree: rank r's region holds r's bytes for every reader. */
  for (int k = 0; k < 3; k++) {
    for (int r = 0; r < use->size; r++) {
      for (size_t i = 0; i < sizes[k]; i += 7) {
        CHECK(shm[k]->base[r][i] == (unsigned char)((r + 1) * (k + 1)));
      }
    }
  }
  pthread_barrier_wait(a->barrier);
  for (int k = 0; k < 3; k++) use->ops->shm_free(use, shm[k]);
  if (node != NULL) node->ops->destroy(node);
  t->ops->destroy(t);
  return NULL;
}

static void test_threads_shm(void **state) {
  (void)state;
  run_ranks(NT, NULL, shm_rank, NULL);
  run_ranks(1, NULL, shm_rank, NULL);
  int two_hosts[4] = {0, 1, 0, 1};
  run_ranks(4, two_hosts, shm_rank, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world_layout),
      cmocka_unit_test(test_world_destroyed_first),
      cmocka_unit_test(test_fifo_by_source_and_tag),
      cmocka_unit_test(test_posted_receives_in_order),
      cmocka_unit_test(test_channels_do_not_mix),
      cmocka_unit_test(test_sizes_and_errors),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_split_single_thread),
      cmocka_unit_test(test_threads_all_to_all),
      cmocka_unit_test(test_threads_split),
      cmocka_unit_test(test_threads_shm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
