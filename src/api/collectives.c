/*
 * The public collective and point-to-point calls: each validates its
 * arguments (an invalid call does nothing and says why), describes the work
 * (what to run, on which buffers, and the signature every member must
 * agree on) and hands it to the engine. Blocking calls are the
 * non-blocking ones followed by a wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "util/reduce.h"

/* ---------------------------------------------------- work functions */

static tnt_status_t broadcast_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  const tnt__algo_t *a = tnt__algo_select(work->comm, TNT__COLL_BROADCAST, work->bytes);
  work->algorithm = a->name;
  return a->fn.broadcast(work->comm, work->recvbuf, work->bytes, work->root, w);
}

static tnt_status_t barrier_run(tnt__work_t *work, const tnt__wait_ctx_t *w) {
  return tnt__barrier(work->comm, w);
}

/* ---------------------------------------------------------- validation */

static tnt_status_t check_common(const char *call, const tnt_group_t *g, tnt_dtype_t dtype,
                                 size_t count) {
  if (g == NULL) return tnt__api_invalid(call, "group is NULL");
  if (!tnt__dtype_valid(dtype)) return tnt__api_invalid(call, "invalid dtype %d", (int)dtype);
  if (count > SIZE_MAX / 8) return tnt__api_invalid(call, "count %zu is too large", count);
  return tnt__engine_check(tnt__context_engine(g->ctx));
}

static tnt_status_t check_buf(const char *call, const void *buf, size_t count, const char *name) {
  if (buf == NULL && count > 0) {
    return tnt__api_invalid(call, "%s is NULL with count %zu > 0", name, count);
  }
  return TNT_OK;
}

static tnt_status_t check_rank(const char *call, const tnt_group_t *g, int rank, const char *name) {
  if (rank < 0 || rank >= g->comm->size) {
    return tnt__api_invalid(call, "%s=%d is not a rank; pass a rank in 0..%d", name, rank,
                            g->comm->size - 1);
  }
  return TNT_OK;
}

/* A request on group g for the work that `proto` describes. */
static tnt_status_t new_work(tnt_group_t *g, const tnt__work_t *proto, tnt_request_t **out) {
  return tnt__engine_work(tnt__context_engine(g->ctx), g->comm, proto, out);
}

/* Submits a non-blocking request, or runs a blocking one. */
static tnt_status_t submit(tnt_group_t *g, tnt_request_t *req, tnt_request_t **out) {
  return tnt__engine_post(tnt__context_engine(g->ctx), req, out);
}

/* The public end of call `call` on group g (which may be NULL). */
static tnt_status_t end(const char *call, const tnt_group_t *g, tnt_status_t st) {
  return tnt__api_end(call, g != NULL ? g->ctx : NULL, st);
}

/* ---------------------------------------------------------- allreduce */

/* tnt_iallreduce, or tnt_allreduce with req == NULL. */
static tnt_status_t allreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                              tnt_dtype_t dtype, tnt_op_t op, tnt_request_t **req) {
  static const char call[] = "allreduce";
  TNT_CHECK(check_common(call, g, dtype, count));
  if (!tnt__op_valid(op)) return tnt__api_invalid(call, "invalid op %d", (int)op);
  TNT_CHECK(check_buf(call, sendbuf, count, "sendbuf"));
  TNT_CHECK(check_buf(call, recvbuf, count, "recvbuf"));
  return tnt__engine_allreduce(tnt__context_engine(g->ctx), g->comm, sendbuf, recvbuf, count,
                               dtype, op, NULL, -1, req);
}

tnt_status_t tnt_allreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                           tnt_dtype_t dtype, tnt_op_t op) {
  tnt__error_clear();
  return end("tnt_allreduce", g,
             allreduce(g, sendbuf, recvbuf, count, dtype, op, NULL));
}

tnt_status_t tnt_iallreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                            tnt_dtype_t dtype, tnt_op_t op, tnt_request_t **req) {
  static const char call[] = "tnt_iallreduce";
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid(call, "req is NULL");
  return end(call, g, allreduce(g, sendbuf, recvbuf, count, dtype, op, req));
}

const char *tnt_allreduce_algorithm(const tnt_group_t *g, size_t bytes) {
  if (g == NULL) return "invalid";
  return tnt__algo_select(g->comm, TNT__COLL_ALLREDUCE, bytes)->name;
}

