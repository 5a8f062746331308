/*
 * Contexts and groups. A context owns the world transport, the engine and
 * every group created on it; the first failure of any operation is recorded
 * here and turns every later call into TNT_ERR_FAILED.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context.h"
#include "core/handles.h"
#include "core/log.h"
#include "core/timeline.h"
#include "engine/engine.h"

struct tnt_context {
  tnt__engine_t *engine;
  tnt_group_t *world;
  pthread_mutex_t mu; /* guards the group list and the error message */
  double timeout;
  _Atomic int error;
  char error_msg[640];
  int rank, size;
  int owns_mpi; /* tnt_context_create initialized MPI */
  int is_mpi;
};

/* ------------------------------------------------------------ errors */

void tnt__context_fail(tnt_context_t *ctx, tnt_status_t st, const char *label) {
  pthread_mutex_lock(&ctx->mu);
  if (atomic_load(&ctx->error) == TNT_OK) {
    const char *why = tnt__log_last_error();
    snprintf(ctx->error_msg, sizeof ctx->error_msg, "%s failed (%s)%s%s", label,
             tnt_status_string(st), *why ? ": " : "", why);
    atomic_store(&ctx->error, st);
  }
  pthread_mutex_unlock(&ctx->mu);
}

tnt_status_t tnt__context_check(const tnt_context_t *ctx) {
  return atomic_load(&ctx->error) == TNT_OK ? TNT_OK : TNT_ERR_FAILED;
}

tnt_status_t tnt_context_error(const tnt_context_t *ctx, const char **message) {
  if (ctx == NULL) return TNT_ERR_INVALID_ARG;
  tnt_status_t st = atomic_load(&ctx->error);
  if (message != NULL) *message = st == TNT_OK ? "" : ctx->error_msg;
  return st;
}

tnt__engine_t *tnt__context_engine(tnt_context_t *ctx) {
  return ctx->engine;
}
int tnt__context_rank(const tnt_context_t *ctx) {
  return ctx->rank;
}
int tnt__context_size(const tnt_context_t *ctx) {
  return ctx->size;
}
double tnt_context_timeout(const tnt_context_t *ctx) {
  return ctx->timeout;
}
tnt_group_t *tnt_context_world(tnt_context_t *ctx) {
  return ctx == NULL ? NULL : ctx->world;
}

/* ------------------------------------------------------------ life cycle */

static tnt_group_t *group_new(tnt_context_t *ctx, tnt__comm_t *comm) {
  tnt_group_t *g = calloc(1, sizeof *g);
  if (g == NULL) return NULL;
  g->ctx = ctx;
  g->comm = comm;
  if (tnt__handle_add(TNT__HANDLE_GROUP, g, &g->handle) < 0) {
    free(g);
    return NULL;
  }
  return g;
}

static void group_free(tnt_group_t *g) {
  tnt__handle_remove(g->handle);
  free(g);
}

tnt_status_t tnt__context_create_with_transport(tnt__transport_t *t, const tnt_config_t *config,
                                                tnt_context_t **out) {
  tnt_context_t *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) {
    t->ops->destroy(t);
    return TNT_ERR_NO_MEMORY;
  }
  pthread_mutex_init(&ctx->mu, NULL);
  atomic_init(&ctx->error, TNT_OK);
  ctx->rank = t->rank;
  ctx->size = t->size;
  ctx->timeout = config != NULL && config->timeout_s > 0 ? config->timeout_s
                                                         : tnt__env_double("TNT_TIMEOUT_S", 30.0);
  tnt__comm_t *comm = NULL;
  tnt_status_t st = tnt__comm_create(t, &comm);
  if (st < 0) goto fail;
  ctx->world = group_new(ctx, comm);
  if (ctx->world == NULL) {
    tnt__comm_destroy(comm);
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  ctx->world->is_world = 1;
  TNT_CHECK_GOTO(tnt__engine_create(ctx, &ctx->engine), st, fail);
  TNT_LOG_DEBUG("context ready: %d ranks on %d hosts, timeout %.1f s", ctx->size,
                comm->num_hosts, ctx->timeout);
  *out = ctx;
  return TNT_OK;
fail:
  if (ctx->world != NULL) {
    tnt__comm_destroy(ctx->world->comm);
    group_free(ctx->world);
  }
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  return st;
}

tnt_status_t tnt_context_create(const tnt_config_t *config, tnt_context_t **out) {
  if (out == NULL) return TNT_ERR_INVALID_ARG;
  int initialized = 0, provided = 0, owns = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      TNT_LOG_ERROR("MPI_Init_thread failed");
      return TNT_ERR_MPI;
    }
    owns = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    /* The engine enters MPI from its own thread, one thread at a time. */
    TNT_LOG_ERROR("MPI was initialized with thread level %d; libtnt needs MPI_THREAD_SERIALIZED "
                  "or MPI_THREAD_MULTIPLE (initialize MPI with MPI_Init_thread)",
                  provided);
    if (owns) MPI_Finalize();
    return TNT_ERR_UNSUPPORTED;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  tnt__log_set_rank(rank, size, 0);
  /* Before the engine starts, so that its thread is in the timeline. */
  tnt__timeline_open(rank, size);
  tnt__timeline_name_thread("main");
  tnt__transport_t *t = NULL;
  tnt_status_t st = tnt__transport_mpi_create(&t);
  if (st >= 0) st = tnt__context_create_with_transport(t, config, out);
  if (st < 0) {
    tnt__timeline_close();
    /* With other ranks, a failure here (e.g. shared memory that could not be
     * allocated) can leave them inside a collective MPI call that waits for
     * this rank; MPI_Finalize would then wait for them forever. Returning
     * without it lets the program exit with the error, and the launcher end
     * the others. */
    if (owns && size == 1) MPI_Finalize();
    return st;
  }
  (*out)->owns_mpi = owns;
  (*out)->is_mpi = 1;
  return TNT_OK;
}

