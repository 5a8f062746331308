/* Environment parsing: positive numbers and switches. */
#include "util/env.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/log.h"

double tnt__env_double(const char *name, double fallback) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return fallback;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v <= 0) {
    if (fallback > 0) {
      TNT_LOG_WARN("ignoring %s=%s: expected a positive number; using %g", name, s, fallback);
    } else { /* a fallback <= 0 stands for a default computed elsewhere */
      TNT_LOG_WARN("ignoring %s=%s: expected a positive number; using the default", name, s);
    }
    return fallback;
  }
  return v;
}

int tnt__env_bool(const char *name, int fallback) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  const char *s = getenv(name);
  if (s == NULL) return fallback;
  while (isspace((unsigned char)*s)) ++s;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) --n;
  if (n == 0) return fallback;
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; ++i) {
    if (strlen(yes[i]) == n && strncasecmp(s, yes[i], n) == 0) return 1;
    if (strlen(no[i]) == n && strncasecmp(s, no[i], n) == 0) return 0;
  }
  /* Not TNT_LOG_WARN: the log reads its own switches with this function,
   * before its level is known. */
  tnt__log_raw("ignoring %s=%s: expected 1, true, yes or on, or 0, false, no or off", name, s);
  return fallback;
}
