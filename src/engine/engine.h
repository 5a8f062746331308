/*
 * The engine: the executor of a context's communication. See engine.c for
 * the threading design.
 */
#ifndef TNT_ENGINE_ENGINE_H
#define TNT_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "collectives/collectives.h"
#include "tnt/tnt.h"

typedef struct tnt__op tnt__op_t;
typedef tnt_status_t (*tnt__op_run_fn)(tnt__op_t *op, const tnt__wait_ctx_t *w);

typedef enum tnt__op_kind {
  TNT__OP_RUN = 0,  /* runs to completion on the executor (collectives) */
  TNT__OP_SEND = 1, /* posted, then polled (point-to-point) */
  TNT__OP_RECV = 2
} tnt__op_kind_t;

/* One unit of work. Embedded in its request; arguments are owned by the
 * caller as the public API documents, except `counts`/`displs`, which the
 * request owns. */
struct tnt__op {
  tnt__op_kind_t kind;
  tnt__op_run_fn run;
  tnt__comm_t *comm;
  struct tnt_group *group;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  tnt_dtype_t dtype;
  tnt_op_t op;
  int root; /* broadcast root, or p2p peer */
  int tag;
  size_t *counts, *displs; /* bytes, for allgatherv */
  tnt__coll_sig_t sig;     /* collectives: what every member must agree on */
  tnt__xreq_t xreq;
  double deadline;
  char label[112];
  tnt__op_t *next;
  /* For the timeline: the public call ("allreduce", NULL for internal
   * operations) and its bytes, the fusion bucket it reduces (-1: none)
   * and when it was queued (0: run inline). */
  const char *call;
  size_t bytes;
  long bucket;
  double submitted;
};

struct tnt_request {
  tnt_context_t *ctx;
  _Atomic int status; /* TNT_IN_PROGRESS until the op completes */
  _Atomic int refs;   /* the caller's and the engine's */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tnt_done_fn done; /* completion callback, at most one */
  void *done_arg;
  tnt__op_t op;
};

/* Calls done(arg, status) once the request completes: right away on this
 * thread if it already has, else on the thread that completes it. */
void tnt__request_on_complete(tnt_request_t *req, tnt_done_fn done, void *arg);

typedef struct tnt__engine tnt__engine_t;

tnt_status_t tnt__engine_create(tnt_context_t *ctx, tnt__engine_t **out);
/* Stops the thread after the queued work has run; fails what is left of
 * point-to-point transfers. */
void tnt__engine_destroy(tnt__engine_t *e);

/* A request with two references (caller and engine), status in progress. */
tnt_status_t tnt__request_new(tnt_context_t *ctx, tnt_request_t **out);
void tnt__request_unref(tnt_request_t *req);
/* Adds a reference (released with tnt__request_unref). */
void tnt__request_ref(tnt_request_t *req);

/* Queues the request's op; the engine takes over its reference. */
void tnt__engine_submit(tnt__engine_t *e, tnt_request_t *req);
/* Runs a request to completion and drops both references: on the calling
 * thread when the engine is idle, else through the queue. Returns the op's
 * status. Bounded by the timeouts of the operations queued before it. */
tnt_status_t tnt__engine_run(tnt__engine_t *e, tnt_request_t *req);
/* Submits a request and waits for it like tnt__engine_run, for operations
 * that must go through the queue (point-to-point). Drops both references. */
tnt_status_t tnt__engine_submit_wait(tnt__engine_t *e, tnt_request_t *req);

/* tnt_iallreduce with the label that logs and errors use for it (NULL: the
 * default "allreduce of N bytes"); req == NULL runs it blocking. */
tnt_status_t tnt__iallreduce_labeled(struct tnt_group *g, const void *sendbuf, void *recvbuf,
                                     size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                     const char *label, tnt_request_t **req);
/* tnt__iallreduce_labeled of fusion bucket `bucket`, which the timeline
 * names. */
tnt_status_t tnt__iallreduce_bucket(struct tnt_group *g, const void *sendbuf, void *recvbuf,
                                    size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                    const char *label, long bucket, tnt_request_t **req);

#endif
