/*
 * Parsing of the launcher's command line. The parser is table driven and
 * hand written rather than built on getopt, because getopt keeps its state
 * in globals and permutes argv, and the fuzz target and the unit tests call
 * the parser many times in one process.
 */
#include "options.h"
#include "strvec.h"
#include "util/settings.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Rank counts above this are surely typing mistakes, and keeping them small
 * keeps every product of counts far from integer overflow. */
#define TNT__MAX_RANKS 1000000

const char tnt__usage_text[] =
    "Usage: tarantella [options] -- PROGRAM [ARGS...]\n"
    "\n"
    "Runs PROGRAM on several ranks with MPI. A Python script (PROGRAM ending in .py, or\n"
    "starting with a python #! line) runs with the Python that has Tarantella installed.\n"
    "\n"
    "Where and how many:\n"
    "  -n, -np N                 N ranks in all (default: one per GPU, or one on the CPU)\n"
    "  --hostfile FILE           run on the hosts listed in FILE, one name per line\n"
    "                            (default: inside a Slurm allocation its nodes,\n"
    "                            else this host)\n"
    "  --n-per-node N            N ranks on every host (aliases --npernode,\n"
    "                            --devices-per-node; default in a Slurm allocation:\n"
    "                            its tasks per node)\n"
    "  --no-gpu                  run on CPUs, even where there are GPUs\n"
    "\n"
    "Logging and output:\n"
    "  --log-level LEVEL         DEBUG, INFO, WARNING or ERROR (TNT_LOG_LEVEL)\n"
    "  --log-on-all-devices      library logs from every rank, not only rank 0\n"
    "  --output-on-all-devices   program output from every rank, not only rank 0\n"
    "  --run-dir DIR             where every rank's log goes (default:\n"
    "                            ./tarantella-run-DATE-TIME-PID, or $TNT_RUN_DIR)\n"
    "\n"
    "Failures:\n"
    "  --max-restarts N          start the job again, up to N times, when an attempt\n"
    "                            fails after a completed step (TNT_MAX_RESTARTS;\n"
    "                            default 0); each attempt logs to DIR/attempt<K>\n"
    "  --restart-delay S         wait S seconds before each restart (default 0)\n"
    "  --min-ranks M             with --hostfile: restart without a host that failed\n"
    "                            (its ranks did not start, stopped answering or were\n"
    "                            killed by a signal) while M ranks remain\n"
    "                            (TNT_MIN_RANKS; default: restart on every host)\n"
    "\n"
    "Environment and tuning:\n"
    "  -x NAME=VALUE [N2=V2 ...] set NAME on every rank (repeatable; several\n"
    "                            assignments may follow one -x); -x NAME passes\n"
    "                            on its current value\n"
    "  --fusion-threshold KB     tensor fusion threshold in KB (TNT_FUSION_THRESHOLD_KB)\n"
    "  --pin-to-socket           bind each rank of a host to its own NUMA node\n"
    "  --pin-memory-to-socket    also bind its memory there (implies --pin-to-socket)\n"
    "  --python-interpreter PATH run Python scripts with PATH\n"
    "\n"
    "Other:\n"
    "  --dry-run                 print the command and environment; run nothing\n"
    "  --settings                print every TNT_* setting the ranks would run with,\n"
    "                            its value and where it comes from (--settings=markdown:\n"
    "                            as a Markdown table); run nothing\n"
    "  --version                 print the version\n"
    "  -h, --help                print this help\n"
    "\n"
    "Examples:\n"
    "  tarantella -- model.py --batch_size=64\n"
    "  tarantella -n 4 --no-gpu -- model.py\n"
    "  tarantella --hostfile hosts --n-per-node 2 --pin-to-socket -- model.py\n"
    "  salloc -N 2 --ntasks-per-node 4 tarantella -- model.py\n";

