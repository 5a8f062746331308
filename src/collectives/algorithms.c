/*
 * The algorithm tables and the choice by message size.
 *
 * On one host the shared-memory algorithms win at every size (measured with
 * tnt-bench against MPI_Allreduce). Across hosts, the allreduce uses the
 * hierarchical shared-memory algorithm when hosts are alike and hold
 * several ranks each, otherwise recursive doubling up to TNT__RD_MAX_BYTES
 * and the ring above.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "core/log.h"

#define TNT__RD_MAX_BYTES (64u * 1024u)

static const tnt__algo_t *const allreduce_algos[] = {&tnt__allreduce_shm, &tnt__allreduce_rd,
                                                     &tnt__allreduce_ring, &tnt__allreduce_mpi,
                                                     NULL};
static const tnt__algo_t *const broadcast_algos[] = {&tnt__broadcast_shm, &tnt__broadcast_tree,
                                                     NULL};
static const tnt__algo_t *const allgatherv_algos[] = {&tnt__allgatherv_shm,
                                                      &tnt__allgatherv_ring, NULL};

static const tnt__algo_t *const *const tables[TNT__COLL_KIND_COUNT] = {
    allreduce_algos, broadcast_algos, allgatherv_algos};
static const char *const env_names[TNT__COLL_KIND_COUNT] = {
    "TNT_ALLREDUCE_ALGORITHM", "TNT_BROADCAST_ALGORITHM", "TNT_ALLGATHER_ALGORITHM"};

const tnt__algo_t *tnt__algo_find(tnt__coll_kind_t kind, const char *name) {
  if ((unsigned)kind >= TNT__COLL_KIND_COUNT || name == NULL) return NULL;
  for (const tnt__algo_t *const *a = tables[kind]; *a != NULL; ++a) {
    if (strcmp((*a)->name, name) == 0) return *a;
  }
  return NULL;
}

static const tnt__algo_t *by_size(const tnt__comm_t *c, tnt__coll_kind_t kind, size_t bytes) {
  const tnt__algo_t *const *t = tables[kind];
  if (t[0]->usable(c)) return t[0]; /* the shared-memory algorithm */
  if (kind == TNT__COLL_ALLREDUCE) {
    return bytes <= TNT__RD_MAX_BYTES ? &tnt__allreduce_rd : &tnt__allreduce_ring;
  }
  return t[1];
}

const tnt__algo_t *tnt__algo_select(const tnt__comm_t *c, tnt__coll_kind_t kind, size_t bytes) {
  const char *forced = getenv(env_names[kind]);
  if (forced != NULL && *forced != '\0' && strcmp(forced, "auto") != 0) {
    const tnt__algo_t *a = tnt__algo_find(kind, forced);
    if (a != NULL && a->usable(c)) return a;
    /* Warn once per process and kind: the same mistake would otherwise
     * print on every call. */
    static _Atomic int warned[TNT__COLL_KIND_COUNT];
    if (!atomic_exchange(&warned[kind], 1)) {
      TNT_LOG_WARN("%s=%s %s; choosing by message size instead", env_names[kind], forced,
                   a == NULL ? "names no such algorithm" : "cannot serve this group");
    }
  }
  return by_size(c, kind, bytes);
}
