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

/* Runs cmd for plan. Returns the launcher's exit status: 0 when every rank
 * succeeded, the failed rank's status (128+N for signal N) otherwise. */
int tnt__run(const tnt__launch_plan_t *plan, const tnt__command_t *cmd);

#endif
