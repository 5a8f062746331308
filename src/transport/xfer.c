/*
 * Blocking transfers with deadlines, built on the transports' non-blocking
 * calls. This is the one place where collective algorithms wait for peers,
 * so it is also the one place that names the peer when a wait times out.
 */
#include <stdint.h>
#include <stdio.h>

#include "util/log.h"
#include "transport/transport.h"

/* Tests every active request of reqs[0..n-1]: *pending of them are not
 * done, the first at *first (-1: none), and *progressed tells whether one
 * completed now. */
static tnt_status_t test_all(tnt__transport_t *t, tnt__xreq_t *reqs, int n, int *pending,
                             int *first, int *progressed) {
  *pending = 0, *first = -1, *progressed = 0;
  for (int i = 0; i < n; ++i) {
    if (!reqs[i].active) continue;
    int done = 0;
    TNT_CHECK(t->ops->test(t, &reqs[i], &done));
    *pending += !done;
    *progressed |= done;
    if (!done && *first < 0) *first = i;
  }
  return TNT_OK;
}

/* Every 64th pass of a wait without progress: the deadline, naming the peer
 * of `req`, which is still waiting. */
static tnt_status_t check_wait(tnt__transport_t *t, const tnt__xreq_t *req, unsigned it,
                               const tnt__wait_ctx_t *w, int *warned) {
  if ((it & 63u) != 63u) return TNT_OK;
  char what[48];
  snprintf(what, sizeof what, "rank %d (%s)", t->world_ranks[req->peer],
           req->is_recv ? "receive" : "send");
  return tnt__wait_check(w, warned, what);
}

static void cancel_all(tnt__transport_t *t, tnt__xreq_t *reqs, int n) {
  for (int i = 0; i < n; ++i) {
    if (reqs[i].active) t->ops->cancel(t, &reqs[i]);
  }
}

tnt_status_t tnt__xwait_all(tnt__transport_t *t, tnt__xreq_t *reqs, int n,
                            const tnt__wait_ctx_t *w) {
  tnt_status_t st = TNT_OK;
  int warned = 0;
  for (unsigned it = 0;; ++it) {
    int pending, first, progressed;
    TNT_CHECK_GOTO(test_all(t, reqs, n, &pending, &first, &progressed), st, fail);
    if (pending == 0) return TNT_OK;
    TNT_CHECK_GOTO(check_wait(t, &reqs[first], it, w, &warned), st, fail);
    tnt__spin_pause(it);
  }
fail:
  cancel_all(t, reqs, n);
  return st;
}

tnt_status_t tnt__xsendrecv(tnt__transport_t *t, const void *sbuf, size_t sbytes, int dst,
                            void *rbuf, size_t rbytes, int src, const tnt__wait_ctx_t *w) {
  tnt__xreq_t reqs[2] = {{.active = 0}, {.active = 0}};
  tnt_status_t st = TNT_OK;
  /* Post the receive first so an eager message lands in place. */
  if (rbytes > 0) TNT_CHECK_GOTO(t->ops->irecv(t, TNT__CH_COLL, rbuf, rbytes, src, TNT__COLL_TAG, &reqs[0]), st, fail);
  if (sbytes > 0) TNT_CHECK_GOTO(t->ops->isend(t, TNT__CH_COLL, sbuf, sbytes, dst, TNT__COLL_TAG, &reqs[1]), st, fail);
  return tnt__xwait_all(t, reqs, 2, w);
fail:
  cancel_all(t, reqs, 2);
  return st;
}

/* Posts the next piece into every free slot of reqs[0..depth-1]: from
 * `*next` on, up to `bytes`. */
static tnt_status_t post_pieces(tnt__transport_t *t, tnt__xreq_t *reqs, int depth, int recv,
                                uint8_t *buf, size_t bytes, int peer, size_t seg, size_t *next) {
  for (int i = 0; i < depth && *next < bytes; ++i) {
    if (reqs[i].active) continue;
    const size_t b = bytes - *next < seg ? bytes - *next : seg;
    TNT_CHECK(recv ? t->ops->irecv(t, TNT__CH_COLL, buf + *next, b, peer, TNT__COLL_TAG, &reqs[i])
                   : t->ops->isend(t, TNT__CH_COLL, buf + *next, b, peer, TNT__COLL_TAG, &reqs[i]));
    *next += b;
  }
  return TNT_OK;
}

enum { MAX_PIECES_IN_FLIGHT = 64 };

tnt_status_t tnt__xsendrecv_pieces(tnt__transport_t *t, const void *sbuf, size_t sbytes, int dst,
                                   void *rbuf, size_t rbytes, int src, size_t seg, int depth,
                                   const tnt__wait_ctx_t *w) {
  if (seg == 0) seg = 1;
  if (depth < 1) depth = 1;
  if (depth > MAX_PIECES_IN_FLIGHT) depth = MAX_PIECES_IN_FLIGHT;
  /* Receives in reqs[0..depth-1], sends after them. Pieces are posted in
   * order, so the transport matches them in order whatever slot they use. */
  tnt__xreq_t reqs[2 * MAX_PIECES_IN_FLIGHT] = {{.active = 0}};
  size_t rnext = 0, snext = 0;
  int warned = 0;
  tnt_status_t st = TNT_OK;
  for (unsigned it = 0;; ++it) {
    TNT_CHECK_GOTO(post_pieces(t, reqs, depth, 1, rbuf, rbytes, src, seg, &rnext), st, fail);
    TNT_CHECK_GOTO(post_pieces(t, reqs + depth, depth, 0, (uint8_t *)(uintptr_t)sbuf, sbytes, dst,
                               seg, &snext),
                   st, fail);
    int pending, first, progressed;
    TNT_CHECK_GOTO(test_all(t, reqs, 2 * depth, &pending, &first, &progressed), st, fail);
    if (pending == 0 && rnext >= rbytes && snext >= sbytes) return TNT_OK;
    if (progressed) { /* post the next pieces at once */
      it = 0;
      continue;
    }
    TNT_CHECK_GOTO(check_wait(t, &reqs[first], it, w, &warned), st, fail);
    tnt__spin_pause(it);
  }
fail:
  cancel_all(t, reqs, 2 * depth);
  return st;
}

tnt_status_t tnt__xsend(tnt__transport_t *t, const void *buf, size_t bytes, int peer,
                        const tnt__wait_ctx_t *w) {
  return tnt__xsendrecv(t, buf, bytes, peer, NULL, 0, -1, w);
}

tnt_status_t tnt__xrecv(tnt__transport_t *t, void *buf, size_t bytes, int peer,
                        const tnt__wait_ctx_t *w) {
  return tnt__xsendrecv(t, NULL, 0, -1, buf, bytes, peer, w);
}
