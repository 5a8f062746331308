/* Building the launch plan from the options and the system. */
#include "plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpus.h"
#include "proc.h"
#include "slurm.h"
#include "util/settings.h"

/* The largest hostfile read; a cluster's list is a few hundred KB at most. */
#define TNT__HOSTFILE_MAX ((size_t)16 << 20)
/* Seconds a tool asked for its version or an interpreter probe may take. */
#define TNT__PROBE_TIMEOUT_S 20

static const char *env_get(char *const *envp, const char *name) {
  return tnt__env_lookup(envp, name, strlen(name));
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Whether a file starts with a #! line that names Python. */
static int has_python_shebang(const char *path) {
  char head[256];
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(head, 1, sizeof head - 1, f);
  fclose(f);
  head[n] = '\0';
  head[strcspn(head, "\n")] = '\0';
  return strncmp(head, "#!", 2) == 0 && strstr(head, "python") != NULL;
}

/* Decides how PROGRAM runs: a Python script through the interpreter, or
 * an executable found as given or on PATH. Sets *is_python. */
static int resolve_program(const char *name, char *const *envp, tnt__plan_storage_t *ps,
                           int *is_python, char *err, size_t err_len) {
  struct stat st;
  *is_python = 0;
  if (ends_with(name, ".py") || strchr(name, '/') != NULL) {
    if (stat(name, &st) != 0) {
      tnt__errorf(err, err_len, "program '%s' not found: %s", name, strerror(errno));
      return -1;
    }
    if (!S_ISREG(st.st_mode)) {
      tnt__errorf(err, err_len, "program '%s' is not a file", name);
      return -1;
    }
    *is_python = ends_with(name, ".py") || has_python_shebang(name);
    if (!*is_python && access(name, X_OK) != 0) {
      tnt__errorf(err, err_len,
                  "program '%s' is not executable (chmod +x it, or name its interpreter before it)",
                  name);
      return -1;
    }
    snprintf(ps->program, sizeof ps->program, "%s", name);
    return 0;
  }
  if (tnt__which(name, env_get(envp, "PATH"), ps->program, sizeof ps->program) != 0) {
    tnt__errorf(err, err_len,
                "program '%s' not found on PATH (for a file in this directory, write ./%s)", name,
                name);
    return -1;
  }
  *is_python = has_python_shebang(ps->program);
  return 0;
}

/* Asks an interpreter for its real path and whether it can import
 * Tarantella, without importing it (which would load TensorFlow). Returns
 * 1 when it can, 0 when it cannot, -1 when it does not run. */
static int probe_python(const char *python, char *real, size_t len) {
  char *argv[] = {(char *)python, "-c",
                  "import importlib.util, sys; print(sys.executable); "
                  "sys.exit(0 if importlib.util.find_spec('tarantella') else 3)",
                  NULL};
  char out[PATH_MAX];
  int st = tnt__capture(argv, out, sizeof out, TNT__PROBE_TIMEOUT_S);
  if (st != 0 && st != 3) return -1;
  out[strcspn(out, "\n")] = '\0';
  if (snprintf(real, len, "%s", out[0] == '/' ? out : python) >= (int)len) return -1;
  return st == 0;
}

static int resolve_interpreter(const tnt__options_t *opts, char *const *envp,
                               tnt__plan_storage_t *ps, char *err, size_t err_len) {
  const char *path = env_get(envp, "PATH");
  if (opts->python != NULL) {
    if (tnt__which(opts->python, path, ps->interpreter, sizeof ps->interpreter) != 0) {
      tnt__errorf(err, err_len, "--python-interpreter '%s': no such executable", opts->python);
      return -1;
    }
    return 0;
  }
  static const char *const candidates[] = {"python3", "python"};
  /* A launcher that pip installed into an environment's bin/ (a virtual
   * environment's, for instance) sits beside that environment's Python,
   * which is the one that has this Tarantella: it comes before PATH, so
   * that venv/bin/tarantella works without activating the environment. */
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL) *slash = '\0';
    for (size_t i = 0; slash != NULL && i < sizeof candidates / sizeof candidates[0]; ++i) {
      char found[PATH_MAX], real[PATH_MAX];
      if (snprintf(found, sizeof found, "%s/%s", self, candidates[i]) >= (int)sizeof found) break;
      if (access(found, X_OK) != 0) continue;
      if (probe_python(found, real, sizeof real) == 1) {
        snprintf(ps->interpreter, sizeof ps->interpreter, "%s", real);
        return 0;
      }
    }
  }
  char fallback[PATH_MAX] = "";
  for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; ++i) {
    char found[PATH_MAX], real[PATH_MAX];
    if (tnt__which(candidates[i], path, found, sizeof found) != 0) continue;
    int has = probe_python(found, real, sizeof real);
    if (has == 1) {
      snprintf(ps->interpreter, sizeof ps->interpreter, "%s", real);
      return 0;
    }
    if (has == 0 && fallback[0] == '\0') snprintf(fallback, sizeof fallback, "%s", real);
  }
  if (fallback[0] == '\0') {
    tnt__errorf(err, err_len, "no Python interpreter (python3) on PATH; give --python-interpreter");
    return -1;
  }
  fprintf(stderr,
          "tarantella: warning: Tarantella is not installed for %s; give the Python that has it "
          "with --python-interpreter\n",
          fallback);
  snprintf(ps->interpreter, sizeof ps->interpreter, "%s", fallback);
  return 0;
}

