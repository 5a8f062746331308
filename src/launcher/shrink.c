/* Which host a failed attempt is blamed on (shrink.h). */
#include "shrink.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

/* How many hosts have a rank that meets `pred`; the first such host goes
 * to first_marked (-1 when none). */
static int mark_hosts(const tnt__attempt_ranks_t *ar,
                      int (*pred)(const tnt__attempt_ranks_t *, int), int *first_marked) {
  int hosts = ar->total / ar->per_host, marked = 0;
  *first_marked = -1;
  for (int h = 0; h < hosts; ++h) {
    for (int r = h * ar->per_host; r < (h + 1) * ar->per_host; ++r) {
      if (pred(ar, r)) {
        if (*first_marked < 0) *first_marked = h;
        ++marked;
        break;
      }
    }
  }
  return marked;
}

static int did_not_start(const tnt__attempt_ranks_t *ar, int r) {
  return !ar->have[r];
}

static int stopped_answering(const tnt__attempt_ranks_t *ar, int r) {
  return ar->have[r] && !ar->status[r].finished;
}

static int is_fault_signal(int sig) {
  return sig == SIGSEGV || sig == SIGABRT || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

int tnt__blamed_host(const tnt__attempt_ranks_t *ar, tnt__blame_t *rule, char *why, size_t len) {
  *rule = TNT__BLAME_NONE;
  if (ar->per_host <= 0 || ar->total < 2 * ar->per_host) return -1;
  int host = -1;
  /* Blame one host only when the others are seen to be healthy (there are
   * at least two hosts): when the ranks of several hosts did not start (or
   * stopped answering), which one is at fault cannot be told. */
  int n = mark_hosts(ar, did_not_start, &host);
  if (n == 1) {
    *rule = TNT__BLAME_NOT_STARTED;
    snprintf(why, len, "its ranks did not start");
    return host;
  }
  if (n == 0) {
    n = mark_hosts(ar, stopped_answering, &host);
    if (n == 1) {
      *rule = TNT__BLAME_STOPPED_ANSWERING;
      snprintf(why, len, "its ranks stopped answering (their wrapper ended without a report)");
      return host;
    }
  }
  int r = ar->first_failed;
  if (n == 0 && r >= 0 && r < ar->total && ar->have[r]) {
    const tnt__rank_status_t *s = &ar->status[r];
    if (s->signal != 0 && !s->ended_by_request && !is_fault_signal(s->signal)) {
      *rule = TNT__BLAME_SIGNAL;
      snprintf(why, len, "its rank %d was killed by signal %d (%s)", r, s->signal,
               strsignal(s->signal));
      return r / ar->per_host;
    }
  }
  return -1;
}
