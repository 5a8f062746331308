/*
 * Communicators: a group's transport plus the two derived transports that
 * hierarchical algorithms need (members on this host, and one member per
 * host) and the shared memory of this host's members.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "util/settings.h"
#include "util/log.h"
#include "util/types.h"

/* Groups that span hosts use larger slots by default: a slot is one round
 * of the hierarchical allreduce, and fewer, longer rounds keep the host's
 * share of each collective short next to the time on the network. */
static size_t slot_bytes_from_settings(int num_hosts) {
  double kb = tnt__setting_number(TNT__S_SHM_SLOT_KB);
  if (kb < 0) kb = num_hosts > 1 ? 4096.0 : 256.0; /* auto */
  size_t bytes = (size_t)(kb * 1024.0);
  bytes = (bytes + 63u) & ~(size_t)63u; /* whole cache lines */
  return bytes < 64 ? 64 : bytes;
}

static tnt__ring_cfg_t ring_cfg_from_settings(void) {
  size_t bytes = (size_t)(tnt__setting_number(TNT__S_RING_SEGMENT_KB) * 1024.0);
  return (tnt__ring_cfg_t){bytes < 64 ? 64 : bytes, (int)tnt__setting_number(TNT__S_RING_DEPTH)};
}

tnt_status_t tnt__comm_create(tnt__transport_t *t, tnt__comm_t **out) {
  tnt_status_t st = TNT_OK;
  int *list = NULL, *count_on = NULL;
  tnt__comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) {
    t->ops->destroy(t);
    return TNT_ERR_NO_MEMORY;
  }
  c->t = t;
  c->rank = t->rank;
  c->size = t->size;
  c->num_hosts = t->num_hosts;
  c->ring = ring_cfg_from_settings();
  list = malloc((size_t)t->size * sizeof(int));
  count_on = calloc((size_t)t->num_hosts, sizeof(int));
  if (list == NULL || count_on == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }

  /* Members on this host, in rank order. */
  int me = t->host_of[t->rank], n = 0;
  for (int r = 0; r < t->size; ++r) {
    if (r == t->rank) c->local_rank = n;
    if (t->host_of[r] == me) list[n++] = r;
    count_on[t->host_of[r]]++;
  }
  c->local_size = n;
  TNT_CHECK_GOTO(t->ops->split(t, list, n, &c->node), st, fail);

  /* One member per host, when hosts are alike. */
  int homogeneous = 1;
  for (int h = 0; h < t->num_hosts; ++h) homogeneous &= count_on[h] == c->local_size;
  if (t->num_hosts > 1 && homogeneous) {
    int m = 0;
    for (int h = 0; h < t->num_hosts; ++h) {
      int seen = 0;
      for (int r = 0; r < t->size; ++r) {
        if (t->host_of[r] == h && seen++ == c->local_rank) list[m++] = r;
      }
    }
    TNT_CHECK_GOTO(t->ops->split(t, list, m, &c->cross), st, fail);
  }

  if (c->node->ops->shm_alloc != NULL) {
    c->shm_slot_bytes = slot_bytes_from_settings(t->num_hosts);
    st = c->node->ops->shm_alloc(c->node, TNT__SHM_CTRL_BYTES + 2 * c->shm_slot_bytes, &c->shm);
    if (st == TNT_ERR_UNSUPPORTED) {
      TNT_LOG_INFO("shared memory is not available; using network algorithms on this host");
      c->shm = NULL;
      st = TNT_OK;
    }
    if (st < 0) goto fail;
  }
  tnt__algo_resolve(c);
  free(list);
  free(count_on);
  *out = c;
  return TNT_OK;
fail:
  free(list);
  free(count_on);
  tnt__comm_destroy(c);
  return st;
}

void tnt__comm_abandon(tnt__comm_t *c) {
  if (c == NULL) return;
  c->t->abandoned = 1;
  if (c->node != NULL) c->node->abandoned = 1;
  if (c->cross != NULL) c->cross->abandoned = 1;
}

void tnt__comm_destroy(tnt__comm_t *c) {
  if (c == NULL) return;
  if (c->shm != NULL) c->node->ops->shm_free(c->node, c->shm);
  if (c->cross != NULL) c->cross->ops->destroy(c->cross);
  if (c->node != NULL) c->node->ops->destroy(c->node);
  c->t->ops->destroy(c->t);
  free(c);
}

/* ---- shared-memory synchronisation ---- */

uint8_t *tnt__shm_slot(const tnt__comm_t *c, int r, int slot) {
  return c->shm->base[r] + TNT__SHM_CTRL_BYTES + (size_t)slot * c->shm_slot_bytes;
}

static _Atomic uint64_t *counter(const tnt__comm_t *c, int r, int which) {
  return (_Atomic uint64_t *)(void *)(c->shm->base[r] + 64 * which);
}

void tnt__shm_publish(tnt__comm_t *c, int which, uint64_t value) {
  atomic_store_explicit(counter(c, c->local_rank, which), value, memory_order_release);
}

/* Rank r's signature of round `seq`: two alternate, after counter 0. */
static tnt__coll_sig_t *sig_of(const tnt__comm_t *c, int r, uint64_t seq) {
  _Static_assert(16 + 2 * sizeof(tnt__coll_sig_t) <= 64, "signatures must fit the line");
  return (tnt__coll_sig_t *)(void *)(c->shm->base[r] + 16 + sizeof(tnt__coll_sig_t) * (seq & 1u));
}

