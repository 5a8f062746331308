/*
 * Tests of the fusion planner (src/fusion/planner.c) against the rules in
 * planner.h. Every plan is also checked for internal consistency
 * (check_plan): members grouped by bucket in list order, each at the first
 * multiple of the slice quantum after the one before it, counts adding up,
 * one dtype per bucket.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fusion/planner.h"
#include "util/common.h"
#include "util/reduce.h"

/* Structural invariants that every valid plan satisfies. */
static void check_plan(const tnt_tensor_info_t *t, size_t n, const tnt__fusion_plan_t *p) {
  assert_int_equal(p->ntensors, n);
  size_t next = 0;
  for (size_t b = 0; b < p->nbuckets; b++) {
    const tnt__bucket_plan_t *bp = &p->buckets[b];
    assert_int_equal(bp->first, next);
    assert_true(bp->nmembers > 0);
    size_t off = 0;
    const size_t q = tnt__slice_quantum(tnt__dtype_size(bp->dtype));
    for (size_t m = 0; m < bp->nmembers; m++) {
      off = (off + q - 1) / q * q;
      size_t i = p->members[bp->first + m];
      assert_true(i < n);
      if (m > 0) assert_true(i > p->members[bp->first + m - 1]); /* list order */
      assert_int_equal(p->bucket_of[i], b);
      assert_int_equal(p->offset_of[i], off); /* on the quantum, back to back */
      assert_int_equal(t[i].dtype, bp->dtype);
      off += t[i].count;
    }
    assert_int_equal(bp->count, off);
    next += bp->nmembers;
    /* Buckets are numbered in opening order: the first member of each
     * bucket comes later in the list than the first member of the one
     * before it. */
    if (b > 0) assert_true(p->members[bp->first] > p->members[p->buckets[b - 1].first]);
  }
  assert_int_equal(next, n);
}

static void assert_plan_empty(const tnt__fusion_plan_t *p) {
  assert_int_equal(p->ntensors, 0);
  assert_int_equal(p->nbuckets, 0);
  assert_null(p->buckets);
  assert_null(p->members);
  assert_null(p->bucket_of);
  assert_null(p->offset_of);
}

static void test_threshold_zero_one_bucket_per_tensor(void **state) {
  (void)state;
  tnt_tensor_info_t t[] = {
      {10, 5, TNT_FLOAT32}, {11, 0, TNT_FLOAT32}, {12, 7, TNT_FLOAT16}, {13, 1, TNT_FLOAT32}};
  tnt__fusion_plan_t p;
  assert_int_equal(tnt__fusion_plan(t, 4, 0, &p), TNT_OK);
  check_plan(t, 4, &p);
  assert_int_equal(p.nbuckets, 4);
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(p.bucket_of[i], i);
    assert_int_equal(p.offset_of[i], 0);
    assert_int_equal(p.buckets[i].count, t[i].count);
  }
  tnt__fusion_plan_free(&p);
  assert_plan_empty(&p);
}

static void test_huge_threshold_one_bucket_per_dtype(void **state) {
  (void)state;
  tnt_tensor_info_t t[] = {{1, 100, TNT_FLOAT32}, {2, 3, TNT_INT64},   {3, 50, TNT_FLOAT32},
                           {4, 8, TNT_BFLOAT16},  {5, 9, TNT_INT64},   {6, 1, TNT_FLOAT32},
                           {7, 2, TNT_FLOAT64},   {8, 4, TNT_BFLOAT16}};
  tnt__fusion_plan_t p;
  assert_int_equal(tnt__fusion_plan(t, 8, (size_t)1 << 40, &p), TNT_OK);
  check_plan(t, 8, &p);
  assert_int_equal(p.nbuckets, 4);
  /* Opening order: float32, int64, bfloat16, float64. */
  assert_int_equal(p.buckets[0].dtype, TNT_FLOAT32);
  assert_int_equal(p.buckets[1].dtype, TNT_INT64);
  assert_int_equal(p.buckets[2].dtype, TNT_BFLOAT16);
  assert_int_equal(p.buckets[3].dtype, TNT_FLOAT64);
  /* float32 tensors start on multiples of 16 elements, int64 of 8. */
  assert_int_equal(p.buckets[0].count, 177);
  assert_int_equal(p.buckets[1].count, 17);
  assert_int_equal(p.offset_of[2], 112);
  assert_int_equal(p.offset_of[5], 176);
  assert_int_equal(p.offset_of[4], 8);
  size_t members0[] = {0, 2, 5};
  assert_memory_equal(&p.members[p.buckets[0].first], members0, sizeof members0);
  tnt__fusion_plan_free(&p);
}

/* Two dtypes interleaved with a threshold in between: each dtype fills and
 * closes its own bucket independently of the other. */
