/*
 * Hierarchical allreduce, for groups that span hosts which hold several
 * ranks each (the same number on every host). The vector is cut into blocks
 * of at most one shared-memory slot, and each block goes through three
 * stages:
 *   1. within each host, the members' blocks are summed through shared
 *      memory into the leader's (the host's first member) receive buffer:
 *      every rank reduces its own slice of the block from all slots, in rank
 *      order, and the leader gathers the slices;
 *   2. the leaders combine the block across hosts, so the network carries
 *      each host's data once instead of once per rank: with the pipelined
 *      ring (allreduce_ring.c), or, for blocks too small for the ring's
 *      2(hosts - 1) steps, recursive doubling or Rabenseifner's algorithm,
 *      as a group of one rank per host would choose (c->cross_allreduce);
 *   3. each leader broadcasts the block within its host through shared
 *      memory (broadcast_shm.c).
 * The stages overlap: while the ring of block b runs, the host broadcasts
 * block b - 1 and reduces block b + 1 (the leader moves the ring on from
 * inside its shared-memory waits), so the link is busy from the first
 * block's ring to the last one's, and only the first block's reduce and the
 * last one's broadcast come on top of the time on the network.
 * (Only the ring runs in the background; the other two run in the leader's
 * turn, between the host's rounds.)
 * The combine order is fixed (rank order within a host, the algorithm's
 * order across hosts, chosen by size alone), and every member copies its leader's bits, so all ranks get
 * identical results on every run. With two hosts the result equals the
 * serial reduction (host 0's sum) (op) (host 1's sum).
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/reduce.h"

/* The vector is cut into at least this many blocks, so that the first
 * block's reduce and the last block's broadcast, which no ring hides, are
 * short... */
#define HIER_MIN_BLOCKS 4
/* ...of at least this size: each block costs two more shared-memory rounds,
 * and its ring ends with the link idle while the last segments drain; on
 * 2 simulated hosts of 2 ranks at 1 Gbit/s, 256 KiB and 1 MiB blocks made
 * 1 and 2 MiB allreduces slower than one block did. */
#define HIER_MIN_BLOCK_BYTES (2u * 1024u * 1024u)

static int hier_usable(const tnt__comm_t *c) {
  return c->shm != NULL && c->num_hosts > 1 && c->cross != NULL && c->local_size > 1;
}

/* Stage 1 of one block of n <= one slot's elements: the host's sum (op) of
 * every member's `src` lands in the leader's `dst`. The other members'
 * `dst` is left alone. */
static tnt_status_t host_reduce(tnt__comm_t *c, const uint8_t *src, uint8_t *dst, size_t n,
                                tnt_dtype_t dtype, tnt_op_t op, const void **srcs,
                                const tnt__wait_ctx_t *w) {
  const size_t esz = tnt__dtype_size(dtype);
  const int nloc = c->local_size, me = c->local_rank;
  uint64_t seq;
  TNT_CHECK(tnt__shm_round_begin(c, w, &seq));
  const int slot = (int)(seq & 1u);
  uint8_t *mine = tnt__shm_slot(c, me, slot);
  size_t lo, hi;
  tnt__slice(n, esz, nloc, me, &lo, &hi);
  memcpy(mine, src, lo * esz);
  memcpy(mine + hi * esz, src + hi * esz, (n - hi) * esz);
  tnt__shm_publish(c, 0, seq);
  TNT_CHECK(tnt__shm_wait_all(c, 0, seq, w));
  if (hi > lo) {
    for (int q = 0; q < nloc; ++q) srcs[q] = tnt__shm_slot(c, q, slot) + lo * esz;
    srcs[me] = src + lo * esz;
    tnt__reduce_many(mine + lo * esz, srcs, nloc, hi - lo, dtype, op, c->size);
  }
  tnt__shm_publish(c, 1, seq);
  if (me != 0) return TNT_OK;
  /* The leader reads the slots of this round before it publishes counter 0
   * of the next one, as tnt__shm_round_begin requires. */
  TNT_CHECK(tnt__shm_wait_all(c, 1, seq, w));
  for (int q = 0; q < nloc; ++q) {
    size_t qlo, qhi;
    tnt__slice(n, esz, nloc, q, &qlo, &qhi);
    memcpy(dst + qlo * esz, tnt__shm_slot(c, q, slot) + qlo * esz, (qhi - qlo) * esz);
  }
  return TNT_OK;
}

