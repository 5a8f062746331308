/*
 * Running and supervising the MPI launcher: it runs as a child in its own
 * process group; interrupts are passed on to it; a failed rank ends the
 * whole job within a bounded time; nothing it started outlives the run;
 * and the exit status and message say which rank failed, where, and where
 * its log is.
 */
#ifndef TNT_LAUNCHER_RUN_H
#define TNT_LAUNCHER_RUN_H

#include "command.h"
#include "status.h"

/* How one run of the command (an attempt of the job) ended. */
typedef struct {
  int start_failed;         /* it could not start (the message was printed) */
  int interrupted;          /* the signal that interrupted the launcher, or 0 */
  int mpi_status;           /* the MPI launcher's exit status (128+N for signal N) */
  int failed_rank;          /* the first rank that failed of its own, or -1 */
  tnt__rank_status_t first; /* that rank's status */
  int progressed;           /* some rank completed a step (tnt__status_progressed) */
  int mpi_messages;         /* lines of the MPI launcher's own that went to mpirun.log */
} tnt__attempt_t;

/* Runs cmd for plan until every process of it has ended; says nothing
 * about how it ended, which a describes. */
void tnt__run(const tnt__launch_plan_t *plan, const tnt__command_t *cmd, tnt__attempt_t *a);

/* Whether the attempt failed: it did not start, was interrupted, a rank
 * failed, or the MPI launcher did. */
int tnt__attempt_failed(const tnt__attempt_t *a);

/* Reports the end of the job's last attempt on stderr: which rank failed,
 * on which host, the ranks that failed after it, and the end of its log.
 * Returns the launcher's exit status: 0 when every rank succeeded, the
 * failed rank's status (128+N for signal N) otherwise. */
int tnt__run_report(const tnt__launch_plan_t *plan, const tnt__attempt_t *a);

/* Why a failed attempt failed, in one line without a newline: "rank 1 on
 * host h was killed by signal 9 (Killed) (log: DIR/rank1.log)". */
void tnt__attempt_describe(const tnt__launch_plan_t *plan, const tnt__attempt_t *a, char *buf,
                           size_t len);

#endif
