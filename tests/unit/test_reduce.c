/*
 * Tests of the reduction kernels and half-precision conversions
 * (src/util/reduce.c, src/util/values.h).
 *
 * The kernels are checked bit for bit against a straightforward scalar
 * reference that combines inputs left to right in the documented
 * accumulator type (float for the half types). The conversions are checked
 * exhaustively: every float16 and bfloat16 value, and the rounding
 * boundaries between every pair of neighbouring finite values, which covers
 * ties to even, subnormals and overflow to infinity.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/reduce.h"
#include "util/values.h"
#include "tnt_test_data.h"

/* ------------------------------------------------------------- helpers */

static uint64_t d2u(double f) {
  uint64_t u;
  memcpy(&u, &f, 8);
  return u;
}

static double u2d(uint64_t u) {
  double f;
  memcpy(&f, &u, 8);
  return f;
}

/* A small deterministic generator, so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33);
}

/* Random values that are exact in every dtype's range but not integers,
 * so float sums round and the order of combination matters. */
static void fill_random(void *buf, size_t count, tnt_dtype_t dtype) {
  for (size_t i = 0; i < count; i++) {
    double v = ((double)(rng() % 200001) - 100000.0) / 997.0;
    /* Integers draw a value of their own, wide enough to exercise the
     * upper word of int64 (every one is exact in a double). */
    if (dtype == TNT_INT32) {
      v = (double)((int32_t)(rng() % 2000001) - 1000000);
    } else if (dtype == TNT_INT64) {
      v = (double)(((int64_t)(rng() % 2000001) - 1000000) * 1000003);
    } else if (dtype == TNT_INT8 || dtype == TNT_UINT8 || dtype == TNT_INT16) {
      /* The narrow integers draw from their whole range, so sums wrap. */
      uint32_t span = dtype == TNT_INT16 ? 65536u : 256u;
      v = (double)(int64_t)(rng() % span) - (dtype == TNT_UINT8 ? 0.0 : (double)(span / 2));
    }
    tnt__store_value(dtype, buf, i, v);
  }
}

static size_t esize(tnt_dtype_t dtype) {
  return tnt_dtype_size(dtype);
}

/* ----------------------------------------------------------- reference */

static float ref_f32(float a, float b, tnt_op_t op) {
  if (op == TNT_MIN) return a < b ? a : b;
  if (op == TNT_MAX) return a > b ? a : b;
  return a + b;
}

static double ref_f64(double a, double b, tnt_op_t op) {
  if (op == TNT_MIN) return a < b ? a : b;
  if (op == TNT_MAX) return a > b ? a : b;
  return a + b;
}

/* `s` wrapped around into the integer dtype's width, as a value. */
static int64_t wrap_int(uint64_t s, tnt_dtype_t dtype) {
  switch (dtype) {
    case TNT_INT8: return (int8_t)(uint8_t)s;
    case TNT_INT16: return (int16_t)(uint16_t)s;
    case TNT_UINT8: return (uint8_t)s;
    case TNT_INT32: return (int32_t)(uint32_t)s;
    default: return (int64_t)s;
  }
}

/* Element i of an integer buffer and its store, exactly: int64 does not
 * go through a double. */
static int64_t load_int(tnt_dtype_t dtype, const void *buf, size_t i) {
  return dtype == TNT_INT64 ? ((const int64_t *)buf)[i] : (int64_t)tnt__load_value(dtype, buf, i);
}

static void store_int(tnt_dtype_t dtype, void *buf, size_t i, int64_t v) {
  if (dtype == TNT_INT64) {
    ((int64_t *)buf)[i] = v;
  } else {
    tnt__store_value(dtype, buf, i, (double)v); /* v is in the dtype's range */
  }
}

static int64_t ref_int(int64_t a, int64_t b, tnt_op_t op, tnt_dtype_t dtype) {
  if (op == TNT_MIN) return a < b ? a : b;
  if (op == TNT_MAX) return a > b ? a : b;
  return wrap_int((uint64_t)a + (uint64_t)b, dtype);
}

/* The documented semantics of tnt__reduce_many, one element at a time, for
 * inputs without NaN and without -0 (those are tested separately). */
static void ref_reduce_many(void *dst, void *const *srcs, int n, size_t count, tnt_dtype_t dtype,
                            tnt_op_t op, int divisor) {
  int avg = op == TNT_AVERAGE && divisor > 1;
  for (size_t i = 0; i < count; i++) {
    switch (dtype) {
      case TNT_FLOAT32: {
        float acc = ((float *)srcs[0])[i];
        for (int k = 1; k < n; k++) acc = ref_f32(acc, ((float *)srcs[k])[i], op);
        if (avg) acc /= (float)divisor;
        ((float *)dst)[i] = acc;
        break;
      }
      case TNT_FLOAT64: {
        double acc = ((double *)srcs[0])[i];
        for (int k = 1; k < n; k++) acc = ref_f64(acc, ((double *)srcs[k])[i], op);
        if (avg) acc /= (double)divisor;
        ((double *)dst)[i] = acc;
        break;
      }
      case TNT_FLOAT16:
      case TNT_BFLOAT16: {
        /* Converted with libtnt's conversions, which the tests of
         * conversions below check against a definition of their own. */
        float acc = (float)tnt__load_value(dtype, srcs[0], i);
        for (int k = 1; k < n; k++) {
          acc = ref_f32(acc, (float)tnt__load_value(dtype, srcs[k], i), op);
        }
        if (avg) acc /= (float)divisor;
        tnt__store_value(dtype, dst, i, acc);
        break;
      }
      case TNT_INT32:
      case TNT_INT64:
      case TNT_INT8:
      case TNT_INT16:
      case TNT_UINT8: {
        int64_t acc = load_int(dtype, srcs[0], i);
        for (int k = 1; k < n; k++) acc = ref_int(acc, load_int(dtype, srcs[k], i), op, dtype);
        if (avg) acc /= divisor;
        store_int(dtype, dst, i, acc);
        break;
      }
      default:
        break;
    }
  }
}

