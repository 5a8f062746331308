/*
 * Reduction kernels and array conversions (see reduce.h).
 *
 * Every reduction combines its inputs element by element in a fixed order,
 * left to right, so the same inputs always give the same bits, whatever the
 * buffer addresses or the number of blocks.
 *
 * Work proceeds in blocks of TNT__REDUCE_BLOCK elements. The general path
 * combines a block of every input into a local accumulator array (float for
 * the half types, the element type otherwise) and stores the finished
 * block into dst only at the end. Because dst is written only after every
 * input of the block has been read, dst may alias any input, and the half
 * types are rounded exactly once.
 *
 * float32 and float64 SUM (and AVERAGE) are the hot path of the
 * shared-memory allreduce, so they have dedicated kernels: plain loops over
 * restrict-qualified pointers for 2, 3 and 4 inputs that the compiler
 * vectorizes, plus in-place variants for dst == srcs[0]. More inputs are
 * folded into the block of dst three at a time while it is still in the L1
 * cache. restrict is only used where it is true: when dst aliases an input
 * other than exactly srcs[0], each block is computed into a local buffer and
 * copied out. On x86-64 the same kernels are also compiled for AVX2 and
 * picked at run time.
 *
 * MIN and MAX are commutative and associative bit for bit: a NaN operand
 * gives the canonical quiet NaN, and -0 counts as smaller than +0.
 */
#include "util/reduce.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "util/common.h"
#include "util/values.h"

/* Elements per block: small enough that a block of every stream stays in
 * the L1 cache, large enough that loop overhead does not matter. */
#define TNT__REDUCE_BLOCK 1024

/* ---------------------------------------------------- array conversions */

/* Portable loops; the compiler vectorizes the bfloat16 ones. */
static void narrow_f16(uint16_t *restrict d, const float *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = tnt__float_to_half(s[i]);
}

static void widen_f16(float *restrict d, const uint16_t *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = tnt__half_to_float(s[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define TNT__HAVE_F16C 1
/* F16C converts 8 values per instruction, rounding to nearest even whatever
 * the MXCSR says; NaNs keep the top of their payload and come out quiet,
 * as in tnt__float_to_half. Widening is exact, but the instruction quiets a
 * signalling NaN, which tnt__half_to_float keeps as it is: a block holding
 * one is converted by the portable loop. */
__attribute__((target("avx,f16c"))) static void narrow_f16_f16c(uint16_t *restrict d,
                                                                const float *restrict s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)(void *)(d + i), h);
  }
  narrow_f16(d + i, s + i, n - i);
}

__attribute__((target("avx,f16c"))) static void widen_f16_f16c(float *restrict d,
                                                               const uint16_t *restrict s,
                                                               size_t n) {
  size_t i = 0;
  const __m128i exp_mask = _mm_set1_epi16(0x7c00), quiet = _mm_set1_epi16(0x0200);
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
    /* A signalling NaN: all exponent bits, quiet bit clear, mantissa != 0. */
    __m128i all_exp = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask);
    __m128i not_quiet = _mm_cmpeq_epi16(_mm_and_si128(h, quiet), _mm_setzero_si128());
    __m128i mant = _mm_and_si128(h, _mm_set1_epi16(0x01ff));
    __m128i some = _mm_xor_si128(_mm_cmpeq_epi16(mant, _mm_setzero_si128()), _mm_set1_epi16(-1));
    if (_mm_movemask_epi8(_mm_and_si128(_mm_and_si128(all_exp, not_quiet), some)) != 0) {
      widen_f16(d + i, s + i, 8);
      continue;
    }
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  widen_f16(d + i, s + i, n - i);
}
#endif

static void narrow_bf16(uint16_t *restrict d, const float *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = tnt__float_to_bfloat16(s[i]);
}

static void widen_bf16(float *restrict d, const uint16_t *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = tnt__bfloat16_to_float(s[i]);
}

