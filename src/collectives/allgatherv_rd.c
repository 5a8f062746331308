/*
 * Recursive-doubling allgatherv, for a power-of-two number of ranks:
 * log2 n exchanges, at distance d = 1, 2, 4, ... rank r swaps the blocks
 * of its aligned group of d ranks for those of its partner r ^ d. It takes
 * as many steps as Bruck's algorithm, but pairs ranks: on the simulated
 * fat-trees it matched SMPI's MPI_Allgather below 256 KiB, where Bruck's
 * (one rank sends to r - d and receives from r + d) took up to 1.3 times
 * longer (docs/research/scale-study.md). Blocks that lie in rank order,
 * one after another (an allgather's), are exchanged in place; others go
 * through a buffer in rank order and are copied into place at the end.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"

static int rd_usable(const tnt__comm_t *c) {
  return c->size > 0 && (c->size & (c->size - 1)) == 0;
}

static tnt_status_t rd_allgatherv(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                  const size_t *counts, const size_t *displs,
                                  const tnt__wait_ctx_t *w) {
  tnt__transport_t *t = c->t;
  const int n = t->size, r = t->rank;
  uint8_t *out = recvbuf;
  /* at[i]: where block i starts in rank order; at[n]: the total. */
  size_t *at = tnt__blocks_at(counts, n, 0);
  if (at == NULL) return TNT_ERR_NO_MEMORY;
  int in_place = 1;
  for (int i = 0; i < n; ++i) {
    if (displs[i] != displs[0] + at[i]) in_place = 0;
  }
  uint8_t *buf = in_place ? out + displs[0] : malloc(at[n] > 0 ? at[n] : 1);
  tnt_status_t st = TNT_OK;
  if (buf == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto out;
  }
  memmove(buf + at[r], sendbuf, counts[r]);
  for (int d = 1; d < n; d *= 2) {
    const int mine = r & ~(d - 1), theirs = (r ^ d) & ~(d - 1);
    st = tnt__xsendrecv_pieces(t, buf + at[mine], at[mine + d] - at[mine], r ^ d,
                               buf + at[theirs], at[theirs + d] - at[theirs], r ^ d,
                               c->ring.segment_bytes, c->ring.depth, w);
    if (st != TNT_OK) goto out;
  }
  if (!in_place) tnt__blocks_to_place(out, displs, buf, at, counts, n, 0);
out:
  if (!in_place) free(buf);
  free(at);
  return st;
}

const tnt__algo_t tnt__allgatherv_rd = {
    .name = "rd",
    .description = "recursive doubling: log2(n) pairwise exchanges (n a power of two)",
    .usable = rd_usable,
    .fn.allgatherv = rd_allgatherv,
};
