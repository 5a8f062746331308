/*
 * The MPI library's own allreduce, as a peer to measure against and as a
 * fallback. It runs as MPI_Iallreduce polled against the deadline, so it
 * cannot wait forever either.
 */
#include "collectives/collectives.h"
#include "util/reduce.h"

static int mpi_usable(const tnt__comm_t *c) {
  return c->t->ops->native_allreduce != NULL;
}

static tnt_status_t mpi_allreduce(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                  const tnt__wait_ctx_t *w) {
  if (count == 0) return TNT_OK;
  TNT_CHECK(c->t->ops->native_allreduce(c->t, sendbuf, recvbuf, count, dtype, op, w));
  tnt__reduce_finish(recvbuf, count, dtype, op, c->size);
  return TNT_OK;
}

const tnt__algo_t tnt__allreduce_mpi = {
    .name = "mpi",
    .description = "MPI_Allreduce of the underlying MPI library",
    .usable = mpi_usable,
    .fn.allreduce = mpi_allreduce,
};
