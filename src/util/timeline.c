/*
 * The timeline writer (see timeline.h). One buffer per process under one
 * mutex: events are formatted outside the lock, so the lock only covers a
 * copy, and the file only sees large writes.
 */
#include "util/timeline.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/common.h"
#include "util/log.h"
#include "util/settings.h"

enum {
  BUF_CAP = 1 << 20, /* bytes buffered before a write */
  EVENT_MAX = 1024,  /* bytes of one event */
  NAME_MAX_LEN = 160 /* bytes of an escaped name */
};

/* Seconds between writes while events keep coming, so that a crash loses
 * at most about this much of the trace. */
static const double FLUSH_INTERVAL_S = 1.0;

_Atomic int tnt__timeline_flag = 0;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *file;
static char *buf;
static size_t len;
static int opens; /* tnt__timeline_open calls not yet closed */
static int rank_;
static int generation; /* of the open file, so that threads name themselves in it */
static int next_tid;
static int wrote_event; /* the next event needs a separating comma */
static double offset_s; /* wall clock minus monotonic clock, so that hosts line up */
static double last_flush;
static int atexit_registered;

static _Thread_local int tl_tid, tl_gen;
static _Thread_local const char *tl_name;

/* Copies `s` into `out` (size `cap`) with JSON escapes; truncates. */
static void escape(char *out, size_t cap, const char *s) {
  size_t n = 0;
  for (; s != NULL && *s != '\0' && n + 7 < cap; ++s) {
    const unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)c;
    } else if (c < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = '\0';
}

static void flush_locked(double now) {
  if (file != NULL && len > 0) {
    if (fwrite(buf, 1, len, file) != len || fflush(file) != 0) {
      TNT_LOG_WARN("timeline: cannot write the trace file; the rest of the timeline is lost");
      fclose(file);
      file = NULL;
      atomic_store_explicit(&tnt__timeline_flag, 0, memory_order_relaxed);
    }
  }
  len = 0;
  last_flush = now;
}

/* Appends one event (without separator); called with mu held. */
static void append_locked(const char *ev, size_t n, double now) {
  if (file == NULL) return;
  if (len + n + 2 > BUF_CAP) flush_locked(now);
  if (wrote_event) {
    buf[len++] = ',';
    buf[len++] = '\n';
  }
  memcpy(buf + len, ev, n);
  len += n;
  wrote_event = 1;
  if (len > BUF_CAP - EVENT_MAX || now - last_flush > FLUSH_INTERVAL_S) flush_locked(now);
}

/* Gives the calling thread its tid in the open file (and names it there);
 * called with mu held. */
static int tid_locked(double now) {
  if (tl_gen != generation) {
    tl_gen = generation;
    tl_tid = ++next_tid;
    char name[NAME_MAX_LEN], ev[EVENT_MAX];
    if (tl_name != NULL) {
      escape(name, sizeof name, tl_name);
    } else {
      snprintf(name, sizeof name, "caller %d", tl_tid);
    }
    int n = snprintf(ev, sizeof ev,
                     "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                     "\"args\":{\"name\":\"%s\"}}",
                     rank_, tl_tid, name);
    append_locked(ev, (size_t)n, now);
    n = snprintf(ev, sizeof ev,
                 "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                 "\"args\":{\"sort_index\":%d}}",
                 rank_, tl_tid, tl_tid);
    append_locked(ev, (size_t)n, now);
  }
  return tl_tid;
}

/* Formats and appends one event of phase 'X', 'i', 'B' or 'E'; `args`
 * (with `ap`) gives the members of its "args" object, or is NULL. */
static void emit(const char *cat, const char *name, char phase, double begin, double end,
                 const char *args, va_list ap) {
  char ename[NAME_MAX_LEN], ecat[48], ev[EVENT_MAX];
  escape(ename, sizeof ename, name);
  escape(ecat, sizeof ecat, cat);
  const double ts = (begin + offset_s) * 1e6;
  /* The tid is known only under the lock; it goes in last. */
  int n = snprintf(ev, sizeof ev, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"%c\",\"ts\":%.3f",
                   ename, ecat, phase, ts);
  if (phase == 'X') {
    n += snprintf(ev + n, sizeof ev - (size_t)n, ",\"dur\":%.3f", (end - begin) * 1e6);
  } else if (phase == 'i') {
    n += snprintf(ev + n, sizeof ev - (size_t)n, ",\"s\":\"t\"");
  }
  if (args != NULL) {
    const int head = n;
    n += snprintf(ev + n, sizeof ev - (size_t)n, ",\"args\":{");
    const int m = vsnprintf(ev + n, sizeof ev - (size_t)n, args, ap);
    if (m < 0 || (size_t)(n + m) >= sizeof ev - 64) {
      n = head; /* too long: no args rather than bad JSON */
    } else {
      n += m;
      n += snprintf(ev + n, sizeof ev - (size_t)n, "}");
    }
  }
  const double now = phase == 'X' ? end : begin;
  pthread_mutex_lock(&mu);
  if (file != NULL) {
    const int tid = tid_locked(now);
    n += snprintf(ev + n, sizeof ev - (size_t)n, ",\"pid\":%d,\"tid\":%d}", rank_, tid);
    append_locked(ev, (size_t)n, now);
  }
  pthread_mutex_unlock(&mu);
}