/* ------------------------------------------------------- conversions */

/* float value of half h, computed independently of the library. */
static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static void test_half_to_float_exhaustive(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tnt__half_to_float((uint16_t)h);
    int e = (h >> 10) & 0x1f;
    if (e == 0x1f && (h & 0x3ff)) {
      assert_true(isnan(f));
      /* NaN survives the round trip. */
      uint16_t back = tnt__float_to_half(f);
      assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
    } else if (e == 0x1f) {
      assert_true(isinf(f));
      assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
      assert_int_equal(tnt__float_to_half(f), h);
    } else {
      assert_true((double)f == half_value((uint16_t)h));
      assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
      /* Every finite half converts back to itself, -0 and subnormals included. */
      assert_int_equal(tnt__float_to_half(f), h);
    }
  }
}

/* For every pair of neighbouring non-negative finite halves a < b (and the
 * step from the largest finite value to infinity), values just below the
 * midpoint round down, just above round up, and the midpoint itself goes to
 * the even one. The same for negative values, by symmetry. */
static void test_half_rounding_boundaries(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x7c00; h++) {
    double a = half_value((uint16_t)h);
    double b = h + 1 == 0x7c00 ? 65536.0 : half_value((uint16_t)(h + 1));
    float mid = (float)((a + b) / 2); /* exact in float */
    assert_true((double)mid == (a + b) / 2);
    uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    for (int neg = 0; neg < 2; neg++) {
      uint16_t s = neg ? 0x8000 : 0;
      float m = neg ? -mid : mid;
      float lo = nextafterf(m, 0.0f), hi = nextafterf(m, neg ? -INFINITY : INFINITY);
      assert_int_equal(tnt__float_to_half(m), s | even);
      assert_int_equal(tnt__float_to_half(lo), s | h);
      assert_int_equal(tnt__float_to_half(hi), s | (h + 1));
    }
  }
}