void tnt__narrow(uint16_t *dst, const float *src, size_t count, tnt_dtype_t wire) {
  if (wire == TNT_BFLOAT16) {
    narrow_bf16(dst, src, count);
    return;
  }
#ifdef TNT__HAVE_F16C
  if (__builtin_cpu_supports("f16c")) {
    narrow_f16_f16c(dst, src, count);
    return;
  }
#endif
  narrow_f16(dst, src, count);
}

void tnt__widen(float *dst, const uint16_t *src, size_t count, tnt_dtype_t wire) {
  if (wire == TNT_BFLOAT16) {
    widen_bf16(dst, src, count);
    return;
  }
#ifdef TNT__HAVE_F16C
  if (__builtin_cpu_supports("f16c")) {
    widen_f16_f16c(dst, src, count);
    return;
  }
#endif
  widen_f16(dst, src, count);
}

/* ------------------------------------------------------ scaled copies */

/* One loop per (type, direction): with the factor a loop constant, the
 * compiler vectorizes each, and no product or quotient is contracted. F is
 * the type the factor is taken in: int64_t for the integers, so that a
 * factor beyond a narrow type's range is not wrapped into it. */
#define TNT__SCALE_LOOP(T, F, d, s, n, f, divide)                  \
  do {                                                             \
    T *restrict d_ = (T *)(d);                                     \
    const T *restrict s_ = (const T *)(s);                         \
    const F f_ = (F)(f);                                           \
    if (divide) {                                                  \
      for (size_t i = 0; i < (n); i++) d_[i] = (T)(s_[i] / f_);    \
    } else {                                                       \
      for (size_t i = 0; i < (n); i++) d_[i] = (T)(s_[i] * f_);    \
    }                                                              \
  } while (0)

static float half_round(float f, tnt_dtype_t t) {
  return t == TNT_FLOAT16 ? tnt__half_to_float(tnt__float_to_half(f))
                          : tnt__bfloat16_to_float(tnt__float_to_bfloat16(f));
}

static float op_f32(float x, float f, int divide) {
  return divide ? x / f : x * f;
}

void tnt__copy_scaled(void *dst, tnt_dtype_t dst_dtype, const void *src, tnt_dtype_t src_dtype,
                      size_t count, double factor, int divide) {
  if (dst_dtype != src_dtype) {
    /* float32 <-> a 16-bit wire: scale in float32 on the float32 side. */
    const float f = (float)factor;
    if (src_dtype == TNT_FLOAT32) {
      const float *s = src;
      uint16_t *d = dst;
      for (size_t i = 0; i < count; i++) {
        const float v = op_f32(s[i], f, divide);
        d[i] = dst_dtype == TNT_FLOAT16 ? tnt__float_to_half(v) : tnt__float_to_bfloat16(v);
      }
    } else {
      const uint16_t *s = src;
      float *d = dst;
      for (size_t i = 0; i < count; i++) {
        const float w =
            src_dtype == TNT_FLOAT16 ? tnt__half_to_float(s[i]) : tnt__bfloat16_to_float(s[i]);
        d[i] = op_f32(w, f, divide);
      }
    }
    return;
  }
  switch (dst_dtype) {
    case TNT_FLOAT32: TNT__SCALE_LOOP(float, float, dst, src, count, factor, divide); break;
    case TNT_FLOAT64: TNT__SCALE_LOOP(double, double, dst, src, count, factor, divide); break;
    case TNT_INT32: TNT__SCALE_LOOP(int32_t, int64_t, dst, src, count, factor, divide); break;
    case TNT_INT64: TNT__SCALE_LOOP(int64_t, int64_t, dst, src, count, factor, divide); break;
    case TNT_INT8: TNT__SCALE_LOOP(int8_t, int64_t, dst, src, count, factor, divide); break;
    case TNT_INT16: TNT__SCALE_LOOP(int16_t, int64_t, dst, src, count, factor, divide); break;
    case TNT_UINT8: TNT__SCALE_LOOP(uint8_t, int64_t, dst, src, count, factor, divide); break;
    case TNT_FLOAT16:
    case TNT_BFLOAT16: {
      const float f = half_round((float)factor, dst_dtype);
      const uint16_t *s = src;
      uint16_t *d = dst;
      for (size_t i = 0; i < count; i++) {
        if (dst_dtype == TNT_FLOAT16) {
          d[i] = tnt__float_to_half(op_f32(tnt__half_to_float(s[i]), f, divide));
        } else {
          d[i] = tnt__float_to_bfloat16(op_f32(tnt__bfloat16_to_float(s[i]), f, divide));
        }
      }
      break;
    }
    default: memcpy(dst, src, count * tnt__dtype_size(dst_dtype)); break;
  }
}

