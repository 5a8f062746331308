/*
 * Tensor fusion at run time. Tensors are copied into the bucket that the
 * planner (src/fusion) assigned them; a bucket's allreduce is submitted
 * once all of its members have started, and buckets are always submitted
 * in plan order. Since every rank submits the same buckets in the same
 * order, ranks may start their tensors in any order without deadlock, and
 * since each bucket is reduced by the same algorithm in a fixed order, the
 * results are bitwise identical on every rank and in every run.
 *
 * A bucket is one round at a time: after all its members have finished
 * (copied their result out), it is reset for the next round of starts.
 *
 * With a 16-bit wire dtype, a float32 bucket holds its tensors in that
 * dtype: each start narrows its tensor into the bucket and each finish
 * widens its part of the result, so the allreduce moves half the bytes and
 * no tensor is converted twice.
 *
 * A set whose overlap is off holds the round's buckets until every tensor
 * has started the round, then submits them all in plan order.
 *
 * A set that tunes its threshold or its overlap (src/fusion/tuner.h)
 * replans between rounds: a round ends when every tensor has finished it,
 * and while tuning (and while overlap is off), a tensor's start for the
 * next round waits until then, so that no tensor is in a bucket while the
 * buckets change. The round that decides carries
 * the master's choice in one more allreduce, submitted just before the
 * round's first bucket: in the same place on every rank, like the buckets.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "api/collectives.h"
#include "fusion/planner.h"
#include "fusion/tuner.h"
#include "util/handles.h"
#include "util/reduce.h"
#include "util/timeline.h"

enum { IDLE = 0, STARTED = 1, FINISHED = 2 };

typedef struct bucket {
  uint8_t *buf;
  size_t started, finished;
  tnt_request_t *req; /* the round's allreduce, once submitted */
  tnt_dtype_t wire;   /* the dtype of buf and of the allreduce */
  char label[112];
} bucket_t;

struct tnt_fusion {
  tnt_group_t *g;
  tnt_fusion_options_t opt;
  tnt__fusion_plan_t plan;
  tnt_tensor_info_t *tensors;
  uint8_t *state; /* per tensor: IDLE, STARTED, FINISHED */
  bucket_t *buckets;
  size_t next_issue; /* the bucket whose allreduce goes next */
  size_t threshold;  /* of the plan in use */
  int hold;          /* of the plan in use: overlap off */
  /* Rounds: tensors started and finished in the round now running, and
   * per tensor the rounds it has finished. */
  size_t round, started_in_round, finished_in_round;
  size_t *rounds_of;
  double round_began;
  tnt__tuner_t tuner;
  int64_t vote[1];         /* the master's choice, in the deciding round */
  tnt_request_t *vote_req; /* its allreduce, once submitted */
  /* TNT_FUSION_ORDER_READINESS: when each tensor started in round 0, the
   * master's order (carried in round 1), and then the order of the list
   * in which buckets are filled (perm[k]: index of the k-th tensor). */
  int64_t *seen;
  tnt_request_t *order_req;
  size_t *perm;
  tnt_status_t broken; /* a failed replan: every later call fails */
  int64_t handle;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a bucket was submitted or reset */
};

/* The context of `f`, for the end of its calls (NULL for a NULL set). */
static const tnt_context_t *ctx_of(const tnt_fusion_t *f) {
  return f == NULL ? NULL : f->g->ctx;
}

/* The index of tensor `id`, or -1 after logging that `call` got an id
 * that is not in the set. */
static long find_tensor(const tnt_fusion_t *f, uint64_t id, const char *call) {
  const long i = tnt__fusion_plan_find(&f->plan, id);
  if (i < 0) {
    TNT_LOG_ERROR("%s: tensor id %llu is not in the fusion set", call, (unsigned long long)id);
  }
  return i;
}

/* Every rank must fuse the same list with the same options: compare a
 * hash of them across ranks so that a mismatch is an error now rather than
 * a hang later. */
