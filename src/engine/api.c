/*
 * The public collective and point-to-point calls: each validates its
 * arguments (an invalid call does nothing and says why), wraps the work in
 * a request, and hands it to the engine. Blocking calls are the
 * non-blocking ones followed by a wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context.h"
#include "core/log.h"
#include "core/reduce.h"
#include "engine/engine.h"

/* ---------------------------------------------------- operation bodies */

static tnt_status_t allreduce_run(tnt__op_t *op, const tnt__wait_ctx_t *w) {
  const tnt__algo_t *a = tnt__algo_select(op->comm, TNT__COLL_ALLREDUCE,
                                          op->count * tnt_dtype_size(op->dtype));
  return a->fn.allreduce(op->comm, op->sendbuf, op->recvbuf, op->count, op->dtype, op->op, w);
}

static tnt_status_t broadcast_run(tnt__op_t *op, const tnt__wait_ctx_t *w) {
  size_t bytes = op->count * tnt_dtype_size(op->dtype);
  const tnt__algo_t *a = tnt__algo_select(op->comm, TNT__COLL_BROADCAST, bytes);
  return a->fn.broadcast(op->comm, op->recvbuf, bytes, op->root, w);
}

static tnt_status_t allgatherv_run(tnt__op_t *op, const tnt__wait_ctx_t *w) {
  size_t total = 0;
  for (int r = 0; r < op->comm->size; ++r) total += op->counts[r];
  const tnt__algo_t *a = tnt__algo_select(op->comm, TNT__COLL_ALLGATHERV, total);
  return a->fn.allgatherv(op->comm, op->sendbuf, op->recvbuf, op->counts, op->displs, w);
}

static tnt_status_t barrier_run(tnt__op_t *op, const tnt__wait_ctx_t *w) {
  return tnt__barrier(op->comm, w);
}

/* ---------------------------------------------------------- validation */

static tnt_status_t bad(const char *call, const char *why) {
  TNT_LOG_ERROR("%s: %s", call, why);
  return TNT_ERR_INVALID_ARG;
}

static tnt_status_t check_common(const char *call, const tnt_group_t *g, tnt_dtype_t dtype,
                                 size_t count) {
  if (g == NULL) return bad(call, "group is NULL");
  if (!tnt__dtype_valid(dtype)) return bad(call, "invalid dtype");
  if (count > SIZE_MAX / 8) return bad(call, "count is too large");
  return tnt__context_check(g->ctx);
}

static tnt_status_t check_buf(const char *call, const void *buf, size_t count, const char *name) {
  if (buf == NULL && count > 0) {
    char why[64];
    snprintf(why, sizeof why, "%s is NULL with count > 0", name);
    return bad(call, why);
  }
  return TNT_OK;
}

/* A request for `run` on group g, the collective `sig`, labelled
 * "<call> of <bytes> bytes". */
static tnt_status_t new_op(tnt_group_t *g, const char *call, tnt__op_run_fn run, size_t bytes,
                           tnt__coll_sig_t sig, tnt_request_t **out) {
  TNT_CHECK(tnt__request_new(g->ctx, out));
  tnt__op_t *op = &(*out)->op;
  op->kind = TNT__OP_RUN;
  op->run = run;
  op->comm = g->comm;
  op->group = g;
  op->sig = sig;
  op->call = call;
  op->bytes = bytes;
  op->bucket = -1;
  snprintf(op->label, sizeof op->label, "%s of %zu bytes", call, bytes);
  return TNT_OK;
}

/* Submits a non-blocking request, or runs a blocking one. */
static tnt_status_t finish(tnt_group_t *g, tnt_request_t *req, tnt_request_t **out) {
  if (out != NULL) {
    tnt__engine_submit(tnt__context_engine(g->ctx), req);
    *out = req;
    return TNT_OK;
  }
  return tnt__engine_run(tnt__context_engine(g->ctx), req);
}

/* ---------------------------------------------------------- allreduce */

tnt_status_t tnt__iallreduce_labeled(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                     size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                     const char *label, tnt_request_t **req) {
  return tnt__iallreduce_bucket(g, sendbuf, recvbuf, count, dtype, op, label, -1, req);
}

