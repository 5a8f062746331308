/*
 * The fusion planner: a pure function from an ordered tensor list and a
 * threshold to buckets. Kept apart from the runtime so it can be tested
 * on its own.
 *
 * Rules: tensors are taken in the given (backprop) order. Each dtype has at
 * most one open bucket; a tensor joins the open bucket of its dtype (a new
 * bucket is opened when there is none) and the bucket closes as soon as it
 * holds at least `threshold_bytes`. Buckets are numbered in the order they
 * were opened, which is the order their allreduces are issued. Inside a
 * bucket, tensors are packed back to back in list order.
 */
#ifndef TNT_FUSION_PLANNER_H
#define TNT_FUSION_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "tnt/tnt.h"

typedef struct tnt__bucket_plan {
  size_t first;    /* index in plan.members of the bucket's first tensor */
  size_t nmembers; /* tensors in the bucket */
  size_t count;    /* elements in the bucket */
  tnt_dtype_t dtype;
} tnt__bucket_plan_t;

/* A tensor's id and its index in the list. */
typedef struct tnt__plan_id {
  uint64_t id;
  size_t index;
} tnt__plan_id_t;

typedef struct tnt__fusion_plan {
  size_t ntensors;
  size_t nbuckets;
  tnt__bucket_plan_t *buckets; /* [nbuckets] */
  size_t *members;             /* [ntensors] tensor indices, grouped by bucket, list order inside */
  size_t *bucket_of;           /* [ntensors] bucket of tensor i */
  size_t *offset_of;           /* [ntensors] element offset of tensor i in its bucket: the
                                  first multiple of tnt__slice_quantum after the tensor
                                  before it (the padding between them is zero) */
  tnt__plan_id_t *by_id;       /* [ntensors] sorted by id, for tnt__fusion_plan_find */
} tnt__fusion_plan_t;

/*
 * Fills `plan` (owned by the caller, freed with tnt__fusion_plan_free).
 * TNT_ERR_INVALID_ARG for a NULL list with n > 0, an invalid dtype or a
 * duplicate id (the log names it); `plan` is then left empty.
 */
tnt_status_t tnt__fusion_plan(const tnt_tensor_info_t *tensors, size_t n, size_t threshold_bytes,
                              tnt__fusion_plan_t *plan);
void tnt__fusion_plan_free(tnt__fusion_plan_t *plan);

/* The index in the list of tensor `id`, or -1 when the plan has none. */
long tnt__fusion_plan_find(const tnt__fusion_plan_t *plan, uint64_t id);

#endif