static tnt_status_t check_same_list(tnt_group_t *g, const tnt_tensor_info_t *t, size_t n,
                                    const tnt_fusion_options_t *opt) {
  uint64_t h = 1469598103934665603ull;
  const uint64_t o[6] = {opt->threshold_bytes,      (uint64_t)opt->op,
                         (uint64_t)opt->wire_dtype, (uint64_t)opt->tune_threshold,
                         (uint64_t)opt->order,      (uint64_t)opt->overlap};
  for (int k = 0; k < 6; ++k) h = (h ^ o[k]) * 1099511628211ull;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v[3] = {t[i].id, t[i].count, (uint64_t)t[i].dtype};
    for (int k = 0; k < 3; ++k) h = (h ^ v[k]) * 1099511628211ull;
  }
  int64_t mine[2] = {(int64_t)(h >> 1), ~(int64_t)(h >> 1)};
  int64_t most[2];
  TNT_CHECK(tnt__allreduce_submit(g, mine, most, 2, TNT_INT64, TNT_MAX, "fusion set agreement", -1,
                                  NULL));
  if (most[0] != mine[0] || most[1] != mine[1]) {
    TNT_LOG_ERROR(
        "tnt_fusion_create: the ranks disagree on the fused tensor list or the "
        "options (%zu tensors here); every rank must create the fusion set with the "
        "same list, in the same order, and the same options",
        n);
    return TNT_ERR_MISMATCH;
  }
  return TNT_OK;
}

static tnt_status_t fusion_free(tnt_fusion_t *f);

