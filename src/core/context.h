/*
 * Internal view of contexts and groups, for the engine, the fusion runtime
 * and the tests that run whole contexts over ranks simulated as threads.
 */
#ifndef TNT_CORE_CONTEXT_H
#define TNT_CORE_CONTEXT_H

#include "collectives/collectives.h"
#include "tnt/tnt.h"

typedef struct tnt__engine tnt__engine_t;

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
 * tests use it with the threads transport, one context per simulated rank.
 * MPI is neither initialized nor finalized by such a context.
 */
tnt_status_t tnt__context_create_with_transport(tnt__transport_t *t, const tnt_config_t *config,
                                                tnt_context_t **out);

tnt__engine_t *tnt__context_engine(tnt_context_t *ctx);

/* Records the first failure of the context: `st` and a message built from
 * `label` and the detailed reason the failing thread logged last. */
void tnt__context_fail(tnt_context_t *ctx, tnt_status_t st, const char *label);
/* TNT_OK, or TNT_ERR_FAILED once the context has failed. */
tnt_status_t tnt__context_check(const tnt_context_t *ctx);
/* World rank and size of the context, for log prefixes. */
int tnt__context_rank(const tnt_context_t *ctx);
int tnt__context_size(const tnt_context_t *ctx);

#endif
