/*
 * The engine: the executor of a context's communication, and the keeper of
 * its failure record. See engine.c for the threading design.
 *
 * The engine knows nothing of contexts, groups or fusion sets: the layers
 * above (src/api, src/fusion) describe each operation as a work item, a
 * function and its arguments, and the engine runs it in submission order.
 * Below the engine are the collectives (src/collectives) that work items
 * call.
 */
#ifndef TNT_ENGINE_ENGINE_H
#define TNT_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "collectives/collectives.h"
#include "tnt/tnt.h"

typedef struct tnt__engine tnt__engine_t;
typedef struct tnt__work tnt__work_t;

/* Runs a work item on the executor; bounded by the wait context `w`. */
typedef tnt_status_t (*tnt__work_fn)(tnt__work_t *work, const tnt__wait_ctx_t *w);

typedef enum tnt__work_kind {
  TNT__WORK_RUN = 0,  /* `run` runs to completion on the executor (collectives, set-up) */
  TNT__WORK_SEND = 1, /* posted, then polled (point-to-point) */
  TNT__WORK_RECV = 2
} tnt__work_kind_t;

/* One unit of work. Embedded in its request; buffers are owned by the
 * caller as the public API documents, `counts`/`displs` by the request. */
struct tnt__work {
  tnt__work_kind_t kind;
  tnt__work_fn run; /* TNT__WORK_RUN only */
  void *arg;        /* what `run` needs beyond the fields below (set-up work) */
  tnt__comm_t *comm;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  tnt_dtype_t dtype;
  tnt_op_t op;             /* the reduction of an allreduce */
  int root;                /* the rank that a broadcast sends from */
  int peer;                /* the other side of a point-to-point transfer */
  int tag;                 /* point-to-point only */
  size_t *counts, *displs; /* bytes, for allgatherv; displs: a reduce-scatter's block bounds */
  void *owned;             /* a buffer the work took over: freed once it has run */
  tnt__coll_sig_t sig;     /* collectives: what every member must agree on */
  tnt__xreq_t xreq;        /* point-to-point: the posted transfer */
  double deadline;         /* point-to-point: when the posted transfer fails */
  char label[112];
  tnt__work_t *next; /* in the engine's queue */
  /* For the timeline: the public call ("allreduce", NULL for internal
   * work) and its bytes, the algorithm that `run` chose, the fusion bucket
   * it reduces (-1: none) and when it was queued (0: run inline). */
  const char *call;
  const char *algorithm;
  size_t bytes;
  long bucket;
  double submitted;
};

struct tnt_request {
  tnt__engine_t *engine;
  _Atomic int status; /* TNT_IN_PROGRESS until the work completes */
  _Atomic int refs;   /* the caller's and the engine's */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tnt__work_t work;
};

/* ---------------------------------------------------------- life cycle */

/* Starts the progress thread of a context of world rank `rank` of `size`
 * whose waits last at most `timeout_s`. */
tnt_status_t tnt__engine_create(int rank, int size, double timeout_s, tnt__engine_t **out);
/* Stops the thread after the queued work has run, fails what is left of
 * point-to-point transfers, and frees the engine. Returns TNT_OK, or
 * TNT_ERR_FAILED when a failure had been recorded (by then). */
tnt_status_t tnt__engine_destroy(tnt__engine_t *e);

double tnt__engine_timeout(const tnt__engine_t *e);

/* ------------------------------------------------------------ failures */

/* Records the first failure: `st` and a message built from `label` and the
 * reason the failing thread gave last (tnt__error_message). */
void tnt__engine_fail(tnt__engine_t *e, tnt_status_t st, const char *label);
/* TNT_OK, or TNT_ERR_FAILED once a failure was recorded. */
tnt_status_t tnt__engine_check(const tnt__engine_t *e);
/* TNT_OK or the status of the first failure; `message` (may be NULL)
 * receives its explanation ("" while there is none), valid as long as e. */
tnt_status_t tnt__engine_error(const tnt__engine_t *e, const char **message);

/* ------------------------------------------------------------ requests */

/* A request with two references (caller and engine), status in progress,
 * its work zeroed. */
