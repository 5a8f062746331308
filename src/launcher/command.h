/*
 * The launch plan (everything the launcher decided: hosts, ranks, devices,
 * program) and the MPI command built from it.
 *
 * Building the command is a pure function of the plan, so that --dry-run
 * and the unit tests see exactly what a real run executes.
 */
#ifndef TNT_LAUNCHER_COMMAND_H
#define TNT_LAUNCHER_COMMAND_H

#include <stdio.h>

#include "hostfile.h"
#include "options.h"
#include "strvec.h"

typedef enum {
  TNT__MPI_OPEN_MPI, /* Open MPI's mpirun */
  TNT__MPI_MPICH     /* MPICH's (Hydra's) mpiexec, and MPI libraries built on it */
} tnt__mpi_flavor_t;

typedef struct {
  const tnt__options_t *opts;
  tnt__mpi_flavor_t flavor;
  const char *mpirun;           /* the MPI launcher to execute */
  const char *self;             /* this program's absolute path, run as each rank's wrapper */
  const char *run_dir;          /* absolute path of the directory of the rank logs */
  int attempt;                  /* with restarts, the attempt (1, 2, ...); 0 without */
  const char *workdir;          /* absolute working directory of every rank */
  int is_root;                  /* the launcher runs as root */
  long cores;                   /* processors of this host */
  int slurm_slots;              /* inside a Slurm allocation, the fewest tasks it gives a node
                                   (Open MPI's slots there); 0 outside one */
  const tnt__hostlist_t *hosts; /* NULL for a run on this host only */
  int per_host;                 /* ranks on each host */
  int total;                    /* ranks in all */
  const char *gpus;             /* comma-separated GPUs for local ranks; NULL for CPU ranks */
  const char *interpreter;      /* Python for a script; NULL for an executable */
  const char *program;          /* the program, as the ranks will start it */
  char *const *envp;            /* the launcher's environment */
} tnt__launch_plan_t;

typedef struct {
  tnt__strvec_t argv; /* the MPI launcher and its arguments */
  tnt__strvec_t env;  /* NAME=VALUE set in its environment and exported, sorted by name */
} tnt__command_t;

/*
 * Builds the command. The environment exported to every rank is: the
 * launcher's TNT_* and TF_* variables, PATH, PYTHONPATH and
 * LD_LIBRARY_PATH; then what the options set (TNT_LOG_LEVEL, ...); then the
 * -x variables, later ones winning. Returns 0, or -1 with a message in err
 * (a -x NAME whose NAME is not set, a setting with a bad value, or no
 * memory).
 */
int tnt__command_build(const tnt__launch_plan_t *plan, tnt__command_t *cmd, char *err,
                       size_t err_len);

void tnt__command_free(tnt__command_t *cmd);

/* The environment exported to every rank (as tnt__command_build makes it,
 * sorted by name) into env, which the caller frees. The TNT_* settings in
 * it are checked by the settings registry, which then holds them; the names
 * that the options and -x gave are listed in TNT_COMMAND_LINE_SETTINGS.
 * Returns 0, or -1 with a message in err. */
int tnt__command_env(const tnt__options_t *o, char *const *envp, tnt__strvec_t *env, char *err,
                     size_t err_len);

/* Writes the command as a shell script: one export per variable, then the
 * command line, every word quoted where needed. Returns 0, or -1 on a
 * write error. */
int tnt__command_print(const tnt__command_t *cmd, FILE *out);

/* Whether name is exported to the ranks when it is set in the launcher's
 * environment. */
int tnt__env_name_exported(const char *name, size_t len);

#endif
