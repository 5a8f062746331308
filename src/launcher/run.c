/*
 * Supervision of a run.
 *
 * The launcher makes itself a child subreaper, so that the rank wrappers
 * Open MPI starts on this host become its children if mpirun dies first;
 * after mpirun has ended it ends and reaps whatever is left. While the job
 * runs it watches the rank status files: once a rank has failed, the MPI
 * launcher normally ends the job within a second or two, and the launcher
 * ends it itself if that has not happened after TNT_ABORT_GRACE_S.
 */
#include "run.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mpi_messages.h"
#include "proc.h"
#include "status.h"
#include "util/settings.h"

/* After a rank failed or an interrupt, the MPI launcher has
 * TNT_ABORT_GRACE_S seconds to end the job before the launcher terminates
 * it, and then TNT__KILL_GRACE_S before it kills it. */
#define TNT__KILL_GRACE_S 5.0
/* How often the status files are checked while the job runs. */
#define TNT__STATUS_POLL_S 0.5
/* Lines of a failed rank's log shown in the report. */
#define TNT__LOG_TAIL_LINES 12

/* The child side of fork: becomes the MPI launcher, with err_fd as its
 * stderr. Never returns. */
static void exec_mpi(const tnt__command_t *cmd, const sigset_t *mask, pid_t launcher, int err_fd) {
  setpgid(0, 0);
  dup2(err_fd, STDERR_FILENO);
  /* If the launcher is killed outright, mpirun ends the job. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher) _exit(127);
  sigprocmask(SIG_SETMASK, mask, NULL);
  for (size_t i = 0; i < cmd->env.count; ++i) putenv(cmd->env.items[i]);
  execv(cmd->argv.items[0], cmd->argv.items);
  dprintf(STDERR_FILENO, "tarantella: cannot run %s: %s\n", cmd->argv.items[0], strerror(errno));
  _exit(127);
}

/* The first rank whose status records a failure of its own (not one it was
 * told to end with), by the time it ended; -1 when there is none. */
static int first_failure(const tnt__launch_plan_t *plan, tnt__rank_status_t *found) {
  int rank = -1;
  for (int r = 0; r < plan->total; ++r) {
    tnt__rank_status_t s;
    if (tnt__status_read(plan->run_dir, r, &s) != 0) continue;
    if (!tnt__status_failed(&s) || s.ended_by_request) continue;
    if (rank < 0 || s.end_time < found->end_time) {
      *found = s;
      rank = r;
    }
  }
  return rank;
}

/* Whether the MPI launcher has ended a rank's program itself: it does so
 * when it gives the job up (a rank failed, or a host it lost), and from
 * then on it must end too, even if it hangs on a host it cannot reach. */
static int any_ended_by_request(const tnt__launch_plan_t *plan) {
  for (int r = 0; r < plan->total; ++r) {
    tnt__rank_status_t s;
    if (tnt__status_read(plan->run_dir, r, &s) == 0 && s.finished && s.ended_by_request) return 1;
  }
  return 0;
}

/* Whether every rank's wrapper has reported that its program ended. */
static int all_programs_ended(const tnt__launch_plan_t *plan) {
  for (int r = 0; r < plan->total; ++r) {
    tnt__rank_status_t s;
    if (tnt__status_read(plan->run_dir, r, &s) != 0 || !s.finished) return 0;
  }
  return 1;
}

/* Lists the processes whose parent is this process. Returns their count. */
static int list_children(pid_t *pids, int max) {
  int n = 0;
  DIR *proc = opendir("/proc");
  if (proc == NULL) return 0;
  pid_t self = getpid();
  struct dirent *e;
  while ((e = readdir(proc)) != NULL && n < max) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char path[300], text[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    /* The command name in parentheses may contain anything; the fields
     * after its last ')' are state, then parent. */
    const char *close_paren = strrchr(text, ')');
    char state;
    int ppid;
    if (close_paren != NULL && sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 &&
        ppid == self) {
      pids[n++] = (pid_t)atoi(e->d_name);
    }
  }
  closedir(proc);
  return n;
}

/* Ends every remaining descendant: the wrappers of local ranks come here
 * if mpirun died before them. They first get SIGTERM, which they pass on
 * to their programs, and SIGKILL if they are still there after a grace
 * period. */
static void end_leftovers(void) {
  double deadline = tnt__clock() + TNT__KILL_GRACE_S + 1.0;
  int term_sent = 0;
  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    pid_t pids[256];
    int n = list_children(pids, 256);
    if (n == 0) break;
    int late = tnt__clock() >= deadline;
    for (int i = 0; i < n; ++i) kill(pids[i], late ? SIGKILL : SIGTERM);
    if (late && term_sent) {
      /* Killed processes are gone at once; reap them and stop. */
      usleep(100000);
      while (waitpid(-1, NULL, WNOHANG) > 0) {
      }
      break;
    }
    term_sent = 1;
    usleep(100000);
  }
}