static void test_mixed_dtypes_interleaved(void **state) {
  (void)state;
  /* threshold 16 bytes: 4 floats, or 8 halves. */
  tnt_tensor_info_t t[] = {
      {100, 2, TNT_FLOAT32}, /* opens b0 (f32, 8 B) */
      {101, 4, TNT_FLOAT16}, /* opens b1 (f16, 8 B) */
      {102, 2, TNT_FLOAT32}, /* b0 reaches 16 B: closes */
      {103, 1, TNT_FLOAT32}, /* opens b2 (f32, 4 B) */
      {104, 6, TNT_FLOAT16}, /* b1 reaches 20 B: closes */
      {105, 9, TNT_FLOAT32}, /* b2 reaches 40 B: closes */
      {106, 1, TNT_FLOAT16}, /* opens b3 */
      {107, 1, TNT_FLOAT32}, /* opens b4 */
  };
  tnt__fusion_plan_t p;
  assert_int_equal(tnt__fusion_plan(t, 8, 16, &p), TNT_OK);
  check_plan(t, 8, &p);
  assert_int_equal(p.nbuckets, 5);
  size_t expect_bucket[] = {0, 1, 0, 2, 1, 2, 3, 4};
  size_t expect_offset[] = {0, 0, 16, 0, 16, 16, 0, 0};
  for (size_t i = 0; i < 8; i++) {
    assert_int_equal(p.bucket_of[i], expect_bucket[i]);
    assert_int_equal(p.offset_of[i], expect_offset[i]);
  }
  size_t expect_members[] = {0, 2, 1, 4, 3, 5, 6, 7};
  assert_memory_equal(p.members, expect_members, sizeof expect_members);
  /* Elements, padding included: the second member starts at 16. */
  assert_int_equal(p.buckets[0].count, 18);
  assert_int_equal(p.buckets[1].count, 22);
  assert_int_equal(p.buckets[2].count, 25);
  assert_int_equal(p.buckets[2].nmembers, 2);
  assert_int_equal(p.buckets[3].dtype, TNT_FLOAT16);
  assert_int_equal(p.buckets[4].dtype, TNT_FLOAT32);
  tnt__fusion_plan_free(&p);
}

/* A bucket closes as soon as it holds at least the threshold: exactly the
 * threshold closes it, one byte less does not. */
static void test_threshold_boundary(void **state) {
  (void)state;
  tnt_tensor_info_t t[] = {{1, 3, TNT_INT32},
                           {2, 1, TNT_INT32},
                           {3, 1, TNT_INT32},
                           {4, 2, TNT_INT32},
                           {5, 1, TNT_INT32}};
  tnt__fusion_plan_t p;
  assert_int_equal(tnt__fusion_plan(t, 5, 16, &p), TNT_OK);
  check_plan(t, 5, &p);
  /* 12 B, 16 B -> close; 4 B, 12 B, 16 B -> close. */
  assert_int_equal(p.nbuckets, 2);
  assert_int_equal(p.buckets[0].nmembers, 2);
  assert_int_equal(p.buckets[1].nmembers, 3);
  tnt__fusion_plan_free(&p);
  /* 12 B, 16 B, 20 B -> close; 8 B, 12 B stay open. */
  assert_int_equal(tnt__fusion_plan(t, 5, 17, &p), TNT_OK);
  check_plan(t, 5, &p);
  assert_int_equal(p.nbuckets, 2);
  assert_int_equal(p.buckets[0].nmembers, 3);
  assert_int_equal(p.buckets[1].nmembers, 2);
  tnt__fusion_plan_free(&p);
  /* 32 B in all: a threshold of 32 closes the only bucket with the last
   * tensor, 33 leaves it open; one bucket either way. */
  assert_int_equal(tnt__fusion_plan(t, 5, 32, &p), TNT_OK);
  assert_int_equal(p.nbuckets, 1);
  tnt__fusion_plan_free(&p);
  assert_int_equal(tnt__fusion_plan(t, 5, 33, &p), TNT_OK);
  assert_int_equal(p.nbuckets, 1);
  assert_int_equal(p.buckets[0].count, 4 * 16 + 1); /* 8 elements, each on a multiple of 16 */
  tnt__fusion_plan_free(&p);
  /* A tensor larger than the threshold gets a bucket of its own. */
  tnt_tensor_info_t big[] = {{1, 1000, TNT_FLOAT64}, {2, 1, TNT_FLOAT64}};
  assert_int_equal(tnt__fusion_plan(big, 2, 64, &p), TNT_OK);
  assert_int_equal(p.nbuckets, 2);
  tnt__fusion_plan_free(&p);
}

