/* Growable string vectors and shell quoting for the launcher. */
#include "strvec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int strvec_append_owned(tnt__strvec_t *v, char *s) {
  /* One slot more than the strings, for the terminating NULL. */
  if (v->count + 2 > v->capacity) {
    size_t cap = v->capacity ? v->capacity * 2 : 16;
    char **items = realloc(v->items, cap * sizeof *items);
    if (items == NULL) return -1;
    v->items = items;
    v->capacity = cap;
  }
  v->items[v->count++] = s;
  v->items[v->count] = NULL;
  return 0;
}

int tnt__strvec_push(tnt__strvec_t *v, const char *s) {
  char *copy = strdup(s);
  if (copy == NULL) return -1;
  if (strvec_append_owned(v, copy) != 0) {
    free(copy);
    return -1;
  }
  return 0;
}

int tnt__strvec_pushf(tnt__strvec_t *v, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0) return -1;
  if (strvec_append_owned(v, s) != 0) {
    free(s);
    return -1;
  }
  return 0;
}

void tnt__strvec_free(tnt__strvec_t *v) {
  for (size_t i = 0; i < v->count; ++i) free(v->items[i]);
  free(v->items);
  v->items = NULL;
  v->count = 0;
  v->capacity = 0;
}

/* Characters that a shell never interprets inside a word. */
static int shell_safe(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         strchr("@%+=:,./-_", c) != NULL;
}

size_t tnt__shell_quote(const char *s, char *buf, size_t len) {
  int safe = *s != '\0';
  for (const char *p = s; *p != '\0'; ++p) safe = safe && shell_safe(*p);
  size_t need = 0;
  /* Writes one character when it fits, and always counts it. */
#define QUOTE_PUT(ch)                     \
  do {                                    \
    if (need + 1 < len) buf[need] = (ch); \
    ++need;                               \
  } while (0)
  if (safe) {
    for (const char *p = s; *p != '\0'; ++p) QUOTE_PUT(*p);
  } else {
    /* Inside single quotes everything is literal except the quote itself,
     * which is written as '\'' (close, escaped quote, reopen). */
    QUOTE_PUT('\'');
    for (const char *p = s; *p != '\0'; ++p) {
      if (*p == '\'') {
        QUOTE_PUT('\'');
        QUOTE_PUT('\\');
        QUOTE_PUT('\'');
        QUOTE_PUT('\'');
      } else {
        QUOTE_PUT(*p);
      }
    }
    QUOTE_PUT('\'');
  }
#undef QUOTE_PUT
  if (len > 0) buf[need < len ? need : len - 1] = '\0';
  return need;
}

void tnt__set_error(char *err, size_t err_len, const char *fmt, ...) {
  if (err == NULL || err_len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}
