/*
 * Tensor fusion at run time. Tensors are copied into the bucket that the
 * planner assigned them; a bucket's allreduce is submitted once all of its
 * members have started, and buckets are always submitted in plan order.
 * Since every rank submits the same buckets in the same order, ranks may
 * start their tensors in any order without deadlock, and since each bucket
 * is reduced by the same algorithm in a fixed order, the results are
 * bitwise identical on every rank and in every run.
 *
 * A bucket is one round at a time: after all its members have finished
 * (copied their result out), it is reset for the next round of starts.
 *
 * Finishing comes in two forms. tnt_fusion_finish blocks the caller.
 * tnt_fusion_finish_async queues a waiter on the bucket; when the bucket's
 * allreduce completes, the engine thread copies the results out and calls
 * the waiters back, so a framework can wait for many tensors without
 * parking a thread on each. A watchdog thread fails waiters whose bucket
 * is not done within the timeout, naming what this rank has not started.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>

#include "core/context.h"
#include "core/handles.h"
#include "core/log.h"
#include "core/timeline.h"
#include "engine/engine.h"
#include "fusion/planner.h"

enum { IDLE = 0, STARTED = 1, FINISHED = 2 };

typedef struct waiter {
  size_t index; /* tensor */
  void *out;
  tnt_done_fn done;
  void *arg;
  double deadline;
  struct waiter *next;
} waiter_t;

typedef struct bucket {
  uint8_t *buf;
  size_t started, finished;
  tnt_request_t *req; /* the round's allreduce, once submitted */
  int completed;      /* req has completed (its callback ran) */
  tnt_status_t status; /* of req, once completed */
  waiter_t *waiters;  /* asynchronous finishes of this round */
  char label[112];
} bucket_t;

/* What the completion callback of one round's allreduce needs. */
typedef struct round_ref {
  tnt_fusion_t *f;
  size_t bucket;
  tnt_request_t *req;
} round_ref_t;

typedef struct id_index {
  uint64_t id;
  size_t index;
} id_index_t;

struct tnt_fusion {
  tnt_group_t *g;
  tnt_op_t op;
  tnt__fusion_plan_t plan;
  tnt_tensor_info_t *tensors;
  id_index_t *by_id; /* sorted by id */
  uint8_t *state;    /* per tensor: IDLE, STARTED, FINISHED */
  bucket_t *buckets;
  size_t next_issue; /* the bucket whose allreduce goes next */
  int64_t handle;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a bucket was submitted or reset, or the watchdog must stop */
  pthread_t watchdog;
  int watchdog_running, stopping;
  size_t nwaiters; /* asynchronous finishes pending, all buckets */
  size_t ncallbacks; /* completion callbacks attached and not yet over */
};

tnt_fusion_t *tnt_fusion_lookup(int64_t handle) {
  return tnt__handle_get(TNT__HANDLE_FUSION, handle);
}

int64_t tnt_fusion_handle(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->handle;
}

static int cmp_id(const void *a, const void *b) {
  uint64_t x = ((const id_index_t *)a)->id, y = ((const id_index_t *)b)->id;
  return x < y ? -1 : x > y;
}

static long find(const tnt_fusion_t *f, uint64_t id) {
  size_t lo = 0, hi = f->plan.ntensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (f->by_id[mid].id == id) return (long)f->by_id[mid].index;
    if (f->by_id[mid].id < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return -1;
}

/* The index of tensor `id`, or -1 after logging that `call` got an id
 * that is not in the set. */
static long find_tensor(const tnt_fusion_t *f, uint64_t id, const char *call) {
  const long i = find(f, id);
  if (i < 0) {
    TNT_LOG_ERROR("%s: tensor id %llu is not in the fusion set", call, (unsigned long long)id);
  }
  return i;
}

/* Every rank must fuse the same list: compare a hash of it across ranks
 * so that a mismatch is an error now rather than a hang later. */
static tnt_status_t check_same_list(tnt_group_t *g, const tnt_tensor_info_t *t, size_t n,
                                    size_t threshold) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v[4] = {t[i].id, t[i].count, (uint64_t)t[i].dtype, threshold};
    for (int k = 0; k < 4; ++k) h = (h ^ v[k]) * 1099511628211ull;
  }
  int64_t mine[2] = {(int64_t)(h >> 1), ~(int64_t)(h >> 1)};
  int64_t most[2];
  TNT_CHECK(tnt__iallreduce_labeled(g, mine, most, 2, TNT_INT64, TNT_MAX,
                                    "fusion set agreement", NULL));
  if (most[0] != mine[0] || most[1] != mine[1]) {
    TNT_LOG_ERROR("ranks disagree on the fused tensor list or threshold (%zu tensors here); "
                  "every rank must create the fusion set with the same list",
                  n);
    return TNT_ERR_INVALID_ARG;
  }
  return TNT_OK;
}

