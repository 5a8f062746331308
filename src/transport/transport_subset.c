/*
 * Rank and host bookkeeping of a transport split from a parent, shared by
 * every transport implementation. A child learns the world rank and host of
 * each member from its parent; host indices are renumbered 0.. in order of
 * first appearance among the child's ranks, so that a child on one host
 * always has num_hosts == 1 and host_of[] == 0, whatever the host's index
 * in the parent.
 */
#include <stdlib.h>

#include "util/log.h"
#include "transport/transport.h"

tnt_status_t tnt__transport_init_subset(tnt__transport_t *child, const tnt__transport_t *parent,
                                        const int *ranks, int n) {
  tnt_status_t st = TNT_OK;
  int *world_ranks = NULL, *host_of = NULL, *renumber = NULL;
  if (child == NULL || parent == NULL || ranks == NULL || n <= 0 || n > parent->size) {
    return TNT_ERR_INVALID_ARG;
  }
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size) {
      TNT_LOG_ERROR("transport split: rank %d is not in a transport of %d ranks", ranks[i],
                    parent->size);
      return TNT_ERR_INVALID_ARG;
    }
  }
  world_ranks = malloc((size_t)n * sizeof *world_ranks);
  host_of = malloc((size_t)n * sizeof *host_of);
  /* renumber[h] is the child's index for parent host h, plus one (0:
   * not seen yet). Parent hosts are numbered below parent->num_hosts. */
  renumber = calloc((size_t)TNT__MAX(parent->num_hosts, 1), sizeof *renumber);
  if (world_ranks == NULL || host_of == NULL || renumber == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  int num_hosts = 0;
  for (int i = 0; i < n; i++) {
    int h = parent->host_of[ranks[i]];
    if (h < 0 || h >= parent->num_hosts) {
      TNT_LOG_ERROR("transport split: parent rank %d has host %d of %d", ranks[i], h,
                    parent->num_hosts);
      st = TNT_ERR_INTERNAL;
      goto fail;
    }
    if (renumber[h] == 0) renumber[h] = ++num_hosts;
    world_ranks[i] = parent->world_ranks[ranks[i]];
    host_of[i] = renumber[h] - 1;
  }
  /* The caller's rank in the child is its position in the list. */
  for (int i = 0; i < n; i++) {
    if (ranks[i] == parent->rank) child->rank = i;
  }
  child->size = n;
  child->world_ranks = world_ranks;
  child->host_of = host_of;
  child->num_hosts = num_hosts;
  free(renumber);
  return TNT_OK;
fail:
  free(world_ranks);
  free(host_of);
  free(renumber);
  return st;
}

void tnt__transport_fini_subset(tnt__transport_t *t) {
  if (t == NULL) return;
  free(t->world_ranks);
  free(t->host_of);
  t->world_ranks = NULL;
  t->host_of = NULL;
}
