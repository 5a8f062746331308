/*
 * Building the MPI command. Open MPI passes a variable to remote hosts only
 * when it is named with -x (taking its value from mpirun's own
 * environment), MPICH when it is named with -genv NAME VALUE; the launcher
 * therefore sets every variable in the MPI launcher's environment and names
 * each one on the command line.
 */
#include "command.h"

#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "util/settings.h"

int tnt__env_name_exported(const char *name, size_t len) {
  static const char *const exact[] = {"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"};
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; ++i) {
    if (strlen(exact[i]) == len && strncmp(name, exact[i], len) == 0) return 1;
  }
  return (len > 4 && strncmp(name, "TNT_", 4) == 0) || (len > 3 && strncmp(name, "TF_", 3) == 0);
}

/* Sets NAME=VALUE in env, replacing an earlier value of NAME. */
static int env_set(tnt__strvec_t *env, const char *name, size_t name_len, const char *value) {
  for (size_t i = 0; i < env->count; ++i) {
    if (strncmp(env->items[i], name, name_len) == 0 && env->items[i][name_len] == '=') {
      char *entry = NULL;
      if (asprintf(&entry, "%.*s=%s", (int)name_len, name, value) < 0) return -1;
      free(env->items[i]);
      env->items[i] = entry;
      return 0;
    }
  }
  return tnt__strvec_pushf(env, "%.*s=%s", (int)name_len, name, value);
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int tnt__command_env(const tnt__options_t *o, char *const *envp, tnt__strvec_t *env, char *err,
                     size_t err_len) {
  int rc = -1;
  tnt__strvec_t from_cli = {0};
  for (char *const *e = envp; e != NULL && *e != NULL; ++e) {
    const char *eq = strchr(*e, '=');
    if (eq == NULL || !tnt__env_name_exported(*e, (size_t)(eq - *e))) continue;
    if (env_set(env, *e, (size_t)(eq - *e), eq + 1) != 0) goto nomem;
  }
  /* Each option that sets a variable, and the value it gives it. */
  const struct {
    const char *name;
    const char *value;
  } settings[] = {
      {"TNT_LOG_LEVEL", o->log_level},
      {"TNT_LOG_ON_ALL_DEVICES", o->log_on_all_devices ? "true" : NULL},
      {"TNT_OUTPUT_ON_ALL_DEVICES", o->output_on_all_devices ? "true" : NULL},
      {"TNT_FUSION_THRESHOLD_KB", o->fusion_threshold},
      {"TNT_MAX_RESTARTS", o->max_restarts},
      {"TNT_MIN_RANKS", o->min_ranks},
  };
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; ++i) {
    if (settings[i].value == NULL) continue;
    if (env_set(env, settings[i].name, strlen(settings[i].name), settings[i].value) != 0 ||
        tnt__strvec_pushf(&from_cli, "%s", settings[i].name) != 0) {
      goto nomem;
    }
  }
  for (int i = 0; i < o->num_env; ++i) {
    const char *arg = o->env[i];
    const char *eq = strchr(arg, '=');
    size_t len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
    const char *value = eq != NULL ? eq + 1 : tnt__env_lookup(envp, arg, len);
    if (value == NULL) {
      tnt__errorf(err, err_len, "-x %s: %s is not set here; give its value with -x %s=VALUE", arg,
                  arg, arg);
      goto out;
    }
    if (env_set(env, arg, len, value) != 0) goto nomem;
    if (eq != NULL && tnt__strvec_pushf(&from_cli, "%.*s", (int)len, arg) != 0) goto nomem;
  }
  /* The ranks report these settings as given on the command line. */
  if (from_cli.count > 0) {
    size_t total = 1;
    for (size_t i = 0; i < from_cli.count; ++i) total += strlen(from_cli.items[i]) + 1;
    char *list = calloc(1, total);
    if (list == NULL) goto nomem;
    for (size_t i = 0; i < from_cli.count; ++i) {
      if (i > 0) strcat(list, ",");
      strcat(list, from_cli.items[i]);
    }
    int failed = env_set(env, "TNT_COMMAND_LINE_SETTINGS", strlen("TNT_COMMAND_LINE_SETTINGS"),
                         list);
    free(list);
    if (failed) goto nomem;
  }
  if (env->count > 0) qsort(env->items, env->count, sizeof *env->items, compare_strings);
  /* A bad setting fails here, before anything starts, as it would on every rank. */
  static char *const no_env[] = {NULL};
  if (tnt__settings_read(env->count > 0 ? env->items : no_env, err, err_len) != 0) goto out;
  rc = 0;
  goto out;
nomem:
  tnt__errorf(err, err_len, "out of memory");
out:
  tnt__strvec_free(&from_cli);
  return rc;
}

