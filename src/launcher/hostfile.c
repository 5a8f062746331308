/* Hostfile parsing and validation. */
#include "hostfile.h"
#include "strvec.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Letters, digits, '-', '.' and '_': what host names and IPv4 addresses
 * are made of. Anything else (quotes, ':' or '=' in particular) would be
 * misread by mpirun's host syntax or by a shell. */
static int host_char(char c) {
  return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_';
}

/* The arrays hold 8 names, then grow by doubling whenever they are full:
 * at 8, 16, 32, ... names. */
int tnt__hostlist_add(tnt__hostlist_t *list, const char *name, size_t len, int line, char *err,
                      size_t err_len) {
  const int n = list->count;
  if (n == 0 || (n >= 8 && (n & (n - 1)) == 0)) {
    int cap = n == 0 ? 8 : n * 2;
    char **names = realloc(list->names, (size_t)cap * sizeof *names);
    if (names == NULL) goto no_memory;
    list->names = names;
    int *lines = realloc(list->lines, (size_t)cap * sizeof *lines);
    if (lines == NULL) goto no_memory;
    list->lines = lines;
  }
  char *copy = strndup(name, len);
  if (copy == NULL) goto no_memory;
  list->names[list->count] = copy;
  list->lines[list->count] = line;
  list->count++;
  return 0;
no_memory:
  tnt__set_error(err, err_len, "out of memory");
  return -1;
}

int tnt__host_name_check(const char *name, size_t len, char *err, size_t err_len) {
  if (len > TNT__HOST_NAME_MAX) {
    tnt__set_error(err, err_len, "host name longer than %d characters", TNT__HOST_NAME_MAX);
    return -1;
  }
  for (size_t i = 0; i < len; ++i) {
    if (!host_char(name[i])) {
      unsigned char c = (unsigned char)name[i];
      if (isprint(c)) {
        tnt__set_error(err, err_len,
                       "'%.*s' is not a host name: '%c' is not allowed (letters, digits, '-', '.' "
                       "and '_' are)",
                       (int)len, name, c);
      } else {
        tnt__set_error(err, err_len,
                       "not a host name: byte 0x%02x is not allowed (is this a text file?)", c);
      }
      return -1;
    }
  }
  if (name[0] == '-' || name[0] == '.') {
    tnt__set_error(err, err_len, "'%.*s' is not a host name: it starts with '%c'", (int)len, name,
                   name[0]);
    return -1;
  }
  return 0;
}

/* Validates one trimmed, non-empty line. Returns 0, or -1 with err set. */
static int check_name(const char *name, size_t len, int line, char *err, size_t err_len) {
  for (size_t i = 0; i < len; ++i) {
    if (isspace((unsigned char)name[i])) {
      size_t shown = len < 60 ? len : 60;
      tnt__set_error(err, err_len,
                     "line %d: expected one host name, found '%.*s' (give the number of ranks "
                     "per host with --n-per-node, not in the hostfile)",
                     line, (int)shown, name);
      return -1;
    }
  }
  char msg[512];
  if (tnt__host_name_check(name, len, msg, sizeof msg) != 0) {
    tnt__set_error(err, err_len, "line %d: %s", line, msg);
    return -1;
  }
  return 0;
}

/* One entry of the sorted copy that duplicate detection works on. */
typedef struct {
  const char *name;
  int index;
} sort_entry_t;

/* By name (case-insensitively, as DNS compares), then by position, so that
 * duplicates end up next to each other in file order. */
static int compare_entries(const void *a, const void *b) {
  const sort_entry_t *ea = a, *eb = b;
  int c = strcasecmp(ea->name, eb->name);
  if (c != 0) return c;
  return (ea->index > eb->index) - (ea->index < eb->index);
}

/* The duplicate whose second mention comes first, so that a message points
 * at the earliest line to fix: 1 with the two indexes, 0 when every name is
 * unique, -1 without memory. */
static int find_duplicate(const tnt__hostlist_t *list, int *first, int *second) {
  int found = 0;
  sort_entry_t *order = malloc((size_t)list->count * sizeof *order);
  if (order == NULL) return -1;
  for (int i = 0; i < list->count; ++i) {
    order[i].name = list->names[i];
    order[i].index = i;
  }
  qsort(order, (size_t)list->count, sizeof *order, compare_entries);
  for (int i = 1; i < list->count; ++i) {
    if (strcasecmp(order[i - 1].name, order[i].name) != 0) continue;
    /* Within a run of equal names, only the second entry is the first repeat. */
    if (i >= 2 && strcasecmp(order[i - 2].name, order[i].name) == 0) continue;
    if (!found || order[i].index < *second) {
      *first = order[i - 1].index;
      *second = order[i].index;
      found = 1;
    }
  }
  free(order);
  return found;
}

