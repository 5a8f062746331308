/*
 * The fusion runtime's buckets and rounds (see runtime.h): a set's buckets
 * from its plan, the starts that fill them, their allreduces in plan
 * order, and the finishes that copy the results out and end the rounds.
 */
#include "fusion/runtime.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/handles.h"
#include "util/log.h"
#include "util/reduce.h"
#include "util/settings.h"
#include "util/timeline.h"

tnt_status_t tnt__fusion_allreduce(const tnt_fusion_t *f, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const char *label, long bucket, tnt_request_t **req) {
  TNT_CHECK(tnt__engine_check(f->engine));
  return tnt__engine_allreduce(f->engine, f->comm, sendbuf, recvbuf, count, dtype, op, label,
                               bucket, req);
}

/* Frees `nbuckets` buckets; none may be in flight. */
static void free_buckets(tnt__bucket_t *buckets, size_t nbuckets) {
  for (size_t b = 0; buckets != NULL && b < nbuckets; ++b) {
    free(buckets[b].buf);
    free(buckets[b].part);
  }
  free(buckets);
}

static const char *mode_verb(tnt_fusion_mode_t mode) {
  return mode == TNT_FUSION_MODE_REDUCE_SCATTER ? "reduce-scatter"
         : mode == TNT_FUSION_MODE_ALLGATHER    ? "allgather"
                                                : "allreduce";
}

/* Plans the tensors of `f` in the order f->perm, with every index of the
 * plan translated back to the index in f->tensors. */
static tnt_status_t plan_permuted(const tnt_fusion_t *f, size_t n, size_t threshold,
                                  tnt__fusion_plan_t *plan) {
  tnt_tensor_info_t *list = calloc(n + 1, sizeof *list);
  size_t *tmp = malloc(2 * n * sizeof *tmp + 1);
  if (list == NULL || tmp == NULL) {
    free(list);
    free(tmp);
    TNT_LOG_ERROR("fusion: out of memory for the order of %zu tensors", n);
    return TNT_ERR_NO_MEMORY;
  }
  for (size_t k = 0; k < n; ++k) list[k] = f->tensors[f->perm[k]];
  tnt_status_t st = tnt__fusion_plan(list, n, threshold, plan);
  if (st == TNT_OK) {
    memcpy(tmp, plan->bucket_of, n * sizeof *tmp);
    memcpy(tmp + n, plan->offset_of, n * sizeof *tmp);
    for (size_t k = 0; k < n; ++k) {
      plan->bucket_of[f->perm[k]] = tmp[k];
      plan->offset_of[f->perm[k]] = tmp[n + k];
    }
    for (size_t m = 0; m < n; ++m) plan->members[m] = f->perm[plan->members[m]];
    for (size_t j = 0; j < n; ++j) plan->by_id[j].index = f->perm[plan->by_id[j].index];
  }
  free(list);
  free(tmp);
  return st;
}

/* Plans the tensors of `f` with `threshold` and allocates their buckets;
 * on success *plan and *buckets belong to the caller. */
static tnt_status_t make_buckets(const tnt_fusion_t *f, size_t n, size_t threshold,
                                 tnt__fusion_plan_t *plan, tnt__bucket_t **buckets) {
  if (f->perm == NULL) {
    TNT_CHECK(tnt__fusion_plan(f->tensors, n, threshold, plan));
  } else {
    TNT_CHECK(plan_permuted(f, n, threshold, plan));
  }
  tnt__bucket_t *bks = calloc(plan->nbuckets + 1, sizeof *bks);
  for (size_t b = 0; bks != NULL && b < plan->nbuckets; ++b) {
    const tnt__bucket_plan_t *bp = &plan->buckets[b];
    tnt__bucket_t *bk = &bks[b];
    bk->wire = bp->dtype == TNT_FLOAT32 ? f->opt.wire_dtype : bp->dtype;
    const size_t esz = tnt__dtype_size(bk->wire);
    tnt__slice(bp->count, esz, f->comm->size, f->comm->rank, &bk->lo, &bk->hi);
    /* The other modes allocate the whole vector round by round. */
    if (f->opt.mode == TNT_FUSION_MODE_ALLREDUCE &&
        (bk->buf = calloc(bp->count * esz + 1, 1)) == NULL) { /* padding stays 0 */
      free_buckets(bks, b);
      bks = NULL;
      break;
    }
    snprintf(bk->label, sizeof bk->label, "%s of fusion bucket %zu (%zu tensors, %zu bytes%s%s)",
             mode_verb(f->opt.mode), b, bp->nmembers, bp->count * esz,
             bk->wire != bp->dtype ? " of " : "",
             bk->wire != bp->dtype ? tnt_dtype_name(bk->wire) : "");
  }
  if (bks == NULL) {
    TNT_LOG_ERROR("fusion: out of memory for the buckets of %zu tensors", n);
    tnt__fusion_plan_free(plan);
    return TNT_ERR_NO_MEMORY;
  }
  *buckets = bks;
  return TNT_OK;
}

