/*
 * Shared-memory allreduce for the members of one host (groups that span
 * hosts use allreduce_hier.c).
 *
 * The vector is processed in segments of one slot. Per segment, each rank
 *   1. copies its input (all but its own slice) into its slot,
 *   2. waits until every rank has done so (counter 0),
 *   3. reduces its own slice: reads that slice from every rank's slot (its
 *      own from its input buffer), combines in rank order, writes the result
 *      into the slice of its own slot,
 *   4. waits until every slice is reduced (counter 1),
 *   5. copies every slice of the result to its output.
 * Each byte crosses memory about three times, against 2(n-1) network steps
 * for a ring, and the combine order is fixed, so every rank gets identical
 * bits on every run. Two slots alternate so that writing segment s+1 does
 * not disturb ranks still reading segment s; a rank writes a slot only after
 * every rank has announced (counter 0) that it finished reading the round
 * that used the slot before.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

/* Up to this many bytes read per rank, small vectors skip the slicing. */
#define TNT__SHM_WHOLE_MAX_BYTES (32u * 1024u)

static int shm_usable(const tnt__comm_t *c) {
  return c->shm != NULL && c->num_hosts == 1;
}

static tnt_status_t shm_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                  const tnt__wait_ctx_t *w) {
  const size_t esz = tnt__dtype_size(dtype);
  const size_t per_slot = c->shm_slot_bytes / esz;
  const int nloc = c->local_size, me = c->local_rank;
  const uint8_t *src = sendbuf;
  uint8_t *dst = recvbuf;
  const void *stack_srcs[16];
  const void **srcs = stack_srcs;
  tnt_status_t st = TNT_OK;
  if (nloc > 16) {
    srcs = malloc((size_t)nloc * sizeof *srcs);
    if (srcs == NULL) return TNT_ERR_NO_MEMORY;
  }
  /* Small vectors on one host: every rank combines the whole vector from
   * all slots itself. Reading n * nloc elements is cheaper than the second
   * wait of the sliced scheme, and the combine order is still rank order. */
  if (count > 0 && count * esz <= c->shm_slot_bytes &&
      count * esz * (size_t)nloc <= TNT__SHM_WHOLE_MAX_BYTES) {
    uint64_t seq;
    TNT_CHECK_GOTO(tnt__shm_round_begin(c, w, &seq), st, out);
    const int slot = (int)(seq & 1u);
    memcpy(tnt__shm_slot(c, me, slot), src, count * esz);
    tnt__shm_publish(c, 0, seq);
    TNT_CHECK_GOTO(tnt__shm_wait_all(c, 0, seq, w), st, out);
    for (int q = 0; q < nloc; ++q) srcs[q] = tnt__shm_slot(c, q, slot);
    tnt__reduce_many(dst, srcs, nloc, count, dtype, op, c->size);
    goto out;
  }
  for (size_t off = 0; off < count; off += per_slot) {
    const size_t n = TNT__MIN(per_slot, count - off);
    uint64_t seq;
    TNT_CHECK_GOTO(tnt__shm_round_begin(c, w, &seq), st, out);
    const int slot = (int)(seq & 1u);
    uint8_t *mine = tnt__shm_slot(c, me, slot);
    size_t lo, hi;
    tnt__slice(n, esz, nloc, me, &lo, &hi);
    memcpy(mine, src + off * esz, lo * esz);
    memcpy(mine + hi * esz, src + (off + hi) * esz, (n - hi) * esz);
    tnt__shm_publish(c, 0, seq);
    TNT_CHECK_GOTO(tnt__shm_wait_all(c, 0, seq, w), st, out);

    if (hi > lo) {
      for (int q = 0; q < nloc; ++q) srcs[q] = tnt__shm_slot(c, q, slot) + lo * esz;
      srcs[me] = src + (off + lo) * esz;
      tnt__reduce_many(mine + lo * esz, srcs, nloc, hi - lo, dtype, op, c->size);
    }
    tnt__shm_publish(c, 1, seq);
    TNT_CHECK_GOTO(tnt__shm_wait_all(c, 1, seq, w), st, out);

    for (int q = 0; q < nloc; ++q) {
      size_t qlo, qhi;
      tnt__slice(n, esz, nloc, q, &qlo, &qhi);
      memcpy(dst + (off + qlo) * esz, tnt__shm_slot(c, q, slot) + qlo * esz, (qhi - qlo) * esz);
    }
  }
out:
  if (srcs != stack_srcs) free(srcs);
  return st;
}

/* The reduce-scatter: in each round every rank writes the next piece of
 * every other rank's block (a slot holds one piece per rank), and each rank
 * combines the piece of its own block from every slot, in rank order as the
 * allreduce does, so its block has the allreduce's bits. Every rank combines
 * in every round: no rank waits while one block is reduced. */
static tnt_status_t shm_reduce_scatter(tnt__comm_t *c, void *buf, const size_t *bounds,
                                       tnt_dtype_t dtype, tnt_op_t op, const tnt__wait_ctx_t *w) {
  const size_t esz = tnt__dtype_size(dtype);
  const size_t line = 64 / esz ? 64 / esz : 1;
  const int nloc = c->local_size, me = c->local_rank;
  uint8_t *data = buf;
  /* On one host the local ranks are the group's ranks. */
  size_t piece = c->shm_slot_bytes / esz / (size_t)nloc;
  piece = piece >= line ? piece / line * line : TNT__MAX(piece, (size_t)1);
  size_t largest = 0;
  for (int q = 0; q < nloc; ++q) largest = TNT__MAX(largest, bounds[q + 1] - bounds[q]);
  const void *stack_srcs[16];
  const void **srcs = stack_srcs;
  if (nloc > 16) {
    srcs = malloc((size_t)nloc * sizeof *srcs);
    if (srcs == NULL) return TNT_ERR_NO_MEMORY;
  }
  tnt_status_t st = TNT_OK;
  for (size_t off = 0; off < largest; off += piece) {
    uint64_t seq;
    TNT_CHECK_GOTO(tnt__shm_round_begin(c, w, &seq), st, out);
    const int slot = (int)(seq & 1u);
    uint8_t *mine = tnt__shm_slot(c, me, slot);
    for (int q = 0; q < nloc; ++q) {
      const size_t len = bounds[q + 1] - bounds[q];
      if (q == me || len <= off) continue;
      memcpy(mine + (size_t)q * piece * esz, data + (bounds[q] + off) * esz,
             TNT__MIN(piece, len - off) * esz);
    }
    tnt__shm_publish(c, 0, seq);
    TNT_CHECK_GOTO(tnt__shm_wait_all(c, 0, seq, w), st, out);
    const size_t len = bounds[me + 1] - bounds[me];
    if (len > off) {
      uint8_t *dst = data + (bounds[me] + off) * esz;
      for (int q = 0; q < nloc; ++q) srcs[q] = tnt__shm_slot(c, q, slot) + (size_t)me * piece * esz;
      srcs[me] = dst;
      tnt__reduce_many(dst, srcs, nloc, TNT__MIN(piece, len - off), dtype, op, c->size);
    }
  }
out:
  if (srcs != stack_srcs) free(srcs);
  return st;
}

const tnt__algo_t tnt__allreduce_shm = {
    .name = "shm",
    .description = "shared-memory reduce of disjoint slices, on one host",
    .usable = shm_usable,
    .fn.allreduce = shm_allreduce,
    .reduce_scatter = shm_reduce_scatter,
};
