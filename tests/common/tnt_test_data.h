/*
 * Test data for every Tarantella dtype, shared by the C tests: elements
 * written and read as doubles, buffers filled from a generator, the exact
 * expected result of a reduction, and the first element where two buffers
 * differ.
 *
 * Elements are written and read with libtnt's own conversions
 * (util/values.h): test_reduce checks them against a definition of its own
 * for every float16 and bfloat16 value and at every rounding boundary.
 *
 * Every function is static inline so that each program uses what it needs
 * without unused-function warnings.
 */
#ifndef TNT_TESTS_COMMON_TNT_TEST_DATA_H
#define TNT_TESTS_COMMON_TNT_TEST_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tnt/tnt.h"
#include "util/values.h"

/* ------------------------------------------------------------ bits */

/* Whether a test that loops over every (dtype, op) pair runs this one. A
 * sanitized build (TNT_TEST_SAMPLED, set by tests/CMakeLists.txt; 5-20x
 * slower) runs each dtype with one operation, the operations taking turns,
 * so that every dtype and every operation still pass through every
 * algorithm, count and layout: what a sanitizer finds there (races,
 * accesses out of bounds) lies in the transfers and the element sizes, not
 * in the pairing. The plain build runs every pair. */
static inline int td_pair_runs(int dtype, int op) {
#if defined(TNT_TEST_SAMPLED) && TNT_TEST_SAMPLED
  return op == dtype % TNT_OP_COUNT;
#else
  (void)dtype;
  (void)op;
  return 1;
#endif
}

/* ------------------------------------------------------------ elements */

/* The size of one element, independently of tnt_dtype_size. */
static inline size_t td_dsize(tnt_dtype_t dt) {
  static const size_t sizes[TNT_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1, 2, 1};
  return sizes[dt];
}

/*
 * Stores the mean of the exact `sum` of `n` contributions as element `i`:
 * one division, rounded once, in the dtype's precision for float32 and
 * float64, in float for the half types (libtnt accumulates them in float),
 * and with C integer division (truncation) for the integers.
 */
static inline void td_store_average(tnt_dtype_t dt, void *buf, size_t i, double sum, int n) {
  switch (dt) {
    case TNT_FLOAT32:
      ((float *)buf)[i] = (float)sum / (float)n;
      break;
    case TNT_FLOAT64:
      ((double *)buf)[i] = sum / (double)n;
      break;
    case TNT_FLOAT16:
      ((uint16_t *)buf)[i] = tnt__float_to_half((float)sum / (float)n);
      break;
    case TNT_BFLOAT16:
      ((uint16_t *)buf)[i] = tnt__float_to_bfloat16((float)sum / (float)n);
      break;
    case TNT_INT32:
      ((int32_t *)buf)[i] = (int32_t)((int64_t)sum / n);
      break;
    case TNT_INT64:
      ((int64_t *)buf)[i] = (int64_t)sum / n;
      break;
    case TNT_INT8:
    case TNT_INT16:
    case TNT_UINT8:
      tnt__store_value(dt, buf, i, (double)((int64_t)sum / n));
      break;
    default:
      break;
  }
}

/* ------------------------------------------------------------ generators */

/* The value that contributor `rank` gives at element `i` of a dtype `dt`
 * buffer; `arg` carries the generator's own parameters (a seed, a salt). */
typedef double (*td_value_fn)(const void *arg, tnt_dtype_t dt, int rank, size_t i);

/* `v`, a value from -half to half, as a generator gives it for `dt`: the
 * unsigned uint8 takes it shifted up by `half`, so that it is never
 * negative. */
static inline double td_centred(tnt_dtype_t dt, double v, double half) {
  return dt == TNT_UINT8 ? v + half : v;
}

/* Fills buf[0..count-1] with the contribution of `rank`. */
static inline void td_fill(tnt_dtype_t dt, void *buf, size_t count, td_value_fn value,
                           const void *arg, int rank) {
  for (size_t i = 0; i < count; i++) tnt__store_value(dt, buf, i, value(arg, dt, rank, i));
}

/*
 * The exact result of reducing `value` over the `n` contributors
 * ranks[0..n-1] (NULL: 0..n-1) with `op`, stored into want[0..count-1].
 * The generators give integers small enough that every combination is
 * exact in a double, so only AVERAGE rounds (see td_store_average).
 */
static inline void td_expected_reduce(tnt_dtype_t dt, tnt_op_t op, void *want, size_t count,
                                      td_value_fn value, const void *arg, const int *ranks, int n) {
  for (size_t i = 0; i < count; i++) {
    double acc = 0.0;
    for (int k = 0; k < n; k++) {
      double v = value(arg, dt, ranks != NULL ? ranks[k] : k, i);
      if (k == 0) {
        acc = v;
      } else if (op == TNT_MIN) {
        acc = v < acc ? v : acc;
      } else if (op == TNT_MAX) {
        acc = v > acc ? v : acc;
      } else {
        acc += v;
      }
    }
    if (op == TNT_AVERAGE) {
      td_store_average(dt, want, i, acc, n);
    } else {
      tnt__store_value(dt, want, i, acc);
    }
  }
}

/* ------------------------------------------------------------ comparison */

/* Compares `count` elements bitwise. Returns how many differ and sets
 * `*first` to the index of the first that does (`count` when none). */
static inline size_t td_count_diff(tnt_dtype_t dt, const void *got, const void *want, size_t count,
                                   size_t *first) {
  size_t es = td_dsize(dt), ndiff = 0;
  *first = count;
  if (count == 0 || memcmp(got, want, count * es) == 0) return 0;
  for (size_t i = 0; i < count; i++) {
    if (memcmp((const uint8_t *)got + i * es, (const uint8_t *)want + i * es, es) != 0) {
      if (*first == count) *first = i;
      ndiff++;
    }
  }
  return ndiff;
}

#endif
