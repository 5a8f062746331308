/* A job and its attempts: restarts after a failure. */
#include "restart.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proc.h"
#include "run.h"
#include "shrink.h"
#include "util/settings.h"

/* Sets the job's plan up for attempt `attempt` and builds its command. */
static int prepare_attempt(tnt__job_t *job, int attempt, char *err, size_t err_len) {
  tnt__command_free(&job->cmd);
  if (job->max_restarts > 0) {
    snprintf(job->attempt_dir, sizeof job->attempt_dir, "%s/attempt%d", job->run_dir, attempt);
    job->plan.run_dir = job->attempt_dir;
    job->plan.attempt = attempt;
  }
  return tnt__command_build(&job->plan, &job->cmd, err, err_len);
}

int tnt__job_init(tnt__job_t *job, const tnt__launch_plan_t *plan, char *err, size_t err_len) {
  memset(job, 0, sizeof *job);
  job->plan = *plan;
  job->run_dir = plan->run_dir;
  job->delay_s = plan->opts->restart_delay_s;
  /* Building the command reads the settings, --max-restarts among them. */
  if (tnt__command_build(&job->plan, &job->cmd, err, err_len) != 0) return -1;
  job->max_restarts = (int)tnt__setting_number(TNT__S_MAX_RESTARTS);
  double min_ranks = tnt__setting_number(TNT__S_MIN_RANKS);
  if (min_ranks > 0) {
    job->min_ranks = (int)min_ranks;
    if (job->max_restarts == 0) {
      tnt__errorf(err, err_len,
                  "--min-ranks (TNT_MIN_RANKS) applies to restarts; give --max-restarts N too");
      return -1;
    }
    if (plan->hosts == NULL) {
      tnt__errorf(err, err_len,
                  "--min-ranks (TNT_MIN_RANKS) leaves failed hosts out of a restart; give the "
                  "hosts with --hostfile");
      return -1;
    }
    if (job->min_ranks > plan->total) {
      tnt__errorf(err, err_len, "--min-ranks %d is more than the %d ranks the job starts with",
                  job->min_ranks, plan->total);
      return -1;
    }
    for (int h = 0; h < plan->hosts->count; ++h) {
      const char *name = plan->hosts->names[h];
      if (tnt__hostlist_add(&job->hosts, name, strlen(name), plan->hosts->lines[h], err,
                            err_len) != 0) {
        return -1;
      }
    }
    job->plan.hosts = &job->hosts;
  }
  return job->max_restarts > 0 ? prepare_attempt(job, 1, err, err_len) : 0;
}

void tnt__job_free(tnt__job_t *job) {
  tnt__command_free(&job->cmd);
  tnt__hostlist_free(&job->hosts);
}

/* The host the failed attempt a is blamed on (shrink.h), with why; -1 when
 * none is, or the job does not shrink. */
static int blamed_host(const tnt__job_t *job, const tnt__attempt_t *a, tnt__blame_t *rule,
                       char *why, size_t len) {
  const tnt__launch_plan_t *p = &job->plan;
  *rule = TNT__BLAME_NONE;
  if (job->min_ranks == 0 || a->interrupted || a->start_failed || job->hosts.count < 2) return -1;
  int *have = calloc((size_t)p->total, sizeof *have);
  tnt__rank_status_t *status = calloc((size_t)p->total, sizeof *status);
  int host = -1;
  *rule = TNT__BLAME_NONE;
  if (have != NULL && status != NULL) {
    for (int r = 0; r < p->total; ++r) have[r] = tnt__status_read(p->run_dir, r, &status[r]) == 0;
    tnt__attempt_ranks_t ar = {.total = p->total, .per_host = p->per_host, .have = have,
                               .status = status, .first_failed = a->failed_rank};
    host = tnt__blamed_host(&ar, rule, why, len);
  }
  free(have);
  free(status);
  return host;
}

/* Leaves host out of the job's next attempts when at least min_ranks
 * ranks remain on the others; says in one line whether it did. */
/* The ranks the job would have without one of its hosts. */
static int ranks_without_a_host(const tnt__job_t *job) {
  return (job->hosts.count - 1) * job->plan.per_host;
}

static void drop_host(tnt__job_t *job, int host, const char *why) {
  tnt__hostlist_t *h = &job->hosts;
  int remaining = ranks_without_a_host(job);
  if (remaining < job->min_ranks) {
    fprintf(stderr,
            "tarantella: host %s failed (%s) but is kept: without it %d rank(s) would remain, "
            "fewer than --min-ranks %d\n",
            h->names[host], why, remaining, job->min_ranks);
    return;
  }
  fprintf(stderr, "tarantella: host %s is dropped (%s); the job goes on with %d rank%s on %d "
          "host%s\n", h->names[host], why, remaining, remaining == 1 ? "" : "s", h->count - 1,
          h->count - 1 == 1 ? "" : "s");
  free(h->names[host]);
  memmove(h->names + host, h->names + host + 1, (size_t)(h->count - host - 1) * sizeof *h->names);
  memmove(h->lines + host, h->lines + host + 1, (size_t)(h->count - host - 1) * sizeof *h->lines);
  --h->count;
  job->plan.total = remaining;
}

