/*
 * The MPI transport. Each transport owns two communicators with the same
 * members: one for collective traffic and one for user point-to-point
 * messages, so a user's tag can never match a collective's message. Errors
 * are returned (MPI_ERRORS_RETURN), never fatal, and become TNT_ERR_MPI
 * with the MPI error string in the log.
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"
#include "util/settings.h"
#include "util/reduce.h"
#include "transport/transport.h"

typedef struct mpi_transport {
  tnt__transport_t base;
  MPI_Comm comm[2]; /* indexed by tnt__channel_t */
} mpi_transport_t;

typedef struct mpi_shm {
  MPI_Win win;
} mpi_shm_t;

static const tnt__transport_ops_t mpi_ops;

static tnt_status_t mpi_fail(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  TNT_LOG_ERROR("%s failed: %s", what, msg);
  return TNT_ERR_MPI;
}

#define MPI_TRY(call)                                   \
  do {                                                  \
    int mpi_rc_ = (call);                               \
    if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, #call); \
  } while (0)

static MPI_Request *req_of(tnt__xreq_t *r) {
  _Static_assert(sizeof(MPI_Request) <= sizeof(r->impl), "MPI_Request does not fit");
  return (MPI_Request *)(void *)r->impl;
}

static tnt_status_t check_bytes(size_t bytes) {
  if (bytes > (size_t)INT_MAX) {
    TNT_LOG_ERROR("a single message of %zu bytes exceeds the MPI limit of %d bytes", bytes,
                  INT_MAX);
    return TNT_ERR_UNSUPPORTED;
  }
  return TNT_OK;
}

static tnt_status_t mpi_isend(tnt__transport_t *t, tnt__channel_t ch, const void *buf,
                              size_t bytes, int peer, int tag, tnt__xreq_t *req) {
  mpi_transport_t *m = (mpi_transport_t *)t;
  TNT_CHECK(check_bytes(bytes));
  MPI_TRY(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm[ch], req_of(req)));
  req->bytes = bytes;
  req->peer = peer;
  req->is_recv = 0;
  req->active = 1;
  return TNT_OK;
}

static tnt_status_t mpi_irecv(tnt__transport_t *t, tnt__channel_t ch, void *buf, size_t bytes,
                              int peer, int tag, tnt__xreq_t *req) {
  mpi_transport_t *m = (mpi_transport_t *)t;
  TNT_CHECK(check_bytes(bytes));
  MPI_TRY(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm[ch], req_of(req)));
  req->bytes = bytes;
  req->peer = peer;
  req->is_recv = 1;
  req->active = 1;
  return TNT_OK;
}

static tnt_status_t size_mismatch(tnt__transport_t *t, const tnt__xreq_t *req, const char *got) {
  TNT_LOG_ERROR("a message from rank %d has %s where %zu were expected: the ranks disagree on "
                "the operation (a different collective, count or type)",
                t->world_ranks[req->peer], got, req->bytes);
  return TNT_ERR_MISMATCH;
}

static tnt_status_t mpi_test(tnt__transport_t *t, tnt__xreq_t *req, int *done) {
  MPI_Status status;
  int rc = MPI_Test(req_of(req), done, &status);
  if (rc != MPI_SUCCESS) {
    int cls = 0;
    MPI_Error_class(rc, &cls);
    req->active = 0;
    if (cls == MPI_ERR_TRUNCATE) return size_mismatch(t, req, "more bytes");
    return mpi_fail(rc, "MPI_Test");
  }
  if (!*done) return TNT_OK;
  req->active = 0;
  if (req->is_recv) {
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if ((size_t)got != req->bytes) {
      char what[40];
      snprintf(what, sizeof what, "%d bytes", got);
      return size_mismatch(t, req, what);
    }
  }
  return TNT_OK;
}

static void mpi_cancel(tnt__transport_t *t, tnt__xreq_t *req) {
  (void)t;
  if (!req->active) return;
  /* Receives can be cancelled; a send is released and completes (or not)
   * on its own. Either way the request no longer needs us. */
  if (req->is_recv) MPI_Cancel(req_of(req));
  MPI_Request_free(req_of(req));
  req->active = 0;
}

static tnt_status_t mpi_wrap(MPI_Comm coll, tnt__transport_t **out);