tnt_status_t tnt__iallreduce_bucket(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                    size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                    const char *label, long bucket, tnt_request_t **req) {
  static const char call[] = "allreduce";
  TNT_CHECK(check_common(call, g, dtype, count));
  if (!tnt__op_valid(op)) return bad(call, "invalid op");
  TNT_CHECK(check_buf(call, sendbuf, count, "sendbuf"));
  TNT_CHECK(check_buf(call, recvbuf, count, "recvbuf"));
  tnt_request_t *r = NULL;
  const tnt__coll_sig_t sig = {.count = count, .kind = TNT__COLL_ALLREDUCE,
                               .dtype = (uint8_t)dtype, .op = (uint8_t)op, .set = 1};
  TNT_CHECK(new_op(g, call, allreduce_run, count * tnt_dtype_size(dtype), sig, &r));
  r->op.bucket = bucket;
  r->op.sendbuf = sendbuf;
  r->op.recvbuf = recvbuf;
  r->op.count = count;
  r->op.dtype = dtype;
  r->op.op = op;
  if (label != NULL) snprintf(r->op.label, sizeof r->op.label, "%s", label);
  return finish(g, r, req);
}

tnt_status_t tnt_allreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                           tnt_dtype_t dtype, tnt_op_t op) {
  return tnt__iallreduce_labeled(g, sendbuf, recvbuf, count, dtype, op, NULL, NULL);
}

tnt_status_t tnt_iallreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                            tnt_dtype_t dtype, tnt_op_t op, tnt_request_t **req) {
  if (req == NULL) return bad("allreduce", "req is NULL");
  return tnt__iallreduce_labeled(g, sendbuf, recvbuf, count, dtype, op, NULL, req);
}

const char *tnt_allreduce_algorithm(const tnt_group_t *g, size_t bytes) {
  if (g == NULL) return "invalid";
  return tnt__algo_select(g->comm, TNT__COLL_ALLREDUCE, bytes)->name;
}

/* ---------------------------------------------------------- broadcast */

static tnt_status_t broadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype,
                              int root, tnt_request_t **req) {
  static const char call[] = "broadcast";
  TNT_CHECK(check_common(call, g, dtype, count));
  if (root < 0 || root >= g->comm->size) return bad(call, "root is not a rank of the group");
  TNT_CHECK(check_buf(call, buf, count, "buf"));
  tnt_request_t *r = NULL;
  const tnt__coll_sig_t sig = {.count = count, .root = root, .kind = TNT__COLL_BROADCAST,
                               .dtype = (uint8_t)dtype, .set = 1};
  TNT_CHECK(new_op(g, call, broadcast_run, count * tnt_dtype_size(dtype), sig, &r));
  r->op.recvbuf = buf;
  r->op.count = count;
  r->op.dtype = dtype;
  r->op.root = root;
  return finish(g, r, req);
}

tnt_status_t tnt_broadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int root) {
  return broadcast(g, buf, count, dtype, root, NULL);
}

tnt_status_t tnt_ibroadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int root,
                            tnt_request_t **req) {
  if (req == NULL) return bad("broadcast", "req is NULL");
  return broadcast(g, buf, count, dtype, root, req);
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
  const size_t esz = tnt_dtype_size(dtype);
  if (counts != NULL && (displs == NULL || counts[me] != count)) {
    return bad(call, "counts and displs are required, and counts[rank] must equal count");
  }
  size_t total = 0;
  for (int r = 0; r < n; ++r) total += counts ? counts[r] : count;
  TNT_CHECK(check_buf(call, sendbuf, count, "sendbuf"));
  TNT_CHECK(check_buf(call, recvbuf, total, "recvbuf"));
  tnt_request_t *rq = NULL;
  const tnt__coll_sig_t sig = {.count = total * esz, .kind = TNT__COLL_ALLGATHERV, .set = 1};
  TNT_CHECK(new_op(g, call, allgatherv_run, total * esz, sig, &rq));
  tnt__op_t *op = &rq->op;
  op->counts = malloc((size_t)n * sizeof(size_t));
  op->displs = malloc((size_t)n * sizeof(size_t));
  if (op->counts == NULL || op->displs == NULL) {
    tnt__request_unref(rq);
    tnt__request_unref(rq);
    return TNT_ERR_NO_MEMORY;
  }
  for (int r = 0; r < n; ++r) {
    op->counts[r] = (counts ? counts[r] : count) * esz;
    op->displs[r] = (counts ? displs[r] : (size_t)r * count) * esz;
  }
  op->sendbuf = sendbuf;
  op->recvbuf = recvbuf;
  op->count = count;
  op->dtype = dtype;
  return finish(g, rq, req);
}

tnt_status_t tnt_allgather(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                           tnt_dtype_t dtype) {
  return allgatherv(g, sendbuf, count, recvbuf, NULL, NULL, dtype, NULL);
}

