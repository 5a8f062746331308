/*
 * Rank mode. The wrapper stays alive next to the program so that it can
 * split the program's output between the log file and the terminal, pass
 * on a request to end, and report how the program ended even when a
 * signal killed it.
 *
 * Termination: the program runs in its own process group and dies with
 * the wrapper (PR_SET_PDEATHSIG); the wrapper dies with its parent (the MPI
 * launcher or its daemon). A request to end (SIGTERM, SIGINT, SIGHUP) is
 * passed to the program's group, and the group is killed if it has not
 * ended after a grace period, so no rank outlives its job.
 */
#include "rank.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpus.h"
#include "proc.h"
#include "status.h"
#include "util/settings.h"

/* Seconds a program has to end after it was asked to, before it is killed. */
#define TNT__RANK_KILL_GRACE_S 5.0
/* Seconds to keep reading output after the program ended: a process it
 * started may hold the pipes open, and must not keep the rank alive. */
#define TNT__RANK_DRAIN_S 2.0
/* Most output held back while a line is incomplete; a longer line is
 * passed on in pieces. */
#define TNT__LINE_MAX 4096
/* The set_mempolicy mode that restricts allocations to the given nodes. */
#define TNT__MPOL_BIND 2

int tnt__rank_options_parse(int argc, char *const argv[], tnt__rank_options_t *o, char *err,
                            size_t err_len) {
  memset(o, 0, sizeof *o);
  int have_devices = 0;
  int i = 2;
  for (; i < argc && strcmp(argv[i], "--") != 0; ++i) {
    const char *a = argv[i];
    if (strcmp(a, "--run-dir") == 0 && i + 1 < argc) {
      o->run_dir = argv[++i];
    } else if (strcmp(a, "--gpus") == 0 && i + 1 < argc) {
      o->gpus = argv[++i];
      have_devices = 1;
    } else if (strcmp(a, "--cpu") == 0) {
      o->gpus = NULL;
      have_devices = 1;
    } else if (strcmp(a, "--restart-count") == 0 && i + 1 < argc) {
      o->restart_count = argv[++i];
    } else if (strcmp(a, "--output-on-all-devices") == 0) {
      o->output_on_all_devices = 1;
    } else if (strcmp(a, "--pin-to-socket") == 0) {
      o->pin_to_socket = 1;
    } else if (strcmp(a, "--pin-memory-to-socket") == 0) {
      o->pin_memory_to_socket = 1;
      o->pin_to_socket = 1;
    } else {
      tnt__errorf(err, err_len, "rank mode: unexpected argument '%s'", a);
      return -1;
    }
  }
  if (o->run_dir == NULL || !have_devices || i + 1 >= argc) {
    tnt__errorf(err, err_len,
                "rank mode needs --run-dir DIR, --gpus LIST or --cpu, then -- PROGRAM");
    return -1;
  }
  o->program_argv = &argv[i + 1];
  return 0;
}

void tnt__rank_pick_gpu(const char *gpus, int local_rank, char *out, size_t len) {
  const char *p = gpus;
  out[0] = '\0';
  for (int k = 0; k < local_rank && p != NULL; ++k) {
    p = strchr(p, ',');
    if (p != NULL) ++p;
  }
  if (p == NULL || *p == '\0') return;
  size_t n = strcspn(p, ",");
  if (n >= len) n = len - 1;
  memcpy(out, p, n);
  out[n] = '\0';
}

/* The first of the variables that MPI launchers set for a rank, or fallback. */
static int env_int(const char *const names[], int fallback) {
  for (int i = 0; names[i] != NULL; ++i) {
    const char *v = getenv(names[i]);
    if (v != NULL && *v != '\0') return atoi(v);
  }
  return fallback;
}

static double wall_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Writes all of buf, retrying short writes. Returns 0 or -1. */
static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* What of one output stream of the program reaches the terminal. Output
 * is passed on in whole lines (or up to a '\r', for progress bars), so that
 * lines of ranks that share a terminal never run into each other; a partial
 * line is passed on once the program has been quiet for a moment. */
typedef struct {
  int fd;     /* the wrapper's own stdout or stderr */
  int shown;  /* anything of this stream reaches the terminal */
  int filter; /* only library messages ("[tnt r/n] LEVEL: ...") do */
  int tf_min_level; /* TF_CPP_MIN_LOG_LEVEL, for TensorFlow's early lines */
  int ok;     /* 0 once a write failed (the reader is gone) */
  int keep;   /* the current line is passed on */
  size_t col; /* characters of the current line so far */
  char head[5];
  char buf[TNT__LINE_MAX];
  size_t len;
} stream_t;

