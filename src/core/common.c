/* Clock, deadlines, polite spinning and environment parsing. */
#include "core/common.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "core/log.h"

double tnt__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tnt__wait_ctx_t tnt__wait_ctx(double timeout_s, const char *label) {
  tnt__wait_ctx_t w;
  w.timeout = timeout_s;
  w.deadline = tnt__now() + timeout_s;
  w.label = label;
  return w;
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

double tnt__env_double(const char *name, double fallback) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return fallback;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v <= 0) {
    TNT_LOG_WARN("ignoring %s=%s: expected a positive number; using %g", name, s, fallback);
    return fallback;
  }
  return v;
}