static tnt_status_t mpi_split(tnt__transport_t *t, const int *ranks, int n,
                              tnt__transport_t **out) {
  mpi_transport_t *m = (mpi_transport_t *)t;
  MPI_Group parent, child;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_TRY(MPI_Comm_group(m->comm[TNT__CH_COLL], &parent));
  int rc = MPI_Group_incl(parent, n, ranks, &child);
  MPI_Group_free(&parent);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Group_incl");
  rc = MPI_Comm_create_group(m->comm[TNT__CH_COLL], child, 0, &comm);
  MPI_Group_free(&child);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_create_group");
  tnt__transport_t *sub = NULL;
  tnt_status_t st = mpi_wrap(comm, &sub);
  if (st < 0) return st;
  st = tnt__transport_init_subset(sub, t, ranks, n);
  if (st < 0) {
    sub->ops->destroy(sub);
    return st;
  }
  *out = sub;
  return TNT_OK;
}

static tnt_status_t mpi_shm_alloc(tnt__transport_t *t, size_t bytes, tnt__shm_t **out) {
  mpi_transport_t *m = (mpi_transport_t *)t;
  if (t->num_hosts != 1) return TNT_ERR_UNSUPPORTED;
  tnt__shm_t *shm = calloc(1, sizeof *shm);
  mpi_shm_t *ms = calloc(1, sizeof *ms);
  uint8_t **base = calloc((size_t)t->size, sizeof *base);
  tnt_status_t st = TNT_OK;
  MPI_Info info = MPI_INFO_NULL;
  if (shm == NULL || ms == NULL || base == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto fail;
  }
  /* Non-contiguous allocation lets each rank's region start on its own
   * pages, placed in memory near the rank that writes it. */
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void *mine = NULL;
  int rc = MPI_Win_allocate_shared((MPI_Aint)bytes + 64, 1, info, m->comm[TNT__CH_COLL], &mine, &ms->win);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    st = mpi_fail(rc, "MPI_Win_allocate_shared");
    goto fail;
  }
  for (int r = 0; r < t->size; ++r) {
    MPI_Aint sz;
    int disp;
    void *p = NULL;
    rc = MPI_Win_shared_query(ms->win, r, &sz, &disp, &p);
    if (rc != MPI_SUCCESS) {
      st = mpi_fail(rc, "MPI_Win_shared_query");
      MPI_Win_free(&ms->win);
      goto fail;
    }
    /* Windows start on a page in every process, so rounding each region
     * up to a cache line lands on the same bytes everywhere. */
    base[r] = (uint8_t *)(((uintptr_t)p + 63u) & ~(uintptr_t)63u);
  }
  memset(base[t->rank], 0, bytes);
  (void)mine;
  /* Direct loads and stores into the window happen inside one passive
   * epoch that lasts as long as the window. */
  MPI_Win_lock_all(MPI_MODE_NOCHECK, ms->win);
  MPI_Win_sync(ms->win);
  MPI_Barrier(m->comm[TNT__CH_COLL]);
  MPI_Win_sync(ms->win);
  shm->nranks = t->size;
  shm->bytes = bytes;
  shm->base = base;
  shm->impl = ms;
  *out = shm;
  return TNT_OK;
fail:
  free(shm);
  free(ms);
  free(base);
  return st;
}

static void mpi_shm_free(tnt__transport_t *t, tnt__shm_t *shm) {
  if (shm == NULL) return;
  mpi_shm_t *ms = shm->impl;
  if (!t->abandoned) {
    MPI_Win_unlock_all(ms->win);
    MPI_Win_free(&ms->win);
  }
  free(ms);
  free(shm->base);
  free(shm);
}

/* MPI has no half-precision types: reduce them with user operations over
 * 16-bit integers, computed by libtnt's own kernels. */
#define HALF_OP(name, dtype, op)                                                 \
  static void name(void *in, void *inout, int *len, MPI_Datatype *type) {        \
    (void)type;                                                                  \
    tnt__reduce(inout, in, (size_t)*len, dtype, op);                             \
  }
HALF_OP(f16_sum, TNT_FLOAT16, TNT_SUM)
HALF_OP(f16_min, TNT_FLOAT16, TNT_MIN)
HALF_OP(f16_max, TNT_FLOAT16, TNT_MAX)
HALF_OP(bf16_sum, TNT_BFLOAT16, TNT_SUM)
HALF_OP(bf16_min, TNT_BFLOAT16, TNT_MIN)
HALF_OP(bf16_max, TNT_BFLOAT16, TNT_MAX)

