/* Sorting the MPI launcher's stderr (mpi_messages.h). */
#include "mpi_messages.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

/* Open MPI's show_help frame: a line of this many dashes. */
#define TNT__FRAME_DASHES 74
/* Longest line held back before it is passed on in pieces. */
#define TNT__MESSAGE_LINE_MAX 8192
/* How long the reader waits for data before it looks at the stop flag. */
#define TNT__MESSAGE_POLL_MS 100

int tnt__mpi_message_line(const char *line, size_t len, int *in_frame) {
  if (len == TNT__FRAME_DASHES) {
    size_t i = 0;
    while (i < len && line[i] == '-') ++i;
    if (i == len) {
      *in_frame = !*in_frame;
      return 1;
    }
  }
  if (*in_frame) return 1;
  /* "[host:1234] ..." : the report of Open MPI's signal handler. */
  if (len < 4 || line[0] != '[') return 0;
  const char *close = memchr(line, ']', len);
  if (close == NULL || (size_t)(close - line) + 1 >= len || close[1] != ' ') return 0;
  const char *colon = NULL;
  for (const char *p = line + 1; p < close; ++p) {
    if (*p == ' ') return 0;
    if (*p == ':') colon = p;
  }
  if (colon == NULL || colon == line + 1 || colon + 1 == close) return 0;
  for (const char *p = colon + 1; p < close; ++p) {
    if (!isdigit((unsigned char)*p)) return 0;
  }
  return 1;
}

static void write_all_fd(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    buf += n;
    len -= (size_t)n;
  }
}

static void emit(tnt__mpi_messages_t *m, const char *line, size_t len, int *in_frame) {
  if (!tnt__mpi_message_line(line, len, in_frame)) {
    write_all_fd(STDERR_FILENO, line, len);
    write_all_fd(STDERR_FILENO, "\n", 1);
    return;
  }
  if (m->log_fd < 0) {
    m->log_fd = open(m->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  if (m->log_fd >= 0) {
    write_all_fd(m->log_fd, line, len);
    write_all_fd(m->log_fd, "\n", 1);
  }
  ++m->lines;
}

static void *sort_lines(void *arg) {
  tnt__mpi_messages_t *m = arg;
  static char buf[TNT__MESSAGE_LINE_MAX];
  size_t used = 0;
  int in_frame = 0;
  for (;;) {
    struct pollfd p = {.fd = m->read_fd, .events = POLLIN};
    int ready = poll(&p, 1, TNT__MESSAGE_POLL_MS);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) break;
      continue;
    }
    ssize_t n = read(m->read_fd, buf + used, sizeof buf - used);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    used += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < used; ++i) {
      if (buf[i] != '\n') continue;
      emit(m, buf + start, i - start, &in_frame);
      start = i + 1;
    }
    memmove(buf, buf + start, used - start);
    used -= start;
    if (used == sizeof buf) {
      emit(m, buf, used, &in_frame);
      used = 0;
    }
  }
  if (used > 0) emit(m, buf, used, &in_frame);
  return NULL;
}

int tnt__mpi_messages_start(tnt__mpi_messages_t *m, const char *run_dir, int *child_fd) {
  memset(m, 0, sizeof *m);
  m->log_fd = -1;
  snprintf(m->log_path, sizeof m->log_path, "%s/mpirun.log", run_dir);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  m->read_fd = fds[0];
  int rc = pthread_create(&m->thread, NULL, sort_lines, m);
  if (rc != 0) {
    close(fds[0]);
    close(fds[1]);
    errno = rc;
    return -1;
  }
  *child_fd = fds[1];
  return 0;
}

int tnt__mpi_messages_finish(tnt__mpi_messages_t *m) {
  __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
  pthread_join(m->thread, NULL);
  close(m->read_fd);
  if (m->log_fd >= 0) close(m->log_fd);
  return m->lines;
}
