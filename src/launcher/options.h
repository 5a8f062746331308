/*
 * The launcher's command line: `tarantella [options] -- PROGRAM [ARGS...]`.
 *
 * The parser is a pure function of its arguments: it keeps no global state,
 * never prints and never exits, so that the unit tests and the fuzz target
 * can call it on any input. Strings in the result point into argv.
 */
#ifndef TNT_LAUNCHER_OPTIONS_H
#define TNT_LAUNCHER_OPTIONS_H

#include <stddef.h>

typedef enum {
  TNT__PARSE_RUN = 0,     /* start (or, with --dry-run, show) a run */
  TNT__PARSE_HELP = 1,    /* --help was given */
  TNT__PARSE_VERSION = 2, /* --version was given */
  TNT__PARSE_SETTINGS = 3, /* --settings was given, without a program */
  TNT__PARSE_ERROR = -1   /* the message says what is wrong */
} tnt__parse_result_t;

typedef struct {
  int nranks;                   /* -n / -np; 0 when not given */
  int n_per_node;               /* --n-per-node and its aliases; 0 when not given */
  const char *hostfile;         /* --hostfile; NULL for a run on this host only */
  int no_gpu;                   /* --no-gpu */
  const char *log_level;        /* --log-level as given (validated); NULL if not given */
  int log_on_all_devices;       /* --log-on-all-devices */
  int output_on_all_devices;    /* --output-on-all-devices */
  const char *fusion_threshold; /* --fusion-threshold as given (validated); NULL if not given */
  int pin_to_socket;            /* --pin-to-socket (implied by --pin-memory-to-socket) */
  int pin_memory_to_socket;     /* --pin-memory-to-socket */
  const char *python;           /* --python-interpreter; NULL for the default */
  const char *run_dir;          /* --run-dir; NULL for the default */
  const char *max_restarts;     /* --max-restarts as given (validated); NULL if not given */
  double restart_delay_s;       /* --restart-delay; 0 when not given */
  const char *min_ranks;        /* --min-ranks as given (validated); NULL if not given */
  int dry_run;                  /* --dry-run */
  int settings;                 /* --settings: 1; --settings=markdown: 2; else 0 */
  const char **env;             /* -x arguments, "NAME=VALUE" or "NAME"; owned by the options */
  int num_env;
  char *const *program_argv; /* PROGRAM and its arguments (points into argv) */
  int program_argc;
} tnt__options_t;

/*
 * Parses argv[1..argc-1]. On TNT__PARSE_ERROR, err holds a one-line message
 * (without a trailing newline) saying what is wrong and what to change.
 * Whatever the result, release the options with tnt__options_free.
 */
tnt__parse_result_t tnt__options_parse(int argc, char *const argv[], tnt__options_t *opts,
                                       char *err, size_t err_len);

/* Frees what tnt__options_parse allocated; the options may be parsed again. */
void tnt__options_free(tnt__options_t *opts);

/* Checks a -x argument: NAME=VALUE or NAME, NAME a valid variable name. */
int tnt__env_assignment_valid(const char *arg, int allow_bare_name);

/* The text of --help. */
extern const char tnt__usage_text[];

#endif