tnt_status_t tnt__fusion_create(tnt_group_t *g, tnt__engine_t *engine, tnt__comm_t *comm,
                                const tnt_tensor_info_t *tensors, size_t n,
                                const tnt_fusion_options_t *opt, tnt_fusion_t **out) {
  static const char call[] = "tnt_fusion_create";
  TNT_CHECK(tnt__engine_check(engine));
  tnt_fusion_t *f = calloc(1, sizeof *f);
  if (f == NULL) {
    TNT_LOG_ERROR("%s: out of memory", call);
    return TNT_ERR_NO_MEMORY;
  }
  f->g = g;
  f->engine = engine;
  f->comm = comm;
  f->opt = *opt;
  tnt__tuner_init(&f->tuner, opt->tune_threshold, opt->threshold_bytes,
                  opt->overlap == TNT_FUSION_OVERLAP_TUNE, opt->overlap == TNT_FUSION_OVERLAP_OFF);
  f->threshold = tnt__tuner_plan(&f->tuner).threshold;
  f->hold = tnt__tuner_plan(&f->tuner).hold;
  f->in_flight_bytes = (size_t)(tnt__setting_number(TNT__S_FUSION_IN_FLIGHT_MIB) * 1048576.0);
  pthread_mutex_init(&f->mu, NULL);
  /* Monotonic: the stall warning and the deadline of a finish are timed
   * waits on this variable. */
  tnt_status_t st = tnt__cond_init_monotonic(&f->cv);
  if (st < 0) {
    pthread_mutex_destroy(&f->mu);
    free(f);
    return st;
  }
  f->tensors = malloc(n * sizeof *f->tensors + 1);
  f->state = calloc(n + 1, 1);
  f->rounds_of = calloc(n + 1, sizeof *f->rounds_of);
  f->seen = calloc(n + 1, sizeof *f->seen);
  if (f->tensors == NULL || f->state == NULL || f->rounds_of == NULL || f->seen == NULL) {
    goto no_memory;
  }
  if (n > 0) memcpy(f->tensors, tensors, n * sizeof *tensors);
  TNT_CHECK_GOTO(make_buckets(f, n, f->threshold, &f->plan, &f->buckets), st, fail);
  TNT_CHECK_GOTO(tnt__fusion_check_same_list(f), st, fail);
  if (tnt__handle_add(TNT__HANDLE_FUSION, f, &f->handle) < 0) goto no_memory;
  TNT_LOG_DEBUG(
      "fusion: %zu tensors in %zu buckets, each one's %s (threshold %zu bytes%s, overlap %s, "
      "float32 travels as %s)",
      n, f->plan.nbuckets, mode_verb(opt->mode), f->threshold,
      opt->tune_threshold ? ", tuning" : "",
      opt->overlap == TNT_FUSION_OVERLAP_TUNE ? "tuning"
      : f->hold                               ? "off"
                                              : "on",
      tnt_dtype_name(opt->wire_dtype));
  *out = f;
  return TNT_OK;
no_memory:
  TNT_LOG_ERROR("%s: out of memory for %zu tensors", call, n);
  st = TNT_ERR_NO_MEMORY;
fail:
  tnt__fusion_free(f);
  return st;
}