/* Asks a launcher for its version and tells Open MPI from MPICH. Returns
 * 0 with *flavor set, or -1 when it is neither (or does not run). */
static int detect_flavor(const char *mpirun, tnt__mpi_flavor_t *flavor) {
  char *argv[] = {(char *)mpirun, "--version", NULL};
  char out[4096];
  if (tnt__capture(argv, out, sizeof out, TNT__PROBE_TIMEOUT_S) < 0) return -1;
  if (strstr(out, "Open MPI") != NULL || strstr(out, "OpenRTE") != NULL) {
    *flavor = TNT__MPI_OPEN_MPI;
    return 0;
  }
  if (strstr(out, "HYDRA") != NULL || strstr(out, "MPICH") != NULL ||
      strstr(out, "Intel(R) MPI") != NULL) {
    *flavor = TNT__MPI_MPICH;
    return 0;
  }
  return -1;
}

static int resolve_mpi(char *const *envp, tnt__plan_storage_t *ps, char *err, size_t err_len) {
  const char *path = env_get(envp, "PATH");
  char forced[1024];
  if (*tnt__setting_text(TNT__S_MPIRUN, forced, sizeof forced) != '\0') {
    if (tnt__which(forced, path, ps->mpirun, sizeof ps->mpirun) != 0) {
      tnt__errorf(err, err_len, "TNT_MPIRUN=%s: no such executable", forced);
      return -1;
    }
    if (detect_flavor(ps->mpirun, &ps->plan.flavor) != 0) {
      tnt__errorf(err, err_len,
                  "TNT_MPIRUN=%s is neither Open MPI's mpirun nor MPICH's mpiexec (judging by "
                  "its --version)",
                  forced);
      return -1;
    }
    return 0;
  }
  static const char *const candidates[] = {"mpirun", "mpiexec"};
  for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; ++i) {
    if (tnt__which(candidates[i], path, ps->mpirun, sizeof ps->mpirun) != 0) continue;
    if (detect_flavor(ps->mpirun, &ps->plan.flavor) == 0) return 0;
  }
  tnt__errorf(err, err_len,
              "no MPI launcher found: install Open MPI (mpirun) or MPICH (mpiexec), or name one "
              "with TNT_MPIRUN");
  return -1;
}

