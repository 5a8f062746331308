/* GPU and NUMA discovery from /dev and /sys. */
#include "gpus.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether name is prefix followed by one or more digits and nothing else. */
static int is_numbered(const char *name, const char *prefix) {
  size_t n = strlen(prefix);
  if (strncmp(name, prefix, n) != 0 || name[n] == '\0') return 0;
  for (const char *p = name + n; *p != '\0'; ++p) {
    if (!isdigit((unsigned char)*p)) return 0;
  }
  return 1;
}

/* Counts the entries of root/sub whose names are prefix + digits. */
static int count_numbered(const char *root, const char *sub, const char *prefix) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s", root, sub);
  DIR *dir = opendir(path);
  if (dir == NULL) return 0;
  int count = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) count += is_numbered(e->d_name, prefix);
  closedir(dir);
  return count;
}

int tnt__gpus_parse_visible(const char *value, char *list, size_t len) {
  int count = 0;
  size_t used = 0;
  if (len == 0) return -1;
  list[0] = '\0';
  const char *p = value;
  while (*p != '\0') {
    size_t n = strcspn(p, ",");
    /* CUDA stops at the first entry it cannot use: an empty one, or a
     * negative index such as the conventional "-1". */
    if (n == 0 || p[0] == '-') break;
    int valid = 1;
    for (size_t i = 0; i < n; ++i) {
      valid = valid && (isalnum((unsigned char)p[i]) || p[i] == '-' || p[i] == '/');
    }
    if (!valid) break;
    if (used + n + 2 > len) return -1;
    if (count > 0) list[used++] = ',';
    memcpy(list + used, p, n);
    used += n;
    list[used] = '\0';
    ++count;
    p += n;
    if (*p == ',') ++p;
  }
  return count;
}

int tnt__gpus_detect(const char *root, const char *cuda_visible, char *list, size_t len) {
  if (len == 0) return -1;
  list[0] = '\0';
  int devices = count_numbered(root, "/dev", "nvidia");
  if (devices == 0) return 0;
  if (cuda_visible != NULL) return tnt__gpus_parse_visible(cuda_visible, list, len);
  size_t used = 0;
  for (int i = 0; i < devices; ++i) {
    int n = snprintf(list + used, len - used, "%s%d", i > 0 ? "," : "", i);
    if (n < 0 || (size_t)n >= len - used) return -1;
    used += (size_t)n;
  }
  return devices;
}

int tnt__numa_node_count(const char *root) {
  return count_numbered(root, "/sys/devices/system/node", "node");
}

int tnt__cpulist_parse(const char *text, cpu_set_t *set) {
  CPU_ZERO(set);
  const char *p = text;
  int any = 0;
  while (*p != '\0' && *p != '\n') {
    char *end = NULL;
    if (!isdigit((unsigned char)*p)) return -1;
    long lo = strtol(p, &end, 10);
    long hi = lo;
    p = end;
    if (*p == '-') {
      ++p;
      if (!isdigit((unsigned char)*p)) return -1;
      hi = strtol(p, &end, 10);
      p = end;
    }
    if (lo > hi || hi >= CPU_SETSIZE) return -1;
    for (long c = lo; c <= hi; ++c) CPU_SET((int)c, set);
    any = 1;
    if (*p == ',') ++p;
  }
  return any ? 0 : -1;
}

int tnt__numa_node_cpus(const char *root, int node, cpu_set_t *set) {
  char path[4096];
  char text[8192];
  snprintf(path, sizeof path, "%s/sys/devices/system/node/node%d/cpulist", root, node);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return tnt__cpulist_parse(text, set);
}