/* ------------------------------------------------------ scalar operators */

#define TNT__F32_QNAN 0x7fc00000u
#define TNT__F64_QNAN 0x7ff8000000000000ull

static inline float min_f32(float a, float b) {
  if (a != a || b != b) return tnt__f32_from_bits(TNT__F32_QNAN);
  if (a < b) return a;
  if (b < a) return b;
  /* Equal values have equal bits except for -0 and +0; OR keeps the sign. */
  return tnt__f32_from_bits(tnt__f32_bits(a) | tnt__f32_bits(b));
}

static inline float max_f32(float a, float b) {
  if (a != a || b != b) return tnt__f32_from_bits(TNT__F32_QNAN);
  if (a > b) return a;
  if (b > a) return b;
  return tnt__f32_from_bits(tnt__f32_bits(a) & tnt__f32_bits(b));
}

static inline double min_f64(double a, double b) {
  if (a != a || b != b) return tnt__f64_from_bits(TNT__F64_QNAN);
  if (a < b) return a;
  if (b < a) return b;
  return tnt__f64_from_bits(tnt__f64_bits(a) | tnt__f64_bits(b));
}

static inline double max_f64(double a, double b) {
  if (a != a || b != b) return tnt__f64_from_bits(TNT__F64_QNAN);
  if (a > b) return a;
  if (b > a) return b;
  return tnt__f64_from_bits(tnt__f64_bits(a) & tnt__f64_bits(b));
}

static inline float add_f32(float a, float b) {
  return a + b;
}

static inline double add_f64(double a, double b) {
  return a + b;
}

static inline float div_f32(float a, int d) {
  return a / (float)d;
}

static inline double div_f64(double a, int d) {
  return a / (double)d;
}

/*
 * The integer element types' operators, one set per type. Sums wrap around
 * in the type's width (two's complement, as NumPy's and TensorFlow's sums
 * of the type do) instead of overflowing, which C leaves undefined for
 * signed types: the sum is taken in the unsigned type U and converted
 * back. Wrapping addition is associative, so every order of combination
 * gives the same bits. The average divides the wrapped sum by the group
 * size with C's truncating division, in a type wide enough for any size.
 */
#define TNT__DEFINE_INT_OPS(SFX, T, U)                                \
  static inline T add_##SFX(T a, T b) {                               \
    return (T)(U)((U)a + (U)b);                                       \
  }                                                                   \
  static inline T min_##SFX(T a, T b) {                               \
    return a < b ? a : b;                                             \
  }                                                                   \
  static inline T max_##SFX(T a, T b) {                               \
    return a > b ? a : b;                                             \
  }                                                                   \
  static inline T div_##SFX(T a, int d) {                             \
    return (T)((int64_t)a / (int64_t)d);                              \
  }                                                                   \
  static inline T id_##SFX(T a) {                                     \
    return a;                                                         \
  }

TNT__DEFINE_INT_OPS(i8, int8_t, uint8_t)
TNT__DEFINE_INT_OPS(i16, int16_t, uint16_t)
TNT__DEFINE_INT_OPS(i32, int32_t, uint32_t)
TNT__DEFINE_INT_OPS(i64, int64_t, uint64_t)
TNT__DEFINE_INT_OPS(u8, uint8_t, uint8_t)

static inline float id_f32(float a) {
  return a;
}

static inline double id_f64(double a) {
  return a;
}


/* ------------------------------------------------------- general kernels */

/*
 * Defines NAME(dst, srcs, n, count, op, divisor) for element type T with
 * accumulator type A. LOAD converts T to A and STORE rounds A back to T.
 * The switch on `op` sits outside the element loops so that each loop is a
 * simple one the compiler can vectorize.
 */