/* Prints the last lines of a rank's log, indented. */
static void print_log_tail(const char *path) {
  size_t len = 0;
  char *text = tnt__read_file(path, (size_t)1 << 30, &len);
  if (text == NULL || len == 0) {
    free(text);
    return;
  }
  size_t start = len;
  int lines = 0;
  if (start > 0 && text[start - 1] == '\n') --start;
  while (start > 0 && lines < TNT__LOG_TAIL_LINES) {
    --start;
    if (text[start] == '\n') ++lines;
  }
  if (text[start] == '\n') ++start;
  fprintf(stderr, "tarantella: the last lines of %s:\n", path);
  const char *p = text + start;
  while (*p != '\0') {
    size_t n = strcspn(p, "\n");
    /* Progress bars rewrite their line with '\r'; show only the last state. */
    const char *shown = p;
    for (size_t i = 0; i < n; ++i) {
      if (p[i] == '\r' && i + 1 < n) shown = p + i + 1;
    }
    fprintf(stderr, "  | %.*s\n", (int)(n - (size_t)(shown - p)), shown);
    p += n;
    if (*p == '\n') ++p;
  }
  free(text);
}

/* Names the first rank that failed, the ranks that failed after it, and
 * shows the end of the first one's log. Returns the launcher's status. */
static int report_failure(const tnt__launch_plan_t *plan, int failed_rank,
                          const tnt__rank_status_t *first) {
  char how[256], log_path[4200];
  tnt__status_describe(first, how, sizeof how);
  snprintf(log_path, sizeof log_path, "%s/rank%d.log", plan->run_dir, failed_rank);
  fprintf(stderr, "tarantella: error: rank %d on host %s failed: it %s; its log: %s\n", failed_rank,
          first->host, how, log_path);
  for (int r = 0; r < plan->total; ++r) {
    tnt__rank_status_t s;
    if (r == failed_rank || tnt__status_read(plan->run_dir, r, &s) != 0) continue;
    if (!tnt__status_failed(&s) || s.ended_by_request) continue;
    tnt__status_describe(&s, how, sizeof how);
    fprintf(stderr, "tarantella: then rank %d on host %s %s (log: %s/rank%d.log)\n", r, s.host, how,
            plan->run_dir, r);
  }
  print_log_tail(log_path);
  if (first->signal != 0) return 128 + first->signal;
  return first->exit_code > 0 && first->exit_code < 256 ? first->exit_code : 1;
}

/* When no rank reports a failure of its own but the MPI launcher failed:
 * some rank never reported, or the MPI launcher itself failed. */
static int report_mpi_failure(const tnt__launch_plan_t *plan, int mpi_status) {
  int silent = 0;
  for (int r = 0; r < plan->total; ++r) {
    tnt__rank_status_t s;
    if (tnt__status_read(plan->run_dir, r, &s) != 0) {
      fprintf(stderr, "tarantella: error: rank %d never started (log: %s/rank%d.log)\n", r,
              plan->run_dir, r);
      ++silent;
    } else if (!s.finished) {
      fprintf(stderr,
              "tarantella: error: rank %d on host %s ended without reporting how (its wrapper "
              "was killed); its log: %s/rank%d.log\n",
              r, s.host, plan->run_dir, r);
      ++silent;
    }
  }
  fprintf(stderr, "tarantella: error: %s exited with status %d%s%s%s\n", plan->mpirun,
          mpi_status, silent == plan->total ? " before any rank started; see its messages in " : "",
          silent == plan->total ? plan->run_dir : "", silent == plan->total ? "/mpirun.log" : "");
  return mpi_status > 0 && mpi_status < 256 ? mpi_status : 1;
}

int tnt__run_report(const tnt__launch_plan_t *plan, const tnt__attempt_t *a) {
  int code = 0;
  if (a->start_failed) {
    code = 1;
  } else if (a->interrupted) {
    fprintf(stderr, "tarantella: interrupted (%s); every rank was ended\n", strsignal(a->interrupted));
    code = 128 + a->interrupted;
  } else if (a->failed_rank >= 0) {
    code = report_failure(plan, a->failed_rank, &a->first);
  } else if (a->mpi_status != 0) {
    code = report_mpi_failure(plan, a->mpi_status);
  }
  if (code != 0 && a->mpi_messages > 0) {
    fprintf(stderr, "tarantella: %s's own messages (%d lines) are in %s/mpirun.log\n",
            plan->mpirun, a->mpi_messages, plan->run_dir);
  }
  return code;
}

int tnt__attempt_failed(const tnt__attempt_t *a) {
  return a->start_failed || a->interrupted || a->failed_rank >= 0 || a->mpi_status != 0;
}

void tnt__attempt_describe(const tnt__launch_plan_t *plan, const tnt__attempt_t *a, char *buf,
                           size_t len) {
  char how[256];
  if (a->failed_rank >= 0) {
    tnt__status_describe(&a->first, how, sizeof how);
    snprintf(buf, len, "rank %d on host %s %s (log: %s/rank%d.log)", a->failed_rank,
             a->first.host, how, plan->run_dir, a->failed_rank);
    return;
  }
  for (int r = 0; r < plan->total; ++r) {
    tnt__rank_status_t s;
    if (tnt__status_read(plan->run_dir, r, &s) != 0) {
      snprintf(buf, len, "rank %d never started (log: %s/rank%d.log)", r, plan->run_dir, r);
      return;
    }
    if (!s.finished) {
      snprintf(buf, len, "rank %d on host %s ended without reporting how (log: %s/rank%d.log)", r,
               s.host, plan->run_dir, r);
      return;
    }
  }
  snprintf(buf, len, "%s exited with status %d", plan->mpirun, a->mpi_status);
}

