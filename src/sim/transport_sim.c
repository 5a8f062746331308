/*
 * The transport of src/transport/transport.h on SimGrid mailboxes: every
 * rank is a simulated actor, and a message crosses the simulated platform
 * (links, latencies, contention) between the hosts of its two ranks.
 *
 * Matching follows MPI's rules for one communicator: each transport has a
 * name ("w" for the world, "w.0", "w.1", ... for the k-th split of it, the
 * same on every member because members split in the same order), and each
 * (transport, channel, source, destination) has its own mailbox, where
 * SimGrid pairs sends and receives in the order they were posted.
 *
 * A SimGrid message carries a pointer, not bytes. A send therefore carries a
 * message (sim_msg_t) it owns (the bytes, copied at isend when the world moves data;
 * only the size otherwise) and its simulated size; the receiver copies the
 * bytes into place when test reports completion and frees the message.
 *
 * Shared memory: the k-th shm_alloc of each member of a transport joins
 * the k-th region of that transport (its name and first member), created and zeroed by the first
 * caller. Regions live until the end of the simulation.
 *
 * Cancel drops a pending transfer from the actor's list without telling
 * SimGrid (its C interface cannot cancel): after a failure the simulation
 * ends anyway.
 */
#include <simgrid/actor.h>
#include <simgrid/comm.h>
#include <simgrid/mailbox.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "util/log.h"

typedef struct sim_msg {
  size_t bytes;
  unsigned char data[];
} sim_msg_t;

typedef struct sim_transport {
  tnt__transport_t base;
  char name[64];
  unsigned splits, shms; /* split and shm_alloc calls made so far */
} sim_transport_t;

typedef struct sim_region {
  struct sim_region *next;
  char key[80];
  int nranks;
  size_t bytes;
  uint8_t **base;
} sim_region_t;

static struct {
  int size, num_hosts;
  int *host_of;
  int *host_start, *host_ranks; /* host h's ranks: host_ranks[host_start[h] .. host_start[h+1]) */
  tnt_sim_actor_t *actors;      /* [size] */
  int *rank_of_pid;             /* [pids]: world rank of each bound actor */
  int pids;
  sim_region_t *regions;
} world;

static const tnt__transport_ops_t sim_ops;

tnt_sim_actor_t *tnt_sim_actor(int rank) { return &world.actors[rank]; }

const int *tnt_sim_host_ranks(int host, int *n) {
  *n = world.host_start[host + 1] - world.host_start[host];
  return world.host_ranks + world.host_start[host];
}

tnt_status_t tnt_sim_bind(int rank) {
  int pid = (int)sg_actor_self_get_pid();
  if (pid >= world.pids) {
    int pids = pid + 1024;
    int *p = realloc(world.rank_of_pid, (size_t)pids * sizeof *p);
    if (p == NULL) return TNT_ERR_NO_MEMORY;
    for (int i = world.pids; i < pids; i++) p[i] = -1;
    world.rank_of_pid = p;
    world.pids = pids;
  }
  world.rank_of_pid[pid] = rank;
  return TNT_OK;
}

tnt_sim_actor_t *tnt_sim_self(void) {
  return &world.actors[world.rank_of_pid[sg_actor_self_get_pid()]];
}

tnt_status_t tnt_sim_world_init(int size, const int *host_of, int num_hosts) {
  if (world.actors != NULL) return TNT_OK;
  world.host_of = malloc((size_t)size * sizeof(int));
  world.actors = calloc((size_t)size, sizeof *world.actors);
  if (world.host_of == NULL || world.actors == NULL) return TNT_ERR_NO_MEMORY;
  __real_memcpy(world.host_of, host_of, (size_t)size * sizeof(int));
  world.size = size;
  world.num_hosts = num_hosts;
  world.host_start = calloc((size_t)num_hosts + 1, sizeof(int));
  world.host_ranks = malloc((size_t)size * sizeof(int));
  if (world.host_start == NULL || world.host_ranks == NULL) return TNT_ERR_NO_MEMORY;
  for (int r = 0; r < size; r++) {
    world.actors[r].rank = r;
    world.actors[r].host = host_of[r];
    world.host_start[host_of[r] + 1]++;
  }
  for (int h = 0; h < num_hosts; h++) world.host_start[h + 1] += world.host_start[h];
  int *fill = calloc((size_t)num_hosts, sizeof(int));
  if (fill == NULL) return TNT_ERR_NO_MEMORY;
  for (int r = 0; r < size; r++) {
    world.host_ranks[world.host_start[host_of[r]] + fill[host_of[r]]++] = r;
  }
  free(fill);
  return TNT_OK;
}

static sim_req_t *req_of(tnt__xreq_t *r) { return (sim_req_t *)(uintptr_t)r->impl[0]; }