int tnt__hostfile_parse(const char *buf, size_t len, tnt__hostlist_t *out, char *err,
                        size_t err_len) {
  int rc = -1;
  memset(out, 0, sizeof *out);
  if (err != NULL && err_len > 0) err[0] = '\0';
  int line = 0;
  size_t pos = 0;
  while (pos < len) {
    ++line;
    size_t end = pos;
    while (end < len && buf[end] != '\n') ++end;
    size_t stop = end;
    /* A comment runs to the end of the line. */
    const char *hash = memchr(buf + pos, '#', end - pos);
    if (hash != NULL) stop = (size_t)(hash - buf);
    size_t a = pos, b = stop;
    while (a < b && isspace((unsigned char)buf[a])) ++a;
    while (b > a && isspace((unsigned char)buf[b - 1])) --b;
    if (b > a) {
      if (memchr(buf + a, '\0', b - a) != NULL) {
        tnt__set_error(err, err_len, "line %d: contains a NUL byte (is this a text file?)", line);
        goto out;
      }
      if (check_name(buf + a, b - a, line, err, err_len) != 0) goto out;
      if (tnt__hostlist_add(out, buf + a, b - a, line, err, err_len) != 0) goto out;
    }
    pos = end + 1;
  }
  if (out->count == 0) {
    tnt__set_error(err, err_len, "no host names in it (one name per line; '#' starts a comment)");
    goto out;
  }
  rc = 0;
out:
  return tnt__hostlist_finish(out, rc, 1, err, err_len);
}

int tnt__hostlist_finish(tnt__hostlist_t *list, int rc, int by_line, char *err, size_t err_len) {
  if (rc == 0) {
    int first = 0, second = 0;
    const int dup = find_duplicate(list, &first, &second);
    if (dup == 0) return 0;
    if (dup < 0) {
      tnt__set_error(err, err_len, "out of memory");
    } else if (by_line) {
      tnt__set_error(err, err_len,
                     "line %d: host '%s' is already listed on line %d; every host must appear "
                     "once (use --n-per-node for several ranks per host)",
                     list->lines[second], list->names[second], list->lines[first]);
    } else {
      tnt__set_error(err, err_len, "host '%s' is listed twice", list->names[second]);
    }
  }
  tnt__hostlist_free(list);
  return -1;
}

int tnt__host_is_local(const char *name, const char *local_name) {
  if (strcasecmp(name, "localhost") == 0 || strncmp(name, "127.", 4) == 0) return 1;
  if (local_name == NULL || *local_name == '\0') return 0;
  if (strcasecmp(name, local_name) == 0) return 1;
  /* The short name of this host (before the first dot) names it too, and
   * so does this host's full name when only the short one is known. */
  size_t short_len = strcspn(local_name, ".");
  size_t name_short = strcspn(name, ".");
  if (name[name_short] == '\0' && name_short == short_len &&
      strncasecmp(name, local_name, short_len) == 0) {
    return 1;
  }
  if (local_name[short_len] == '\0' && name_short == short_len &&
      strncasecmp(name, local_name, short_len) == 0) {
    return 1;
  }
  return 0;
}

int tnt__hostlist_check_local(const tnt__hostlist_t *list, const char *local_name, char *err,
                              size_t err_len) {
  int first = -1;
  for (int i = 0; i < list->count; ++i) {
    if (!tnt__host_is_local(list->names[i], local_name)) continue;
    if (first >= 0) {
      tnt__set_error(
          err, err_len,
          "line %d: '%s' and '%s' on line %d both name this host; every host must appear "
          "once (use --n-per-node for several ranks per host)",
          list->lines[i], list->names[i], list->names[first], list->lines[first]);
      return -1;
    }
    first = i;
  }
  return 0;
}

void tnt__hostlist_free(tnt__hostlist_t *list) {
  for (int i = 0; i < list->count; ++i) free(list->names[i]);
  free(list->names);
  free(list->lines);
  memset(list, 0, sizeof *list);
}