#define TNT__DEFINE_GENERIC(NAME, T, A, LOAD, STORE, ADD, MIN, MAX, DIV)                 \
  static void NAME(void *dst, const void *const *srcs, int n, size_t count, tnt_op_t op, \
                   int divisor) {                                                        \
    A acc[TNT__REDUCE_BLOCK];                                                            \
    T *d = (T *)dst;                                                                     \
    for (size_t base = 0; base < count; base += TNT__REDUCE_BLOCK) {                     \
      size_t len = TNT__MIN(count - base, (size_t)TNT__REDUCE_BLOCK);                    \
      const T *s = (const T *)srcs[0] + base;                                            \
      for (size_t i = 0; i < len; i++) acc[i] = LOAD(s[i]);                              \
      for (int k = 1; k < n; k++) {                                                      \
        s = (const T *)srcs[k] + base;                                                   \
        switch (op) {                                                                    \
          case TNT_MIN:                                                                  \
            for (size_t i = 0; i < len; i++) acc[i] = MIN(acc[i], LOAD(s[i]));           \
            break;                                                                       \
          case TNT_MAX:                                                                  \
            for (size_t i = 0; i < len; i++) acc[i] = MAX(acc[i], LOAD(s[i]));           \
            break;                                                                       \
          default:                                                                       \
            for (size_t i = 0; i < len; i++) acc[i] = ADD(acc[i], LOAD(s[i]));           \
            break;                                                                       \
        }                                                                                \
      }                                                                                  \
      if (op == TNT_AVERAGE && divisor > 1) {                                            \
        for (size_t i = 0; i < len; i++) acc[i] = DIV(acc[i], divisor);                  \
      }                                                                                  \
      for (size_t i = 0; i < len; i++) d[base + i] = STORE(acc[i]);                      \
    }                                                                                    \
  }

TNT__DEFINE_GENERIC(generic_f32, float, float, id_f32, id_f32, add_f32, min_f32, max_f32, div_f32)
TNT__DEFINE_GENERIC(generic_f64, double, double, id_f64, id_f64, add_f64, min_f64, max_f64, div_f64)
TNT__DEFINE_GENERIC(generic_f16, uint16_t, float, tnt__half_to_float, tnt__float_to_half, add_f32,
                    min_f32, max_f32, div_f32)
TNT__DEFINE_GENERIC(generic_bf16, uint16_t, float, tnt__bfloat16_to_float, tnt__float_to_bfloat16,
                    add_f32, min_f32, max_f32, div_f32)
TNT__DEFINE_GENERIC(generic_i32, int32_t, int32_t, id_i32, id_i32, add_i32, min_i32, max_i32,
                    div_i32)
TNT__DEFINE_GENERIC(generic_i64, int64_t, int64_t, id_i64, id_i64, add_i64, min_i64, max_i64,
                    div_i64)
TNT__DEFINE_GENERIC(generic_i8, int8_t, int8_t, id_i8, id_i8, add_i8, min_i8, max_i8, div_i8)
TNT__DEFINE_GENERIC(generic_i16, int16_t, int16_t, id_i16, id_i16, add_i16, min_i16, max_i16,
                    div_i16)
TNT__DEFINE_GENERIC(generic_u8, uint8_t, uint8_t, id_u8, id_u8, add_u8, min_u8, max_u8, div_u8)

/* float16 SUM (and AVERAGE): the general kernel's order and rounding, with
 * each block converted by the array conversions (F16C where the CPU has
 * it), which give the scalar conversions' bits. dst is written only after
 * every input of the block has been read, so it may alias any input. */
