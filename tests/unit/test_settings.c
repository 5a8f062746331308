/* The settings registry: parsing by kind, one policy for bad values,
 * sources, and the algorithm settings' words against the algorithm tables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "collectives/collectives.h"
#include "tnt/tnt.h"
#include "util/settings.h"

/* Reads the registry from a NULL-terminated list of NAME=VALUE. */
static int read_env(char *err, size_t len, ...) {
  char *env[16];
  int n = 0;
  va_list ap;
  va_start(ap, len);
  for (char *e = va_arg(ap, char *); e != NULL && n < 15; e = va_arg(ap, char *)) env[n++] = e;
  va_end(ap);
  env[n] = NULL;
  return tnt__settings_read(env, err, len);
}

static void test_defaults(void **state) {
  (void)state;
  char err[512];
  assert_int_equal(read_env(err, sizeof err, NULL), 0);
  assert_true(tnt__setting_number(TNT__S_TIMEOUT_S) == 30.0);
  assert_int_equal(tnt__setting_word(TNT__S_STALL_WARNING_S), 0); /* auto */
  assert_true(tnt__setting_number(TNT__S_STALL_WARNING_S) < 0);
  assert_int_equal(tnt__setting_word(TNT__S_LOG_LEVEL), 1);      /* INFO */
  assert_int_equal(tnt__setting_word(TNT__S_DATA_SHARE), 0); /* on */
  assert_int_equal(tnt__setting_on(TNT__S_LOG_ON_ALL_DEVICES), 0);
  char text[64];
  assert_string_equal(tnt__setting_text(TNT__S_TIMELINE, text, sizeof text), "");
  for (int i = 0; i < TNT__S_COUNT; ++i) {
    tnt__setting_view_t v;
    tnt__setting_view((tnt__setting_id_t)i, &v);
    assert_int_equal(v.source, TNT__SOURCE_DEFAULT);
    assert_null(v.error);
    assert_int_equal(strncmp(v.name, "TNT_", 4), 0);
    assert_true(strlen(v.help) > 10);
  }
}

static void test_values_of_every_kind(void **state) {
  (void)state;
  char err[512];
  assert_int_equal(read_env(err, sizeof err, "TNT_TIMEOUT_S= 2.5 ", "TNT_LOG_LEVEL=debug",
                            "TNT_DATA_SHARE=No", "TNT_LOG_ON_ALL_DEVICES=TRUE",
                            "TNT_RING_DEPTH=7", "TNT_FUSION_THRESHOLD_KB=auto",
                            "TNT_SHM_SLOT_KB=0.5", "TNT_TIMELINE=/tmp/t.json",
                            "TNT_OVERLAP=off", NULL),
                   0);
  assert_true(tnt__setting_number(TNT__S_TIMEOUT_S) == 2.5);
  assert_int_equal(tnt__setting_word(TNT__S_LOG_LEVEL), 0);
  assert_int_equal(tnt__setting_word(TNT__S_DATA_SHARE), 1); /* "No": a choice of on and off
                                                                 takes a switch's words */
  assert_int_equal(tnt__setting_on(TNT__S_LOG_ON_ALL_DEVICES), 1);
  assert_true(tnt__setting_number(TNT__S_RING_DEPTH) == 7.0);
  assert_int_equal(tnt__setting_word(TNT__S_FUSION_THRESHOLD_KB), 0);
  assert_true(tnt__setting_number(TNT__S_SHM_SLOT_KB) == 0.5);
  char text[64];
  assert_string_equal(tnt__setting_text(TNT__S_TIMELINE, text, sizeof text), "/tmp/t.json");
  tnt__setting_view_t v;
  tnt__setting_view(TNT__S_LOG_LEVEL, &v);
  assert_string_equal(v.value, "DEBUG"); /* canonical */
  assert_int_equal(v.source, TNT__SOURCE_ENVIRONMENT);
  tnt__setting_view(TNT__S_OVERLAP, &v);
  assert_string_equal(v.value, "off");
}