/* The host list in the syntax both launchers accept: a:N,b:N. */
static char *host_list(const tnt__launch_plan_t *plan) {
  size_t len = 1;
  for (int i = 0; i < plan->hosts->count; ++i) len += strlen(plan->hosts->names[i]) + 16;
  char *s = malloc(len);
  if (s == NULL) return NULL;
  size_t used = 0;
  s[0] = '\0';
  for (int i = 0; i < plan->hosts->count; ++i) {
    used += (size_t)snprintf(s + used, len - used, "%s%s:%d", i > 0 ? "," : "",
                             plan->hosts->names[i], plan->per_host);
  }
  return s;
}

/* The rank wrapper (this program in rank mode) and the program it runs. */
static int push_rank_command(const tnt__launch_plan_t *plan, tnt__strvec_t *a) {
  const tnt__options_t *o = plan->opts;
  int rc = 0;
  rc |= tnt__strvec_push(a, plan->self);
  rc |= tnt__strvec_push(a, "--rank-exec");
  rc |= tnt__strvec_push(a, "--run-dir");
  rc |= tnt__strvec_push(a, plan->run_dir);
  if (plan->attempt > 0) {
    rc |= tnt__strvec_push(a, "--restart-count");
    rc |= tnt__strvec_pushf(a, "%d", plan->attempt - 1);
  }
  if (plan->gpus != NULL) {
    rc |= tnt__strvec_push(a, "--gpus");
    rc |= tnt__strvec_push(a, plan->gpus);
  } else {
    rc |= tnt__strvec_push(a, "--cpu");
  }
  if (o->output_on_all_devices) rc |= tnt__strvec_push(a, "--output-on-all-devices");
  if (o->pin_to_socket) rc |= tnt__strvec_push(a, "--pin-to-socket");
  if (o->pin_memory_to_socket) rc |= tnt__strvec_push(a, "--pin-memory-to-socket");
  rc |= tnt__strvec_push(a, "--");
  if (plan->interpreter != NULL) rc |= tnt__strvec_push(a, plan->interpreter);
  rc |= tnt__strvec_push(a, plan->program);
  for (int i = 1; i < o->program_argc; ++i) rc |= tnt__strvec_push(a, o->program_argv[i]);
  return rc;
}

static int push_open_mpi(const tnt__launch_plan_t *plan, const tnt__strvec_t *env,
                         const char *hosts, tnt__strvec_t *a) {
  int rc = 0;
  rc |= tnt__strvec_push(a, plan->mpirun);
  /* Open MPI refuses to start as root unless told that it is intended. */
  if (plan->is_root) rc |= tnt__strvec_push(a, "--allow-run-as-root");
  rc |= tnt__strvec_push(a, "-np");
  rc |= tnt__strvec_pushf(a, "%d", plan->total);
  if (hosts != NULL) {
    rc |= tnt__strvec_push(a, "--host");
    rc |= tnt__strvec_push(a, hosts);
  }
  /* Without this, Open MPI refuses more ranks than a host has cores, and
   * inside a Slurm allocation more than the allocation's tasks on a node. */
  if (plan->per_host > plan->cores ||
      (plan->slurm_slots > 0 && plan->per_host > plan->slurm_slots)) {
    rc |= tnt__strvec_push(a, "--oversubscribe");
  }
  /* Open MPI's default binding would pin two ranks to one core when they
   * outnumber the cores; the rank wrapper does the pinning that
   * --pin-to-socket asks for. */
  rc |= tnt__strvec_push(a, "--bind-to");
  rc |= tnt__strvec_push(a, "none");
  for (size_t i = 0; i < env->count; ++i) {
    rc |= tnt__strvec_push(a, "-x");
    rc |= tnt__strvec_pushf(a, "%.*s", (int)strcspn(env->items[i], "="), env->items[i]);
  }
  rc |= tnt__strvec_push(a, "--wdir");
  rc |= tnt__strvec_push(a, plan->workdir);
  return rc;
}

