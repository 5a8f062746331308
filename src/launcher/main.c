/*
 * tarantella: runs a program on several ranks with MPI.
 *
 *   tarantella [options] -- PROGRAM [ARGS...]
 *
 * The same executable also serves as every rank's wrapper
 * (`tarantella --rank-exec ...`, see rank.h), so that a rank needs nothing
 * but this program and MPI on its host.
 */
#include <stdio.h>
#include <string.h>

#include "command.h"
#include "options.h"
#include "plan.h"
#include "rank.h"
#include "restart.h"
#include "run.h"
#include "util/settings.h"

#ifndef TNT_VERSION
#define TNT_VERSION "unknown"
#endif

/* Exit status for a command line or input that cannot work. */
#define TNT__EXIT_USAGE 2

extern char **environ;

/* --settings: every setting as the ranks would get it; --settings=markdown:
 * the table of the README, generated from the registry. */
static int print_settings(const tnt__options_t *opts, char *err, size_t err_len) {
  tnt__strvec_t env = {0};
  int rc = tnt__command_env(opts, environ, &env, err, err_len);
  tnt__strvec_free(&env);
  if (rc != 0) return rc;
  static const char *const sources[] = {"default", "environment", "command line"};
  if (opts->settings == 2) printf("| setting | takes | default | what it does |\n|---|---|---|---|\n");
  for (int i = 0; i < TNT__S_COUNT; ++i) {
    tnt__setting_view_t v;
    tnt__setting_view((tnt__setting_id_t)i, &v);
    if (opts->settings == 2) {
      char takes[256] = "a path or a program";
      if (strcmp(v.kind, "text") != 0) tnt__setting_accepts((tnt__setting_id_t)i, takes, sizeof takes);
      printf("| `%s` | %s | %s%s%s | %s |\n", v.name, takes, *v.default_value ? "`" : "",
             *v.default_value ? v.default_value : "unset", *v.default_value ? "`" : "", v.help);
    } else {
      printf("%-32s %-24s %s\n", v.name, *v.value ? v.value : "(unset)", sources[v.source]);
    }
  }
  return 0;
}

static void print_dry_run(const tnt__plan_storage_t *ps, const tnt__job_t *job) {
  printf("# tarantella --dry-run: what would run (nothing was started)\n");
  printf("# %s\n", ps->summary);
  if (ps->hosts_from[0] != '\0') printf("# hosts from %s\n", ps->hosts_from);
  printf("# logs: %s/rank<R>.log\n", job->plan.run_dir);
  if (job->max_restarts > 0) {
    printf("# up to %d restart(s), each logging in %s/attempt<K>\n", job->max_restarts,
           ps->run_dir);
  }
  if (tnt__command_print(&job->cmd, stdout) != 0) perror("tarantella: writing the dry run");
}

int main(int argc, char *argv[]) {
  if (argc > 1 && strcmp(argv[1], "--rank-exec") == 0) return tnt__rank_main(argc, argv);
  int status = TNT__EXIT_USAGE;
  char err[1024] = "";
  tnt__options_t opts;
  tnt__plan_storage_t ps;
  tnt__job_t job;
  memset(&ps, 0, sizeof ps);
  memset(&job, 0, sizeof job);
  tnt__parse_result_t parsed = tnt__options_parse(argc, argv, &opts, err, sizeof err);
  if (parsed == TNT__PARSE_HELP) {
    fputs(tnt__usage_text, stdout);
    status = 0;
    goto out;
  }
  if (parsed == TNT__PARSE_VERSION) {
    printf("tarantella %s\n", TNT_VERSION);
    status = 0;
    goto out;
  }
  if (parsed == TNT__PARSE_SETTINGS) {
    if (print_settings(&opts, err, sizeof err) == 0) {
      status = 0;
      goto out;
    }
    fprintf(stderr, "tarantella: error: %s\n", err);
    goto out;
  }
  if (parsed != TNT__PARSE_RUN) {
    fprintf(stderr,
            "tarantella: error: %s\nUsage: tarantella [options] -- PROGRAM [ARGS...] "
            "(see tarantella --help)\n",
            err);
    goto out;
  }
  if (tnt__plan_make(&opts, environ, &ps, err, sizeof err) != 0 ||
      tnt__job_init(&job, &ps.plan, err, sizeof err) != 0) {
    fprintf(stderr, "tarantella: error: %s\n", err);
    goto out;
  }
  if (opts.dry_run) {
    print_dry_run(&ps, &job);
    status = 0;
    goto out;
  }
  if (ps.hosts_from[0] != '\0') fprintf(stderr, "tarantella: hosts from %s\n", ps.hosts_from);
  fprintf(stderr, "tarantella: %s; logs in %s\n", ps.summary, job.plan.run_dir);
  status = tnt__job_run(&job);
out:
  tnt__job_free(&job);
  tnt__plan_free(&ps);
  tnt__options_free(&opts);
  return status;
}
