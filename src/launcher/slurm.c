/* Parsing the host list and task counts of a Slurm allocation. */
#include "slurm.h"

#include <stdio.h>
#include <string.h>

#include "strvec.h"

/* The most digits of a number in a host list or a task count. */
#define TNT__SLURM_MAX_DIGITS 9

/* Reads a decimal number of 1..TNT__SLURM_MAX_DIGITS digits at *p and
 * moves *p past it. Returns its digit count, or 0 when there is none or it
 * is too long. */
static int read_number(const char **p, const char *end, unsigned long *value) {
  int digits = 0;
  unsigned long v = 0;
  const char *s = *p;
  while (s < end && *s >= '0' && *s <= '9') {
    if (++digits > TNT__SLURM_MAX_DIGITS) return 0;
    v = v * 10 + (unsigned long)(*s++ - '0');
  }
  *p = s;
  *value = v;
  return digits;
}

/* One range of a bracket group: lo, or lo-hi. */
typedef struct {
  unsigned long lo, hi;
  int width; /* the digits of lo: every number is zero-padded to it */
} range_t;

/* Reads the range at *p (inside a group that ends at close) and moves *p
 * to the ',' or ']' after it. Returns 0, or -1 with a message about item. */
static int read_range(const char **p, const char *close, range_t *r, const char *item, int item_len,
                      char *err, size_t err_len) {
  const char *start = *p;
  r->width = read_number(p, close, &r->lo);
  r->hi = r->lo;
  int ok = r->width > 0;
  if (ok && *p < close && **p == '-') {
    ++*p;
    ok = read_number(p, close, &r->hi) > 0;
  }
  if (!ok || (*p < close && **p != ',')) {
    int shown = (int)strcspn(start, ",]");
    tnt__set_error(err, err_len,
                   "'%.*s': '%.*s' in brackets is not a number or a range of numbers (such as "
                   "7 or 01-12, at most %d digits)",
                   item_len, item, shown, start, TNT__SLURM_MAX_DIGITS);
    return -1;
  }
  if (r->hi < r->lo) {
    tnt__set_error(err, err_len, "'%.*s': the range %lu-%lu runs backwards", item_len, item, r->lo,
                   r->hi);
    return -1;
  }
  return 0;
}

/* Checks one item (a name with bracket groups; no ',' outside brackets)
 * and counts the names it expands to (at most TNT__SLURM_MAX_HOSTS + 1). */
static int count_item(const char *item, const char *end, unsigned long *count, char *err,
                      size_t err_len) {
  const int len = (int)(end - item);
  unsigned long total = 1;
  for (const char *p = item; p < end; ++p) {
    if (*p == ']') {
      tnt__set_error(err, err_len, "'%.*s': ']' without its '['", len, item);
      return -1;
    }
    if (*p != '[') continue;
    const char *close = memchr(p, ']', (size_t)(end - p));
    const char *nested = memchr(p + 1, '[', (size_t)((close != NULL ? close : end) - p - 1));
    if (close == NULL || nested != NULL) {
      tnt__set_error(err, err_len, "'%.*s': '[' without its ']'", len, item);
      return -1;
    }
    if (close == p + 1) {
      tnt__set_error(err, err_len, "'%.*s': empty brackets", len, item);
      return -1;
    }
    unsigned long in_group = 0;
    for (const char *q = p + 1; in_group <= TNT__SLURM_MAX_HOSTS; ++q) {
      range_t r;
      if (read_range(&q, close, &r, item, len, err, err_len) != 0) return -1;
      in_group += r.hi - r.lo + 1;
      if (q == close) break;
    }
    total *= in_group;
    if (total > TNT__SLURM_MAX_HOSTS) break;
    p = close;
  }
  *count = total;
  return 0;
}

/* Appends every name of item[p..end) to out, each after the name[0..used)
 * expanded so far; groups expand leftmost first ("a[1-2]b[3-4]" is a1b3,
 * a1b4, a2b3, a2b4). The item was checked by count_item. */
