/* Rank status files. */
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

int tnt__status_format(const tnt__rank_status_t *s, char *buf, size_t len) {
  return snprintf(
      buf, len,
      "rank=%d\nhost=%s\npid=%ld\nwrapper_pid=%ld\nfinished=%d\nexit_code=%d\nsignal=%d\n"
      "ended_by_request=%d\nend_time=%.6f\n",
      s->rank, s->host, s->pid, s->wrapper_pid, s->finished, s->exit_code, s->signal,
      s->ended_by_request, s->end_time);
}

/* Finds "key=" at the start of a line and returns its value, or NULL. */
static const char *field(const char *buf, const char *key) {
  size_t n = strlen(key);
  for (const char *line = buf; line != NULL && *line != '\0';) {
    if (strncmp(line, key, n) == 0 && line[n] == '=') return line + n + 1;
    line = strchr(line, '\n');
    if (line != NULL) ++line;
  }
  return NULL;
}

static int field_long(const char *buf, const char *key, long *out) {
  const char *v = field(buf, key);
  if (v == NULL) return -1;
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno != 0 || end == v || (*end != '\n' && *end != '\0')) return -1;
  *out = x;
  return 0;
}

int tnt__status_parse(const char *buf, tnt__rank_status_t *s) {
  long rank, pid, wrapper_pid, finished, code, sig, requested;
  memset(s, 0, sizeof *s);
  if (field_long(buf, "rank", &rank) || field_long(buf, "pid", &pid) ||
      field_long(buf, "wrapper_pid", &wrapper_pid) || field_long(buf, "finished", &finished) ||
      field_long(buf, "exit_code", &code) || field_long(buf, "signal", &sig) ||
      field_long(buf, "ended_by_request", &requested)) {
    return -1;
  }
  const char *host = field(buf, "host");
  const char *end_time = field(buf, "end_time");
  if (host == NULL || end_time == NULL) return -1;
  size_t host_len = strcspn(host, "\n");
  if (host_len >= sizeof s->host) host_len = sizeof s->host - 1;
  memcpy(s->host, host, host_len);
  s->host[host_len] = '\0';
  s->end_time = strtod(end_time, NULL);
  s->rank = (int)rank;
  s->pid = pid;
  s->wrapper_pid = wrapper_pid;
  s->finished = finished != 0;
  s->exit_code = (int)code;
  s->signal = (int)sig;
  s->ended_by_request = requested != 0;
  return 0;
}

int tnt__status_write(const char *run_dir, const tnt__rank_status_t *s) {
  int rc = -1;
  char path[4096], tmp[4200], text[1024];
  snprintf(path, sizeof path, "%s/rank%d.status", run_dir, s->rank);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int len = tnt__status_format(s, text, sizeof text);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) goto out;
  ssize_t written = write(fd, text, (size_t)len);
  if (close(fd) != 0 || written != len) goto out;
  /* rename replaces the old file in one step: a reader sees the old
   * status or the new one, never a mix. */
  if (rename(tmp, path) != 0) goto out;
  rc = 0;
out:
  if (rc != 0) unlink(tmp);
  return rc;
}

int tnt__status_read(const char *run_dir, int rank, tnt__rank_status_t *s) {
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.status", run_dir, rank);
  char *text = tnt__read_file(path, 4096, NULL);
  if (text == NULL) return -1;
  int rc = tnt__status_parse(text, s);
  free(text);
  return rc;
}

void tnt__progress_path(const char *run_dir, int rank, char *buf, size_t len) {
  snprintf(buf, len, "%s/rank%d.progress", run_dir, rank);
}

void tnt__status_remove(const char *run_dir, int rank) {
  char path[4200];
  snprintf(path, sizeof path, "%s/rank%d.status", run_dir, rank);
  unlink(path);
  tnt__progress_path(run_dir, rank, path, sizeof path);
  unlink(path);
}

int tnt__status_progressed(const char *run_dir, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    char path[4200];
    tnt__progress_path(run_dir, r, path, sizeof path);
    if (access(path, F_OK) == 0) return 1;
  }
  return 0;
}

int tnt__status_failed(const tnt__rank_status_t *s) {
  return s->finished && (s->exit_code != 0 || s->signal != 0);
}

void tnt__status_describe(const tnt__rank_status_t *s, char *buf, size_t len) {
  if (!s->finished) {
    snprintf(buf, len, "ended without reporting how (its wrapper was killed)");
  } else if (s->signal != 0) {
    snprintf(buf, len, "was killed by signal %d (%s)", s->signal, strsignal(s->signal));
  } else {
    snprintf(buf, len, "exited with code %d", s->exit_code);
  }
}
