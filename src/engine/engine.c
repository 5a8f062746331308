/*
 * The engine: one progress thread per context that owns the context's
 * communication.
 *
 * Threading design. Callers never talk to the transport themselves. They
 * wrap each operation in a request and queue it; the engine thread pops
 * requests in submission order and executes them one at a time, so every
 * rank issues collectives in the order its callers submitted them, and the
 * transport (MPI) is only ever entered by one thread at a time. Collectives
 * run to completion (bounded by their deadline); point-to-point transfers
 * are posted and then polled between other work, so a receive that waits
 * for a late sender never blocks the collectives queued behind it.
 *
 * One shortcut keeps small blocking calls as fast as the MPI library's own:
 * when the queue is empty and no executor is busy, a blocking call claims
 * the executor role and runs its operation on the calling thread. The
 * executor role is exclusive (the `busy` flag), so the transport is still
 * entered by one thread at a time and submission order is preserved; the
 * hand-off to and from the engine thread would otherwise cost more than a
 * whole small allreduce on one host.
 *
 * Failures. An operation that fails (timeout, MPI error) records the
 * failure here, with the reason the failing thread gave; queued operations
 * then complete with TNT_ERR_FAILED without running, and so does every
 * later call of the context (the API asks tnt__engine_check).
 *
 * The engine does not know the context, groups or fusion sets above it:
 * work items carry a function and its arguments, and the engine calls back
 * into nothing but them. The one work item it describes itself is the
 * allreduce, which both the API and the fusion runtime submit.
 */
#include "engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/log.h"
#include "util/timeline.h"

struct tnt__engine {
  int rank, size; /* world rank and size, for the log prefix of the thread */
  double timeout;
  /* The first failure: status and explanation, written once under err_mu
   * (not mu: requests fail while the queue lock is held, see engine_main). */
  pthread_mutex_t err_mu;
  _Atomic int error;
  char error_msg[640];
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* work queued, executor released, or stop */
  tnt__work_t *head, *tail;
  int busy; /* an executor (engine thread or inline caller) is running */
  int idle; /* the engine thread sleeps with nothing to do */
  /* Threads asleep on a request of this engine: their cores are free, so
   * the engine thread polls pending transfers without napping (a receive
   * that a caller waits for completes as soon as its data arrives). */
  _Atomic int sleepers;
  int sleeper_arrived; /* under mu: a caller began to sleep (sleeper_enter) */
  int stop;
  /* Engine thread only: posted point-to-point requests. */
  tnt_request_t **active;
  size_t nactive, cap_active;
};

static tnt_request_t *req_of_work(tnt__work_t *work) {
  return (tnt_request_t *)((char *)work - offsetof(tnt_request_t, work));
}

/* ------------------------------------------------------------ failures */

void tnt__engine_fail(tnt__engine_t *e, tnt_status_t st, const char *label) {
  pthread_mutex_lock(&e->err_mu);
  if (atomic_load(&e->error) == TNT_OK) {
    const char *why = tnt__error_message();
    snprintf(e->error_msg, sizeof e->error_msg, "%s failed (%s)%s%s", label, tnt__status_string(st),
             *why ? ": " : "", why);
    atomic_store(&e->error, st);
  }
  pthread_mutex_unlock(&e->err_mu);
}

tnt_status_t tnt__engine_check(const tnt__engine_t *e) {
  return atomic_load(&e->error) == TNT_OK ? TNT_OK : TNT_ERR_FAILED;
}

tnt_status_t tnt__engine_error(const tnt__engine_t *e, const char **message) {
  tnt_status_t st = atomic_load(&e->error);
  if (message != NULL) *message = st == TNT_OK ? "" : e->error_msg;
  return st;
}

double tnt__engine_timeout(const tnt__engine_t *e) {
  return e->timeout;
}

/* ---------------------------------------------------------------- requests */

tnt_status_t tnt__request_new(tnt__engine_t *e, tnt_request_t **out) {
  tnt_request_t *req = calloc(1, sizeof *req);
  if (req == NULL) {
    TNT_LOG_ERROR("out of memory for a request");
    return TNT_ERR_NO_MEMORY;
  }
  req->engine = e;
  atomic_init(&req->status, TNT_IN_PROGRESS);
  atomic_init(&req->refs, 2);
  pthread_mutex_init(&req->mu, NULL);
  tnt_status_t st = tnt__cond_init_monotonic(&req->cv);
  if (st < 0) {
    pthread_mutex_destroy(&req->mu);
    free(req);
    return st;
  }
  *out = req;
  return TNT_OK;
}

