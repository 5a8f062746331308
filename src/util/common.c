/* Clock, deadlines, monotonic condition variables and polite spinning. */
#include "util/common.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "util/settings.h"
#include "util/log.h"

double tnt__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tnt_status_t tnt__cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t attr;
  if (pthread_condattr_init(&attr) != 0) return TNT_ERR_NO_MEMORY;
  /* Linux supports CLOCK_MONOTONIC here; a failure would be a libc that
   * cannot run libtnt's timed waits at all. */
  int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  if (rc == 0) rc = pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
  if (rc != 0) {
    TNT_LOG_ERROR("cannot create a condition variable on the monotonic clock (error %d)", rc);
    return rc == EINVAL ? TNT_ERR_UNSUPPORTED : TNT_ERR_NO_MEMORY;
  }
  return TNT_OK;
}

struct timespec tnt__abs_time(double t) {
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

tnt__wait_ctx_t tnt__wait_ctx(double timeout_s, const char *label) {
  const double stall_warning_s = tnt__setting_number(TNT__S_STALL_WARNING_S); /* < 0: auto */
  tnt__wait_ctx_t w;
  const double now = tnt__now();
  w.timeout = timeout_s;
  w.deadline = now + timeout_s;
  w.warn_at = now + (stall_warning_s > 0 ? stall_warning_s : timeout_s / 3.0);
  w.label = label;
  w.sig = NULL;
  w.poll = NULL;
  w.poll_arg = NULL;
  return w;
}

tnt_status_t tnt__wait_check(const tnt__wait_ctx_t *w, int *warned, const char *what) {
  const double now = tnt__now();
  if (now > w->deadline) {
    TNT_LOG_ERROR("%s: timed out after %.1f s waiting for %s", w->label, w->timeout, what);
    return TNT_ERR_TIMEOUT;
  }
  if (!*warned && now > w->warn_at) {
    *warned = 1;
    TNT_LOG_WARN("%s: still waiting for %s after %.1f s; it fails after %.1f s", w->label,
                 what, now - (w->deadline - w->timeout), w->timeout);
  }
  return TNT_OK;
}

/* Pause iterations before waits start yielding the core; lowered when a
 * host runs more ranks than it has cores (tnt__spin_set_oversubscribed). */
static _Atomic unsigned spin_limit = 2048;

void tnt__spin_set_oversubscribed(int oversubscribed) {
  atomic_store_explicit(&spin_limit, oversubscribed ? 0u : 2048u, memory_order_relaxed);
}

void tnt__spin_pause(unsigned iter) {
  /* While every rank has a core of its own, a peer answers within
   * microseconds and yielding would only add system-call latency. When
   * ranks outnumber cores, the peer we wait for may need our core: yield at
   * once. */
  if (iter < atomic_load_explicit(&spin_limit, memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  } else {
    sched_yield();
  }
}
