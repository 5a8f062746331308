/*
 * Ring allreduce: a reduce-scatter followed by an allgather, each of n - 1
 * steps in which every rank sends one chunk to its right neighbour and
 * receives one from its left. Every rank sends 2(n-1)/n of the vector, the
 * minimum for an allreduce, so this is the algorithm for large messages
 * between hosts.
 *
 * The ring is pipelined: each step's chunk travels in segments of
 * TNT_RING_SEGMENT_KB, with up to TNT_RING_DEPTH segments in flight on each
 * link. In step k a rank sends the chunk it received (and reduced) in step
 * k - 1, so segment j of step k leaves as soon as segment j of step k - 1
 * has arrived and been reduced: the link does not idle while a whole chunk
 * is reduced, and a step does not wait for the slowest segment of the step
 * before it. In both phases the chunk sent in step k is (r - k) mod n and
 * the chunk received is (r - k - 1) mod n.
 *
 * Each chunk is reduced by one chain in a fixed order (chunk q starts at
 * rank q and passes ranks q + 1, q + 2, ...) and then copied, so all ranks
 * get identical bits, whatever the segment size or the timing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

/* A position in the sequence of transfers: step k and segment j of the
 * chunk of that step. Positions run in (k, j) order; k == steps is the end. */
typedef struct ring_pos {
  int k;
  size_t j;
} ring_pos_t;

typedef struct ring {
  uint8_t *data;
  size_t count, esz, seg; /* seg: elements per segment */
  int n, r, steps;
} ring_t;

/* The chunk that is sent (recv == 0) or received (recv == 1) in step k. */
static void ring_chunk(const ring_t *g, int k, int recv, size_t *lo, size_t *hi) {
  const int q = ((g->r - k - recv) % g->n + g->n) % g->n;
  tnt__slice(g->count, g->esz, g->n, q, lo, hi);
}

static size_t ring_nseg(const ring_t *g, int k, int recv) {
  size_t lo, hi;
  ring_chunk(g, k, recv, &lo, &hi);
  return (hi - lo + g->seg - 1) / g->seg;
}

/* Elements [*lo, *hi) of segment p.j of the chunk of step p.k. */
static void ring_segment(const ring_t *g, ring_pos_t p, int recv, size_t *lo, size_t *hi) {
  size_t clo, chi;
  ring_chunk(g, p.k, recv, &clo, &chi);
  *lo = clo + p.j * g->seg;
  *hi = TNT__MIN(chi, *lo + g->seg);
}

/* Moves p to the next segment, skipping empty chunks. */
static void ring_advance(const ring_t *g, ring_pos_t *p, int recv) {
  p->j++;
  while (p->k < g->steps && p->j >= ring_nseg(g, p->k, recv)) {
    p->k++;
    p->j = 0;
  }
}

static ring_pos_t ring_first(const ring_t *g, int recv) {
  ring_pos_t p = {0, 0};
  if (ring_nseg(g, 0, recv) == 0) {
    p.j = (size_t)-1; /* advance wraps it to 0 */
    ring_advance(g, &p, recv);
  }
  return p;
}

/* Segment s of step k may leave once segment s of step k - 1 (the same
 * chunk) has arrived and been reduced, i.e. once the receives are done past
 * it. */
static int ring_send_ready(ring_pos_t s, ring_pos_t done) {
  return s.k == 0 || done.k > s.k - 1 || (done.k == s.k - 1 && done.j > s.j);
}

