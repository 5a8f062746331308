/*
 * The API layer: every public function of tnt/tnt.h is defined in src/api,
 * in the file its name says (tnt_context_* in context.c, tnt_group_* in
 * group.c, the collectives and point-to-point calls in collectives.c,
 * tnt_request_* in request.c, tnt_fusion_* in fusion.c, tnt_timeline_* in
 * timeline.c, names and tnt_last_error in status.c). The layers below
 * (fusion, engine, collectives, transport, util) are internal and never
 * call back up.
 *
 * The error contract. Every public call that returns a tnt_status_t clears
 * the calling thread's message when it starts (tnt__error_clear) and ends
 * through tnt__api_end, so that tnt_last_error describes this call's
 * failure, and is "" after a success. Queries that cannot fail (names,
 * sizes, group getters, tnt_context_error) leave the message alone.
 */
#ifndef TNT_API_API_H
#define TNT_API_API_H

#include "collectives/collectives.h"
#include "engine/engine.h"
#include "tnt/tnt.h"
#include "util/common.h"
#include "util/log.h"

struct tnt_group {
  tnt_context_t *ctx;
  tnt__comm_t *comm;
  tnt_group_t *next; /* in the context's list of groups */
  int64_t handle;
  int is_world;
};

/*
 * Creates a context over an existing world transport (takes ownership of
 * `t`, also on failure). tnt_context_create uses it with the MPI transport;
 * tests use it with the threads transport (tests/fixtures), one context
 * per simulated rank. MPI is neither initialized nor finalized by such a
 * context.
 */
tnt_status_t tnt__context_create_with_transport(tnt__transport_t *t, const tnt_config_t *config,
                                                tnt_context_t **out);

/* The engine of a context (never NULL for a created context). */
tnt__engine_t *tnt__context_engine(const tnt_context_t *ctx);
/* World rank and size of the context. */
int tnt__context_rank(const tnt_context_t *ctx);
int tnt__context_size(const tnt_context_t *ctx);
/* The context's list of groups (context.c), which it frees with it. */
void tnt__context_add_group(tnt_context_t *ctx, tnt_group_t *g);
void tnt__context_remove_group(tnt_context_t *ctx, tnt_group_t *g);

/* A group of `ctx` over `comm` with a handle (group.c); NULL when out of
 * memory. tnt__group_free releases the handle and the group, not comm. */
tnt_group_t *tnt__group_new(tnt_context_t *ctx, tnt__comm_t *comm);
void tnt__group_free(tnt_group_t *g);

/*
 * The end of a public call named `call` on context `ctx` (may be NULL)
 * with status `st`: on success it clears the thread's message; on failure
 * it makes sure there is one, saying why. A failure that logged its reason
 * keeps it; otherwise the message is the context's first failure when the
 * context has failed ("<call>: the communication context failed: <why>"),
 * else the status name. Returns `st`.
 */
tnt_status_t tnt__api_end(const char *call, const tnt_context_t *ctx, tnt_status_t st);

/* Logs "<call>: <why>" as the thread's error and returns
 * TNT_ERR_INVALID_ARG: the end of every argument check. */
tnt_status_t tnt__api_invalid(const char *call, const char *why, ...)
    __attribute__((format(printf, 2, 3)));

#endif
