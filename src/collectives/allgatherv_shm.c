/*
 * Shared-memory allgatherv on one host: in each round every rank writes the
 * next slot-sized piece of its block, and after one barrier every rank
 * copies every piece to its place.
 */
#include <string.h>

#include "collectives/collectives.h"

static int shm_usable(const tnt__comm_t *c) {
  return c->shm != NULL && c->num_hosts == 1;
}

static tnt_status_t shm_allgatherv(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                   const size_t *counts, const size_t *displs,
                                   const tnt__wait_ctx_t *w) {
  const size_t slot = c->shm_slot_bytes;
  const int n = c->local_size, me = c->local_rank;
  const uint8_t *src = sendbuf;
  uint8_t *out = recvbuf;
  size_t largest = 0;
  for (int q = 0; q < n; ++q) largest = TNT__MAX(largest, counts[q]);
  for (size_t off = 0; off < largest; off += slot) {
    uint64_t seq;
    TNT_CHECK(tnt__shm_round_begin(c, w, &seq));
    const int s = (int)(seq & 1u);
    if (counts[me] > off) memcpy(tnt__shm_slot(c, me, s), src + off, TNT__MIN(slot, counts[me] - off));
    tnt__shm_publish(c, 0, seq);
    TNT_CHECK(tnt__shm_wait_all(c, 0, seq, w));
    for (int q = 0; q < n; ++q) {
      if (counts[q] > off) {
        memcpy(out + displs[q] + off, tnt__shm_slot(c, q, s), TNT__MIN(slot, counts[q] - off));
      }
    }
  }
  return TNT_OK;
}

const tnt__algo_t tnt__allgatherv_shm = {
    .name = "shm",
    .description = "every rank writes its block to shared memory once, all read",
    .usable = shm_usable,
    .fn.allgatherv = shm_allgatherv,
};