static void test_half_special_cases(void **state) {
  (void)state;
  assert_int_equal(tnt__float_to_half(0.0f), 0x0000);
  assert_int_equal(tnt__float_to_half(-0.0f), 0x8000);
  assert_int_equal(tnt__float_to_half(1.0f), 0x3c00);
  /* Ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
  assert_int_equal(tnt__float_to_half(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(tnt__float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal(tnt__float_to_half(65504.0f), 0x7bff);
  assert_int_equal(tnt__float_to_half(65519.996f), 0x7bff);
  assert_int_equal(tnt__float_to_half(65520.0f), 0x7c00); /* overflow rounds to inf */
  assert_int_equal(tnt__float_to_half(1e10f), 0x7c00);
  assert_int_equal(tnt__float_to_half(-1e10f), 0xfc00);
  assert_int_equal(tnt__float_to_half(INFINITY), 0x7c00);
  assert_int_equal(tnt__float_to_half(-INFINITY), 0xfc00);
  /* Subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 3 * 2^-25 ties to 2. */
  assert_int_equal(tnt__float_to_half(0x1p-24f), 0x0001);
  assert_int_equal(tnt__float_to_half(0x1p-25f), 0x0000);
  assert_int_equal(tnt__float_to_half(-0x1p-25f), 0x8000);
  assert_int_equal(tnt__float_to_half(0x1.000002p-25f), 0x0001);
  assert_int_equal(tnt__float_to_half(3 * 0x1p-25f), 0x0002);
  assert_int_equal(tnt__float_to_half(0x1p-14f), 0x0400);
  assert_int_equal(tnt__float_to_half(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
  assert_int_equal(tnt__float_to_half(0x1.ffcp-15f), 0x0400); /* tie rounds up to normal */
  assert_int_equal(tnt__float_to_half(1e-30f), 0x0000);
  assert_int_equal(tnt__float_to_half(tnt__f32_from_bits(0x00000001u)), 0x0000); /* float subnormal */
  assert_true(tnt__half_to_float(0x0001) == 0x1p-24f);
  assert_true(tnt__half_to_float(0x03ff) == 0x1.ff8p-15f);
  /* NaN stays NaN, even when only low payload bits are set (plain
   * truncation would give infinity), and keeps its sign. */
  uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffc00000u, 0xff800001u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t h = tnt__float_to_half(tnt__f32_from_bits(nans[i]));
    assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
    assert_int_equal(h >> 15, nans[i] >> 31);
  }
  assert_true(isnan(tnt__half_to_float(0x7e00)));
  assert_true(isnan(tnt__half_to_float(0x7c01)));
  assert_true(isnan(tnt__half_to_float(0xfc01)));
}

static void test_bfloat16_exhaustive(void **state) {
  (void)state;
  for (uint32_t b = 0; b < 65536; b++) {
    float f = tnt__bfloat16_to_float((uint16_t)b);
    assert_int_equal(tnt__f32_bits(f), b << 16);
    uint16_t back = tnt__float_to_bfloat16(f);
    if (isnan(f)) {
      assert_true((back & 0x7f80) == 0x7f80 && (back & 0x7f) != 0);
    } else {
      assert_int_equal(back, b);
    }
  }
  /* Rounding boundaries between neighbouring finite values, as for halves. */
  for (uint32_t b = 0; b < 0x7f80; b++) {
    double a = (double)tnt__f32_from_bits(b << 16);
    double c = (double)tnt__f32_from_bits((b + 1) << 16); /* inf for the last one */
    float mid = b + 1 == 0x7f80 ? tnt__f32_from_bits(0x7f7f8000u) : (float)((a + c) / 2);
    uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
    for (int neg = 0; neg < 2; neg++) {
      uint16_t s = neg ? 0x8000 : 0;
      float m = neg ? -mid : mid;
      float lo = nextafterf(m, 0.0f), hi = nextafterf(m, neg ? -INFINITY : INFINITY);
      assert_int_equal(tnt__float_to_bfloat16(m), s | even);
      assert_int_equal(tnt__float_to_bfloat16(lo), s | b);
      if (!isinf(hi)) assert_int_equal(tnt__float_to_bfloat16(hi), s | (b + 1));
    }
  }
}

static void test_bfloat16_special_cases(void **state) {
  (void)state;
  assert_int_equal(tnt__float_to_bfloat16(-0.0f), 0x8000);
  assert_int_equal(tnt__float_to_bfloat16(1.0f), 0x3f80);
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x3f808000u)), 0x3f80); /* tie to even */
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x3f818000u)), 0x3f82); /* tie to even */
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x3f808001u)), 0x3f81);
  /* FLT_MAX rounds to infinity. */
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x7f7fffffu)), 0x7f80);
  assert_int_equal(tnt__float_to_bfloat16(INFINITY), 0x7f80);
  assert_int_equal(tnt__float_to_bfloat16(-INFINITY), 0xff80);
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x00000001u)), 0x0000); /* subnormal */
  /* A tie between subnormals goes to the even one. */
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x00018000u)), 0x0002);
  assert_int_equal(tnt__float_to_bfloat16(tnt__f32_from_bits(0x00008001u)), 0x0001);
  /* NaNs whose rounding would carry into infinity or the sign bit. */
  uint32_t nans[] = {0x7fc00000u, 0x7f807fffu, 0x7f800001u, 0x7fffffffu, 0xff807fffu};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t b = tnt__float_to_bfloat16(tnt__f32_from_bits(nans[i]));
    assert_true((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0);
    assert_int_equal(b >> 15, nans[i] >> 31);
  }
}

/* ------------------------------------------------------------- kernels */

#define MAX_N 8
static const size_t kCounts[] = {1, 2, 7, 31, 1023, 1024, 1025, 2500};

static void test_reduce_many_all(void **state) {
  (void)state;
  size_t maxc = 2500;
  void *srcs[MAX_N];
  for (int k = 0; k < MAX_N; k++) srcs[k] = malloc(maxc * 8);
  void *out = malloc(maxc * 8 + 8), *ref = malloc(maxc * 8);
  for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
    for (int op = 0; op < TNT_OP_COUNT; op++) {
      for (int n = 1; n <= MAX_N; n++) {
        for (size_t ci = 0; ci < sizeof kCounts / sizeof kCounts[0]; ci++) {
          size_t count = kCounts[ci];
          for (int k = 0; k < n; k++) fill_random(srcs[k], count, (tnt_dtype_t)dt);
          int divisor = op == TNT_AVERAGE ? n + 1 : 1;
          ref_reduce_many(ref, srcs, n, count, (tnt_dtype_t)dt, (tnt_op_t)op, divisor);
          memset(out, 0xa5, maxc * 8 + 8);
          tnt__reduce_many(out, (const void *const *)srcs, n, count, (tnt_dtype_t)dt, (tnt_op_t)op,
                           divisor);
          if (memcmp(out, ref, count * esize((tnt_dtype_t)dt)) != 0) {
            fail_msg("reduce_many %s %s n=%d count=%zu differs from the reference",
                     tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), n, count);
          }
          /* Nothing past the end is written. */
          assert_int_equal(((uint8_t *)out)[count * esize((tnt_dtype_t)dt)], 0xa5);
        }
      }
    }
  }
  for (int k = 0; k < MAX_N; k++) free(srcs[k]);
  free(out);
  free(ref);
}

