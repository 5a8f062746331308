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
 * runs the same algorithm in the same order. tnt-sim also compares the
 * "bits" results of the algorithms that serve any layout (ring, rd,
 * rabenseifner) with the serial sum in the order each one's file documents
 * (sim_check_ordered), at any number of ranks.
 */
#ifndef TNT_SIM_SIM_CHECK_H
#define TNT_SIM_SIM_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* The serial sum of element i of n ranks' "bits" inputs in the order of
 * `algo` (NULL when tnt-sim has no serial reference for it), for a vector
 * of `count` float32:
 *   ring          chunk q of i (tnt__slice) summed along the chain
 *                 q + 1, q + 2, ..., q + n (mod n);
 *   rd            the largest power of two p <= n participants: the first
 *                 n - p of them hold ranks 2v and 2v + 1 summed, the others
 *                 rank v + n - p; then a balanced binary tree over the
 *                 participants in order (distance 1 first, then 2, 4, ...);
 *   rabenseifner  the same participants and tree, the distances the other
 *                 way round (p/2 first, then p/4, ..., 1).
 * Floating-point addition is commutative, so only the tree matters. */
static inline float sim_check_leaf(int n, int p, int v, size_t i) {
  const int extra = n - p;
  if (v < extra) return sim_check_input(0, 2 * v + 1, i) + sim_check_input(0, 2 * v, i);
  return sim_check_input(0, v + extra, i);
}

/* The tree over the `span` participants v, v + stride, v + 2 stride, ...:
 * rd joins the two contiguous halves last, rabenseifner (`far`) the even
 * and the odd ones. */
static inline float sim_check_tree(int n, int p, int v, int stride, int span, int far,
                                   size_t i) {
  if (span == 1) return sim_check_leaf(n, p, v, i);
  if (far) {
    return sim_check_tree(n, p, v, 2 * stride, span / 2, far, i) +
           sim_check_tree(n, p, v + stride, 2 * stride, span / 2, far, i);
  }
  return sim_check_tree(n, p, v, stride, span / 2, far, i) +
         sim_check_tree(n, p, v + stride * (span / 2), stride, span / 2, far, i);
}

static inline const char *sim_check_ordered(const char *algo, int n, size_t count, size_t i,
                                            float *sum) {
  if (strcmp(algo, "ring") == 0) {
    int q = 0;
    size_t lo, hi;
    for (q = 0; q < n; q++) {
      tnt__slice(count, sizeof(float), n, q, &lo, &hi);
      if (lo <= i && i < hi) break;
    }
    float s = sim_check_input(0, (q + 1) % n, i);
    for (int k = 2; k <= n; k++) s += sim_check_input(0, (q + k) % n, i);
    *sum = s;
    return algo;
  }
  const int far = strcmp(algo, "rabenseifner") == 0;
  if (!far && strcmp(algo, "rd") != 0) return NULL;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  *sum = sim_check_tree(n, p, 0, 1, p, far, i);
  return algo;
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