tnt_status_t tnt_iallgather(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                            tnt_dtype_t dtype, tnt_request_t **req) {
  if (req == NULL) return bad("allgather", "req is NULL");
  return allgatherv(g, sendbuf, count, recvbuf, NULL, NULL, dtype, req);
}

tnt_status_t tnt_allgatherv(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                            const size_t *counts, const size_t *displs, tnt_dtype_t dtype) {
  if (counts == NULL) return bad("allgatherv", "counts is NULL");
  return allgatherv(g, sendbuf, count, recvbuf, counts, displs, dtype, NULL);
}

tnt_status_t tnt_iallgatherv(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                             const size_t *counts, const size_t *displs, tnt_dtype_t dtype,
                             tnt_request_t **req) {
  if (counts == NULL || req == NULL) return bad("allgatherv", "counts or req is NULL");
  return allgatherv(g, sendbuf, count, recvbuf, counts, displs, dtype, req);
}

/* ---------------------------------------------------------- barrier */

static tnt_status_t barrier(tnt_group_t *g, tnt_request_t **req) {
  TNT_CHECK(check_common("barrier", g, TNT_FLOAT32, 0));
  tnt_request_t *r = NULL;
  const tnt__coll_sig_t sig = {.kind = TNT__COLL_BARRIER, .set = 1};
  TNT_CHECK(new_op(g, "barrier", barrier_run, 0, sig, &r));
  snprintf(r->op.label, sizeof r->op.label, "barrier");
  return finish(g, r, req);
}

tnt_status_t tnt_barrier(tnt_group_t *g) {
  return barrier(g, NULL);
}

tnt_status_t tnt_ibarrier(tnt_group_t *g, tnt_request_t **req) {
  if (req == NULL) return bad("barrier", "req is NULL");
  return barrier(g, req);
}

/* ---------------------------------------------------------- point to point */

static tnt_status_t p2p(tnt_group_t *g, tnt__op_kind_t kind, const void *sbuf, void *rbuf,
                        size_t count, tnt_dtype_t dtype, int peer, int tag, tnt_request_t **req) {
  const char *call = kind == TNT__OP_SEND ? "send" : "recv";
  TNT_CHECK(check_common(call, g, dtype, count));
  if (peer < 0 || peer >= g->comm->size) return bad(call, "peer is not a rank of the group");
  if (tag < 0 || tag >= 32768) return bad(call, "tag must be in 0..32767");
  TNT_CHECK(check_buf(call, kind == TNT__OP_SEND ? sbuf : rbuf, count, "buf"));
  tnt_request_t *r = NULL;
  TNT_CHECK(tnt__request_new(g->ctx, &r));
  tnt__op_t *op = &r->op;
  op->kind = kind;
  op->comm = g->comm;
  op->group = g;
  op->sendbuf = sbuf;
  op->recvbuf = rbuf;
  op->count = count;
  op->dtype = dtype;
  op->root = peer;
  op->tag = tag;
  snprintf(op->label, sizeof op->label, "%s of %zu bytes %s rank %d (tag %d)", call,
           count * tnt_dtype_size(dtype), kind == TNT__OP_SEND ? "to" : "from",
           g->comm->t->world_ranks[peer], tag);
  if (req == NULL) return tnt__engine_submit_wait(tnt__context_engine(g->ctx), r);
  tnt__engine_submit(tnt__context_engine(g->ctx), r);
  *req = r;
  return TNT_OK;
}

tnt_status_t tnt_send(tnt_group_t *g, const void *buf, size_t count, tnt_dtype_t dtype, int dst,
                      int tag) {
  return p2p(g, TNT__OP_SEND, buf, NULL, count, dtype, dst, tag, NULL);
}

tnt_status_t tnt_recv(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int src,
                      int tag) {
  return p2p(g, TNT__OP_RECV, NULL, buf, count, dtype, src, tag, NULL);
}

tnt_status_t tnt_isend(tnt_group_t *g, const void *buf, size_t count, tnt_dtype_t dtype, int dst,
                       int tag, tnt_request_t **req) {
  if (req == NULL) return bad("send", "req is NULL");
  return p2p(g, TNT__OP_SEND, buf, NULL, count, dtype, dst, tag, req);
}

tnt_status_t tnt_irecv(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int src,
                       int tag, tnt_request_t **req) {
  if (req == NULL) return bad("recv", "req is NULL");
  return p2p(g, TNT__OP_RECV, NULL, buf, count, dtype, src, tag, req);
}