typedef enum {
  OPT_NRANKS,
  OPT_HOSTFILE,
  OPT_N_PER_NODE,
  OPT_NO_GPU,
  OPT_LOG_LEVEL,
  OPT_LOG_ALL,
  OPT_OUTPUT_ALL,
  OPT_ENV,
  OPT_FUSION,
  OPT_PIN,
  OPT_PIN_MEMORY,
  OPT_PYTHON,
  OPT_RUN_DIR,
  OPT_MAX_RESTARTS,
  OPT_RESTART_DELAY,
  OPT_MIN_RANKS,
  OPT_DRY_RUN,
  OPT_SETTINGS,
  OPT_VERSION,
  OPT_HELP
} option_id_t;

typedef struct {
  const char *name;
  option_id_t id;
  int takes_value; /* 1: a value; 2: an optional value, attached (--name=value) */
} option_spec_t;

/* Long options also accept --name=value. Single-dash names take their
 * value as the next argument or attached (-n4, -xNAME=VALUE), except -np,
 * which mpirun users type as a word of its own. */
static const option_spec_t long_options[] = {
    {"--hostfile", OPT_HOSTFILE, 1},
    {"--n-per-node", OPT_N_PER_NODE, 1},
    {"--npernode", OPT_N_PER_NODE, 1},
    {"--devices-per-node", OPT_N_PER_NODE, 1},
    {"--no-gpu", OPT_NO_GPU, 0},
    {"--no-gpus", OPT_NO_GPU, 0},
    {"--log-level", OPT_LOG_LEVEL, 1},
    {"--log-on-all-devices", OPT_LOG_ALL, 0},
    {"--output-on-all-devices", OPT_OUTPUT_ALL, 0},
    {"--fusion-threshold", OPT_FUSION, 1},
    {"--pin-to-socket", OPT_PIN, 0},
    {"--pin-memory-to-socket", OPT_PIN_MEMORY, 0},
    {"--python-interpreter", OPT_PYTHON, 1},
    {"--run-dir", OPT_RUN_DIR, 1},
    {"--max-restarts", OPT_MAX_RESTARTS, 1},
    {"--restart-delay", OPT_RESTART_DELAY, 1},
    {"--min-ranks", OPT_MIN_RANKS, 1},
    {"--dry-run", OPT_DRY_RUN, 0},
    {"--settings", OPT_SETTINGS, 2},
    {"--version", OPT_VERSION, 0},
    {"--help", OPT_HELP, 0},
};

static const option_spec_t short_options[] = {
    {"-n", OPT_NRANKS, 1},
    {"-x", OPT_ENV, 1},
    {"-h", OPT_HELP, 0},
};


/* Parses a whole positive decimal number no larger than TNT__MAX_RANKS. */
static int parse_count(const char *s, int *out) {
  long v = 0;
  if (*s == '\0') return -1;
  for (const char *p = s; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (*p - '0');
    if (v > TNT__MAX_RANKS) return -1;
  }
  if (v < 1) return -1;
  *out = (int)v;
  return 0;
}

/* Parses a finite number of seconds, 0 or more, and no more than a day:
 * a longer wait between attempts is surely a typing mistake. */
static int parse_seconds(const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (*s == '\0' || errno != 0 || *end != '\0' || !isfinite(v) || v < 0 || v > 86400) return -1;
  *out = v;
  return 0;
}

int tnt__env_assignment_valid(const char *arg, int allow_bare_name) {
  const char *p = arg;
  if (!(isalpha((unsigned char)*p) || *p == '_')) return 0;
  while (isalnum((unsigned char)*p) || *p == '_') ++p;
  if (*p == '=') return 1;
  return *p == '\0' && allow_bare_name;
}

/* Checks the value of an option that gives a setting by the registry's
 * rules. Returns 0, or -1 with err saying what the option takes. */
static int check_setting(tnt__setting_id_t id, const char *arg, const char *value, char *err,
                         size_t err_len) {
  if (*value != '\0' && tnt__setting_check(id, value) == 0) return 0;
  char accepts[256];
  tnt__setting_accepts(id, accepts, sizeof accepts);
  tnt__set_error(err, err_len, "%s takes %s, not '%s'", arg, accepts, value);
  return -1;
}

/* Finds the option an argument names. *value is set to the attached value
 * (after '=' or a short option's letter), or NULL when there is none. */
