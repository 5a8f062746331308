/*
 * Tests of the fusion set's tuner (src/fusion/tuner.c): the candidates of
 * each kind of tuning, the schedule of plans by round, the fastest
 * candidate by the timings, and that the master's choice, not this rank's
 * own timings, is kept.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fusion/tuner.h"

#define KB 1024u

/* Runs the trying rounds, the candidates taking turns, candidate c's
 * rounds taking times[c] seconds (its first, its later ones 1 s slower)
 * and checking that each round runs candidate c's plan; returns the rounds
 * after which the threshold changed. */
static int try_all(tnt__tuner_t *t, const double *times) {
  int changes = 0;
  assert_int_equal(tnt__tuner_plan(t).threshold, t->candidates[0].threshold);
  assert_int_equal(tnt__tuner_plan(t).hold, t->candidates[0].hold);
  for (int w = 0; w < TNT__TUNER_WARMUP; w++) {
    changes += tnt__tuner_end_round(t, 100.0, -1); /* warm-up, not timed */
  }
  for (int r = 0; r < TNT__TUNER_ROUNDS; r++) {
    for (int c = 0; c < t->ncandidates; c++) {
      assert_int_equal(tnt__tuner_phase(t), TNT__TUNER_TRYING);
      assert_int_equal(tnt__tuner_plan(t).threshold, t->candidates[c].threshold);
      assert_int_equal(tnt__tuner_plan(t).hold, t->candidates[c].hold);
      changes += tnt__tuner_end_round(t, times[c] + (r == 0 ? 0.0 : 1.0), -1);
    }
  }
  assert_int_equal(tnt__tuner_phase(t), TNT__TUNER_DECIDING);
  return changes;
}

static void test_threshold_schedule_and_fastest(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t, 1, 0, 0, 0);
  assert_int_equal(t.ncandidates, TNT__TUNER_NTHRESHOLDS);
  for (int c = 0; c < t.ncandidates; c++) {
    assert_int_equal(t.candidates[c].threshold, TNT__TUNER_THRESHOLDS_KB[c] * KB);
    assert_int_equal(t.candidates[c].hold, 0);
  }
  assert_int_equal(tnt__tuner_rounds(&t),
                   TNT__TUNER_WARMUP + TNT__TUNER_ROUNDS * TNT__TUNER_NTHRESHOLDS + 1);
  const double times[TNT__TUNER_NTHRESHOLDS] = {0.5, 0.4, 0.3, 0.3, 0.6};
  /* The threshold changes after every trying round but the last (the
   * deciding round keeps the last candidate's plan). */
  assert_int_equal(try_all(&t, times), TNT__TUNER_ROUNDS * TNT__TUNER_NTHRESHOLDS - 1);
  assert_int_equal(tnt__tuner_plan(&t).threshold, 8192 * KB);
  /* Fastest rounds count; the earlier candidate wins the tie. */
  assert_true(t.best_s[0] == 0.5 && t.best_s[2] == 0.3);
  assert_int_equal(tnt__tuner_fastest(&t), 2);
  /* The master's choice is kept, whatever this rank measured. */
  assert_int_equal(tnt__tuner_end_round(&t, 1.0, 1), 1);
  assert_int_equal(tnt__tuner_phase(&t), TNT__TUNER_DONE);
  assert_int_equal(tnt__tuner_plan(&t).threshold, 128 * KB);
  for (int r = 0; r < 5; r++) assert_int_equal(tnt__tuner_end_round(&t, 0.1, 3), 0);
  assert_int_equal(tnt__tuner_plan(&t).threshold, 128 * KB);
}

static void test_keeping_the_last_candidate_needs_no_replan(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t, 1, 0, 0, 0);
  const double times[TNT__TUNER_NTHRESHOLDS] = {0.5, 0.5, 0.5, 0.5, 0.1};
  try_all(&t, times);
  assert_int_equal(tnt__tuner_fastest(&t), TNT__TUNER_NTHRESHOLDS - 1);
  assert_int_equal(tnt__tuner_end_round(&t, 0.1, TNT__TUNER_NTHRESHOLDS - 1), 0);
  assert_int_equal(tnt__tuner_plan(&t).threshold, 8192 * KB);
}

