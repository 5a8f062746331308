/*
 * The link-time hooks of tnt-sim (see sim.h): libtnt's waits block the
 * simulated actor instead of spinning, and its copies and reductions cost
 * simulated time at the memory bandwidth of one rank.
 */
#include <simgrid/actor.h>
#include <simgrid/comm.h>
#include <simgrid/mailbox.h>
#include <stdio.h>
#include <stdlib.h>

#include "collectives/collectives.h"
#include "sim.h"
#include "util/reduce.h"
#include "util/types.h"

tnt_sim_opts_t tnt_sim_opts = {.data = 1, .copy_gbps = 10.0};

/* Copies shorter than this are control data (signatures, counters): free. */
#define SIM_COSTED_COPY_BYTES 1024u

static sg_mailbox_t bell_box(int rank) {
  char name[32];
  snprintf(name, sizeof name, "bell>%d", rank);
  return sg_mailbox_by_name(name);
}

void tnt_sim_block(void) {
  tnt_sim_actor_t *a = tnt_sim_self();
  int k = 0;
  for (int i = 0; i < a->npending; i++) {
    if (a->pending[i]->completed) continue;
    a->scratch[k] = a->pending[i]->comm;
    a->scratch_idx[k++] = i;
  }
  int peers = 0;
  tnt_sim_host_ranks(a->host, &peers);
  if (peers > 1) {
    if (!a->bell_posted) {
      a->bell_posted = 1; /* before the simcall: a publisher may run during it */
      a->bell = sg_mailbox_get_async(bell_box(a->rank), &a->bell_payload);
    }
    if (a->scratch == NULL) { /* nothing posted yet: room for the bell */
      a->scratch = malloc(sizeof *a->scratch);
      a->scratch_idx = malloc(sizeof *a->scratch_idx);
      if (a->scratch == NULL || a->scratch_idx == NULL) return;
    }
    a->scratch[k] = a->bell;
    a->scratch_idx[k++] = -1;
  }
  if (k == 0) {
    /* Nothing can change what this actor waits for; let time pass so
     * that the simulation reports the deadlock instead of spinning. */
    sg_actor_sleep_for(1e-3);
    return;
  }
  ssize_t got = sg_comm_wait_any(a->scratch, (size_t)k);
  if (got < 0) return;
  /* SimGrid released the comm that completed; the others stay ours. */
  if (a->scratch_idx[got] < 0) {
    a->bell_posted = 0;
    a->rung = 0;
  } else {
    a->pending[a->scratch_idx[got]]->completed = 1;
  }
}

void tnt_sim_wake_host(void) {
  tnt_sim_actor_t *a = tnt_sim_self();
  int n = 0;
  const int *ranks = tnt_sim_host_ranks(a->host, &n);
  for (int i = 0; i < n; i++) {
    tnt_sim_actor_t *b = tnt_sim_actor(ranks[i]);
    if (b == a || !b->bell_posted || b->rung) continue;
    /* An empty message. SimGrid refuses a null payload, and SMPI's copy
     * callback frees the payload of a detached send once it is delivered. */
    void **token = calloc(1, sizeof *token);
    if (token == NULL) continue; /* the waiter then wakes at its next transfer */
    b->rung = 1;
    sg_comm_detach(sg_mailbox_put_init(bell_box(b->rank), token, 0), NULL);
  }
}

/* Simulated time for moving `bytes` through one rank's memory system. */
static void charge(double bytes) {
  if (tnt_sim_opts.copy_gbps > 0.0) sg_actor_sleep_for(bytes / (tnt_sim_opts.copy_gbps * 1e9));
}

/* ---- the wrapped functions (-Wl,--wrap=NAME) ---- */

void __real_tnt__shm_publish(tnt__comm_t *c, int which, uint64_t value);
void __real_tnt__reduce(void *dst, const void *src, size_t count, tnt_dtype_t dtype, tnt_op_t op);
void __real_tnt__reduce_many(void *dst, const void *const *srcs, int n, size_t count,
                             tnt_dtype_t dtype, tnt_op_t op, int divisor);

void __wrap_tnt__spin_pause(unsigned iter) {
  (void)iter;
  tnt_sim_block();
}

void __wrap_tnt__shm_publish(tnt__comm_t *c, int which, uint64_t value) {
  __real_tnt__shm_publish(c, which, value);
  tnt_sim_wake_host();
}

void *__wrap_memcpy(void *dst, const void *src, size_t n) {
  if (n >= SIM_COSTED_COPY_BYTES) {
    charge((double)n);
    if (!tnt_sim_opts.data) return dst;
  }
  return __real_memcpy(dst, src, n);
}

void __wrap_tnt__reduce(void *dst, const void *src, size_t count, tnt_dtype_t dtype,
                        tnt_op_t op) {
  charge(TNT_SIM_REDUCE_COPIES * (double)count * (double)tnt__dtype_size(dtype));
  if (tnt_sim_opts.data) __real_tnt__reduce(dst, src, count, dtype, op);
}

/* n inputs read, one output written: (n + 1) / 2 copies. */
void __wrap_tnt__reduce_many(void *dst, const void *const *srcs, int n, size_t count,
                             tnt_dtype_t dtype, tnt_op_t op, int divisor) {
  charge(0.5 * (n + 1) * (double)count * (double)tnt__dtype_size(dtype));
  if (tnt_sim_opts.data) __real_tnt__reduce_many(dst, srcs, n, count, dtype, op, divisor);
}
