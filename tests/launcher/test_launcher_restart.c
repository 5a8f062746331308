/* Unit tests of the launcher's rule for "the same error twice in a row". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>

#include "restart.h"

static tnt__rank_status_t ended(int exit_code, int sig) {
  tnt__rank_status_t s;
  memset(&s, 0, sizeof s);
  s.finished = 1;
  s.exit_code = exit_code;
  s.signal = sig;
  return s;
}

static void test_same_exit_and_line(void **state) {
  (void)state;
  tnt__rank_status_t a = ended(1, 0), b = ended(1, 0);
  assert_true(tnt__same_error(&a, "ValueError: bad", &b, "ValueError: bad"));
  assert_false(tnt__same_error(&a, "ValueError: bad", &b, "OSError: disk"));
  tnt__rank_status_t c = ended(2, 0);
  assert_false(tnt__same_error(&a, "ValueError: bad", &c, "ValueError: bad"));
}

static void test_signals(void **state) {
  (void)state;
  /* A fault of the program, twice alike, is the same error. */
  tnt__rank_status_t segv = ended(0, SIGSEGV);
  assert_true(tnt__same_error(&segv, "x", &segv, "x"));
  /* A signal from outside (the OOM killer, a scheduler) never is. */
  tnt__rank_status_t killed = ended(0, SIGKILL), term = ended(0, SIGTERM);
  assert_false(tnt__same_error(&killed, "x", &killed, "x"));
  assert_false(tnt__same_error(&term, "x", &term, "x"));
  tnt__rank_status_t exit1 = ended(1, 0);
  assert_false(tnt__same_error(&segv, "x", &exit1, "x"));
}

static void test_unfinished_is_never_the_same(void **state) {
  (void)state;
  tnt__rank_status_t a = ended(1, 0), b = ended(1, 0);
  b.finished = 0;
  assert_false(tnt__same_error(&a, "", &b, ""));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_exit_and_line),
      cmocka_unit_test(test_signals),
      cmocka_unit_test(test_unfinished_is_never_the_same),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