tnt_status_t tnt_algorithm_info(const char *collective, int index, const char **name,
                                const char **description) {
  static const char call[] = "tnt_algorithm_info";
  static const char *const kinds[TNT__ALGO_TABLE_COUNT] = {"allreduce", "broadcast",
                                                           "allgather"};
  tnt__error_clear();
  for (int k = 0; collective != NULL && k < TNT__ALGO_TABLE_COUNT; ++k) {
    if (strcmp(collective, kinds[k]) != 0) continue;
    const tnt__algo_t *a = tnt__algo_at((tnt__coll_kind_t)k, index);
    if (a == NULL) {
      /* The end of a listing, not worth a line in the log. */
      tnt__error_set("%s: %s has no algorithm number %d", call, collective, index);
      return TNT_ERR_INVALID_ARG;
    }
    if (name != NULL) *name = a->name;
    if (description != NULL) *description = a->description;
    return TNT_OK;
  }
  return tnt__api_invalid(call, "collective %s%s%s: expected allreduce, broadcast or allgather",
                          collective ? "'" : "", collective ? collective : "NULL",
                          collective ? "'" : "");
}

/* ---------------------------------------------------------- broadcast */

static tnt_status_t broadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype,
                              int root, tnt_request_t **req) {
  static const char call[] = "broadcast";
  TNT_CHECK(check_common(call, g, dtype, count));
  TNT_CHECK(check_rank(call, g, root, "root"));
  TNT_CHECK(check_buf(call, buf, count, "buf"));
  const tnt__work_t work = {
      .kind = TNT__WORK_RUN, .run = broadcast_run, .call = call, .bucket = -1,
      .recvbuf = buf, .count = count, .dtype = dtype, .root = root,
      .bytes = count * tnt__dtype_size(dtype),
      .sig = {.count = count, .root = root, .kind = TNT__COLL_BROADCAST,
              .dtype = (uint8_t)dtype, .set = 1}};
  tnt_request_t *r = NULL;
  TNT_CHECK(new_work(g, &work, &r));
  return submit(g, r, req);
}

tnt_status_t tnt_broadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int root) {
  tnt__error_clear();
  return end("tnt_broadcast", g, broadcast(g, buf, count, dtype, root, NULL));
}

tnt_status_t tnt_ibroadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int root,
                            tnt_request_t **req) {
  static const char call[] = "tnt_ibroadcast";
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid(call, "req is NULL");
  return end(call, g, broadcast(g, buf, count, dtype, root, req));
}

/* ---------------------------------------------------------- allgather(v) */

/* Element counts and displacements (NULL: `count` each, back to back)
 * become byte arrays owned by the request. */
static tnt_status_t allgatherv(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                               const size_t *counts, const size_t *displs, tnt_dtype_t dtype,
                               tnt_request_t **req) {
  static const char call[] = "allgather";
  TNT_CHECK(check_common(call, g, dtype, count));
  const int n = g->comm->size, me = g->comm->rank;
  const size_t esz = tnt__dtype_size(dtype);
  if (counts != NULL && (displs == NULL || counts[me] != count)) {
    return tnt__api_invalid(call,
                            "counts and displs are required, and counts[rank] must equal count");
  }
  size_t total = 0;
  for (int r = 0; r < n; ++r) total += counts ? counts[r] : count;
  TNT_CHECK(check_buf(call, sendbuf, count, "sendbuf"));
  TNT_CHECK(check_buf(call, recvbuf, total, "recvbuf"));
  size_t *bcounts = malloc((size_t)n * sizeof(size_t));
  size_t *bdispls = malloc((size_t)n * sizeof(size_t));
  if (bcounts == NULL || bdispls == NULL) {
    free(bcounts);
    free(bdispls);
    TNT_LOG_ERROR("%s: out of memory for %d counts", call, n);
    return TNT_ERR_NO_MEMORY;
  }
  for (int r = 0; r < n; ++r) {
    bcounts[r] = (counts ? counts[r] : count) * esz;
    bdispls[r] = (counts ? displs[r] : (size_t)r * count) * esz;
  }
  return tnt__engine_allgatherv(tnt__context_engine(g->ctx), g->comm, sendbuf, recvbuf, bcounts,
                                bdispls, total * esz, NULL, -1, req);
}