static int push_mpich(const tnt__launch_plan_t *plan, const tnt__strvec_t *env, const char *hosts,
                      tnt__strvec_t *a) {
  int rc = 0;
  rc |= tnt__strvec_push(a, plan->mpirun);
  rc |= tnt__strvec_push(a, "-n");
  rc |= tnt__strvec_pushf(a, "%d", plan->total);
  if (hosts != NULL) {
    rc |= tnt__strvec_push(a, "-hosts");
    rc |= tnt__strvec_push(a, hosts);
    rc |= tnt__strvec_push(a, "-ppn");
    rc |= tnt__strvec_pushf(a, "%d", plan->per_host);
  }
  rc |= tnt__strvec_push(a, "-bind-to");
  rc |= tnt__strvec_push(a, "none");
  for (size_t i = 0; i < env->count; ++i) {
    const char *eq = strchr(env->items[i], '=');
    rc |= tnt__strvec_push(a, "-genv");
    rc |= tnt__strvec_pushf(a, "%.*s", (int)(eq - env->items[i]), env->items[i]);
    rc |= tnt__strvec_push(a, eq + 1);
  }
  rc |= tnt__strvec_push(a, "-wdir");
  rc |= tnt__strvec_push(a, plan->workdir);
  return rc;
}

int tnt__command_build(const tnt__launch_plan_t *plan, tnt__command_t *cmd, char *err,
                       size_t err_len) {
  int rc = -1;
  char *hosts = NULL;
  memset(cmd, 0, sizeof *cmd);
  if (tnt__command_env(plan->opts, plan->envp, &cmd->env, err, err_len) != 0) goto out;
  if (plan->hosts != NULL) {
    hosts = host_list(plan);
    if (hosts == NULL) goto nomem;
  }
  int failed = plan->flavor == TNT__MPI_OPEN_MPI ? push_open_mpi(plan, &cmd->env, hosts, &cmd->argv)
                                                 : push_mpich(plan, &cmd->env, hosts, &cmd->argv);
  if (failed || push_rank_command(plan, &cmd->argv) != 0) goto nomem;
  rc = 0;
  goto out;
nomem:
  tnt__errorf(err, err_len, "out of memory");
out:
  free(hosts);
  if (rc != 0) tnt__command_free(cmd);
  return rc;
}

void tnt__command_free(tnt__command_t *cmd) {
  tnt__strvec_free(&cmd->argv);
  tnt__strvec_free(&cmd->env);
}

/* Writes one word, quoted for the shell. */
static int print_word(const char *word, FILE *out) {
  char small[512];
  size_t need = tnt__shell_quote(word, small, sizeof small);
  int rc = 0;
  if (need < sizeof small) {
    rc = fputs(small, out) < 0 ? -1 : 0;
  } else {
    char *big = malloc(need + 1);
    rc = -1;
    if (big != NULL) {
      tnt__shell_quote(word, big, need + 1);
      rc = fputs(big, out) < 0 ? -1 : 0;
    }
    free(big);
  }
  return rc;
}

int tnt__command_print(const tnt__command_t *cmd, FILE *out) {
  int rc = 0;
  for (size_t i = 0; i < cmd->env.count; ++i) {
    const char *entry = cmd->env.items[i];
    size_t name_len = strcspn(entry, "=");
    rc |= fprintf(out, "export %.*s=", (int)name_len, entry) < 0;
    rc |= print_word(entry + name_len + 1, out) != 0;
    rc |= fputc('\n', out) == EOF;
  }
  for (size_t i = 0; i < cmd->argv.count; ++i) {
    if (i > 0) rc |= fputc(' ', out) == EOF;
    rc |= print_word(cmd->argv.items[i], out) != 0;
  }
  rc |= fputc('\n', out) == EOF;
  return rc ? -1 : 0;
}
