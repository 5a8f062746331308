/* Unit tests of the launcher's sorting of the MPI launcher's stderr
 * (mpi_messages.h): Open MPI's framed notices and crash reports go to the
 * run directory's log; the ranks' output stays on the terminal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "mpi_messages.h"

static int sorted(const char *line, int *in_frame) {
  return tnt__mpi_message_line(line, strlen(line), in_frame);
}

#define FRAME "--------------------------------------------------------------------------"

static void test_framed_notice(void **state) {
  (void)state;
  int in_frame = 0;
  assert_false(sorted("Epoch 1/2", &in_frame));
  assert_true(sorted(FRAME, &in_frame));
  assert_true(sorted("ORTE has lost communication with a remote daemon.", &in_frame));
  assert_true(sorted("", &in_frame));
  assert_true(sorted(FRAME, &in_frame));
  assert_false(in_frame);
  assert_false(sorted("[tnt 0/2] INFO: training: global batch size 64", &in_frame));
  /* A line of dashes of another length is the program's. */
  assert_false(sorted("-----", &in_frame));
  assert_false(sorted(FRAME "-", &in_frame));
}

static void test_crash_report(void **state) {
  (void)state;
  int in_frame = 0;
  assert_true(sorted("[vm:01234] *** Process received signal ***", &in_frame));
  assert_true(
      sorted("[node-1.cluster:77] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)", &in_frame));
  assert_false(in_frame);
  /* Brackets of the program's own output. */
  assert_false(sorted("[tnt 1/2] ERROR: allreduce timed out", &in_frame));
  assert_false(sorted("[a:b] not a pid", &in_frame));
  assert_false(sorted("[host:12]no space after", &in_frame));
  assert_false(sorted("[:12] no host", &in_frame));
  assert_false(sorted("[host:] no pid", &in_frame));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_framed_notice),
      cmocka_unit_test(test_crash_report),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