tnt_status_t tnt__fusion_free(tnt_fusion_t *f) {
  tnt__handle_remove(f->handle);
  tnt_status_t st = TNT_OK;
  for (size_t b = 0; f->buckets != NULL && b < f->plan.nbuckets; ++b) {
    if (f->buckets[b].req != NULL) {
      /* The engine may still be writing into the bucket; its work is
       * bounded by the engine's deadline. */
      tnt_status_t w = tnt__request_wait(f->buckets[b].req, -1);
      if (w < 0) st = w;
      tnt__request_unref(f->buckets[b].req);
    }
  }
  tnt_request_t *votes[2] = {f->vote_req, f->order_req};
  for (int k = 0; k < 2; ++k) {
    if (votes[k] == NULL) continue;
    tnt_status_t w = tnt__request_wait(votes[k], -1);
    if (w < 0) st = w;
    tnt__request_unref(votes[k]);
  }
  free_buckets(f->buckets, f->plan.nbuckets);
  tnt__fusion_plan_free(&f->plan);
  free(f->tensors);
  free(f->state);
  free(f->rounds_of);
  free(f->seen);
  free(f->perm);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
  return st;
}

void tnt__fusion_part(const tnt_fusion_t *f, size_t i, size_t *lo, size_t *hi) {
  const tnt__bucket_t *bk = &f->buckets[f->plan.bucket_of[i]];
  const size_t off = f->plan.offset_of[i], end = off + f->tensors[i].count;
  const size_t a = TNT__MIN(TNT__MAX(bk->lo, off), end);
  *lo = a - off;
  *hi = TNT__MIN(TNT__MAX(bk->hi, a), end) - off;
}

tnt_status_t tnt__fusion_replan(tnt_fusion_t *f, size_t threshold) {
  tnt__fusion_plan_t plan;
  tnt__bucket_t *buckets;
  TNT_CHECK(make_buckets(f, f->plan.ntensors, threshold, &plan, &buckets));
  /* The ids map to the same indices: keep the index (and the count) that
   * find_tensor reads without the lock, untouched. */
  free(plan.by_id);
  free_buckets(f->buckets, f->plan.nbuckets);
  free(f->plan.buckets);
  free(f->plan.members);
  free(f->plan.bucket_of);
  free(f->plan.offset_of);
  f->plan.nbuckets = plan.nbuckets;
  f->plan.buckets = plan.buckets;
  f->plan.members = plan.members;
  f->plan.bucket_of = plan.bucket_of;
  f->plan.offset_of = plan.offset_of;
  f->buckets = buckets;
  f->threshold = threshold;
  f->next_issue = 0;
  return TNT_OK;
}

/* Marks tensor i finished; the last member of a bucket resets it for the
 * next round, and the last tensor of the round ends the round. Called with
 * f->mu held; *release becomes the request to release (after unlocking)
 * when the bucket's round ended, else NULL. */
static tnt_status_t mark_finished(tnt_fusion_t *f, size_t i, tnt_request_t **release) {
  const size_t b = f->plan.bucket_of[i];
  tnt__bucket_t *bk = &f->buckets[b];
  const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
  *release = NULL;
  f->state[i] = TNT__FUSION_FINISHED;
  f->rounds_of[i]++;
  if (++bk->finished < bp->nmembers) return TNT_OK;
  for (size_t k = 0; k < bp->nmembers; ++k) f->state[f->plan.members[bp->first + k]] = TNT__FUSION_IDLE;
  *release = bk->req;
  bk->started = bk->finished = 0;
  bk->req = NULL;
  if (f->opt.mode == TNT_FUSION_MODE_ALLGATHER) {
    free(bk->buf);
    bk->buf = NULL;
  }
  free(bk->part); /* reduce-scatter: every member has copied its part out */
  bk->part = NULL;
  pthread_cond_broadcast(&f->cv);
  f->finished_in_round += bp->nmembers;
  if (f->finished_in_round < f->plan.ntensors) return TNT_OK;
  f->round++;
  f->started_in_round = f->finished_in_round = 0;
  if (!tnt__fusion_deciding(f)) return TNT_OK;
  tnt_status_t st = tnt__fusion_end_deciding_round(f);
  if (st < 0) f->broken = st;
  return st;
}