/* tnt__reduce is dst op= src, with AVERAGE adding. */
static void test_reduce_pairwise(void **state) {
  (void)state;
  size_t count = 1500;
  void *a = malloc(count * 8), *b = malloc(count * 8), *d = malloc(count * 8);
  void *ref = malloc(count * 8);
  for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
    for (int op = 0; op < TNT_OP_COUNT; op++) {
      size_t es = esize((tnt_dtype_t)dt);
      fill_random(a, count, (tnt_dtype_t)dt);
      fill_random(b, count, (tnt_dtype_t)dt);
      void *pair[2] = {a, b};
      ref_reduce_many(ref, pair, 2, count, (tnt_dtype_t)dt, op == TNT_AVERAGE ? TNT_SUM : op, 1);
      memcpy(d, a, count * es);
      tnt__reduce(d, b, count, (tnt_dtype_t)dt, (tnt_op_t)op);
      if (memcmp(d, ref, count * es) != 0) {
        fail_msg("reduce %s %s differs", tnt_dtype_name((tnt_dtype_t)dt),
                 tnt_op_name((tnt_op_t)op));
      }
      /* dst == src: the value combined with itself. */
      memcpy(d, a, count * es);
      void *self[2] = {a, a};
      ref_reduce_many(ref, self, 2, count, (tnt_dtype_t)dt, op == TNT_AVERAGE ? TNT_SUM : op, 1);
      tnt__reduce(d, d, count, (tnt_dtype_t)dt, (tnt_op_t)op);
      assert_memory_equal(d, ref, count * es);
    }
  }
  free(a);
  free(b);
  free(d);
  free(ref);
}

/* dst may be any of the inputs (even several of them): the result is the
 * same as with a separate dst. */
static void test_reduce_many_aliasing(void **state) {
  (void)state;
  size_t count = 2100;
  void *orig[MAX_N], *work[MAX_N];
  void *ref = malloc(count * 8);
  for (int k = 0; k < MAX_N; k++) {
    orig[k] = malloc(count * 8);
    work[k] = malloc(count * 8);
  }
  for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
    size_t es = esize((tnt_dtype_t)dt);
    for (int op = 0; op < TNT_OP_COUNT; op++) {
      for (int n = 1; n <= MAX_N; n++) {
        for (int k = 0; k < n; k++) fill_random(orig[k], count, (tnt_dtype_t)dt);
        int divisor = op == TNT_AVERAGE ? 3 : 1;
        ref_reduce_many(ref, orig, n, count, (tnt_dtype_t)dt, (tnt_op_t)op, divisor);
        for (int target = 0; target < n; target++) {
          for (int k = 0; k < n; k++) memcpy(work[k], orig[k], count * es);
          tnt__reduce_many(work[target], (const void *const *)work, n, count, (tnt_dtype_t)dt,
                           (tnt_op_t)op, divisor);
          if (memcmp(work[target], ref, count * es) != 0) {
            fail_msg("reduce_many %s %s n=%d with dst == srcs[%d] differs",
                     tnt_dtype_name((tnt_dtype_t)dt), tnt_op_name((tnt_op_t)op), n, target);
          }
        }
        /* The same buffer listed twice, once as srcs[0], also as dst. */
        if (n >= 3) {
          void *twice[MAX_N];
          for (int k = 0; k < n; k++) twice[k] = orig[k];
          twice[n - 1] = orig[0];
          ref_reduce_many(ref, twice, n, count, (tnt_dtype_t)dt, (tnt_op_t)op, divisor);
          memcpy(work[0], orig[0], count * es);
          for (int k = 1; k < n - 1; k++) twice[k] = orig[k];
          twice[0] = twice[n - 1] = work[0];
          tnt__reduce_many(work[0], (const void *const *)twice, n, count, (tnt_dtype_t)dt,
                           (tnt_op_t)op, divisor);
          assert_memory_equal(work[0], ref, count * es);
        }
      }
    }
  }
  for (int k = 0; k < MAX_N; k++) {
    free(orig[k]);
    free(work[k]);
  }
  free(ref);
}

static void test_determinism(void **state) {
  (void)state;
  size_t count = 4099;
  void *srcs[5], *out1 = malloc(count * 8), *out2 = malloc(count * 8);
  for (int k = 0; k < 5; k++) srcs[k] = malloc(count * 8);
  for (int dt = 0; dt < TNT_DTYPE_COUNT; dt++) {
    for (int k = 0; k < 5; k++) fill_random(srcs[k], count, (tnt_dtype_t)dt);
    for (int op = 0; op < TNT_OP_COUNT; op++) {
      tnt__reduce_many(out1, (const void *const *)srcs, 5, count, (tnt_dtype_t)dt, (tnt_op_t)op, 5);
      tnt__reduce_many(out2, (const void *const *)srcs, 5, count, (tnt_dtype_t)dt, (tnt_op_t)op, 5);
      assert_memory_equal(out1, out2, count * esize((tnt_dtype_t)dt));
      /* Offsets in the buffers (alignment) do not change the bits either. */
      const void *shifted[5];
      for (int k = 0; k < 5; k++) shifted[k] = (uint8_t *)srcs[k] + esize((tnt_dtype_t)dt);
      tnt__reduce_many(out2, shifted, 5, count - 1, (tnt_dtype_t)dt, (tnt_op_t)op, 5);
      assert_memory_equal((uint8_t *)out1 + esize((tnt_dtype_t)dt), out2,
                          (count - 1) * esize((tnt_dtype_t)dt));
    }
  }
  for (int k = 0; k < 5; k++) free(srcs[k]);
  free(out1);
  free(out2);
}