static void sum_many_f16(void *dst, const void *const *srcs, int n, size_t count, int divisor) {
  float acc[TNT__REDUCE_BLOCK], in[TNT__REDUCE_BLOCK];
  uint16_t *d = dst;
  for (size_t base = 0; base < count; base += TNT__REDUCE_BLOCK) {
    const size_t len = TNT__MIN(count - base, (size_t)TNT__REDUCE_BLOCK);
    tnt__widen(acc, (const uint16_t *)srcs[0] + base, len, TNT_FLOAT16);
    for (int k = 1; k < n; k++) {
      tnt__widen(in, (const uint16_t *)srcs[k] + base, len, TNT_FLOAT16);
      for (size_t i = 0; i < len; i++) acc[i] = add_f32(acc[i], in[i]);
    }
    if (divisor > 1) {
      for (size_t i = 0; i < len; i++) acc[i] = div_f32(acc[i], divisor);
    }
    tnt__narrow(d + base, acc, len, TNT_FLOAT16);
  }
}

/* ------------------------------------------------ float SUM fast kernels */

/*
 * The SUM kernels for element type T, compiled with the function attribute
 * ATTR (empty, or a target ISA) and suffixed SFX. Each combines in the same
 * left-to-right order as the general kernels, so which kernel runs never
 * changes the result.
 *
 *  sum2/3/4  d = a + b (+ c (+ e)), d distinct from every input
 *  acc1/2/3  d = d + b (+ c (+ e)), in place
 *  block     one block of n inputs into `out`; out is either distinct from
 *            every input or exactly srcs[0] + off (then it is updated in
 *            place); divides by divisor when divisor > 1
 */
#define TNT__DEFINE_SUM_KERNELS(T, SFX, ATTR)                                                      \
  ATTR static void sum2_##SFX(T *restrict d, const T *restrict a, const T *restrict b, size_t n) { \
    for (size_t i = 0; i < n; i++) d[i] = a[i] + b[i];                                             \
  }                                                                                                \
  ATTR static void sum3_##SFX(T *restrict d, const T *restrict a, const T *restrict b,             \
                              const T *restrict c, size_t n) {                                     \
    for (size_t i = 0; i < n; i++) d[i] = (a[i] + b[i]) + c[i];                                    \
  }                                                                                                \
  ATTR static void sum4_##SFX(T *restrict d, const T *restrict a, const T *restrict b,             \
                              const T *restrict c, const T *restrict e, size_t n) {                \
    for (size_t i = 0; i < n; i++) d[i] = ((a[i] + b[i]) + c[i]) + e[i];                           \
  }                                                                                                \
  ATTR static void acc1_##SFX(T *restrict d, const T *restrict b, size_t n) {                      \
    for (size_t i = 0; i < n; i++) d[i] = d[i] + b[i];                                             \
  }                                                                                                \
  ATTR static void acc2_##SFX(T *restrict d, const T *restrict b, const T *restrict c, size_t n) { \
    for (size_t i = 0; i < n; i++) d[i] = (d[i] + b[i]) + c[i];                                    \
  }                                                                                                \
  ATTR static void acc3_##SFX(T *restrict d, const T *restrict b, const T *restrict c,             \
                              const T *restrict e, size_t n) {                                     \
    for (size_t i = 0; i < n; i++) d[i] = ((d[i] + b[i]) + c[i]) + e[i];                           \
  }                                                                                                \
  ATTR static void divide_##SFX(T *restrict d, T divisor, size_t n) {                              \
    for (size_t i = 0; i < n; i++) d[i] = d[i] / divisor;                                          \
  }                                                                                                \
  ATTR static void block_##SFX(T *out, const void *const *srcs, size_t off, int n, size_t len,     \
                               int divisor) {                                                      \
    const T *s0 = (const T *)srcs[0] + off;                                                        \
    int k;                                                                                         \
    if (n == 1) {                                                                                  \
      if (out != s0) memcpy(out, s0, len * sizeof(T));                                             \
      k = 1;                                                                                       \
    } else if (out == s0) {                                                                        \
      k = 1;                                                                                       \
    } else if (n == 2) {                                                                           \
      sum2_##SFX(out, s0, (const T *)srcs[1] + off, len);                                          \
      k = 2;                                                                                       \
    } else if (n == 3) {                                                                           \
      sum3_##SFX(out, s0, (const T *)srcs[1] + off, (const T *)srcs[2] + off, len);                \
      k = 3;                                                                                       \
    } else {                                                                                       \
      sum4_##SFX(out, s0, (const T *)srcs[1] + off, (const T *)srcs[2] + off,                      \
                 (const T *)srcs[3] + off, len);                                                   \
      k = 4;                                                                                       \
    }                                                                                              \
    /* The rest is folded in three at a time while `out` is in the cache. */                       \
    while (k < n) {                                                                                \
      const T *b = (const T *)srcs[k] + off;                                                       \
      if (n - k >= 3) {                                                                            \
        acc3_##SFX(out, b, (const T *)srcs[k + 1] + off, (const T *)srcs[k + 2] + off, len);       \
        k += 3;                                                                                    \
      } else if (n - k == 2) {                                                                     \
        acc2_##SFX(out, b, (const T *)srcs[k + 1] + off, len);                                     \
        k += 2;                                                                                    \
      } else {                                                                                     \
        acc1_##SFX(out, b, len);                                                                   \
        k += 1;                                                                                    \
      }                                                                                            \
    }                                                                                              \
    if (divisor > 1) divide_##SFX(out, (T)divisor, len);                                           \
  }