static sg_mailbox_t box(const sim_transport_t *st, tnt__channel_t ch, int src, int dst) {
  char name[112];
  snprintf(name, sizeof name, "%.64s:%d:%d>%d", st->name, (int)ch, st->base.world_ranks[src],
           st->base.world_ranks[dst]);
  return sg_mailbox_by_name(name);
}

static tnt_status_t pending_add(tnt_sim_actor_t *a, sim_req_t *q) {
  if (a->npending == a->cap) {
    int cap = a->cap ? 2 * a->cap : 64;
    sim_req_t **p = realloc(a->pending, (size_t)cap * sizeof *p);
    if (p == NULL) return TNT_ERR_NO_MEMORY;
    a->pending = p;
    sg_comm_t *c = realloc(a->scratch, ((size_t)cap + 1) * sizeof *c);
    if (c == NULL) return TNT_ERR_NO_MEMORY;
    a->scratch = c;
    int *ix = realloc(a->scratch_idx, ((size_t)cap + 1) * sizeof *ix);
    if (ix == NULL) return TNT_ERR_NO_MEMORY;
    a->scratch_idx = ix;
    a->cap = cap;
  }
  a->pending[a->npending++] = q;
  return TNT_OK;
}

void tnt_sim_pending_remove(tnt_sim_actor_t *a, sim_req_t *q) {
  for (int i = 0; i < a->npending; i++) {
    if (a->pending[i] == q) {
      a->pending[i] = a->pending[--a->npending];
      return;
    }
  }
}

static tnt_status_t post(tnt__transport_t *t, sim_req_t *q, tnt__xreq_t *req, int peer,
                         size_t bytes, int is_recv) {
  tnt_status_t st = pending_add(tnt_sim_self(), q);
  if (st < 0) {
    free(q);
    return st;
  }
  (void)t;
  req->impl[0] = (uint64_t)(uintptr_t)q;
  req->peer = peer;
  req->bytes = bytes;
  req->is_recv = is_recv;
  req->active = 1;
  return TNT_OK;
}

static tnt_status_t sim_isend(tnt__transport_t *t, tnt__channel_t ch, const void *buf, size_t bytes,
                              int peer, int tag, tnt__xreq_t *req) {
  (void)tag; /* one tag per channel: matching is by order, as with MPI */
  sim_transport_t *s = (sim_transport_t *)t;
  sim_req_t *q = calloc(1, sizeof *q);
  sim_msg_t *m = malloc(sizeof *m + (tnt_sim_opts.data ? bytes : 0));
  if (q == NULL || m == NULL) {
    free(q);
    free(m);
    return TNT_ERR_NO_MEMORY;
  }
  m->bytes = bytes;
  if (tnt_sim_opts.data && bytes > 0) __real_memcpy(m->data, buf, bytes);
  /* What travels is the 8 bytes at &q->payload (SMPI makes SimGrid copy
   * buffers, not pointers): the receiver's payload becomes m. */
  q->payload = m;
  q->comm = sg_mailbox_put_async(box(s, ch, t->rank, peer), &q->payload, (long)bytes);
  return post(t, q, req, peer, bytes, 0);
}

static tnt_status_t sim_irecv(tnt__transport_t *t, tnt__channel_t ch, void *buf, size_t bytes,
                              int peer, int tag, tnt__xreq_t *req) {
  (void)tag;
  sim_transport_t *s = (sim_transport_t *)t;
  sim_req_t *q = calloc(1, sizeof *q);
  if (q == NULL) return TNT_ERR_NO_MEMORY;
  q->buf = buf;
  q->comm = sg_mailbox_get_async(box(s, ch, peer, t->rank), &q->payload);
  return post(t, q, req, peer, bytes, 1);
}

static tnt_status_t sim_test(tnt__transport_t *t, tnt__xreq_t *req, int *done) {
  sim_req_t *q = req_of(req);
  if (!req->active) {
    *done = 1;
    return TNT_OK;
  }
  if (!q->completed && !sg_comm_test(q->comm)) {
    *done = 0;
    return TNT_OK;
  }
  *done = 1;
  req->active = 0;
  tnt_sim_pending_remove(tnt_sim_self(), q);
  tnt_status_t st = TNT_OK;
  if (req->is_recv) {
    sim_msg_t *m = q->payload;
    if (m->bytes != req->bytes) {
      TNT_LOG_ERROR("a message from rank %d has %zu bytes where %zu were expected: the ranks "
                    "disagree on the operation", t->world_ranks[req->peer], m->bytes, req->bytes);
      st = TNT_ERR_MISMATCH;
    } else if (tnt_sim_opts.data && m->bytes > 0) {
      __real_memcpy(q->buf, m->data, m->bytes);
    }
    free(m);
  }
  free(q);
  return st;
}

