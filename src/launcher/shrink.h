/*
 * Shrinking a job to the hosts that remain (--min-ranks M, TNT_MIN_RANKS):
 * after a failed attempt, the launcher looks for the host that caused it,
 * and restarts the job without that host while at least M ranks remain.
 *
 * A host is blamed, in this order, when
 *   1. its ranks did not start while ranks of other hosts did (the host
 *      cannot be reached, or cannot start programs);
 *   2. its ranks stopped answering: their wrappers ended without writing
 *      how their program ended, which happens when the host goes away
 *      (reboot, power, network namespace removed), while the wrappers of
 *      other hosts did write it;
 *   3. the first rank that failed of its own was killed by a signal from
 *      outside the program (SIGKILL from the out-of-memory killer, SIGTERM
 *      from the host's shutdown), not a fault of the program (SIGSEGV, ...).
 * A failure that is none of these (a Python exception, a timeout, a rank
 * that exited with an error) is the program's, and no host is blamed.
 *
 * Ranks are placed in blocks, per_host consecutive ranks on each host in
 * the order of the host list (command.c), so that rank r runs on host
 * r / per_host.
 */
#ifndef TNT_LAUNCHER_SHRINK_H
#define TNT_LAUNCHER_SHRINK_H

#include <stddef.h>

#include "status.h"

/* What a failed attempt left: the status of every rank. */
typedef struct {
  int total;                        /* ranks of the attempt */
  int per_host;                     /* ranks on each host */
  const int *have;                  /* have[r]: rank r wrote a status */
  const tnt__rank_status_t *status; /* status[r], when have[r] */
  int first_failed;                 /* the first rank that failed of its own, or -1 */
} tnt__attempt_ranks_t;

typedef enum {
  TNT__BLAME_NONE = 0,
  TNT__BLAME_NOT_STARTED,       /* rule 1 */
  TNT__BLAME_STOPPED_ANSWERING, /* rule 2 */
  TNT__BLAME_SIGNAL             /* rule 3 */
} tnt__blame_t;

/* The index (in the host list) of the host that the attempt's failure is
 * blamed on, with the rule in *rule and why in one line ("its ranks did
 * not start"); -1 (and TNT__BLAME_NONE) when no host is to blame. Pure:
 * reads only its arguments. */
int tnt__blamed_host(const tnt__attempt_ranks_t *ar, tnt__blame_t *rule, char *why, size_t len);

#endif