tnt_status_t tnt_fusion_create(tnt_group_t *g, const tnt_tensor_info_t *tensors, size_t n,
                               size_t threshold_bytes, tnt_op_t op, tnt_fusion_t **out) {
  if (g == NULL || out == NULL || (tensors == NULL && n > 0) || (unsigned)op >= TNT_OP_COUNT) {
    TNT_LOG_ERROR("tnt_fusion_create: need a group, a tensor list, a valid op and an output");
    return TNT_ERR_INVALID_ARG;
  }
  TNT_CHECK(tnt__context_check(g->ctx));
  tnt_fusion_t *f = calloc(1, sizeof *f);
  if (f == NULL) return TNT_ERR_NO_MEMORY;
  f->g = g;
  f->op = op;
  pthread_mutex_init(&f->mu, NULL);
  /* Monotonic: the stall warning, the deadline of a blocking finish and the
   * watchdog's tick are timed waits on this variable. */
  tnt_status_t st = tnt__cond_init_monotonic(&f->cv);
  if (st < 0) {
    pthread_mutex_destroy(&f->mu);
    free(f);
    return st;
  }
  TNT_CHECK_GOTO(tnt__fusion_plan(tensors, n, threshold_bytes, &f->plan), st, fail);
  TNT_CHECK_GOTO(check_same_list(g, tensors, n, threshold_bytes), st, fail);
  f->tensors = malloc(n * sizeof *f->tensors + 1);
  f->by_id = malloc(n * sizeof *f->by_id + 1);
  f->state = calloc(n + 1, 1);
  f->buckets = calloc(f->plan.nbuckets + 1, sizeof *f->buckets);
  if (f->tensors == NULL || f->by_id == NULL || f->state == NULL || f->buckets == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  memcpy(f->tensors, tensors, n * sizeof *tensors);
  for (size_t i = 0; i < n; ++i) f->by_id[i] = (id_index_t){tensors[i].id, i};
  qsort(f->by_id, n, sizeof *f->by_id, cmp_id);
  for (size_t b = 0; b < f->plan.nbuckets; ++b) {
    const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
    f->buckets[b].buf = malloc(bp->count * tnt_dtype_size(bp->dtype) + 1);
    if (f->buckets[b].buf == NULL) {
      st = TNT_ERR_NO_MEMORY;
      goto fail;
    }
    snprintf(f->buckets[b].label, sizeof f->buckets[b].label,
             "allreduce of fusion bucket %zu (%zu tensors, %zu bytes)", b, bp->nmembers,
             bp->count * tnt_dtype_size(bp->dtype));
  }
  TNT_CHECK_GOTO(tnt__handle_add(TNT__HANDLE_FUSION, f, &f->handle), st, fail);
  TNT_LOG_DEBUG("fusion: %zu tensors in %zu buckets (threshold %zu bytes)", n, f->plan.nbuckets,
                threshold_bytes);
  *out = f;
  return TNT_OK;
fail:
  tnt_fusion_destroy(f);
  return st;
}

static void fail_all_waiters(tnt_fusion_t *f, tnt_status_t st);

tnt_status_t tnt_fusion_destroy(tnt_fusion_t *f) {
  if (f == NULL) return TNT_OK;
  tnt__handle_remove(f->handle);
  pthread_mutex_lock(&f->mu);
  f->stopping = 1;
  pthread_cond_broadcast(&f->cv);
  int joined = f->watchdog_running;
  pthread_mutex_unlock(&f->mu);
  if (joined) pthread_join(f->watchdog, NULL);
  pthread_mutex_lock(&f->mu);
  const size_t pending = f->nwaiters;
  pthread_mutex_unlock(&f->mu);
  if (pending > 0) {
    TNT_LOG_WARN("fusion set destroyed with %zu asynchronous finishes pending", pending);
    fail_all_waiters(f, TNT_ERR_STATE);
  }
  /* Completion callbacks still to run would touch the set: let them end.
   * Every allreduce is bounded by the engine's deadline, so they do. */
  pthread_mutex_lock(&f->mu);
  while (f->ncallbacks > 0) pthread_cond_wait(&f->cv, &f->mu);
  pthread_mutex_unlock(&f->mu);
  tnt_status_t st = TNT_OK;
  for (size_t b = 0; f->buckets != NULL && b < f->plan.nbuckets; ++b) {
    if (f->buckets[b].req != NULL) {
      /* The engine may still be writing into the bucket. */
      tnt_status_t w = tnt_request_wait(f->buckets[b].req, -1);
      if (w < 0) st = w;
      tnt_request_free(f->buckets[b].req);
    }
    free(f->buckets[b].buf);
  }
  tnt__fusion_plan_free(&f->plan);
  free(f->buckets);
  free(f->tensors);
  free(f->by_id);
  free(f->state);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
  return st;
}

/* Marks tensor i finished; the last member of a bucket resets it for the
 * next round. Called with f->mu held; returns the request to release (after
 * unlocking) when the round ended, else NULL. */
static tnt_request_t *mark_finished(tnt_fusion_t *f, size_t i) {
  const size_t b = f->plan.bucket_of[i];
  bucket_t *bk = &f->buckets[b];
  const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
  f->state[i] = FINISHED;
  if (++bk->finished < bp->nmembers) return NULL;
  for (size_t k = 0; k < bp->nmembers; ++k) f->state[f->plan.members[bp->first + k]] = IDLE;
  tnt_request_t *req = bk->req;
  bk->started = bk->finished = 0;
  bk->req = NULL;
  bk->completed = 0;
  pthread_cond_broadcast(&f->cv);
  return req;
}

/* Delivers a completed round to the waiters taken from its bucket. */
static void deliver(tnt_fusion_t *f, waiter_t *list, tnt_status_t st) {
  while (list != NULL) {
    waiter_t *w = list;
    list = w->next;
    const tnt_tensor_info_t *t = &f->tensors[w->index];
    const size_t b = f->plan.bucket_of[w->index];
    tnt_request_t *release = NULL;
    if (st >= 0) {
      const size_t esz = tnt_dtype_size(t->dtype);
      memcpy(w->out, f->buckets[b].buf + f->plan.offset_of[w->index] * esz, t->count * esz);
      pthread_mutex_lock(&f->mu);
      release = mark_finished(f, w->index);
      pthread_mutex_unlock(&f->mu);
    }
    w->done(w->arg, st);
    if (release != NULL) tnt_request_free(release);
    free(w);
  }
}

/* Completion callback of a bucket's allreduce (engine thread). */
static void round_done(void *arg, tnt_status_t st) {
  round_ref_t *ref = arg;
  tnt_fusion_t *f = ref->f;
  bucket_t *bk = &f->buckets[ref->bucket];
  waiter_t *list = NULL;
  pthread_mutex_lock(&f->mu);
  /* Without asynchronous waiters, blocking finishes may already have ended
   * the round; then there is nothing left to do here. */
  if (bk->req == ref->req) {
    bk->completed = 1;
    bk->status = st;
    list = bk->waiters;
    bk->waiters = NULL;
    for (waiter_t *w = list; w != NULL; w = w->next) f->nwaiters--;
  }
  pthread_mutex_unlock(&f->mu);
  deliver(f, list, st);
  tnt__request_unref(ref->req);
  free(ref);
  pthread_mutex_lock(&f->mu);
  f->ncallbacks--;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* Submits, in plan order, every bucket whose members have all started.
 * Called with f->mu held; the completion callbacks of the submitted rounds
 * are attached by attach_callbacks once the lock is released, since a
 * callback may run at once and takes the lock. */
static tnt_status_t issue_ready(tnt_fusion_t *f, round_ref_t **issued, size_t *nissued) {
  for (;;) {
    size_t b = f->next_issue;
    bucket_t *bk = &f->buckets[b];
    const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
    if (bk->req != NULL || bk->started < bp->nmembers) return TNT_OK;
    round_ref_t *ref = malloc(sizeof *ref);
    if (ref == NULL) return TNT_ERR_NO_MEMORY;
    tnt_status_t st = tnt__iallreduce_bucket(f->g, bk->buf, bk->buf, bp->count, bp->dtype,
                                             f->op, bk->label, (long)b, &bk->req);
    if (st < 0) {
      free(ref);
      return st;
    }
    /* The callback holds its own reference: blocking finishes may release
     * the bucket's before the callback is attached. */
    tnt__request_ref(bk->req);
    f->ncallbacks++;
    *ref = (round_ref_t){f, b, bk->req};
    issued[(*nissued)++] = ref;
    f->next_issue = (b + 1) % f->plan.nbuckets;
    pthread_cond_broadcast(&f->cv);
  }
}

static void attach_callbacks(round_ref_t **issued, size_t n) {
  for (size_t k = 0; k < n; ++k) tnt__request_on_complete(issued[k]->req, round_done, issued[k]);
}

tnt_status_t tnt_fusion_start(tnt_fusion_t *f, uint64_t id, const void *data) {
  if (f == NULL) return TNT_ERR_INVALID_ARG;
  const long i = find_tensor(f, id, "tnt_fusion_start");
  if (i < 0) return TNT_ERR_INVALID_ARG;
  const tnt_tensor_info_t *t = &f->tensors[i];
  if (data == NULL && t->count > 0) return TNT_ERR_INVALID_ARG;
  TNT_CHECK(tnt__context_check(f->g->ctx));
  const size_t b = f->plan.bucket_of[i];
  const size_t esz = tnt_dtype_size(t->dtype);
  pthread_mutex_lock(&f->mu);
  if (f->state[i] != IDLE) {
    const int twice = f->state[i] == STARTED;
    pthread_mutex_unlock(&f->mu);
    if (twice) {
      TNT_LOG_ERROR("tnt_fusion_start: tensor %llu was started twice without tnt_fusion_finish",
                    (unsigned long long)id);
    } else {
      TNT_LOG_ERROR("tnt_fusion_start: tensor %llu was started again before every tensor of "
                    "fusion bucket %zu finished the previous round",
                    (unsigned long long)id, b);
    }
    return TNT_ERR_STATE;
  }
  f->state[i] = STARTED;
  pthread_mutex_unlock(&f->mu);

  /* Members occupy disjoint parts of the bucket, which no allreduce uses
   * until every member has started: the copy needs no lock. */
  memcpy(f->buckets[b].buf + f->plan.offset_of[i] * esz, data, t->count * esz);
  if (TNT__TIMELINE_ON()) {
    tnt__timeline_instant("fusion", "fusion start",
                          "\"tensor\":%llu,\"bytes\":%zu,\"bucket\":%zu",
                          (unsigned long long)id, t->count * esz, b);
  }

  round_ref_t *stack_issued[8];
  round_ref_t **issued = stack_issued;
  if (f->plan.nbuckets > 8) {
    issued = malloc(f->plan.nbuckets * sizeof *issued);
    if (issued == NULL) return TNT_ERR_NO_MEMORY;
  }
  size_t nissued = 0;
  pthread_mutex_lock(&f->mu);
  f->buckets[b].started++;
  tnt_status_t st = issue_ready(f, issued, &nissued);
  pthread_mutex_unlock(&f->mu);
  for (size_t k = 0; k < nissued && TNT__TIMELINE_ON(); ++k) {
    const tnt__bucket_plan_t *bp = &f->plan.buckets[issued[k]->bucket];
    tnt__timeline_instant("fusion", "bucket submitted", "\"bucket\":%zu,\"bytes\":%zu",
                          issued[k]->bucket, bp->count * tnt_dtype_size(bp->dtype));
  }
  attach_callbacks(issued, nissued);
  if (issued != stack_issued) free(issued);
  return st;
}

/* Names the members of bucket b that this rank has not started. */
/* Names what keeps bucket b from being submitted on this rank: its members
 * not started here, or an earlier bucket. `what` says what happened ("timed
 * out after 30.0 s"); stalls are warnings, timeouts errors. */
static void log_missing(const tnt_fusion_t *f, size_t b, tnt__log_level_t level,
                        const char *what) {
  char ids[256];
  size_t len = 0;
  ids[0] = '\0';
  const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
  for (size_t k = 0; k < bp->nmembers && len < sizeof ids - 24; ++k) {
    size_t i = f->plan.members[bp->first + k];
    if (f->state[i] == IDLE) {
      len += (size_t)snprintf(ids + len, sizeof ids - len, " %llu",
                              (unsigned long long)f->tensors[i].id);
    }
  }
  if (len > 0) {
    tnt__log(level, "fusion bucket %zu: %s; tensors not started on this rank:%s", b, what, ids);
  } else {
    tnt__log(level, "fusion bucket %zu: %s waiting for an earlier bucket (%zu) to be started "
             "on this rank", b, what, f->next_issue);
  }
}

static void log_timeout(const tnt_fusion_t *f, size_t b, double timeout) {
  char what[64];
  snprintf(what, sizeof what, "timed out after %.1f s", timeout);
  log_missing(f, b, TNT__LOG_ERROR, what);
}

tnt_status_t tnt_fusion_finish(tnt_fusion_t *f, uint64_t id, void *out, double timeout_s) {
  if (f == NULL) return TNT_ERR_INVALID_ARG;
  const long i = find_tensor(f, id, "tnt_fusion_finish");
  if (i < 0) return TNT_ERR_INVALID_ARG;
  const tnt_tensor_info_t *t = &f->tensors[i];
  if (out == NULL && t->count > 0) return TNT_ERR_INVALID_ARG;
  if (timeout_s < 0) timeout_s = tnt_context_timeout(f->g->ctx);
  const size_t b = f->plan.bucket_of[i];
  bucket_t *bk = &f->buckets[b];
  const double entered = tnt__now();
  const double deadline = entered + timeout_s;
  const struct timespec ts = tnt__abs_time(deadline);

  pthread_mutex_lock(&f->mu);
  if (f->state[i] != STARTED) {
    pthread_mutex_unlock(&f->mu);
    TNT_LOG_ERROR("tnt_fusion_finish: tensor %llu was not started", (unsigned long long)id);
    return TNT_ERR_STATE;
  }
  /* A stall is reported once, a third of the way to the timeout. */
  const tnt__wait_ctx_t w = tnt__wait_ctx(timeout_s, "");
  const struct timespec warn_ts = tnt__abs_time(w.warn_at);
  int warned = 0;
  while (bk->req == NULL) {
    if (!warned) {
      if (pthread_cond_timedwait(&f->cv, &f->mu, &warn_ts) == ETIMEDOUT && bk->req == NULL) {
        char what[64];
        snprintf(what, sizeof what, "still waiting after %.1f s", w.warn_at - (deadline -
                                                                             timeout_s));
        log_missing(f, b, TNT__LOG_WARNING, what);
        warned = 1;
      }
    } else if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT && bk->req == NULL) {
      log_timeout(f, b, timeout_s);
      pthread_mutex_unlock(&f->mu);
      return TNT_ERR_TIMEOUT;
    }
  }
  tnt_request_t *req = bk->req;
  pthread_mutex_unlock(&f->mu);

  tnt_status_t st = tnt_request_wait(req, TNT__MAX(0.0, deadline - tnt__now()));
  if (st < 0) return st;
  const size_t esz = tnt_dtype_size(t->dtype);
  memcpy(out, bk->buf + f->plan.offset_of[i] * esz, t->count * esz);
  if (TNT__TIMELINE_ON()) {
    tnt__timeline_complete("wait", "fusion finish", entered, tnt__now(),
                           "\"tensor\":%llu,\"bucket\":%zu", (unsigned long long)id, b);
  }

  pthread_mutex_lock(&f->mu);
  tnt_request_t *release = mark_finished(f, (size_t)i);
  pthread_mutex_unlock(&f->mu);
  if (release != NULL) tnt_request_free(release);
  return TNT_OK;
}

/* ---------------------------------------------------- asynchronous finish */

static void fail_all_waiters(tnt_fusion_t *f, tnt_status_t st) {
  for (size_t b = 0; b < f->plan.nbuckets; ++b) {
    pthread_mutex_lock(&f->mu);
    waiter_t *list = f->buckets[b].waiters;
    f->buckets[b].waiters = NULL;
    for (waiter_t *w = list; w != NULL; w = w->next) f->nwaiters--;
    pthread_mutex_unlock(&f->mu);
    deliver(f, list, st);
  }
}

/* Fails the waiters whose deadline has passed, a few times a second. */
static void *watchdog_main(void *arg) {
  tnt_fusion_t *f = arg;
  tnt__log_set_rank(tnt__context_rank(f->g->ctx), tnt__context_size(f->g->ctx), 1);
  pthread_mutex_lock(&f->mu);
  while (!f->stopping) {
    struct timespec ts = tnt__abs_time(tnt__now() + 0.25);
    pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    const double now = tnt__now();
    for (size_t b = 0; b < f->plan.nbuckets; ++b) {
      waiter_t *expired = NULL;
      for (waiter_t **p = &f->buckets[b].waiters; *p != NULL;) {
        if ((*p)->deadline < now) {
          waiter_t *w = *p;
          *p = w->next;
          w->next = expired;
          expired = w;
          f->nwaiters--;
        } else {
          p = &(*p)->next;
        }
      }
      if (expired == NULL) continue;
      if (f->buckets[b].req == NULL) {
        log_timeout(f, b, tnt_context_timeout(f->g->ctx));
      } else {
        TNT_LOG_ERROR("%s: not done after %.1f s", f->buckets[b].label,
                      tnt_context_timeout(f->g->ctx));
      }
      pthread_mutex_unlock(&f->mu);
      deliver(f, expired, TNT_ERR_TIMEOUT);
      pthread_mutex_lock(&f->mu);
    }
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

tnt_status_t tnt_fusion_finish_async(tnt_fusion_t *f, uint64_t id, void *out, tnt_done_fn done,
                                     void *arg) {
  if (f == NULL || done == NULL) return TNT_ERR_INVALID_ARG;
  const long i = find_tensor(f, id, "tnt_fusion_finish_async");
  if (i < 0) return TNT_ERR_INVALID_ARG;
  if (out == NULL && f->tensors[i].count > 0) return TNT_ERR_INVALID_ARG;
  waiter_t *w = malloc(sizeof *w);
  if (w == NULL) return TNT_ERR_NO_MEMORY;
  *w = (waiter_t){(size_t)i, out, done, arg, tnt__now() + tnt_context_timeout(f->g->ctx), NULL};
  bucket_t *bk = &f->buckets[f->plan.bucket_of[i]];

  pthread_mutex_lock(&f->mu);
  if (f->state[i] != STARTED) {
    pthread_mutex_unlock(&f->mu);
    free(w);
    TNT_LOG_ERROR("tnt_fusion_finish_async: tensor %llu was not started", (unsigned long long)id);
    return TNT_ERR_STATE;
  }
  if (!f->watchdog_running) {
    if (pthread_create(&f->watchdog, NULL, watchdog_main, f) != 0) {
      pthread_mutex_unlock(&f->mu);
      free(w);
      TNT_LOG_ERROR("cannot start the fusion watchdog thread");
      return TNT_ERR_NO_MEMORY;
    }
    f->watchdog_running = 1;
  }
  if (bk->completed) {
    /* The round is over already: deliver on this thread. */
    tnt_status_t st = bk->status;
    pthread_mutex_unlock(&f->mu);
    deliver(f, w, st);
    return TNT_OK;
  }
  w->next = bk->waiters;
  bk->waiters = w;
  f->nwaiters++;
  pthread_mutex_unlock(&f->mu);
  return TNT_OK;
}

tnt_group_t *tnt_fusion_group(const tnt_fusion_t *f) {
  return f == NULL ? NULL : f->g;
}

size_t tnt_fusion_num_buckets(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->plan.nbuckets;
}

long tnt_fusion_bucket_of(const tnt_fusion_t *f, uint64_t id) {
  if (f == NULL) return -1;
  long i = find(f, id);
  return i < 0 ? -1 : (long)f->plan.bucket_of[i];
}
