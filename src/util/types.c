/*
 * Element types, reduction operations and status codes: sizes and names.
 * The tables are indexed by the enum values of tnt.h, and every lookup
 * checks the range first, so an invalid value gives 0 or "invalid" instead
 * of reading past a table.
 */
#include "util/types.h"

static const size_t dtype_sizes[TNT_DTYPE_COUNT] = {
    [TNT_FLOAT32] = 4,  [TNT_FLOAT64] = 8, [TNT_FLOAT16] = 2,
    [TNT_BFLOAT16] = 2, [TNT_INT32] = 4,   [TNT_INT64] = 8,
    [TNT_INT8] = 1,     [TNT_INT16] = 2,   [TNT_UINT8] = 1,
};

static const char *const dtype_names[TNT_DTYPE_COUNT] = {
    [TNT_FLOAT32] = "float32",   [TNT_FLOAT64] = "float64", [TNT_FLOAT16] = "float16",
    [TNT_BFLOAT16] = "bfloat16", [TNT_INT32] = "int32",     [TNT_INT64] = "int64",
    [TNT_INT8] = "int8",         [TNT_INT16] = "int16",     [TNT_UINT8] = "uint8",
};

static const char *const op_names[TNT_OP_COUNT] = {
    [TNT_SUM] = "sum",
    [TNT_AVERAGE] = "average",
    [TNT_MIN] = "min",
    [TNT_MAX] = "max",
};

int tnt__dtype_valid(tnt_dtype_t dtype) {
  return (unsigned)dtype < (unsigned)TNT_DTYPE_COUNT;
}

int tnt__dtype_is_integer(tnt_dtype_t dtype) {
  return dtype == TNT_INT32 || dtype == TNT_INT64 || dtype == TNT_INT8 || dtype == TNT_INT16 ||
         dtype == TNT_UINT8;
}

int tnt__op_valid(tnt_op_t op) {
  return (unsigned)op < (unsigned)TNT_OP_COUNT;
}

size_t tnt__dtype_size(tnt_dtype_t dtype) {
  return tnt__dtype_valid(dtype) ? dtype_sizes[dtype] : 0;
}

const char *tnt__dtype_name(tnt_dtype_t dtype) {
  return tnt__dtype_valid(dtype) ? dtype_names[dtype] : "invalid";
}

const char *tnt__op_name(tnt_op_t op) {
  return tnt__op_valid(op) ? op_names[op] : "invalid";
}

const char *tnt__status_string(tnt_status_t status) {
  switch (status) {
    case TNT_OK:
      return "TNT_OK: success";
    case TNT_IN_PROGRESS:
      return "TNT_IN_PROGRESS: the operation is still running";
    case TNT_ERR_INVALID_ARG:
      return "TNT_ERR_INVALID_ARG: an argument is invalid";
    case TNT_ERR_NO_MEMORY:
      return "TNT_ERR_NO_MEMORY: out of memory";
    case TNT_ERR_MPI:
      return "TNT_ERR_MPI: the MPI library reported an error";
    case TNT_ERR_TIMEOUT:
      return "TNT_ERR_TIMEOUT: a peer did not answer within the timeout";
    case TNT_ERR_FAILED:
      return "TNT_ERR_FAILED: an earlier operation failed and the context is unusable";
    case TNT_ERR_UNSUPPORTED:
      return "TNT_ERR_UNSUPPORTED: not supported by this build or MPI";
    case TNT_ERR_STATE:
      return "TNT_ERR_STATE: call out of order";
    case TNT_ERR_INTERNAL:
      return "TNT_ERR_INTERNAL: internal error in libtnt";
    case TNT_ERR_MISMATCH:
      return "TNT_ERR_MISMATCH: the ranks called different collectives at the same point";
  }
  return "unknown tnt_status_t value";
}
