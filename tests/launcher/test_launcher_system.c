/* Unit tests of GPU and NUMA discovery (on a fake /dev and /sys), rank
 * status files and the rank wrapper's own parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpus.h"
#include "proc.h"
#include "rank.h"
#include "status.h"

static void touch(const char *root, const char *rel, const char *content) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  assert_int_equal(tnt__mkdirs(dir), 0);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(content, f);
  fclose(f);
}

static void test_visible_devices(void **state) {
  (void)state;
  char list[64];
  assert_int_equal(tnt__gpus_parse_visible("0,1,2", list, sizeof list), 3);
  assert_string_equal(list, "0,1,2");
  assert_int_equal(tnt__gpus_parse_visible("", list, sizeof list), 0);
  assert_int_equal(tnt__gpus_parse_visible("-1", list, sizeof list), 0);
  /* CUDA ignores everything from the first invalid entry on. */
  assert_int_equal(tnt__gpus_parse_visible("3,-1,2", list, sizeof list), 1);
  assert_string_equal(list, "3");
  assert_int_equal(tnt__gpus_parse_visible("2,,1", list, sizeof list), 1);
  assert_int_equal(tnt__gpus_parse_visible("GPU-8a2b,MIG-1c/2", list, sizeof list), 2);
  assert_string_equal(list, "GPU-8a2b,MIG-1c/2");
  char tiny[3];
  assert_int_equal(tnt__gpus_parse_visible("10,11", tiny, sizeof tiny), -1);
}

static void test_gpu_detection(void **state) {
  (void)state;
  char root[] = "/tmp/tnt-gpus-XXXXXX";
  assert_non_null(mkdtemp(root));
  char list[64];
  assert_int_equal(tnt__gpus_detect(root, NULL, list, sizeof list), 0);
  touch(root, "dev/nvidiactl", "");
  touch(root, "dev/nvidia-uvm", "");
  assert_int_equal(tnt__gpus_detect(root, NULL, list, sizeof list), 0);
  touch(root, "dev/nvidia0", "");
  touch(root, "dev/nvidia1", "");
  touch(root, "dev/nvidia2", "");
  assert_int_equal(tnt__gpus_detect(root, NULL, list, sizeof list), 3);
  assert_string_equal(list, "0,1,2");
  assert_int_equal(tnt__gpus_detect(root, "2,0", list, sizeof list), 2);
  assert_string_equal(list, "2,0");
  assert_int_equal(tnt__gpus_detect(root, "", list, sizeof list), 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
}

static void test_numa(void **state) {
  (void)state;
  char root[] = "/tmp/tnt-numa-XXXXXX";
  assert_non_null(mkdtemp(root));
  cpu_set_t set;
  assert_int_equal(tnt__numa_node_count(root), 0);
  assert_int_equal(tnt__numa_node_cpus(root, 0, &set), -1);
  touch(root, "sys/devices/system/node/node0/cpulist", "0-3,8-11\n");
  touch(root, "sys/devices/system/node/node1/cpulist", "4-7,12\n");
  touch(root, "sys/devices/system/node/possible", "0-1\n");
  assert_int_equal(tnt__numa_node_count(root), 2);
  assert_int_equal(tnt__numa_node_cpus(root, 1, &set), 0);
  assert_int_equal(CPU_COUNT(&set), 5);
  assert_true(CPU_ISSET(12, &set));
  assert_false(CPU_ISSET(3, &set));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);

  assert_int_equal(tnt__cpulist_parse("0", &set), 0);
  assert_int_equal(CPU_COUNT(&set), 1);
  assert_int_equal(tnt__cpulist_parse("", &set), -1);
  assert_int_equal(tnt__cpulist_parse("3-1", &set), -1);
  assert_int_equal(tnt__cpulist_parse("a", &set), -1);
  assert_int_equal(tnt__cpulist_parse("1,,2", &set), -1);
  assert_int_equal(tnt__cpulist_parse("0-99999999", &set), -1);
}

