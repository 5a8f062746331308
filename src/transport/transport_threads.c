/*
 * The threads transport: ranks simulated as threads of one process, so that
 * collective algorithms, contexts and the fusion runtime can be tested
 * without MPI (see the end of transport.h).
 *
 * Ranks of one transport share a "sub-world" (thr_comm_t) that holds one
 * mailbox per rank. Matching follows MPI's rules for one communicator:
 *  - A send is eager: isend copies the message and completes at once. It
 *    is handed to the oldest matching receive posted at the destination,
 *    or queued there as unexpected when there is none.
 *  - A receive takes the oldest matching unexpected message, or waits in
 *    the posted queue. Either way, for one (channel, source, tag) at most
 *    one of the two queues is non-empty, so messages and receives pair up
 *    in FIFO order on both sides.
 *  - test copies a matched message into the receive buffer, on the
 *    receiver's own thread, outside the lock.
 * Each mailbox has its own mutex, held only while a queue is searched or
 * changed; nothing waits while holding it and no thread takes two, so there
 * is no lock order to get wrong.
 *
 * Collective set-up calls meet in registries of the parent sub-world:
 *  - split: the k-th call of each rank with a given rank list joins the
 *    k-th entry for that list, so repeated splits over the same ranks pair
 *    up in order. The first caller creates the child sub-world; nobody
 *    waits for the others, because messages to a rank that has not joined
 *    yet simply queue in its mailbox.
 *  - shm_alloc: the k-th call of each rank joins the k-th region; the first
 *    caller allocates and zeroes it, under the registry lock, so every
 *    later caller sees the zeroes.
 * Sub-worlds and shared regions are reference counted, and freed by the
 * last rank that lets go of them.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "transport/transport.h"

/* ---------------------------------------------------------------- types */

/* What messages and posted receives share: their link in a mailbox queue
 * and the (channel, source, tag) that pairs them up. It comes first in
 * both, so that one queue code serves the two. */
typedef struct thr_entry {
  struct thr_entry *next;
  int ch, src, tag;
} thr_entry_t;

/* A mailbox queue, oldest first, with the link that the next entry goes
 * into. */
typedef struct thr_queue {
  thr_entry_t *head;
  thr_entry_t **tail;
} thr_queue_t;

typedef struct thr_msg {
  thr_entry_t e; /* first */
  size_t bytes;
  unsigned char data[];
} thr_msg_t;

/* A posted receive. It belongs to the request (impl[0]) and sits in the
 * posted queue until a message is attached to it. */
typedef struct thr_recv {
  thr_entry_t e; /* first */
  void *buf;
  size_t bytes;
  thr_msg_t *msg; /* set under the mailbox lock when matched */
} thr_recv_t;

typedef struct thr_box {
  pthread_mutex_t lock;
  thr_queue_t msgs;  /* unexpected messages (thr_msg_t) */
  thr_queue_t recvs; /* posted receives (thr_recv_t) */
} thr_box_t;

typedef struct thr_split thr_split_t;
typedef struct thr_shm_entry thr_shm_entry_t;

/* What the ranks of one transport share. */
typedef struct thr_comm {
  pthread_mutex_t lock; /* refs and the two registries */
  int size;
  int refs;
  thr_box_t *boxes; /* [size] */
  thr_split_t *splits;
  thr_shm_entry_t *shms;
} thr_comm_t;

/* A split in progress: the ranks that have joined so far. */
struct thr_split {
  thr_split_t *next;
  int n;
  int *ranks;            /* [n] parent ranks */
  unsigned char *joined; /* [n] */
  int njoined;
  thr_comm_t *child;
};

/* Memory shared by the ranks of one shm_alloc call. */
typedef struct thr_region {
  unsigned char *mem;
  size_t bytes;  /* per rank, as asked */
  size_t stride; /* bytes rounded up to a cache line */
  int refs;      /* ranks that still hold it; protected by the comm lock */
} thr_region_t;