static int load_hosts(const tnt__options_t *opts, int in_slurm, tnt__plan_storage_t *ps, char *err,
                      size_t err_len) {
  size_t len = 0;
  char *text = tnt__read_file(opts->hostfile, TNT__HOSTFILE_MAX, &len);
  if (text == NULL) {
    tnt__errorf(err, err_len, "hostfile '%s': %s", opts->hostfile, strerror(errno));
    return -1;
  }
  char msg[768] = "";
  int rc = tnt__hostfile_parse(text, len, &ps->hosts, msg, sizeof msg);
  free(text);
  char local[256] = "";
  gethostname(local, sizeof local - 1);
  if (rc == 0) rc = tnt__hostlist_check_local(&ps->hosts, local, msg, sizeof msg);
  if (rc != 0) tnt__errorf(err, err_len, "hostfile '%s': %s", opts->hostfile, msg);
  ps->hosts_kind = "the hostfile";
  snprintf(ps->hosts_from, sizeof ps->hosts_from, "the hostfile %s%s", opts->hostfile,
           in_slurm ? " (not the nodes of the Slurm allocation: --hostfile wins)" : "");
  return rc;
}

/* The variable that lists the nodes of the Slurm allocation the launcher
 * runs in (SLURM_NODELIST is the older name), or NULL outside one. */
static const char *slurm_nodes_var(char *const *envp) {
  static const char *const names[] = {"SLURM_JOB_NODELIST", "SLURM_NODELIST"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    const char *value = env_get(envp, names[i]);
    if (value != NULL && *value != '\0') return names[i];
  }
  return NULL;
}

/* The nodes of the Slurm allocation the launcher runs in (nodes_var names
 * the variable that lists them), and the tasks per node that decide the
 * ranks per host when the options do not. */
static int load_slurm(const tnt__options_t *opts, char *const *envp, const char *nodes_var,
                      tnt__plan_storage_t *ps, char *err, size_t err_len) {
  const char *nodes = env_get(envp, nodes_var);
  /* In a job step, srun has set the task variables to the step's. */
  const char *step = env_get(envp, "SLURM_STEP_ID");
  if (step != NULL && *step != '\0') {
    tnt__errorf(err, err_len,
                "tarantella runs in a Slurm job step (SLURM_STEP_ID=%s: under srun), whose "
                "variables describe the step, not the allocation; start it once in the allocation "
                "itself (in the sbatch script or the salloc shell), not under srun: it starts the "
                "ranks on every node",
                step);
    return -1;
  }
  char msg[768] = "";
  if (tnt__slurm_hostlist_parse(nodes, &ps->hosts, msg, sizeof msg) != 0) {
    tnt__errorf(err, err_len,
                "%s=%s: %s (inside a Slurm allocation tarantella runs on its nodes; give "
                "--hostfile to choose the hosts yourself)",
                nodes_var, nodes, msg);
    return -1;
  }
  ps->hosts_kind = "the Slurm allocation";
  const char *job = env_get(envp, "SLURM_JOB_ID");
  size_t used =
      (size_t)snprintf(ps->hosts_from, sizeof ps->hosts_from, "the Slurm allocation%s%s: %s=%s",
                       job != NULL ? ", job " : "", job != NULL ? job : "", nodes_var, nodes);
  /* A long node list is cut; what follows it is then left out. */
  if (used >= sizeof ps->hosts_from) used = sizeof ps->hosts_from - 1;
  /* The allocation's tasks on each node: Open MPI's slots there. */
  const char *tasks = env_get(envp, "SLURM_TASKS_PER_NODE");
  int count = 0, fewest = 0, most = 0;
  if (tasks != NULL) {
    if (tnt__slurm_tasks_parse(tasks, &count, &fewest, &most, msg, sizeof msg) != 0) {
      tnt__errorf(err, err_len, "SLURM_TASKS_PER_NODE=%s: %s", tasks, msg);
      return -1;
    }
    if (count != ps->hosts.count) {
      tnt__errorf(err, err_len,
                  "SLURM_TASKS_PER_NODE=%s gives the tasks of %d node(s), but %s=%s names %d",
                  tasks, count, nodes_var, nodes, ps->hosts.count);
      return -1;
    }
    ps->plan.slurm_slots = fewest;
  }
  if (opts->n_per_node > 0 || opts->nranks > 0) return 0;
  const char *source = "SLURM_NTASKS_PER_NODE";
  const char *asked = env_get(envp, source);
  if (asked != NULL && *asked != '\0') {
    int n = 0, lo = 0, hi = 0;
    if (tnt__slurm_tasks_parse(asked, &n, &lo, &hi, msg, sizeof msg) != 0 || n != 1) {
      tnt__errorf(err, err_len, "SLURM_NTASKS_PER_NODE=%s: %s", asked,
                  n > 1 ? "expected one number" : msg);
      return -1;
    }
    ps->slurm_per_node = lo;
  } else if (tasks == NULL) {
    tnt__errorf(err, err_len,
                "%s is set but neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE is: give "
                "the ranks per node with --n-per-node",
                nodes_var);
    return -1;
  } else if (fewest != most) {
    tnt__errorf(err, err_len,
                "the nodes of the Slurm allocation hold different numbers of tasks "
                "(SLURM_TASKS_PER_NODE=%s), but tarantella places the same number of ranks on "
                "every node: give it with --n-per-node, or allocate with --ntasks-per-node",
                tasks);
    return -1;
  } else {
    source = "SLURM_TASKS_PER_NODE";
    asked = tasks;
    ps->slurm_per_node = fewest;
  }
  snprintf(ps->hosts_from + used, sizeof ps->hosts_from - used, "; %d rank(s) per node from %s=%s",
           ps->slurm_per_node, source, asked);
  return 0;
}

