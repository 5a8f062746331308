/*
 * A growable vector of owned, NUL-terminated strings, always kept
 * NULL-terminated so that it can be handed to execve as an argument or
 * environment vector. Also shell quoting for printing commands, and the
 * error-message formatting that the parsers share.
 */
#ifndef TNT_LAUNCHER_STRVEC_H
#define TNT_LAUNCHER_STRVEC_H

#include <stddef.h>

typedef struct {
  char **items; /* items[count] is always NULL once anything was pushed */
  size_t count;
  size_t capacity;
} tnt__strvec_t;

/* Appends a copy of s. Returns 0, or -1 when memory runs out. */
int tnt__strvec_push(tnt__strvec_t *v, const char *s);

/* Appends a formatted string. Returns 0, or -1 when memory runs out. */
int tnt__strvec_pushf(tnt__strvec_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Formats a message into err[err_len] (nothing when err is NULL or
 * err_len is 0): how the parsers report what is wrong. */
void tnt__set_error(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Frees every string and the vector itself, leaving an empty vector. */
void tnt__strvec_free(tnt__strvec_t *v);

/*
 * Writes s to buf quoted for a POSIX shell (unchanged when it needs no
 * quoting). Returns the length the quoted text needs, like snprintf, so a
 * caller can size the buffer with a first call.
 */
size_t tnt__shell_quote(const char *s, char *buf, size_t len);

#endif