void tnt__request_ref(tnt_request_t *req) { atomic_fetch_add(&req->refs, 1); }

void tnt__request_unref(tnt_request_t *req) {
  if (req == NULL || atomic_fetch_sub(&req->refs, 1) != 1) return;
  pthread_mutex_destroy(&req->mu);
  pthread_cond_destroy(&req->cv);
  free(req->work.counts);
  free(req->work.displs);
  free(req->work.owned);
  free(req);
}

static void request_complete(tnt_request_t *req, tnt_status_t st) {
  free(req->work.owned); /* no longer needed, though the request may live on */
  req->work.owned = NULL;
  if (st < 0 && st != TNT_ERR_FAILED) tnt__engine_fail(req->engine, st, req->work.label);
  pthread_mutex_lock(&req->mu);
  atomic_store_explicit(&req->status, st, memory_order_release);
  pthread_cond_broadcast(&req->cv);
  pthread_mutex_unlock(&req->mu);
  tnt__request_unref(req);
}

tnt_status_t tnt__request_test(const tnt_request_t *req) {
  return atomic_load_explicit(&req->status, memory_order_acquire);
}

/* A caller goes to sleep on a request: the first sleeper wakes a napping
 * engine thread, which then polls without naps (see engine_main). */
static void sleeper_enter(tnt__engine_t *e) {
  if (atomic_fetch_add(&e->sleepers, 1) == 0) {
    pthread_mutex_lock(&e->mu);
    e->sleeper_arrived = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
  }
}

static void sleeper_leave(tnt__engine_t *e) { atomic_fetch_sub(&e->sleepers, 1); }

tnt_status_t tnt__request_wait(tnt_request_t *req, double timeout_s) {
  if (timeout_s < 0) timeout_s = req->engine->timeout;
  /* Most operations finish within microseconds: spin briefly before
   * sleeping on the condition variable. */
  for (unsigned it = 0; it < 256; ++it) {
    int st = atomic_load_explicit(&req->status, memory_order_acquire);
    if (st != TNT_IN_PROGRESS) return st;
    tnt__spin_pause(it);
  }
  const double deadline = tnt__now() + timeout_s;
  const struct timespec ts = tnt__abs_time(deadline);
  int st;
  sleeper_enter(req->engine);
  pthread_mutex_lock(&req->mu);
  while ((st = atomic_load(&req->status)) == TNT_IN_PROGRESS) {
    if (pthread_cond_timedwait(&req->cv, &req->mu, &ts) == ETIMEDOUT) {
      st = atomic_load(&req->status);
      break;
    }
  }
  pthread_mutex_unlock(&req->mu);
  sleeper_leave(req->engine);
  if (st == TNT_IN_PROGRESS) {
    /* The request goes on and may still succeed: a warning in the log, and
     * the reason of this call's status. */
    TNT_LOG_WARN("%s: not finished after waiting %.1f s", req->work.label, timeout_s);
    tnt__error_set("%s: not finished after waiting %.1f s", req->work.label, timeout_s);
    return TNT_ERR_TIMEOUT;
  }
  return st;
}

/* Waits for completion without a deadline of its own: every operation is
 * bounded by the deadline the engine gives it, so completion always comes.
 * Blocking calls use this, since returning early would leave the engine
 * writing into a buffer the caller considers free again. */
static tnt_status_t request_wait_done(tnt_request_t *req) {
  for (unsigned it = 0; it < 256; ++it) {
    int st = atomic_load_explicit(&req->status, memory_order_acquire);
    if (st != TNT_IN_PROGRESS) return st;
    tnt__spin_pause(it);
  }
  int st;
  sleeper_enter(req->engine);
  pthread_mutex_lock(&req->mu);
  while ((st = atomic_load(&req->status)) == TNT_IN_PROGRESS) pthread_cond_wait(&req->cv, &req->mu);
  pthread_mutex_unlock(&req->mu);
  sleeper_leave(req->engine);
  return st;
}

/* ------------------------------------------------------------- execution */