/* Decides the number of ranks and whether they use GPUs. */
static int decide_ranks(const tnt__options_t *opts, char *const *envp, tnt__plan_storage_t *ps,
                        char *err, size_t err_len) {
  tnt__launch_plan_t *p = &ps->plan;
  char root[1024];
  tnt__setting_text(TNT__S_SYS_ROOT, root, sizeof root);
  int gpus = 0;
  if (!opts->no_gpu) {
    gpus = tnt__gpus_detect(root, env_get(envp, "CUDA_VISIBLE_DEVICES"), ps->gpus, sizeof ps->gpus);
    if (gpus < 0) gpus = 0;
  }
  int hosts = ps->hosts.count > 0 ? ps->hosts.count : 1;
  int explicit_count = 1;
  if (opts->n_per_node > 0) {
    p->per_host = opts->n_per_node;
  } else if (opts->nranks > 0 && hosts == 1) {
    p->per_host = opts->nranks;
  } else if (opts->nranks > 0) {
    if (opts->nranks % hosts != 0) {
      tnt__errorf(err, err_len,
                  "-n %d does not split evenly over the %d hosts of %s; give a multiple of %d, or "
                  "--n-per-node",
                  opts->nranks, hosts, ps->hosts_kind, hosts);
      return -1;
    }
    p->per_host = opts->nranks / hosts;
  } else if (ps->slurm_per_node > 0) {
    p->per_host = ps->slurm_per_node;
  } else {
    explicit_count = 0;
    p->per_host = gpus > 0 ? gpus : 1;
  }
  p->total = p->per_host * hosts;
  const char *where = hosts > 1 ? "per host" : "on this host";
  if (!opts->no_gpu && gpus == 0 && !explicit_count) {
    fprintf(stderr,
            "tarantella: warning: no GPU found: starting 1 CPU rank %s (--no-gpu silences "
            "this)\n",
            where);
  } else if (!opts->no_gpu && gpus > 0 && p->per_host > gpus) {
    fprintf(stderr,
            "tarantella: warning: %d ranks %s but only %d GPU(s): every rank runs on the CPU\n",
            p->per_host, where, gpus);
    gpus = 0;
  }
  p->gpus = gpus > 0 ? ps->gpus : NULL;
  if (opts->pin_to_socket) {
    int nodes = tnt__numa_node_count(root);
    if (nodes < p->per_host) {
      tnt__errorf(err, err_len,
                  "--pin-to-socket needs a NUMA node for each rank of a host, but this host has %d "
                  "NUMA node(s) for %d ranks per host; run fewer ranks per host or drop the option",
                  nodes, p->per_host);
      return -1;
    }
  }
  return 0;
}

