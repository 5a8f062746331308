/* Unit tests of the launcher's rule for which host a failed attempt is
 * blamed on (shrink.h), on 3 hosts of 2 ranks each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>

#include "shrink.h"

#define RANKS 6

typedef struct {
  int have[RANKS];
  tnt__rank_status_t status[RANKS];
  tnt__attempt_ranks_t ar;
} attempt_t;

/* Every rank started and was ended at the launcher's request. */
static void healthy(attempt_t *t) {
  memset(t, 0, sizeof *t);
  for (int r = 0; r < RANKS; ++r) {
    t->have[r] = 1;
    t->status[r].finished = 1;
    t->status[r].signal = SIGTERM;
    t->status[r].ended_by_request = 1;
  }
  t->ar = (tnt__attempt_ranks_t){
      .total = RANKS, .per_host = 2, .have = t->have, .status = t->status, .first_failed = -1};
}

static int blame(attempt_t *t, tnt__blame_t *rule, char *why) {
  return tnt__blamed_host(&t->ar, rule, why, 256);
}

static void test_ranks_that_did_not_start(void **state) {
  (void)state;
  attempt_t t;
  tnt__blame_t rule;
  char why[256];
  healthy(&t);
  t.have[3] = 0;
  assert_int_equal(blame(&t, &rule, why), 1);
  assert_int_equal(rule, TNT__BLAME_NOT_STARTED);
  assert_string_equal(why, "its ranks did not start");
  /* Ranks of two hosts did not start: which one is at fault is unknown. */
  t.have[4] = 0;
  assert_int_equal(blame(&t, &rule, why), -1);
  assert_int_equal(rule, TNT__BLAME_NONE);
}

static void test_ranks_that_stopped_answering(void **state) {
  (void)state;
  attempt_t t;
  tnt__blame_t rule;
  char why[256];
  healthy(&t);
  t.status[5].finished = 0;
  /* Even when a rank of another host failed first (a timeout waiting for it). */
  t.status[0].ended_by_request = 0;
  t.status[0].signal = 0;
  t.status[0].exit_code = 1;
  t.ar.first_failed = 0;
  assert_int_equal(blame(&t, &rule, why), 2);
  assert_int_equal(rule, TNT__BLAME_STOPPED_ANSWERING);
  t.status[1].finished = 0;
  assert_int_equal(blame(&t, &rule, why), -1);
}

static void test_signals(void **state) {
  (void)state;
  attempt_t t;
  tnt__blame_t rule;
  char why[256];
  healthy(&t);
  t.status[3].ended_by_request = 0;
  t.status[3].signal = SIGKILL;
  t.ar.first_failed = 3;
  assert_int_equal(blame(&t, &rule, why), 1);
  assert_int_equal(rule, TNT__BLAME_SIGNAL);
  assert_non_null(strstr(why, "its rank 3 was killed by signal 9"));
  /* A fault of the program is not the host's. */
  t.status[3].signal = SIGSEGV;
  assert_int_equal(blame(&t, &rule, why), -1);
  /* Nor is an exit with an error. */
  t.status[3].signal = 0;
  t.status[3].exit_code = 1;
  assert_int_equal(blame(&t, &rule, why), -1);
}

static void test_one_host_is_never_blamed(void **state) {
  (void)state;
  attempt_t t;
  tnt__blame_t rule;
  char why[256];
  healthy(&t);
  t.ar.total = 2;
  t.have[1] = 0;
  assert_int_equal(blame(&t, &rule, why), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ranks_that_did_not_start),
      cmocka_unit_test(test_ranks_that_stopped_answering),
      cmocka_unit_test(test_signals),
      cmocka_unit_test(test_one_host_is_never_blamed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
