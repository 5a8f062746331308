/*
 * The algorithm tables and the choice by message size and group size.
 *
 * On one host the shared-memory algorithms win at every size (measured with
 * tnt-bench against MPI_Allreduce). Across hosts, the allreduce is
 * hierarchical (shared memory within hosts, one leader per host combining
 * across hosts as below) when hosts are alike and hold several ranks each.
 * Otherwise it is recursive doubling for small messages, Rabenseifner's
 * algorithm for medium ones and the pipelined ring for large ones, the
 * sizes between them set by a cost model of the three that depends on the
 * number of ranks and on the machine: the network's rate and latency and
 * how fast a rank reduces (TNT_NETWORK_GBIT, TNT_NETWORK_LATENCY_US,
 * TNT_REDUCE_GBPS; rd_max_bytes, ring_min_bytes, checked against libtnt's
 * algorithms simulated on fat-trees of 8 to 1024 hosts,
 * docs/research/scale-study.md). The allgather across hosts is recursive
 * doubling (a power of two of ranks) or Bruck's algorithm for small totals
 * and the ring for large ones (bruck_max_bytes). Where the model leaves
 * Rabenseifner's no sizes of its own (2, 3 and 5 ranks) the ring
 * follows recursive doubling directly. The settings TNT_ALLREDUCE_ALGORITHM,
 * TNT_BROADCAST_ALGORITHM and TNT_ALLGATHER_ALGORITHM force one.
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

/* Recursive doubling at most up to this size: on 2 hosts it beats the ring
 * up to here (measured with tnt-bench). */
#define TNT__RD_MAX_BYTES (64u * 1024u)
/* The cost model of rd_max_bytes and ring_min_bytes reads three facts of
 * the machine, each a setting whose default describes a 100 Gbit/s
 * cluster: the link's rate B (TNT_NETWORK_GBIT, 100), a message's latency
 * between two hosts (TNT_NETWORK_LATENCY_US, 1 us), and how fast one rank
 * reduces vectors larger than its cache (TNT_REDUCE_GBPS, 10 GB/s: memcpy
 * measured 13 GB/s at 64 MiB, a reduction moves 1.5 times the bytes of a
 * copy); while the vectors fit in cache, up to TNT__CACHED_BYTES, a rank
 * reduces TNT__CACHED_REDUCE_SPEEDUP times faster (memcpy measured 39 GB/s
 * at 2 to 4 MiB).
 *
 * Recursive doubling gives way to Rabenseifner's algorithm at
 * TNT__RD_CROSSING_LATENCIES x latency x B. With one latency per exchange
 * the model below puts the tie at log2 p / (log2 p - 2(p-1)/p) latencies
 * x B: 2.4 at 8 hosts, 1.25 at 1024; but an exchange with a far host
 * crosses more switches, and simulated on fat-trees
 * (docs/research/scale-study.md) the two crossed where 2 latencies (host to host under one
 * switch) x B put them on every tree: between 16 and 32 KiB at 100 Gbit/s
 * on 8, 64, 256 and 1024 hosts, between 4 and 8 KiB at 10 Gbit/s with
 * 2 us (8 and 64 hosts), between 64 and 128 KiB at 400 Gbit/s (8 and 64).
 *
 * The ring pays 2(n-1) latencies where Rabenseifner's algorithm pays
 * 2 log2 p for the same traffic (n a power of two), and wins only by
 * hiding the reductions that Rabenseifner's algorithm runs between its
 * transfers: where reducing costs nothing next to the link (as on the
 * simulated clusters, where copies and reductions are free and tnt-sim
 * says so through TNT_REDUCE_GBPS) the ring never wins on a power of two.
 * A ring step's latency is taken as 2 latencies (it waits for the previous
 * step's segment and its reduction). */
#define TNT__RD_CROSSING_LATENCIES 2.0
#define TNT__RING_STEP_LATENCIES 2.0
#define TNT__CACHED_BYTES (8.0 * 1024 * 1024)
#define TNT__CACHED_REDUCE_SPEEDUP 2.5

static const tnt__algo_t *const allreduce_algos[] = {
    &tnt__allreduce_shm, &tnt__allreduce_rd, &tnt__allreduce_ring, &tnt__allreduce_mpi,
    &tnt__allreduce_hier, &tnt__allreduce_rabenseifner, NULL};