tnt_status_t tnt_allgather(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                           tnt_dtype_t dtype) {
  tnt__error_clear();
  return end("tnt_allgather", g, allgatherv(g, sendbuf, count, recvbuf, NULL, NULL, dtype, NULL));
}

tnt_status_t tnt_iallgather(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                            tnt_dtype_t dtype, tnt_request_t **req) {
  static const char call[] = "tnt_iallgather";
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid(call, "req is NULL");
  return end(call, g, allgatherv(g, sendbuf, count, recvbuf, NULL, NULL, dtype, req));
}

tnt_status_t tnt_allgatherv(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                            const size_t *counts, const size_t *displs, tnt_dtype_t dtype) {
  static const char call[] = "tnt_allgatherv";
  tnt__error_clear();
  if (counts == NULL) return tnt__api_invalid(call, "counts is NULL");
  return end(call, g, allgatherv(g, sendbuf, count, recvbuf, counts, displs, dtype, NULL));
}

tnt_status_t tnt_iallgatherv(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                             const size_t *counts, const size_t *displs, tnt_dtype_t dtype,
                             tnt_request_t **req) {
  static const char call[] = "tnt_iallgatherv";
  tnt__error_clear();
  if (counts == NULL || req == NULL) return tnt__api_invalid(call, "counts or req is NULL");
  return end(call, g, allgatherv(g, sendbuf, count, recvbuf, counts, displs, dtype, req));
}

/* ---------------------------------------------------------- reduce-scatter */

/* tnt_(i)reduce_scatter(v): rank r's block has counts[r] elements (NULL:
 * `count` each). The blocks' bounds go to the request. */
static tnt_status_t reduce_scatter(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                   const size_t *counts, tnt_dtype_t dtype, tnt_op_t op,
                                   tnt_request_t **req) {
  static const char call[] = "reduce_scatter";
  TNT_CHECK(check_common(call, g, dtype, count));
  if (!tnt__op_valid(op)) return tnt__api_invalid(call, "invalid op %d", (int)op);
  const int n = g->comm->size, me = g->comm->rank;
  size_t *bounds = malloc(((size_t)n + 1) * sizeof *bounds);
  if (bounds == NULL) {
    TNT_LOG_ERROR("%s: out of memory for %d counts", call, n);
    return TNT_ERR_NO_MEMORY;
  }
  bounds[0] = 0;
  tnt_status_t st = TNT_OK;
  for (int r = 0; r < n && st == TNT_OK; ++r) {
    const size_t c = counts != NULL ? counts[r] : count;
    if (c > SIZE_MAX / 8 - bounds[r]) {
      st = tnt__api_invalid(call, "the blocks hold more than %zu elements in all", SIZE_MAX / 8);
    }
    bounds[r + 1] = bounds[r] + c;
  }
  if (st == TNT_OK) st = check_buf(call, sendbuf, bounds[n], "sendbuf");
  if (st == TNT_OK) st = check_buf(call, recvbuf, bounds[me + 1] - bounds[me], "recvbuf");
  if (st < 0) {
    free(bounds);
    return st;
  }
  return tnt__engine_reduce_scatter(tnt__context_engine(g->ctx), g->comm, sendbuf, NULL, recvbuf,
                                    bounds[n], bounds, dtype, op, NULL, -1, req);
}

tnt_status_t tnt_reduce_scatter(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                tnt_dtype_t dtype, tnt_op_t op) {
  tnt__error_clear();
  return end("tnt_reduce_scatter", g,
             reduce_scatter(g, sendbuf, recvbuf, count, NULL, dtype, op, NULL));
}

tnt_status_t tnt_ireduce_scatter(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                 tnt_dtype_t dtype, tnt_op_t op, tnt_request_t **req) {
  static const char call[] = "tnt_ireduce_scatter";
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid(call, "req is NULL");
  return end(call, g, reduce_scatter(g, sendbuf, recvbuf, count, NULL, dtype, op, req));
}

tnt_status_t tnt_reduce_scatterv(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                 const size_t *counts, tnt_dtype_t dtype, tnt_op_t op) {
  static const char call[] = "tnt_reduce_scatterv";
  tnt__error_clear();
  if (counts == NULL) return tnt__api_invalid(call, "counts is NULL");
  return end(call, g, reduce_scatter(g, sendbuf, recvbuf, 0, counts, dtype, op, NULL));
}

