/*
 * Logging. The level and the all-ranks switch are read once from the
 * settings (TNT_LOG_LEVEL, TNT_LOG_ON_ALL_DEVICES). The rank prefix is process-wide, except for threads that set
 * their own (ranks simulated as threads in tests).
 */
#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/settings.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static tnt__log_level_t log_level = TNT__LOG_INFO;
static int log_all_ranks = 0;
static int proc_rank = 0, proc_size = 1;
static _Thread_local int thread_rank = -1, thread_size = 0;
static _Thread_local char last_error[512];

static void log_init(void) {
  log_level = (tnt__log_level_t)tnt__setting_word(TNT__S_LOG_LEVEL);
  log_all_ranks = tnt__setting_on(TNT__S_LOG_ON_ALL_DEVICES);
}

void tnt__log_set_rank(int rank, int size, int per_thread) {
  if (per_thread) {
    thread_rank = rank;
    thread_size = size;
  } else {
    proc_rank = rank;
    proc_size = size;
  }
}

int tnt__log_enabled(tnt__log_level_t level) {
  pthread_once(&log_once, log_init);
  if (level < log_level) return 0;
  int rank = thread_rank >= 0 ? thread_rank : proc_rank;
  return level >= TNT__LOG_WARNING || log_all_ranks || rank == 0;
}

void tnt__error_clear(void) {
  last_error[0] = '\0';
}

void tnt__error_set(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

const char *tnt__error_message(void) {
  return last_error;
}

void tnt__log(tnt__log_level_t level, const char *fmt, ...) {
  if (level == TNT__LOG_ERROR) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
  }
  if (!tnt__log_enabled(level)) return;
  static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  int rank = thread_rank >= 0 ? thread_rank : proc_rank;
  int size = thread_rank >= 0 ? thread_size : proc_size;
  char line[1024];
  int n = snprintf(line, sizeof line, "[tnt %d/%d] %s: ", rank, size, names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  /* One write per line keeps lines from different threads whole. */
  fprintf(stderr, "%s\n", line);
}