static tnt_status_t mpi_native_allreduce(tnt__transport_t *t, const void *sendbuf, void *recvbuf,
                                         size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                         const tnt__wait_ctx_t *w) {
  mpi_transport_t *m = (mpi_transport_t *)t;
  if (count > (size_t)INT_MAX) return check_bytes(count * tnt__dtype_size(dtype));
  static MPI_User_function *const half_fns[2][3] = {{f16_sum, f16_min, f16_max},
                                                    {bf16_sum, bf16_min, bf16_max}};
  static const MPI_Op std_ops[3] = {MPI_SUM, MPI_MIN, MPI_MAX};
  int opi = op == TNT_MIN ? 1 : op == TNT_MAX ? 2 : 0; /* AVERAGE sums */
  MPI_Datatype type;
  MPI_Op mop = std_ops[opi];
  int user_op = 0;
  switch (dtype) {
    case TNT_FLOAT32: type = MPI_FLOAT; break;
    case TNT_FLOAT64: type = MPI_DOUBLE; break;
    case TNT_INT32: type = MPI_INT32_T; break;
    case TNT_INT64: type = MPI_INT64_T; break;
    case TNT_INT8: type = MPI_INT8_T; break;
    case TNT_INT16: type = MPI_INT16_T; break;
    case TNT_UINT8: type = MPI_UINT8_T; break;
    default:
      type = MPI_UINT16_T;
      MPI_TRY(MPI_Op_create(half_fns[dtype == TNT_BFLOAT16][opi], 1, &mop));
      user_op = 1;
  }
  const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
  MPI_Request req;
  tnt_status_t st = TNT_OK;
  int rc = MPI_Iallreduce(src, recvbuf, (int)count, type, mop, m->comm[TNT__CH_COLL], &req);
  if (rc != MPI_SUCCESS) {
    st = mpi_fail(rc, "MPI_Iallreduce");
    goto out;
  }
  int warned = 0;
  for (unsigned it = 0;; ++it) {
    int done = 0;
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      st = mpi_fail(rc, "MPI_Test");
      break;
    }
    if (done) break;
    if ((it & 255u) == 255u &&
        (st = tnt__wait_check(w, &warned, "a peer in MPI_Allreduce (MPI does not say which)")) < 0)
      break;
    tnt__spin_pause(it);
  }
out:
  if (user_op) MPI_Op_free(&mop);
  return st;
}

static void mpi_destroy(tnt__transport_t *t) {
  mpi_transport_t *m = (mpi_transport_t *)t;
  if (m == NULL) return;
  for (int i = 0; i < 2 && !t->abandoned; ++i) {
    if (m->comm[i] != MPI_COMM_NULL) MPI_Comm_free(&m->comm[i]);
  }
  tnt__transport_fini_subset(t);
  free(m);
}

static const tnt__transport_ops_t mpi_ops = {
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .cancel = mpi_cancel,
    .split = mpi_split,
    .shm_alloc = mpi_shm_alloc,
    .shm_free = mpi_shm_free,
    .native_allreduce = mpi_native_allreduce,
    .destroy = mpi_destroy,
};

/* Wraps `coll` (owned from now on) and a duplicate of it for p2p. */
static tnt_status_t mpi_wrap(MPI_Comm coll, tnt__transport_t **out) {
  mpi_transport_t *m = calloc(1, sizeof *m);
  if (m == NULL) {
    MPI_Comm_free(&coll);
    return TNT_ERR_NO_MEMORY;
  }
  m->base.ops = &mpi_ops;
  m->comm[TNT__CH_COLL] = coll;
  m->comm[TNT__CH_P2P] = MPI_COMM_NULL;
  MPI_Comm_set_errhandler(coll, MPI_ERRORS_RETURN);
  int rc = MPI_Comm_dup(coll, &m->comm[TNT__CH_P2P]);
  if (rc != MPI_SUCCESS) {
    mpi_destroy(&m->base);
    return mpi_fail(rc, "MPI_Comm_dup");
  }
  MPI_Comm_rank(coll, &m->base.rank);
  MPI_Comm_size(coll, &m->base.size);
  *out = &m->base;
  return TNT_OK;
}

/*
 * TNT_SPLIT_HOSTS=k: the ranks act as if they sat on k hosts, in
 * consecutive blocks (rank r on host floor(r * k / n)), so that the
 * algorithms for several hosts run, and are tested, on one machine. A block
 * must lie within one real host: its ranks still share memory. Read once,
 * when the world transport is created; every rank must set the same value.
 */