/* Submits bucket b's collective for the round: its allreduce, its
 * reduce-scatter into its part, or the allgather of every rank's part.
 * Called with f->mu held. */
static tnt_status_t submit_bucket(tnt_fusion_t *f, size_t b) {
  tnt__bucket_t *bk = &f->buckets[b];
  const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
  const size_t esz = tnt__dtype_size(bk->wire);
  switch (f->opt.mode) {
    case TNT_FUSION_MODE_REDUCE_SCATTER: {
      TNT_CHECK(tnt__engine_check(f->engine));
      /* The engine frees the whole vector once it is reduced: buckets in
       * flight hold it, reduced ones their part only, until the round's
       * last finish has copied it out. */
      bk->part = malloc((bk->hi - bk->lo) * esz + 1);
      if (bk->part == NULL) {
        TNT_LOG_ERROR("%s: out of memory for this rank's part (%zu bytes)", bk->label,
                      (bk->hi - bk->lo) * esz);
        return TNT_ERR_NO_MEMORY;
      }
      uint8_t *whole = bk->buf;
      bk->buf = NULL;
      return tnt__engine_reduce_scatter(f->engine, f->comm, NULL, whole, bk->part, bp->count,
                                        NULL, bk->wire, f->opt.op, bk->label, (long)b, &bk->req);
    }
    case TNT_FUSION_MODE_ALLGATHER: {
      TNT_CHECK(tnt__engine_check(f->engine));
      const int n = f->comm->size;
      size_t *counts = malloc((size_t)n * sizeof *counts);
      size_t *displs = malloc((size_t)n * sizeof *displs);
      if (counts == NULL || displs == NULL) {
        free(counts);
        free(displs);
        TNT_LOG_ERROR("%s: out of memory for %d counts", bk->label, n);
        return TNT_ERR_NO_MEMORY;
      }
      for (int q = 0; q < n; ++q) {
        size_t lo, hi;
        tnt__slice(bp->count, esz, n, q, &lo, &hi);
        counts[q] = (hi - lo) * esz;
        displs[q] = lo * esz;
      }
      return tnt__engine_allgatherv(f->engine, f->comm, bk->buf + bk->lo * esz, bk->buf, counts,
                                    displs, bp->count * esz, bk->label, (long)b, &bk->req);
    }
    default:
      return tnt__fusion_allreduce(f, bk->buf, bk->buf, bp->count, bk->wire, f->opt.op, bk->label,
                                   (long)b, &bk->req);
  }
}

/* Submits, in plan order, every bucket whose members have all started
 * (with overlap off: none before every tensor has started the round);
 * `*nissued` counts them. In the deciding round of a tuning set, the
 * master's choice goes first. Called with f->mu held. */
static tnt_status_t issue_ready(tnt_fusion_t *f, size_t *first, size_t *nissued) {
  *first = f->next_issue;
  if (f->hold && f->started_in_round < f->plan.ntensors) return TNT_OK;
  for (;;) {
    size_t b = f->next_issue;
    tnt__bucket_t *bk = &f->buckets[b];
    const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
    if (bk->req != NULL || bk->started < bp->nmembers) return TNT_OK;
    if (b == 0) TNT_CHECK(tnt__fusion_submit_choices(f));
    TNT_CHECK(submit_bucket(f, b));
    ++*nissued;
    f->next_issue = (b + 1) % f->plan.nbuckets;
    pthread_cond_broadcast(&f->cv);
  }
}

/* While a set decides its plan, waits until tensor i may start: until
 * every tensor has finished the round that i has finished already. Called
 * with f->mu held. */
