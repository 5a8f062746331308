/* Unit tests of the hostfile parser and the check for this host's names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "hostfile.h"

static int parse_text(const char *text, tnt__hostlist_t *list, char *err) {
  return tnt__hostfile_parse(text, strlen(text), list, err, 512);
}

static void expect_error(const char *text, size_t len, const char *expected) {
  tnt__hostlist_t list;
  char err[512];
  assert_int_equal(tnt__hostfile_parse(text, len, &list, err, sizeof err), -1);
  if (strstr(err, expected) == NULL) fail_msg("message '%s' lacks '%s'", err, expected);
  assert_int_equal(list.count, 0);
  tnt__hostlist_free(&list);
}

static void test_plain(void **state) {
  (void)state;
  tnt__hostlist_t list;
  char err[512];
  assert_int_equal(parse_text("node1\nnode2\n", &list, err), 0);
  assert_int_equal(list.count, 2);
  assert_string_equal(list.names[0], "node1");
  assert_string_equal(list.names[1], "node2");
  assert_int_equal(list.lines[1], 2);
  tnt__hostlist_free(&list);
}

static void test_comments_blanks_and_spacing(void **state) {
  (void)state;
  const char *text =
      "# the cluster\n"
      "\n"
      "   node-a.example.org   # first\r\n"
      "\t\n"
      "node_b\r\n"
      "#node-c\n"
      "10.1.2.3";
  tnt__hostlist_t list;
  char err[512];
  assert_int_equal(parse_text(text, &list, err), 0);
  assert_int_equal(list.count, 3);
  assert_string_equal(list.names[0], "node-a.example.org");
  assert_int_equal(list.lines[0], 3);
  assert_string_equal(list.names[1], "node_b");
  assert_string_equal(list.names[2], "10.1.2.3");
  assert_int_equal(list.lines[2], 7);
  tnt__hostlist_free(&list);
}

static void test_empty(void **state) {
  (void)state;
  expect_error("", 0, "no host names");
  expect_error("\n\n  \n", 5, "no host names");
  expect_error("# only a comment\n", 17, "no host names");
}

static void test_duplicates(void **state) {
  (void)state;
  const char *text = "a\nb\nc\nb\nA\n";
  expect_error(text, strlen(text), "line 4: host 'b' is already listed on line 2");
  /* Names compare without regard to case, as DNS does. */
  const char *cased = "Node1\nnode2\nNODE1\n";
  expect_error(cased, strlen(cased), "line 3: host 'NODE1' is already listed on line 1");
  const char *three = "x\nx\nx\n";
  expect_error(three, strlen(three), "line 2: host 'x' is already listed on line 1");
}

static void test_bad_lines(void **state) {
  (void)state;
  const char *slots = "node1 slots=4\n";
  expect_error(slots, strlen(slots), "line 1: expected one host name");
  const char *chars = "ok\nno'quote\n";
  expect_error(chars, strlen(chars), "line 2: 'no'quote' is not a host name");
  const char *colon = "node1:4\n";
  expect_error(colon, strlen(colon), "':' is not allowed");
  const char *dash = "-n\n";
  expect_error(dash, strlen(dash), "starts with '-'");
  const char nul[] = "node1\nno\0de\n";
  expect_error(nul, sizeof nul - 1, "line 2: contains a NUL byte");
  const char binary[] = "\x7f\x45LF\n";
  expect_error(binary, sizeof binary - 1, "byte 0x7f");
  char long_name[300];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  expect_error(long_name, strlen(long_name), "longer than 253");
}

static void test_local_names(void **state) {
  (void)state;
  assert_true(tnt__host_is_local("localhost", "vm"));
  assert_true(tnt__host_is_local("LOCALHOST", "vm"));
  assert_true(tnt__host_is_local("127.0.0.1", "vm"));
  assert_true(tnt__host_is_local("vm", "vm"));
  assert_true(tnt__host_is_local("vm", "vm.example.org"));
  assert_true(tnt__host_is_local("vm.example.org", "vm"));
  assert_false(tnt__host_is_local("vm2", "vm"));
  assert_false(tnt__host_is_local("vm.other.org", "vm.example.org"));
  assert_false(tnt__host_is_local("node", ""));

  tnt__hostlist_t list;
  char err[512];
  assert_int_equal(parse_text("localhost\nnode1\n", &list, err), 0);
  assert_int_equal(tnt__hostlist_check_local(&list, "vm", err, sizeof err), 0);
  tnt__hostlist_free(&list);
  assert_int_equal(parse_text("localhost\nnode1\nvm\n", &list, err), 0);
  assert_int_equal(tnt__hostlist_check_local(&list, "vm", err, sizeof err), -1);
  assert_non_null(strstr(err, "line 3: 'vm' and 'localhost' on line 1 both name this host"));
  tnt__hostlist_free(&list);
}

static void test_many_hosts(void **state) {
  (void)state;
  char text[20000];
  size_t used = 0;
  for (int i = 0; i < 1000; ++i) used += (size_t)snprintf(text + used, 20, "n%04d\n", i);
  tnt__hostlist_t list;
  char err[512];
  assert_int_equal(tnt__hostfile_parse(text, used, &list, err, sizeof err), 0);
  assert_int_equal(list.count, 1000);
  assert_string_equal(list.names[999], "n0999");
  tnt__hostlist_free(&list);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain),      cmocka_unit_test(test_comments_blanks_and_spacing),
      cmocka_unit_test(test_empty),      cmocka_unit_test(test_duplicates),
      cmocka_unit_test(test_bad_lines),  cmocka_unit_test(test_local_names),
      cmocka_unit_test(test_many_hosts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