tnt_status_t tnt_context_destroy(tnt_context_t *ctx) {
  if (ctx == NULL) return TNT_OK;
  tnt__engine_destroy(ctx->engine);
  tnt_status_t failed = tnt__context_check(ctx);
  while (ctx->world->next != NULL) {
    tnt_group_t *g = ctx->world->next;
    ctx->world->next = g->next;
    tnt__comm_destroy(g->comm);
    group_free(g);
  }
  tnt__comm_destroy(ctx->world->comm);
  group_free(ctx->world);
  int finalize = ctx->owns_mpi && failed == TNT_OK;
  if (ctx->is_mpi) tnt__timeline_close();
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  if (finalize) MPI_Finalize();
  return failed;
}

void tnt_context_abort(tnt_context_t *ctx, int exit_code) {
  (void)ctx;
  fflush(stdout);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

/* ------------------------------------------------------------ groups */

typedef struct group_args {
  const int *ranks;
  int n;
  tnt__comm_t *comm;
} group_args_t;

static tnt_status_t group_create_run(tnt__op_t *op, const tnt__wait_ctx_t *w) {
  (void)w;
  group_args_t *a = op->recvbuf;
  tnt__transport_t *sub = NULL;
  TNT_CHECK(op->comm->t->ops->split(op->comm->t, a->ranks, a->n, &sub));
  return tnt__comm_create(sub, &a->comm);
}

static tnt_status_t group_destroy_run(tnt__op_t *op, const tnt__wait_ctx_t *w) {
  (void)w;
  tnt__comm_destroy(op->comm);
  return TNT_OK;
}

tnt_status_t tnt_group_create(tnt_context_t *ctx, const int *ranks, int n, tnt_group_t **out) {
  if (ctx == NULL || ranks == NULL || out == NULL) {
    TNT_LOG_ERROR("tnt_group_create: the context, the rank list and the output must not be NULL");
    return TNT_ERR_INVALID_ARG;
  }
  if (n <= 0 || n > ctx->size) {
    TNT_LOG_ERROR("tnt_group_create: %d ranks listed; a group has 1..%d ranks", n, ctx->size);
    return TNT_ERR_INVALID_ARG;
  }
  TNT_CHECK(tnt__context_check(ctx));
  int member = 0;
  for (int i = 0; i < n; ++i) {
    if (ranks[i] < 0 || ranks[i] >= ctx->size) {
      TNT_LOG_ERROR("tnt_group_create: rank %d is not in 0..%d", ranks[i], ctx->size - 1);
      return TNT_ERR_INVALID_ARG;
    }
    for (int j = 0; j < i; ++j) {
      if (ranks[j] == ranks[i]) {
        TNT_LOG_ERROR("tnt_group_create: rank %d is listed twice", ranks[i]);
        return TNT_ERR_INVALID_ARG;
      }
    }
    member |= ranks[i] == ctx->rank;
  }
  if (!member) {
    TNT_LOG_ERROR("tnt_group_create: only listed ranks may call it; rank %d is not listed",
                  ctx->rank);
    return TNT_ERR_INVALID_ARG;
  }
  tnt_request_t *req = NULL;
  TNT_CHECK(tnt__request_new(ctx, &req));
  group_args_t args = {ranks, n, NULL};
  req->op.kind = TNT__OP_RUN;
  req->op.run = group_create_run;
  req->op.comm = ctx->world->comm;
  req->op.recvbuf = &args;
  snprintf(req->op.label, sizeof req->op.label, "group creation (%d ranks)", n);
  TNT_CHECK(tnt__engine_run(ctx->engine, req));
  tnt_group_t *g = group_new(ctx, args.comm);
  if (g == NULL) {
    tnt__comm_destroy(args.comm);
    return TNT_ERR_NO_MEMORY;
  }
  pthread_mutex_lock(&ctx->mu);
  g->next = ctx->world->next;
  ctx->world->next = g;
  pthread_mutex_unlock(&ctx->mu);
  *out = g;
  return TNT_OK;
}

tnt_status_t tnt_group_destroy(tnt_group_t *g) {
  if (g == NULL || g->is_world) return TNT_ERR_INVALID_ARG;
  tnt_context_t *ctx = g->ctx;
  pthread_mutex_lock(&ctx->mu);
  for (tnt_group_t *p = ctx->world; p != NULL; p = p->next) {
    if (p->next == g) {
      p->next = g->next;
      break;
    }
  }
  pthread_mutex_unlock(&ctx->mu);
  tnt_request_t *req = NULL;
  tnt_status_t st = tnt__request_new(ctx, &req);
  if (st >= 0) {
    req->op.kind = TNT__OP_RUN;
    req->op.run = group_destroy_run;
    req->op.comm = g->comm;
    snprintf(req->op.label, sizeof req->op.label, "group destruction");
    st = tnt__engine_run(ctx->engine, req);
  }
  group_free(g);
  return st;
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
