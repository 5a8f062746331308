/*
 * Bruck's allgatherv: ceil(log2 n) steps for any n, where the ring takes
 * n - 1, for the same bytes on each rank's link. Rank r keeps the blocks
 * it has in a buffer of its own, in the order r, r + 1, ... (mod n); at
 * the step of distance d = 1, 2, 4, ... it holds its first d blocks (or
 * all n), sends the first min(d, n - d) of them to rank r - d and appends
 * as many from rank r + d, which are blocks r + d, r + d + 1, ... A last
 * pass copies every block to its place. The steps' pieces travel as the
 * ring's (tnt__xsendrecv_pieces). Across many hosts the ring's n - 1
 * latencies are what a gather of small blocks waits for (a ZeRO stage's
 * gather of its updated parts, bucket by bucket); the extra copy of the
 * whole result is what Bruck's algorithm pays instead (algorithms.c weighs
 * the two).
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"

static int bruck_usable(const tnt__comm_t *c) {
  (void)c;
  return 1;
}

static tnt_status_t bruck_allgatherv(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                     const size_t *counts, const size_t *displs,
                                     const tnt__wait_ctx_t *w) {
  tnt__transport_t *t = c->t;
  const int n = t->size, r = t->rank;
  uint8_t *out = recvbuf;
  /* at[j]: where block (r + j) mod n starts in the rotated buffer; at[n]: its size. */
  size_t *at = tnt__blocks_at(counts, n, r);
  if (at == NULL) return TNT_ERR_NO_MEMORY;
  uint8_t *rot = malloc(at[n] > 0 ? at[n] : 1);
  if (rot == NULL) {
    free(at);
    return TNT_ERR_NO_MEMORY;
  }
  memcpy(rot, sendbuf, counts[r]);
  tnt_status_t st = TNT_OK;
  for (int d = 1; d < n; d *= 2) {
    const int moved = d < n - d ? d : n - d;
    st = tnt__xsendrecv_pieces(t, rot, at[moved], (r - d + n) % n, rot + at[d],
                               at[d + moved] - at[d], (r + d) % n, c->ring.segment_bytes,
                               c->ring.depth, w);
    if (st != TNT_OK) goto out;
  }
  tnt__blocks_to_place(out, displs, rot, at, counts, n, r);
out:
  free(rot);
  free(at);
  return st;
}

const tnt__algo_t tnt__allgatherv_bruck = {
    .name = "bruck",
    .description = "Bruck's: ceil(log2 n) steps of doubling block counts, then a copy into place",
    .usable = bruck_usable,
    .fn.allgatherv = bruck_allgatherv,
};