typedef struct {
  int log_fd;
  stream_t out, err;
} output_t;

static void stream_init(stream_t *s, int fd, int shown, int filter) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->shown = shown;
  s->filter = filter;
  s->ok = 1;
  s->keep = !filter;
  const char *level = getenv("TF_CPP_MIN_LOG_LEVEL");
  s->tf_min_level = level != NULL ? atoi(level) : 0;
}

static int starts_with(const char *line, size_t len, const char *prefix) {
  size_t n = strlen(prefix);
  return len >= n && memcmp(line, prefix, n) == 0;
}

/* TensorFlow logs a few lines while it is imported, before its logging is
 * set up, and then TF_CPP_MIN_LOG_LEVEL does not apply to them: absl's note
 * that logging is not initialized (a warning), and information such as
 * "oneDNN custom operations are on" (severity I, with the zero timestamp
 * absl uses before it is initialized). The terminal copy applies the level
 * the user set to these lines; the log keeps them. `line` is one whole line. */
static int tensorflow_early_line_hidden(const stream_t *s, const char *line, size_t len) {
  if (s->tf_min_level >= 1 && (starts_with(line, len, "I0000 00:00:") ||
                               starts_with(line, len, "To enable the following instructions:"))) {
    return 1;
  }
  return s->tf_min_level >= 2 &&
         starts_with(line, len, "WARNING: All log messages before absl::InitializeLog() is called");
}

static void stream_flush(stream_t *s) {
  const int whole_line = s->len > 0 && s->col == s->len && s->buf[s->len - 1] == '\n';
  if (whole_line && tensorflow_early_line_hidden(s, s->buf, s->len)) s->len = 0;
  if (s->len > 0 && s->shown && s->ok && s->keep && write_all(s->fd, s->buf, s->len) != 0) {
    s->ok = 0;
  }
  s->len = 0;
}

/* Passes on a partial line after a quiet moment, once it is known whether
 * it is a library message. */
static void stream_idle(stream_t *s) {
  if (!s->filter || s->col >= sizeof s->head) stream_flush(s);
}

static void stream_put(stream_t *s, const char *data, size_t n) {
  if (!s->shown) return;
  for (size_t i = 0; i < n; ++i) {
    char c = data[i];
    if (s->col < sizeof s->head) s->head[s->col] = c;
    s->col++;
    /* On ranks other than 0, stderr reaches the terminal only for library
     * messages: the library already decides, by --log-level and
     * --log-on-all-devices, which of them every rank prints. */
    if (s->filter && s->col == sizeof s->head) s->keep = memcmp(s->head, "[tnt ", 5) == 0;
    s->buf[s->len++] = c;
    if (c == '\n' || c == '\r' || s->len == sizeof s->buf) stream_flush(s);
    if (c == '\n') {
      s->col = 0;
      s->keep = !s->filter;
    }
  }
}

/* Copies what one pipe has. Returns 0 at end of file, 1 otherwise. */
static int copy_output(output_t *out, int fd, stream_t *s) {
  char buf[65536];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
  if (n <= 0) return 0;
  /* The log is the complete record; a failed write there cannot be helped
   * and must not stop the program. */
  (void)write_all(out->log_fd, buf, (size_t)n);
  stream_put(s, buf, (size_t)n);
  return 1;
}

