/*
 * Shared-memory broadcast on one host: the root copies each segment into
 * its slot once and every other rank copies it out. Readers wait for the
 * root, and the root can fill the next slot while the others still read the
 * current one.
 */
#include <string.h>

#include "collectives/collectives.h"

static int shm_usable(const tnt__comm_t *c) {
  return c->shm != NULL && c->num_hosts == 1;
}

static tnt_status_t shm_broadcast(tnt__comm_t *c, void *buf, size_t bytes, int root,
                                  const tnt__wait_ctx_t *w) {
  uint8_t *data = buf;
  for (size_t off = 0; off < bytes; off += c->shm_slot_bytes) {
    const size_t n = TNT__MIN(c->shm_slot_bytes, bytes - off);
    uint64_t seq;
    TNT_CHECK(tnt__shm_round_begin(c, w, &seq));
    if (c->local_rank == root) {
      memcpy(tnt__shm_slot(c, root, (int)(seq & 1u)), data + off, n);
      tnt__shm_publish(c, 0, seq);
    } else {
      uint8_t *slot = tnt__shm_slot(c, root, (int)(seq & 1u));
      tnt__shm_publish(c, 0, seq);
      TNT_CHECK(tnt__shm_wait_one(c, 0, root, seq, w));
      memcpy(data + off, slot, n);
    }
  }
  return TNT_OK;
}

const tnt__algo_t tnt__broadcast_shm = {
    .name = "shm",
    .description = "root writes shared memory once, every rank reads it",
    .usable = shm_usable,
    .fn.broadcast = shm_broadcast,
};