static void sim_cancel(tnt__transport_t *t, tnt__xreq_t *req) {
  (void)t;
  if (!req->active) return;
  tnt_sim_pending_remove(tnt_sim_self(), req_of(req));
  req->active = 0;
}

static sim_transport_t *transport_new(const char *name) {
  sim_transport_t *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->base.ops = &sim_ops;
  snprintf(s->name, sizeof s->name, "%.63s", name);
  return s;
}

static tnt_status_t sim_split(tnt__transport_t *t, const int *ranks, int n,
                              tnt__transport_t **out) {
  sim_transport_t *p = (sim_transport_t *)t;
  char name[80];
  snprintf(name, sizeof name, "%.60s.%u", p->name, p->splits++);
  sim_transport_t *s = transport_new(name);
  if (s == NULL) return TNT_ERR_NO_MEMORY;
  tnt_status_t st = tnt__transport_init_subset(&s->base, t, ranks, n);
  if (st < 0) {
    free(s);
    return st;
  }
  *out = &s->base;
  return TNT_OK;
}

static tnt_status_t sim_shm_alloc(tnt__transport_t *t, size_t bytes, tnt__shm_t **out) {
  sim_transport_t *s = (sim_transport_t *)t;
  if (t->num_hosts != 1) return TNT_ERR_UNSUPPORTED;
  char key[80];
  /* Splits with the same name (the node transports of different hosts)
   * have disjoint members: the first one tells them apart. */
  snprintf(key, sizeof key, "%.60s@%d#%u", s->name, t->world_ranks[0], s->shms++);
  sim_region_t *g = world.regions;
  while (g != NULL && strcmp(g->key, key) != 0) g = g->next;
  if (g == NULL) {
    g = calloc(1, sizeof *g);
    if (g == NULL) return TNT_ERR_NO_MEMORY;
    snprintf(g->key, sizeof g->key, "%.79s", key);
    g->nranks = t->size;
    g->bytes = bytes;
    g->base = calloc((size_t)t->size, sizeof *g->base);
    /* calloc of a large block maps fresh zero pages: a timing-only run
     * never touches the data slots, and costs no memory for them. */
    for (int r = 0; g->base != NULL && r < t->size; r++) {
      g->base[r] = calloc(1, bytes);
      if (g->base[r] == NULL) return TNT_ERR_NO_MEMORY;
    }
    if (g->base == NULL) return TNT_ERR_NO_MEMORY;
    g->next = world.regions;
    world.regions = g;
  }
  if (g->bytes != bytes || g->nranks != t->size) {
    TNT_LOG_ERROR("simulated shm_alloc of %zu bytes meets one of %zu bytes", bytes, g->bytes);
    return TNT_ERR_MISMATCH;
  }
  tnt__shm_t *shm = calloc(1, sizeof *shm);
  if (shm == NULL) return TNT_ERR_NO_MEMORY;
  shm->nranks = g->nranks;
  shm->bytes = g->bytes;
  shm->base = g->base;
  shm->impl = g;
  *out = shm;
  return TNT_OK;
}

static void sim_shm_free(tnt__transport_t *t, tnt__shm_t *shm) {
  (void)t;
  free(shm); /* the region stays: other members may still read it */
}

static void sim_destroy(tnt__transport_t *t) {
  if (t == NULL) return;
  tnt__transport_fini_subset(t);
  free(t);
}

static const tnt__transport_ops_t sim_ops = {
    .name = "simgrid",
    .isend = sim_isend,
    .irecv = sim_irecv,
    .test = sim_test,
    .cancel = sim_cancel,
    .split = sim_split,
    .shm_alloc = sim_shm_alloc,
    .shm_free = sim_shm_free,
    .native_allreduce = NULL,
    .destroy = sim_destroy,
};

tnt_status_t tnt_sim_transport_create(int rank, tnt__transport_t **out) {
  sim_transport_t *s = transport_new("w");
  if (s == NULL) return TNT_ERR_NO_MEMORY;
  s->base.rank = rank;
  s->base.size = world.size;
  s->base.num_hosts = world.num_hosts;
  s->base.world_ranks = malloc((size_t)world.size * sizeof(int));
  s->base.host_of = malloc((size_t)world.size * sizeof(int));
  if (s->base.world_ranks == NULL || s->base.host_of == NULL) {
    sim_destroy(&s->base);
    return TNT_ERR_NO_MEMORY;
  }
  for (int r = 0; r < world.size; r++) s->base.world_ranks[r] = r;
  __real_memcpy(s->base.host_of, world.host_of, (size_t)world.size * sizeof(int));
  *out = &s->base;
  return TNT_OK;
}
