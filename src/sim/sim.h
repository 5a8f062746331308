/*
 * tnt-sim: libtnt's collective algorithms on a simulated cluster (SimGrid).
 *
 * Every rank is an SMPI actor (the program is started by smpirun on a
 * platform file). libtnt's own collective code (src/collectives, the
 * helpers of src/transport and src/util) is linked in unchanged and runs on
 * the SimGrid transport of transport_sim.c. Three kinds of waiting and work
 * in that code need the simulator's clock instead of the machine's, and are
 * redirected at link time (-Wl,--wrap, sim_hooks.c), so that no source file
 * of libtnt knows it is simulated:
 *  - tnt__spin_pause, where every wait of libtnt polls: the actor blocks
 *    until one of its transfers completes or a rank of its host publishes
 *    shared-memory progress;
 *  - tnt__shm_publish: wakes the ranks of the host that wait for it;
 *  - memcpy, tnt__reduce and tnt__reduce_many: cost simulated time at the
 *    host's memory bandwidth (and are skipped without --data, where the
 *    buffers hold no data worth reducing).
 * Ranks run cooperatively (one actor at a time), so none of this needs
 * locks. The program runs with smpi/privatization:no: the globals below are
 * shared by the actors on purpose.
 */
#ifndef TNT_SIM_SIM_H
#define TNT_SIM_SIM_H

#include <simgrid/forward.h>
#include <stddef.h>

#include "transport/transport.h"

/* A reduction dst op= src reads two vectors and writes one: it costs this
 * many copies of the vector (sim_hooks.c). */
#define TNT_SIM_REDUCE_COPIES 1.5

/* What the command line sets for every rank. */
typedef struct tnt_sim_opts {
  int data;          /* 1: real data (moved, reduced, checked); 0: timing only */
  double copy_gbps;  /* GB/s of one rank's memcpy (bytes copied per second) */
} tnt_sim_opts_t;

extern tnt_sim_opts_t tnt_sim_opts;

/* Sets up the world of `size` ranks; `host_of[r]` is rank r's host index
 * (0..num_hosts-1, numbered by first appearance). Called by every rank
 * with the same arguments; the first call copies them. */
tnt_status_t tnt_sim_world_init(int size, const int *host_of, int num_hosts);
/* This rank's transport over the whole world. */
tnt_status_t tnt_sim_transport_create(int rank, tnt__transport_t **out);

/* A pending transfer of the SimGrid transport. */
typedef struct sim_req {
  sg_comm_t comm;
  void *payload;  /* the message: sent, or received once it arrived */
  void *buf;      /* receive: where its bytes go */
  int completed;  /* 1: tnt_sim_block saw it finish (SimGrid released the comm) */
} sim_req_t;

/* Per-actor state the hooks and the transport share. */
typedef struct tnt_sim_actor {
  int rank, host;
  sim_req_t **pending; /* posted and not yet reported done by test */
  int npending, cap;
  sg_comm_t *scratch;  /* [cap + 1], for tnt_sim_block */
  int *scratch_idx;
  /* The doorbell: a receive of an empty message, posted while the actor
   * blocks, which a rank of its host sends when it publishes progress. */
  sg_comm_t bell;
  void *bell_payload;
  int bell_posted, rung;
} tnt_sim_actor_t;

/* Binds the calling actor to world rank `rank` (once, at start). */
tnt_status_t tnt_sim_bind(int rank);
tnt_sim_actor_t *tnt_sim_self(void);
tnt_sim_actor_t *tnt_sim_actor(int rank);
/* The ranks on `host`: *n of them, in rank order. */
const int *tnt_sim_host_ranks(int host, int *n);
void tnt_sim_pending_remove(tnt_sim_actor_t *a, sim_req_t *q);

/* Blocks the calling actor until one of its transfers completes or a rank
 * of its host publishes (sim_hooks.c). */
void tnt_sim_block(void);
/* Wakes the ranks of the caller's host that block in tnt_sim_block. */
void tnt_sim_wake_host(void);

/* The libc memcpy (the link wraps the plain name). */
void *__real_memcpy(void *dst, const void *src, size_t n);

#endif
