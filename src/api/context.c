/*
 * Contexts: a context owns the world transport, the engine (which keeps
 * the record of the first failure) and every group created on it. Also
 * the end of every public call (tnt__api_end), which keeps the error
 * contract of api.h.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "util/settings.h"
#include "util/timeline.h"

struct tnt_context {
  tnt__engine_t *engine;
  tnt_group_t *world; /* the head of the list of groups */
  pthread_mutex_t mu; /* guards the list of groups */
  int rank, size;
  int owns_mpi; /* tnt_context_create initialized MPI */
  int is_mpi;
};

/* ------------------------------------------------------------ errors */

tnt_status_t tnt__api_end(const char *call, const tnt_context_t *ctx, tnt_status_t st) {
  if (st >= 0) {
    tnt__error_clear();
    return st;
  }
  if (*tnt__error_message() != '\0') return st;
  const char *why = "";
  if (ctx != NULL && tnt__engine_error(ctx->engine, &why) != TNT_OK) {
    tnt__error_set("%s: the communication context failed: %s", call, why);
  } else {
    tnt__error_set("%s: %s", call, tnt__status_string(st));
  }
  return st;
}

tnt_status_t tnt__api_invalid(const char *call, const char *why, ...) {
  char text[400];
  va_list ap;
  va_start(ap, why);
  vsnprintf(text, sizeof text, why, ap);
  va_end(ap);
  TNT_LOG_ERROR("%s: %s", call, text);
  return TNT_ERR_INVALID_ARG;
}

tnt_status_t tnt_context_error(const tnt_context_t *ctx, const char **message) {
  if (ctx == NULL) {
    if (message != NULL) *message = "no context";
    return TNT_ERR_INVALID_ARG;
  }
  return tnt__engine_error(ctx->engine, message);
}

tnt__engine_t *tnt__context_engine(const tnt_context_t *ctx) {
  return ctx->engine;
}

double tnt_context_timeout(const tnt_context_t *ctx) {
  return ctx == NULL ? 0.0 : tnt__engine_timeout(ctx->engine);
}

tnt_group_t *tnt_context_world(tnt_context_t *ctx) {
  return ctx == NULL ? NULL : ctx->world;
}

/* ------------------------------------------------------------ groups */

void tnt__context_add_group(tnt_context_t *ctx, tnt_group_t *g) {
  pthread_mutex_lock(&ctx->mu);
  g->next = ctx->world->next;
  ctx->world->next = g;
  pthread_mutex_unlock(&ctx->mu);
}

void tnt__context_remove_group(tnt_context_t *ctx, tnt_group_t *g) {
  pthread_mutex_lock(&ctx->mu);
  for (tnt_group_t *p = ctx->world; p != NULL; p = p->next) {
    if (p->next == g) {
      p->next = g->next;
      break;
    }
  }
  pthread_mutex_unlock(&ctx->mu);
}

int tnt__context_rank(const tnt_context_t *ctx) {
  return ctx->rank;
}

int tnt__context_size(const tnt_context_t *ctx) {
  return ctx->size;
}

/* ------------------------------------------------------------ life cycle */

/* Reads the settings a new context runs with; a bad value is an error
 * that names it and lists what it takes. */
static tnt_status_t load_settings(void) {
  char err[512];
  if (tnt__settings_read(NULL, err, sizeof err) == 0) return TNT_OK;
  TNT_LOG_ERROR("%s", err);
  return TNT_ERR_INVALID_ARG;
}

tnt_status_t tnt__context_create_with_transport(tnt__transport_t *t, const tnt_config_t *config,
                                                tnt_context_t **out) {
  if (load_settings() < 0) {
    t->ops->destroy(t);
    return TNT_ERR_INVALID_ARG;
  }
  tnt_context_t *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) {
    t->ops->destroy(t);
    TNT_LOG_ERROR("out of memory for a context");
    return TNT_ERR_NO_MEMORY;
  }
  pthread_mutex_init(&ctx->mu, NULL);
  ctx->rank = t->rank;
  ctx->size = t->size;
  const double timeout = config != NULL && config->timeout_s > 0
                             ? config->timeout_s
                             : tnt__setting_number(TNT__S_TIMEOUT_S);
  tnt__comm_t *comm = NULL;
  tnt_status_t st = tnt__comm_create(t, &comm);
  if (st < 0) goto fail;
  ctx->world = tnt__group_new(ctx, comm);
  if (ctx->world == NULL) {
    tnt__comm_destroy(comm);
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  ctx->world->is_world = 1;
  TNT_CHECK_GOTO(tnt__engine_create(ctx->rank, ctx->size, timeout, &ctx->engine), st, fail);
  TNT_LOG_DEBUG("context ready: %d ranks on %d hosts, timeout %.1f s", ctx->size, comm->num_hosts,
                timeout);
  *out = ctx;
  return TNT_OK;
fail:
  if (ctx->world != NULL) {
    tnt__comm_destroy(ctx->world->comm);
    tnt__group_free(ctx->world);
  }
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  return st;
}

static tnt_status_t context_create(const tnt_config_t *config, tnt_context_t **out) {
  if (out == NULL) return tnt__api_invalid("tnt_context_create", "the output must not be NULL");
  TNT_CHECK(load_settings()); /* before MPI starts: a bad setting fails at once */
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
    TNT_LOG_ERROR(
        "MPI was initialized with thread level %d; libtnt needs MPI_THREAD_SERIALIZED "
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

tnt_status_t tnt_context_create(const tnt_config_t *config, tnt_context_t **out) {
  tnt__error_clear();
  return tnt__api_end("tnt_context_create", NULL, context_create(config, out));
}

tnt_status_t tnt_context_destroy(tnt_context_t *ctx) {
  tnt__error_clear();
  if (ctx == NULL) return TNT_OK;
  const tnt_status_t failed = tnt__engine_destroy(ctx->engine);
  ctx->engine = NULL;
  while (ctx->world->next != NULL) {
    tnt_group_t *g = ctx->world->next;
    ctx->world->next = g->next;
    if (failed < 0) tnt__comm_abandon(g->comm);
    tnt__comm_destroy(g->comm);
    tnt__group_free(g);
  }
  if (failed < 0) tnt__comm_abandon(ctx->world->comm);
  tnt__comm_destroy(ctx->world->comm);
  tnt__group_free(ctx->world);
  const int finalize = ctx->owns_mpi && failed == TNT_OK;
  if (ctx->is_mpi) tnt__timeline_close();
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  if (finalize) MPI_Finalize();
  if (failed < 0) {
    tnt__error_set(
        "tnt_context_destroy: the context had failed, so MPI was not finalized "
        "(operations may still be pending); end the process");
  }
  return failed;
}

void tnt_context_abort(tnt_context_t *ctx, int exit_code) {
  (void)ctx;
  fflush(stdout);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}