static void test_status_round_trip(void **state) {
  (void)state;
  tnt__rank_status_t s = {.rank = 3,
                          .pid = 1234,
                          .wrapper_pid = 1233,
                          .finished = 1,
                          .signal = 9,
                          .ended_by_request = 0,
                          .end_time = 1700000000.25};
  strcpy(s.host, "node-b");
  char text[512];
  tnt__status_format(&s, text, sizeof text);
  tnt__rank_status_t r;
  assert_int_equal(tnt__status_parse(text, &r), 0);
  assert_int_equal(r.rank, 3);
  assert_string_equal(r.host, "node-b");
  assert_int_equal(r.pid, 1234);
  assert_true(r.finished);
  assert_int_equal(r.signal, 9);
  assert_true(r.end_time == 1700000000.25);
  assert_true(tnt__status_failed(&r));
  char how[128];
  tnt__status_describe(&r, how, sizeof how);
  assert_non_null(strstr(how, "killed by signal 9"));
  assert_int_equal(tnt__status_parse("rank=1\nhost=x\n", &r), -1);
  assert_int_equal(tnt__status_parse("", &r), -1);

  char dir[] = "/tmp/tnt-status-XXXXXX";
  assert_non_null(mkdtemp(dir));
  assert_int_equal(tnt__status_read(dir, 3, &r), -1);
  assert_int_equal(tnt__status_write(dir, &s), 0);
  assert_int_equal(tnt__status_read(dir, 3, &r), 0);
  assert_string_equal(r.host, "node-b");
  /* Progress files: a rank's program makes its own once it completed a step. */
  char progress[256];
  tnt__progress_path(dir, 1, progress, sizeof progress);
  assert_false(tnt__status_progressed(dir, 4));
  FILE *f = fopen(progress, "w");
  assert_non_null(f);
  fclose(f);
  assert_false(tnt__status_progressed(dir, 1));
  assert_true(tnt__status_progressed(dir, 2));
  /* An earlier run's files are removed before a new one starts. */
  tnt__status_remove(dir, 1);
  tnt__status_remove(dir, 3);
  assert_false(tnt__status_progressed(dir, 4));
  assert_int_equal(tnt__status_read(dir, 3, &r), -1);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_rank_options(void **state) {
  (void)state;
  char *argv[] = {
      "tarantella", "--rank-exec", "--run-dir", "/r", "--gpus", "0,1", "--pin-memory-to-socket",
      "--",         "prog",        "--x"};
  tnt__rank_options_t o;
  char err[256];
  assert_int_equal(tnt__rank_options_parse(10, argv, &o, err, sizeof err), 0);
  assert_string_equal(o.run_dir, "/r");
  assert_string_equal(o.gpus, "0,1");
  assert_true(o.pin_to_socket);
  assert_string_equal(o.program_argv[0], "prog");
  assert_null(o.restart_count);
  char *restarted[] = {"tarantella", "--rank-exec", "--run-dir", "/r/attempt3", "--restart-count",
                       "2", "--cpu", "--", "prog"};
  assert_int_equal(tnt__rank_options_parse(9, restarted, &o, err, sizeof err), 0);
  assert_string_equal(o.restart_count, "2");
  assert_string_equal(o.run_dir, "/r/attempt3");
  char *missing[] = {"tarantella", "--rank-exec", "--cpu", "--", "prog"};
  assert_int_equal(tnt__rank_options_parse(5, missing, &o, err, sizeof err), -1);

  char gpu[16];
  tnt__rank_pick_gpu("4,5,6", 0, gpu, sizeof gpu);
  assert_string_equal(gpu, "4");
  tnt__rank_pick_gpu("4,5,6", 2, gpu, sizeof gpu);
  assert_string_equal(gpu, "6");
  tnt__rank_pick_gpu("4,5,6", 3, gpu, sizeof gpu);
  assert_string_equal(gpu, "");
}

static void test_which_and_capture(void **state) {
  (void)state;
  char path[256];
  assert_int_equal(tnt__which("sh", "/nonexistent:/bin:/usr/bin", path, sizeof path), 0);
  assert_non_null(strstr(path, "/sh"));
  assert_int_equal(tnt__which("no-such-tool-anywhere", "/bin", path, sizeof path), -1);
  char out[64];
  char *echo[] = {"sh", "-c", "echo hello; exit 3", NULL};
  assert_int_equal(tnt__capture(echo, out, sizeof out, 10), 3);
  assert_string_equal(out, "hello\n");
  /* A command that hangs is killed at its deadline. */
  char *hang[] = {"sleep", "30", NULL};
  double start = tnt__clock();
  assert_int_equal(tnt__capture(hang, out, sizeof out, 1), -1);
  assert_true(tnt__clock() - start < 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_visible_devices),
      cmocka_unit_test(test_gpu_detection),
      cmocka_unit_test(test_numa),
      cmocka_unit_test(test_status_round_trip),
      cmocka_unit_test(test_rank_options),
      cmocka_unit_test(test_which_and_capture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