static const tnt__algo_t *const broadcast_algos[] = {&tnt__broadcast_shm, &tnt__broadcast_tree,
                                                     NULL};
static const tnt__algo_t *const allgatherv_algos[] = {
    &tnt__allgatherv_shm, &tnt__allgatherv_ring, &tnt__allgatherv_bruck, &tnt__allgatherv_rd,
    NULL};

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

/*
 * Times of the three algorithms on n ranks for S bytes, in units of the
 * link rate B (times in bytes sent at B), with p the largest power of two
 * <= n, L = latency x B and R = B / the reduction rate:
 *   recursive doubling  log2(p) (L + S (1 + R))     (R: see TNT__CACHED_BYTES)
 *   Rabenseifner        2 log2(p) L + (p-1)/p S (2 + R)
 *   ring                2(n-1) L + 2(n-1)/n S  (its pipeline hides the reductions)
 * For n > p, recursive doubling and Rabenseifner's algorithm both fold the
 * extra ranks in first and send them the result last (2 L + S (2 + R)).
 * The thresholds depend on n and the settings alone, so every rank
 * computes the same.
 */
static void powers_below(int n, int *p, int *log2p) {
  *p = 1, *log2p = 0;
  while (*p * 2 <= n) *p *= 2, ++*log2p;
}

/* The link's rate B in bytes per second. */
static double link_bytes_per_s(void) {
  return tnt__setting_number(TNT__S_NETWORK_GBIT) * 1e9 / 8.0;
}

/* Bytes the link carries in one message latency (L x B). */
static double latency_bytes(void) {
  return tnt__setting_number(TNT__S_NETWORK_LATENCY_US) * 1e-6 * link_bytes_per_s();
}

/* Recursive doubling up to here: where it ties with Rabenseifner's (see
 * TNT__RD_CROSSING_LATENCIES); on 2 and 3 ranks, which leave Rabenseifner's
 * algorithm no sizes of its own, up to the 64 KiB measured on 2 hosts. */
static size_t rd_max_bytes(int n) {
  int p, log2p;
  powers_below(n, &p, &log2p);
  const double tie = TNT__RD_CROSSING_LATENCIES * latency_bytes();
  if (p < 4 || tie >= TNT__RD_MAX_BYTES) return TNT__RD_MAX_BYTES;
  return (size_t)tie;
}

/* The ring from here on: where its 2(n-1) latencies cost less than what
 * Rabenseifner's algorithm pays on top of the same traffic (its reductions,
 * and for n > p the fold); SIZE_MAX where they never do. */
static size_t ring_crossing(int n, double R) {
  int p, log2p;
  powers_below(n, &p, &log2p);
  const int fold = n > p;
  const double latency_saved =
      2.0 * TNT__RING_STEP_LATENCIES * latency_bytes() * (n - 1 - log2p - fold);
  const double per_byte_extra =
      (double)(p - 1) / p * (2.0 + R) + fold * (2.0 + R) - 2.0 * (n - 1) / n;
  if (latency_saved <= 0.0) return 0;
  if (per_byte_extra <= 0.0 || latency_saved / per_byte_extra >= (double)(SIZE_MAX / 2)) {
    return SIZE_MAX;
  }
  return (size_t)(latency_saved / per_byte_extra);
}

static size_t ring_min_bytes(int n) {
  const double memory_R = link_bytes_per_s() / (tnt__setting_number(TNT__S_REDUCE_GBPS) * 1e9);
  const size_t cached = ring_crossing(n, memory_R / TNT__CACHED_REDUCE_SPEEDUP);
  if (cached <= TNT__CACHED_BYTES) return cached;
  /* Beyond the cache the reductions cost more and the ring wins sooner,
   * but not before the cache is left. */
  const size_t memory = ring_crossing(n, memory_R);
  return memory > TNT__CACHED_BYTES ? memory : (size_t)TNT__CACHED_BYTES;
}

