/*
 * Element types, reduction operations and status codes: their sizes and
 * names. The public tnt_dtype_size, tnt_dtype_name, tnt_op_name and
 * tnt_status_string (src/api/status.c) return these; the layers below the
 * API call these directly.
 */
#ifndef TNT_UTIL_TYPES_H
#define TNT_UTIL_TYPES_H

#include <stddef.h>

#include "tnt/tnt.h"

/* 1 when `dtype` (`op`) is one of the values of tnt.h, else 0. */
int tnt__dtype_valid(tnt_dtype_t dtype);
int tnt__op_valid(tnt_op_t op);
/* Whether `dtype` is one of the integer types (divided by truncation). */
int tnt__dtype_is_integer(tnt_dtype_t dtype);

/* Size in bytes of one element, or 0 for an invalid dtype. */
size_t tnt__dtype_size(tnt_dtype_t dtype);
/* Static lower-case names ("float32", "sum"), or "invalid". */
const char *tnt__dtype_name(tnt_dtype_t dtype);
const char *tnt__op_name(tnt_op_t op);
/* A static, human-readable name of `status` ("TNT_ERR_TIMEOUT: ..."). */
const char *tnt__status_string(tnt_status_t status);

#endif
