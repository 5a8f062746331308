/*
 * Turning the options into a launch plan: which program and interpreter,
 * which hosts, how many ranks, GPUs or CPUs, which MPI launcher. This is
 * where the launcher looks at the system (files, PATH, /dev, /sys); the
 * command built from the plan is then a pure function of it.
 */
#ifndef TNT_LAUNCHER_PLAN_H
#define TNT_LAUNCHER_PLAN_H

#include <limits.h>

#include "command.h"

typedef struct {
  tnt__launch_plan_t plan;
  tnt__hostlist_t hosts;
  char gpus[1024];
  char interpreter[PATH_MAX];
  char program[PATH_MAX];
  char mpirun[PATH_MAX];
  char self[PATH_MAX];
  char run_dir[PATH_MAX];
  char workdir[PATH_MAX];
  char summary[512];      /* one line: ranks, hosts, devices */
  char hosts_from[1024];  /* where the hosts came from; empty for this host only */
  const char *hosts_kind; /* "the hostfile" or "the Slurm allocation", for messages */
  int slurm_per_node;     /* the allocation's tasks per node, when they decide the ranks */
} tnt__plan_storage_t;

/*
 * Fills ps from the options and the environment. The hosts are those of
 * the hostfile; else, inside a Slurm allocation (SLURM_JOB_NODELIST or
 * SLURM_NODELIST set), the allocation's nodes; else this host. Prints
 * warnings (no GPU where one was expected, Tarantella missing from the
 * interpreter) on stderr. Returns 0, or -1 with a message in err. Release ps with
 * tnt__plan_free either way.
 */
int tnt__plan_make(const tnt__options_t *opts, char *const *envp, tnt__plan_storage_t *ps,
                   char *err, size_t err_len);

void tnt__plan_free(tnt__plan_storage_t *ps);

#endif