/* Sends sig to the MPI launcher's process group. */
static void signal_group(pid_t pgid, int sig) {
  if (kill(-pgid, sig) != 0 && errno == ESRCH) kill(pgid, sig);
}

void tnt__run(const tnt__launch_plan_t *plan, const tnt__command_t *cmd, tnt__attempt_t *a) {
  memset(a, 0, sizeof *a);
  a->failed_rank = -1;
  a->mpi_status = -1;
  a->start_failed = 1;
  sigset_t watched, old_mask;
  sigemptyset(&watched);
  sigaddset(&watched, SIGCHLD);
  sigaddset(&watched, SIGINT);
  sigaddset(&watched, SIGTERM);
  sigaddset(&watched, SIGHUP);
  sigprocmask(SIG_BLOCK, &watched, &old_mask);

  if (tnt__mkdirs(plan->run_dir) != 0) {
    fprintf(stderr, "tarantella: error: cannot create the run directory %s: %s\n", plan->run_dir,
            strerror(errno));
    goto out;
  }
  /* Status and progress files of an earlier run in the same directory
   * would be taken for this run's. */
  for (int r = 0; r < plan->total; ++r) tnt__status_remove(plan->run_dir, r);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  tnt__mpi_messages_t messages;
  int child_err = -1;
  if (tnt__mpi_messages_start(&messages, plan->run_dir, &child_err) != 0) {
    fprintf(stderr, "tarantella: error: cannot start %s: %s\n", plan->mpirun, strerror(errno));
    goto out;
  }
  fflush(NULL);
  pid_t self = getpid();
  pid_t mpi = fork();
  if (mpi == 0) exec_mpi(cmd, &old_mask, self, child_err);
  int fork_errno = errno;
  close(child_err);
  if (mpi < 0) {
    tnt__mpi_messages_finish(&messages);
    fprintf(stderr, "tarantella: error: cannot start %s: %s\n", plan->mpirun,
            strerror(fork_errno));
    goto out;
  }
  setpgid(mpi, mpi);
  a->start_failed = 0;

  double abort_grace = tnt__setting_number(TNT__S_ABORT_GRACE_S);
  int interrupted = 0, mpi_status = -1;
  double term_at = 0, kill_at = 0, next_poll = tnt__clock() + TNT__STATUS_POLL_S;
  int failure_seen = 0, all_ended = 0;
  while (mpi_status < 0) {
    double now = tnt__clock();
    if (term_at > 0 && now >= term_at) {
      signal_group(mpi, SIGTERM);
      term_at = 0;
      kill_at = now + TNT__KILL_GRACE_S;
    }
    if (kill_at > 0 && now >= kill_at) {
      signal_group(mpi, SIGKILL);
      kill_at = 0;
    }
    if (!all_ended && now >= next_poll) {
      tnt__rank_status_t s;
      next_poll = now + TNT__STATUS_POLL_S;
      if (!failure_seen && (first_failure(plan, &s) >= 0 || any_ended_by_request(plan))) {
        failure_seen = 1;
        if (term_at == 0 && kill_at == 0) term_at = now + abort_grace;
      }
      /* Once every rank's program has ended after a failure, the MPI
       * launcher has nothing left to end: when it stays (a host it cannot
       * reach any more), it is ended at once. */
      if (failure_seen && all_programs_ended(plan)) {
        all_ended = 1;
        if (kill_at == 0) term_at = now;
      }
    }
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&watched, &info, &tick);
    if (sig == SIGCHLD) {
      int ws = 0;
      pid_t done;
      /* Reap every child: orphaned wrappers may come here too. */
      while ((done = waitpid(-1, &ws, WNOHANG)) > 0) {
        if (done != mpi) continue;
        mpi_status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
      }
    } else if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (!interrupted) {
        interrupted = sig;
        fprintf(stderr, "tarantella: %s: ending every rank\n", strsignal(sig));
        /* Open MPI and MPICH end the whole job on SIGINT or SIGTERM. */
        signal_group(mpi, sig);
        term_at = tnt__clock() + abort_grace;
      } else {
        signal_group(mpi, SIGKILL);
      }
    }
  }
  /* Whatever is left of the MPI launcher's group goes with it. */
  kill(-mpi, SIGKILL);
  end_leftovers();
  a->mpi_messages = tnt__mpi_messages_finish(&messages);
  a->interrupted = interrupted;
  a->mpi_status = mpi_status;
  a->failed_rank = first_failure(plan, &a->first);
  a->progressed = tnt__status_progressed(plan->run_dir, plan->total);
out:
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
}
