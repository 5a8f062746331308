/*
 * A job and its attempts. Without restarts the job is one run of the MPI
 * command, its rank logs in the run directory. With --max-restarts N
 * (TNT_MAX_RESTARTS) a failed attempt is followed by another, up to N
 * times: the launcher has ended every process of the failed attempt
 * (run.h), logs why it failed in one line, waits --restart-delay seconds
 * and starts the next, whose rank logs go to <run dir>/attempt<K> (K = 1,
 * 2, ...) and whose ranks see TNT_RESTART_COUNT = K - 1.
 *
 * An attempt is not followed by another when restarting cannot help: it
 * was interrupted, it failed before any rank completed a training step
 * (status.h: the progress files), or it failed with the same error as the
 * attempt before it (the same exit code or program fault, and the same
 * last line in the failed rank's log). Signals sent from outside (SIGKILL,
 * SIGTERM, ...) are faults of the machine, never "the same error".
 *
 * With --min-ranks M (TNT_MIN_RANKS) and a host list, the next attempt
 * leaves out the host that the failed attempt is blamed on (shrink.h), as
 * long as at least M ranks remain on the others, with as many ranks per
 * host as before; the launcher says so in one line. An attempt whose ranks
 * did not start on one host is restarted without it even though it
 * completed no step, once an earlier attempt had.
 */
#ifndef TNT_LAUNCHER_RESTART_H
#define TNT_LAUNCHER_RESTART_H

#include <limits.h>

#include "command.h"
#include "status.h"

typedef struct {
  tnt__launch_plan_t plan; /* the current attempt's plan */
  tnt__command_t cmd;      /* and its command */
  const char *run_dir;     /* the job's run directory (not owned) */
  char attempt_dir[PATH_MAX];
  int max_restarts; /* 0: a single attempt, logging in run_dir itself */
  double delay_s;   /* between a failed attempt and the next */
  int min_ranks;    /* fewest ranks a shrunk job may run on; 0: never shrink */
  tnt__hostlist_t hosts; /* the hosts of the current attempt, when shrinking (owned) */
} tnt__job_t;

/* Prepares the first attempt of the job that plan describes (plan->run_dir
 * is the job's run directory and must outlive the job), with the restarts,
 * delay and fewest ranks that the options and settings give. Returns 0, or
 * -1 with a message in err (--min-ranks without restarts or hosts, or more
 * than the job's ranks). Release the job with tnt__job_free either way. */
int tnt__job_init(tnt__job_t *job, const tnt__launch_plan_t *plan, char *err, size_t err_len);

/* Runs the attempts; reports the end on stderr. Returns the launcher's exit
 * status: 0 once an attempt succeeded, else that of the last attempt (the
 * failed rank's status, 128+N for signal N). */
int tnt__job_run(tnt__job_t *job);

void tnt__job_free(tnt__job_t *job);

/* Whether two failed attempts failed with the same error of the program:
 * the same exit code, or the same fault signal (SIGSEGV, SIGABRT, SIGBUS,
 * SIGFPE, SIGILL), with the same last log line. */
int tnt__same_error(const tnt__rank_status_t *a, const char *a_line, const tnt__rank_status_t *b,
                    const char *b_line);

#endif