/* MIN and MAX with NaN and signed zeros: commutative bit for bit, NaN wins. */
static void test_min_max_nan_and_zero(void **state) {
  (void)state;
  for (int op = TNT_MIN; op <= TNT_MAX; op++) {
    /* float32 */
    float fv[] = {1.0f, -2.0f, NAN, -NAN, tnt__f32_from_bits(0x7f800001u), 0.0f, -0.0f, INFINITY};
    size_t nf = sizeof fv / sizeof fv[0];
    for (size_t i = 0; i < nf; i++) {
      for (size_t j = 0; j < nf; j++) {
        float ab, ba;
        const void *s1[2] = {&fv[i], &fv[j]}, *s2[2] = {&fv[j], &fv[i]};
        tnt__reduce_many(&ab, s1, 2, 1, TNT_FLOAT32, (tnt_op_t)op, 1);
        tnt__reduce_many(&ba, s2, 2, 1, TNT_FLOAT32, (tnt_op_t)op, 1);
        assert_int_equal(tnt__f32_bits(ab), tnt__f32_bits(ba));
        if (isnan(fv[i]) || isnan(fv[j])) assert_true(isnan(ab));
      }
    }
    /* float64 */
    double dv[] = {1.0, NAN, u2d(0xfff0000000000001ull), 0.0, -0.0, -INFINITY};
    size_t nd = sizeof dv / sizeof dv[0];
    for (size_t i = 0; i < nd; i++) {
      for (size_t j = 0; j < nd; j++) {
        double ab, ba;
        const void *s1[2] = {&dv[i], &dv[j]}, *s2[2] = {&dv[j], &dv[i]};
        tnt__reduce_many(&ab, s1, 2, 1, TNT_FLOAT64, (tnt_op_t)op, 1);
        tnt__reduce_many(&ba, s2, 2, 1, TNT_FLOAT64, (tnt_op_t)op, 1);
        assert_int_equal(d2u(ab), d2u(ba));
        if (isnan(dv[i]) || isnan(dv[j])) assert_true(isnan(ab));
      }
    }
    /* the half types */
    for (int dt = TNT_FLOAT16; dt <= TNT_BFLOAT16; dt++) {
      uint16_t hv[] = {0x3c00, 0x7e00, 0x7c01, 0xfe00, 0x0000, 0x8000, 0x7c00, 0x0001};
      if (dt == TNT_BFLOAT16) {
        uint16_t bv[] = {0x3f80, 0x7fc0, 0x7f81, 0xffc0, 0x0000, 0x8000, 0x7f80, 0x0001};
        memcpy(hv, bv, sizeof hv);
      }
      size_t nh = sizeof hv / sizeof hv[0];
      for (size_t i = 0; i < nh; i++) {
        for (size_t j = 0; j < nh; j++) {
          uint16_t ab, ba;
          const void *s1[2] = {&hv[i], &hv[j]}, *s2[2] = {&hv[j], &hv[i]};
          tnt__reduce_many(&ab, s1, 2, 1, (tnt_dtype_t)dt, (tnt_op_t)op, 1);
          tnt__reduce_many(&ba, s2, 2, 1, (tnt_dtype_t)dt, (tnt_op_t)op, 1);
          assert_int_equal(ab, ba);
          float fi = dt == TNT_FLOAT16 ? tnt__half_to_float(hv[i]) : tnt__bfloat16_to_float(hv[i]);
          float fj = dt == TNT_FLOAT16 ? tnt__half_to_float(hv[j]) : tnt__bfloat16_to_float(hv[j]);
          float fr = dt == TNT_FLOAT16 ? tnt__half_to_float(ab) : tnt__bfloat16_to_float(ab);
          if (isnan(fi) || isnan(fj)) assert_true(isnan(fr));
        }
      }
    }
  }
  /* Signed zeros: MIN prefers -0, MAX prefers +0. */
  float pz = 0.0f, nz = -0.0f, r;
  const void *zz[2] = {&pz, &nz};
  tnt__reduce_many(&r, zz, 2, 1, TNT_FLOAT32, TNT_MIN, 1);
  assert_int_equal(tnt__f32_bits(r), 0x80000000u);
  tnt__reduce_many(&r, zz, 2, 1, TNT_FLOAT32, TNT_MAX, 1);
  assert_int_equal(tnt__f32_bits(r), 0x00000000u);
  /* Whatever the position of the NaN among many inputs, the bits agree. */
  float many[6] = {3, 1, 4, 1, 5, 9}, res[6];
  for (int pos = 0; pos < 6; pos++) {
    float vals[6];
    memcpy(vals, many, sizeof vals);
    vals[pos] = tnt__f32_from_bits(0xffc00123u);
    const void *ps[6];
    for (int k = 0; k < 6; k++) ps[k] = &vals[k];
    tnt__reduce_many(&res[pos], ps, 6, 1, TNT_FLOAT32, TNT_MAX, 1);
    assert_true(isnan(res[pos]));
    assert_int_equal(tnt__f32_bits(res[pos]), tnt__f32_bits(res[0]));
  }
}