/* A shm_alloc in progress. */
struct thr_shm_entry {
  thr_shm_entry_t *next;
  uint64_t seq;
  int njoined;
  thr_region_t *region;
};

typedef struct thr_transport {
  tnt__transport_t base; /* first, so the two pointers convert */
  thr_comm_t *comm;
  uint64_t shm_seq; /* shm_alloc calls made by this rank */
} thr_transport_t;

struct tnt__threads_world {
  int size;
  int num_hosts;
  int *host_of; /* [size], numbered by first appearance */
  thr_comm_t *root;
};

static const tnt__transport_ops_t thr_ops;

/* ------------------------------------------------------------ sub-worlds */

static thr_comm_t *comm_new(int size, int refs) {
  thr_comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->boxes = calloc((size_t)size, sizeof *c->boxes);
  if (c->boxes == NULL) {
    free(c);
    return NULL;
  }
  c->size = size;
  c->refs = refs;
  pthread_mutex_init(&c->lock, NULL);
  for (int r = 0; r < size; r++) {
    pthread_mutex_init(&c->boxes[r].lock, NULL);
    c->boxes[r].msgs.tail = &c->boxes[r].msgs.head;
    c->boxes[r].recvs.tail = &c->boxes[r].recvs.head;
  }
  return c;
}

static void split_entry_free(thr_split_t *e) {
  free(e->ranks);
  free(e->joined);
  free(e);
}

/* Drops one reference; the last one frees everything still queued. */
static void comm_release(thr_comm_t *c) {
  pthread_mutex_lock(&c->lock);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (!last) return;
  for (int r = 0; r < c->size; r++) {
    thr_box_t *b = &c->boxes[r];
    /* Both kinds of entry were allocated whole, with the entry first. */
    thr_queue_t *queues[2] = {&b->msgs, &b->recvs};
    for (int q = 0; q < 2; q++) {
      while (queues[q]->head != NULL) {
        thr_entry_t *e = queues[q]->head;
        queues[q]->head = e->next;
        free(e);
      }
    }
    pthread_mutex_destroy(&b->lock);
  }
  /* Entries left here belong to set-up calls that some rank never made;
   * their children and regions may still be in use by the ranks that did,
   * so only the bookkeeping goes. */
  while (c->splits != NULL) {
    thr_split_t *e = c->splits;
    c->splits = e->next;
    split_entry_free(e);
  }
  while (c->shms != NULL) {
    thr_shm_entry_t *e = c->shms;
    c->shms = e->next;
    free(e);
  }
  pthread_mutex_destroy(&c->lock);
  free(c->boxes);
  free(c);
}

/* ------------------------------------------------------------- messages */

/* Takes the entry at link `pp` of `q` out of the queue and returns it. */
static thr_entry_t *queue_unlink(thr_queue_t *q, thr_entry_t **pp) {
  thr_entry_t *e = *pp;
  *pp = e->next;
  if (q->tail == &e->next) q->tail = pp;
  e->next = NULL;
  return e;
}

/*
 * Pairs `e` (a message or a receive, under its mailbox lock) with the
 * oldest entry of `other` (the opposite kind) that has the same channel,
 * source and tag: takes that entry out of `other` and returns it. With no
 * such entry, `e` waits at the end of `mine` and the result is NULL.
 */
static thr_entry_t *match_or_queue(thr_queue_t *other, thr_queue_t *mine, thr_entry_t *e) {
  for (thr_entry_t **pp = &other->head; *pp != NULL; pp = &(*pp)->next) {
    const thr_entry_t *o = *pp;
    if (o->ch == e->ch && o->src == e->src && o->tag == e->tag) return queue_unlink(other, pp);
  }
  e->next = NULL;
  *mine->tail = e;
  mine->tail = &e->next;
  return NULL;
}

