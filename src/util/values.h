/*
 * Elements of every dtype: the float16 and bfloat16 conversions and element
 * access as a double. Float to float16 or bfloat16 rounds to nearest even
 * (a NaN stays a NaN, made quiet); the way back is exact. The conversions
 * work on the bit patterns only, so they do not depend on the
 * floating-point environment (rounding mode, flush-to-zero).
 *
 * Every function is static inline: the reduction kernels call the
 * conversions in their inner loops, and tnt-bench, which links the shared
 * libtnt (where the tnt__ functions are hidden), uses them too.
 */
#ifndef TNT_UTIL_VALUES_H
#define TNT_UTIL_VALUES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tnt/tnt.h"

/* ------------------------------------------------------------ bit casts */

static inline uint32_t tnt__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float tnt__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint64_t tnt__f64_bits(double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline double tnt__f64_from_bits(uint64_t u) {
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---------------------------------------------------------- conversions */

static inline float tnt__half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    /* Infinity, or NaN with its payload (a nonzero mantissa stays nonzero). */
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    /* Subnormal half: shift the leading one up into the implicit bit;
     * every such value is a normal float. */
    uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      e--;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return tnt__f32_from_bits(bits);
}

static inline uint16_t tnt__float_to_half(float f) {
  uint32_t x = tnt__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) {
    /* NaN: quiet it and keep the top of the payload, so it stays a NaN. */
    return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x1ffu));
  }
  if (x >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536, or inf */
  if (x < 0x38800000u) {
    /* Below the smallest normal half (2^-14): the result is subnormal or
     * zero, in units of 2^-24. Values below 2^-25 round to zero. */
    uint32_t e = x >> 23;
    if (e < 102) return sign;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) r++;
    /* r == 0x400 is the smallest normal, which the same encoding gives. */
    return (uint16_t)(sign | r);
  }
  /* Normal range: rebias the exponent and round the 13 dropped bits to
   * nearest even; a carry out of the mantissa correctly bumps the exponent,
   * up to infinity for values at or above 65520. */
  uint32_t odd = (x >> 13) & 1u;
  x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
  return (uint16_t)(sign | (x >> 13));
}

static inline float tnt__bfloat16_to_float(uint16_t b) {
  return tnt__f32_from_bits((uint32_t)b << 16);
}

static inline uint16_t tnt__float_to_bfloat16(float f) {
  uint32_t x = tnt__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    /* NaN: rounding could carry a small payload into infinity, so quiet it
     * and truncate instead. */
    return (uint16_t)((x >> 16) | 0x0040u);
  }
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* ------------------------------------------------------------ elements */

/* Stores `v` as element `i` of `buf`, converted to `dtype` as C converts
 * (float16 and bfloat16 round the float that `v` converts to). For the
 * integer dtypes, `v` must lie in int64_t's range: it is truncated to an
 * int64_t, which the narrower types then wrap (-1 stored as uint8 is 255). */
static inline void tnt__store_value(tnt_dtype_t dtype, void *buf, size_t i, double v) {
  switch (dtype) {
    case TNT_FLOAT32:
      ((float *)buf)[i] = (float)v;
      break;
    case TNT_FLOAT64:
      ((double *)buf)[i] = v;
      break;
    case TNT_FLOAT16:
      ((uint16_t *)buf)[i] = tnt__float_to_half((float)v);
      break;
    case TNT_BFLOAT16:
      ((uint16_t *)buf)[i] = tnt__float_to_bfloat16((float)v);
      break;
    case TNT_INT32:
      ((int32_t *)buf)[i] = (int32_t)(int64_t)v;
      break;
    case TNT_INT64:
      ((int64_t *)buf)[i] = (int64_t)v;
      break;
    case TNT_INT8:
      ((int8_t *)buf)[i] = (int8_t)(int64_t)v;
      break;
    case TNT_INT16:
      ((int16_t *)buf)[i] = (int16_t)(int64_t)v;
      break;
    case TNT_UINT8:
      ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
      break;
    default:
      break;
  }
}

/* Element `i` of `buf` as a double (exact, but for int64 beyond 2^53); 0
 * for an invalid dtype. */
static inline double tnt__load_value(tnt_dtype_t dtype, const void *buf, size_t i) {
  switch (dtype) {
    case TNT_FLOAT32:
      return ((const float *)buf)[i];
    case TNT_FLOAT64:
      return ((const double *)buf)[i];
    case TNT_FLOAT16:
      return tnt__half_to_float(((const uint16_t *)buf)[i]);
    case TNT_BFLOAT16:
      return tnt__bfloat16_to_float(((const uint16_t *)buf)[i]);
    case TNT_INT32:
      return ((const int32_t *)buf)[i];
    case TNT_INT64:
      return (double)((const int64_t *)buf)[i];
    case TNT_INT8:
      return ((const int8_t *)buf)[i];
    case TNT_INT16:
      return ((const int16_t *)buf)[i];
    case TNT_UINT8:
      return ((const uint8_t *)buf)[i];
    default:
      return 0.0;
  }
}

#endif
