/*
 * Element types and reduction operations: sizes and names for the public
 * API. The tables are indexed by the enum values of tnt.h, and every lookup
 * checks the range first, so an invalid value gives 0 or "invalid" instead
 * of reading past a table.
 */
#include "core/reduce.h"
#include "tnt/tnt.h"

static const size_t tnt__dtype_sizes[TNT_DTYPE_COUNT] = {
    [TNT_FLOAT32] = 4,  [TNT_FLOAT64] = 8, [TNT_FLOAT16] = 2,
    [TNT_BFLOAT16] = 2, [TNT_INT32] = 4,   [TNT_INT64] = 8,
};

static const char *const tnt__dtype_names[TNT_DTYPE_COUNT] = {
    [TNT_FLOAT32] = "float32",   [TNT_FLOAT64] = "float64", [TNT_FLOAT16] = "float16",
    [TNT_BFLOAT16] = "bfloat16", [TNT_INT32] = "int32",     [TNT_INT64] = "int64",
};

static const char *const tnt__op_names[TNT_OP_COUNT] = {
    [TNT_SUM] = "sum",
    [TNT_AVERAGE] = "average",
    [TNT_MIN] = "min",
    [TNT_MAX] = "max",
};

size_t tnt_dtype_size(tnt_dtype_t dtype) {
  return tnt__dtype_valid(dtype) ? tnt__dtype_sizes[dtype] : 0;
}

const char *tnt_dtype_name(tnt_dtype_t dtype) {
  return tnt__dtype_valid(dtype) ? tnt__dtype_names[dtype] : "invalid";
}

const char *tnt_op_name(tnt_op_t op) {
  return tnt__op_valid(op) ? tnt__op_names[op] : "invalid";
}
