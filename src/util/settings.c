/*
 * The settings registry (see settings.h and settings.def).
 */
#include "util/settings.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

enum { SWITCH = 1, NUMBER = 2, INTEGER = 4, CHOICE = 8, TEXT = 16, MIN_EXCLUSIVE = 32 };

typedef struct decl {
  const char *name;
  int kind;
  const char *default_value, *words;
  double min, max;
  const char *user, *help;
} decl_t;

#define TNT__SETTING(id, name, kind, def, words, min, max, user, help) \
  {name, kind, def, words, min, max, user, help},
static const decl_t decls[TNT__S_COUNT] = {
#include "util/settings.def"
};
#undef TNT__SETTING

/* The value in force of one setting. */
typedef struct value {
  char text[1024]; /* canonical text */
  char error[512];
  double number; /* NUMBER or INTEGER; -1 when a word */
  int word;      /* index in WORDS; -1 when a number */
  int on;        /* SWITCH */
  tnt__setting_source_t source;
} value_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int loaded = 0;
static value_t values[TNT__S_COUNT];

static const char *const yes_words[] = {"on", "1", "true", "yes"};
static const char *const no_words[] = {"off", "0", "false", "no"};

static const char *kind_name(int kind) {
  if (kind & SWITCH) return "switch";
  if (kind & NUMBER) return "number";
  if (kind & INTEGER) return "integer";
  if (kind & CHOICE) return "choice";
  return "text";
}

/* The index of `s` (n bytes, any case) among the "|"-separated `words`, or
 * -1. */
static int word_index(const char *words, const char *s, size_t n) {
  if (words == NULL) return -1;
  int i = 0;
  for (const char *w = words;; ++i) {
    const char *bar = strchr(w, '|');
    size_t len = bar == NULL ? strlen(w) : (size_t)(bar - w);
    if (len == n && strncasecmp(w, s, n) == 0) return i;
    if (bar == NULL) return -1;
    w = bar + 1;
  }
}

/* Copies word i of `words` into out. */
static void word_at(const char *words, int i, char *out, size_t cap) {
  const char *w = words;
  for (; i > 0; --i) w = strchr(w, '|') + 1;
  const char *bar = strchr(w, '|');
  size_t len = bar == NULL ? strlen(w) : (size_t)(bar - w);
  snprintf(out, cap, "%.*s", (int)len, w);
}

/* "a, b or c" of a "|"-separated list. */
static void list_words(const char *words, char *out, size_t cap) {
  size_t used = 0;
  out[0] = '\0';
  int n = 1;
  for (const char *p = words; *p; ++p) n += *p == '|';
  for (int i = 0; i < n; ++i) {
    char w[64];
    word_at(words, i, w, sizeof w);
    const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
    int k = snprintf(out + used, cap - used, "%s%s", sep, w);
    if (k < 0 || (size_t)k >= cap - used) return;
    used += (size_t)k;
  }
}

/* What a setting accepts, for its error message. */
static void accepted(const decl_t *d, char *out, size_t cap) {
  char words[256] = "";
  if (d->words != NULL) list_words(d->words, words, sizeof words);
  if (d->kind & SWITCH) {
    snprintf(out, cap, "on or off (also 1, true, yes or 0, false, no)");
  } else if (d->kind & (NUMBER | INTEGER)) {
    const char *what = (d->kind & INTEGER) ? "a whole number" : "a number";
    char range[128];
    if (d->kind & MIN_EXCLUSIVE) {
      snprintf(range, sizeof range, "%s greater than %.15g and at most %.15g", what, d->min, d->max);
    } else {
      snprintf(range, sizeof range, "%s from %.15g to %.15g", what, d->min, d->max);
    }
    if (d->words != NULL) {
      snprintf(out, cap, "%s, or %s", range, words);
    } else {
      snprintf(out, cap, "%s", range);
    }
  } else {
    snprintf(out, cap, "%s", words);
  }
}

/* Parses `raw` (NULL or blank: the default) for setting `d` into v.
 * Returns 0, or -1 with v->error set. */
