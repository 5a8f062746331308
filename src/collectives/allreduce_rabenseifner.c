/*
 * Rabenseifner's allreduce: a reduce-scatter by recursive halving followed
 * by an allgather by recursive doubling. Each rank sends 2(p-1)/p of the
 * vector, as the ring does, but in 2 log2(p) exchanges instead of 2(p-1):
 * the algorithm for medium messages among many hosts, where the ring's
 * steps each pay a network latency (see algorithms.c for the choice).
 *
 * The p participants are the largest power of two p <= n ranks. The first
 * 2 * extra ranks (extra = n - p) pair up first, as in recursive doubling:
 * even ones hand their vector to the odd one next to them, sit out, and
 * receive the result at the end.
 *
 * Reduce-scatter: the vector is cut into p even blocks. In the
 * exchange with the partner at distance d = p/2, p/4, ..., 1, the two
 * partners split the range of blocks they still hold: the one whose bit d
 * is clear keeps the lower half, the other the upper half; each sends the
 * half it gives up and adds the partner's copy of the half it keeps. After
 * the last exchange participant v holds the sum of block v over all ranks.
 * Allgather: the same exchanges in reverse order (d = 1, 2, ..., p/2), each
 * partner sending the range it holds, so that all end with every block.
 *
 * Each exchange moves its halves in the ring's segments, several in flight
 * each way (tnt__xsendrecv_pieces): as one message each, they used one
 * direction of a link at a time (4 hosts at 1 Gbit/s: half the ring's bus
 * bandwidth).
 *
 * Each element is summed on exactly one rank, in a fixed binary-tree order
 * (which depends only on n), and then copied, so every rank gets identical
 * bits on every run. Since the split decides only where an element is
 * summed, the reduce-scatter (the fold and the halving alone, on blocks cut
 * at the reduce-scatter's block bounds) gives the allreduce's bits.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

static int rabenseifner_usable(const tnt__comm_t *c) {
  (void)c;
  return 1;
}

/* The first element of block i of p: an even split of the count, each
 * start rounded down to a whole cache line while blocks are at least a line
 * long. Shorter blocks start anywhere: rounded to lines, most of them would
 * be empty and the first exchange would carry the whole vector instead of
 * half (1024 ranks and 32 KiB of floats: 8 per block). The blocks only
 * decide who adds which elements, not in what order, so the bits are the
 * same for any split. */
static size_t block_start(size_t count, size_t esz, int p, int i) {
  const size_t line = 64 / esz ? 64 / esz : 1, np = (size_t)p, ni = (size_t)i;
  if (i >= p) return count;
  const size_t start = count / np * ni + count % np * ni / np; /* floor(count i / p) */
  return count / np >= line ? start / line * line : start;
}

/* Recursive halving over the p blocks that start at starts[0..p-1]
 * (starts[p]: the count): on return participant v holds block v, reduced
 * over every participant, and *b0 = v, *b1 = v + 1. */
static tnt_status_t halving(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp, const size_t *starts,
                            tnt_dtype_t dtype, tnt_op_t op, int p, int extra, int v, int *b0,
                            int *b1, const tnt__ring_cfg_t *pieces, const tnt__wait_ctx_t *w) {
  const size_t esz = tnt__dtype_size(dtype);
  *b0 = 0, *b1 = p; /* the blocks this participant holds */
  for (int d = p / 2; d >= 1; d /= 2) {
    const int peer = tnt__participant_rank(v ^ d, extra), mid = *b0 + (*b1 - *b0) / 2;
    const int keep_lower = (v & d) == 0;
    const size_t klo = starts[keep_lower ? *b0 : mid], khi = starts[keep_lower ? mid : *b1];
    const size_t slo = starts[keep_lower ? mid : *b0], shi = starts[keep_lower ? *b1 : mid];
    TNT_CHECK(tnt__xsendrecv_pieces(t, buf + slo * esz, (shi - slo) * esz, peer, tmp,
                                    (khi - klo) * esz, peer, pieces->segment_bytes,
                                    pieces->depth, w));
    tnt__reduce(buf + klo * esz, tmp, khi - klo, dtype, op);
    if (keep_lower) *b1 = mid;
    else *b0 = mid;
  }
  return TNT_OK;
}

