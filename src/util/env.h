/*
 * Reading settings from the environment. libtnt reads each variable once
 * (when the log starts, when a context or a group is created), never on
 * the path of a collective: getenv racing a setenv in another thread is
 * undefined behaviour, and a setting that changes under a running job
 * would make ranks disagree.
 */
#ifndef TNT_UTIL_ENV_H
#define TNT_UTIL_ENV_H

/* A positive number from the environment variable `name`, or `fallback`
 * when it is unset or invalid (invalid values are logged). */
double tnt__env_double(const char *name, double fallback);

/*
 * A switch from the environment variable `name`: 1 for 1, true, yes or on,
 * 0 for 0, false, no or off (any case, surrounding blanks ignored), and
 * `fallback` when it is unset or empty. Any other value is logged and gives
 * `fallback`. The Python package (tarantella/log.py, env_flag) reads its
 * switches by the same rules.
 */
int tnt__env_bool(const char *name, int fallback);

#endif