static tnt_status_t wait_for_round(tnt_fusion_t *f, size_t i, const char *call) {
  if (!tnt__fusion_sequential(f)) return TNT_OK;
  const double timeout_s = tnt__engine_timeout(f->engine);
  const struct timespec ts = tnt__abs_time(tnt__now() + timeout_s);
  while (f->rounds_of[i] > f->round && f->broken == TNT_OK) {
    if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT && f->rounds_of[i] > f->round) {
      TNT_LOG_ERROR(
          "%s: tensor %llu waited %.1f s for the other tensors of the set to finish round %zu; "
          "while a set decides its plan (tuning: the first %zu rounds; readiness order: the "
          "first 2) and while its overlap is off, every tensor must finish a round before any "
          "starts the next",
          call, (unsigned long long)f->tensors[i].id, timeout_s, f->round,
          tnt__tuner_rounds(&f->tuner));
      return TNT_ERR_TIMEOUT;
    }
  }
  return f->broken;
}

/* Reduce-scatter: before a start fills a new whole vector of `bytes`,
 * waits while the vectors being filled and those submitted but not yet
 * reduced, with it, would pass f->in_flight_bytes, for a submitted one to
 * be reduced: when backprop outruns the network, the gradients wait in
 * TensorFlow (each until its start) rather than all of them in buckets.
 * It waits for submitted buckets only, whose collectives need nothing
 * more from this rank, and not at all when none is in flight, so that
 * every rank can always submit the round's next bucket: no deadlock.
 * Called with f->mu held. */
static tnt_status_t wait_for_room(tnt_fusion_t *f, size_t bytes, const char *call) {
  const double began = tnt__now();
  for (;;) {
    size_t held = bytes;
    tnt_request_t *oldest = NULL;
    for (size_t k = 0; k < f->plan.nbuckets; ++k) {
      const size_t b = (f->next_issue + k) % f->plan.nbuckets; /* submission order */
      const tnt__bucket_t *bk = &f->buckets[b];
      const int reducing = bk->buf == NULL && bk->req != NULL &&
                           tnt__request_test(bk->req) == TNT_IN_PROGRESS;
      if (bk->buf != NULL || reducing) {
        held += f->plan.buckets[b].count * tnt__dtype_size(bk->wire);
      }
      if (reducing && oldest == NULL) oldest = bk->req;
    }
    if (oldest == NULL || held <= f->in_flight_bytes) break;
    tnt__request_ref(oldest);
    pthread_mutex_unlock(&f->mu);
    const tnt_status_t st = tnt__request_wait(oldest, -1);
    tnt__request_unref(oldest);
    pthread_mutex_lock(&f->mu);
    if (st < 0) {
      TNT_LOG_ERROR("%s: a fusion bucket's reduce-scatter failed while a start waited for it",
                    call);
      return st;
    }
  }
  if (TNT__TIMELINE_ON() && tnt__now() - began > 1e-4) {
    tnt__timeline_complete("wait", "fusion start waits for room", began, tnt__now(),
                           "\"bytes\":%zu", bytes);
  }
  return TNT_OK;
}

