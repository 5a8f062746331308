/* Unit tests of the MPI command built from a launch plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "strvec.h"

static char *test_environ[] = {
    "PATH=/usr/bin:/bin",  "HOME=/root", "TNT_TIMEOUT_S=20",         "TF_CPP_MIN_LOG_LEVEL=2",
    "TNT_LOG_LEVEL=ERROR", "OTHER=1",    "LD_LIBRARY_PATH=/opt/lib", NULL};

/* Joins the command into one line, words separated by single spaces. */
static char *join(const tnt__strvec_t *v) {
  size_t len = 1;
  for (size_t i = 0; i < v->count; ++i) len += strlen(v->items[i]) + 1;
  char *s = calloc(1, len);
  for (size_t i = 0; i < v->count; ++i) {
    if (i > 0) strcat(s, " ");
    strcat(s, v->items[i]);
  }
  return s;
}

static void base_plan(tnt__launch_plan_t *p, tnt__options_t *o, char **program_argv, int argc) {
  memset(o, 0, sizeof *o);
  o->program_argv = program_argv;
  o->program_argc = argc;
  memset(p, 0, sizeof *p);
  p->opts = o;
  p->flavor = TNT__MPI_OPEN_MPI;
  p->mpirun = "/usr/bin/mpirun";
  p->self = "/usr/local/bin/tarantella";
  p->run_dir = "/w/run";
  p->workdir = "/w";
  p->cores = 2;
  p->per_host = 2;
  p->total = 2;
  p->interpreter = "/usr/bin/python3";
  p->program = "model.py";
  p->envp = test_environ;
}

static void test_local_open_mpi(void **state) {
  (void)state;
  char *prog[] = {"model.py", "--epochs", "1"};
  tnt__options_t o;
  tnt__launch_plan_t p;
  tnt__command_t cmd;
  char err[512];
  base_plan(&p, &o, prog, 3);
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), 0);
  char *line = join(&cmd.argv);
  assert_string_equal(line,
                      "/usr/bin/mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x PATH "
                      "-x TF_CPP_MIN_LOG_LEVEL -x TNT_LOG_LEVEL -x TNT_TIMEOUT_S --wdir /w "
                      "/usr/local/bin/tarantella --rank-exec --run-dir /w/run --cpu -- "
                      "/usr/bin/python3 model.py --epochs 1");
  free(line);
  /* Only TNT_*, TF_*, PATH, PYTHONPATH and LD_LIBRARY_PATH, sorted. */
  assert_int_equal(cmd.env.count, 5);
  assert_string_equal(cmd.env.items[0], "LD_LIBRARY_PATH=/opt/lib");
  assert_string_equal(cmd.env.items[3], "TNT_LOG_LEVEL=ERROR");
  tnt__command_free(&cmd);
}

/* An attempt of a job with restarts: the wrapper learns its restart count,
 * and --max-restarts reaches the registry as a command-line setting. */
static void test_restart_attempt(void **state) {
  (void)state;
  char *prog[] = {"model.py"};
  tnt__options_t o;
  tnt__launch_plan_t p;
  tnt__command_t cmd;
  char err[512];
  base_plan(&p, &o, prog, 1);
  p.run_dir = "/w/run/attempt3";
  p.attempt = 3;
  o.max_restarts = "4";
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), 0);
  char *line = join(&cmd.argv);
  assert_non_null(
      strstr(line, "--rank-exec --run-dir /w/run/attempt3 --restart-count 2 --cpu -- "));
  free(line);
  int found = 0;
  for (size_t i = 0; i < cmd.env.count; ++i) {
    found += strcmp(cmd.env.items[i], "TNT_MAX_RESTARTS=4") == 0;
    found += strcmp(cmd.env.items[i], "TNT_COMMAND_LINE_SETTINGS=TNT_MAX_RESTARTS") == 0;
  }
  assert_int_equal(found, 2);
  tnt__command_free(&cmd);
}