static const option_spec_t *find_option(const char *arg, const char **value) {
  *value = NULL;
  if (strncmp(arg, "--", 2) == 0) {
    for (size_t i = 0; i < sizeof long_options / sizeof long_options[0]; ++i) {
      size_t len = strlen(long_options[i].name);
      if (strncmp(arg, long_options[i].name, len) != 0) continue;
      if (arg[len] == '\0') return &long_options[i];
      if (arg[len] == '=') {
        *value = arg + len + 1;
        return &long_options[i];
      }
    }
    return NULL;
  }
  if (strcmp(arg, "-np") == 0) return &short_options[0];
  for (size_t i = 0; i < sizeof short_options / sizeof short_options[0]; ++i) {
    if (strncmp(arg, short_options[i].name, 2) != 0) continue;
    if (arg[2] == '\0') return &short_options[i];
    if (!short_options[i].takes_value) return NULL;
    *value = arg + 2;
    return &short_options[i];
  }
  return NULL;
}

/* Applies one option with its value. Returns 0, or -1 with err set. */
static int apply_option(tnt__options_t *o, const option_spec_t *spec, const char *arg,
                        const char *value, char *err, size_t err_len) {
  switch (spec->id) {
    case OPT_NRANKS:
      if (parse_count(value, &o->nranks) != 0) {
        tnt__set_error(err, err_len, "%s needs a positive whole number of ranks, not '%s'", arg, value);
        return -1;
      }
      return 0;
    case OPT_N_PER_NODE:
      if (parse_count(value, &o->n_per_node) != 0) {
        tnt__set_error(err, err_len, "%s needs a positive whole number of ranks per host, not '%s'", arg,
                  value);
        return -1;
      }
      return 0;
    case OPT_HOSTFILE:
      if (*value == '\0') {
        tnt__set_error(err, err_len, "%s needs the name of a file", arg);
        return -1;
      }
      o->hostfile = value;
      return 0;
    case OPT_LOG_LEVEL:
      if (check_setting(TNT__S_LOG_LEVEL, arg, value, err, err_len) != 0) return -1;
      o->log_level = value;
      return 0;
    case OPT_ENV:
      if (!tnt__env_assignment_valid(value, 1)) {
        tnt__set_error(err, err_len,
                  "-x needs NAME=VALUE (or NAME, to pass on its current value) with NAME made "
                  "of letters, digits and '_', not '%s'",
                  value);
        return -1;
      }
      o->env[o->num_env++] = value;
      return 0;
    case OPT_FUSION:
      if (check_setting(TNT__S_FUSION_THRESHOLD_KB, arg, value, err, err_len) != 0) return -1;
      o->fusion_threshold = value;
      return 0;
    case OPT_PYTHON:
      if (*value == '\0') {
        tnt__set_error(err, err_len, "%s needs the path of a Python interpreter", arg);
        return -1;
      }
      o->python = value;
      return 0;
    case OPT_RUN_DIR:
      if (*value == '\0') {
        tnt__set_error(err, err_len, "%s needs the name of a directory", arg);
        return -1;
      }
      o->run_dir = value;
      return 0;
    case OPT_MAX_RESTARTS:
      if (check_setting(TNT__S_MAX_RESTARTS, arg, value, err, err_len) != 0) return -1;
      o->max_restarts = value;
      return 0;
    case OPT_MIN_RANKS:
      if (check_setting(TNT__S_MIN_RANKS, arg, value, err, err_len) != 0) return -1;
      o->min_ranks = value;
      return 0;
    case OPT_RESTART_DELAY:
      if (parse_seconds(value, &o->restart_delay_s) != 0) {
        tnt__set_error(err, err_len, "%s needs a number of seconds from 0 to 86400 (a day), not '%s'", arg,
                       value);
        return -1;
      }
      return 0;
    case OPT_NO_GPU:
      o->no_gpu = 1;
      return 0;
    case OPT_LOG_ALL:
      o->log_on_all_devices = 1;
      return 0;
    case OPT_OUTPUT_ALL:
      o->output_on_all_devices = 1;
      return 0;
    case OPT_PIN:
      o->pin_to_socket = 1;
      return 0;
    case OPT_PIN_MEMORY:
      o->pin_memory_to_socket = 1;
      o->pin_to_socket = 1;
      return 0;
    case OPT_DRY_RUN:
      o->dry_run = 1;
      return 0;
    case OPT_SETTINGS:
      if (value != NULL && strcmp(value, "markdown") != 0) {
        tnt__set_error(err, err_len, "%s takes no value or =markdown, not '%s'", arg, value);
        return -1;
      }
      o->settings = value != NULL ? 2 : 1;
      return 0;
    case OPT_VERSION:
    case OPT_HELP:
      return 0;
  }
  return 0;
}

