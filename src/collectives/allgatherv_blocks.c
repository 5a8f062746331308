/*
 * What the allgatherv algorithms that gather the blocks into a buffer of
 * their own share (Bruck's, recursive doubling's): where each block lies in
 * that buffer, one after another from a given block on, and the copy of
 * the blocks from it to their places.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"

size_t *tnt__blocks_at(const size_t *counts, int n, int first) {
  size_t *at = malloc((size_t)(n + 1) * sizeof *at);
  if (at == NULL) return NULL;
  at[0] = 0;
  for (int j = 0; j < n; ++j) at[j + 1] = at[j] + counts[(first + j) % n];
  return at;
}

void tnt__blocks_to_place(uint8_t *out, const size_t *displs, const uint8_t *buf,
                          const size_t *at, const size_t *counts, int n, int first) {
  for (int j = 0; j < n; ++j) {
    const int b = (first + j) % n;
    memcpy(out + displs[b], buf + at[j], counts[b]);
  }
}
