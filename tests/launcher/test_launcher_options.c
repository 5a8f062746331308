/* Unit tests of the launcher's command-line parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "options.h"

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Parses argv and checks the result; err receives the message. */
static tnt__parse_result_t parse(int argc, char **argv, tnt__options_t *o, char *err) {
  return tnt__options_parse(argc, argv, o, err, 512);
}

/* Checks that argv is rejected with a message containing `expected`. */
static void expect_error(int argc, char **argv, const char *expected) {
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(argc, argv, &o, err), TNT__PARSE_ERROR);
  if (strstr(err, expected) == NULL) fail_msg("message '%s' lacks '%s'", err, expected);
  tnt__options_free(&o);
}

static void test_defaults(void **state) {
  (void)state;
  char *argv[] = {"tarantella", "--", "model.py"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
  assert_int_equal(o.nranks, 0);
  assert_int_equal(o.n_per_node, 0);
  assert_null(o.hostfile);
  assert_false(o.no_gpu);
  assert_null(o.log_level);
  assert_null(o.fusion_threshold);
  assert_false(o.dry_run);
  assert_int_equal(o.num_env, 0);
  assert_int_equal(o.program_argc, 1);
  assert_string_equal(o.program_argv[0], "model.py");
  tnt__options_free(&o);
}

static void test_every_option(void **state) {
  (void)state;
  char *argv[] = {"tarantella",
                  "--hostfile",
                  "hosts",
                  "--n-per-node",
                  "2",
                  "--no-gpu",
                  "--log-level",
                  "warning",
                  "--log-on-all-devices",
                  "--output-on-all-devices",
                  "-x",
                  "A=1",
                  "-xB=two words",
                  "--fusion-threshold",
                  "0.5",
                  "--pin-to-socket",
                  "--python-interpreter",
                  "/usr/bin/python3",
                  "--run-dir",
                  "runs",
                  "--dry-run",
                  "--",
                  "model.py",
                  "--epochs",
                  "3",
                  "--help",
                  "-n",
                  "7"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
  assert_string_equal(o.hostfile, "hosts");
  assert_int_equal(o.n_per_node, 2);
  assert_true(o.no_gpu);
  assert_string_equal(o.log_level, "warning");
  assert_true(o.log_on_all_devices);
  assert_true(o.output_on_all_devices);
  assert_int_equal(o.num_env, 2);
  assert_string_equal(o.env[0], "A=1");
  assert_string_equal(o.env[1], "B=two words");
  assert_string_equal(o.fusion_threshold, "0.5");
  assert_true(o.pin_to_socket);
  assert_false(o.pin_memory_to_socket);
  assert_string_equal(o.python, "/usr/bin/python3");
  assert_string_equal(o.run_dir, "runs");
  assert_true(o.dry_run);
  /* Everything after -- belongs to the program, options included. */
  assert_int_equal(o.program_argc, 6);
  assert_string_equal(o.program_argv[3], "--help");
  assert_int_equal(o.nranks, 0);
  tnt__options_free(&o);
}

static void test_equals_forms_and_aliases(void **state) {
  (void)state;
  const char *aliases[] = {"--n-per-node=3", "--npernode=3", "--devices-per-node=3"};
  for (int i = 0; i < 3; ++i) {
    char *argv[] = {"tarantella",
                    (char *)aliases[i],
                    "--hostfile=h",
                    "--log-level=ERROR",
                    "--fusion-threshold=1e3",
                    "--",
                    "p"};
    tnt__options_t o;
    char err[512];
    assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
    assert_int_equal(o.n_per_node, 3);
    assert_string_equal(o.hostfile, "h");
    assert_string_equal(o.log_level, "ERROR");
    tnt__options_free(&o);
  }
}

static void test_rank_count_forms(void **state) {
  (void)state;
  const char *forms[][2] = {{"-n", "4"}, {"-np", "4"}, {"-n4", NULL}};
  for (int i = 0; i < 3; ++i) {
    char *argv[] = {"tarantella", (char *)forms[i][0], (char *)forms[i][1], "--", "p"};
    char *short_argv[] = {"tarantella", (char *)forms[i][0], "--", "p"};
    tnt__options_t o;
    char err[512];
    if (forms[i][1] != NULL) {
      assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
    } else {
      assert_int_equal(parse(ARGC(short_argv), short_argv, &o, err), TNT__PARSE_RUN);
    }
    assert_int_equal(o.nranks, 4);
    tnt__options_free(&o);
  }
}

static void test_pin_memory_implies_pin(void **state) {
  (void)state;
  char *argv[] = {"tarantella", "--pin-memory-to-socket", "--", "p"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
  assert_true(o.pin_memory_to_socket);
  assert_true(o.pin_to_socket);
  tnt__options_free(&o);
}

static void test_help_and_version(void **state) {
  (void)state;
  char *help[] = {"tarantella", "-n", "2", "--help"};
  char *short_help[] = {"tarantella", "-h"};
  char *version[] = {"tarantella", "--version", "--bogus"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(help), help, &o, err), TNT__PARSE_HELP);
  tnt__options_free(&o);
  assert_int_equal(parse(ARGC(short_help), short_help, &o, err), TNT__PARSE_HELP);
  tnt__options_free(&o);
  assert_int_equal(parse(ARGC(version), version, &o, err), TNT__PARSE_VERSION);
  tnt__options_free(&o);
  assert_non_null(strstr(tnt__usage_text, "--fusion-threshold"));
}

static void test_bare_x_name(void **state) {
  (void)state;
  char *argv[] = {"tarantella", "-x", "HOME", "-x", "_A9=", "--", "p"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
  assert_int_equal(o.num_env, 2);
  assert_string_equal(o.env[0], "HOME");
  assert_string_equal(o.env[1], "_A9=");
  tnt__options_free(&o);
}

static void test_several_assignments_after_one_x(void **state) {
  (void)state;
  char *argv[] = {"tarantella", "--hostfile", "hosts", "-x", "DATASET=/scratch/data",
                  "TF_CPP_MIN_LOG_LEVEL=1", "-x", "HOME", "C=3", "--", "model.py"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
  assert_int_equal(o.num_env, 4);
  assert_string_equal(o.env[0], "DATASET=/scratch/data");
  assert_string_equal(o.env[1], "TF_CPP_MIN_LOG_LEVEL=1");
  assert_string_equal(o.env[2], "HOME");
  assert_string_equal(o.env[3], "C=3");
  assert_string_equal(o.program_argv[0], "model.py");
  tnt__options_free(&o);
  /* A word without '=' after the assignments is no assignment: a program
   * before a forgotten '--' is reported as before. */
  char *forgotten[] = {"tarantella", "-x", "A=1", "B=2", "model.py"};
  expect_error(ARGC(forgotten), forgotten, "unexpected argument 'model.py' before '--'");
  char *bad_name[] = {"tarantella", "-x", "A=1", "B-C=2", "--", "p"};
  expect_error(ARGC(bad_name), bad_name, "-x needs NAME=VALUE");
}

static void test_errors(void **state) {
  (void)state;
  char *unknown[] = {"tarantella", "--bogus", "--", "p"};
  expect_error(ARGC(unknown), unknown, "unknown option '--bogus'");
  char *unknown_short[] = {"tarantella", "-q", "--", "p"};
  expect_error(ARGC(unknown_short), unknown_short, "unknown option '-q'");
  char *no_dashes[] = {"tarantella", "-n", "2", "model.py"};
  expect_error(ARGC(no_dashes), no_dashes, "before '--'");
  char *nothing[] = {"tarantella"};
  expect_error(ARGC(nothing), nothing, "missing '--' and PROGRAM");
  char *no_program[] = {"tarantella", "-n", "2", "--"};
  expect_error(ARGC(no_program), no_program, "missing PROGRAM");
  char *empty_program[] = {"tarantella", "--", ""};
  expect_error(ARGC(empty_program), empty_program, "empty");
  char *both[] = {"tarantella", "-n", "2", "--n-per-node", "2", "--", "p"};
  expect_error(ARGC(both), both, "cannot be combined");
  char *zero[] = {"tarantella", "-n", "0", "--", "p"};
  expect_error(ARGC(zero), zero, "positive whole number");
  char *negative[] = {"tarantella", "-n", "-2", "--", "p"};
  expect_error(ARGC(negative), negative, "positive whole number");
  char *word[] = {"tarantella", "--n-per-node", "two", "--", "p"};
  expect_error(ARGC(word), word, "not 'two'");
  char *huge[] = {"tarantella", "-n", "99999999999999999999", "--", "p"};
  expect_error(ARGC(huge), huge, "positive whole number");
  char *missing_value[] = {"tarantella", "-n"};
  expect_error(ARGC(missing_value), missing_value, "needs a value");
  char *value_is_option[] = {"tarantella", "--hostfile", "--no-gpu", "--", "p"};
  expect_error(ARGC(value_is_option), value_is_option, "--hostfile needs a value");
  char *flag_value[] = {"tarantella", "--no-gpu=yes", "--", "p"};
  expect_error(ARGC(flag_value), flag_value, "takes no value");
  char *level[] = {"tarantella", "--log-level", "VERBOSE", "--", "p"};
  expect_error(ARGC(level), level, "DEBUG, INFO, WARNING or ERROR");
  const char *bad_env[] = {"=v", "1A=b", "A-B=c", "", "A B=c"};
  for (int i = 0; i < 5; ++i) {
    char *argv[] = {"tarantella", "-x", (char *)bad_env[i], "--", "p"};
    expect_error(ARGC(argv), argv, "-x needs NAME=VALUE");
  }
  const char *bad_threshold[] = {"-1", "abc", "nan", "inf", "", "0x10", "1e999", "3KB", "-0.5"};
  for (int i = 0; i < 9; ++i) {
    char *argv[] = {"tarantella", "--fusion-threshold", (char *)bad_threshold[i], "--", "p"};
    expect_error(ARGC(argv), argv, "takes a number from 0 to 1048576, or auto");
  }
  char *empty_file[] = {"tarantella", "--hostfile=", "--", "p"};
  expect_error(ARGC(empty_file), empty_file, "needs the name of a file");
}

static void test_restart_options(void **state) {
  (void)state;
  char *argv[] = {"tarantella", "--max-restarts", "3", "--restart-delay=2.5", "--min-ranks", "2",
                  "--", "m.py"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(argv), argv, &o, err), TNT__PARSE_RUN);
  assert_string_equal(o.max_restarts, "3");
  assert_true(o.restart_delay_s == 2.5);
  assert_string_equal(o.min_ranks, "2");
  tnt__options_free(&o);
  char *none[] = {"tarantella", "--", "m.py"};
  assert_int_equal(parse(ARGC(none), none, &o, err), TNT__PARSE_RUN);
  assert_null(o.max_restarts);
  assert_null(o.min_ranks);
  assert_true(o.restart_delay_s == 0.0);
  tnt__options_free(&o);
  char *zero[] = {"tarantella", "--max-restarts=0", "--restart-delay", "0", "--", "m.py"};
  assert_int_equal(parse(ARGC(zero), zero, &o, err), TNT__PARSE_RUN);
  assert_string_equal(o.max_restarts, "0");
  tnt__options_free(&o);

  char *negative[] = {"tarantella", "--max-restarts", "-1", "--", "m.py"};
  expect_error(ARGC(negative), negative, "--max-restarts takes a whole number from 0 to 1000000");
  char *word[] = {"tarantella", "--max-restarts", "many", "--", "m.py"};
  expect_error(ARGC(word), word, "not 'many'");
  char *fraction[] = {"tarantella", "--max-restarts=1.5", "--", "m.py"};
  expect_error(ARGC(fraction), fraction, "not '1.5'");
  char *no_ranks[] = {"tarantella", "--min-ranks", "0", "--", "m.py"};
  expect_error(ARGC(no_ranks), no_ranks, "--min-ranks takes a whole number from 1 to 1000000");
  char *no_value[] = {"tarantella", "--max-restarts", "--", "m.py"};
  expect_error(ARGC(no_value), no_value, "--max-restarts needs a value");
  const char *bad_delays[] = {"-1", "soon", "1e9", "nan", "inf", "2s", ""};
  for (size_t i = 0; i < sizeof bad_delays / sizeof bad_delays[0]; ++i) {
    char *argv_delay[] = {"tarantella", "--restart-delay", (char *)bad_delays[i], "--", "m.py"};
    expect_error(ARGC(argv_delay), argv_delay,
                 "--restart-delay needs a number of seconds from 0 to 86400");
  }
}

static void test_parse_twice(void **state) {
  (void)state;
  /* No state survives a call: a second parse sees only its own input. */
  char *first[] = {"tarantella", "-x", "A=1", "--no-gpu", "--", "p"};
  char *second[] = {"tarantella", "--", "q"};
  tnt__options_t o;
  char err[512];
  assert_int_equal(parse(ARGC(first), first, &o, err), TNT__PARSE_RUN);
  tnt__options_free(&o);
  assert_int_equal(parse(ARGC(second), second, &o, err), TNT__PARSE_RUN);
  assert_false(o.no_gpu);
  assert_int_equal(o.num_env, 0);
  assert_string_equal(o.program_argv[0], "q");
  tnt__options_free(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_every_option),
      cmocka_unit_test(test_equals_forms_and_aliases),
      cmocka_unit_test(test_rank_count_forms),
      cmocka_unit_test(test_pin_memory_implies_pin),
      cmocka_unit_test(test_help_and_version),
      cmocka_unit_test(test_bare_x_name),
      cmocka_unit_test(test_several_assignments_after_one_x),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_restart_options),
      cmocka_unit_test(test_parse_twice),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
