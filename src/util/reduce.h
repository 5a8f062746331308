/*
 * Reduction kernels and array conversions. Every kernel combines its inputs
 * in a fixed order, so results are bitwise reproducible. float16 and
 * bfloat16 are computed in float and rounded to nearest even (the scalar
 * conversions are in util/values.h).
 */
#ifndef TNT_UTIL_REDUCE_H
#define TNT_UTIL_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "tnt/tnt.h"
#include "util/types.h"

/*
 * Array conversions for compressed transfers: float32 to `wire` (TNT_FLOAT16
 * or TNT_BFLOAT16, rounded to nearest even) and back (exact). They give the
 * same bits as the scalar conversions of util/values.h for every input,
 * NaNs included; float16 uses the F16C instructions where the CPU has them.
 */
void tnt__narrow(uint16_t *dst, const float *src, size_t count, tnt_dtype_t wire);
void tnt__widen(float *dst, const uint16_t *src, size_t count, tnt_dtype_t wire);

/*
 * Copies count elements of `src` to `dst`, multiplying each by `factor`
 * (divide = 0) or dividing it by `factor` (divide = 1), in the element's own
 * precision: factor is first converted to the dtype (as a TensorFlow cast
 * does), and float16 and bfloat16 compute in float and round once (as
 * TensorFlow's Mul and RealDiv do on them), so the result is bitwise what
 * TensorFlow gives. Integer dtypes multiply and divide as integers. The
 * types are `dtype` on both sides, or float32 and `wire` (TNT_FLOAT16 or
 * TNT_BFLOAT16) on one: src float32 -> dst wire scales before rounding to
 * the wire dtype, src wire -> dst float32 scales after widening.
 */
void tnt__copy_scaled(void *dst, tnt_dtype_t dst_dtype, const void *src, tnt_dtype_t src_dtype,
                      size_t count, double factor, int divide);

/* dst[i] = dst[i] (op) src[i] for i < count. AVERAGE adds (like SUM); the
 * division happens once, in tnt__reduce_finish. */
void tnt__reduce(void *dst, const void *src, size_t count, tnt_dtype_t dtype, tnt_op_t op);

/*
 * dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[n-1][i], combined
 * left to right; half types accumulate all n inputs in float and round once.
 * For AVERAGE the sum is divided by `divisor` before rounding. dst may alias
 * any src.
 */
void tnt__reduce_many(void *dst, const void *const *srcs, int n, size_t count, tnt_dtype_t dtype,
                      tnt_op_t op, int divisor);

/* Finishes an AVERAGE computed with tnt__reduce: divides by `divisor`.
 * A no-op for the other operations. */
void tnt__reduce_finish(void *buf, size_t count, tnt_dtype_t dtype, tnt_op_t op, int divisor);

#endif