/* A collective's slice of the timeline, on the thread that ran it. */
static void timeline_collective(const tnt__work_t *op, double begin, double end, tnt_status_t st) {
  const char *algo = op->algorithm != NULL ? op->algorithm : "";
  const double queued_ms = op->submitted > 0 ? (begin - op->submitted) * 1e3 : 0.0;
  if (op->bucket >= 0) {
    /* Named by the bucket's collective: "allreduce bucket 3", and at ZeRO
     * stages "reduce_scatter bucket 3", "allgather bucket 3". */
    char name[48];
    snprintf(name, sizeof name, "%s bucket %ld", op->call, op->bucket);
    tnt__timeline_complete("comm", name, begin, end,
                           "\"bucket\":%ld,\"bytes\":%zu,\"algorithm\":\"%s\","
                           "\"queued_ms\":%.3f,\"status\":%d",
                           op->bucket, op->bytes, algo, queued_ms, (int)st);
  } else {
    tnt__timeline_complete("comm", op->call != NULL ? op->call : op->label, begin, end,
                           "\"bytes\":%zu,\"algorithm\":\"%s\",\"queued_ms\":%.3f,"
                           "\"status\":%d,\"label\":\"%s\"",
                           op->bytes, algo, queued_ms, (int)st, op->label);
  }
}

static tnt_status_t run_collective(tnt__engine_t *e, tnt__work_t *op) {
  tnt_status_t st = tnt__engine_check(e);
  if (st < 0) return st;
  tnt__wait_ctx_t w = tnt__wait_ctx(e->timeout, op->label);
  w.sig = &op->sig;
  if (!TNT__TIMELINE_ON()) return op->run(op, &w);
  const double begin = tnt__now();
  st = op->run(op, &w);
  timeline_collective(op, begin, tnt__now(), st);
  return st;
}

static void fail_active(tnt__engine_t *e, size_t i, tnt_status_t st) {
  tnt_request_t *req = e->active[i];
  tnt__transport_t *t = req->work.comm->t;
  if (req->work.xreq.active) t->ops->cancel(t, &req->work.xreq);
  e->active[i] = e->active[--e->nactive];
  request_complete(req, st);
}

static void post_p2p(tnt__engine_t *e, tnt_request_t *req) {
  tnt__work_t *op = &req->work;
  tnt_status_t st = tnt__engine_check(e);
  if (st >= 0 && e->nactive == e->cap_active) {
    size_t cap = e->cap_active ? 2 * e->cap_active : 16;
    tnt_request_t **a = realloc(e->active, cap * sizeof *a);
    if (a == NULL) {
      st = TNT_ERR_NO_MEMORY;
    } else {
      e->active = a;
      e->cap_active = cap;
    }
  }
  if (st >= 0) {
    tnt__transport_t *t = op->comm->t;
    size_t bytes = op->count * tnt__dtype_size(op->dtype);
    op->deadline = tnt__now() + e->timeout;
    if (op->kind == TNT__WORK_SEND) {
      st = t->ops->isend(t, TNT__CH_P2P, op->sendbuf, bytes, op->peer, op->tag, &op->xreq);
    } else {
      st = t->ops->irecv(t, TNT__CH_P2P, op->recvbuf, bytes, op->peer, op->tag, &op->xreq);
    }
  }
  if (st < 0) {
    request_complete(req, st);
    return;
  }
  e->active[e->nactive++] = req;
}

/* Tests every posted transfer once; returns how many are still pending. */
static size_t poll_p2p(tnt__engine_t *e) {
  double now = 0;
  for (size_t i = 0; i < e->nactive;) {
    tnt_request_t *req = e->active[i];
    tnt__transport_t *t = req->work.comm->t;
    int done = 0;
    tnt_status_t st = t->ops->test(t, &req->work.xreq, &done);
    if (st < 0) {
      fail_active(e, i, st);
    } else if (done) {
      e->active[i] = e->active[--e->nactive];
      request_complete(req, TNT_OK);
    } else {
      if (now == 0) now = tnt__now();
      if (now > req->work.deadline) {
        TNT_LOG_ERROR("%s: timed out after %.1f s waiting for rank %d", req->work.label, e->timeout,
                      t->world_ranks[req->work.peer]);
        fail_active(e, i, TNT_ERR_TIMEOUT);
      } else {
        ++i;
      }
    }
  }
  return e->nactive;
}

static void execute(tnt__engine_t *e, tnt__work_t *op) {
  tnt_request_t *req = req_of_work(op);
  if (op->kind == TNT__WORK_RUN) {
    request_complete(req, run_collective(e, op));
  } else {
    post_p2p(e, req);
  }
}