static int parse(const decl_t *d, const char *raw, value_t *v) {
  const char *s = raw;
  while (s != NULL && isspace((unsigned char)*s)) ++s;
  size_t n = s == NULL ? 0 : strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) --n;
  if (n == 0) s = d->default_value, n = strlen(s);
  v->number = -1;
  v->word = -1;
  v->on = 0;
  v->error[0] = '\0';
  if (d->kind & TEXT) {
    snprintf(v->text, sizeof v->text, "%.*s", (int)n, s);
    return 0;
  }
  if (d->kind & SWITCH) {
    for (size_t i = 0; i < sizeof yes_words / sizeof yes_words[0]; ++i) {
      const int yes = strlen(yes_words[i]) == n && strncasecmp(s, yes_words[i], n) == 0;
      if (yes || (strlen(no_words[i]) == n && strncasecmp(s, no_words[i], n) == 0)) {
        v->on = yes;
        snprintf(v->text, sizeof v->text, "%s", yes ? "on" : "off");
        return 0;
      }
    }
  } else {
    int w = word_index(d->words, s, n);
    /* A choice among on, off and more also takes the words of a switch. */
    for (size_t i = 0; w < 0 && (d->kind & CHOICE) && i < sizeof yes_words / sizeof yes_words[0];
         ++i) {
      if (strlen(yes_words[i]) == n && strncasecmp(s, yes_words[i], n) == 0) {
        w = word_index(d->words, "on", 2);
      } else if (strlen(no_words[i]) == n && strncasecmp(s, no_words[i], n) == 0) {
        w = word_index(d->words, "off", 3);
      }
    }
    if (w >= 0) {
      v->word = w;
      word_at(d->words, w, v->text, sizeof v->text);
      return 0;
    }
    if (d->kind & (NUMBER | INTEGER)) {
      char buf[64];
      snprintf(buf, sizeof buf, "%.*s", (int)n, s);
      char *end = NULL;
      errno = 0;
      double x = strtod(buf, &end);
      /* Decimal only: strtod also reads hexadecimal, inf and nan. */
      int ok = strspn(buf, "0123456789.eE+-") == strlen(buf) && n < sizeof buf;
      ok = ok && errno == 0 && end != buf && *end == '\0' && isfinite(x) && x <= d->max &&
               ((d->kind & MIN_EXCLUSIVE) ? x > d->min : x >= d->min) &&
               (!(d->kind & INTEGER) || x == floor(x));
      if (ok) {
        v->number = x;
        /* 15 digits read back exactly for every value a user writes. */
        snprintf(v->text, sizeof v->text, "%.15g", x);
        if (strtod(v->text, NULL) != x) snprintf(v->text, sizeof v->text, "%.17g", x);
        return 0;
      }
    }
  }
  char what[400];
  accepted(d, what, sizeof what);
  snprintf(v->error, sizeof v->error, "%s=%.*s is not a value %s takes: use %s (default %s); fix "
           "or unset it", d->name, (int)(n > 100 ? 100 : n), s, d->name, what, d->default_value);
  return -1;
}

const char *tnt__env_lookup(char *const *envp, const char *name, size_t len) {
  for (char *const *e = envp; e != NULL && *e != NULL; ++e) {
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  }
  return NULL;
}

static const char *env_value(char *const *envp, const char *name) {
  return tnt__env_lookup(envp, name, strlen(name));
}

/* Whether `name` is in the comma-separated list. */
static int listed(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; p != NULL && *p;) {
    const char *comma = strchr(p, ',');
    size_t n = comma == NULL ? strlen(p) : (size_t)(comma - p);
    if (n == len && strncmp(p, name, n) == 0) return 1;
    p = comma == NULL ? NULL : comma + 1;
  }
  return 0;
}

static int read_locked(char *const *envp, char *err, size_t err_len) {
  if (envp == NULL) envp = environ;
  const char *from_cli = env_value(envp, "TNT_COMMAND_LINE_SETTINGS");
  int failed = 0;
  if (err != NULL && err_len > 0) err[0] = '\0';
  for (int i = 0; i < TNT__S_COUNT; ++i) {
    const char *raw = env_value(envp, decls[i].name);
    value_t *v = &values[i];
    int blank = 1;
    for (const char *p = raw; p != NULL && *p; ++p) blank &= isspace((unsigned char)*p) != 0;
    v->source = blank                               ? TNT__SOURCE_DEFAULT
                : listed(from_cli, decls[i].name) ? TNT__SOURCE_COMMAND_LINE
                                                  : TNT__SOURCE_ENVIRONMENT;
    if (parse(&decls[i], raw, v) == 0) continue;
    char saved[sizeof v->error];
    memcpy(saved, v->error, sizeof saved);
    parse(&decls[i], NULL, v); /* the default */
    memcpy(v->error, saved, sizeof saved);
    v->source = TNT__SOURCE_DEFAULT;
    if (!failed && err != NULL && err_len > 0) snprintf(err, err_len, "%s", v->error);
    failed = 1;
  }
  loaded = 1;
  return failed ? -1 : 0;
}

int tnt__settings_read(char *const *envp, char *err, size_t err_len) {
  pthread_mutex_lock(&mu);
  int st = read_locked(envp, err, err_len);
  pthread_mutex_unlock(&mu);
  return st;
}

/* Locks the registry, reading the environment on first use. */
static const value_t *lock_value(tnt__setting_id_t id) {
  pthread_mutex_lock(&mu);
  if (!loaded) read_locked(NULL, NULL, 0);
  return &values[id];
}

double tnt__setting_number(tnt__setting_id_t id) {
  double x = lock_value(id)->number;
  pthread_mutex_unlock(&mu);
  return x;
}

int tnt__setting_word(tnt__setting_id_t id) {
  int w = lock_value(id)->word;
  pthread_mutex_unlock(&mu);
  return w;
}

int tnt__setting_on(tnt__setting_id_t id) {
  int on = lock_value(id)->on;
  pthread_mutex_unlock(&mu);
  return on;
}

char *tnt__setting_text(tnt__setting_id_t id, char *out, size_t cap) {
  snprintf(out, cap, "%s", lock_value(id)->text);
  pthread_mutex_unlock(&mu);
  return out;
}

void tnt__setting_view(tnt__setting_id_t id, tnt__setting_view_t *view) {
  const value_t *v = lock_value(id);
  const decl_t *d = &decls[id];
  *view = (tnt__setting_view_t){d->name, kind_name(d->kind), d->default_value, d->words, d->user,
                                d->help, v->text, v->error[0] ? v->error : NULL, v->source};
  pthread_mutex_unlock(&mu);
}

int tnt__setting_check(tnt__setting_id_t id, const char *text) {
  value_t v;
  return parse(&decls[id], text, &v);
}

void tnt__setting_accepts(tnt__setting_id_t id, char *out, size_t cap) {
  accepted(&decls[id], out, cap);
}
