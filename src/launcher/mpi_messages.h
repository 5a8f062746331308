/*
 * The MPI launcher's own messages. Open MPI's mpirun writes its notices
 * (framed by lines of 74 dashes: "ORTE has lost communication with a remote
 * daemon", "mpirun noticed that process rank 1 ... exited on signal 9") and
 * the crash reports of its processes ("[host:1234] *** Process received
 * signal ***" and a backtrace) on its stderr, where the ranks' forwarded
 * output also arrives. The launcher reads that stream: the MPI launcher's
 * messages go to <run dir>/mpirun.log, everything else to the terminal, so
 * that the terminal shows the program's output and the launcher's own
 * one-line reports.
 */
#ifndef TNT_LAUNCHER_MPI_MESSAGES_H
#define TNT_LAUNCHER_MPI_MESSAGES_H

#include <pthread.h>
#include <stddef.h>

/* Whether the line (len bytes, without its newline) is the MPI launcher's
 * message. *in_frame carries whether a framed notice is open from one line
 * to the next (start with 0). Pure. */
int tnt__mpi_message_line(const char *line, size_t len, int *in_frame);

typedef struct {
  int read_fd; /* the reading end of the MPI launcher's stderr */
  int log_fd;  /* <run dir>/mpirun.log, opened on the first message */
  char log_path[4200];
  int stop;  /* set by tnt__mpi_messages_finish */
  int lines; /* the lines that went to the log */
  pthread_t thread;
} tnt__mpi_messages_t;

/* Starts sorting what the MPI launcher writes on its stderr: *child_fd is
 * the end to give the MPI launcher as its stderr (the caller closes it once
 * the child has it). Returns 0, or -1 with errno set. */
int tnt__mpi_messages_start(tnt__mpi_messages_t *m, const char *run_dir, int *child_fd);

/* After the MPI launcher and everything it started have ended: passes on
 * what is left and stops. Returns how many lines went to the log. */
int tnt__mpi_messages_finish(tnt__mpi_messages_t *m);

#endif