/* Random lists: invariants hold and the plan is reproducible. */
static void test_random_plans(void **state) {
  (void)state;
  uint64_t s = 12345;
  tnt_tensor_info_t t[200];
  for (int round = 0; round < 200; round++) {
    size_t n = 1 + (size_t)(round % 200);
    for (size_t i = 0; i < n; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t[i].id = (s >> 20) * 1000 + i; /* unique through the low digits */
      t[i].count = (size_t)((s >> 33) % 5000);
      t[i].dtype = (tnt_dtype_t)((s >> 50) % TNT_DTYPE_COUNT);
    }
    size_t thresholds[] = {0, 64, 4096, 1 << 20, SIZE_MAX};
    for (size_t k = 0; k < 5; k++) {
      tnt__fusion_plan_t p, q;
      assert_int_equal(tnt__fusion_plan(t, n, thresholds[k], &p), TNT_OK);
      check_plan(t, n, &p);
      if (thresholds[k] == 0) assert_int_equal(p.nbuckets, n);
      if (thresholds[k] == SIZE_MAX) assert_true(p.nbuckets <= TNT_DTYPE_COUNT);
      /* Every bucket but the last of its dtype reached the threshold. */
      for (size_t b = 0; b < p.nbuckets; b++) {
        int later = 0;
        for (size_t c = b + 1; c < p.nbuckets; c++) {
          later |= p.buckets[c].dtype == p.buckets[b].dtype;
        }
        if (later) {
          assert_true(p.buckets[b].count * tnt_dtype_size(p.buckets[b].dtype) >= thresholds[k]);
        }
      }
      assert_int_equal(tnt__fusion_plan(t, n, thresholds[k], &q), TNT_OK);
      assert_int_equal(p.nbuckets, q.nbuckets);
      assert_memory_equal(p.buckets, q.buckets, p.nbuckets * sizeof *p.buckets);
      assert_memory_equal(p.members, q.members, n * sizeof(size_t));
      assert_memory_equal(p.offset_of, q.offset_of, n * sizeof(size_t));
      tnt__fusion_plan_free(&p);
      tnt__fusion_plan_free(&q);
    }
  }
}

static void test_invalid_arguments(void **state) {
  (void)state;
  tnt__fusion_plan_t p;
  /* Duplicate ids, even far apart. */
  tnt_tensor_info_t dup[] = {
      {7, 1, TNT_FLOAT32}, {8, 1, TNT_FLOAT32}, {9, 1, TNT_INT32}, {7, 2, TNT_INT32}};
  memset(&p, 0x5a, sizeof p);
  assert_int_equal(tnt__fusion_plan(dup, 4, 16, &p), TNT_ERR_INVALID_ARG);
  assert_plan_empty(&p);
  /* Invalid dtype, above and below the valid range. */
  tnt_tensor_info_t bad[] = {{1, 1, TNT_FLOAT32}, {2, 1, TNT_DTYPE_COUNT}};
  memset(&p, 0x5a, sizeof p);
  assert_int_equal(tnt__fusion_plan(bad, 2, 16, &p), TNT_ERR_INVALID_ARG);
  assert_plan_empty(&p);
  bad[1].dtype = (tnt_dtype_t)-1;
  assert_int_equal(tnt__fusion_plan(bad, 2, 16, &p), TNT_ERR_INVALID_ARG);
  assert_plan_empty(&p);
  /* A NULL list with tensors. */
  memset(&p, 0x5a, sizeof p);
  assert_int_equal(tnt__fusion_plan(NULL, 3, 16, &p), TNT_ERR_INVALID_ARG);
  assert_plan_empty(&p);
  /* A tensor whose size in bytes overflows. */
  tnt_tensor_info_t huge[] = {{1, SIZE_MAX / 2, TNT_FLOAT64}};
  assert_int_equal(tnt__fusion_plan(huge, 1, 16, &p), TNT_ERR_INVALID_ARG);
  assert_plan_empty(&p);
  /* No plan to fill. */
  assert_int_equal(tnt__fusion_plan(dup, 1, 16, NULL), TNT_ERR_INVALID_ARG);
  /* Freeing an empty plan, or NULL, is harmless. */
  tnt__fusion_plan_free(&p);
  tnt__fusion_plan_free(NULL);
}

static void test_empty_list(void **state) {
  (void)state;
  tnt__fusion_plan_t p;
  memset(&p, 0x5a, sizeof p);
  assert_int_equal(tnt__fusion_plan(NULL, 0, 16, &p), TNT_OK);
  assert_plan_empty(&p);
  tnt_tensor_info_t one[] = {{1, 1, TNT_FLOAT32}};
  assert_int_equal(tnt__fusion_plan(one, 0, 0, &p), TNT_OK);
  assert_plan_empty(&p);
  tnt__fusion_plan_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threshold_zero_one_bucket_per_tensor),
      cmocka_unit_test(test_huge_threshold_one_bucket_per_dtype),
      cmocka_unit_test(test_mixed_dtypes_interleaved),
      cmocka_unit_test(test_threshold_boundary),
      cmocka_unit_test(test_random_plans),
      cmocka_unit_test(test_invalid_arguments),
      cmocka_unit_test(test_empty_list),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
