/*
 * Logging with levels and a rank prefix, to stderr:
 *   [tnt 3/8] WARNING: message
 * The level comes from TNT_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default
 * INFO). DEBUG and INFO lines are printed by rank 0 only unless
 * TNT_LOG_ON_ALL_DEVICES is true; warnings and errors by every rank, since
 * they name the rank that has the problem.
 */
#ifndef TNT_UTIL_LOG_H
#define TNT_UTIL_LOG_H

typedef enum tnt__log_level {
  TNT__LOG_DEBUG = 0,
  TNT__LOG_INFO = 1,
  TNT__LOG_WARNING = 2,
  TNT__LOG_ERROR = 3,
  TNT__LOG_OFF = 4
} tnt__log_level_t;

/* Sets the rank shown in the prefix for the calling thread and every thread
 * that has not set its own (ranks simulated as threads set their own). */
void tnt__log_set_rank(int rank, int size, int per_thread);

int tnt__log_enabled(tnt__log_level_t level);
void tnt__log(tnt__log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * The calling thread's error message: what tnt_last_error returns. Every
 * ERROR line sets it (without the prefix), so the reason a failing call
 * logs is also the reason it reports; tnt__error_set sets it without
 * logging. The API clears it when a call starts (tnt__error_clear) and
 * makes sure that a failing call leaves one (src/api/api.h). On the
 * engine thread it carries the reason of a failure into the context's
 * error message.
 */
void tnt__error_clear(void);
void tnt__error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *tnt__error_message(void);

#define TNT_LOG_DEBUG(...) tnt__log(TNT__LOG_DEBUG, __VA_ARGS__)
#define TNT_LOG_INFO(...) tnt__log(TNT__LOG_INFO, __VA_ARGS__)
#define TNT_LOG_WARN(...) tnt__log(TNT__LOG_WARNING, __VA_ARGS__)
#define TNT_LOG_ERROR(...) tnt__log(TNT__LOG_ERROR, __VA_ARGS__)

#endif