TNT__DEFINE_SUM_KERNELS(float, f32, )
TNT__DEFINE_SUM_KERNELS(double, f64, )

typedef void (*tnt__f32_block_fn)(float *, const void *const *, size_t, int, size_t, int);
typedef void (*tnt__f64_block_fn)(double *, const void *const *, size_t, int, size_t, int);

#if defined(__x86_64__) && defined(__GNUC__)
#define TNT__HAVE_AVX2 1
TNT__DEFINE_SUM_KERNELS(float, f32_avx2, __attribute__((target("avx2"))))
TNT__DEFINE_SUM_KERNELS(double, f64_avx2, __attribute__((target("avx2"))))
#endif

/* The block kernels for this CPU. __builtin_cpu_supports only reads data
 * that libgcc initialized before main, so this is safe from any thread. */
static tnt__f32_block_fn pick_block_f32(void) {
#ifdef TNT__HAVE_AVX2
  if (__builtin_cpu_supports("avx2")) return block_f32_avx2;
#endif
  return block_f32;
}

static tnt__f64_block_fn pick_block_f64(void) {
#ifdef TNT__HAVE_AVX2
  if (__builtin_cpu_supports("avx2")) return block_f64_avx2;
#endif
  return block_f64;
}

/* 1 when [a, a+bytes) and [b, b+bytes) overlap. */
static int overlaps(const void *a, const void *b, size_t bytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bytes && y < x + bytes;
}

/*
 * float32/float64 SUM or AVERAGE of n inputs. When dst is exactly srcs[0]
 * the kernels update it in place; when it overlaps any other input, each
 * block goes through a local buffer so that no input is overwritten before
 * it has been read.
 */
#define TNT__DEFINE_SUM_MANY(T, SFX)                                                  \
  static void sum_many_##SFX(void *dst, const void *const *srcs, int n, size_t count, \
                             int divisor) {                                           \
    _Alignas(64) T tmp[TNT__REDUCE_BLOCK];                                            \
    T *d = (T *)dst;                                                                  \
    size_t bytes = count * sizeof(T);                                                 \
    int via_tmp = 0;                                                                  \
    for (int k = 0; k < n; k++) {                                                     \
      if (overlaps(d, srcs[k], bytes) && !(k == 0 && srcs[0] == dst)) via_tmp = 1;    \
    }                                                                                 \
    tnt__##SFX##_block_fn block = pick_block_##SFX();                                 \
    for (size_t base = 0; base < count; base += TNT__REDUCE_BLOCK) {                  \
      size_t len = TNT__MIN(count - base, (size_t)TNT__REDUCE_BLOCK);                 \
      if (via_tmp) {                                                                  \
        block(tmp, srcs, base, n, len, divisor);                                      \
        memcpy(d + base, tmp, len * sizeof(T));                                       \
      } else {                                                                        \
        block(d + base, srcs, base, n, len, divisor);                                 \
      }                                                                               \
    }                                                                                 \
  }

TNT__DEFINE_SUM_MANY(float, f32)
TNT__DEFINE_SUM_MANY(double, f64)

/* ------------------------------------------------------------ public API */

