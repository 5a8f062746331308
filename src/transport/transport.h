/*
 * The transport: how bytes move between the ranks of one group. Collective
 * algorithms are written only against this interface, so the same code runs
 * over MPI (transport_mpi.c) and, in the tests, over ranks simulated as
 * threads in one process (tests/fixtures/transport_threads.c, which is not
 * part of the library).
 *
 * A transport is used by one thread at a time (the executor of the
 * context that owns it). Ranks are numbered 0..size-1 within the transport;
 * world_ranks[] translates them for messages.
 */
#ifndef TNT_TRANSPORT_TRANSPORT_H
#define TNT_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "util/common.h"

/* Collective traffic and user point-to-point traffic never match each
 * other: they travel on separate channels. */
typedef enum tnt__channel { TNT__CH_COLL = 0, TNT__CH_P2P = 1 } tnt__channel_t;

/* Collective messages of one transport are matched by order (MPI never
 * lets two messages of one source and tag overtake each other), so a
 * single tag serves every algorithm. */
#define TNT__COLL_TAG 1

/* A pending transfer. `impl` storage belongs to the transport. */
typedef struct tnt__xreq {
  uint64_t impl[4];
  int peer;    /* transport rank of the other side */
  int is_recv; /* for messages: "waiting for rank 3 (receive)" */
  int active;  /* 1 from post until test reports completion */
  size_t bytes; /* the size of the transfer; a received message must match it */
} tnt__xreq_t;

/* Memory that every rank of a single-host transport can address directly.
 * Rank r's region starts at base[r] in this process; all regions have
 * `bytes` bytes, 64-byte aligned, and start zeroed. */
typedef struct tnt__shm {
  int nranks;
  size_t bytes;
  uint8_t **base;
  void *impl;
} tnt__shm_t;

typedef struct tnt__transport tnt__transport_t;

typedef struct tnt__transport_ops {
  const char *name;
  /* Non-blocking transfers; completion is observed with test. */
  tnt_status_t (*isend)(tnt__transport_t *t, tnt__channel_t ch, const void *buf, size_t bytes,
                        int peer, int tag, tnt__xreq_t *req);
  tnt_status_t (*irecv)(tnt__transport_t *t, tnt__channel_t ch, void *buf, size_t bytes, int peer,
                        int tag, tnt__xreq_t *req);
  /* *done = 1 once the transfer completed (then req->active is cleared). A
   * received message of another size than the receive fails with
   * TNT_ERR_MISMATCH: the ranks disagree on the operation. */
  tnt_status_t (*test)(tnt__transport_t *t, tnt__xreq_t *req, int *done);
  /* Abandons a pending transfer after a failure (best effort). */
  void (*cancel)(tnt__transport_t *t, tnt__xreq_t *req);
  /* Creates the transport of the ranks `ranks[0..n-1]` (transport ranks of
   * `t`). Called by exactly the listed ranks, with the same list. */
  tnt_status_t (*split)(tnt__transport_t *t, const int *ranks, int n, tnt__transport_t **out);
  /* Collective: shared memory for a transport whose ranks share one host,
   * `bytes` per rank. NULL when the transport cannot share memory. */
  tnt_status_t (*shm_alloc)(tnt__transport_t *t, size_t bytes, tnt__shm_t **out);
  void (*shm_free)(tnt__transport_t *t, tnt__shm_t *shm);
  /* The transport's own allreduce (MPI_Allreduce), or NULL. Handles SUM,
   * MIN and MAX of every dtype; AVERAGE is finished by the caller. */
  tnt_status_t (*native_allreduce)(tnt__transport_t *t, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const tnt__wait_ctx_t *w);
  void (*destroy)(tnt__transport_t *t);
} tnt__transport_ops_t;

struct tnt__transport {
  const tnt__transport_ops_t *ops;
  int rank;
  int size;
  int *world_ranks; /* [size]: world rank of each transport rank */
  int *host_of;     /* [size]: host index (0..num_hosts-1, by first rank) */
  int num_hosts;
  /* Set once the context has failed: destroy and shm_free then free memory
   * only, and skip the MPI calls that need every peer (MPI_Win_free
   * synchronizes; a dead or stuck peer would keep the process forever). */
  int abandoned;
};

/* Fills world_ranks/host_of of a freshly split transport from its parent.
 * `ranks` are parent ranks. Returns TNT_ERR_NO_MEMORY on failure. */
tnt_status_t tnt__transport_init_subset(tnt__transport_t *child, const tnt__transport_t *parent,
                                        const int *ranks, int n);
/* Frees what tnt__transport_init_subset allocated. */
void tnt__transport_fini_subset(tnt__transport_t *t);

/* ---- blocking helpers built on the non-blocking calls (xfer.c) ---- */

/*
 * Waits until every active request in reqs[0..n-1] completes or w's
 * deadline passes. On expiry it cancels the rest, logs
 *   "<label>: timed out after <T> s waiting for rank <world> (<send|receive>)"
 * and returns TNT_ERR_TIMEOUT.
 */
tnt_status_t tnt__xwait_all(tnt__transport_t *t, tnt__xreq_t *reqs, int n,
                            const tnt__wait_ctx_t *w);

tnt_status_t tnt__xsend(tnt__transport_t *t, const void *buf, size_t bytes, int peer,
                        const tnt__wait_ctx_t *w);
tnt_status_t tnt__xrecv(tnt__transport_t *t, void *buf, size_t bytes, int peer,
                        const tnt__wait_ctx_t *w);
/* Sends to `dst` and receives from `src` at the same time (either size may
 * be 0, in which case that half is skipped). Collective channel. */
tnt_status_t tnt__xsendrecv(tnt__transport_t *t, const void *sbuf, size_t sbytes, int dst,
                            void *rbuf, size_t rbytes, int src, const tnt__wait_ctx_t *w);

/* As tnt__xsendrecv, in pieces of at most `seg` bytes with up to `depth`
 * of them in flight each way (the ring's TNT_RING_SEGMENT_KB and
 * TNT_RING_DEPTH): a transport may move one large message in one direction
 * at a time, many pieces move both ways at once. */
tnt_status_t tnt__xsendrecv_pieces(tnt__transport_t *t, const void *sbuf, size_t sbytes, int dst,
                                   void *rbuf, size_t rbytes, int src, size_t seg, int depth,
                                   const tnt__wait_ctx_t *w);

/* ---- constructors ---- */

/* The MPI transport over a duplicate of MPI_COMM_WORLD (MPI initialized). */
tnt_status_t tnt__transport_mpi_create(tnt__transport_t **out);

#endif
