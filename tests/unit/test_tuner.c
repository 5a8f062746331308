/*
 * Tests of the fusion threshold tuner (src/fusion/tuner.c): the schedule of
 * candidate thresholds by round, the fastest candidate by the timings, and
 * that the master's choice, not this rank's own timings, is kept.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fusion/tuner.h"

#define KB 1024u

/* Runs the trying rounds, candidate c's rounds taking times[c] seconds
 * (the first of each pair, the second 1 s slower); returns the rounds
 * after which the threshold changed. */
static int try_all(tnt__tuner_t *t, const double *times) {
  int changes = 0;
  assert_int_equal(tnt__tuner_threshold(t), 32 * KB);
  changes += tnt__tuner_end_round(t, 100.0, -1); /* warm-up, not timed */
  for (int c = 0; c < TNT__TUNER_NCANDIDATES; c++) {
    for (int r = 0; r < TNT__TUNER_ROUNDS; r++) {
      assert_int_equal(tnt__tuner_phase(t), TNT__TUNER_TRYING);
      assert_int_equal(tnt__tuner_threshold(t), TNT__TUNER_CANDIDATES_KB[c] * KB);
      changes += tnt__tuner_end_round(t, times[c] + (r == 0 ? 0.0 : 1.0), -1);
    }
  }
  assert_int_equal(tnt__tuner_phase(t), TNT__TUNER_DECIDING);
  return changes;
}

static void test_schedule_and_fastest(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t);
  const double times[TNT__TUNER_NCANDIDATES] = {0.5, 0.4, 0.3, 0.3, 0.6};
  /* The threshold changes after the last round of each candidate but the
   * last (the deciding round keeps the last candidate's plan). */
  assert_int_equal(try_all(&t, times), TNT__TUNER_NCANDIDATES - 1);
  assert_int_equal(tnt__tuner_threshold(&t), 8192 * KB);
  /* Fastest rounds count; the smaller threshold wins the tie. */
  assert_true(t.best_s[0] == 0.5 && t.best_s[2] == 0.3);
  assert_int_equal(tnt__tuner_fastest(&t), 2);
  /* The master's choice is kept, whatever this rank measured. */
  assert_int_equal(tnt__tuner_end_round(&t, 1.0, 1), 1);
  assert_int_equal(tnt__tuner_phase(&t), TNT__TUNER_DONE);
  assert_int_equal(tnt__tuner_threshold(&t), 128 * KB);
  for (int r = 0; r < 5; r++) assert_int_equal(tnt__tuner_end_round(&t, 0.1, 3), 0);
  assert_int_equal(tnt__tuner_threshold(&t), 128 * KB);
}

static void test_keeping_the_last_candidate_needs_no_replan(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t);
  const double times[TNT__TUNER_NCANDIDATES] = {0.5, 0.5, 0.5, 0.5, 0.1};
  try_all(&t, times);
  assert_int_equal(tnt__tuner_fastest(&t), TNT__TUNER_NCANDIDATES - 1);
  assert_int_equal(tnt__tuner_end_round(&t, 0.1, TNT__TUNER_NCANDIDATES - 1), 0);
  assert_int_equal(tnt__tuner_threshold(&t), 8192 * KB);
}

static void test_out_of_range_choice_keeps_the_first(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t);
  const double times[TNT__TUNER_NCANDIDATES] = {0.5, 0.5, 0.5, 0.5, 0.5};
  try_all(&t, times);
  assert_int_equal(tnt__tuner_fastest(&t), 0);
  tnt__tuner_end_round(&t, 0.1, 99);
  assert_int_equal(tnt__tuner_threshold(&t), 32 * KB);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_and_fastest),
      cmocka_unit_test(test_keeping_the_last_candidate_needs_no_replan),
      cmocka_unit_test(test_out_of_range_choice_keeps_the_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