/* Pins this process (and so the program it starts) to a NUMA node. */
static int pin_to_node(const tnt__rank_options_t *o, int node, char *err, size_t err_len) {
  char root[1024];
  tnt__setting_text(TNT__S_SYS_ROOT, root, sizeof root);
  cpu_set_t cpus;
  if (tnt__numa_node_cpus(root, node, &cpus) != 0) {
    tnt__errorf(err, err_len,
                "--pin-to-socket: this host has no NUMA node %d for local rank %d (found %d "
                "node(s))",
                node, node, tnt__numa_node_count(root));
    return -1;
  }
  if (sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
    tnt__errorf(err, err_len, "--pin-to-socket: cannot bind to the CPUs of NUMA node %d: %s", node,
                strerror(errno));
    return -1;
  }
  if (o->pin_memory_to_socket) {
    unsigned long mask[16] = {0};
    if (node >= (int)(sizeof mask * 8)) {
      tnt__errorf(err, err_len, "--pin-memory-to-socket: NUMA node %d is out of range", node);
      return -1;
    }
    mask[node / (8 * sizeof mask[0])] |= 1UL << (node % (8 * sizeof mask[0]));
    /* The memory policy survives fork and exec, like the affinity, so the
     * program allocates only on its node (what numactl --membind does). */
    if (syscall(SYS_set_mempolicy, TNT__MPOL_BIND, mask, sizeof mask * 8 + 1) != 0) {
      tnt__errorf(err, err_len, "--pin-memory-to-socket: cannot bind memory to NUMA node %d: %s",
                  node, strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* The child side of fork: becomes the program. Never returns. */
static void exec_program(char *const argv[], int out_fd, int err_fd, const sigset_t *mask,
                         pid_t wrapper) {
  setpgid(0, 0);
  /* Dies with the wrapper, whatever kills it. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != wrapper) _exit(127);
  sigprocmask(SIG_SETMASK, mask, NULL);
  signal(SIGPIPE, SIG_DFL);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  execvp(argv[0], argv);
  dprintf(STDERR_FILENO, "tarantella: cannot start %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

/* Runs the program and copies its output until it ended. Fills status. */
static int supervise(const tnt__rank_options_t *o, output_t *out, tnt__rank_status_t *status,
                     char *err, size_t err_len) {
  int rc = -1;
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  int sig_fd = -1;
  pid_t child = -1;
  sigset_t watched, old_mask;
  sigemptyset(&watched);
  sigaddset(&watched, SIGCHLD);
  sigaddset(&watched, SIGTERM);
  sigaddset(&watched, SIGINT);
  sigaddset(&watched, SIGHUP);
  sigprocmask(SIG_BLOCK, &watched, &old_mask);
  signal(SIGPIPE, SIG_IGN);
  sig_fd = signalfd(-1, &watched, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sig_fd < 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    tnt__errorf(err, err_len, "cannot set up the rank: %s", strerror(errno));
    goto out;
  }
  pid_t self = getpid();
  child = fork();
  if (child < 0) {
    tnt__errorf(err, err_len, "cannot start the program: %s", strerror(errno));
    goto out;
  }
  if (child == 0) exec_program(o->program_argv, out_pipe[1], err_pipe[1], &old_mask, self);
  /* Both sides set the group, so that a signal to it reaches the program
   * whichever runs first. */
  setpgid(child, child);
  close(out_pipe[1]);
  close(err_pipe[1]);
  out_pipe[1] = err_pipe[1] = -1;
  status->pid = child;
  /* Now the status names the program's process, which is what a person
   * looking for a rank wants to see (and to signal). */
  tnt__status_write(o->run_dir, status);

  int open_out = 1, open_err = 1, child_done = 0;
  double kill_at = 0, drain_until = 0;
  while (open_out || open_err || !child_done) {
    double now = tnt__clock();
    if (child_done && now >= drain_until) break;
    if (!child_done && kill_at > 0 && now >= kill_at) {
      kill(-child, SIGKILL);
      kill_at = 0;
    }
    struct pollfd p[3] = {{.fd = open_out ? out_pipe[0] : -1, .events = POLLIN},
                          {.fd = open_err ? err_pipe[0] : -1, .events = POLLIN},
                          {.fd = sig_fd, .events = POLLIN}};
    int r = poll(p, 3, 200);
    if (r < 0 && errno != EINTR) break;
    if (r == 0) {
      stream_idle(&out->out);
      stream_idle(&out->err);
    }
    if (r <= 0) continue;
    if (p[0].revents) open_out = copy_output(out, out_pipe[0], &out->out);
    if (p[1].revents) open_err = copy_output(out, err_pipe[0], &out->err);
    if (!p[2].revents) continue;
    struct signalfd_siginfo si;
    while (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
      int sig = (int)si.ssi_signo;
      if (sig == SIGCHLD) {
        int ws = 0;
        if (!child_done && waitpid(child, &ws, WNOHANG) == child) {
          child_done = 1;
          drain_until = tnt__clock() + TNT__RANK_DRAIN_S;
          status->finished = 1;
          status->end_time = wall_clock();
          status->exit_code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 0;
          status->signal = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
        }
      } else if (!child_done) {
        /* The first request is passed on politely; a second one, or the
         * grace period running out, kills. */
        status->ended_by_request = 1;
        kill(-child, kill_at > 0 ? SIGKILL : sig);
        if (kill_at == 0) kill_at = tnt__clock() + TNT__RANK_KILL_GRACE_S;
      }
    }
  }
  rc = 0;
out:
  /* Processes the program started in its group go with it. */
  if (child > 0) kill(-child, SIGKILL);
  stream_flush(&out->out);
  stream_flush(&out->err);
  for (int i = 0; i < 2; ++i) {
    if (out_pipe[i] >= 0) close(out_pipe[i]);
    if (err_pipe[i] >= 0) close(err_pipe[i]);
  }
  if (sig_fd >= 0) close(sig_fd);
  return rc;
}

int tnt__rank_main(int argc, char *argv[]) {
  int exit_code = 1;
  char err[1024] = "";
  tnt__rank_options_t o;
  output_t out = {.log_fd = -1};
  stream_init(&out.out, STDOUT_FILENO, 0, 0);
  stream_init(&out.err, STDERR_FILENO, 0, 0);
  tnt__rank_status_t status;
  memset(&status, 0, sizeof status);
  if (tnt__rank_options_parse(argc, argv, &o, err, sizeof err) != 0) goto out;

  static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", NULL};
  static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                           "PMI_LOCAL_RANK", NULL};
  int rank = env_int(rank_vars, 0);
  int local_rank = env_int(local_vars, 0);
  status.rank = rank;
  status.wrapper_pid = getpid();
  if (gethostname(status.host, sizeof status.host - 1) != 0) strcpy(status.host, "?");

  /* The rank ends when its MPI launcher or daemon does. */
  pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) goto out;

  if (tnt__mkdirs(o.run_dir) != 0) {
    tnt__errorf(err, sizeof err, "cannot create the run directory %s: %s", o.run_dir,
                strerror(errno));
    goto out;
  }
  char log_path[4200];
  snprintf(log_path, sizeof log_path, "%s/rank%d.log", o.run_dir, rank);
  out.log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (out.log_fd < 0) {
    tnt__errorf(err, sizeof err, "cannot write %s: %s", log_path, strerror(errno));
    goto out;
  }
  int show_all = rank == 0 || o.output_on_all_devices;
  stream_init(&out.out, STDOUT_FILENO, show_all, 0);
  stream_init(&out.err, STDERR_FILENO, 1, !show_all);

  /* Each rank sees only its own GPU, so that TensorFlow in every rank
   * uses device 0 and the ranks of a host never share one. A CPU rank
   * sees none at all. */
  char gpu[256] = "";
  if (o.gpus != NULL) tnt__rank_pick_gpu(o.gpus, local_rank, gpu, sizeof gpu);
  setenv("CUDA_VISIBLE_DEVICES", gpu, 1);
  /* Python buffers a pipe's output in large blocks; unbuffered, the log
   * holds everything up to the moment a rank fails. */
  setenv("PYTHONUNBUFFERED", "1", 0);
  /* Which attempt of the job this is (0 for the first), and where the
   * program records its first completed step (status.h). */
  setenv("TNT_RESTART_COUNT", o.restart_count != NULL ? o.restart_count : "0", 1);
  char progress_path[4200];
  tnt__progress_path(o.run_dir, rank, progress_path, sizeof progress_path);
  setenv("TNT_PROGRESS_FILE", progress_path, 1);
  if (o.pin_to_socket && pin_to_node(&o, local_rank, err, sizeof err) != 0) goto out;

  if (tnt__status_write(o.run_dir, &status) != 0) {
    tnt__errorf(err, sizeof err, "cannot write the status of rank %d in %s: %s", rank, o.run_dir,
                strerror(errno));
    goto out;
  }
  if (supervise(&o, &out, &status, err, sizeof err) != 0) goto out;
  if (status.signal != 0) {
    exit_code = 128 + status.signal;
  } else {
    exit_code = status.exit_code;
  }
out:
  if (err[0] != '\0') {
    /* A wrapper failure counts as a failure of the program. */
    dprintf(STDERR_FILENO, "tarantella: rank %d: %s\n", status.rank, err);
    if (out.log_fd >= 0) dprintf(out.log_fd, "tarantella: rank %d: %s\n", status.rank, err);
    status.finished = 1;
    status.exit_code = exit_code;
    status.end_time = wall_clock();
  }
  if (status.finished && o.run_dir != NULL) tnt__status_write(o.run_dir, &status);
  if (out.log_fd >= 0) close(out.log_fd);
  return exit_code;
}