void tnt__coll_sig_describe(const tnt__coll_sig_t *s, char *buf, size_t len) {
  const unsigned long long n = (unsigned long long)s->count;
  switch (s->kind) {
    case TNT__COLL_ALLREDUCE:
      snprintf(buf, len, "allreduce of %llu %s (%s)", n, tnt__dtype_name((tnt_dtype_t)s->dtype),
               tnt__op_name((tnt_op_t)s->op));
      break;
    case TNT__COLL_BROADCAST:
      snprintf(buf, len, "broadcast of %llu %s from rank %d", n,
               tnt__dtype_name((tnt_dtype_t)s->dtype), (int)s->root);
      break;
    case TNT__COLL_ALLGATHERV: snprintf(buf, len, "allgather of %llu bytes in all", n); break;
    case TNT__COLL_BARRIER: snprintf(buf, len, "barrier"); break;
    case TNT__COLL_REDUCE_SCATTER:
      /* root: 0 for the tnt__slice blocks, else a hash of the caller's. */
      snprintf(buf, len, "reduce-scatter of %llu %s (%s, %s blocks %08x)", n,
               tnt__dtype_name((tnt_dtype_t)s->dtype), tnt__op_name((tnt_op_t)s->op),
               s->root == 0 ? "even" : "given", (unsigned)s->root);
      break;
    default: snprintf(buf, len, "unknown collective %d", (int)s->kind); break;
  }
}

/* Compares node rank r's signature of round `seq` with this rank's. */
static tnt_status_t sig_check(const tnt__comm_t *c, int r, uint64_t seq, const tnt__wait_ctx_t *w) {
  const tnt__coll_sig_t *theirs = sig_of(c, r, seq);
  if (w->sig == NULL || !theirs->set || memcmp(theirs, w->sig, sizeof *theirs) == 0) return TNT_OK;
  char mine_s[96], theirs_s[96];
  tnt__coll_sig_describe(w->sig, mine_s, sizeof mine_s);
  tnt__coll_sig_describe(theirs, theirs_s, sizeof theirs_s);
  TNT_LOG_ERROR("%s: the ranks disagree on the collective: rank %d runs %s while rank %d runs %s; "
                "every rank must make the same collective calls in the same order",
                w->label, c->node->world_ranks[c->local_rank], mine_s, c->node->world_ranks[r],
                theirs_s);
  return TNT_ERR_MISMATCH;
}

tnt_status_t tnt__shm_wait_one(tnt__comm_t *c, int which, int r, uint64_t value,
                               const tnt__wait_ctx_t *w) {
  _Atomic uint64_t *ctr = counter(c, r, which);
  int warned = 0;
  for (unsigned it = 0; atomic_load_explicit(ctr, memory_order_acquire) < value; ++it) {
    /* The clock is read every 64 pauses: negligible while spinning, and
     * timely when each pause yields the core on a busy host. */
    if ((it & 63u) == 63u) {
      char what[48];
      snprintf(what, sizeof what, "rank %d (shared memory)", c->node->world_ranks[r]);
      TNT_CHECK(tnt__wait_check(w, &warned, what));
    }
    if (w->poll != NULL) TNT_CHECK(w->poll(w->poll_arg));
    tnt__spin_pause(it);
  }
  /* Rank r wrote its signature of this round before publishing counter 0,
   * and rewrites that half only in round value + 2, which needs this rank
   * to finish round value first. */
  if (which == 0 && value == c->shm_seq) return sig_check(c, r, value, w);
  return TNT_OK;
}

tnt_status_t tnt__shm_wait_all(tnt__comm_t *c, int which, uint64_t value,
                               const tnt__wait_ctx_t *w) {
  for (int r = 0; r < c->local_size; ++r) TNT_CHECK(tnt__shm_wait_one(c, which, r, value, w));
  return TNT_OK;
}

tnt_status_t tnt__shm_round_begin(tnt__comm_t *c, const tnt__wait_ctx_t *w, uint64_t *seq) {
  *seq = ++c->shm_seq;
  /* Slot (seq & 1) was last read in round seq - 2; every rank announces
   * the end of those reads when it publishes counter 0 of round seq - 1. */
  TNT_CHECK(tnt__shm_wait_all(c, 0, *seq - 1, w));
  tnt__coll_sig_t *mine = sig_of(c, c->local_rank, *seq);
  if (w->sig != NULL) {
    *mine = *w->sig;
  } else {
    memset(mine, 0, sizeof *mine);
  }
  return TNT_OK;
}

void tnt__slice(size_t n, size_t esz, int parts, int i, size_t *lo, size_t *hi) {
  /* Slices of 4- and 8-byte elements are whole cache lines, so two ranks
   * never write the same line; a fusion set's parts do not depend on its
   * wire dtype (tnt__slice_quantum). */
  size_t line = tnt__slice_quantum(esz);
  size_t per = (n + (size_t)parts - 1) / (size_t)parts;
  per = (per + line - 1) / line * line;
  size_t a = per * (size_t)i, b = a + per;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

void tnt__slice_bounds(size_t n, size_t esz, int parts, size_t *bounds) {
  size_t hi;
  for (int i = 0; i < parts; ++i) tnt__slice(n, esz, parts, i, &bounds[i], &hi);
  bounds[parts] = n;
}