static void test_out_of_range_choice_keeps_the_first(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t, 1, 0, 0, 0);
  const double times[TNT__TUNER_NTHRESHOLDS] = {0.5, 0.5, 0.5, 0.5, 0.5};
  try_all(&t, times);
  assert_int_equal(tnt__tuner_fastest(&t), 0);
  tnt__tuner_end_round(&t, 0.1, 99);
  assert_int_equal(tnt__tuner_plan(&t).threshold, 32 * KB);
}

/* Overlap alone: on, then off, with the set's threshold; the plan keeps
 * its buckets (no replan) whichever wins. */
static void test_overlap_alone(void **state) {
  (void)state;
  for (int master = 0; master < 2; master++) {
    tnt__tuner_t t;
    tnt__tuner_init(&t, 0, 64 * KB, 1, 0);
    assert_int_equal(t.ncandidates, 2);
    assert_int_equal(tnt__tuner_rounds(&t), TNT__TUNER_WARMUP + TNT__TUNER_ROUNDS * 2 + 1);
    assert_int_equal(t.candidates[0].hold, 0);
    assert_int_equal(t.candidates[1].hold, 1);
    const double times[2] = {0.3, 0.2};
    assert_int_equal(try_all(&t, times), 0);
    assert_int_equal(tnt__tuner_fastest(&t), 1);
    assert_int_equal(tnt__tuner_end_round(&t, 0.1, master), 0);
    assert_int_equal(tnt__tuner_phase(&t), TNT__TUNER_DONE);
    assert_int_equal(tnt__tuner_plan(&t).threshold, 64 * KB);
    assert_int_equal(tnt__tuner_plan(&t).hold, master);
  }
}

/* Both: every threshold with overlap on, then off. */
static void test_threshold_and_overlap(void **state) {
  (void)state;
  tnt__tuner_t t;
  tnt__tuner_init(&t, 1, 0, 1, 0);
  assert_int_equal(t.ncandidates, 2 * TNT__TUNER_NTHRESHOLDS);
  assert_int_equal(tnt__tuner_rounds(&t),
                   TNT__TUNER_WARMUP + TNT__TUNER_ROUNDS * 2 * TNT__TUNER_NTHRESHOLDS + 1);
  for (int c = 0; c < t.ncandidates; c++) {
    assert_int_equal(t.candidates[c].threshold, TNT__TUNER_THRESHOLDS_KB[c / 2] * KB);
    assert_int_equal(t.candidates[c].hold, c % 2);
  }
  double times[2 * TNT__TUNER_NTHRESHOLDS];
  for (int c = 0; c < t.ncandidates; c++) times[c] = 0.5;
  times[5] = 0.1; /* 512 KiB, overlap off */
  /* Within a turn the threshold changes 4 times, and once between turns. */
  assert_int_equal(try_all(&t, times),
                   TNT__TUNER_ROUNDS * (TNT__TUNER_NTHRESHOLDS - 1) + TNT__TUNER_ROUNDS - 1);
  assert_int_equal(tnt__tuner_fastest(&t), 5);
  assert_int_equal(tnt__tuner_end_round(&t, 0.1, 5), 1);
  assert_int_equal(tnt__tuner_plan(&t).threshold, 512 * KB);
  assert_int_equal(tnt__tuner_plan(&t).hold, 1);
}

/* Nothing to tune: done from the first round, with the set's own plan. */
static void test_nothing_to_tune(void **state) {
  (void)state;
  for (int hold = 0; hold < 2; hold++) {
    tnt__tuner_t t;
    tnt__tuner_init(&t, 0, 7, 0, hold);
    assert_int_equal(tnt__tuner_rounds(&t), 0);
    assert_int_equal(tnt__tuner_phase(&t), TNT__TUNER_DONE);
    assert_int_equal(tnt__tuner_end_round(&t, 0.1, 1), 0);
    assert_int_equal(tnt__tuner_plan(&t).threshold, 7);
    assert_int_equal(tnt__tuner_plan(&t).hold, hold);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threshold_schedule_and_fastest),
      cmocka_unit_test(test_keeping_the_last_candidate_needs_no_replan),
      cmocka_unit_test(test_out_of_range_choice_keeps_the_first),
      cmocka_unit_test(test_overlap_alone),
      cmocka_unit_test(test_threshold_and_overlap),
      cmocka_unit_test(test_nothing_to_tune),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