/* How long the engine thread spins on pending transfers while a caller
 * sleeps on a request, before it naps again. */
#define SLEEPER_SPIN_S 2e-3
/* Naps while transfers are pending and nobody waits for one: the first
 * lasts NAP_MIN_S, each nap after which nothing completed twice the last,
 * up to NAP_MAX_S. A pipeline keeps sends and early receives pending most
 * of a step; polling them every 100 us costs a rank whose cores all
 * compute (as many ranks as cores) a tenth of a core in wake-ups. A waiter
 * ends the naps at once (sleeper_enter), so they delay only transfers
 * that nobody waits for yet. */
#define NAP_MIN_S 100e-6
#define NAP_MAX_S 1e-3

static void *engine_main(void *arg) {
  tnt__engine_t *e = arg;
  tnt__log_set_rank(e->rank, e->size, 1);
  tnt__timeline_name_thread("progress");
  pthread_setname_np(pthread_self(), "tnt-progress"); /* as top -H and gdb show it */
  unsigned idle = 0;
  double spin_until = 0; /* see SLEEPER_SPIN_S */
  double nap = NAP_MIN_S;
  size_t was_pending = 0;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (e->busy || (e->head == NULL && e->nactive == 0 && !e->stop)) {
      e->idle = !e->busy && e->head == NULL && e->nactive == 0;
      pthread_cond_wait(&e->cv, &e->mu);
    }
    e->idle = 0;
    if (e->head == NULL && e->stop) {
      if (e->nactive > 0) {
        TNT_LOG_WARN("context destroyed with %zu point-to-point transfers pending", e->nactive);
      }
      while (e->nactive > 0) fail_active(e, e->nactive - 1, TNT_ERR_STATE);
      break;
    }
    tnt__work_t *op = e->head;
    if (op != NULL) {
      e->head = op->next;
      if (e->head == NULL) e->tail = NULL;
    }
    e->busy = 1;
    pthread_mutex_unlock(&e->mu);

    if (op != NULL) execute(e, op);
    size_t pending = poll_p2p(e);

    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    pthread_cond_broadcast(&e->cv);
    if (op != NULL || pending < was_pending) nap = NAP_MIN_S; /* progress: poll soon */
    was_pending = pending;
    if (e->sleeper_arrived) { /* spin for the new waiter (SLEEPER_SPIN_S) */
      e->sleeper_arrived = 0;
      spin_until = 0;
    }
    if (op == NULL && pending > 0 && e->head == NULL) {
      /* Only transfers in flight: poll, spinning at first and then sleeping
       * in naps (NAP_MIN_S to NAP_MAX_S) so that a long-pending receive
       * costs little CPU. While a caller sleeps on a request (its core is
       * free) the spinning lasts up to SLEEPER_SPIN_S: a transfer that
       * completes within it (a pipeline stage's next activations) is seen
       * at once, not after a nap and a wake-up. */
      if (idle >= 1024 && spin_until == 0 &&
          atomic_load_explicit(&e->sleepers, memory_order_relaxed) > 0) {
        spin_until = tnt__now() + SLEEPER_SPIN_S;
      }
      if (idle < 1024 || (spin_until > 0 && tnt__now() < spin_until)) {
        pthread_mutex_unlock(&e->mu);
        tnt__spin_pause(idle < 1024 ? idle++ : idle);
        pthread_mutex_lock(&e->mu);
      } else {
        struct timespec ts = tnt__abs_time(tnt__now() + nap);
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        nap = nap * 2 < NAP_MAX_S ? nap * 2 : NAP_MAX_S;
      }
    } else {
      idle = 0;
      spin_until = 0;
    }
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

void tnt__engine_submit(tnt__engine_t *e, tnt_request_t *req) {
  tnt__work_t *op = &req->work;
  op->next = NULL;
  if (TNT__TIMELINE_ON()) op->submitted = tnt__now();
  pthread_mutex_lock(&e->mu);
  if (e->tail != NULL) {
    e->tail->next = op;
  } else {
    e->head = op;
  }
  e->tail = op;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

tnt_status_t tnt__engine_run(tnt__engine_t *e, tnt_request_t *req) {
  pthread_mutex_lock(&e->mu);
  int inline_ok = req->work.kind == TNT__WORK_RUN && !e->busy && e->head == NULL;
  if (inline_ok) e->busy = 1;
  pthread_mutex_unlock(&e->mu);
  tnt_status_t st;
  if (inline_ok) {
    st = run_collective(e, &req->work);
    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    /* Waking an engine that has nothing to do would only steal a core from
     * the ranks. */
    if (!e->idle) pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (st < 0 && st != TNT_ERR_FAILED) tnt__engine_fail(e, st, req->work.label);
    tnt__request_unref(req); /* the engine's reference, never handed over */
  } else {
    tnt__engine_submit(e, req);
    st = request_wait_done(req);
  }
  tnt__request_unref(req);
  return st;
}

tnt_status_t tnt__engine_submit_wait(tnt__engine_t *e, tnt_request_t *req) {
  tnt__engine_submit(e, req);
  tnt_status_t st = request_wait_done(req);
  tnt__request_unref(req);
  return st;
}

tnt_status_t tnt__engine_call(tnt__engine_t *e, tnt__comm_t *comm, const char *label,
                              tnt__work_fn fn, void *arg) {
  tnt_request_t *req = NULL;
  TNT_CHECK(tnt__request_new(e, &req));
  req->work.kind = TNT__WORK_RUN;
  req->work.run = fn;
  req->work.arg = arg;
  req->work.comm = comm;
  req->work.bucket = -1;
  snprintf(req->work.label, sizeof req->work.label, "%s", label);
  return tnt__engine_run(e, req);
}

/* ---------------------------------------------------------- work items */

tnt_status_t tnt__engine_work(tnt__engine_t *e, tnt__comm_t *comm, const tnt__work_t *proto,
                              tnt_request_t **out) {
  TNT_CHECK(tnt__request_new(e, out));
  tnt__work_t *work = &(*out)->work;
  *work = *proto;
  work->comm = comm;
  if (work->label[0] == '\0') {
    snprintf(work->label, sizeof work->label, "%s of %zu bytes", work->call, work->bytes);
  }
  return TNT_OK;
}

tnt_status_t tnt__engine_post(tnt__engine_t *e, tnt_request_t *req, tnt_request_t **out) {
  if (out == NULL) {
    return req->work.kind == TNT__WORK_RUN ? tnt__engine_run(e, req)
                                           : tnt__engine_submit_wait(e, req);
  }
  tnt__engine_submit(e, req);
  *out = req;
  return TNT_OK;
}

static tnt_status_t allreduce_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  const tnt__algo_t *a = tnt__algo_select(work->comm, TNT__COLL_ALLREDUCE, work->bytes);
  work->algorithm = a->name;
  return a->fn.allreduce(work->comm, work->sendbuf, work->recvbuf, work->count, work->dtype,
                         work->op, w);
}

tnt_status_t tnt__engine_allreduce(tnt__engine_t *e, tnt__comm_t *comm, const void *sendbuf,
                                   void *recvbuf, size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const char *label, long bucket, tnt_request_t **req) {
  tnt__work_t work = {
      .kind = TNT__WORK_RUN, .run = allreduce_run, .call = "allreduce", .bucket = bucket,
      .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op,
      .bytes = count * tnt__dtype_size(dtype),
      .sig = {.count = count, .kind = TNT__COLL_ALLREDUCE, .dtype = (uint8_t)dtype,
              .op = (uint8_t)op, .set = 1}};
  if (label != NULL) snprintf(work.label, sizeof work.label, "%s", label);
  tnt_request_t *r = NULL;
  TNT_CHECK(tnt__engine_work(e, comm, &work, &r));
  return tnt__engine_post(e, r, req);
}

static tnt_status_t reduce_scatter_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  uint8_t *scratch = work->arg;
  if (scratch == NULL) {
    scratch = malloc(work->bytes + 1);
    if (scratch == NULL) {
      TNT_LOG_ERROR("%s: out of memory for a copy of the input", work->label);
      return TNT_ERR_NO_MEMORY;
    }
    if (work->bytes > 0) memcpy(scratch, work->sendbuf, work->bytes);
  }
  const tnt_status_t st =
      tnt__reduce_scatter(work->comm, scratch, work->recvbuf, work->count, work->displs,
                          work->dtype, work->op, w, &work->algorithm);
  if (scratch != work->arg) free(scratch);
  return st;
}

