/*
 * Ring allreduce: a reduce-scatter followed by an allgather, each of n - 1
 * steps in which every rank sends one chunk to its right neighbour and
 * receives one from its left. Every rank sends 2(n-1)/n of the vector, the
 * minimum for an allreduce, so this is the algorithm for large messages
 * between hosts. Each chunk is reduced by one chain in a fixed order and
 * then copied, so all ranks get identical bits.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

tnt_status_t tnt__ring_allreduce(tnt__transport_t *t, void *buf, size_t count, tnt_dtype_t dtype,
                                 tnt_op_t op, const tnt__wait_ctx_t *w) {
  const int n = t->size, r = t->rank;
  const size_t esz = tnt__dtype_size(dtype);
  uint8_t *data = buf;
  if (n == 1 || count == 0) {
    tnt__reduce_finish(buf, count, dtype, op, n);
    return TNT_OK;
  }
  size_t lo, hi;
  tnt__slice(count, esz, n, 0, &lo, &hi);
  uint8_t *tmp = malloc((hi - lo) * esz + 1);
  if (tmp == NULL) return TNT_ERR_NO_MEMORY;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  tnt_status_t st = TNT_OK;

  /* Reduce-scatter: after step k, chunk (r - k - 1) holds k + 2 inputs. */
  for (int k = 0; k < n - 1; ++k) {
    size_t slo, shi, rlo, rhi;
    tnt__slice(count, esz, n, (r - k + n) % n, &slo, &shi);
    tnt__slice(count, esz, n, (r - k - 1 + n) % n, &rlo, &rhi);
    TNT_CHECK_GOTO(tnt__xsendrecv(t, data + slo * esz, (shi - slo) * esz, right, tmp,
                                  (rhi - rlo) * esz, left, w),
                   st, out);
    tnt__reduce(data + rlo * esz, tmp, rhi - rlo, dtype, op);
  }
  /* This rank now owns the complete chunk (r + 1). */
  size_t olo, ohi;
  tnt__slice(count, esz, n, (r + 1) % n, &olo, &ohi);
  tnt__reduce_finish(data + olo * esz, ohi - olo, dtype, op, n);

  /* Allgather: pass the finished chunks around the ring. */
  for (int k = 0; k < n - 1; ++k) {
    size_t slo, shi, rlo, rhi;
    tnt__slice(count, esz, n, (r + 1 - k + n) % n, &slo, &shi);
    tnt__slice(count, esz, n, (r - k + n) % n, &rlo, &rhi);
    TNT_CHECK_GOTO(tnt__xsendrecv(t, data + slo * esz, (shi - slo) * esz, right,
                                  data + rlo * esz, (rhi - rlo) * esz, left, w),
                   st, out);
  }
out:
  free(tmp);
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
  return tnt__ring_allreduce(c->t, recvbuf, count, dtype, op, w);
}

const tnt__algo_t tnt__allreduce_ring = {
    .name = "ring",
    .description = "ring reduce-scatter then allgather; bandwidth-optimal across hosts",
    .usable = ring_usable,
    .fn.allreduce = ring_allreduce,
};