static void test_sum_special_values(void **state) {
  (void)state;
  /* NaN stays NaN through half sums; overflow of a half sum gives inf. */
  uint16_t a[3] = {0x7e00, 0x7bff, 0x3c00}, b[3] = {0x3c00, 0x7bff, 0xbc00}, d[3];
  const void *s[2] = {a, b};
  tnt__reduce_many(d, s, 2, 3, TNT_FLOAT16, TNT_SUM, 1);
  assert_true((d[0] & 0x7c00) == 0x7c00 && (d[0] & 0x3ff));
  assert_int_equal(d[1], 0x7c00);
  assert_int_equal(d[2], 0x0000);
  /* Integer sums wrap around. */
  int32_t i1 = INT32_MAX, i2 = 1, ir;
  const void *si[2] = {&i1, &i2};
  tnt__reduce_many(&ir, si, 2, 1, TNT_INT32, TNT_SUM, 1);
  assert_int_equal(ir, INT32_MIN);
  int64_t l1 = INT64_MAX, l2 = 2, lr;
  const void *sl[2] = {&l1, &l2};
  tnt__reduce_many(&lr, sl, 2, 1, TNT_INT64, TNT_SUM, 1);
  assert_true(lr == INT64_MIN + 1);
  /* The narrow ones wrap in their own width, as NumPy's sums of them do
   * (int16: 32767 + 2 == -32767; uint8: 255 + 2 == 1), and take min and
   * max by their own (signed or unsigned) order. */
  int16_t h1s = INT16_MAX, h2s = 2, hrs;
  const void *sh16[2] = {&h1s, &h2s};
  tnt__reduce_many(&hrs, sh16, 2, 1, TNT_INT16, TNT_SUM, 1);
  assert_int_equal(hrs, -32767);
  int8_t c1 = -128, c2 = -1, crs;
  const void *s8[2] = {&c1, &c2};
  tnt__reduce_many(&crs, s8, 2, 1, TNT_INT8, TNT_SUM, 1);
  assert_int_equal(crs, 127);
  tnt__reduce_many(&crs, s8, 2, 1, TNT_INT8, TNT_MAX, 1);
  assert_int_equal(crs, -1);
  uint8_t u1 = 255, u2 = 2, urs;
  const void *su[2] = {&u1, &u2};
  tnt__reduce_many(&urs, su, 2, 1, TNT_UINT8, TNT_SUM, 1);
  assert_int_equal(urs, 1);
  tnt__reduce_many(&urs, su, 2, 1, TNT_UINT8, TNT_MIN, 1);
  assert_int_equal(urs, 2);
  /* A divisor beyond the type's range divides, it is not wrapped into it:
   * 100 / 300 == 0 in int8, not 100 / 44. */
  int8_t big = 100;
  tnt__reduce_finish(&big, 1, TNT_INT8, TNT_AVERAGE, 300);
  assert_int_equal(big, 0);
  /* Half sums accumulate in float and round once: 2048 + 1 + 1 in half
   * rounds 2049 to 2048 if done pairwise, but 2050 is exact. */
  uint16_t h2048 = tnt__float_to_half(2048.0f), h1 = tnt__float_to_half(1.0f), hr;
  const void *sh[3] = {&h2048, &h1, &h1};
  tnt__reduce_many(&hr, sh, 3, 1, TNT_FLOAT16, TNT_SUM, 1);
  assert_true(tnt__half_to_float(hr) == 2050.0f);
}