/* A hash of a reduce-scatter's block bounds for its signature (0: the
 * tnt__slice partition), so that ranks that cut the vector differently
 * fail with TNT_ERR_MISMATCH where shared memory compares signatures. */
static int32_t bounds_hash(const size_t *bounds, int n) {
  if (bounds == NULL) return 0;
  uint64_t h = 1469598103934665603ull;
  for (int q = 0; q <= n; ++q) h = (h ^ (uint64_t)bounds[q]) * 1099511628211ull;
  return (int32_t)(uint32_t)(h ^ (h >> 32)) | 1;
}

tnt_status_t tnt__engine_reduce_scatter(tnt__engine_t *e, tnt__comm_t *comm, const void *sendbuf,
                                        void *scratch, void *recvbuf, size_t count,
                                        size_t *bounds, tnt_dtype_t dtype, tnt_op_t op,
                                        const char *label, long bucket, tnt_request_t **req) {
  tnt__work_t work = {
      .kind = TNT__WORK_RUN, .run = reduce_scatter_run, .call = "reduce_scatter",
      .bucket = bucket, .arg = scratch, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
      .dtype = dtype, .op = op, .bytes = count * tnt__dtype_size(dtype),
      .sig = {.count = count, .root = bounds_hash(bounds, comm->size),
              .kind = TNT__COLL_REDUCE_SCATTER, .dtype = (uint8_t)dtype, .op = (uint8_t)op,
              .set = 1}};
  if (label != NULL) snprintf(work.label, sizeof work.label, "%s", label);
  tnt_request_t *r = NULL;
  tnt_status_t st = tnt__engine_work(e, comm, &work, &r);
  if (st < 0) {
    free(bounds);
    if (sendbuf == NULL) free(scratch);
    return st;
  }
  r->work.displs = bounds;
  if (sendbuf == NULL) r->work.owned = scratch;
  return tnt__engine_post(e, r, req);
}

