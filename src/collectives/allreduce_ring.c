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
 * before it. In both phases the chunk sent in step k is (r - k - 1) mod n
 * and the chunk received is (r - k - 2) mod n.
 *
 * Each chunk is reduced by one chain in a fixed order (chunk q starts at
 * rank q + 1 and passes ranks q + 2, q + 3, ..., ending at rank q) and then
 * copied, so all ranks get identical bits, whatever the segment size or the
 * timing. Ending chunk r on rank r makes the first phase a reduce-scatter
 * of the chunk partition: tnt__reduce_scatter runs it alone, and its block r
 * is bitwise the allreduce's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

typedef tnt__ring_run_t ring_t;
typedef tnt__ring_pos_t ring_pos_t;

/* The chunk that is sent (recv == 0) or received (recv == 1) in step k. */
static void ring_chunk(const ring_t *g, int k, int recv, size_t *lo, size_t *hi) {
  const int q = ((g->r - k - recv - 1) % g->n + g->n) % g->n;
  if (g->bounds == NULL) {
    tnt__slice(g->count, g->esz, g->n, q, lo, hi);
  } else {
    *lo = g->bounds[q];
    *hi = g->bounds[q + 1];
  }
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

tnt_status_t tnt__ring_start(ring_t *g, tnt__transport_t *t, const tnt__ring_cfg_t *cfg, void *buf,
                             size_t count, tnt_dtype_t dtype, tnt_op_t op, const size_t *bounds,
                             int scatter) {
  const int n = t->size;
  const size_t esz = tnt__dtype_size(dtype);
  *g = (ring_t){.t = t,
                .data = buf,
                .bounds = bounds,
                .count = count,
                .esz = esz,
                .dtype = dtype,
                .op = op,
                .n = n,
                .r = t->rank,
                .steps = (scatter ? 1 : 2) * (n - 1),
                .depth = cfg->depth,
                .right = (t->rank + 1) % n,
                .left = (t->rank + n - 1) % n};
  if (n == 1 || count == 0) {
    tnt__reduce_finish(buf, count, dtype, op, n);
    g->done = 1;
    return TNT_OK;
  }
  g->seg = cfg->segment_bytes / esz > 0 ? cfg->segment_bytes / esz : 1;
  /* Received segments of the reduce-scatter wait in one of `depth` slots
   * until they are reduced; the allgather receives in place. */
  g->tmp = malloc((size_t)g->depth * g->seg * esz);
  g->rreq = calloc((size_t)g->depth * 2, sizeof *g->rreq);
  g->rpos = malloc((size_t)g->depth * sizeof *g->rpos);
  if (g->tmp == NULL || g->rreq == NULL || g->rpos == NULL) {
    tnt__ring_end(g);
    return TNT_ERR_NO_MEMORY;
  }
  g->sreq = g->rreq + g->depth;
  g->rpost = g->rdone = ring_first(g, 1);
  g->spost = ring_first(g, 0);
  return TNT_OK;
}

tnt_status_t tnt__ring_progress(ring_t *g, int *progress) {
  *progress = 0;
  if (g->done) return TNT_OK;
  tnt__transport_t *t = g->t;
  const size_t depth = (size_t)g->depth, esz = g->esz;
  const int last_rs = g->n - 2; /* the step after which a rank owns a reduced chunk */
  while (g->rpost.k < g->steps && g->nrpost - g->nrdone < depth) {
    size_t lo, hi;
    ring_segment(g, g->rpost, 1, &lo, &hi);
    const size_t i = g->nrpost % depth;
    uint8_t *dst = g->rpost.k <= last_rs ? g->tmp + i * g->seg * esz : g->data + lo * esz;
    TNT_CHECK(
        t->ops->irecv(t, TNT__CH_COLL, dst, (hi - lo) * esz, g->left, TNT__COLL_TAG, &g->rreq[i]));
    g->rpos[i] = g->rpost;
    ring_advance(g, &g->rpost, 1);
    g->nrpost++;
    *progress = 1;
  }
  while (g->spost.k < g->steps && g->nspost - g->nsdone < depth &&
         ring_send_ready(g->spost, g->rdone)) {
    size_t lo, hi;
    ring_segment(g, g->spost, 0, &lo, &hi);
    TNT_CHECK(t->ops->isend(t, TNT__CH_COLL, g->data + lo * esz, (hi - lo) * esz, g->right,
                            TNT__COLL_TAG, &g->sreq[g->nspost % depth]));
    ring_advance(g, &g->spost, 0);
    g->nspost++;
    *progress = 1;
  }
  /* Receives complete in the order they were posted (one source, one
   * tag), so the oldest is the one to test. */
  while (g->nrdone < g->nrpost) {
    const size_t i = g->nrdone % depth;
    int done = 0;
    TNT_CHECK(t->ops->test(t, &g->rreq[i], &done));
    if (!done) break;
    if (g->rpos[i].k <= last_rs) {
      size_t lo, hi;
      ring_segment(g, g->rpos[i], 1, &lo, &hi);
      tnt__reduce(g->data + lo * esz, g->tmp + i * g->seg * esz, hi - lo, g->dtype, g->op);
      if (g->rpos[i].k == last_rs) {
        tnt__reduce_finish(g->data + lo * esz, hi - lo, g->dtype, g->op, g->n);
      }
    }
    ring_advance(g, &g->rdone, 1);
    g->nrdone++;
    *progress = 1;
  }
  while (g->nsdone < g->nspost) {
    int done = 0;
    TNT_CHECK(t->ops->test(t, &g->sreq[g->nsdone % depth], &done));
    if (!done) break;
    g->nsdone++;
    *progress = 1;
  }
  g->done = g->rdone.k >= g->steps && g->spost.k >= g->steps && g->nsdone == g->nspost;
  return TNT_OK;
}

tnt_status_t tnt__ring_wait(ring_t *g, const tnt__wait_ctx_t *w) {
  int warned = 0;
  unsigned idle = 0;
  while (!g->done) {
    int progress;
    TNT_CHECK(tnt__ring_progress(g, &progress));
    if (progress) {
      idle = 0;
      continue;
    }
    if ((++idle & 63u) == 63u) {
      const tnt__xreq_t *late = g->nrdone < g->nrpost ? &g->rreq[g->nrdone % (size_t)g->depth]
                                                      : &g->sreq[g->nsdone % (size_t)g->depth];
      char what[48];
      snprintf(what, sizeof what, "rank %d (%s)", g->t->world_ranks[late->peer],
               late->is_recv ? "receive" : "send");
      TNT_CHECK(tnt__wait_check(w, &warned, what));
    }
    tnt__spin_pause(idle);
  }
  return TNT_OK;
}

void tnt__ring_end(ring_t *g) {
  if (g->rreq != NULL) {
    for (int i = 0; i < 2 * g->depth; ++i) {
      if (g->rreq[i].active) g->t->ops->cancel(g->t, &g->rreq[i]);
    }
  }
  free(g->tmp);
  free(g->rreq);
  free(g->rpos);
  g->tmp = NULL;
  g->rreq = g->sreq = NULL;
  g->rpos = NULL;
}

/* The ring over every member of c, in place on buf, to the end. */
static tnt_status_t ring_run(tnt__comm_t *c, void *buf, size_t count, tnt_dtype_t dtype,
                             tnt_op_t op, const size_t *bounds, int scatter,
                             const tnt__wait_ctx_t *w) {
  ring_t g;
  tnt_status_t st = tnt__ring_start(&g, c->t, &c->ring, buf, count, dtype, op, bounds, scatter);
  if (st < 0) return st;
  st = tnt__ring_wait(&g, w);
  tnt__ring_end(&g);
  return st;
}

static int ring_usable(const tnt__comm_t *c) {
  (void)c;
  return 1;
}

static tnt_status_t ring_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                   tnt_dtype_t dtype, tnt_op_t op, const tnt__wait_ctx_t *w) {
  if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * tnt__dtype_size(dtype));
  return ring_run(c, recvbuf, count, dtype, op, NULL, 0, w);
}

static tnt_status_t ring_reduce_scatter(tnt__comm_t *c, void *buf, const size_t *bounds,
                                        tnt_dtype_t dtype, tnt_op_t op, const tnt__wait_ctx_t *w) {
  return ring_run(c, buf, bounds[c->size], dtype, op, bounds, 1, w);
}

const tnt__algo_t tnt__allreduce_ring = {
    .name = "ring",
    .description = "pipelined ring reduce-scatter then allgather; bandwidth-optimal across hosts",
    .usable = ring_usable,
    .fn.allreduce = ring_allreduce,
    .reduce_scatter = ring_reduce_scatter,
};