static tnt_status_t check_transfer(const tnt__transport_t *t, tnt__channel_t ch, const void *buf,
                                   size_t bytes, int peer, const char *what) {
  if (peer < 0 || peer >= t->size || (ch != TNT__CH_COLL && ch != TNT__CH_P2P) ||
      (buf == NULL && bytes > 0)) {
    TNT_LOG_ERROR("threads transport: invalid %s (peer %d of %d, channel %d, %zu bytes)", what,
                  peer, t->size, (int)ch, bytes);
    return TNT_ERR_INVALID_ARG;
  }
  return TNT_OK;
}

static tnt_status_t thr_isend(tnt__transport_t *t, tnt__channel_t ch, const void *buf, size_t bytes,
                              int peer, int tag, tnt__xreq_t *req) {
  thr_transport_t *tt = (thr_transport_t *)t;
  TNT_CHECK(check_transfer(t, ch, buf, bytes, peer, "send"));
  /* The copy is made before taking the lock: the sender's buffer is free
   * again as soon as isend returns. */
  thr_msg_t *m = malloc(sizeof *m + bytes);
  if (m == NULL) return TNT_ERR_NO_MEMORY;
  m->e.next = NULL;
  m->e.ch = (int)ch;
  m->e.src = t->rank;
  m->e.tag = tag;
  m->bytes = bytes;
  if (bytes > 0) memcpy(m->data, buf, bytes);

  thr_box_t *box = &tt->comm->boxes[peer];
  pthread_mutex_lock(&box->lock);
  thr_recv_t *rv = (thr_recv_t *)match_or_queue(&box->recvs, &box->msgs, &m->e);
  if (rv != NULL) rv->msg = m;
  pthread_mutex_unlock(&box->lock);

  req->impl[0] = 0;
  req->peer = peer;
  req->is_recv = 0;
  req->active = 1;
  return TNT_OK;
}

static tnt_status_t thr_irecv(tnt__transport_t *t, tnt__channel_t ch, void *buf, size_t bytes,
                              int peer, int tag, tnt__xreq_t *req) {
  thr_transport_t *tt = (thr_transport_t *)t;
  TNT_CHECK(check_transfer(t, ch, buf, bytes, peer, "receive"));
  thr_recv_t *rv = calloc(1, sizeof *rv);
  if (rv == NULL) return TNT_ERR_NO_MEMORY;
  rv->e.ch = (int)ch;
  rv->e.src = peer;
  rv->e.tag = tag;
  rv->buf = buf;
  rv->bytes = bytes;

  thr_box_t *box = &tt->comm->boxes[t->rank];
  pthread_mutex_lock(&box->lock);
  rv->msg = (thr_msg_t *)match_or_queue(&box->msgs, &box->recvs, &rv->e);
  pthread_mutex_unlock(&box->lock);

  req->impl[0] = (uint64_t)(uintptr_t)rv;
  req->peer = peer;
  req->is_recv = 1;
  req->active = 1;
  return TNT_OK;
}

static tnt_status_t thr_test(tnt__transport_t *t, tnt__xreq_t *req, int *done) {
  thr_transport_t *tt = (thr_transport_t *)t;
  tnt_status_t st = TNT_OK;
  if (!req->active || !req->is_recv) {
    req->active = 0;
    *done = 1;
    return TNT_OK;
  }
  thr_recv_t *rv = (thr_recv_t *)(uintptr_t)req->impl[0];
  thr_box_t *box = &tt->comm->boxes[t->rank];
  pthread_mutex_lock(&box->lock);
  thr_msg_t *m = rv->msg;
  pthread_mutex_unlock(&box->lock);
  if (m == NULL) {
    *done = 0;
    return TNT_OK;
  }
  /* Matched: the record left the queues, so only this thread sees it. */
  if (m->bytes != rv->bytes) {
    TNT_LOG_ERROR("a message from rank %d has %zu bytes where %zu were expected: the ranks "
                  "disagree on the operation (a different collective, count or type)",
                  t->world_ranks[m->e.src], m->bytes, rv->bytes);
    st = TNT_ERR_MISMATCH;
  } else if (m->bytes > 0) {
    memcpy(rv->buf, m->data, m->bytes);
  }
  free(m);
  free(rv);
  req->impl[0] = 0;
  req->active = 0;
  *done = 1;
  return st;
}

