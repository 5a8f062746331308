/*
 * Names of status codes, element types and operations, and the calling
 * thread's error message. These are queries: none of them changes what
 * tnt_last_error returns.
 */
#include "api/api.h"

const char *tnt_status_string(tnt_status_t status) {
  return tnt__status_string(status);
}

size_t tnt_dtype_size(tnt_dtype_t dtype) {
  return tnt__dtype_size(dtype);
}

const char *tnt_dtype_name(tnt_dtype_t dtype) {
  return tnt__dtype_name(dtype);
}

const char *tnt_op_name(tnt_op_t op) {
  return tnt__op_name(op);
}

const char *tnt_last_error(void) {
  return tnt__error_message();
}