static int decide_dirs(const tnt__options_t *opts, tnt__plan_storage_t *ps,
                       char *err, size_t err_len) {
  if (getcwd(ps->workdir, sizeof ps->workdir) == NULL) {
    tnt__errorf(err, err_len, "cannot tell the working directory: %s", strerror(errno));
    return -1;
  }
  char from_settings[1024];
  const char *dir = opts->run_dir != NULL
                        ? opts->run_dir
                        : tnt__setting_text(TNT__S_RUN_DIR, from_settings, sizeof from_settings);
  char name[128];
  if (dir == NULL || *dir == '\0') {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(name, sizeof name, "tarantella-run-%Y%m%d-%H%M%S", &tm);
    snprintf(name + strlen(name), sizeof name - strlen(name), "-%ld", (long)getpid());
    dir = name;
  }
  int n = dir[0] == '/' ? snprintf(ps->run_dir, sizeof ps->run_dir, "%s", dir)
                        : snprintf(ps->run_dir, sizeof ps->run_dir, "%s/%s", ps->workdir, dir);
  if (n < 0 || (size_t)n >= sizeof ps->run_dir) {
    tnt__errorf(err, err_len, "run directory name too long");
    return -1;
  }
  return 0;
}

int tnt__plan_make(const tnt__options_t *opts, char *const *envp, tnt__plan_storage_t *ps,
                   char *err, size_t err_len) {
  int rc = -1;
  memset(ps, 0, sizeof *ps);
  tnt__launch_plan_t *p = &ps->plan;
  p->opts = opts;
  p->envp = envp;
  /* The launcher's own settings, and a bad value of any, before anything starts. */
  if (tnt__settings_read(envp, err, err_len) != 0) goto out;
  int is_python = 0;
  if (resolve_program(opts->program_argv[0], envp, ps, &is_python, err, err_len) != 0) {
    goto out;
  }
  if (is_python && resolve_interpreter(opts, envp, ps, err, err_len) != 0) goto out;
  const char *slurm_nodes = slurm_nodes_var(envp);
  if (opts->hostfile != NULL) {
    if (load_hosts(opts, slurm_nodes != NULL, ps, err, err_len) != 0) goto out;
  } else if (slurm_nodes != NULL) {
    if (load_slurm(opts, envp, slurm_nodes, ps, err, err_len) != 0) goto out;
  }
  if (decide_ranks(opts, envp, ps, err, err_len) != 0) goto out;
  if (decide_dirs(opts, ps, err, err_len) != 0) goto out;
  if (resolve_mpi(envp, ps, err, err_len) != 0) goto out;
  ssize_t n = readlink("/proc/self/exe", ps->self, sizeof ps->self - 1);
  if (n <= 0) {
    tnt__errorf(err, err_len, "cannot find the tarantella executable: %s", strerror(errno));
    goto out;
  }
  ps->self[n] = '\0';
  p->mpirun = ps->mpirun;
  p->self = ps->self;
  p->run_dir = ps->run_dir;
  p->workdir = ps->workdir;
  p->is_root = geteuid() == 0;
  p->cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (p->cores < 1) p->cores = 1;
  p->hosts = ps->hosts.count > 0 ? &ps->hosts : NULL;
  p->interpreter = is_python ? ps->interpreter : NULL;
  p->program = ps->program;
  int hosts = p->hosts != NULL ? p->hosts->count : 1;
  if (hosts > 1) {
    snprintf(ps->summary, sizeof ps->summary, "%d ranks on %d hosts (%d per host), on %s%s",
             p->total, hosts, p->per_host, p->gpus != NULL ? "GPUs " : "the CPU",
             p->gpus != NULL ? p->gpus : "");
  } else {
    snprintf(ps->summary, sizeof ps->summary, "%d rank%s on %s, on %s%s", p->total,
             p->total == 1 ? "" : "s", p->hosts != NULL ? p->hosts->names[0] : "this host",
             p->gpus != NULL ? "GPUs " : "the CPU", p->gpus != NULL ? p->gpus : "");
  }
  rc = 0;
out:
  return rc;
}

void tnt__plan_free(tnt__plan_storage_t *ps) {
  tnt__hostlist_free(&ps->hosts);
}