static void thr_cancel(tnt__transport_t *t, tnt__xreq_t *req) {
  thr_transport_t *tt = (thr_transport_t *)t;
  if (!req->active) return;
  req->active = 0;
  /* A send was delivered when it was posted; there is nothing to undo. */
  if (!req->is_recv) return;
  thr_recv_t *rv = (thr_recv_t *)(uintptr_t)req->impl[0];
  thr_box_t *box = &tt->comm->boxes[t->rank];
  pthread_mutex_lock(&box->lock);
  if (rv->msg == NULL) {
    thr_entry_t **pp = &box->recvs.head;
    while (*pp != NULL && *pp != &rv->e) pp = &(*pp)->next;
    if (*pp == &rv->e) queue_unlink(&box->recvs, pp);
  }
  pthread_mutex_unlock(&box->lock);
  free(rv->msg);
  free(rv);
  req->impl[0] = 0;
}

/* ------------------------------------------------------------------ split */

static tnt_status_t transport_new(thr_comm_t *comm, thr_transport_t **out) {
  thr_transport_t *tt = calloc(1, sizeof *tt);
  if (tt == NULL) return TNT_ERR_NO_MEMORY;
  tt->base.ops = &thr_ops;
  tt->comm = comm;
  *out = tt;
  return TNT_OK;
}

static tnt_status_t check_split_list(const tnt__transport_t *t, const int *ranks, int n,
                                     int *my_index) {
  *my_index = -1;
  if (ranks == NULL || n < 1 || n > t->size) return TNT_ERR_INVALID_ARG;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= t->size) return TNT_ERR_INVALID_ARG;
    for (int j = 0; j < i; j++) {
      if (ranks[j] == ranks[i]) return TNT_ERR_INVALID_ARG;
    }
    if (ranks[i] == t->rank) *my_index = i;
  }
  return *my_index < 0 ? TNT_ERR_INVALID_ARG : TNT_OK;
}

/* Joins the oldest split entry for this rank list that this rank has not
 * joined yet, creating it when there is none; returns its child with one
 * reference for the caller. Called with the parent's lock held. */
static tnt_status_t split_join(thr_comm_t *parent, const int *ranks, int n, int my_index,
                               thr_comm_t **child) {
  thr_split_t **pp = &parent->splits;
  for (; *pp != NULL; pp = &(*pp)->next) {
    thr_split_t *e = *pp;
    if (e->n == n && !e->joined[my_index] &&
        memcmp(e->ranks, ranks, (size_t)n * sizeof(int)) == 0) {
      break;
    }
  }
  if (*pp == NULL) {
    thr_split_t *e = calloc(1, sizeof *e);
    if (e == NULL) return TNT_ERR_NO_MEMORY;
    e->n = n;
    e->ranks = malloc((size_t)n * sizeof(int));
    e->joined = calloc((size_t)n, 1);
    /* Every listed rank will take one reference when it joins. */
    e->child = comm_new(n, n);
    if (e->ranks == NULL || e->joined == NULL || e->child == NULL) {
      if (e->child != NULL) {
        e->child->refs = 1;
        comm_release(e->child);
      }
      split_entry_free(e);
      return TNT_ERR_NO_MEMORY;
    }
    memcpy(e->ranks, ranks, (size_t)n * sizeof(int));
    *pp = e;
  }
  thr_split_t *e = *pp;
  e->joined[my_index] = 1;
  *child = e->child;
  if (++e->njoined == n) {
    *pp = e->next;
    split_entry_free(e);
  }
  return TNT_OK;
}

