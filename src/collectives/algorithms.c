/*
 * The algorithm tables and the choice by message size.
 *
 * On one host the shared-memory algorithms win at every size (measured with
 * tnt-bench against MPI_Allreduce). Across hosts, the allreduce is
 * hierarchical (shared memory within hosts, the pipelined ring among one
 * leader per host) when hosts are alike and hold several ranks each,
 * otherwise recursive doubling up to TNT__RD_MAX_BYTES and the pipelined
 * ring above. The settings TNT_ALLREDUCE_ALGORITHM, TNT_BROADCAST_ALGORITHM
 * and TNT_ALLGATHER_ALGORITHM force one.
 *
 * A communicator resolves its choice once, when it is created
 * (tnt__algo_resolve): the collectives themselves only look it up, and
 * never read the environment.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/settings.h"
#include "util/log.h"

#define TNT__RD_MAX_BYTES (64u * 1024u)

static const tnt__algo_t *const allreduce_algos[] = {
    &tnt__allreduce_shm, &tnt__allreduce_rd, &tnt__allreduce_ring, &tnt__allreduce_mpi,
    &tnt__allreduce_hier, NULL};
static const tnt__algo_t *const broadcast_algos[] = {&tnt__broadcast_shm, &tnt__broadcast_tree,
                                                     NULL};
static const tnt__algo_t *const allgatherv_algos[] = {&tnt__allgatherv_shm,
                                                      &tnt__allgatherv_ring, NULL};

static const tnt__algo_t *const *const tables[TNT__ALGO_TABLE_COUNT] = {
    allreduce_algos, broadcast_algos, allgatherv_algos};
/* The setting that forces each table's algorithm: its words are "auto" and
 * the table's names, in the table's order (checked by a unit test). */
static const tnt__setting_id_t settings[TNT__ALGO_TABLE_COUNT] = {
    TNT__S_ALLREDUCE_ALGORITHM, TNT__S_BROADCAST_ALGORITHM, TNT__S_ALLGATHER_ALGORITHM};

const tnt__algo_t *tnt__algo_find(tnt__coll_kind_t kind, const char *name) {
  if ((unsigned)kind >= TNT__ALGO_TABLE_COUNT || name == NULL) return NULL;
  for (const tnt__algo_t *const *a = tables[kind]; *a != NULL; ++a) {
    if (strcmp((*a)->name, name) == 0) return *a;
  }
  return NULL;
}

const tnt__algo_t *tnt__algo_at(tnt__coll_kind_t kind, int index) {
  if ((unsigned)kind >= TNT__ALGO_TABLE_COUNT || index < 0) return NULL;
  for (int i = 0; tables[kind][i] != NULL; ++i) {
    if (i == index) return tables[kind][i];
  }
  return NULL;
}

/* The choice by message size. */
static tnt__algo_choice_t by_size(const tnt__comm_t *c, tnt__coll_kind_t kind) {
  const tnt__algo_t *const *t = tables[kind];
  if (t[0]->usable(c)) return (tnt__algo_choice_t){t[0], t[0], SIZE_MAX}; /* shared memory */
  if (kind == TNT__COLL_ALLREDUCE) {
    if (tnt__allreduce_hier.usable(c)) {
      return (tnt__algo_choice_t){&tnt__allreduce_hier, &tnt__allreduce_hier, SIZE_MAX};
    }
    return (tnt__algo_choice_t){&tnt__allreduce_rd, &tnt__allreduce_ring, TNT__RD_MAX_BYTES};
  }
  return (tnt__algo_choice_t){t[1], t[1], SIZE_MAX};
}

void tnt__algo_resolve(tnt__comm_t *c) {
  for (int k = 0; k < TNT__ALGO_TABLE_COUNT; ++k) {
    const tnt__coll_kind_t kind = (tnt__coll_kind_t)k;
    c->algos[k] = by_size(c, kind);
    const int word = tnt__setting_word(settings[k]);
    if (word <= 0) continue; /* auto */
    const tnt__algo_t *a = tnt__algo_at(kind, word - 1);
    if (a->usable(c)) {
      c->algos[k] = (tnt__algo_choice_t){a, a, SIZE_MAX};
      continue;
    }
    /* Warn once per process and kind: every group would repeat it. */
    static _Atomic int warned[TNT__ALGO_TABLE_COUNT];
    if (!atomic_exchange(&warned[k], 1)) {
      tnt__setting_view_t v;
      tnt__setting_view(settings[k], &v);
      TNT_LOG_WARN("%s=%s cannot serve a group of %d ranks on %d host(s); choosing by message "
                   "size instead",
                   v.name, v.value, c->size, c->num_hosts);
    }
  }
}
