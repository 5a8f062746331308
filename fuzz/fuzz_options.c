/*
 * Fuzz target for the launcher's command line. The input is split at NUL
 * bytes into arguments; a successful parse is checked for consistency and
 * then turned into an MPI command and printed, so that the command builder
 * and the shell quoting of the dry run are fuzzed with it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "options.h"
#include "util/settings.h"

/* More arguments than any real command line has, and few enough to keep
 * every input fast. */
#define MAX_ARGS 64

static char *fake_environ[] = {"PATH=/usr/bin:/bin", "HOME=/root", "TNT_TIMEOUT_S=30",
                               "TF_CPP_MIN_LOG_LEVEL=2", NULL};

static void check_options(const tnt__options_t *o, char **argv, int argc) {
  if (o->program_argc < 1 || o->program_argv < argv ||
      o->program_argv + o->program_argc != argv + argc) {
    abort();
  }
  if (o->program_argv[0][0] == '\0') abort();
  if (o->nranks < 0 || o->n_per_node < 0 || (o->nranks > 0 && o->n_per_node > 0)) abort();
  if (o->fusion_threshold != NULL &&
      tnt__setting_check(TNT__S_FUSION_THRESHOLD_KB, o->fusion_threshold) != 0) {
    abort();
  }
  if (o->log_level != NULL && tnt__setting_check(TNT__S_LOG_LEVEL, o->log_level) != 0) abort();
  if (o->pin_memory_to_socket && !o->pin_to_socket) abort();
  for (int i = 0; i < o->num_env; ++i) {
    if (!tnt__env_assignment_valid(o->env[i], 1)) abort();
  }
}

static void build_and_print(const tnt__options_t *o, int flavor) {
  char *names[] = {"node-a", "node-b"};
  int lines[] = {1, 2};
  tnt__hostlist_t hosts = {names, lines, 2};
  tnt__launch_plan_t plan = {
      .opts = o,
      .flavor = flavor ? TNT__MPI_MPICH : TNT__MPI_OPEN_MPI,
      .mpirun = "/usr/bin/mpirun",
      .self = "/usr/local/bin/tarantella",
      .run_dir = "/tmp/run",
      .workdir = "/tmp",
      .is_root = flavor,
      .cores = 2,
      .hosts = o->hostfile != NULL ? &hosts : NULL,
      .per_host = o->n_per_node > 0 ? o->n_per_node : 1,
      .total = o->nranks > 0 ? o->nranks : 2,
      .gpus = o->no_gpu ? NULL : "0,1",
      .interpreter = o->python,
      .program = o->program_argv[0],
      .envp = fake_environ,
  };
  tnt__command_t cmd;
  char err[512];
  if (tnt__command_build(&plan, &cmd, err, sizeof err) == 0) {
    static char out[1 << 16];
    FILE *f = fmemopen(out, sizeof out, "w");
    if (f != NULL) {
      tnt__command_print(&cmd, f);
      fclose(f);
    }
    tnt__command_free(&cmd);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size + 1);
  if (copy == NULL) return 0;
  memcpy(copy, data, size);
  copy[size] = '\0';
  char *argv[MAX_ARGS + 1];
  int argc = 0;
  argv[argc++] = "tarantella";
  for (size_t pos = 0; pos <= size && argc < MAX_ARGS;) {
    argv[argc++] = copy + pos;
    pos += strlen(copy + pos) + 1;
  }
  argv[argc] = NULL;
  tnt__options_t o;
  char err[1024];
  tnt__parse_result_t r = tnt__options_parse(argc, argv, &o, err, sizeof err);
  if (r == TNT__PARSE_RUN) {
    check_options(&o, argv, argc);
    build_and_print(&o, size % 2);
  } else if (r == TNT__PARSE_ERROR && err[0] == '\0') {
    /* Every rejection must say why. */
    abort();
  }
  tnt__options_free(&o);
  free(copy);
  return 0;
}
