/*
 * Rank status files. Every rank's wrapper writes <run dir>/rank<R>.status
 * when it starts and again when its program has ended; the launcher reads
 * them during the run (to notice a failure early) and after it (to say
 * which rank failed, on which host, and where its log is). Files on a
 * shared run directory work across hosts, and they say more than the MPI
 * launcher's exit code. The program itself creates <run dir>/rank<R>.progress
 * once it completed a training step, which tells the launcher that a
 * failed attempt had got somewhere and is worth restarting.
 */
#ifndef TNT_LAUNCHER_STATUS_H
#define TNT_LAUNCHER_STATUS_H

#include <stddef.h>

typedef struct {
  int rank;
  char host[256];
  long pid;             /* of the program (0 before it started) */
  long wrapper_pid;     /* of the rank's wrapper */
  int finished;         /* 0 while the program runs (or when its wrapper died) */
  int exit_code;        /* when the program exited by itself */
  int signal;           /* the signal that ended it, or 0 */
  int ended_by_request; /* the wrapper was told to end it (job abort, interrupt) */
  double end_time;      /* wall-clock seconds when it ended */
} tnt__rank_status_t;

/* Writes the status as "key=value" lines. Returns the length, like snprintf. */
int tnt__status_format(const tnt__rank_status_t *s, char *buf, size_t len);

/* Parses what tnt__status_format wrote. Returns 0, or -1 when a field is
 * missing or malformed. */
int tnt__status_parse(const char *buf, tnt__rank_status_t *s);

/* Writes run_dir/rank<R>.status so that readers never see half a file. */
int tnt__status_write(const char *run_dir, const tnt__rank_status_t *s);

/* Reads rank's status. Returns 0, or -1 when there is none (yet). */
int tnt__status_read(const char *run_dir, int rank, tnt__rank_status_t *s);

/* Removes rank's status and progress files, left by an earlier run. */
void tnt__status_remove(const char *run_dir, int rank);

/* The file in which rank's program records that it completed a step (the
 * wrapper passes its path on as TNT_PROGRESS_FILE). */
void tnt__progress_path(const char *run_dir, int rank, char *buf, size_t len);

/* Whether any of the first `ranks` ranks recorded a completed step. */
int tnt__status_progressed(const char *run_dir, int ranks);

/* Whether the status records a failure: a non-zero exit or a signal. */
int tnt__status_failed(const tnt__rank_status_t *s);

/* Describes how the program ended ("exit code 3", "killed by signal 9
 * (Killed)") into buf. */
void tnt__status_describe(const tnt__rank_status_t *s, char *buf, size_t len);

#endif