tnt_status_t tnt_ireduce_scatterv(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                  const size_t *counts, tnt_dtype_t dtype, tnt_op_t op,
                                  tnt_request_t **req) {
  static const char call[] = "tnt_ireduce_scatterv";
  tnt__error_clear();
  if (counts == NULL || req == NULL) return tnt__api_invalid(call, "counts or req is NULL");
  return end(call, g, reduce_scatter(g, sendbuf, recvbuf, 0, counts, dtype, op, req));
}

/* ---------------------------------------------------------- barrier */

static tnt_status_t barrier(tnt_group_t *g, tnt_request_t **req) {
  TNT_CHECK(check_common("barrier", g, TNT_FLOAT32, 0));
  const tnt__work_t work = {.kind = TNT__WORK_RUN, .run = barrier_run, .call = "barrier",
                            .bucket = -1, .label = "barrier",
                            .sig = {.kind = TNT__COLL_BARRIER, .set = 1}};
  tnt_request_t *r = NULL;
  TNT_CHECK(new_work(g, &work, &r));
  return submit(g, r, req);
}

tnt_status_t tnt_barrier(tnt_group_t *g) {
  tnt__error_clear();
  return end("tnt_barrier", g, barrier(g, NULL));
}

tnt_status_t tnt_ibarrier(tnt_group_t *g, tnt_request_t **req) {
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid("tnt_ibarrier", "req is NULL");
  return end("tnt_ibarrier", g, barrier(g, req));
}

/* ---------------------------------------------------------- point to point */

static tnt_status_t p2p(tnt_group_t *g, tnt__work_kind_t kind, const void *sbuf, void *rbuf,
                        size_t count, tnt_dtype_t dtype, int peer, int tag, tnt_request_t **req) {
  const int is_send = kind == TNT__WORK_SEND;
  const char *call = is_send ? "send" : "recv";
  TNT_CHECK(check_common(call, g, dtype, count));
  TNT_CHECK(check_rank(call, g, peer, is_send ? "dst" : "src"));
  if (tag < 0 || tag >= 32768) return tnt__api_invalid(call, "tag %d is not in 0..32767", tag);
  TNT_CHECK(check_buf(call, is_send ? sbuf : rbuf, count, "buf"));
  tnt__work_t work = {.kind = kind, .call = call, .bucket = -1,
                      .sendbuf = sbuf, .recvbuf = rbuf, .count = count, .dtype = dtype,
                      .peer = peer, .tag = tag, .bytes = count * tnt__dtype_size(dtype)};
  snprintf(work.label, sizeof work.label, "%s of %zu bytes %s rank %d (tag %d)", call,
           work.bytes, is_send ? "to" : "from", g->comm->t->world_ranks[peer], tag);
  tnt_request_t *r = NULL;
  TNT_CHECK(new_work(g, &work, &r));
  return submit(g, r, req);
}

tnt_status_t tnt_send(tnt_group_t *g, const void *buf, size_t count, tnt_dtype_t dtype, int dst,
                      int tag) {
  tnt__error_clear();
  return end("tnt_send", g, p2p(g, TNT__WORK_SEND, buf, NULL, count, dtype, dst, tag, NULL));
}

tnt_status_t tnt_recv(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int src,
                      int tag) {
  tnt__error_clear();
  return end("tnt_recv", g, p2p(g, TNT__WORK_RECV, NULL, buf, count, dtype, src, tag, NULL));
}

tnt_status_t tnt_isend(tnt_group_t *g, const void *buf, size_t count, tnt_dtype_t dtype, int dst,
                       int tag, tnt_request_t **req) {
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid("tnt_isend", "req is NULL");
  return end("tnt_isend", g, p2p(g, TNT__WORK_SEND, buf, NULL, count, dtype, dst, tag, req));
}

tnt_status_t tnt_irecv(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int src,
                       int tag, tnt_request_t **req) {
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid("tnt_irecv", "req is NULL");
  return end("tnt_irecv", g, p2p(g, TNT__WORK_RECV, NULL, buf, count, dtype, src, tag, req));
}