static tnt_status_t allgatherv_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  const tnt__algo_t *a = tnt__algo_select(work->comm, TNT__COLL_ALLGATHERV, work->bytes);
  work->algorithm = a->name;
  return a->fn.allgatherv(work->comm, work->sendbuf, work->recvbuf, work->counts, work->displs, w);
}

tnt_status_t tnt__engine_allgatherv(tnt__engine_t *e, tnt__comm_t *comm, const void *sendbuf,
                                    void *recvbuf, size_t *counts, size_t *displs, size_t total,
                                    const char *label, long bucket, tnt_request_t **req) {
  tnt__work_t work = {
      .kind = TNT__WORK_RUN, .run = allgatherv_run, .call = "allgather", .bucket = bucket,
      .sendbuf = sendbuf, .recvbuf = recvbuf, .bytes = total,
      .sig = {.count = total, .kind = TNT__COLL_ALLGATHERV, .set = 1}};
  if (label != NULL) snprintf(work.label, sizeof work.label, "%s", label);
  tnt_request_t *r = NULL;
  tnt_status_t st = tnt__engine_work(e, comm, &work, &r);
  if (st < 0) {
    free(counts);
    free(displs);
    return st;
  }
  r->work.counts = counts;
  r->work.displs = displs;
  return tnt__engine_post(e, r, req);
}

/* ---------------------------------------------------------- life cycle */

tnt_status_t tnt__engine_create(int rank, int size, double timeout_s, tnt__engine_t **out) {
  tnt__engine_t *e = calloc(1, sizeof *e);
  if (e == NULL) {
    TNT_LOG_ERROR("out of memory for the engine");
    return TNT_ERR_NO_MEMORY;
  }
  e->rank = rank;
  e->size = size;
  e->timeout = timeout_s;
  atomic_init(&e->error, TNT_OK);
  atomic_init(&e->sleepers, 0);
  pthread_mutex_init(&e->err_mu, NULL);
  pthread_mutex_init(&e->mu, NULL);
  /* Monotonic: the nap between polls of pending transfers is a timed wait
   * on this variable (see engine_main). */
  tnt_status_t st = tnt__cond_init_monotonic(&e->cv);
  if (st < 0) {
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->err_mu);
    free(e);
    return st;
  }
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->err_mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    TNT_LOG_ERROR("cannot start the progress thread");
    return TNT_ERR_NO_MEMORY;
  }
  *out = e;
  return TNT_OK;
}

tnt_status_t tnt__engine_destroy(tnt__engine_t *e) {
  if (e == NULL) return TNT_OK;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  const tnt_status_t failed = tnt__engine_check(e);
  pthread_mutex_destroy(&e->mu);
  pthread_mutex_destroy(&e->err_mu);
  pthread_cond_destroy(&e->cv);
  free(e->active);
  free(e);
  return failed;
}
