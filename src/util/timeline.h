/*
 * The timeline (TNT_TIMELINE=path.json): each rank writes the phases of its
 * compute and communication as a Chrome trace (the JSON array format of the
 * Trace Event Format), which chrome://tracing and ui.perfetto.dev open.
 *
 * Off, recording costs one relaxed atomic load and a branch: callers test
 * TNT__TIMELINE_ON() before they gather what an event needs. On, events are
 * formatted on the calling thread and appended to one buffer under a mutex;
 * the buffer goes to the file when it fills, at least once a second while
 * events keep coming, and when the last context is destroyed. Every event
 * ends a line, so a run that crashes leaves a file that the viewers read
 * (the format allows the closing bracket to be missing).
 *
 * pid is the rank; tid is a small number per thread, named in the trace
 * ("main", "progress", "caller 2", ...).
 */
#ifndef TNT_UTIL_TIMELINE_H
#define TNT_UTIL_TIMELINE_H

#include <stdatomic.h>

extern _Atomic int tnt__timeline_flag;

/* True while a timeline is being written. */
#define TNT__TIMELINE_ON() \
  __builtin_expect(atomic_load_explicit(&tnt__timeline_flag, memory_order_relaxed), 0)

/* Opens the timeline of `rank` of `size` if TNT_TIMELINE is set; nested
 * opens (several contexts in one process) share the file, and the last
 * tnt__timeline_close flushes and closes it. A file that cannot be opened
 * is a warning, not an error: the run goes on without a timeline. */
void tnt__timeline_open(int rank, int size);
void tnt__timeline_close(void);

/* The name the calling thread has in the trace (a static string); threads
 * that never set one are "caller N". */
void tnt__timeline_name_thread(const char *name);

/* Events. Times are tnt__now() values. `args` is NULL or printf format of
 * the members of the event's "args" object, e.g. "\"bytes\":%zu"; strings
 * in it must not need JSON escaping (names and categories are escaped). */
void tnt__timeline_complete(const char *cat, const char *name, double begin, double end,
                            const char *args, ...) __attribute__((format(printf, 5, 6)));
void tnt__timeline_instant(const char *cat, const char *name, const char *args, ...)
    __attribute__((format(printf, 3, 4)));
/* 'B' (begin) or 'E' (end) of a span of the calling thread. */
void tnt__timeline_mark(char phase, const char *cat, const char *name);

/* Writes what is buffered to the file. */
void tnt__timeline_flush(void);

#endif
