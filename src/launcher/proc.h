/* Small process and path helpers for the launcher. */
#ifndef TNT_LAUNCHER_PROC_H
#define TNT_LAUNCHER_PROC_H

#include <stddef.h>

/*
 * Runs argv (looked up on PATH) with stdin and stderr on /dev/null and
 * captures up to len-1 bytes of its stdout into out (NUL-terminated). The
 * command is killed after timeout_s seconds, so a broken tool can never
 * hang the launcher. Returns its exit status (0-255), or -1 when it could
 * not run, was killed or timed out.
 */
int tnt__capture(char *const argv[], char *out, size_t len, int timeout_s);

/*
 * Finds an executable: a name containing '/' is taken as it is, anything
 * else is searched in the directories of path (a PATH value; NULL means
 * the default search path). Writes the path found to out and returns 0,
 * or returns -1 when there is no such executable.
 */
int tnt__which(const char *name, const char *path, char *out, size_t len);

/* Reads a whole file into a new NUL-terminated buffer (free it). Returns
 * NULL with errno set when it cannot be read or is larger than max_len. */
char *tnt__read_file(const char *path, size_t max_len, size_t *len_out);

/* Creates a directory and its parents (like mkdir -p). Returns 0 or -1. */
int tnt__mkdirs(const char *path);

/* Formats a message into err (truncating it when it does not fit). */
void tnt__errorf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The monotonic clock in seconds. */
double tnt__clock(void);

#endif
