/*
 * Binomial-tree broadcast: log2(n) rounds, in which every rank that has the
 * data sends it to one that does not.
 */
#include "collectives/collectives.h"

static int tree_usable(const tnt__comm_t *c) {
  (void)c;
  return 1;
}

static tnt_status_t tree_broadcast(tnt__comm_t *c, void *buf, size_t bytes, int root,
                                   const tnt__wait_ctx_t *w) {
  tnt__transport_t *t = c->t;
  const int n = t->size;
  const int vr = (t->rank - root + n) % n; /* rank relative to the root */
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      TNT_CHECK(tnt__xrecv(t, buf, bytes, (vr - mask + root) % n, w));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) TNT_CHECK(tnt__xsend(t, buf, bytes, (vr + mask + root) % n, w));
  }
  return TNT_OK;
}

const tnt__algo_t tnt__broadcast_tree = {
    .name = "tree",
    .description = "binomial tree over the transport",
    .usable = tree_usable,
    .fn.broadcast = tree_broadcast,
};
