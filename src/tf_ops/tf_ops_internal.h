/*
 * What the two translation units of libtnt_tf_ops.so share. They are two
 * because tensorflow/c/kernels.h defines an object (a `const size_t`) in
 * the header, which in C has external linkage: only tnt_tf_ops.c may
 * include it, so the op definitions, which need ops.h only, live apart.
 */
#ifndef TNT_TF_OPS_INTERNAL_H
#define TNT_TF_OPS_INTERNAL_H

#include "tensorflow/c/tf_status.h"

/* The types every op accepts for its attribute T: the dtypes of libtnt. */
#define TNT_TF_TYPE_ATTR "T: {float, double, half, bfloat16, int8, int16, int32, int64, uint8}"

/* Registers the definitions and shape functions of every op; on failure
 * `status` says which op could not be registered and why. */
void tnt_tf__register_op_defs(TF_Status *status);

#endif
