/*
 * The correctness cases of tnt-sim --check, shared with the reference run
 * on the threads transport (tests/sim/sim_reference.c), so that both run
 * exactly the same allreduces and print the same lines:
 *
 *   <algorithm> <count> <exact|bits> <FNV-1a hash of the result>
 *
 * "exact" inputs are small integers stored as float32: every sum is exact,
 * so the result is the serial sum whatever the order, and each rank checks
 * it element by element. "bits" inputs are non-integer float32 values, whose
 * sum depends on the order of combination; the hash of the result must be
 * the same on every rank and the same as on the threads transport, which
 * runs the same algorithm in the same order.
 */
#ifndef TNT_SIM_SIM_CHECK_H
#define TNT_SIM_SIM_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/collectives.h"

static const size_t kSimCheckCounts[] = {1, 7, 1000, 6007, 100003};
#define SIM_CHECK_NCOUNTS (sizeof kSimCheckCounts / sizeof kSimCheckCounts[0])
static const char *const kSimCheckAlgos[] = {"ring", "rd", "rabenseifner", "hier", "shm", "auto"};
#define SIM_CHECK_NALGOS (sizeof kSimCheckAlgos / sizeof kSimCheckAlgos[0])

/* Element i of rank r's input. */
static inline float sim_check_input(int exact, int r, size_t i) {
  if (exact) return (float)((i * 7u + (size_t)r * 13u) % 17u) - 8.0f;
  return (float)((double)((i * 7919u + (size_t)r * 104729u) % 10007u) / 97.0 - 50.0);
}

/* The exact sum of element i over n ranks (exact inputs). */
static inline float sim_check_sum(int n, size_t i) {
  double s = 0.0;
  for (int r = 0; r < n; r++) s += sim_check_input(1, r, i);
  return (float)s;
}

static inline uint64_t sim_check_hash(const void *p, size_t bytes) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Sets c's allreduce choice to `name` ("auto": libtnt's own choice, made
 * when c was created and passed in as `resolved`). Returns 0 when the
 * algorithm cannot serve c. */
static inline int sim_check_choose(tnt__comm_t *c, const char *name,
                                   const tnt__algo_choice_t *resolved) {
  if (name[0] == 'a') {
    c->algos[TNT__COLL_ALLREDUCE] = *resolved;
    return 1;
  }
  const tnt__algo_t *a = tnt__algo_find(TNT__COLL_ALLREDUCE, name);
  if (a == NULL || !a->usable(c)) return 0;
  c->algos[TNT__COLL_ALLREDUCE] = tnt__algo_only(a);
  return 1;
}

#endif