static void test_average(void **state) {
  (void)state;
  /* Integers: integer division of the sum, rounding toward zero. */
  int32_t a[4] = {7, -7, 100, 5}, b[4] = {8, 0, 1, -6}, c[4] = {-3, 0, 2, 0}, r[4];
  const void *s[3] = {a, b, c};
  tnt__reduce_many(r, s, 3, 4, TNT_INT32, TNT_AVERAGE, 3);
  assert_int_equal(r[0], 4);  /* 12 / 3 */
  assert_int_equal(r[1], -2); /* -7 / 3 */
  assert_int_equal(r[2], 34); /* 103 / 3 */
  assert_int_equal(r[3], 0);  /* -1 / 3 */
  int64_t la[2] = {-9, 1000000000000ll}, lb[2] = {0, 1}, lr[2];
  const void *sl[2] = {la, lb};
  tnt__reduce_many(lr, sl, 2, 2, TNT_INT64, TNT_AVERAGE, 2);
  assert_true(lr[0] == -4 && lr[1] == 500000000000ll);

  /* reduce + finish, the two-step form. */
  int32_t acc[4];
  memcpy(acc, a, sizeof acc);
  tnt__reduce(acc, b, 4, TNT_INT32, TNT_AVERAGE);
  tnt__reduce(acc, c, 4, TNT_INT32, TNT_AVERAGE);
  tnt__reduce_finish(acc, 4, TNT_INT32, TNT_AVERAGE, 3);
  assert_memory_equal(acc, r, sizeof acc);
  int64_t lacc[2] = {-9, 1000000000000ll};
  tnt__reduce(lacc, lb, 2, TNT_INT64, TNT_AVERAGE);
  tnt__reduce_finish(lacc, 2, TNT_INT64, TNT_AVERAGE, 2);
  assert_memory_equal(lacc, lr, sizeof lacc);

  /* Floats divide in their own type. */
  float fa[3] = {1, 2, 3}, fb[3] = {2, 2, 2}, fr[3];
  const void *sf[2] = {fa, fb};
  tnt__reduce_many(fr, sf, 2, 3, TNT_FLOAT32, TNT_AVERAGE, 3);
  assert_true(fr[0] == 1.0f && fr[1] == 4.0f / 3.0f && fr[2] == 5.0f / 3.0f);
  float facc[3] = {1, 2, 3};
  tnt__reduce(facc, fb, 3, TNT_FLOAT32, TNT_AVERAGE);
  assert_true(facc[0] == 3.0f && facc[1] == 4.0f && facc[2] == 5.0f);
  tnt__reduce_finish(facc, 3, TNT_FLOAT32, TNT_AVERAGE, 3);
  assert_memory_equal(facc, fr, sizeof fr);
  double da[2] = {1, 10}, dr[2];
  const void *sd[1] = {da};
  tnt__reduce_many(dr, sd, 1, 2, TNT_FLOAT64, TNT_AVERAGE, 4);
  assert_true(dr[0] == 0.25 && dr[1] == 2.5);
  tnt__reduce_finish(da, 2, TNT_FLOAT64, TNT_AVERAGE, 4);
  assert_memory_equal(da, dr, sizeof dr);

  /* Half types: the float sum is divided, then rounded once. */
  uint16_t h[3], hr[1];
  h[0] = tnt__float_to_half(1.0f);
  h[1] = tnt__float_to_half(1.0f);
  h[2] = tnt__float_to_half(2.0f);
  const void *sh[3] = {&h[0], &h[1], &h[2]};
  tnt__reduce_many(hr, sh, 3, 1, TNT_FLOAT16, TNT_AVERAGE, 3);
  assert_int_equal(hr[0], tnt__float_to_half(4.0f / 3.0f));
  uint16_t hb = tnt__float_to_bfloat16(10.0f), hbr;
  tnt__reduce_finish(&hb, 1, TNT_BFLOAT16, TNT_AVERAGE, 4);
  assert_int_equal(hb, tnt__float_to_bfloat16(2.5f));
  const void *sb[1] = {&hb};
  tnt__reduce_many(&hbr, sb, 1, 1, TNT_BFLOAT16, TNT_AVERAGE, 1);
  assert_int_equal(hbr, hb);
  uint16_t hh = tnt__float_to_half(3.0f);
  tnt__reduce_finish(&hh, 1, TNT_FLOAT16, TNT_AVERAGE, 2);
  assert_int_equal(hh, tnt__float_to_half(1.5f));

  /* Other ops ignore the divisor; a divisor below 2 does not divide. */
  int32_t x[1] = {9}, y[1] = {4}, z[1];
  const void *sx[2] = {x, y};
  tnt__reduce_many(z, sx, 2, 1, TNT_INT32, TNT_MAX, 7);
  assert_int_equal(z[0], 9);
  tnt__reduce_finish(x, 1, TNT_INT32, TNT_SUM, 3);
  assert_int_equal(x[0], 9);
  tnt__reduce_finish(x, 1, TNT_INT32, TNT_AVERAGE, 0);
  assert_int_equal(x[0], 9);
  tnt__reduce_many(z, sx, 2, 1, TNT_INT32, TNT_AVERAGE, 1);
  assert_int_equal(z[0], 13);
}

static void test_invalid_arguments_are_noops(void **state) {
  (void)state;
  int32_t a[2] = {1, 2}, d[2] = {5, 6};
  const void *s[1] = {a};
  tnt__reduce_many(d, s, 0, 2, TNT_INT32, TNT_SUM, 1);
  tnt__reduce_many(d, s, 1, 2, TNT_DTYPE_COUNT, TNT_SUM, 1);
  tnt__reduce_many(d, s, 1, 2, TNT_INT32, TNT_OP_COUNT, 1);
  tnt__reduce_many(d, s, 1, 2, (tnt_dtype_t)-1, TNT_SUM, 1);
  tnt__reduce(d, a, 2, (tnt_dtype_t)99, TNT_SUM);
  tnt__reduce(d, a, 2, TNT_INT32, (tnt_op_t)-3);
  tnt__reduce_many(d, s, 1, 0, TNT_INT32, TNT_SUM, 1);
  tnt__reduce_finish(d, 2, (tnt_dtype_t)42, TNT_AVERAGE, 2);
  assert_int_equal(d[0], 5);
  assert_int_equal(d[1], 6);
  assert_true(tnt__dtype_valid(TNT_FLOAT32) && tnt__dtype_valid(TNT_INT64));
  assert_false(tnt__dtype_valid(TNT_DTYPE_COUNT) || tnt__dtype_valid((tnt_dtype_t)-1));
  assert_true(tnt__op_valid(TNT_SUM) && tnt__op_valid(TNT_MAX));
  assert_false(tnt__op_valid(TNT_OP_COUNT) || tnt__op_valid((tnt_op_t)-1));
}

/* ------------------------------------------- array conversions (wire) */

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Widening every 16-bit pattern (one array, so the vector path sees every
 * one, signalling NaNs included) gives the scalar conversion's bits. */
static void test_widen_every_value(void **state) {
  (void)state;
  const tnt_dtype_t wires[2] = {TNT_FLOAT16, TNT_BFLOAT16};
  uint16_t *h = malloc(65536 * sizeof *h);
  float *f = malloc(65536 * sizeof *f);
  assert_non_null(h);
  assert_non_null(f);
  for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  for (int w = 0; w < 2; w++) {
    tnt__widen(f, h, 65536, wires[w]);
    for (uint32_t i = 0; i < 65536; i++) {
      float want = wires[w] == TNT_FLOAT16 ? tnt__half_to_float((uint16_t)i)
                                           : tnt__bfloat16_to_float((uint16_t)i);
      if (f2u(f[i]) != f2u(want)) fail_msg("%s widen of 0x%04x", tnt_dtype_name(wires[w]), i);
    }
  }
  free(h);
  free(f);
}

