/*
 * Rank mode: `tarantella --rank-exec [options] -- PROGRAM [ARGS...]`, the
 * command the MPI launcher starts for every rank. It gives the rank its GPU
 * (CUDA_VISIBLE_DEVICES by local rank), pins it to its NUMA node when asked,
 * tells the program its restart count (TNT_RESTART_COUNT) and where to
 * record its first completed step (TNT_PROGRESS_FILE), runs the program
 * with its output captured into <run dir>/rank<R>.log
 * (and shown on the terminal for rank 0, or every rank with
 * --output-on-all-devices), ends the program when the rank is told to end,
 * and records how it ended in <run dir>/rank<R>.status.
 */
#ifndef TNT_LAUNCHER_RANK_H
#define TNT_LAUNCHER_RANK_H

#include <stddef.h>

typedef struct {
  const char *run_dir;
  const char *gpus; /* comma-separated GPU names; NULL for a CPU rank */
  const char *restart_count; /* the attempt's restart count; NULL: 0 (no restarts) */
  int output_on_all_devices;
  int pin_to_socket;
  int pin_memory_to_socket;
  char *const *program_argv; /* points into argv */
} tnt__rank_options_t;

/* Parses argv[2..] (argv[1] is --rank-exec). Returns 0, or -1 with err set. */
int tnt__rank_options_parse(int argc, char *const argv[], tnt__rank_options_t *o, char *err,
                            size_t err_len);

/* Picks the GPU of a local rank from a comma-separated list into out; ""
 * when the list has fewer entries. */
void tnt__rank_pick_gpu(const char *gpus, int local_rank, char *out, size_t len);

/* Runs rank mode; returns the process exit status. */
int tnt__rank_main(int argc, char *argv[]);

#endif
