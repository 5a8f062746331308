/*
 * Hostfiles: one host name per line; '#' starts a comment; blank lines are
 * ignored. Names must be unique, because the launcher places the same
 * number of ranks on every host and a repeated name would silently double
 * a host's share.
 *
 * The parser is a pure function over a buffer, so that the unit tests and
 * the fuzz target can call it on any bytes.
 */
#ifndef TNT_LAUNCHER_HOSTFILE_H
#define TNT_LAUNCHER_HOSTFILE_H

#include <stddef.h>

/* The longest host name DNS allows. */
#define TNT__HOST_NAME_MAX 253

typedef struct {
  char **names; /* owned copies, in file order */
  int *lines;   /* the line (from 1) each name came from */
  int count;
} tnt__hostlist_t;

/*
 * Parses len bytes of a hostfile into out. Returns 0, or -1 with a
 * one-line message in err ("line 3: ..."). On error out is left empty.
 * Release out with tnt__hostlist_free either way.
 */
int tnt__hostfile_parse(const char *buf, size_t len, tnt__hostlist_t *out, char *err,
                        size_t err_len);

/*
 * Checks that at most one entry names the host the launcher runs on:
 * "localhost", an address in 127.0.0.0/8, local_name (this host's name) or
 * its first label. Returns 0, or -1 with a message in err.
 */
int tnt__hostlist_check_local(const tnt__hostlist_t *list, const char *local_name, char *err,
                              size_t err_len);

/*
 * Checks one host name of len bytes: letters, digits, '-', '.' and '_',
 * not starting with '-' or '.', at most TNT__HOST_NAME_MAX long. Returns 0,
 * or -1 with a message in err ("'a:b' is not a host name: ...").
 */
int tnt__host_name_check(const char *name, size_t len, char *err, size_t err_len);

/* Appends a copy of name[0..len) from the given line. Returns 0, or -1
 * with "out of memory" in err. */
int tnt__hostlist_add(tnt__hostlist_t *list, const char *name, size_t len, int line, char *err,
                      size_t err_len);

/*
 * The end of every parser that fills list: returns 0 when the parse
 * succeeded (rc 0) and no name repeats (names compare without regard to
 * case, as DNS does). Otherwise empties list and returns -1, with err
 * naming the repeated name whose second mention comes first: with the
 * lines of both mentions when by_line ("line 4: host 'b' is already
 * listed on line 2; ..."), else "host 'b' is listed twice". A failed parse
 * (rc != 0) has written err already.
 */
int tnt__hostlist_finish(tnt__hostlist_t *list, int rc, int by_line, char *err, size_t err_len);

/* Whether name refers to the host the launcher runs on (see above). */
int tnt__host_is_local(const char *name, const char *local_name);

void tnt__hostlist_free(tnt__hostlist_t *list);

#endif
