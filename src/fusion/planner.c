/*
 * The fusion planner (see planner.h): one pass over the tensors in list
 * order assigns each to the open bucket of its dtype, opening one when
 * there is none and closing it once it holds threshold_bytes or more; a
 * second pass lays the members out bucket by bucket. Both passes are
 * linear; duplicate ids are found by sorting a copy of the ids, so a plan
 * of n tensors costs O(n log n) and never depends on hashing or addresses,
 * which keeps it identical on every rank.
 */
#include "fusion/planner.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/log.h"
#include "core/reduce.h"

static int tnt__cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* TNT_ERR_INVALID_ARG (logged) for an invalid dtype, a tensor whose size
 * in bytes does not fit in size_t, or a repeated id. */
static tnt_status_t tnt__check_tensors(const tnt_tensor_info_t *tensors, size_t n) {
  tnt_status_t st = TNT_OK;
  uint64_t *ids = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!tnt__dtype_valid(tensors[i].dtype)) {
      TNT_LOG_ERROR("fusion plan: tensor %zu (id %llu) has invalid dtype %d", i,
                    (unsigned long long)tensors[i].id, (int)tensors[i].dtype);
      st = TNT_ERR_INVALID_ARG;
      goto out;
    }
    if (tensors[i].count > SIZE_MAX / tnt_dtype_size(tensors[i].dtype)) {
      TNT_LOG_ERROR("fusion plan: tensor %zu (id %llu) is too large", i,
                    (unsigned long long)tensors[i].id);
      st = TNT_ERR_INVALID_ARG;
      goto out;
    }
  }
  ids = malloc(n * sizeof *ids);
  if (ids == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto out;
  }
  for (size_t i = 0; i < n; i++) ids[i] = tensors[i].id;
  qsort(ids, n, sizeof *ids, tnt__cmp_u64);
  for (size_t i = 1; i < n; i++) {
    if (ids[i] == ids[i - 1]) {
      TNT_LOG_ERROR("fusion plan: tensor id %llu appears more than once",
                    (unsigned long long)ids[i]);
      st = TNT_ERR_INVALID_ARG;
      goto out;
    }
  }
out:
  free(ids);
  return st;
}

tnt_status_t tnt__fusion_plan(const tnt_tensor_info_t *tensors, size_t n, size_t threshold_bytes,
                              tnt__fusion_plan_t *plan) {
  tnt_status_t st = TNT_OK;
  size_t *fill = NULL;
  if (plan == NULL) return TNT_ERR_INVALID_ARG;
  memset(plan, 0, sizeof *plan);
  if (n == 0) return TNT_OK;
  if (tensors == NULL) {
    TNT_LOG_ERROR("fusion plan: NULL tensor list with %zu tensors", n);
    return TNT_ERR_INVALID_ARG;
  }
  TNT_CHECK_GOTO(tnt__check_tensors(tensors, n), st, fail);

  /* At most one bucket per tensor; the array is shrunk at the end. */
  plan->ntensors = n;
  plan->buckets = calloc(n, sizeof *plan->buckets);
  plan->members = malloc(n * sizeof *plan->members);
  plan->bucket_of = malloc(n * sizeof *plan->bucket_of);
  plan->offset_of = malloc(n * sizeof *plan->offset_of);
  fill = calloc(n, sizeof *fill);
  if (!plan->buckets || !plan->members || !plan->bucket_of || !plan->offset_of || !fill) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }

  /* Pass 1: assign tensors to buckets. open[d] is the open bucket of dtype
   * d plus one (0: none), so that bucket 0 needs no special value. */
  size_t open[TNT_DTYPE_COUNT] = {0};
  for (size_t i = 0; i < n; i++) {
    tnt_dtype_t dt = tensors[i].dtype;
    if (open[dt] == 0) {
      plan->buckets[plan->nbuckets].dtype = dt;
      open[dt] = ++plan->nbuckets;
    }
    size_t b = open[dt] - 1;
    tnt__bucket_plan_t *bp = &plan->buckets[b];
    plan->bucket_of[i] = b;
    plan->offset_of[i] = bp->count;
    bp->nmembers++;
    /* A bucket's element count cannot overflow in bytes: it is at most the
     * total of the tensors, each of which fits, but their sum might not. */
    if (tensors[i].count > SIZE_MAX / tnt_dtype_size(dt) - bp->count) {
      TNT_LOG_ERROR("fusion plan: bucket %zu grows beyond the address space", b);
      st = TNT_ERR_INVALID_ARG;
      goto fail;
    }
    bp->count += tensors[i].count;
    if (bp->count * tnt_dtype_size(dt) >= threshold_bytes) open[dt] = 0;
  }

  /* Pass 2: members grouped by bucket, in list order inside each. */
  size_t first = 0;
  for (size_t b = 0; b < plan->nbuckets; b++) {
    plan->buckets[b].first = first;
    first += plan->buckets[b].nmembers;
  }
  for (size_t i = 0; i < n; i++) {
    size_t b = plan->bucket_of[i];
    plan->members[plan->buckets[b].first + fill[b]++] = i;
  }

  tnt__bucket_plan_t *shrunk = realloc(plan->buckets, plan->nbuckets * sizeof *shrunk);
  if (shrunk != NULL) plan->buckets = shrunk;
  free(fill);
  return TNT_OK;

fail:
  free(fill);
  tnt__fusion_plan_free(plan);
  return st;
}

void tnt__fusion_plan_free(tnt__fusion_plan_t *plan) {
  if (plan == NULL) return;
  free(plan->buckets);
  free(plan->members);
  free(plan->bucket_of);
  free(plan->offset_of);
  memset(plan, 0, sizeof *plan);
}