static int expand(const char *item, const char *p, const char *end, char *name, size_t used,
                  tnt__hostlist_t *out, char *err, size_t err_len) {
  const char *open = memchr(p, '[', (size_t)(end - p));
  size_t literal = (size_t)((open != NULL ? open : end) - p);
  if (used + literal > TNT__HOST_NAME_MAX) goto too_long;
  memcpy(name + used, p, literal);
  used += literal;
  if (open == NULL) {
    char msg[512];
    if (tnt__host_name_check(name, used, msg, sizeof msg) != 0) {
      tnt__set_error(err, err_len, "'%.*s': %s", (int)(end - item), item, msg);
      return -1;
    }
    return tnt__hostlist_add(out, name, used, out->count + 1, err, err_len);
  }
  const char *close = memchr(open, ']', (size_t)(end - open));
  for (const char *q = open + 1;; ++q) {
    range_t r;
    if (read_range(&q, close, &r, item, (int)(end - item), err, err_len) != 0) return -1;
    for (unsigned long v = r.lo; v <= r.hi; ++v) {
      int n = snprintf(name + used, TNT__HOST_NAME_MAX + 1 - used, "%0*lu", r.width, v);
      if (used + (size_t)n > TNT__HOST_NAME_MAX) goto too_long;
      if (expand(item, close + 1, end, name, used + (size_t)n, out, err, err_len) != 0) return -1;
    }
    if (q == close) break;
  }
  return 0;
too_long:
  tnt__set_error(err, err_len, "'%.*s': a host name longer than %d characters", (int)(end - item),
                 item, TNT__HOST_NAME_MAX);
  return -1;
}

/* The end of the item that starts at p: the next ',' outside brackets. */
static const char *item_end(const char *p) {
  int depth = 0;
  for (; *p != '\0'; ++p) {
    if (*p == '[') depth = 1;
    if (*p == ']') depth = 0;
    if (*p == ',' && depth == 0) break;
  }
  return p;
}

int tnt__slurm_hostlist_parse(const char *text, tnt__hostlist_t *out, char *err, size_t err_len) {
  int rc = -1;
  memset(out, 0, sizeof *out);
  if (err != NULL && err_len > 0) err[0] = '\0';
  if (*text == '\0') {
    tnt__set_error(err, err_len, "no host names");
    return -1;
  }
  /* Every item is checked before any is expanded, so that a mistake is
   * reported whatever the size of the list. */
  unsigned long total = 0;
  for (const char *p = text;; ++p) {
    const char *end = item_end(p);
    if (end == p) {
      tnt__set_error(err, err_len, "an empty item (two commas in a row, or one at an end)");
      goto out;
    }
    unsigned long count = 0;
    if (count_item(p, end, &count, err, err_len) != 0) goto out;
    total += count;
    if (total > TNT__SLURM_MAX_HOSTS) {
      tnt__set_error(err, err_len, "more than %d hosts", TNT__SLURM_MAX_HOSTS);
      goto out;
    }
    p = end;
    if (*p == '\0') break;
  }
  char name[TNT__HOST_NAME_MAX + 1];
  for (const char *p = text;; ++p) {
    const char *end = item_end(p);
    if (expand(p, p, end, name, 0, out, err, err_len) != 0) goto out;
    p = end;
    if (*p == '\0') break;
  }
  rc = 0;
out:
  return tnt__hostlist_finish(out, rc, 0, err, err_len);
}

int tnt__slurm_tasks_parse(const char *text, int *nodes, int *min, int *max, char *err,
                           size_t err_len) {
  const char *end = text + strlen(text);
  long total = 0;
  *min = 0;
  *max = 0;
  *nodes = 0;
  for (const char *p = text;; ++p) {
    const char *start = p;
    unsigned long tasks = 0, times = 1;
    int ok = read_number(&p, end, &tasks) > 0 && tasks >= 1;
    if (ok && strncmp(p, "(x", 2) == 0) {
      p += 2;
      ok = read_number(&p, end, &times) > 0 && times >= 1 && *p == ')';
      if (ok) ++p;
    }
    if (!ok || (*p != ',' && *p != '\0')) {
      tnt__set_error(err, err_len,
                     "'%.*s' is not a task count (a number from 1, or N(xM) for M nodes of N "
                     "tasks each)",
                     (int)strcspn(start, ","), start);
      return -1;
    }
    total += (long)times;
    if (total > TNT__SLURM_MAX_HOSTS) {
      tnt__set_error(err, err_len, "task counts for more than %d nodes", TNT__SLURM_MAX_HOSTS);
      return -1;
    }
    if (*min == 0 || (int)tasks < *min) *min = (int)tasks;
    if ((int)tasks > *max) *max = (int)tasks;
    if (*p == '\0') break;
  }
  *nodes = (int)total;
  return 0;
}