/* Narrowing gives the scalar conversion's bits: special values, every
 * rounding boundary region and random patterns, at lengths that leave a
 * tail for the portable loop. */
static void test_narrow_matches_scalar(void **state) {
  (void)state;
  enum { N = 1 << 18 };
  const tnt_dtype_t wires[2] = {TNT_FLOAT16, TNT_BFLOAT16};
  float *f = malloc(N * sizeof *f);
  uint16_t *h = malloc(N * sizeof *h);
  assert_non_null(f);
  assert_non_null(h);
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                              0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0x00000001u, 0x477fe000u,
                              0x477ff000u, 0x477fefffu, 0x47800000u, 0x38800000u, 0x387fffffu,
                              0x33000000u, 0x33000001u, 0x7f7fffffu, 0x3f800000u, 0xbf7fffffu};
  size_t n = 0;
  for (size_t k = 0; k < sizeof special / sizeof *special; k++) f[n++] = u2f(special[k]);
  while (n < N / 2) f[n++] = u2f(rng());
  /* Around every float16 value: the patterns just below, at and above its
   * tie with the next value. */
  for (uint32_t i = 0; n + 3 <= N && i < 0x7c00; i += 3) {
    uint32_t tie = f2u(tnt__half_to_float((uint16_t)i)) + (1u << 12);
    f[n++] = u2f(tie - 1);
    f[n++] = u2f(tie);
    f[n++] = u2f(tie + 1);
  }
  /* Also with denormals flushed (FTZ and DAZ), as TensorFlow sets them on
   * its threads: the conversions must not change. */
  for (int w = 0; w < 4; w++) {
    const tnt_dtype_t wire = wires[w % 2];
#if defined(__x86_64__)
    const unsigned csr = __builtin_ia32_stmxcsr();
    if (w >= 2) __builtin_ia32_ldmxcsr(csr | 0x8040u);
#endif
    for (size_t len = N - 5; len <= N - 5 + 4; len += 4) {
      tnt__narrow(h, f, len, wire);
      for (size_t i = 0; i < len; i++) {
        uint16_t want =
            wire == TNT_FLOAT16 ? tnt__float_to_half(f[i]) : tnt__float_to_bfloat16(f[i]);
        if (h[i] != want) {
          fail_msg("%s narrow of 0x%08x%s: 0x%04x, want 0x%04x", tnt_dtype_name(wire), f2u(f[i]),
                   w >= 2 ? " (FTZ, DAZ)" : "", h[i], want);
        }
      }
    }
#if defined(__x86_64__)
    __builtin_ia32_ldmxcsr(csr);
#endif
  }
  free(f);
  free(h);
}

/* Every value that the wire type holds survives narrow then widen; NaN
 * stays NaN, infinities and signed zeros keep their sign; values beyond
 * the float16 range become infinities. */
static void test_wire_round_trip(void **state) {
  (void)state;
  float in[12] = {0.0f,           -0.0f,    1.0f,      -2.5f, 65504.0f, 6.103515625e-05f,
                  5.9604645e-08f, INFINITY, -INFINITY, NAN,   65536.0f, -1e30f};
  uint16_t h[12];
  float out[12];
  tnt__narrow(h, in, 12, TNT_FLOAT16);
  tnt__widen(out, h, 12, TNT_FLOAT16);
  for (int i = 0; i < 7; i++) assert_int_equal(f2u(out[i]), f2u(in[i]));
  assert_true(isinf(out[7]) && out[7] > 0);
  assert_true(isinf(out[8]) && out[8] < 0);
  assert_true(isnan(out[9]));
  assert_true(isinf(out[10]) && out[10] > 0);
  assert_true(isinf(out[11]) && out[11] < 0);
  tnt__narrow(h, in, 12, TNT_BFLOAT16);
  tnt__widen(out, h, 12, TNT_BFLOAT16);
  for (int i = 0; i < 4; i++) assert_int_equal(f2u(out[i]), f2u(in[i]));
  assert_true(isnan(out[9]));
  assert_true(fabsf(out[11] + 1e30f) < 1e28f); /* bfloat16 keeps float's range */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half_to_float_exhaustive),
      cmocka_unit_test(test_half_rounding_boundaries),
      cmocka_unit_test(test_half_special_cases),
      cmocka_unit_test(test_bfloat16_exhaustive),
      cmocka_unit_test(test_bfloat16_special_cases),
      cmocka_unit_test(test_widen_every_value),
      cmocka_unit_test(test_narrow_matches_scalar),
      cmocka_unit_test(test_wire_round_trip),
      cmocka_unit_test(test_reduce_many_all),
      cmocka_unit_test(test_reduce_pairwise),
      cmocka_unit_test(test_reduce_many_aliasing),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_min_max_nan_and_zero),
      cmocka_unit_test(test_sum_special_values),
      cmocka_unit_test(test_average),
      cmocka_unit_test(test_invalid_arguments_are_noops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