/* The allreduce of n ranks with one rank per host, by size. */
static tnt__algo_choice_t across_hosts(int n) {
  const size_t rd_max = rd_max_bytes(n), ring_from = ring_min_bytes(n);
  if (ring_from <= rd_max) {
    return (tnt__algo_choice_t){{&tnt__allreduce_rd, &tnt__allreduce_ring}, {rd_max, SIZE_MAX}};
  }
  if (ring_from == SIZE_MAX) {
    return (tnt__algo_choice_t){{&tnt__allreduce_rd, &tnt__allreduce_rabenseifner},
                                {rd_max, SIZE_MAX}};
  }
  return (tnt__algo_choice_t){{&tnt__allreduce_rd, &tnt__allreduce_rabenseifner,
                               &tnt__allreduce_ring},
                              {rd_max, ring_from, SIZE_MAX}};
}

/*
 * The allgather across hosts, by the gathered total S: the ring pays n - 1
 * latencies, Bruck's algorithm ceil(log2 n) and a copy of S into place, for
 * the same bytes on the link; it serves totals up to where the latencies it
 * saves cost what the copy does (no size on 2 and 3 ranks, where the step
 * counts are equal). A copy moves bytes at 1.5 times the reduction rate
 * (TNT_REDUCE_GBPS), TNT__CACHED_REDUCE_SPEEDUP times faster in cache (see
 * TNT__CACHED_BYTES); with copies free (the simulated clusters) it serves
 * every size.
 */
static size_t bruck_max_bytes(int n) {
  int steps = 0;
  while ((1 << steps) < n) ++steps;
  const double saved = (double)(n - 1 - steps) * latency_bytes();
  if (saved <= 0.0) return 0;
  const double copy_per_byte =
      link_bytes_per_s() / (1.5 * tnt__setting_number(TNT__S_REDUCE_GBPS) * 1e9);
  const double cached = saved / (copy_per_byte / TNT__CACHED_REDUCE_SPEEDUP);
  if (cached <= TNT__CACHED_BYTES) return (size_t)cached;
  const double memory = saved / copy_per_byte;
  if (memory >= (double)(SIZE_MAX / 2)) return SIZE_MAX;
  return memory > TNT__CACHED_BYTES ? (size_t)memory : (size_t)TNT__CACHED_BYTES;
}

/* On a power of two, recursive doubling takes Bruck's place: as many
 * steps, exchanges between pairs of ranks (faster on the simulated
 * fat-trees), and no copy for blocks in rank order. */
static tnt__algo_choice_t allgather_across_hosts(int n) {
  const size_t bruck_max = bruck_max_bytes(n);
  const tnt__algo_t *few_steps = (n & (n - 1)) == 0 ? &tnt__allgatherv_rd : &tnt__allgatherv_bruck;
  if (bruck_max == 0) return tnt__algo_only(&tnt__allgatherv_ring);
  if (bruck_max == SIZE_MAX) return tnt__algo_only(few_steps);
  return (tnt__algo_choice_t){{few_steps, &tnt__allgatherv_ring}, {bruck_max, SIZE_MAX}};
}

/* The choice by message size and group size. */
static tnt__algo_choice_t by_size(const tnt__comm_t *c, tnt__coll_kind_t kind) {
  const tnt__algo_t *const *t = tables[kind];
  if (t[0]->usable(c)) return tnt__algo_only(t[0]); /* shared memory */
  if (kind == TNT__COLL_ALLGATHERV) return allgather_across_hosts(c->size);
  if (kind != TNT__COLL_ALLREDUCE) return tnt__algo_only(t[1]);
  if (tnt__allreduce_hier.usable(c)) return tnt__algo_only(&tnt__allreduce_hier);
  return across_hosts(c->size);
}

void tnt__algo_resolve(tnt__comm_t *c) {
  if (c->cross != NULL) c->cross_allreduce = across_hosts(c->cross->size);
  for (int k = 0; k < TNT__ALGO_TABLE_COUNT; ++k) {
    const tnt__coll_kind_t kind = (tnt__coll_kind_t)k;
    c->algos[k] = by_size(c, kind);
    const int word = tnt__setting_word(settings[k]);
    if (word <= 0) continue; /* auto */
    const tnt__algo_t *a = tnt__algo_at(kind, word - 1);
    if (a->usable(c)) {
      c->algos[k] = tnt__algo_only(a);
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