/* Recursive doubling of the blocks [b0, b1) that halving left. */
static tnt_status_t doubling(tnt__transport_t *t, uint8_t *buf, const size_t *starts, size_t esz,
                             int p, int extra, int v, int b0, int b1,
                             const tnt__ring_cfg_t *pieces, const tnt__wait_ctx_t *w) {
  for (int d = 1; d < p; d *= 2) {
    const int peer = tnt__participant_rank(v ^ d, extra), width = b1 - b0;
    /* The partner holds the neighbouring range of the same width. */
    const int p0 = (v & d) == 0 ? b1 : b0 - width;
    const size_t mlo = starts[b0], mhi = starts[b1];
    const size_t plo = starts[p0], phi = starts[p0 + width];
    TNT_CHECK(tnt__xsendrecv_pieces(t, buf + mlo * esz, (mhi - mlo) * esz, peer,
                                    buf + plo * esz, (phi - plo) * esz, peer,
                                    pieces->segment_bytes, pieces->depth, w));
    if (p0 < b0) b0 = p0;
    else b1 = p0 + width;
  }
  return TNT_OK;
}

tnt_status_t tnt__rabenseifner_exchanges(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp,
                                         size_t count, tnt_dtype_t dtype, tnt_op_t op, int p,
                                         int extra, int v, const tnt__ring_cfg_t *pieces,
                                         const tnt__wait_ctx_t *w) {
  const size_t esz = tnt__dtype_size(dtype);
  size_t *starts = malloc(((size_t)p + 1) * sizeof *starts);
  if (starts == NULL) return TNT_ERR_NO_MEMORY;
  for (int i = 0; i <= p; ++i) starts[i] = block_start(count, esz, p, i);
  int b0, b1;
  tnt_status_t st = halving(t, buf, tmp, starts, dtype, op, p, extra, v, &b0, &b1, pieces, w);
  if (st == TNT_OK) st = doubling(t, buf, starts, esz, p, extra, v, b0, b1, pieces, w);
  free(starts);
  return st;
}

static tnt_status_t rabenseifner_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                           size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                           const tnt__wait_ctx_t *w) {
  return tnt__allreduce_folded(c->t, sendbuf, recvbuf, count, dtype, op,
                               tnt__rabenseifner_exchanges, &c->ring, w);
}

/* The allreduce's fold and halving, with participant v's block made of the
 * blocks of the ranks it stands for (2v and 2v + 1 for v < extra, else
 * v + extra); the odd rank of a pair then hands its partner its block. */
static tnt_status_t rabenseifner_reduce_scatter(tnt__comm_t *c, void *buf, const size_t *bounds,
                                                tnt_dtype_t dtype, tnt_op_t op,
                                                const tnt__wait_ctx_t *w) {
  tnt__transport_t *t = c->t;
  const int n = t->size, r = t->rank;
  const size_t esz = tnt__dtype_size(dtype), count = bounds[n];
  uint8_t *data = buf;
  if (n == 1 || count == 0) {
    tnt__reduce_finish(buf, count, dtype, op, n);
    return TNT_OK;
  }
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  uint8_t *tmp = malloc(count * esz);
  size_t *starts = malloc(((size_t)p + 1) * sizeof *starts);
  tnt_status_t st = TNT_OK;
  if (tmp == NULL || starts == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto out;
  }
  for (int i = 0; i < p; ++i) starts[i] = bounds[i < extra ? 2 * i : i + extra];
  starts[p] = count;
  int v, b0, b1;
  TNT_CHECK_GOTO(tnt__fold_in(t, data, tmp, count, dtype, op, extra, &v, w), st, out);
  if (v < 0) { /* sits out */
    TNT_CHECK_GOTO(
        tnt__xrecv(t, data + bounds[r] * esz, (bounds[r + 1] - bounds[r]) * esz, r + 1, w), st,
        out);
    goto out;
  }
  TNT_CHECK_GOTO(halving(t, data, tmp, starts, dtype, op, p, extra, v, &b0, &b1, &c->ring, w), st,
                 out);
  tnt__reduce_finish(data + starts[v] * esz, starts[v + 1] - starts[v], dtype, op, n);
  if (r < 2 * extra) {
    TNT_CHECK_GOTO(tnt__xsend(t, data + bounds[r - 1] * esz,
                              (bounds[r] - bounds[r - 1]) * esz, r - 1, w),
                   st, out);
  }
out:
  free(tmp);
  free(starts);
  return st;
}

const tnt__algo_t tnt__allreduce_rabenseifner = {
    .name = "rabenseifner",
    .description = "recursive halving then doubling; ring-like traffic in 2 log2(n) steps, for "
                   "medium messages across many hosts",
    .usable = rabenseifner_usable,
    .fn.allreduce = rabenseifner_allreduce,
    .reduce_scatter = rabenseifner_reduce_scatter,
};