static tnt_status_t thr_split(tnt__transport_t *t, const int *ranks, int n,
                              tnt__transport_t **out) {
  thr_transport_t *tt = (thr_transport_t *)t;
  thr_transport_t *sub = NULL;
  thr_comm_t *child = NULL;
  tnt_status_t st = TNT_OK;
  int my_index;
  if (check_split_list(t, ranks, n, &my_index) < 0) {
    TNT_LOG_ERROR("threads transport: split with an invalid rank list (n = %d, rank %d)", n,
                  t->rank);
    return TNT_ERR_INVALID_ARG;
  }
  pthread_mutex_lock(&tt->comm->lock);
  st = split_join(tt->comm, ranks, n, my_index, &child);
  pthread_mutex_unlock(&tt->comm->lock);
  if (st < 0) return st;
  TNT_CHECK_GOTO(transport_new(child, &sub), st, fail);
  child = NULL; /* owned by sub from here on */
  TNT_CHECK_GOTO(tnt__transport_init_subset(&sub->base, t, ranks, n), st, fail);
  *out = &sub->base;
  return TNT_OK;
fail:
  if (sub != NULL) {
    comm_release(sub->comm);
    free(sub);
  }
  if (child != NULL) comm_release(child);
  return st;
}

/* ---------------------------------------------------------- shared memory */

static void region_release(thr_comm_t *c, thr_region_t *region) {
  pthread_mutex_lock(&c->lock);
  int last = --region->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (last) {
    free(region->mem);
    free(region);
  }
}

/* Joins the region of shm_alloc call number `seq`, creating and zeroing it
 * when this rank is the first. Called with the comm's lock held. */
static tnt_status_t shm_join(thr_comm_t *c, uint64_t seq, size_t bytes, thr_region_t **out) {
  thr_shm_entry_t **pp = &c->shms;
  while (*pp != NULL && (*pp)->seq != seq) pp = &(*pp)->next;
  if (*pp == NULL) {
    size_t stride = (TNT__MAX(bytes, (size_t)1) + 63u) & ~(size_t)63u;
    if (stride < bytes || stride > SIZE_MAX / (size_t)c->size) return TNT_ERR_NO_MEMORY;
    thr_shm_entry_t *e = calloc(1, sizeof *e);
    thr_region_t *region = calloc(1, sizeof *region);
    unsigned char *mem = aligned_alloc(64, stride * (size_t)c->size);
    if (e == NULL || region == NULL || mem == NULL) {
      free(e);
      free(region);
      free(mem);
      return TNT_ERR_NO_MEMORY;
    }
    memset(mem, 0, stride * (size_t)c->size);
    region->mem = mem;
    region->bytes = bytes;
    region->stride = stride;
    region->refs = c->size;
    e->seq = seq;
    e->region = region;
    *pp = e;
  }
  thr_shm_entry_t *e = *pp;
  thr_region_t *region = e->region;
  if (++e->njoined == c->size) {
    *pp = e->next;
    free(e);
  }
  if (region->bytes != bytes) {
    /* This rank gives its reference back at once: it will not use it. */
    TNT_LOG_ERROR("threads transport: shm_alloc of %zu bytes meets one of %zu bytes", bytes,
                  region->bytes);
    if (--region->refs == 0) {
      free(region->mem);
      free(region);
    }
    return TNT_ERR_INVALID_ARG;
  }
  *out = region;
  return TNT_OK;
}