/* The leader's shared-memory waits move the running ring on. */
static tnt_status_t poll_ring(void *arg) {
  int progress;
  return tnt__ring_progress(arg, &progress);
}

static tnt_status_t hier_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                   tnt_dtype_t dtype, tnt_op_t op, const tnt__wait_ctx_t *w) {
  /* The average is taken once, by the leaders, after the host sums are
   * combined; the other operations combine the same way at both levels. */
  const tnt_op_t sum_op = op == TNT_AVERAGE ? TNT_SUM : op;
  const size_t esz = tnt__dtype_size(dtype);
  const size_t line = 64 / esz ? 64 / esz : 1;
  size_t block = (count + HIER_MIN_BLOCKS - 1) / HIER_MIN_BLOCKS;
  block = TNT__MAX(block, HIER_MIN_BLOCK_BYTES / esz);
  block = (block + line - 1) / line * line;
  block = TNT__MIN(block, c->shm_slot_bytes / esz);
  const size_t nblocks = count == 0 ? 0 : (count + block - 1) / block;
  const uint8_t *src = sendbuf;
  uint8_t *dst = recvbuf;
  const int leader = c->local_rank == 0;

  const void *stack_srcs[16];
  const void **srcs = stack_srcs;
  if (c->local_size > 16) {
    srcs = malloc((size_t)c->local_size * sizeof *srcs);
    if (srcs == NULL) return TNT_ERR_NO_MEMORY;
  }
  tnt__ring_run_t ring = {.done = 1};
  tnt__wait_ctx_t wl = *w;
  if (leader) {
    wl.poll = poll_ring;
    wl.poll_arg = &ring;
  }
  tnt_status_t st = TNT_OK;
  /* Round b reduces block b and broadcasts block b - 1; the leader starts
   * the ring of block b in between, once the ring of block b - 1 is done.
   * Every member runs the same shared-memory rounds in the same order. */
  for (size_t b = 0; b <= nblocks; ++b) {
    if (b < nblocks) {
      const size_t off = b * block, n = TNT__MIN(block, count - off);
      TNT_CHECK_GOTO(host_reduce(c, src + off * esz, dst + off * esz, n, dtype, sum_op, srcs, &wl),
                     st, out);
    }
    if (leader) {
      TNT_CHECK_GOTO(tnt__ring_wait(&ring, w), st, out);
      tnt__ring_end(&ring);
      if (b > 0) {
        const size_t off = (b - 1) * block, n = TNT__MIN(block, count - off);
        tnt__reduce_finish(dst + off * esz, n, dtype, op, c->size);
      }
      if (b < nblocks) {
        const size_t off = b * block, n = TNT__MIN(block, count - off);
        const tnt__algo_t *across = tnt__algo_choose(&c->cross_allreduce, n * esz);
        if (across == &tnt__allreduce_rd || across == &tnt__allreduce_rabenseifner) {
          const tnt__participants_fn among = across == &tnt__allreduce_rd
                                                 ? tnt__rd_exchanges
                                                 : tnt__rabenseifner_exchanges;
          uint8_t *part = dst + off * esz;
          TNT_CHECK_GOTO(
              tnt__allreduce_folded(c->cross, part, part, n, dtype, sum_op, among, &c->ring, w),
              st, out);
        } else {
          TNT_CHECK_GOTO(tnt__ring_start(&ring, c->cross, &c->ring, dst + off * esz, n, dtype,
                                         sum_op, NULL, 0),
                         st, out);
        }
      }
    }
    if (b > 0) {
      const size_t off = (b - 1) * block, n = TNT__MIN(block, count - off);
      TNT_CHECK_GOTO(tnt__broadcast_shm.fn.broadcast(c, dst + off * esz, n * esz, 0, &wl), st, out);
    }
  }
out:
  tnt__ring_end(&ring);
  if (srcs != stack_srcs) free(srcs);
  return st;
}

const tnt__algo_t tnt__allreduce_hier = {
    .name = "hier",
    .description =
        "shared-memory reduce on each host, pipelined ring among host leaders, "
        "shared-memory broadcast, the three overlapped block by block",
    .usable = hier_usable,
    .fn.allreduce = hier_allreduce,
};
