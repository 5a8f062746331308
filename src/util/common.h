/*
 * Internal helpers shared by every part of libtnt: error-checking macros,
 * the monotonic clock, monotonic condition variables, deadlines and polite
 * spinning. Internal non-static symbols are prefixed tnt__.
 */
#ifndef TNT_UTIL_COMMON_H
#define TNT_UTIL_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tnt/tnt.h"
#include "util/types.h"

#define TNT__MIN(a, b) ((a) < (b) ? (a) : (b))
#define TNT__MAX(a, b) ((a) > (b) ? (a) : (b))

/* The alignment, in elements of `esz` bytes, of the slices of a vector
 * (tnt__slice) and of the tensors in a fusion bucket: a cache line of 4-
 * and 8-byte elements, 16 elements of smaller ones (as float32's, so that
 * a float32 vector and its 16-bit wire copy are cut alike). Cut there, a
 * slice of a tensor splits into vector packets and a scalar tail where the
 * whole tensor does, so elementwise kernels give it the same bits. */
static inline size_t tnt__slice_quantum(size_t esz) { return 64 / TNT__MAX(esz, (size_t)4); }

/* Evaluates `expr` (a tnt_status_t); on failure stores it in `st` and jumps
 * to `label`, the function's single cleanup exit. */
#define TNT_CHECK_GOTO(expr, st, label) \
  do {                                  \
    (st) = (expr);                      \
    if ((st) < 0) goto label;           \
  } while (0)

/* Returns the status of `expr` from the enclosing function on failure. */
#define TNT_CHECK(expr)                \
  do {                                 \
    tnt_status_t tnt__st_ = (expr);    \
    if (tnt__st_ < 0) return tnt__st_; \
  } while (0)

/* Seconds on the monotonic clock. */
double tnt__now(void);

/*
 * Condition variables with deadlines on the monotonic clock. Every
 * deadline in libtnt is a tnt__now() value, and pthread_cond_timedwait
 * reads its absolute time on the clock the condition variable was created
 * with (CLOCK_REALTIME by default). On the default clock a monotonic
 * deadline lies decades in the past: the wait returns at once, and a loop
 * meant to sleep spins instead. So every condition variable that is ever
 * given to pthread_cond_timedwait is created with tnt__cond_init_monotonic,
 * and its deadlines are made with tnt__abs_time.
 */

/* Initializes `cv` on CLOCK_MONOTONIC; the caller destroys it with
 * pthread_cond_destroy. Returns TNT_OK; TNT_ERR_NO_MEMORY when the system
 * lacks the resources, TNT_ERR_UNSUPPORTED when it cannot use the monotonic
 * clock (both logged; `cv` is then not initialized). */
tnt_status_t tnt__cond_init_monotonic(pthread_cond_t *cv);

/* The absolute time for pthread_cond_timedwait on a condition variable from
 * tnt__cond_init_monotonic: `t` is a tnt__now() value in seconds. */
struct timespec tnt__abs_time(double t);

/*
 * What a blocking wait inside libtnt needs to know: when to give up, and
 * what to call the operation in the message that says it gave up.
 */
struct tnt__coll_sig;

typedef struct tnt__wait_ctx {
  double deadline;   /* tnt__now() value after which waits fail */
  double timeout;    /* the timeout the deadline came from, for messages */
  double warn_at;    /* tnt__now() value after which a wait warns that it stalls */
  const char *label; /* e.g. "allreduce of fusion bucket 3" */
  /* The collective being run, which every member must agree on; NULL for
   * waits that are not part of a collective. */
  const struct tnt__coll_sig *sig;
  /* Work that goes on while this wait waits (NULL: none): shared-memory
   * waits call poll(poll_arg) on every turn, and fail with its error. */
  tnt_status_t (*poll)(void *poll_arg);
  void *poll_arg;
} tnt__wait_ctx_t;

/* A wait context that expires `timeout_s` seconds from now and warns of a
 * stall after TNT_STALL_WARNING_S seconds (default: a third of the
 * timeout), so that a rank that is alive but not contributing is named long
 * before the job fails. */
tnt__wait_ctx_t tnt__wait_ctx(double timeout_s, const char *label);

/* The check every wait loop makes now and then: TNT_ERR_TIMEOUT once the
 * deadline has passed, else TNT_OK; logs the stall warning once per wait
 * (`*warned` starts at 0). `what` names what is missing ("rank 3 (receive)"). */
tnt_status_t tnt__wait_check(const tnt__wait_ctx_t *w, int *warned, const char *what);

/* Polite spinning: pause instructions while every rank has a core, then
 * sched_yield, so that waits stay fast when cores are free and do not
 * starve peers when ranks outnumber cores. `iter` is the caller's loop
 * counter. */
void tnt__spin_pause(unsigned iter);
/* Tells the waits whether this host runs more ranks than it has cores. */
void tnt__spin_set_oversubscribed(int oversubscribed);

#endif
