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

#include "util/common.h"
#include "util/log.h"
#include "util/reduce.h"

static int cmp_id(const void *a, const void *b) {
  uint64_t x = ((const tnt__plan_id_t *)a)->id, y = ((const tnt__plan_id_t *)b)->id;
  return (x > y) - (x < y);
}

/* TNT_ERR_INVALID_ARG (logged) for an invalid dtype or a tensor whose size
 * in bytes does not fit in size_t. */
static tnt_status_t check_tensors(const tnt_tensor_info_t *tensors, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!tnt__dtype_valid(tensors[i].dtype)) {
      TNT_LOG_ERROR("fusion plan: tensor %zu (id %llu) has invalid dtype %d", i,
                    (unsigned long long)tensors[i].id, (int)tensors[i].dtype);
      return TNT_ERR_INVALID_ARG;
    }
    if (tensors[i].count > SIZE_MAX / tnt__dtype_size(tensors[i].dtype)) {
      TNT_LOG_ERROR("fusion plan: tensor %zu (id %llu) is too large", i,
                    (unsigned long long)tensors[i].id);
      return TNT_ERR_INVALID_ARG;
    }
  }
  return TNT_OK;
}

/* Fills plan->by_id (sorted by id); TNT_ERR_INVALID_ARG (logged) for a
 * repeated id. */
static tnt_status_t index_ids(const tnt_tensor_info_t *tensors, size_t n,
                              tnt__fusion_plan_t *plan) {
  plan->by_id = malloc(n * sizeof *plan->by_id);
  if (plan->by_id == NULL) {
    TNT_LOG_ERROR("fusion plan: out of memory for %zu tensors", n);
    return TNT_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++) plan->by_id[i] = (tnt__plan_id_t){tensors[i].id, i};
  qsort(plan->by_id, n, sizeof *plan->by_id, cmp_id);
  for (size_t i = 1; i < n; i++) {
    if (plan->by_id[i].id == plan->by_id[i - 1].id) {
      TNT_LOG_ERROR("fusion plan: tensor id %llu appears more than once; ids must be unique",
                    (unsigned long long)plan->by_id[i].id);
      return TNT_ERR_INVALID_ARG;
    }
  }
  return TNT_OK;
}

long tnt__fusion_plan_find(const tnt__fusion_plan_t *plan, uint64_t id) {
  size_t lo = 0, hi = plan->ntensors;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (plan->by_id[mid].id == id) return (long)plan->by_id[mid].index;
    if (plan->by_id[mid].id < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return -1;
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
  TNT_CHECK_GOTO(check_tensors(tensors, n), st, fail);
  plan->ntensors = n;
  TNT_CHECK_GOTO(index_ids(tensors, n, plan), st, fail);

  /* At most one bucket per tensor; the array is shrunk at the end. */
  plan->buckets = calloc(n, sizeof *plan->buckets);
  plan->members = malloc(n * sizeof *plan->members);
  plan->bucket_of = malloc(n * sizeof *plan->bucket_of);
  plan->offset_of = malloc(n * sizeof *plan->offset_of);
  fill = calloc(n, sizeof *fill);
  if (!plan->buckets || !plan->members || !plan->bucket_of || !plan->offset_of || !fill) {
    TNT_LOG_ERROR("fusion plan: out of memory for %zu tensors", n);
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
    /* Every tensor starts on the slices' quantum, so that where a rank's
     * part of a bucket cuts a tensor, it cuts it as elementwise kernels cut
     * the whole tensor (tnt__slice_quantum). */
    const size_t q = tnt__slice_quantum(tnt__dtype_size(dt));
    const size_t at = (bp->count + q - 1) / q * q;
    plan->offset_of[i] = at;
    bp->nmembers++;
    /* A bucket's element count cannot overflow in bytes: it is at most the
     * total of the tensors, each of which fits, but their sum might not. */
    if (tensors[i].count > SIZE_MAX / tnt__dtype_size(dt) - at - q) {
      TNT_LOG_ERROR("fusion plan: bucket %zu grows beyond the address space", b);
      st = TNT_ERR_INVALID_ARG;
      goto fail;
    }
    bp->count = at + tensors[i].count;
    fill[b] += tensors[i].count; /* the threshold counts the tensors, not the padding */
    if (fill[b] * tnt__dtype_size(dt) >= threshold_bytes) open[dt] = 0;
  }

  /* Pass 2: members grouped by bucket, in list order inside each. */
  memset(fill, 0, n * sizeof *fill);
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
  free(plan->by_id);
  memset(plan, 0, sizeof *plan);
}