tnt_status_t tnt__ring_allreduce(tnt__transport_t *t, const tnt__ring_cfg_t *cfg, void *buf,
                                 size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                 const tnt__wait_ctx_t *w) {
  const int n = t->size;
  if (n == 1 || count == 0) {
    tnt__reduce_finish(buf, count, dtype, op, n);
    return TNT_OK;
  }
  const size_t esz = tnt__dtype_size(dtype);
  ring_t g = {.data = buf, .count = count, .esz = esz, .n = n, .r = t->rank,
              .steps = 2 * (n - 1)};
  g.seg = cfg->segment_bytes / esz > 0 ? cfg->segment_bytes / esz : 1;
  const int right = (t->rank + 1) % n, left = (t->rank + n - 1) % n;
  const int depth = cfg->depth;
  /* Received segments of the reduce-scatter wait in one of `depth` slots
   * until they are reduced; the allgather receives in place. */
  uint8_t *tmp = malloc((size_t)depth * g.seg * esz);
  tnt__xreq_t *rreq = calloc((size_t)depth * 2, sizeof *rreq);
  ring_pos_t *rpos = malloc((size_t)depth * sizeof *rpos);
  tnt_status_t st = TNT_OK;
  if (tmp == NULL || rreq == NULL || rpos == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto out;
  }
  tnt__xreq_t *sreq = rreq + depth;
  const int last_rs = n - 2; /* the step after which a rank owns a reduced chunk */
  ring_pos_t rpost = ring_first(&g, 1), rdone = rpost, spost = ring_first(&g, 0);
  size_t nrpost = 0, nrdone = 0, nspost = 0, nsdone = 0;
  int warned = 0;
  unsigned idle = 0;
  while (rdone.k < g.steps || spost.k < g.steps || nsdone < nspost) {
    int progress = 0;
    while (rpost.k < g.steps && nrpost - nrdone < (size_t)depth) {
      size_t lo, hi;
      ring_segment(&g, rpost, 1, &lo, &hi);
      const size_t i = nrpost % (size_t)depth;
      uint8_t *dst = rpost.k <= last_rs ? tmp + i * g.seg * esz : g.data + lo * esz;
      TNT_CHECK_GOTO(t->ops->irecv(t, TNT__CH_COLL, dst, (hi - lo) * esz, left, TNT__COLL_TAG,
                                   &rreq[i]),
                     st, fail);
      rpos[i] = rpost;
      ring_advance(&g, &rpost, 1);
      nrpost++;
      progress = 1;
    }
    while (spost.k < g.steps && nspost - nsdone < (size_t)depth &&
           ring_send_ready(spost, rdone)) {
      size_t lo, hi;
      ring_segment(&g, spost, 0, &lo, &hi);
      TNT_CHECK_GOTO(t->ops->isend(t, TNT__CH_COLL, g.data + lo * esz, (hi - lo) * esz, right,
                                   TNT__COLL_TAG, &sreq[nspost % (size_t)depth]),
                     st, fail);
      ring_advance(&g, &spost, 0);
      nspost++;
      progress = 1;
    }
    /* Receives complete in the order they were posted (one source, one
     * tag), so the oldest is the one to test. */
    while (nrdone < nrpost) {
      const size_t i = nrdone % (size_t)depth;
      int done = 0;
      TNT_CHECK_GOTO(t->ops->test(t, &rreq[i], &done), st, fail);
      if (!done) break;
      if (rpos[i].k <= last_rs) {
        size_t lo, hi;
        ring_segment(&g, rpos[i], 1, &lo, &hi);
        tnt__reduce(g.data + lo * esz, tmp + i * g.seg * esz, hi - lo, dtype, op);
        if (rpos[i].k == last_rs) tnt__reduce_finish(g.data + lo * esz, hi - lo, dtype, op, n);
      }
      ring_advance(&g, &rdone, 1);
      nrdone++;
      progress = 1;
    }
    while (nsdone < nspost) {
      int done = 0;
      TNT_CHECK_GOTO(t->ops->test(t, &sreq[nsdone % (size_t)depth], &done), st, fail);
      if (!done) break;
      nsdone++;
      progress = 1;
    }
    if (progress) {
      idle = 0;
      continue;
    }
    if ((++idle & 63u) == 63u) {
      const tnt__xreq_t *late = nrdone < nrpost ? &rreq[nrdone % (size_t)depth]
                                                : &sreq[nsdone % (size_t)depth];
      char what[48];
      snprintf(what, sizeof what, "rank %d (%s)", t->world_ranks[late->peer],
               late->is_recv ? "receive" : "send");
      TNT_CHECK_GOTO(tnt__wait_check(w, &warned, what), st, fail);
    }
    tnt__spin_pause(idle);
  }
  goto out;
fail:
  for (int i = 0; i < 2 * depth; ++i) {
    if (rreq[i].active) t->ops->cancel(t, &rreq[i]);
  }
out:
  free(tmp);
  free(rreq);
  free(rpos);
  return st;
}

static int ring_usable(const tnt__comm_t *c) {
  (void)c;
  return 1;
}

static tnt_status_t ring_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const tnt__wait_ctx_t *w) {
  if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * tnt__dtype_size(dtype));
  return tnt__ring_allreduce(c->t, &c->ring, recvbuf, count, dtype, op, w);
}

const tnt__algo_t tnt__allreduce_ring = {
    .name = "ring",
    .description = "pipelined ring reduce-scatter then allgather; bandwidth-optimal across hosts",
    .usable = ring_usable,
    .fn.allreduce = ring_allreduce,
};