static void test_root_oversubscribed_gpus_and_options(void **state) {
  (void)state;
  char *prog[] = {"model.py"};
  const char *env[] = {"TNT_LOG_LEVEL=WARNING", "NEW=a b", "HOME"};
  tnt__options_t o;
  tnt__launch_plan_t p;
  tnt__command_t cmd;
  char err[512];
  base_plan(&p, &o, prog, 1);
  p.is_root = 1;
  p.per_host = p.total = 4;
  p.gpus = "0,1,2,3";
  o.log_level = "DEBUG";
  o.log_on_all_devices = 1;
  o.output_on_all_devices = 1;
  o.fusion_threshold = "64";
  o.pin_to_socket = o.pin_memory_to_socket = 1;
  o.env = env;
  o.num_env = 3;
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), 0);
  char *line = join(&cmd.argv);
  assert_non_null(strstr(line,
                         "/usr/bin/mpirun --allow-run-as-root -np 4 --oversubscribe "
                         "--bind-to none -x HOME -x LD_LIBRARY_PATH -x NEW -x PATH"));
  assert_non_null(strstr(line,
                         "--rank-exec --run-dir /w/run --gpus 0,1,2,3 "
                         "--output-on-all-devices --pin-to-socket --pin-memory-to-socket "
                         "-- /usr/bin/python3 model.py"));
  free(line);
  /* The options override the environment, and -x overrides both. */
  int found = 0;
  for (size_t i = 0; i < cmd.env.count; ++i) {
    const char *e = cmd.env.items[i];
    if (strncmp(e, "TNT_LOG_LEVEL=", 14) == 0) found += strcmp(e, "TNT_LOG_LEVEL=WARNING") == 0;
    found += strcmp(e, "TNT_LOG_ON_ALL_DEVICES=true") == 0;
    found += strcmp(e, "TNT_OUTPUT_ON_ALL_DEVICES=true") == 0;
    found += strcmp(e, "TNT_FUSION_THRESHOLD_KB=64") == 0;
    found += strcmp(e, "NEW=a b") == 0;
    found += strcmp(e, "HOME=/root") == 0;
  }
  assert_int_equal(found, 6);
  tnt__command_free(&cmd);
}

static void test_hosts(void **state) {
  (void)state;
  char *prog[] = {"/bin/hostname"};
  char *names[] = {"a", "b"};
  int lines[] = {1, 2};
  tnt__hostlist_t hosts = {names, lines, 2};
  tnt__options_t o;
  tnt__launch_plan_t p;
  tnt__command_t cmd;
  char err[512];
  base_plan(&p, &o, prog, 1);
  p.hosts = &hosts;
  p.total = 4;
  p.interpreter = NULL;
  p.program = "/bin/hostname";
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), 0);
  char *line = join(&cmd.argv);
  assert_non_null(strstr(line, "/usr/bin/mpirun -np 4 --host a:2,b:2 --bind-to none"));
  assert_non_null(strstr(line, "--cpu -- /bin/hostname"));
  free(line);
  tnt__command_free(&cmd);

  p.flavor = TNT__MPI_MPICH;
  p.mpirun = "/usr/bin/mpiexec";
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), 0);
  line = join(&cmd.argv);
  assert_non_null(strstr(line,
                         "/usr/bin/mpiexec -n 4 -hosts a:2,b:2 -ppn 2 -bind-to none "
                         "-genv LD_LIBRARY_PATH /opt/lib -genv PATH /usr/bin:/bin"));
  assert_non_null(strstr(line, "-wdir /w /usr/local/bin/tarantella --rank-exec"));
  free(line);
  tnt__command_free(&cmd);
}

static void test_unset_x_name(void **state) {
  (void)state;
  char *prog[] = {"model.py"};
  const char *env[] = {"NOT_SET_ANYWHERE"};
  tnt__options_t o;
  tnt__launch_plan_t p;
  tnt__command_t cmd;
  char err[512];
  base_plan(&p, &o, prog, 1);
  o.env = env;
  o.num_env = 1;
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), -1);
  assert_non_null(strstr(err, "NOT_SET_ANYWHERE is not set here"));
}

static void test_print_quotes(void **state) {
  (void)state;
  char *prog[] = {"model.py", "it's", "a b", ""};
  const char *env[] = {"Q=x'y"};
  tnt__options_t o;
  tnt__launch_plan_t p;
  tnt__command_t cmd;
  char err[512];
  base_plan(&p, &o, prog, 4);
  o.env = env;
  o.num_env = 1;
  assert_int_equal(tnt__command_build(&p, &cmd, err, sizeof err), 0);
  char buf[4096] = "";
  FILE *f = fmemopen(buf, sizeof buf, "w");
  assert_int_equal(tnt__command_print(&cmd, f), 0);
  fclose(f);
  assert_non_null(strstr(buf, "export Q='x'\\''y'\n"));
  assert_non_null(strstr(buf, "export PATH=/usr/bin:/bin\n"));
  assert_non_null(strstr(buf, " model.py 'it'\\''s' 'a b' ''\n"));
  tnt__command_free(&cmd);
}

static void test_shell_quote(void **state) {
  (void)state;
  char buf[64];
  assert_int_equal(tnt__shell_quote("plain-word_1.2:/x=y,z@%+", buf, sizeof buf), 24);
  assert_string_equal(buf, "plain-word_1.2:/x=y,z@%+");
  tnt__shell_quote("$HOME", buf, sizeof buf);
  assert_string_equal(buf, "'$HOME'");
  /* A small buffer is filled as far as it goes and the need reported. */
  char small[4];
  assert_int_equal(tnt__shell_quote("a b c", small, sizeof small), 7);
  assert_string_equal(small, "'a ");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_open_mpi),
      cmocka_unit_test(test_restart_attempt),
      cmocka_unit_test(test_root_oversubscribed_gpus_and_options),
      cmocka_unit_test(test_hosts),
      cmocka_unit_test(test_unset_x_name),
      cmocka_unit_test(test_print_quotes),
      cmocka_unit_test(test_shell_quote),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
