/*
 * Groups: a communicator over a subset of the world, created and destroyed
 * on the engine (in order with the collectives, since creating one is
 * collective over its members).
 */
#include <stdio.h>
#include <stdlib.h>

#include "api/api.h"
#include "util/handles.h"

tnt_group_t *tnt__group_new(tnt_context_t *ctx, tnt__comm_t *comm) {
  tnt_group_t *g = calloc(1, sizeof *g);
  if (g == NULL) {
    TNT_LOG_ERROR("out of memory for a group");
    return NULL;
  }
  g->ctx = ctx;
  g->comm = comm;
  if (tnt__handle_add(TNT__HANDLE_GROUP, g, &g->handle) < 0) {
    TNT_LOG_ERROR("out of memory for the handle of a group");
    free(g);
    return NULL;
  }
  return g;
}

void tnt__group_free(tnt_group_t *g) {
  tnt__handle_remove(g->handle);
  free(g);
}

/* What creating a group's communicator needs, on the executor. */
typedef struct group_args {
  const int *ranks; /* world ranks, which are the world transport's ranks */
  int n;
  tnt__comm_t *comm; /* the result */
} group_args_t;

static tnt_status_t group_create_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  (void)w;
  group_args_t *a = work->arg;
  tnt__transport_t *sub = NULL;
  TNT_CHECK(work->comm->t->ops->split(work->comm->t, a->ranks, a->n, &sub));
  return tnt__comm_create(sub, &a->comm);
}

static tnt_status_t group_destroy_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  (void)w;
  tnt__comm_destroy(work->comm);
  return TNT_OK;
}

static tnt_status_t group_create(tnt_context_t *ctx, const int *ranks, int n, tnt_group_t **out) {
  static const char call[] = "tnt_group_create";
  if (ctx == NULL || ranks == NULL || out == NULL) {
    return tnt__api_invalid(call, "the context, the rank list and the output must not be NULL");
  }
  const int size = tnt__context_size(ctx), me = tnt__context_rank(ctx);
  if (n <= 0 || n > size) {
    return tnt__api_invalid(call, "%d ranks listed; a group has 1..%d ranks", n, size);
  }
  TNT_CHECK(tnt__engine_check(tnt__context_engine(ctx)));
  int member = 0;
  for (int i = 0; i < n; ++i) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      return tnt__api_invalid(call, "rank %d is not in 0..%d", ranks[i], size - 1);
    }
    for (int j = 0; j < i; ++j) {
      if (ranks[j] == ranks[i]) return tnt__api_invalid(call, "rank %d is listed twice", ranks[i]);
    }
    member |= ranks[i] == me;
  }
  if (!member) {
    return tnt__api_invalid(call, "only listed ranks may call it; rank %d is not listed", me);
  }
  group_args_t args = {ranks, n, NULL};
  char label[64];
  snprintf(label, sizeof label, "group creation (%d ranks)", n);
  TNT_CHECK(tnt__engine_call(tnt__context_engine(ctx), tnt_context_world(ctx)->comm, label,
                             group_create_run, &args));
  tnt_group_t *g = tnt__group_new(ctx, args.comm);
  if (g == NULL) {
    tnt__comm_destroy(args.comm);
    return TNT_ERR_NO_MEMORY;
  }
  tnt__context_add_group(ctx, g);
  *out = g;
  return TNT_OK;
}

tnt_status_t tnt_group_create(tnt_context_t *ctx, const int *ranks, int n, tnt_group_t **out) {
  tnt__error_clear();
  return tnt__api_end("tnt_group_create", ctx, group_create(ctx, ranks, n, out));
}

tnt_status_t tnt_group_destroy(tnt_group_t *g) {
  static const char call[] = "tnt_group_destroy";
  tnt__error_clear();
  if (g == NULL || g->is_world) {
    return tnt__api_invalid(call, "need a group from tnt_group_create (not NULL, not the world)");
  }
  tnt_context_t *ctx = g->ctx;
  tnt__context_remove_group(ctx, g);
  tnt_status_t st = tnt__engine_call(tnt__context_engine(ctx), g->comm, "group destruction",
                                     group_destroy_run, NULL);
  tnt__group_free(g);
  return tnt__api_end(call, ctx, st);
}

int tnt_group_rank(const tnt_group_t *g) {
  return g == NULL ? -1 : g->comm->rank;
}
int tnt_group_size(const tnt_group_t *g) {
  return g == NULL ? -1 : g->comm->size;
}
int tnt_group_local_rank(const tnt_group_t *g) {
  return g == NULL ? -1 : g->comm->local_rank;
}
int tnt_group_local_size(const tnt_group_t *g) {
  return g == NULL ? -1 : g->comm->local_size;
}
int tnt_group_num_hosts(const tnt_group_t *g) {
  return g == NULL ? -1 : g->comm->num_hosts;
}
int64_t tnt_group_handle(const tnt_group_t *g) {
  return g == NULL ? 0 : g->handle;
}
tnt_context_t *tnt_group_context(const tnt_group_t *g) {
  return g == NULL ? NULL : g->ctx;
}
tnt_group_t *tnt_group_lookup(int64_t handle) {
  return tnt__handle_get(TNT__HANDLE_GROUP, handle);
}
