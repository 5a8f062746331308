/*
 * Hierarchical allreduce, for groups that span hosts which hold several
 * ranks each (the same number on every host):
 *   1. within each host, the members' vectors are summed through shared
 *      memory into the vector of the host's first member (its leader), one
 *      slot-sized segment per round: every rank reduces its own slice of
 *      the segment from all slots, in rank order, and the leader gathers
 *      the slices;
 *   2. the leaders run the pipelined ring across hosts over the whole
 *      vector (allreduce_ring.c), so the network carries each host's data
 *      once instead of once per rank, and the link stays busy from the first
 *      segment to the last;
 *   3. each leader broadcasts the result within its host through shared
 *      memory (broadcast_shm.c).
 * The combine order is fixed (rank order within a host, the ring's chain
 * across hosts), and every member copies its leader's bits, so all ranks get
 * identical results on every run. With two hosts the result equals the
 * serial reduction (host 0's sum) (op) (host 1's sum).
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

static int hier_usable(const tnt__comm_t *c) {
  return c->shm != NULL && c->num_hosts > 1 && c->cross != NULL && c->local_size > 1;
}

/* Step 1: the host's sum (op) of every member's `src` lands in the leader's
 * `dst`. The other members' `dst` is left alone. */
static tnt_status_t host_reduce(tnt__comm_t *c, const uint8_t *src, uint8_t *dst, size_t count,
                                tnt_dtype_t dtype, tnt_op_t op, const void **srcs,
                                const tnt__wait_ctx_t *w) {
  const size_t esz = tnt__dtype_size(dtype);
  const size_t per_slot = c->shm_slot_bytes / esz;
  const int nloc = c->local_size, me = c->local_rank;
  for (size_t off = 0; off < count; off += per_slot) {
    const size_t n = TNT__MIN(per_slot, count - off);
    uint64_t seq;
    TNT_CHECK(tnt__shm_round_begin(c, w, &seq));
    const int slot = (int)(seq & 1u);
    uint8_t *mine = tnt__shm_slot(c, me, slot);
    size_t lo, hi;
    tnt__slice(n, esz, nloc, me, &lo, &hi);
    memcpy(mine, src + off * esz, lo * esz);
    memcpy(mine + hi * esz, src + (off + hi) * esz, (n - hi) * esz);
    tnt__shm_publish(c, 0, seq);
    TNT_CHECK(tnt__shm_wait_all(c, 0, seq, w));
    if (hi > lo) {
      for (int q = 0; q < nloc; ++q) srcs[q] = tnt__shm_slot(c, q, slot) + lo * esz;
      srcs[me] = src + (off + lo) * esz;
      tnt__reduce_many(mine + lo * esz, srcs, nloc, hi - lo, dtype, op, c->size);
    }
    tnt__shm_publish(c, 1, seq);
    if (me != 0) continue;
    /* The leader reads the slots of this round before it publishes counter
     * 0 of the next one, as tnt__shm_round_begin requires. */
    TNT_CHECK(tnt__shm_wait_all(c, 1, seq, w));
    for (int q = 0; q < nloc; ++q) {
      size_t qlo, qhi;
      tnt__slice(n, esz, nloc, q, &qlo, &qhi);
      memcpy(dst + (off + qlo) * esz, tnt__shm_slot(c, q, slot) + qlo * esz, (qhi - qlo) * esz);
    }
  }
  return TNT_OK;
}

static tnt_status_t hier_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const tnt__wait_ctx_t *w) {
  /* The average is taken once, by the leaders, after the host sums are
   * combined; the other operations combine the same way at both levels. */
  const tnt_op_t sum_op = op == TNT_AVERAGE ? TNT_SUM : op;
  const void *stack_srcs[16];
  const void **srcs = stack_srcs;
  if (c->local_size > 16) {
    srcs = malloc((size_t)c->local_size * sizeof *srcs);
    if (srcs == NULL) return TNT_ERR_NO_MEMORY;
  }
  tnt_status_t st = host_reduce(c, sendbuf, recvbuf, count, dtype, sum_op, srcs, w);
  if (srcs != stack_srcs) free(srcs);
  if (st < 0) return st;
  if (c->local_rank == 0) {
    TNT_CHECK(tnt__ring_allreduce(c->cross, &c->ring, recvbuf, count, dtype, sum_op, w));
    tnt__reduce_finish(recvbuf, count, dtype, op, c->size);
  }
  return tnt__broadcast_shm.fn.broadcast(c, recvbuf, count * tnt__dtype_size(dtype), 0, w);
}

const tnt__algo_t tnt__allreduce_hier = {
    .name = "hier",
    .description = "shared-memory reduce on each host, pipelined ring among host leaders, "
                   "shared-memory broadcast",
    .usable = hier_usable,
    .fn.allreduce = hier_allreduce,
};
