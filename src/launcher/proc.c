/* Process and path helpers. */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void tnt__errorf(char *err, size_t len, const char *fmt, ...) {
  if (err == NULL || len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
}

double tnt__clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tnt__capture(char *const argv[], char *out, size_t len, int timeout_s) {
  int result = -1;
  int fds[2] = {-1, -1};
  pid_t pid = -1;
  size_t used = 0;
  if (len > 0) out[0] = '\0';
  if (pipe2(fds, O_CLOEXEC) != 0) goto out;
  pid = fork();
  if (pid < 0) goto out;
  if (pid == 0) {
    int null_fd = open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      dup2(null_fd, STDIN_FILENO);
      dup2(null_fd, STDERR_FILENO);
    }
    dup2(fds[1], STDOUT_FILENO);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  fds[1] = -1;
  double deadline = tnt__clock() + timeout_s;
  for (;;) {
    double left = deadline - tnt__clock();
    if (left <= 0) break;
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char chunk[512];
    ssize_t n = read(fds[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    /* Output beyond the buffer is read and dropped, so that the child
     * never blocks on a full pipe. */
    for (ssize_t i = 0; i < n && len > 0 && used + 1 < len; ++i) out[used++] = chunk[i];
    if (len > 0) out[used] = '\0';
  }
  /* Whatever state it is in now, the command has had its time. */
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && tnt__clock() < deadline) result = WEXITSTATUS(status);
out:
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
  return result;
}

static int is_executable_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int tnt__which(const char *name, const char *path, char *out, size_t len) {
  if (*name == '\0') return -1;
  if (strchr(name, '/') != NULL) {
    if (!is_executable_file(name) || strlen(name) >= len) return -1;
    strcpy(out, name);
    return 0;
  }
  const char *p = path != NULL ? path : "/usr/local/bin:/usr/bin:/bin";
  while (*p != '\0') {
    size_t n = strcspn(p, ":");
    char candidate[4096];
    /* An empty PATH entry means the current directory. */
    int w = snprintf(candidate, sizeof candidate, "%.*s/%s", (int)(n ? n : 1), n ? p : ".", name);
    if (w > 0 && (size_t)w < sizeof candidate && is_executable_file(candidate) && (size_t)w < len) {
      strcpy(out, candidate);
      return 0;
    }
    p += n;
    if (*p == ':') ++p;
  }
  return -1;
}

char *tnt__read_file(const char *path, size_t max_len, size_t *len_out) {
  char *buf = NULL;
  char *result = NULL;
  int saved_errno = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    saved_errno = errno;
    goto out;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    saved_errno = errno;
    goto out;
  }
  if (S_ISDIR(st.st_mode)) {
    saved_errno = EISDIR;
    goto out;
  }
  size_t cap = 4096, used = 0;
  buf = malloc(cap);
  if (buf == NULL) {
    saved_errno = ENOMEM;
    goto out;
  }
  for (;;) {
    if (used + 1 >= cap) {
      if (cap > max_len) {
        saved_errno = EFBIG;
        goto out;
      }
      char *bigger = realloc(buf, cap * 2);
      if (bigger == NULL) {
        saved_errno = ENOMEM;
        goto out;
      }
      buf = bigger;
      cap *= 2;
    }
    ssize_t n = read(fd, buf + used, cap - used - 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      saved_errno = errno;
      goto out;
    }
    if (n == 0) break;
    used += (size_t)n;
  }
  if (used > max_len) {
    saved_errno = EFBIG;
    goto out;
  }
  buf[used] = '\0';
  if (len_out != NULL) *len_out = used;
  result = buf;
  buf = NULL;
out:
  free(buf);
  if (fd >= 0) close(fd);
  errno = saved_errno;
  return result;
}

int tnt__mkdirs(const char *path) {
  char buf[4096];
  if (strlen(path) >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy(buf, path);
  for (char *p = buf + 1; *p != '\0'; ++p) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
  return 0;
}