void tnt__timeline_complete(const char *cat, const char *name, double begin, double end,
                            const char *args, ...) {
  if (!TNT__TIMELINE_ON()) return;
  va_list ap;
  va_start(ap, args);
  emit(cat, name, 'X', begin, end < begin ? begin : end, args, ap);
  va_end(ap);
}

void tnt__timeline_instant(const char *cat, const char *name, const char *args, ...) {
  if (!TNT__TIMELINE_ON()) return;
  const double now = tnt__now();
  va_list ap;
  va_start(ap, args);
  emit(cat, name, 'i', now, now, args, ap);
  va_end(ap);
}

/* emit() needs a va_list even without args. */
static void emit_plain(const char *cat, const char *name, char phase, double t, ...) {
  va_list ap;
  va_start(ap, t);
  emit(cat, name, phase, t, t, NULL, ap);
  va_end(ap);
}

void tnt__timeline_mark(char phase, const char *cat, const char *name) {
  if (!TNT__TIMELINE_ON()) return;
  emit_plain(cat, name, phase == 'E' ? 'E' : 'B', tnt__now());
}

void tnt__timeline_name_thread(const char *name) {
  tl_name = name;
}

void tnt__timeline_flush(void) {
  pthread_mutex_lock(&mu);
  if (file != NULL) flush_locked(tnt__now());
  pthread_mutex_unlock(&mu);
}

/* At exit without tnt__timeline_close (a context never destroyed), the
 * buffered events still reach the file. Another thread may hold the lock
 * while the process exits: give it a moment, then give up. */
static void flush_at_exit(void) {
  for (int i = 0; i < 100; ++i) {
    if (pthread_mutex_trylock(&mu) == 0) {
      if (file != NULL) flush_locked(tnt__now());
      pthread_mutex_unlock(&mu);
      return;
    }
    usleep(10000);
  }
}

/* `path` with ".rank<r>" before its extension (or at its end). */
static void rank_path(char *out, size_t cap, const char *path, int rank, int size) {
  if (size <= 1) {
    snprintf(out, cap, "%s", path);
    return;
  }
  const char *base = strrchr(path, '/');
  base = base == NULL ? path : base + 1;
  const char *dot = strrchr(base, '.');
  if (dot == NULL || dot == base) dot = base + strlen(base);
  snprintf(out, cap, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
}

void tnt__timeline_open(int rank, int size) {
  char path[2048];
  if (*tnt__setting_text(TNT__S_TIMELINE, path, sizeof path) == '\0') return;
  char name[4096];
  rank_path(name, sizeof name, path, rank, size);
  pthread_mutex_lock(&mu);
  if (opens++ > 0) {
    pthread_mutex_unlock(&mu);
    return;
  }
  buf = malloc(BUF_CAP);
  file = buf == NULL ? NULL : fopen(name, "w");
  if (file == NULL) {
    free(buf);
    buf = NULL;
    pthread_mutex_unlock(&mu);
    TNT_LOG_WARN("timeline: cannot create %s (TNT_TIMELINE); running without a timeline", name);
    return;
  }
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  const double now = tnt__now();
  offset_s = (double)wall.tv_sec + (double)wall.tv_nsec * 1e-9 - now;
  rank_ = rank;
  generation++;
  next_tid = 0;
  wrote_event = 0;
  len = (size_t)snprintf(buf, BUF_CAP, "[\n");
  last_flush = now;
  char ev[EVENT_MAX];
  int n = snprintf(ev, sizeof ev,
                   "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                   "\"args\":{\"name\":\"rank %d\"}}",
                   rank, rank);
  append_locked(ev, (size_t)n, now);
  n = snprintf(ev, sizeof ev,
               "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}}",
               rank, rank);
  append_locked(ev, (size_t)n, now);
  flush_locked(now);
  if (!atexit_registered) atexit_registered = atexit(flush_at_exit) == 0;
  atomic_store_explicit(&tnt__timeline_flag, 1, memory_order_relaxed);
  pthread_mutex_unlock(&mu);
  TNT_LOG_INFO("timeline: writing %s", name);
}

void tnt__timeline_close(void) {
  pthread_mutex_lock(&mu);
  if (opens == 0 || --opens > 0) {
    pthread_mutex_unlock(&mu);
    return;
  }
  atomic_store_explicit(&tnt__timeline_flag, 0, memory_order_relaxed);
  if (file != NULL) {
    flush_locked(tnt__now());
    if (file != NULL) {
      fputs("\n]\n", file);
      fclose(file);
      file = NULL;
    }
  }
  free(buf);
  buf = NULL;
  len = 0;
  pthread_mutex_unlock(&mu);
}
