/* Unit tests of the parsers of a Slurm allocation's host list and task counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "slurm.h"

/* Expands text and compares the names with the space-separated expected. */
static void expect_hosts(const char *text, const char *expected) {
  tnt__hostlist_t list;
  char err[512] = "";
  if (tnt__slurm_hostlist_parse(text, &list, err, sizeof err) != 0) {
    fail_msg("'%s' was refused: %s", text, err);
  }
  char joined[4096] = "";
  size_t used = 0;
  for (int i = 0; i < list.count; ++i) {
    used += (size_t)snprintf(joined + used, sizeof joined - used, "%s%s", i > 0 ? " " : "",
                             list.names[i]);
    assert_int_equal(list.lines[i], i + 1);
  }
  assert_string_equal(joined, expected);
  tnt__hostlist_free(&list);
}

static void expect_host_error(const char *text, const char *expected) {
  tnt__hostlist_t list;
  char err[512] = "";
  assert_int_equal(tnt__slurm_hostlist_parse(text, &list, err, sizeof err), -1);
  if (strstr(err, expected) == NULL) fail_msg("'%s': message '%s' lacks '%s'", text, err, expected);
  assert_int_equal(list.count, 0);
  tnt__hostlist_free(&list);
}

static void test_plain_names(void **state) {
  (void)state;
  expect_hosts("node1", "node1");
  expect_hosts("node1,gpu5,login.example.org", "node1 gpu5 login.example.org");
  expect_hosts("tnt-sim-abc-a,tnt-sim-abc-b", "tnt-sim-abc-a tnt-sim-abc-b");
}

static void test_ranges(void **state) {
  (void)state;
  expect_hosts("node[01-03,07],gpu5", "node01 node02 node03 node07 gpu5");
  expect_hosts("n[1-3]", "n1 n2 n3");
  /* The width of a range is that of its first number. */
  expect_hosts("n[8-10]", "n8 n9 n10");
  expect_hosts("n[098-101]", "n098 n099 n100 n101");
  expect_hosts("n[5]", "n5");
  expect_hosts("n[7,3]", "n7 n3");
  /* Text after the brackets, and several groups: the leftmost varies slowest. */
  expect_hosts("rack[1-2]-node[3-4].ib",
               "rack1-node3.ib rack1-node4.ib rack2-node3.ib rack2-node4.ib");
  expect_hosts("[1-2]x", "1x 2x");
  expect_hosts("a[1-2],b,c[10-11]", "a1 a2 b c10 c11");
}

static void test_many_hosts(void **state) {
  (void)state;
  tnt__hostlist_t list;
  char err[512];
  assert_int_equal(tnt__slurm_hostlist_parse("n[00000-29999],m[1-3]", &list, err, sizeof err), 0);
  assert_int_equal(list.count, 30003);
  assert_string_equal(list.names[0], "n00000");
  assert_string_equal(list.names[29999], "n29999");
  assert_string_equal(list.names[30002], "m3");
  tnt__hostlist_free(&list);
}

static void test_malformed_host_lists(void **state) {
  (void)state;
  expect_host_error("", "no host names");
  expect_host_error("a,,b", "an empty item");
  expect_host_error("a,b,", "an empty item");
  expect_host_error(",a", "an empty item");
  expect_host_error("node[1-3", "'node[1-3': '[' without its ']'");
  expect_host_error("node[1-3,b", "'[' without its ']'");
  expect_host_error("node1-3]", "'node1-3]': ']' without its '['");
  expect_host_error("n[1[2]]", "'[' without its ']'");
  expect_host_error("node[]", "'node[]': empty brackets");
  expect_host_error("node[3-1]", "'node[3-1]': the range 3-1 runs backwards");
  expect_host_error("node[a-b]", "'node[a-b]': 'a-b' in brackets is not a number");
  expect_host_error("node[1-]", "'1-' in brackets is not a number");
  expect_host_error("node[-2]", "'-2' in brackets is not a number");
  expect_host_error("node[1,]", "in brackets is not a number");
  expect_host_error("node[,1]", "in brackets is not a number");
  expect_host_error("node[1 - 2]", "in brackets is not a number");
  expect_host_error("node[1234567890]", "at most 9 digits");
  expect_host_error("node1 node2", "'node1 node2' is not a host name: ' ' is not allowed");
  expect_host_error("a:2", "':' is not allowed");
  expect_host_error("-oProxyCommand", "it starts with '-'");
  expect_host_error("n[1-3],n2", "host 'n2' is listed twice");
  expect_host_error("N1,n1", "is listed twice");
  expect_host_error("n[0-100000]", "more than 100000 hosts");
  expect_host_error("n[0-999],m[0-999],k[0-99999]", "more than 100000 hosts");
  expect_host_error("a[0-999]b[0-999]", "more than 100000 hosts");
  char long_name[300];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  expect_host_error(long_name, "longer than 253");
  /* A name that grows too long only once expanded. */
  char grows[300];
  memset(grows, 'a', 250);
  strcpy(grows + 250, "[1000-1001]");
  expect_host_error(grows, "a host name longer than 253 characters");
}

static void expect_tasks(const char *text, int nodes, int min, int max) {
  int n = -1, lo = -1, hi = -1;
  char err[512] = "";
  if (tnt__slurm_tasks_parse(text, &n, &lo, &hi, err, sizeof err) != 0) {
    fail_msg("'%s' was refused: %s", text, err);
  }
  assert_int_equal(n, nodes);
  assert_int_equal(lo, min);
  assert_int_equal(hi, max);
}

static void expect_tasks_error(const char *text, const char *expected) {
  int n, lo, hi;
  char err[512] = "";
  assert_int_equal(tnt__slurm_tasks_parse(text, &n, &lo, &hi, err, sizeof err), -1);
  if (strstr(err, expected) == NULL) fail_msg("'%s': message '%s' lacks '%s'", text, err, expected);
}

static void test_tasks(void **state) {
  (void)state;
  expect_tasks("2", 1, 2, 2);
  expect_tasks("2(x3)", 3, 2, 2);
  expect_tasks("2(x3),1", 4, 1, 2);
  expect_tasks("4,4,4", 3, 4, 4);
  expect_tasks("1,8(x2),3", 4, 1, 8);
  expect_tasks("16(x1000)", 1000, 16, 16);
}

static void test_malformed_tasks(void **state) {
  (void)state;
  const char *hint = "is not a task count (a number from 1, or N(xM) for M nodes";
  expect_tasks_error("", hint);
  expect_tasks_error("x", "'x' is not a task count");
  expect_tasks_error("0", "'0' is not a task count");
  expect_tasks_error("2(x0)", "'2(x0)' is not a task count");
  expect_tasks_error("2(x3", "'2(x3' is not a task count");
  expect_tasks_error("2(3)", "'2(3)' is not a task count");
  expect_tasks_error("2(x3)4", "'2(x3)4' is not a task count");
  expect_tasks_error("2,", "'' is not a task count");
  expect_tasks_error("2,,1", "'' is not a task count");
  expect_tasks_error("-1", "'-1' is not a task count");
  expect_tasks_error("2 (x3)", "'2 (x3)' is not a task count");
  expect_tasks_error("1234567890", "'1234567890' is not a task count");
  expect_tasks_error("1(x99999),1(x2)", "task counts for more than 100000 nodes");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain_names), cmocka_unit_test(test_ranges),
      cmocka_unit_test(test_many_hosts),  cmocka_unit_test(test_malformed_host_lists),
      cmocka_unit_test(test_tasks),       cmocka_unit_test(test_malformed_tasks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
