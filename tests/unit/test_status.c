/*
 * Tests of the names that the public API gives to status codes, dtypes and
 * operations (tnt_status_string, tnt_dtype_size, tnt_dtype_name,
 * tnt_op_name), including the answers for values outside the enums.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tnt/tnt.h"

static const tnt_status_t kStatuses[] = {
    TNT_OK,          TNT_IN_PROGRESS, TNT_ERR_INVALID_ARG, TNT_ERR_NO_MEMORY, TNT_ERR_MPI,
    TNT_ERR_TIMEOUT, TNT_ERR_FAILED,  TNT_ERR_UNSUPPORTED, TNT_ERR_STATE,     TNT_ERR_INTERNAL,
    TNT_ERR_MISMATCH};
#define NSTATUS (sizeof kStatuses / sizeof kStatuses[0])

static void test_status_strings_distinct(void **state) {
  (void)state;
  for (size_t i = 0; i < NSTATUS; i++) {
    const char *s = tnt_status_string(kStatuses[i]);
    assert_non_null(s);
    assert_true(strlen(s) > 0);
    /* Each string starts with the name of its code. */
    assert_true(strncmp(s, "TNT_", 4) == 0);
    for (size_t j = 0; j < i; j++) assert_string_not_equal(s, tnt_status_string(kStatuses[j]));
  }
  assert_non_null(strstr(tnt_status_string(TNT_ERR_TIMEOUT), "TNT_ERR_TIMEOUT"));
  assert_non_null(strstr(tnt_status_string(TNT_OK), "TNT_OK"));
  /* Every error is negative and "in progress" positive, so st < 0 means
   * failure. */
  for (size_t i = 2; i < NSTATUS; i++) assert_true(kStatuses[i] < 0);
  assert_true(TNT_IN_PROGRESS > 0);
}

static void test_status_unknown_codes(void **state) {
  (void)state;
  int unknown[] = {2, 3, 100, -10, -100, 12345, -2147483647 - 1, 2147483647};
  const char *generic = tnt_status_string((tnt_status_t)unknown[0]);
  assert_non_null(generic);
  assert_true(strlen(generic) > 0);
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *s = tnt_status_string((tnt_status_t)unknown[i]);
    assert_non_null(s);
    /* One generic string, different from every real code's. */
    assert_string_equal(s, generic);
    for (size_t j = 0; j < NSTATUS; j++) {
      assert_string_not_equal(s, tnt_status_string(kStatuses[j]));
    }
  }
}

static void test_dtype_sizes_and_names(void **state) {
  (void)state;
  assert_int_equal(tnt_dtype_size(TNT_FLOAT32), 4);
  assert_int_equal(tnt_dtype_size(TNT_FLOAT64), 8);
  assert_int_equal(tnt_dtype_size(TNT_FLOAT16), 2);
  assert_int_equal(tnt_dtype_size(TNT_BFLOAT16), 2);
  assert_int_equal(tnt_dtype_size(TNT_INT32), 4);
  assert_int_equal(tnt_dtype_size(TNT_INT64), 8);
  assert_int_equal(tnt_dtype_size(TNT_INT8), 1);
  assert_int_equal(tnt_dtype_size(TNT_INT16), 2);
  assert_int_equal(tnt_dtype_size(TNT_UINT8), 1);
  assert_string_equal(tnt_dtype_name(TNT_FLOAT32), "float32");
  assert_string_equal(tnt_dtype_name(TNT_FLOAT64), "float64");
  assert_string_equal(tnt_dtype_name(TNT_FLOAT16), "float16");
  assert_string_equal(tnt_dtype_name(TNT_BFLOAT16), "bfloat16");
  assert_string_equal(tnt_dtype_name(TNT_INT32), "int32");
  assert_string_equal(tnt_dtype_name(TNT_INT64), "int64");
  assert_string_equal(tnt_dtype_name(TNT_INT8), "int8");
  assert_string_equal(tnt_dtype_name(TNT_INT16), "int16");
  assert_string_equal(tnt_dtype_name(TNT_UINT8), "uint8");
  for (int a = 0; a < TNT_DTYPE_COUNT; a++) {
    for (int b = 0; b < a; b++) {
      assert_string_not_equal(tnt_dtype_name((tnt_dtype_t)a), tnt_dtype_name((tnt_dtype_t)b));
    }
  }
}

static void test_op_names(void **state) {
  (void)state;
  assert_string_equal(tnt_op_name(TNT_SUM), "sum");
  assert_string_equal(tnt_op_name(TNT_AVERAGE), "average");
  assert_string_equal(tnt_op_name(TNT_MIN), "min");
  assert_string_equal(tnt_op_name(TNT_MAX), "max");
}

static void test_invalid_values(void **state) {
  (void)state;
  int bad[] = {TNT_DTYPE_COUNT, TNT_DTYPE_COUNT + 1, -1, 1000, -2147483647 - 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(tnt_dtype_size((tnt_dtype_t)bad[i]), 0);
    assert_string_equal(tnt_dtype_name((tnt_dtype_t)bad[i]), "invalid");
  }
  int bad_ops[] = {TNT_OP_COUNT, TNT_OP_COUNT + 7, -1, -2147483647 - 1};
  for (size_t i = 0; i < sizeof bad_ops / sizeof bad_ops[0]; i++) {
    assert_string_equal(tnt_op_name((tnt_op_t)bad_ops[i]), "invalid");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings_distinct), cmocka_unit_test(test_status_unknown_codes),
      cmocka_unit_test(test_dtype_sizes_and_names),   cmocka_unit_test(test_op_names),
      cmocka_unit_test(test_invalid_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