tnt_status_t tnt__fusion_start(tnt_fusion_t *f, size_t i, const void *data, double scale,
                               const char *call) {
  const tnt_tensor_info_t *t = &f->tensors[i];
  const uint64_t id = t->id;
  TNT_CHECK(tnt__engine_check(f->engine));
  pthread_mutex_lock(&f->mu);
  tnt_status_t st = wait_for_round(f, i, call);
  if (st < 0) {
    pthread_mutex_unlock(&f->mu);
    return st;
  }
  /* The plan stays until this tensor has finished the round. */
  const size_t b = f->plan.bucket_of[i];
  tnt__bucket_t *bk = &f->buckets[b];
  const size_t esz = tnt__dtype_size(bk->wire);
  if (f->state[i] != TNT__FUSION_IDLE) {
    const int twice = f->state[i] == TNT__FUSION_STARTED;
    pthread_mutex_unlock(&f->mu);
    TNT_LOG_ERROR(
        "%s: tensor %llu was started already in this round (%s); a round of fusion "
        "bucket %zu ends once every tensor of the bucket has finished",
        call, (unsigned long long)id,
        twice ? "and not finished" : "finished, but not every tensor of its bucket", b);
    return TNT_ERR_STATE;
  }
  if (bk->buf == NULL && f->opt.mode == TNT_FUSION_MODE_REDUCE_SCATTER) {
    st = wait_for_room(f, f->plan.buckets[b].count * esz, call); /* unlocks while it waits */
    if (st < 0) {
      pthread_mutex_unlock(&f->mu);
      return st;
    }
  }
  if (bk->buf == NULL) { /* the round's first start, in the modes that free it */
    bk->buf = calloc(f->plan.buckets[b].count * esz + 1, 1); /* padding stays 0 */
    if (bk->buf == NULL) {
      pthread_mutex_unlock(&f->mu);
      TNT_LOG_ERROR("%s: out of memory for fusion bucket %zu (%zu bytes)", call, b,
                    f->plan.buckets[b].count * esz);
      return TNT_ERR_NO_MEMORY;
    }
  }
  f->state[i] = TNT__FUSION_STARTED;
  if (f->round == 0) f->seen[i] = (int64_t)f->started_in_round;
  if (f->started_in_round++ == 0) f->round_began = tnt__now();
  /* The whole tensor, or in the allgather mode its part. */
  size_t lo = 0, count = t->count;
  if (f->opt.mode == TNT_FUSION_MODE_ALLGATHER) {
    size_t hi;
    tnt__fusion_part(f, i, &lo, &hi);
    count = hi - lo;
  }
  uint8_t *part = bk->buf + (f->plan.offset_of[i] + lo) * esz;
  pthread_mutex_unlock(&f->mu);

  /* Members occupy disjoint parts of the bucket, which no collective uses
   * until every member has started: the copy needs no lock. */
  if (scale != 1.0) {
    tnt__copy_scaled(part, bk->wire, data, t->dtype, count, scale, 0);
  } else if (bk->wire != t->dtype) {
    tnt__narrow((uint16_t *)(void *)part, data, count, bk->wire);
  } else {
    memcpy(part, data, count * esz);
  }
  if (TNT__TIMELINE_ON()) {
    tnt__timeline_instant("fusion", "fusion start", "\"tensor\":%llu,\"bytes\":%zu,\"bucket\":%zu",
                          (unsigned long long)id, count * esz, b);
  }

  size_t first = 0, nissued = 0;
  pthread_mutex_lock(&f->mu);
  bk->started++;
  st = issue_ready(f, &first, &nissued);
  pthread_mutex_unlock(&f->mu);
  for (size_t k = 0; k < nissued && TNT__TIMELINE_ON(); ++k) {
    const size_t ib = (first + k) % f->plan.nbuckets;
    const tnt__bucket_plan_t *bp = &f->plan.buckets[ib];
    tnt__timeline_instant("fusion", "bucket submitted", "\"bucket\":%zu,\"bytes\":%zu", ib,
                          bp->count * tnt__dtype_size(f->buckets[ib].wire));
  }
  return st;
}

/* Names what keeps bucket b from being submitted on this rank: its members
 * not started here, or an earlier bucket. `what` says what happened ("timed
 * out after 30.0 s"); stalls are warnings, timeouts errors. */
static void log_missing(const tnt_fusion_t *f, size_t b, tnt__log_level_t level, const char *what) {
  char ids[256];
  size_t len = 0;
  ids[0] = '\0';
  const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
  for (size_t k = 0; k < bp->nmembers && len < sizeof ids - 24; ++k) {
    size_t i = f->plan.members[bp->first + k];
    if (f->state[i] == TNT__FUSION_IDLE) {
      len += (size_t)snprintf(ids + len, sizeof ids - len, " %llu",
                              (unsigned long long)f->tensors[i].id);
    }
  }
  if (len > 0) {
    tnt__log(level, "fusion bucket %zu: %s; tensors not started on this rank:%s", b, what, ids);
  } else if (f->hold && f->started_in_round < f->plan.ntensors) {
    for (size_t i = 0; i < f->plan.ntensors && len < sizeof ids - 24; ++i) {
      if (f->state[i] == TNT__FUSION_IDLE) {
        len += (size_t)snprintf(ids + len, sizeof ids - len, " %llu",
                                (unsigned long long)f->tensors[i].id);
      }
    }
    tnt__log(level,
             "fusion bucket %zu: %s; with overlap off, no bucket is reduced before every tensor "
             "of the set has started; tensors not started on this rank:%s",
             b, what, ids);
  } else {
    tnt__log(level,
             "fusion bucket %zu: %s waiting for an earlier bucket (%zu) to be started "
             "on this rank",
             b, what, f->next_issue);
  }
}