static void test_bad_values_name_what_the_setting_takes(void **state) {
  (void)state;
  static const struct {
    const char *env, *message;
  } cases[] = {
      {"TNT_TIMEOUT_S=0", "TNT_TIMEOUT_S=0 is not a value TNT_TIMEOUT_S takes: use a number "
                          "greater than 0 and at most 1000000000 (default 30); fix or unset it"},
      {"TNT_TIMEOUT_S=0x10", "use a number greater than 0"},
      {"TNT_TIMEOUT_S=inf", "use a number greater than 0"},
      {"TNT_TIMEOUT_S=nan", "use a number greater than 0"},
      {"TNT_RING_DEPTH=2.5", "use a whole number from 1 to 1024"},
      {"TNT_RING_DEPTH=0", "use a whole number from 1 to 1024"},
      {"TNT_LOG_LEVEL=LOUD", "use DEBUG, INFO, WARNING or ERROR (default INFO)"},
      {"TNT_DATA_SHARE=maybe", "use on, off or deterministic (default on)"},
      {"TNT_OUTPUT_ON_ALL_DEVICES=maybe",
       "use on or off (also 1, true, yes or 0, false, no) (default off)"},
      {"TNT_FUSION_THRESHOLD_KB=-1", "use a number from 0 to 1048576, or auto (default 32)"},
      {"TNT_ALLREDUCE_ALGORITHM=fast", "use auto, shm, rd, ring, mpi, hier or rabenseifner"},
      {"TNT_SPLIT_HOSTS=0", "use a whole number from 1 to 1048576, or off"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    char err[512] = "";
    char env[128];
    snprintf(env, sizeof env, "%s", cases[i].env);
    assert_int_equal(read_env(err, sizeof err, env, "TNT_COMPRESSION=bf16", NULL), -1);
    if (strstr(err, cases[i].message) == NULL) fail_msg("%s: got '%s'", cases[i].env, err);
    /* The bad setting keeps its default and says why; the others hold. */
    tnt__setting_view_t v;
    tnt__setting_view(TNT__S_COMPRESSION, &v);
    assert_string_equal(v.value, "bf16");
    assert_null(v.error);
  }
  char err[512];
  assert_int_equal(read_env(err, sizeof err, "TNT_TIMEOUT_S=soon", NULL), -1);
  assert_true(tnt__setting_number(TNT__S_TIMEOUT_S) == 30.0);
  tnt__setting_view_t v;
  tnt__setting_view(TNT__S_TIMEOUT_S, &v);
  assert_non_null(v.error);
  assert_int_equal(v.source, TNT__SOURCE_DEFAULT);
}

static void test_command_line_source(void **state) {
  (void)state;
  char err[512];
  assert_int_equal(read_env(err, sizeof err, "TNT_TIMEOUT_S=5", "TNT_RING_DEPTH=4",
                            "TNT_COMMAND_LINE_SETTINGS=TNT_LOG_LEVEL,TNT_TIMEOUT_S", NULL),
                   0);
  tnt__setting_view_t v;
  tnt__setting_view(TNT__S_TIMEOUT_S, &v);
  assert_int_equal(v.source, TNT__SOURCE_COMMAND_LINE);
  tnt__setting_view(TNT__S_RING_DEPTH, &v);
  assert_int_equal(v.source, TNT__SOURCE_ENVIRONMENT);
  tnt__setting_view(TNT__S_LOG_LEVEL, &v); /* listed, but unset */
  assert_int_equal(v.source, TNT__SOURCE_DEFAULT);
}

/* Each algorithm setting takes "auto" and then the names of its table, in
 * the table's order (algorithms.c maps word k to the table's entry k-1). */
static void test_algorithm_words_match_the_tables(void **state) {
  (void)state;
  static const tnt__setting_id_t ids[TNT__ALGO_TABLE_COUNT] = {
      TNT__S_ALLREDUCE_ALGORITHM, TNT__S_BROADCAST_ALGORITHM, TNT__S_ALLGATHER_ALGORITHM};
  for (int k = 0; k < TNT__ALGO_TABLE_COUNT; ++k) {
    tnt__setting_view_t v;
    tnt__setting_view(ids[k], &v);
    char want[256] = "auto";
    for (int i = 0; tnt__algo_at((tnt__coll_kind_t)k, i) != NULL; ++i) {
      strcat(want, "|");
      strcat(want, tnt__algo_at((tnt__coll_kind_t)k, i)->name);
    }
    assert_string_equal(v.words, want);
  }
}

static void test_public_api(void **state) {
  (void)state;
  assert_int_equal(tnt_settings_count(), TNT__S_COUNT);
  tnt_setting_info_t info;
  assert_int_equal(tnt_setting_info(0, &info), TNT_OK);
  assert_string_equal(info.name, "TNT_TIMEOUT_S");
  assert_int_equal(tnt_setting_info(TNT__S_COUNT, &info), TNT_ERR_INVALID_ARG);
  assert_int_equal(tnt_setting_info(0, NULL), TNT_ERR_INVALID_ARG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_values_of_every_kind),
      cmocka_unit_test(test_bad_values_name_what_the_setting_takes),
      cmocka_unit_test(test_command_line_source),
      cmocka_unit_test(test_algorithm_words_match_the_tables),
      cmocka_unit_test(test_public_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
