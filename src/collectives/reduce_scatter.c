/*
 * Reduce-scatter: each rank receives its block of the reduction of every
 * member's vector. It runs the allreduce algorithm that the communicator
 * chooses for the whole vector's size (so a forced allreduce algorithm
 * forces it too): that algorithm's reduce-scatter phase where it has one
 * (the ring, Rabenseifner's recursive halving, shared memory), else the
 * allreduce itself, of which each rank keeps its block (recursive doubling,
 * the hierarchy, MPI's). Either way block r is, with the tnt__slice
 * partition, bitwise what the allreduce gives there: a sharded optimizer
 * that reduce-scatters its gradients computes what plain data parallelism
 * computes.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"

tnt_status_t tnt__reduce_scatter(tnt__comm_t *c, void *buf, void *recvbuf, size_t count,
                                 const size_t *bounds, tnt_dtype_t dtype, tnt_op_t op,
                                 const tnt__wait_ctx_t *w, const char **algorithm) {
  const size_t esz = tnt__dtype_size(dtype);
  const int n = c->size;
  const tnt__algo_t *a = tnt__algo_select(c, TNT__COLL_ALLREDUCE, count * esz);
  if (algorithm != NULL) *algorithm = a->name;
  size_t stack_bounds[9];
  size_t *own = NULL;
  if (bounds == NULL) {
    own = n < 9 ? stack_bounds : malloc(((size_t)n + 1) * sizeof *own);
    if (own == NULL) return TNT_ERR_NO_MEMORY;
    tnt__slice_bounds(count, esz, n, own);
    bounds = own;
  }
  tnt_status_t st = a->reduce_scatter != NULL ? a->reduce_scatter(c, buf, bounds, dtype, op, w)
                                              : a->fn.allreduce(c, buf, buf, count, dtype, op, w);
  uint8_t *block = (uint8_t *)buf + bounds[c->rank] * esz;
  if (st == TNT_OK && block != recvbuf && bounds[c->rank + 1] > bounds[c->rank]) {
    memcpy(recvbuf, block, (bounds[c->rank + 1] - bounds[c->rank]) * esz);
  }
  if (own != stack_bounds) free(own);
  return st;
}