tnt__parse_result_t tnt__options_parse(int argc, char *const argv[], tnt__options_t *opts,
                                       char *err, size_t err_len) {
  tnt__parse_result_t result = TNT__PARSE_ERROR;
  memset(opts, 0, sizeof *opts);
  if (err != NULL && err_len > 0) err[0] = '\0';
  /* Every -x takes at least one argument, so argc slots always suffice. */
  opts->env = calloc((size_t)(argc > 0 ? argc : 1), sizeof *opts->env);
  if (opts->env == NULL) {
    tnt__set_error(err, err_len, "out of memory");
    goto out;
  }
  int i = 1;
  for (; i < argc; ++i) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) break;
    if (arg[0] != '-' || arg[1] == '\0') {
      tnt__set_error(err, err_len,
                "unexpected argument '%s' before '--': write the options, then '--', then "
                "the program (tarantella -n 2 -- %s)",
                arg, arg);
      goto out;
    }
    const char *value = NULL;
    const option_spec_t *spec = find_option(arg, &value);
    if (spec == NULL) {
      tnt__set_error(err, err_len, "unknown option '%s' (see tarantella --help)", arg);
      goto out;
    }
    if (spec->id == OPT_HELP && value == NULL) {
      result = TNT__PARSE_HELP;
      goto out;
    }
    if (spec->id == OPT_VERSION && value == NULL) {
      result = TNT__PARSE_VERSION;
      goto out;
    }
    if (spec->takes_value == 0 && value != NULL) {
      tnt__set_error(err, err_len, "option %s takes no value", spec->name);
      goto out;
    }
    if (spec->takes_value == 1 && value == NULL) {
      /* A following option or '--' means the value was forgotten; taking
       * it as the value would only give a more confusing error later. */
      if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
        tnt__set_error(err, err_len, "option %s needs a value", arg);
        goto out;
      }
      value = argv[++i];
    }
    if (apply_option(opts, spec, arg, value, err, err_len) != 0) goto out;
    /* "-x A=1 B=2": the assignments that follow one -x (NAME=VALUE only, so
     * that a program named before a forgotten '--' is still reported). */
    while (spec->id == OPT_ENV && i + 1 < argc && argv[i + 1][0] != '-' &&
           strchr(argv[i + 1], '=') != NULL) {
      if (apply_option(opts, spec, arg, argv[++i], err, err_len) != 0) goto out;
    }
  }
  if (opts->settings) {
    result = TNT__PARSE_SETTINGS;
    goto out;
  }
  if (i >= argc) {
    tnt__set_error(err, err_len, "missing '--' and PROGRAM: tarantella [options] -- PROGRAM [ARGS...]");
    goto out;
  }
  if (i + 1 >= argc) {
    tnt__set_error(err, err_len, "missing PROGRAM after '--': tarantella [options] -- PROGRAM");
    goto out;
  }
  if (argv[i + 1][0] == '\0') {
    tnt__set_error(err, err_len, "PROGRAM after '--' is an empty string");
    goto out;
  }
  opts->program_argv = &argv[i + 1];
  opts->program_argc = argc - i - 1;
  if (opts->nranks > 0 && opts->n_per_node > 0) {
    tnt__set_error(err, err_len,
              "-n and --n-per-node cannot be combined: give -n for the total number of ranks, "
              "or --n-per-node for the ranks on each host");
    goto out;
  }
  result = TNT__PARSE_RUN;
out:
  return result;
}

void tnt__options_free(tnt__options_t *opts) {
  free(opts->env);
  opts->env = NULL;
  opts->num_env = 0;
}