tnt_status_t tnt__fusion_finish(tnt_fusion_t *f, size_t i, void *out, double divisor,
                                double timeout_s, const char *call) {
  const tnt_tensor_info_t *t = &f->tensors[i];
  const uint64_t id = t->id;
  if (timeout_s < 0) timeout_s = tnt__engine_timeout(f->engine);
  const double entered = tnt__now();
  const double deadline = entered + timeout_s;
  const struct timespec ts = tnt__abs_time(deadline);

  pthread_mutex_lock(&f->mu);
  if (f->state[i] != TNT__FUSION_STARTED) {
    pthread_mutex_unlock(&f->mu);
    TNT_LOG_ERROR("%s: tensor %llu was not started", call, (unsigned long long)id);
    return TNT_ERR_STATE;
  }
  /* Started: the plan stays until the tensor has finished. */
  const size_t b = f->plan.bucket_of[i];
  tnt__bucket_t *bk = &f->buckets[b];
  /* A stall is reported once, a third of the way to the timeout. */
  const tnt__wait_ctx_t w = tnt__wait_ctx(timeout_s, "");
  const struct timespec warn_ts = tnt__abs_time(w.warn_at);
  int warned = 0;
  while (bk->req == NULL) {
    if (!warned) {
      if (pthread_cond_timedwait(&f->cv, &f->mu, &warn_ts) == ETIMEDOUT && bk->req == NULL) {
        char what[64];
        snprintf(what, sizeof what, "still waiting after %.1f s", w.warn_at - entered);
        log_missing(f, b, TNT__LOG_WARNING, what);
        warned = 1;
      }
    } else if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT && bk->req == NULL) {
      char what[128];
      snprintf(what, sizeof what,
               "timed out after %.1f s (every rank must start every tensor of the bucket)",
               timeout_s);
      log_missing(f, b, TNT__LOG_ERROR, what);
      pthread_mutex_unlock(&f->mu);
      return TNT_ERR_TIMEOUT;
    }
  }
  tnt_request_t *req = bk->req;
  pthread_mutex_unlock(&f->mu);

  TNT_CHECK(tnt__request_wait(req, TNT__MAX(0.0, deadline - tnt__now())));
  const size_t esz = tnt__dtype_size(bk->wire);
  /* The whole tensor, or in the reduce-scatter mode its part. */
  const uint8_t *part;
  size_t count = t->count;
  if (f->opt.mode == TNT_FUSION_MODE_REDUCE_SCATTER) {
    size_t lo, hi;
    tnt__fusion_part(f, i, &lo, &hi);
    count = hi - lo;
    part = bk->part + (f->plan.offset_of[i] + lo - bk->lo) * esz;
  } else {
    part = bk->buf + f->plan.offset_of[i] * esz;
  }
  if (divisor != 1.0) {
    tnt__copy_scaled(out, t->dtype, part, bk->wire, count, divisor, 1);
  } else if (bk->wire != t->dtype) {
    tnt__widen(out, (const uint16_t *)(const void *)part, count, bk->wire);
  } else {
    memcpy(out, part, count * esz);
  }
  if (TNT__TIMELINE_ON()) {
    tnt__timeline_complete("wait", "fusion finish", entered, tnt__now(),
                           "\"tensor\":%llu,\"bucket\":%zu", (unsigned long long)id, b);
  }

  tnt_request_t *release;
  pthread_mutex_lock(&f->mu);
  const tnt_status_t st = mark_finished(f, i, &release);
  pthread_mutex_unlock(&f->mu);
  if (release != NULL) tnt__request_unref(release);
  return st;
}