static int is_fault_signal(int sig) {
  return sig == SIGSEGV || sig == SIGABRT || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

int tnt__same_error(const tnt__rank_status_t *a, const char *a_line, const tnt__rank_status_t *b,
                    const char *b_line) {
  if (!a->finished || !b->finished) return 0;
  if (a->signal != 0 || b->signal != 0) {
    if (a->signal != b->signal || !is_fault_signal(a->signal)) return 0;
  } else if (a->exit_code != b->exit_code) {
    return 0;
  }
  return strcmp(a_line, b_line) == 0;
}

/* The last line of text in a rank's log, as a terminal would show it (a
 * progress bar's last state), into line; "" when there is none. */
static void last_log_line(const char *run_dir, int rank, char *line, size_t cap) {
  char path[4200];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/rank%d.log", run_dir, rank);
  line[0] = '\0';
  char *text = tnt__read_file(path, (size_t)1 << 30, &len);
  if (text == NULL) return;
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) {
    --len;
  }
  size_t start = len;
  while (start > 0 && text[start - 1] != '\n' && text[start - 1] != '\r') --start;
  snprintf(line, cap, "%.*s", (int)(len - start), text + start);
  free(text);
}

/* Why attempt `attempt` of the job, which failed, is not followed by
 * another; NULL when it is. */
static const char *no_restart_reason(const tnt__job_t *job, int attempt, const tnt__attempt_t *a,
                                     int same_as_before, int host_lost_before_progress) {
  if (job->max_restarts == 0 || a->start_failed) return "";
  if (a->interrupted) return "the launcher was interrupted";
  if (!a->progressed && !host_lost_before_progress) {
    return "it failed before any rank completed a training step";
  }
  if (same_as_before) return "it failed with the same error as the attempt before it";
  if (attempt > job->max_restarts) return "the restart budget is spent";
  return NULL;
}

static void sleep_seconds(double s) {
  struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&t, &t) != 0) {
  }
}

int tnt__job_run(tnt__job_t *job) {
  char err[1024] = "", line[512] = "", previous_line[512] = "";
  tnt__rank_status_t previous;
  int have_previous = 0, progressed_before = 0;
  for (int attempt = 1;; ++attempt) {
    tnt__attempt_t a;
    tnt__run(&job->plan, &job->cmd, &a);
    if (!tnt__attempt_failed(&a)) {
      if (attempt > 1) {
        fprintf(stderr, "tarantella: attempt %d succeeded after %d restart(s)\n", attempt,
                attempt - 1);
      }
      return 0;
    }
    int same = 0;
    if (a.failed_rank >= 0) {
      last_log_line(job->plan.run_dir, a.failed_rank, line, sizeof line);
      same = have_previous && tnt__same_error(&previous, previous_line, &a.first, line);
      previous = a.first;
      memcpy(previous_line, line, sizeof line);
      have_previous = 1;
    } else {
      have_previous = 0;
    }
    char blame[256] = "";
    tnt__blame_t rule;
    int blamed = blamed_host(job, &a, &rule, blame, sizeof blame);
    /* Ranks that did not start on one host, in a job that made progress
     * before: the host was lost, not the program's fault. */
    int lost_host = rule == TNT__BLAME_NOT_STARTED && progressed_before && !a.progressed &&
                    ranks_without_a_host(job) >= job->min_ranks;
    progressed_before |= a.progressed;
    const char *stop = no_restart_reason(job, attempt, &a, same, lost_host);
    if (stop != NULL) {
      int code = tnt__run_report(&job->plan, &a);
      if (*stop != '\0') {
        fprintf(stderr,
                "tarantella: error: attempt %d of at most %d failed and is not restarted: %s\n",
                attempt, job->max_restarts + 1, stop);
      }
      return code;
    }
    char why[4600];
    tnt__attempt_describe(&job->plan, &a, why, sizeof why);
    fprintf(stderr, "tarantella: attempt %d failed: %s; restart %d of %d in %g s\n", attempt, why,
            attempt, job->max_restarts, job->delay_s);
    if (blamed >= 0) drop_host(job, blamed, blame);
    if (job->delay_s > 0) sleep_seconds(job->delay_s);
    if (prepare_attempt(job, attempt + 1, err, sizeof err) != 0) {
      fprintf(stderr, "tarantella: error: cannot restart: %s\n", err);
      return 1;
    }
    fprintf(stderr, "tarantella: attempt %d; logs in %s\n", attempt + 1, job->plan.run_dir);
  }
}
