/*
 * Barrier: on one host, a shared-memory round in which every rank announces
 * its arrival; otherwise a dissemination barrier (log2(n) rounds, in round k
 * each rank signals rank + 2^k and waits for rank - 2^k).
 */
#include "collectives/collectives.h"

tnt_status_t tnt__barrier(tnt__comm_t *c, const tnt__wait_ctx_t *w) {
  if (c->shm != NULL && c->num_hosts == 1) {
    uint64_t seq;
    TNT_CHECK(tnt__shm_round_begin(c, w, &seq));
    tnt__shm_publish(c, 0, seq);
    return tnt__shm_wait_all(c, 0, seq, w);
  }
  tnt__transport_t *t = c->t;
  const int n = t->size, r = t->rank;
  char out = 1, in = 0;
  for (int k = 1; k < n; k <<= 1) {
    TNT_CHECK(tnt__xsendrecv(t, &out, 1, (r + k) % n, &in, 1, (r - k + n) % n, w));
  }
  return TNT_OK;
}
