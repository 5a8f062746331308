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

tnt_status_t tnt__rd_allreduce(tnt__transport_t *t, void *recvbuf, size_t count,
                               tnt_dtype_t dtype, tnt_op_t op, const tnt__wait_ctx_t *w) {
  const int n = t->size, r = t->rank;
  const size_t bytes = count * tnt__dtype_size(dtype);
  if (n == 1 || count == 0) {
    tnt__reduce_finish(recvbuf, count, dtype, op, n);
    return TNT_OK;
  }
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  uint8_t *tmp = malloc(bytes);
  if (tmp == NULL) return TNT_ERR_NO_MEMORY;
  tnt_status_t st = TNT_OK;
  int vr; /* rank among the p2 participants, -1 when sitting out */
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      TNT_CHECK_GOTO(tnt__xsend(t, recvbuf, bytes, r + 1, w), st, out);
      vr = -1;
    } else {
      TNT_CHECK_GOTO(tnt__xrecv(t, tmp, bytes, r - 1, w), st, out);
      tnt__reduce(recvbuf, tmp, count, dtype, op);
      vr = r / 2;
    }
  } else {
    vr = r - extra;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      int vp = vr ^ mask;
      int peer = vp < extra ? vp * 2 + 1 : vp + extra;
      TNT_CHECK_GOTO(tnt__xsendrecv(t, recvbuf, bytes, peer, tmp, bytes, peer, w), st, out);
      tnt__reduce(recvbuf, tmp, count, dtype, op);
    }
    tnt__reduce_finish(recvbuf, count, dtype, op, n);
    if (r < 2 * extra) TNT_CHECK_GOTO(tnt__xsend(t, recvbuf, bytes, r - 1, w), st, out);
  } else {
    TNT_CHECK_GOTO(tnt__xrecv(t, recvbuf, bytes, r + 1, w), st, out);
  }
out:
  free(tmp);
  return st;
}

static tnt_status_t rd_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                 size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                 const tnt__wait_ctx_t *w) {
  if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * tnt__dtype_size(dtype));
  return tnt__rd_allreduce(c->t, recvbuf, count, dtype, op, w);
}

const tnt__algo_t tnt__allreduce_rd = {
    .name = "rd",
    .description = "recursive doubling; fewest steps, for small messages across hosts",
    .usable = rd_usable,
    .fn.allreduce = rd_allreduce,
};