/* Frees `nbuckets` buckets; none may be in flight. */
static void free_buckets(bucket_t *buckets, size_t nbuckets) {
  for (size_t b = 0; buckets != NULL && b < nbuckets; ++b) free(buckets[b].buf);
  free(buckets);
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
                                 tnt__fusion_plan_t *plan, bucket_t **buckets) {
  if (f->perm == NULL) {
    TNT_CHECK(tnt__fusion_plan(f->tensors, n, threshold, plan));
  } else {
    TNT_CHECK(plan_permuted(f, n, threshold, plan));
  }
  bucket_t *bks = calloc(plan->nbuckets + 1, sizeof *bks);
  for (size_t b = 0; bks != NULL && b < plan->nbuckets; ++b) {
    const tnt__bucket_plan_t *bp = &plan->buckets[b];
    bucket_t *bk = &bks[b];
    bk->wire = bp->dtype == TNT_FLOAT32 ? f->opt.wire_dtype : bp->dtype;
    bk->buf = malloc(bp->count * tnt__dtype_size(bk->wire) + 1);
    if (bk->buf == NULL) {
      free_buckets(bks, b);
      bks = NULL;
      break;
    }
    snprintf(bk->label, sizeof bk->label,
             "allreduce of fusion bucket %zu (%zu tensors, %zu bytes%s%s)", b, bp->nmembers,
             bp->count * tnt__dtype_size(bk->wire), bk->wire != bp->dtype ? " of " : "",
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

static tnt_status_t fusion_create(tnt_group_t *g, const tnt_tensor_info_t *tensors, size_t n,
                                  const tnt_fusion_options_t *options, tnt_fusion_t **out) {
  static const char call[] = "tnt_fusion_create";
  /* Only the first `size` bytes are the caller's: a caller built against
   * an older tnt.h has a shorter struct, whose missing fields keep their
   * zero defaults. */
  tnt_fusion_options_t opt = {.size = sizeof opt};
  if (options != NULL) {
    if (options->size < sizeof options->size || options->size > sizeof opt) {
      return tnt__api_invalid(call,
                              "options.size is %zu: set it to sizeof(tnt_fusion_options_t) (%zu "
                              "in this libtnt), e.g. with TNT_FUSION_OPTIONS_INIT; a larger size "
                              "means a tnt.h newer than this libtnt",
                              options->size, sizeof opt);
    }
    memcpy(&opt, options, options->size);
  }
  if (g == NULL || out == NULL || (tensors == NULL && n > 0)) {
    return tnt__api_invalid(call, "need a group, a tensor list and an output");
  }
  if (!tnt__op_valid(opt.op)) return tnt__api_invalid(call, "invalid op %d", (int)opt.op);
  if (opt.wire_dtype != TNT_FLOAT32 && opt.wire_dtype != TNT_FLOAT16 &&
      opt.wire_dtype != TNT_BFLOAT16) {
    return tnt__api_invalid(call,
                            "wire_dtype %d (%s): float32 tensors travel as float32 (no "
                            "compression), float16 or bfloat16",
                            (int)opt.wire_dtype, tnt_dtype_name(opt.wire_dtype));
  }
  if ((unsigned)opt.order >= TNT_FUSION_ORDER_COUNT) {
    return tnt__api_invalid(call, "order %d: TNT_FUSION_ORDER_LIST or TNT_FUSION_ORDER_READINESS",
                            (int)opt.order);
  }
  if (opt.tune_threshold != 0 && opt.tune_threshold != 1) {
    return tnt__api_invalid(call, "tune_threshold %d: 0 (use threshold_bytes) or 1 (tune it)",
                            opt.tune_threshold);
  }
  if ((unsigned)opt.overlap >= TNT_FUSION_OVERLAP_COUNT) {
    return tnt__api_invalid(call,
                            "overlap %d: TNT_FUSION_OVERLAP_ON, TNT_FUSION_OVERLAP_OFF or "
                            "TNT_FUSION_OVERLAP_TUNE",
                            (int)opt.overlap);
  }
  TNT_CHECK(tnt__engine_check(tnt__context_engine(g->ctx)));
  tnt_fusion_t *f = calloc(1, sizeof *f);
  if (f == NULL) {
    TNT_LOG_ERROR("%s: out of memory", call);
    return TNT_ERR_NO_MEMORY;
  }
  f->g = g;
  f->opt = opt;
  tnt__tuner_init(&f->tuner, opt.tune_threshold, opt.threshold_bytes,
                  opt.overlap == TNT_FUSION_OVERLAP_TUNE, opt.overlap == TNT_FUSION_OVERLAP_OFF);
  f->threshold = tnt__tuner_plan(&f->tuner).threshold;
  f->hold = tnt__tuner_plan(&f->tuner).hold;
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
  TNT_CHECK_GOTO(check_same_list(g, tensors, n, &opt), st, fail);
  if (tnt__handle_add(TNT__HANDLE_FUSION, f, &f->handle) < 0) goto no_memory;
  TNT_LOG_DEBUG(
      "fusion: %zu tensors in %zu buckets (threshold %zu bytes%s, overlap %s, float32 travels "
      "as %s)",
      n, f->plan.nbuckets, f->threshold, opt.tune_threshold ? ", tuning" : "",
      opt.overlap == TNT_FUSION_OVERLAP_TUNE ? "tuning"
      : f->hold                              ? "off"
                                             : "on",
      tnt_dtype_name(opt.wire_dtype));
  *out = f;
  return TNT_OK;
no_memory:
  TNT_LOG_ERROR("%s: out of memory for %zu tensors", call, n);
  st = TNT_ERR_NO_MEMORY;
fail:
  fusion_free(f);
  return st;
}

tnt_status_t tnt_fusion_create(tnt_group_t *g, const tnt_tensor_info_t *tensors, size_t n,
                               const tnt_fusion_options_t *options, tnt_fusion_t **out) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_create", g != NULL ? g->ctx : NULL,
                      fusion_create(g, tensors, n, options, out));
}

static tnt_status_t fusion_free(tnt_fusion_t *f) {
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

tnt_status_t tnt_fusion_destroy(tnt_fusion_t *f) {
  tnt__error_clear();
  if (f == NULL) return TNT_OK;
  const tnt_context_t *ctx = ctx_of(f);
  return tnt__api_end("tnt_fusion_destroy", ctx, fusion_free(f));
}

tnt_fusion_t *tnt_fusion_lookup(int64_t handle) {
  return tnt__handle_get(TNT__HANDLE_FUSION, handle);
}

int64_t tnt_fusion_handle(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->handle;
}

/* 1 while the set's first rounds decide its plan. */
static int deciding(const tnt_fusion_t *f) {
  return tnt__tuner_phase(&f->tuner) != TNT__TUNER_DONE ||
         (f->opt.order == TNT_FUSION_ORDER_READINESS && f->perm == NULL);
}

/* 1 while a round must end before the next starts: while deciding, and
 * while overlap is off (a round's count of starts says when to submit). */
static int sequential(const tnt_fusion_t *f) {
  return deciding(f) || f->hold;
}

/* Replaces the plan and buckets of `f` by those for `threshold` (in the
 * order f->perm). Called with f->mu held and no bucket in flight. */
static tnt_status_t replan(tnt_fusion_t *f, size_t threshold) {
  tnt__fusion_plan_t plan;
  bucket_t *buckets;
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

static int cmp_seen(const void *a, const void *b) {
  const int64_t *x = a, *y = b; /* {position, index} */
  if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
  return (x[1] > y[1]) - (x[1] < y[1]);
}

/* The end of round 1 of a set in readiness order: the master's order has
 * arrived (submitted before the round's first bucket, so it completed
 * first); f->perm becomes the tensors sorted by it. */
static tnt_status_t take_order(tnt_fusion_t *f) {
  const size_t n = f->plan.ntensors;
  TNT_CHECK(tnt__request_wait(f->order_req, tnt_context_timeout(f->g->ctx)));
  tnt__request_unref(f->order_req);
  f->order_req = NULL;
  int64_t *pairs = malloc(2 * n * sizeof *pairs + 1);
  size_t *perm = malloc(n * sizeof *perm + 1);
  if (pairs == NULL || perm == NULL) {
    free(pairs);
    free(perm);
    TNT_LOG_ERROR("fusion: out of memory for the order of %zu tensors", n);
    return TNT_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < n; ++i) {
    pairs[2 * i] = f->seen[i];
    pairs[2 * i + 1] = (int64_t)i;
  }
  qsort(pairs, n, 2 * sizeof *pairs, cmp_seen);
  for (size_t k = 0; k < n; ++k) perm[k] = (size_t)pairs[2 * k + 1];
  free(pairs);
  f->perm = perm;
  if (tnt_group_rank(f->g) == 0 && n > 0) {
    TNT_LOG_DEBUG(
        "fusion: %zu tensors fill their buckets in the order the master started them "
        "(first tensor id %llu, last %llu)",
        n, (unsigned long long)f->tensors[perm[0]].id,
        (unsigned long long)f->tensors[perm[n - 1]].id);
  }
  return TNT_OK;
}

/* The master's log line of the plan a set tuned. */
static void log_tuned(const tnt_fusion_t *f) {
  const tnt__tuner_t *t = &f->tuner;
  const int tunes_overlap = f->opt.overlap == TNT_FUSION_OVERLAP_TUNE;
  char times[400];
  size_t len = 0;
  for (int c = 0; c < t->ncandidates && len < sizeof times; ++c) {
    const tnt__tuner_plan_t p = t->candidates[c];
    char thr[24] = "", ovl[24] = "";
    if (f->opt.tune_threshold) snprintf(thr, sizeof thr, "%zu KiB", p.threshold / 1024);
    if (tunes_overlap) {
      snprintf(ovl, sizeof ovl, "%soverlap %s", f->opt.tune_threshold ? " " : "",
               p.hold ? "off" : "on");
    }
    len += (size_t)snprintf(times + len, sizeof times - len, "%s%s%s %.2f ms", c ? ", " : "", thr,
                            ovl, t->best_s[c] * 1e3);
  }
  char chosen[48] = "";
  if (f->opt.tune_threshold)
    snprintf(chosen, sizeof chosen, "threshold %zu KiB", f->threshold / 1024);
  if (tunes_overlap) {
    const size_t len2 = strlen(chosen);
    snprintf(chosen + len2, sizeof chosen - len2, "%soverlap %s", len2 ? ", " : "",
             f->hold ? "off" : "on");
  }
  TNT_LOG_DEBUG("fusion: tuned %s for %zu tensors (%zu bucket%s); fastest round with each: %s",
               chosen, f->plan.ntensors, f->plan.nbuckets, f->plan.nbuckets == 1 ? "" : "s", times);
}

/* Ends a round while the set decides its plan: takes the master's order
 * after round 1, times the round and takes the master's threshold for a
 * set that tunes it, and replans when either changed. Called with f->mu
 * held, once every tensor has finished the round (so no bucket is in
 * flight); f->round already counts the round. */
static tnt_status_t end_deciding_round(tnt_fusion_t *f) {
  int changed = 0;
  size_t threshold = f->threshold;
  if (f->opt.order == TNT_FUSION_ORDER_READINESS && f->perm == NULL && f->round == 2) {
    TNT_CHECK(take_order(f));
    changed = 1;
  }
  const tnt__tuner_phase_t phase = tnt__tuner_phase(&f->tuner);
  if (phase != TNT__TUNER_DONE) {
    int chosen = -1;
    if (phase == TNT__TUNER_DECIDING) {
      /* Submitted before the round's first bucket, so it completed first. */
      TNT_CHECK(tnt__request_wait(f->vote_req, tnt_context_timeout(f->g->ctx)));
      tnt__request_unref(f->vote_req);
      f->vote_req = NULL;
      chosen = (int)f->vote[0];
    }
    changed |= tnt__tuner_end_round(&f->tuner, tnt__now() - f->round_began, chosen);
    threshold = tnt__tuner_plan(&f->tuner).threshold;
    f->hold = tnt__tuner_plan(&f->tuner).hold;
  }
  if (changed) TNT_CHECK(replan(f, threshold));
  if (phase == TNT__TUNER_DECIDING && tnt_group_rank(f->g) == 0) log_tuned(f);
  return TNT_OK;
}

/* Marks tensor i finished; the last member of a bucket resets it for the
 * next round, and the last tensor of the round ends the round. Called with
 * f->mu held; *release becomes the request to release (after unlocking)
 * when the bucket's round ended, else NULL. */
static tnt_status_t mark_finished(tnt_fusion_t *f, size_t i, tnt_request_t **release) {
  const size_t b = f->plan.bucket_of[i];
  bucket_t *bk = &f->buckets[b];
  const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
  *release = NULL;
  f->state[i] = FINISHED;
  f->rounds_of[i]++;
  if (++bk->finished < bp->nmembers) return TNT_OK;
  for (size_t k = 0; k < bp->nmembers; ++k) f->state[f->plan.members[bp->first + k]] = IDLE;
  *release = bk->req;
  bk->started = bk->finished = 0;
  bk->req = NULL;
  pthread_cond_broadcast(&f->cv);
  f->finished_in_round += bp->nmembers;
  if (f->finished_in_round < f->plan.ntensors) return TNT_OK;
  f->round++;
  f->started_in_round = f->finished_in_round = 0;
  if (!deciding(f)) return TNT_OK;
  tnt_status_t st = end_deciding_round(f);
  if (st < 0) f->broken = st;
  return st;
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
    bucket_t *bk = &f->buckets[b];
    const tnt__bucket_plan_t *bp = &f->plan.buckets[b];
    if (bk->req != NULL || bk->started < bp->nmembers) return TNT_OK;
    if (b == 0 && f->opt.order == TNT_FUSION_ORDER_READINESS && f->perm == NULL && f->round == 1 &&
        f->order_req == NULL) {
      const int master = tnt_group_rank(f->g) == 0;
      for (size_t i = 0; i < f->plan.ntensors; ++i) f->seen[i] = master ? f->seen[i] : -1;
      TNT_CHECK(tnt__allreduce_submit(f->g, f->seen, f->seen, f->plan.ntensors, TNT_INT64, TNT_MAX,
                                      "fusion order of readiness", -1, &f->order_req));
    }
    if (b == 0 && f->vote_req == NULL && tnt__tuner_phase(&f->tuner) == TNT__TUNER_DECIDING) {
      f->vote[0] = tnt_group_rank(f->g) == 0 ? tnt__tuner_fastest(&f->tuner) : -1;
      TNT_CHECK(tnt__allreduce_submit(f->g, f->vote, f->vote, 1, TNT_INT64, TNT_MAX,
                                      "fusion threshold choice", -1, &f->vote_req));
    }
    TNT_CHECK(tnt__allreduce_submit(f->g, bk->buf, bk->buf, bp->count, bk->wire, f->opt.op,
                                    bk->label, (long)b, &bk->req));
    ++*nissued;
    f->next_issue = (b + 1) % f->plan.nbuckets;
    pthread_cond_broadcast(&f->cv);
  }
}

/* While a set decides its plan, waits until tensor i may start: until
 * every tensor has finished the round that i has finished already. Called
 * with f->mu held. */
static tnt_status_t wait_for_round(tnt_fusion_t *f, size_t i, const char *call) {
  if (!sequential(f)) return TNT_OK;
  const double timeout_s = tnt_context_timeout(f->g->ctx);
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

static tnt_status_t fusion_start(tnt_fusion_t *f, uint64_t id, const void *data, double scale) {
  static const char call[] = "tnt_fusion_start";
  if (f == NULL) return tnt__api_invalid(call, "the fusion set is NULL");
  const long i = find_tensor(f, id, call);
  if (i < 0) return TNT_ERR_INVALID_ARG;
  const tnt_tensor_info_t *t = &f->tensors[i];
  if (data == NULL && t->count > 0) {
    return tnt__api_invalid(call, "tensor %llu: data is NULL with count %zu > 0",
                            (unsigned long long)id, t->count);
  }
  TNT_CHECK(tnt__engine_check(tnt__context_engine(f->g->ctx)));
  pthread_mutex_lock(&f->mu);
  tnt_status_t st = wait_for_round(f, (size_t)i, call);
  if (st < 0) {
    pthread_mutex_unlock(&f->mu);
    return st;
  }
  /* The plan stays until this tensor has finished the round. */
  const size_t b = f->plan.bucket_of[i];
  bucket_t *bk = &f->buckets[b];
  const size_t esz = tnt__dtype_size(bk->wire);
  if (f->state[i] != IDLE) {
    const int twice = f->state[i] == STARTED;
    pthread_mutex_unlock(&f->mu);
    TNT_LOG_ERROR(
        "%s: tensor %llu was started already in this round (%s); a round of fusion "
        "bucket %zu ends once every tensor of the bucket has finished",
        call, (unsigned long long)id,
        twice ? "and not finished" : "finished, but not every tensor of its bucket", b);
    return TNT_ERR_STATE;
  }
  f->state[i] = STARTED;
  if (f->round == 0) f->seen[i] = (int64_t)f->started_in_round;
  if (f->started_in_round++ == 0) f->round_began = tnt__now();
  uint8_t *part = bk->buf + f->plan.offset_of[i] * esz;
  pthread_mutex_unlock(&f->mu);

  /* Members occupy disjoint parts of the bucket, which no allreduce uses
   * until every member has started: the copy needs no lock. */
  if (scale != 1.0) {
    tnt__copy_scaled(part, bk->wire, data, t->dtype, t->count, scale, 0);
  } else if (bk->wire != t->dtype) {
    tnt__narrow((uint16_t *)(void *)part, data, t->count, bk->wire);
  } else {
    memcpy(part, data, t->count * esz);
  }
  if (TNT__TIMELINE_ON()) {
    tnt__timeline_instant("fusion", "fusion start", "\"tensor\":%llu,\"bytes\":%zu,\"bucket\":%zu",
                          (unsigned long long)id, t->count * esz, b);
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

tnt_status_t tnt_fusion_start(tnt_fusion_t *f, uint64_t id, const void *data) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_start", ctx_of(f), fusion_start(f, id, data, 1.0));
}

tnt_status_t tnt_fusion_start_scaled(tnt_fusion_t *f, uint64_t id, const void *data,
                                     double scale) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_start_scaled", ctx_of(f), fusion_start(f, id, data, scale));
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
    if (f->state[i] == IDLE) {
      len += (size_t)snprintf(ids + len, sizeof ids - len, " %llu",
                              (unsigned long long)f->tensors[i].id);
    }
  }
  if (len > 0) {
    tnt__log(level, "fusion bucket %zu: %s; tensors not started on this rank:%s", b, what, ids);
  } else if (f->hold && f->started_in_round < f->plan.ntensors) {
    for (size_t i = 0; i < f->plan.ntensors && len < sizeof ids - 24; ++i) {
      if (f->state[i] == IDLE) {
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

static tnt_status_t fusion_finish(tnt_fusion_t *f, uint64_t id, void *out, double divisor,
                                  double timeout_s) {
  static const char call[] = "tnt_fusion_finish";
  if (f == NULL) return tnt__api_invalid(call, "the fusion set is NULL");
  const long i = find_tensor(f, id, call);
  if (i < 0) return TNT_ERR_INVALID_ARG;
  const tnt_tensor_info_t *t = &f->tensors[i];
  if (tnt__dtype_is_integer(t->dtype) && (long long)divisor == 0) {
    return tnt__api_invalid(call, "tensor %llu: an integer tensor cannot be divided by %g",
                            (unsigned long long)id, divisor);
  }
  if (out == NULL && t->count > 0) {
    return tnt__api_invalid(call, "tensor %llu: out is NULL with count %zu > 0",
                            (unsigned long long)id, t->count);
  }
  if (timeout_s < 0) timeout_s = tnt_context_timeout(f->g->ctx);
  const double entered = tnt__now();
  const double deadline = entered + timeout_s;
  const struct timespec ts = tnt__abs_time(deadline);

  pthread_mutex_lock(&f->mu);
  if (f->state[i] != STARTED) {
    pthread_mutex_unlock(&f->mu);
    TNT_LOG_ERROR("%s: tensor %llu was not started", call, (unsigned long long)id);
    return TNT_ERR_STATE;
  }
  /* Started: the plan stays until the tensor has finished. */
  const size_t b = f->plan.bucket_of[i];
  bucket_t *bk = &f->buckets[b];
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
  const uint8_t *part = bk->buf + f->plan.offset_of[i] * esz;
  if (divisor != 1.0) {
    tnt__copy_scaled(out, t->dtype, part, bk->wire, t->count, divisor, 1);
  } else if (bk->wire != t->dtype) {
    tnt__widen(out, (const uint16_t *)(const void *)part, t->count, bk->wire);
  } else {
    memcpy(out, part, t->count * esz);
  }
  if (TNT__TIMELINE_ON()) {
    tnt__timeline_complete("wait", "fusion finish", entered, tnt__now(),
                           "\"tensor\":%llu,\"bucket\":%zu", (unsigned long long)id, b);
  }

  tnt_request_t *release;
  pthread_mutex_lock(&f->mu);
  const tnt_status_t st = mark_finished(f, (size_t)i, &release);
  pthread_mutex_unlock(&f->mu);
  if (release != NULL) tnt__request_unref(release);
  return st;
}

tnt_status_t tnt_fusion_finish(tnt_fusion_t *f, uint64_t id, void *out, double timeout_s) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_finish", ctx_of(f), fusion_finish(f, id, out, 1.0, timeout_s));
}

tnt_status_t tnt_fusion_finish_scaled(tnt_fusion_t *f, uint64_t id, void *out, double divisor,
                                      double timeout_s) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_finish_scaled", ctx_of(f),
                      fusion_finish(f, id, out, divisor, timeout_s));
}

tnt_group_t *tnt_fusion_group(const tnt_fusion_t *f) {
  return f == NULL ? NULL : f->g;
}

size_t tnt_fusion_num_buckets(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->plan.nbuckets;
}

size_t tnt_fusion_threshold(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->threshold;
}

int tnt_fusion_overlaps(const tnt_fusion_t *f) {
  return f != NULL && !f->hold;
}

long tnt_fusion_bucket_of(const tnt_fusion_t *f, uint64_t id) {
  if (f == NULL) return -1;
  long i = tnt__fusion_plan_find(&f->plan, id);
  return i < 0 ? -1 : (long)f->plan.bucket_of[i];
}

int tnt_fusion_tensor(const tnt_fusion_t *f, uint64_t id, tnt_tensor_info_t *info) {
  if (f == NULL) return 0;
  long i = tnt__fusion_plan_find(&f->plan, id);
  if (i < 0) return 0;
  if (info != NULL) *info = f->tensors[i];
  return 1;
}
