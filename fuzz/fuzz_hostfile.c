/*
 * Fuzz target for the hostfile parser: any bytes must give either a list
 * of valid, unique host names or a message, never a crash, a leak or a
 * hang.
 */
#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hostfile.h"

static void check_list(const tnt__hostlist_t *list) {
  if (list->count < 1) abort();
  for (int i = 0; i < list->count; ++i) {
    const char *name = list->names[i];
    size_t len = strlen(name);
    if (len == 0 || len > TNT__HOST_NAME_MAX || name[0] == '-' || name[0] == '.') abort();
    for (size_t k = 0; k < len; ++k) {
      char c = name[k];
      if (!isalnum((unsigned char)c) && c != '-' && c != '.' && c != '_') abort();
    }
    if (i > 0 && list->lines[i] <= list->lines[i - 1]) abort();
  }
  /* Uniqueness, checked the slow and obvious way on small lists. */
  if (list->count <= 200) {
    for (int i = 0; i < list->count; ++i) {
      for (int j = i + 1; j < list->count; ++j) {
        if (strcasecmp(list->names[i], list->names[j]) == 0) abort();
      }
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tnt__hostlist_t list;
  char err[768];
  if (tnt__hostfile_parse((const char *)data, size, &list, err, sizeof err) == 0) {
    check_list(&list);
    tnt__hostlist_check_local(&list, "node-a.example.org", err, sizeof err);
    for (int i = 0; i < list.count; ++i) tnt__host_is_local(list.names[i], "");
  } else if (err[0] == '\0') {
    abort();
  }
  tnt__hostlist_free(&list);
  return 0;
}