static tnt_status_t thr_shm_alloc(tnt__transport_t *t, size_t bytes, tnt__shm_t **out) {
  thr_transport_t *tt = (thr_transport_t *)t;
  tnt_status_t st = TNT_OK;
  thr_region_t *region = NULL;
  /* Every rank sees the same host layout, so all of them answer alike. */
  if (t->num_hosts != 1) return TNT_ERR_UNSUPPORTED;
  tnt__shm_t *shm = calloc(1, sizeof *shm);
  uint8_t **base = calloc((size_t)t->size, sizeof *base);
  if (shm == NULL || base == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  uint64_t seq = tt->shm_seq++;
  pthread_mutex_lock(&tt->comm->lock);
  st = shm_join(tt->comm, seq, bytes, &region);
  pthread_mutex_unlock(&tt->comm->lock);
  if (st < 0) goto fail;
  for (int r = 0; r < t->size; r++) base[r] = region->mem + (size_t)r * region->stride;
  shm->nranks = t->size;
  shm->bytes = bytes;
  shm->base = base;
  shm->impl = region;
  *out = shm;
  return TNT_OK;
fail:
  free(shm);
  free(base);
  return st;
}

static void thr_shm_free(tnt__transport_t *t, tnt__shm_t *shm) {
  thr_transport_t *tt = (thr_transport_t *)t;
  if (shm == NULL) return;
  region_release(tt->comm, shm->impl);
  free(shm->base);
  free(shm);
}

/* ---------------------------------------------------------------- destroy */

static void thr_destroy(tnt__transport_t *t) {
  thr_transport_t *tt = (thr_transport_t *)t;
  if (tt == NULL) return;
  comm_release(tt->comm);
  tnt__transport_fini_subset(t);
  free(tt);
}

static const tnt__transport_ops_t thr_ops = {
    .name = "threads",
    .isend = thr_isend,
    .irecv = thr_irecv,
    .test = thr_test,
    .cancel = thr_cancel,
    .split = thr_split,
    .shm_alloc = thr_shm_alloc,
    .shm_free = thr_shm_free,
    .native_allreduce = NULL,
    .destroy = thr_destroy,
};

/* ------------------------------------------------------------------ world */

tnt_status_t tnt__threads_world_create(int size, const int *hosts, tnt__threads_world_t **out) {
  tnt_status_t st = TNT_OK;
  if (size < 1 || out == NULL) return TNT_ERR_INVALID_ARG;
  tnt__threads_world_t *w = calloc(1, sizeof *w);
  if (w == NULL) return TNT_ERR_NO_MEMORY;
  w->size = size;
  w->host_of = malloc((size_t)size * sizeof(int));
  w->root = comm_new(size, 1); /* the world's own reference */
  if (w->host_of == NULL || w->root == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  /* Hosts are numbered in order of first appearance by rank, as the MPI
   * transport numbers them by their lowest rank. */
  for (int r = 0; r < size; r++) {
    int h = 0;
    if (hosts != NULL) {
      int earlier = 0;
      while (earlier < r && hosts[earlier] != hosts[r]) earlier++;
      h = earlier < r ? w->host_of[earlier] : w->num_hosts;
    }
    if (h == w->num_hosts) w->num_hosts++;
    w->host_of[r] = h;
  }
  *out = w;
  return TNT_OK;
fail:
  tnt__threads_world_destroy(w);
  return st;
}

void tnt__threads_world_destroy(tnt__threads_world_t *world) {
  if (world == NULL) return;
  /* Transports still open keep the root sub-world alive on their own. */
  if (world->root != NULL) comm_release(world->root);
  free(world->host_of);
  free(world);
}

tnt_status_t tnt__threads_transport_create(tnt__threads_world_t *world, int rank,
                                           tnt__transport_t **out) {
  thr_transport_t *tt = NULL;
  tnt_status_t st = TNT_OK;
  if (world == NULL || out == NULL || rank < 0 || rank >= world->size) {
    return TNT_ERR_INVALID_ARG;
  }
  TNT_CHECK(transport_new(world->root, &tt));
  tt->base.rank = rank;
  tt->base.size = world->size;
  tt->base.num_hosts = world->num_hosts;
  tt->base.world_ranks = malloc((size_t)world->size * sizeof(int));
  tt->base.host_of = malloc((size_t)world->size * sizeof(int));
  if (tt->base.world_ranks == NULL || tt->base.host_of == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  for (int r = 0; r < world->size; r++) tt->base.world_ranks[r] = r;
  memcpy(tt->base.host_of, world->host_of, (size_t)world->size * sizeof(int));
  pthread_mutex_lock(&world->root->lock);
  world->root->refs++;
  pthread_mutex_unlock(&world->root->lock);
  *out = &tt->base;
  return TNT_OK;
fail:
  tnt__transport_fini_subset(&tt->base);
  free(tt);
  return st;
}
