/*
 * Recursive-doubling allreduce: log2(n) exchanges of the whole vector with
 * partners at distance 1, 2, 4, ... It minimizes latency, so it serves
 * small messages between hosts. For a size that is not a power of two, the
 * first 2 * extra ranks pair up: even ones hand their data to the odd one
 * next to them, sit out, and receive the result at the end.
 *
 * Both partners of an exchange combine the same two values, and every
 * operation is commutative, so every rank ends with identical bits.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

static int rd_usable(const tnt__comm_t *c) {
  (void)c;
  return 1;
}

int tnt__participant_rank(int v, int extra) { return v < extra ? v * 2 + 1 : v + extra; }

tnt_status_t tnt__fold_in(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp, size_t count,
                          tnt_dtype_t dtype, tnt_op_t op, int extra, int *v,
                          const tnt__wait_ctx_t *w) {
  const int r = t->rank;
  const size_t bytes = count * tnt__dtype_size(dtype);
  if (r < 2 * extra && r % 2 == 0) {
    *v = -1;
    return tnt__xsend(t, buf, bytes, r + 1, w);
  }
  if (r < 2 * extra) {
    TNT_CHECK(tnt__xrecv(t, tmp, bytes, r - 1, w));
    tnt__reduce(buf, tmp, count, dtype, op);
  }
  *v = r < 2 * extra ? r / 2 : r - extra;
  return TNT_OK;
}

tnt_status_t tnt__allreduce_folded(tnt__transport_t *t, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   tnt__participants_fn among, const tnt__ring_cfg_t *pieces,
                                   const tnt__wait_ctx_t *w) {
  const int n = t->size, r = t->rank;
  const size_t bytes = count * tnt__dtype_size(dtype);
  if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, bytes);
  if (n == 1 || count == 0) {
    tnt__reduce_finish(recvbuf, count, dtype, op, n);
    return TNT_OK;
  }
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  uint8_t *tmp = malloc(bytes);
  if (tmp == NULL) return TNT_ERR_NO_MEMORY;
  tnt_status_t st = TNT_OK;
  int v;
  TNT_CHECK_GOTO(tnt__fold_in(t, recvbuf, tmp, count, dtype, op, extra, &v, w), st, out);
  if (v < 0) { /* sits out */
    TNT_CHECK_GOTO(tnt__xrecv(t, recvbuf, bytes, r + 1, w), st, out);
    goto out;
  }
  TNT_CHECK_GOTO(among(t, recvbuf, tmp, count, dtype, op, p, extra, v, pieces, w), st, out);
  tnt__reduce_finish(recvbuf, count, dtype, op, n);
  if (r < 2 * extra) TNT_CHECK_GOTO(tnt__xsend(t, recvbuf, bytes, r - 1, w), st, out);
out:
  free(tmp);
  return st;
}

/* Exchanges of the whole vector with the participants at distance 1, 2, 4...
 * (small vectors: they travel whole). */
tnt_status_t tnt__rd_exchanges(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp, size_t count,
                               tnt_dtype_t dtype, tnt_op_t op, int p, int extra, int v,
                               const tnt__ring_cfg_t *pieces, const tnt__wait_ctx_t *w) {
  (void)pieces;
  const size_t bytes = count * tnt__dtype_size(dtype);
  for (int mask = 1; mask < p; mask <<= 1) {
    const int peer = tnt__participant_rank(v ^ mask, extra);
    TNT_CHECK(tnt__xsendrecv(t, buf, bytes, peer, tmp, bytes, peer, w));
    tnt__reduce(buf, tmp, count, dtype, op);
  }
  return TNT_OK;
}

static tnt_status_t rd_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                 size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                 const tnt__wait_ctx_t *w) {
  return tnt__allreduce_folded(c->t, sendbuf, recvbuf, count, dtype, op, tnt__rd_exchanges,
                               &c->ring, w);
}

const tnt__algo_t tnt__allreduce_rd = {
    .name = "rd",
    .description = "recursive doubling; fewest steps, for small messages across hosts",
    .usable = rd_usable,
    .fn.allreduce = rd_allreduce,
};