tnt_status_t tnt__request_new(tnt__engine_t *e, tnt_request_t **out);
void tnt__request_ref(tnt_request_t *req);
void tnt__request_unref(tnt_request_t *req);
/* TNT_OK when done, TNT_IN_PROGRESS while running, < 0 when it failed. */
tnt_status_t tnt__request_test(const tnt_request_t *req);
/* Waits at most `timeout_s` (< 0: the engine's timeout); TNT_ERR_TIMEOUT
 * (logged) when the request is still running then. */
tnt_status_t tnt__request_wait(tnt_request_t *req, double timeout_s);

/* ---------------------------------------------------------- submission */

/* Queues the request's work; the engine takes over its reference. */
void tnt__engine_submit(tnt__engine_t *e, tnt_request_t *req);
/* Runs a request to completion and drops both references: on the calling
 * thread when the engine is idle, else through the queue. Returns the
 * work's status. Bounded by the timeouts of the work queued before it. */
tnt_status_t tnt__engine_run(tnt__engine_t *e, tnt_request_t *req);
/* Submits a request and waits for it like tnt__engine_run, for work that
 * must go through the queue (point-to-point). Drops both references. */
tnt_status_t tnt__engine_submit_wait(tnt__engine_t *e, tnt_request_t *req);
/* Runs `fn` with `arg` (work->arg) on the executor, in order with the
 * collectives, and returns its status: for set-up work such as creating
 * a group's communicator over `comm`. */
tnt_status_t tnt__engine_call(tnt__engine_t *e, tnt__comm_t *comm, const char *label,
                              tnt__work_fn fn, void *arg);

/* ---------------------------------------------------------- work items */

/* A request on `comm` for the work that `proto` describes, labelled
 * "<call> of <bytes> bytes" unless proto has a label; references as
 * tnt__request_new. */
tnt_status_t tnt__engine_work(tnt__engine_t *e, tnt__comm_t *comm, const tnt__work_t *proto,
                              tnt_request_t **out);
/* Submits `req` with *out as the caller's reference, or, with out == NULL,
 * runs it blocking (tnt__engine_run, or tnt__engine_submit_wait for
 * point-to-point work) and returns its status. */
tnt_status_t tnt__engine_post(tnt__engine_t *e, tnt_request_t *req, tnt_request_t **out);
/* An allreduce on `comm` labelled `label` (NULL: "allreduce of N bytes")
 * for fusion bucket `bucket` (-1: none), posted as tnt__engine_post does.
 * Checks nothing: the caller has validated the arguments. */
tnt_status_t tnt__engine_allreduce(tnt__engine_t *e, tnt__comm_t *comm, const void *sendbuf,
                                   void *recvbuf, size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const char *label, long bucket, tnt_request_t **req);
/*
 * A reduce-scatter (tnt__reduce_scatter) of `count` elements on `comm` into
 * recvbuf, posted as tnt__engine_post does. The input is either `scratch`,
 * which it takes over, overwrites and frees once it has run, or at once on
 * failure (sendbuf NULL; a fusion bucket's whole vector, which then lives
 * no longer than its reduce-scatter), or `sendbuf`, which it copies into a
 * scratch vector of its own when it runs (scratch NULL). `bounds`: the
 * comm->size + 1 element offsets of the blocks, taken over by the call
 * (freed with the request, or at once on failure), or NULL for the
 * tnt__slice partition. Checks nothing.
 */
tnt_status_t tnt__engine_reduce_scatter(tnt__engine_t *e, tnt__comm_t *comm, const void *sendbuf,
                                        void *scratch, void *recvbuf, size_t count,
                                        size_t *bounds, tnt_dtype_t dtype, tnt_op_t op,
                                        const char *label, long bucket, tnt_request_t **req);
/* An allgatherv of bytes on `comm`: rank r's counts[r] bytes land at
 * recvbuf + displs[r] (sendbuf may be that place itself). counts and displs
 * (comm->size each) are taken over by the call, as bounds above; `total`
 * is the sum of counts. Posted as tnt__engine_post does; checks nothing. */
tnt_status_t tnt__engine_allgatherv(tnt__engine_t *e, tnt__comm_t *comm, const void *sendbuf,
                                    void *recvbuf, size_t *counts, size_t *displs, size_t total,
                                    const char *label, long bucket, tnt_request_t **req);

#endif
