/*
 * The settings registry: every TNT_* setting, declared once in
 * util/settings.def, read from the environment in one place
 * (tnt__settings_read) with one rule per kind and one policy for a bad value
 * (an error that names the setting and lists what it accepts; the setting
 * keeps its default). libtnt reads the environment when a context is
 * created (tnt_settings_load); the launcher reads its own environment once;
 * the rest of the code asks the registry through the getters below, never
 * getenv.
 *
 * This file is compiled into libtnt and into the launcher, which links
 * nothing but libc: it does not log. Its state is process-wide and guarded
 * by a mutex, so that ranks simulated as threads may create contexts at
 * once.
 */
#ifndef TNT_UTIL_SETTINGS_H
#define TNT_UTIL_SETTINGS_H

#include <stddef.h>

#define TNT__SETTING(id, ...) TNT__S_##id,
typedef enum tnt__setting_id {
#include "util/settings.def"
  TNT__S_COUNT
} tnt__setting_id_t;
#undef TNT__SETTING

/* Where a value came from. The launcher names the settings it set from its
 * own options in TNT_COMMAND_LINE_SETTINGS (a comma-separated list), so
 * that the ranks report them as given on the command line. */
typedef enum tnt__setting_source {
  TNT__SOURCE_DEFAULT = 0,
  TNT__SOURCE_ENVIRONMENT = 1,
  TNT__SOURCE_COMMAND_LINE = 2,
} tnt__setting_source_t;

/* The description of one setting and the value in force. The strings stay
 * valid until the next tnt__settings_read. */
typedef struct tnt__setting_view {
  const char *name, *kind, *default_value, *words, *user, *help;
  const char *value; /* canonical text: on/off, a number, a word, a path ("" if unset) */
  const char *error; /* why the given value was rejected, or NULL */
  tnt__setting_source_t source;
} tnt__setting_view_t;

/* Reads every setting from `envp` (NULL: the process environment). Returns
 * 0, or -1 when a value is invalid: `err` (may be NULL) then holds the
 * first such error, and every invalid setting keeps its default. */
int tnt__settings_read(char *const *envp, char *err, size_t err_len);

/* The getters read the last tnt__settings_read, or the process environment
 * on first use. */

/* A NUMBER or INTEGER: its value; -1 when it holds one of its words. */
double tnt__setting_number(tnt__setting_id_t id);
/* The index of the word a CHOICE (or a NUMBER with words) holds in its
 * WORDS, or -1 when it holds a number. */
int tnt__setting_word(tnt__setting_id_t id);
/* A SWITCH: 1 for on, 0 for off. */
int tnt__setting_on(tnt__setting_id_t id);
/* A TEXT, copied into out (cap bytes, truncated): "" when unset. Returns
 * out. */
char *tnt__setting_text(tnt__setting_id_t id, char *out, size_t cap);

/* Whether `text` is a valid value of setting `id` (blank: the default):
 * 0, or -1. */
int tnt__setting_check(tnt__setting_id_t id, const char *text);
/* What setting `id` takes, in words ("DEBUG, INFO, WARNING or ERROR"). */
void tnt__setting_accepts(tnt__setting_id_t id, char *out, size_t cap);

/* The value of the variable whose name is the `len` bytes at `name` in
 * `envp` (NAME=VALUE strings, NULL-terminated), or NULL. */
const char *tnt__env_lookup(char *const *envp, const char *name, size_t len);

/* Describes setting `id` (0 <= id < TNT__S_COUNT). */
void tnt__setting_view(tnt__setting_id_t id, tnt__setting_view_t *view);

#endif
