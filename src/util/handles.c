/* The handle table: a growing array indexed by handle - 1, under a mutex. */
#include "util/handles.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct entry {
  tnt__handle_kind_t kind;
  void *obj;
} entry_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry_t *table;
static size_t used, cap;

tnt_status_t tnt__handle_add(tnt__handle_kind_t kind, void *obj, int64_t *handle) {
  pthread_mutex_lock(&mu);
  if (used == cap) {
    size_t n = cap ? 2 * cap : 32;
    entry_t *t = realloc(table, n * sizeof *t);
    if (t == NULL) {
      pthread_mutex_unlock(&mu);
      return TNT_ERR_NO_MEMORY;
    }
    table = t;
    cap = n;
  }
  table[used++] = (entry_t){kind, obj};
  *handle = (int64_t)used;
  pthread_mutex_unlock(&mu);
  return TNT_OK;
}

void *tnt__handle_get(tnt__handle_kind_t kind, int64_t handle) {
  void *obj = NULL;
  pthread_mutex_lock(&mu);
  if (handle > 0 && (size_t)handle <= used && table[handle - 1].kind == kind) {
    obj = table[handle - 1].obj;
  }
  pthread_mutex_unlock(&mu);
  return obj;
}

void tnt__handle_remove(int64_t handle) {
  pthread_mutex_lock(&mu);
  if (handle > 0 && (size_t)handle <= used) table[handle - 1].obj = NULL;
  pthread_mutex_unlock(&mu);
}