void tnt__reduce_many(void *dst, const void *const *srcs, int n, size_t count, tnt_dtype_t dtype,
                      tnt_op_t op, int divisor) {
  if (n < 1 || count == 0 || !tnt__dtype_valid(dtype) || !tnt__op_valid(op)) return;
  /* The divisor only matters for AVERAGE; values below 2 divide by 1. */
  int div = (op == TNT_AVERAGE && divisor > 1) ? divisor : 1;
  int is_sum = op == TNT_SUM || op == TNT_AVERAGE;
  switch (dtype) {
    case TNT_FLOAT32:
      if (is_sum) {
        sum_many_f32(dst, srcs, n, count, div);
      } else {
        generic_f32(dst, srcs, n, count, op, div);
      }
      break;
    case TNT_FLOAT64:
      if (is_sum) {
        sum_many_f64(dst, srcs, n, count, div);
      } else {
        generic_f64(dst, srcs, n, count, op, div);
      }
      break;
    case TNT_FLOAT16:
      if (is_sum) {
        sum_many_f16(dst, srcs, n, count, div);
      } else {
        generic_f16(dst, srcs, n, count, op, div);
      }
      break;
    case TNT_BFLOAT16:
      generic_bf16(dst, srcs, n, count, op, div);
      break;
    case TNT_INT32:
      generic_i32(dst, srcs, n, count, op, div);
      break;
    case TNT_INT64:
      generic_i64(dst, srcs, n, count, op, div);
      break;
    case TNT_INT8:
      generic_i8(dst, srcs, n, count, op, div);
      break;
    case TNT_INT16:
      generic_i16(dst, srcs, n, count, op, div);
      break;
    case TNT_UINT8:
      generic_u8(dst, srcs, n, count, op, div);
      break;
    default:
      break;
  }
}

void tnt__reduce(void *dst, const void *src, size_t count, tnt_dtype_t dtype, tnt_op_t op) {
  /* AVERAGE only adds here; tnt__reduce_finish divides once at the end. */
  const void *srcs[2] = {dst, src};
  tnt__reduce_many(dst, srcs, 2, count, dtype, op == TNT_AVERAGE ? TNT_SUM : op, 1);
}

#define TNT__DIVIDE_LOOP(T, SFX, buf, count, divisor)                    \
  do {                                                                   \
    T *p_ = (T *)(buf);                                                  \
    for (size_t i = 0; i < (count); i++) p_[i] = div_##SFX(p_[i], divisor); \
  } while (0)

void tnt__reduce_finish(void *buf, size_t count, tnt_dtype_t dtype, tnt_op_t op, int divisor) {
  if (op != TNT_AVERAGE || divisor <= 1) return;
  switch (dtype) {
    case TNT_FLOAT32: {
      float *p = buf;
      for (size_t i = 0; i < count; i++) p[i] = p[i] / (float)divisor;
      break;
    }
    case TNT_FLOAT64: {
      double *p = buf;
      for (size_t i = 0; i < count; i++) p[i] = p[i] / (double)divisor;
      break;
    }
    case TNT_FLOAT16: {
      uint16_t *p = buf;
      for (size_t i = 0; i < count; i++) {
        p[i] = tnt__float_to_half(tnt__half_to_float(p[i]) / (float)divisor);
      }
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *p = buf;
      for (size_t i = 0; i < count; i++) {
        p[i] = tnt__float_to_bfloat16(tnt__bfloat16_to_float(p[i]) / (float)divisor);
      }
      break;
    }
    case TNT_INT32: TNT__DIVIDE_LOOP(int32_t, i32, buf, count, divisor); break;
    case TNT_INT64: TNT__DIVIDE_LOOP(int64_t, i64, buf, count, divisor); break;
    case TNT_INT8: TNT__DIVIDE_LOOP(int8_t, i8, buf, count, divisor); break;
    case TNT_INT16: TNT__DIVIDE_LOOP(int16_t, i16, buf, count, divisor); break;
    case TNT_UINT8: TNT__DIVIDE_LOOP(uint8_t, u8, buf, count, divisor); break;
    default:
      break;
  }
}
