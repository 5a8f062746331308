/*
 * What the ranks of a fusion set agree on (see runtime.h): the fused list
 * and options (checked at creation), the order of readiness (the master's,
 * carried in round 1) and the tuned plan (the master's choice, carried in
 * the deciding round). Each is an allreduce that every rank submits in the
 * same place: the check at creation, the others just before the round's
 * first bucket.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/runtime.h"
#include "util/log.h"

tnt_status_t tnt__fusion_check_same_list(const tnt_fusion_t *f) {
  const tnt_fusion_options_t *opt = &f->opt;
  const tnt_tensor_info_t *t = f->tensors;
  const size_t n = f->plan.ntensors;
  uint64_t h = 1469598103934665603ull;
  const uint64_t o[7] = {opt->threshold_bytes,      (uint64_t)opt->op,
                         (uint64_t)opt->wire_dtype, (uint64_t)opt->tune_threshold,
                         (uint64_t)opt->order,      (uint64_t)opt->overlap,
                         (uint64_t)opt->mode};
  for (int k = 0; k < 7; ++k) h = (h ^ o[k]) * 1099511628211ull;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v[3] = {t[i].id, t[i].count, (uint64_t)t[i].dtype};
    for (int k = 0; k < 3; ++k) h = (h ^ v[k]) * 1099511628211ull;
  }
  int64_t mine[2] = {(int64_t)(h >> 1), ~(int64_t)(h >> 1)};
  int64_t most[2];
  TNT_CHECK(tnt__fusion_allreduce(f, mine, most, 2, TNT_INT64, TNT_MAX, "fusion set agreement", -1,
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

int tnt__fusion_deciding(const tnt_fusion_t *f) {
  return tnt__tuner_phase(&f->tuner) != TNT__TUNER_DONE ||
         (f->opt.order == TNT_FUSION_ORDER_READINESS && f->perm == NULL);
}

int tnt__fusion_sequential(const tnt_fusion_t *f) {
  return tnt__fusion_deciding(f) || f->hold;
}

tnt_status_t tnt__fusion_submit_choices(tnt_fusion_t *f) {
  if (f->opt.order == TNT_FUSION_ORDER_READINESS && f->perm == NULL && f->round == 1 &&
      f->order_req == NULL) {
    const int master = f->comm->rank == 0;
    for (size_t i = 0; i < f->plan.ntensors; ++i) f->seen[i] = master ? f->seen[i] : -1;
    TNT_CHECK(tnt__fusion_allreduce(f, f->seen, f->seen, f->plan.ntensors, TNT_INT64, TNT_MAX,
                                    "fusion order of readiness", -1, &f->order_req));
  }
  if (f->vote_req == NULL && tnt__tuner_phase(&f->tuner) == TNT__TUNER_DECIDING) {
    f->vote[0] = f->comm->rank == 0 ? tnt__tuner_fastest(&f->tuner) : -1;
    TNT_CHECK(tnt__fusion_allreduce(f, f->vote, f->vote, 1, TNT_INT64, TNT_MAX,
                                    "fusion threshold choice", -1, &f->vote_req));
  }
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
  TNT_CHECK(tnt__request_wait(f->order_req, tnt__engine_timeout(f->engine)));
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
  if (f->comm->rank == 0 && n > 0) {
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
tnt_status_t tnt__fusion_end_deciding_round(tnt_fusion_t *f) {
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
      TNT_CHECK(tnt__request_wait(f->vote_req, tnt__engine_timeout(f->engine)));
      tnt__request_unref(f->vote_req);
      f->vote_req = NULL;
      chosen = (int)f->vote[0];
    }
    changed |= tnt__tuner_end_round(&f->tuner, tnt__now() - f->round_began, chosen);
    threshold = tnt__tuner_plan(&f->tuner).threshold;
    f->hold = tnt__tuner_plan(&f->tuner).hold;
  }
  if (changed) TNT_CHECK(tnt__fusion_replan(f, threshold));
  if (phase == TNT__TUNER_DECIDING && f->comm->rank == 0) log_tuned(f);
  return TNT_OK;
}