static tnt_status_t split_hosts(tnt__transport_t *t, const int *leader) {
  const double hosts = tnt__setting_number(TNT__S_SPLIT_HOSTS);
  if (hosts < 0) return TNT_OK; /* off */
  const int n = t->size;
  const long k = (long)hosts;
  if (k > n) {
    TNT_LOG_ERROR("TNT_SPLIT_HOSTS=%ld: give the number of hosts to pretend, a whole number from "
                  "1 to %d (the number of ranks), or unset it",
                  k, n);
    return TNT_ERR_INVALID_ARG;
  }
  for (int r = 1; r < n; ++r) {
    const int same_block = (long)r * k / n == (long)(r - 1) * k / n;
    if (same_block && leader[r] != leader[r - 1]) {
      TNT_LOG_ERROR("TNT_SPLIT_HOSTS=%ld puts ranks %d and %d, which run on different hosts, on "
                    "one pretended host; use a multiple of the %d real hosts, or unset it",
                    k, r - 1, r, t->num_hosts);
      return TNT_ERR_INVALID_ARG;
    }
  }
  for (int r = 0; r < n; ++r) t->host_of[r] = (int)((long)r * k / n);
  t->num_hosts = (int)k;
  return TNT_OK;
}

/* A number that ranks of one kernel share and ranks of different kernels
 * (machines) almost surely do not: a hash of Linux's boot id, or 0 where it
 * cannot be read. */
static uint64_t kernel_id(void) {
  char id[64] = {0};
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == NULL) return 0;
  size_t len = fread(id, 1, sizeof id - 1, f);
  fclose(f);
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)id[i]) * 1099511628211ull;
  return len > 0 ? h : 0;
}

/* More ranks than cores on this machine: waits must yield at once. The
 * ranks that share the cores are those of one kernel, which can be more
 * than those of one host: hosts made of containers or network namespaces
 * on one machine each count as a host (their own shared memory) but share
 * the machine's cores. Where the kernel cannot be told, a host's ranks. */
static tnt_status_t detect_oversubscription(MPI_Comm coll, int n, const int *leader,
                                            int my_leader) {
  uint64_t mine = kernel_id();
  uint64_t *ids = malloc((size_t)n * sizeof *ids);
  if (ids == NULL) return TNT_ERR_NO_MEMORY;
  int rc = MPI_Allgather(&mine, 1, MPI_UINT64_T, ids, 1, MPI_UINT64_T, coll);
  if (rc != MPI_SUCCESS) {
    free(ids);
    return mpi_fail(rc, "machine discovery");
  }
  int sharing = 0;
  for (int r = 0; r < n; ++r) {
    sharing += mine != 0 && ids[r] != 0 ? ids[r] == mine : leader[r] == my_leader;
  }
  free(ids);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int oversubscribed = cores > 0 && sharing > cores;
  TNT_LOG_DEBUG("%d ranks share this machine's %ld cores%s", sharing, cores,
                oversubscribed ? ": waits yield at once" : "");
  tnt__spin_set_oversubscribed(oversubscribed);
  return TNT_OK;
}

tnt_status_t tnt__transport_mpi_create(tnt__transport_t **out) {
  MPI_Comm coll;
  MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &coll));
  tnt__transport_t *t = NULL;
  TNT_CHECK(mpi_wrap(coll, &t));
  mpi_transport_t *m = (mpi_transport_t *)t;
  int n = t->size;
  t->world_ranks = malloc((size_t)n * sizeof(int));
  t->host_of = malloc((size_t)n * sizeof(int));
  int *leader = malloc((size_t)n * sizeof(int));
  tnt_status_t st = TNT_OK;
  if (t->world_ranks == NULL || t->host_of == NULL || leader == NULL) {
    st = TNT_ERR_NO_MEMORY;
    goto out;
  }
  /* A host is named by its lowest world rank; hosts are numbered in order
   * of that rank. */
  MPI_Comm node;
  int rc = MPI_Comm_split_type(coll, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) {
    st = mpi_fail(rc, "MPI_Comm_split_type");
    goto out;
  }
  int me = t->rank, my_leader = 0;
  rc = MPI_Allreduce(&me, &my_leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  if (rc == MPI_SUCCESS) rc = MPI_Allgather(&my_leader, 1, MPI_INT, leader, 1, MPI_INT, coll);
  if (rc != MPI_SUCCESS) {
    st = mpi_fail(rc, "host discovery");
    goto out;
  }
  st = detect_oversubscription(coll, n, leader, my_leader);
  if (st < 0) goto out;
  t->num_hosts = 0;
  for (int r = 0; r < n; ++r) {
    t->world_ranks[r] = r;
    if (leader[r] == r) {
      t->host_of[r] = t->num_hosts++;
    } else {
      t->host_of[r] = t->host_of[leader[r]];
    }
  }
  st = split_hosts(t, leader);
  (void)m;
out:
  free(leader);
  if (st < 0) {
    mpi_destroy(t);
    return st;
  }
  *out = t;
  return TNT_OK;
}
