/*
 * The fusion runtime: a fusion set's buckets and rounds (runtime.c) and
 * what its ranks agree on (agreement.c): the fused list, the readiness
 * order and the tuned plan. src/api/fusion.c checks the arguments of the
 * public tnt_fusion_* calls and calls these; the set reduces its buckets
 * through the engine, over the communicator of its group.
 *
 * Tensor fusion at run time. Tensors are copied into the bucket that the
 * planner (src/fusion) assigned them; a bucket's allreduce is submitted
 * once all of its members have started, and buckets are always submitted
 * in plan order. Since every rank submits the same buckets in the same
 * order, ranks may start their tensors in any order without deadlock, and
 * since each bucket is reduced by the same algorithm in a fixed order, the
 * results are bitwise identical on every rank and in every run.
 *
 * A bucket is one round at a time: after all its members have finished
 * (copied their result out), it is reset for the next round of starts.
 *
 * In TNT_FUSION_MODE_REDUCE_SCATTER a bucket is reduce-scattered instead
 * (the same algorithm and order as its allreduce, so each rank's part has
 * the allreduce's bits) into a part of its own, and in
 * TNT_FUSION_MODE_ALLGATHER each rank's parts are gathered; the whole
 * vector then exists only while a round needs it (see tnt__bucket_t).
 *
 * With a 16-bit wire dtype, a float32 bucket holds its tensors in that
 * dtype: each start narrows its tensor into the bucket and each finish
 * widens its part of the result, so the allreduce moves half the bytes and
 * no tensor is converted twice.
 *
 * A set whose overlap is off holds the round's buckets until every tensor
 * has started the round, then submits them all in plan order.
 *
 * A set that tunes its threshold or its overlap (src/fusion/tuner.h)
 * replans between rounds: a round ends when every tensor has finished it,
 * and while tuning (and while overlap is off), a tensor's start for the
 * next round waits until then, so that no tensor is in a bucket while the
 * buckets change. The round that decides carries
 * the master's choice in one more allreduce, submitted just before the
 * round's first bucket: in the same place on every rank, like the buckets.
 */
#ifndef TNT_FUSION_RUNTIME_H
#define TNT_FUSION_RUNTIME_H

#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"
#include "fusion/planner.h"
#include "fusion/tuner.h"
#include "tnt/tnt.h"

/* The state of each tensor in the round now running. */
enum { TNT__FUSION_IDLE = 0, TNT__FUSION_STARTED = 1, TNT__FUSION_FINISHED = 2 };

typedef struct tnt__bucket {
  /* The whole vector: for the set's life in TNT_FUSION_MODE_ALLREDUCE; in
   * the other modes from the round's first start to the end of its
   * reduce-scatter (the engine takes it over when the bucket is submitted
   * and frees it once it has run) or to the round's last finish
   * (allgather), NULL in between. */
  uint8_t *buf;
  /* TNT_FUSION_MODE_REDUCE_SCATTER: elements [lo, hi), reduced; from the
   * bucket's submission to the round's last finish, NULL in between. */
  uint8_t *part;
  size_t lo, hi; /* this rank's part of the bucket, in elements */
  size_t started, finished;
  tnt_request_t *req; /* the round's allreduce (reduce-scatter, allgather), once submitted */
  tnt_dtype_t wire;   /* the dtype of buf, part and the collective */
  char label[112];
} tnt__bucket_t;

struct tnt_fusion {
  tnt_group_t *g;        /* for tnt_fusion_group; the runtime uses the two below */
  tnt__engine_t *engine; /* of g's context */
  tnt__comm_t *comm;     /* of g */
  tnt_fusion_options_t opt;
  tnt__fusion_plan_t plan;
  tnt_tensor_info_t *tensors;
  uint8_t *state; /* per tensor: IDLE, STARTED, FINISHED */
  tnt__bucket_t *buckets;
  size_t next_issue; /* the bucket whose allreduce goes next */
  size_t threshold;  /* of the plan in use */
  /* TNT_FUSION_MODE_REDUCE_SCATTER: the bytes of whole vectors a rank
   * keeps filled or waiting for their reduce-scatter before a start that
   * needs a new one waits (TNT_FUSION_IN_FLIGHT_MIB). */
  size_t in_flight_bytes;
  int hold;          /* of the plan in use: overlap off */
  /* Rounds: tensors started and finished in the round now running, and
   * per tensor the rounds it has finished. */
  size_t round, started_in_round, finished_in_round;
  size_t *rounds_of;
  double round_began;
  tnt__tuner_t tuner;
  int64_t vote[1];         /* the master's choice, in the deciding round */
  tnt_request_t *vote_req; /* its allreduce, once submitted */
  /* TNT_FUSION_ORDER_READINESS: when each tensor started in round 0, the
   * master's order (carried in round 1), and then the order of the list
   * in which buckets are filled (perm[k]: index of the k-th tensor). */
  int64_t *seen;
  tnt_request_t *order_req;
  size_t *perm;
  tnt_status_t broken; /* a failed replan: every later call fails */
  int64_t handle;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a bucket was submitted or reset */
};

/* ------------------------------------------------ runtime.c: buckets, rounds */

/*
 * A set over group `g` (whose context runs `engine`, over `comm`) of the n
 * `tensors` with the options `opt`, which the caller has validated; fails
 * with TNT_ERR_MISMATCH when the ranks disagree on the list or options.
 */
tnt_status_t tnt__fusion_create(tnt_group_t *g, tnt__engine_t *engine, tnt__comm_t *comm,
                                const tnt_tensor_info_t *tensors, size_t n,
                                const tnt_fusion_options_t *opt, tnt_fusion_t **out);
/* Waits for the set's allreduces in flight and frees it; returns the first
 * failure among them. */
tnt_status_t tnt__fusion_free(tnt_fusion_t *f);
/* Starts tensor i (an index of f->tensors) of the set with `data` (valid
 * for its count) multiplied by `scale`, under the name of public `call`. */
tnt_status_t tnt__fusion_start(tnt_fusion_t *f, size_t i, const void *data, double scale,
                               const char *call);
/* Finishes tensor i into `out`, divided by `divisor`, waiting at most
 * `timeout_s` (< 0: the context's timeout), under the name of `call`. */
tnt_status_t tnt__fusion_finish(tnt_fusion_t *f, size_t i, void *out, double divisor,
                                double timeout_s, const char *call);
/* This rank's part of tensor i: its elements [*lo, *hi) (see
 * tnt_fusion_mode_t). Stable while the plan is. */
void tnt__fusion_part(const tnt_fusion_t *f, size_t i, size_t *lo, size_t *hi);
/* Replaces the plan and buckets of `f` by those for `threshold` (in the
 * order f->perm). Called with f->mu held and no bucket in flight. */
tnt_status_t tnt__fusion_replan(tnt_fusion_t *f, size_t threshold);
/* An allreduce of the set's group, as a public allreduce submits it: it
 * fails once the context has failed. */
tnt_status_t tnt__fusion_allreduce(const tnt_fusion_t *f, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   const char *label, long bucket, tnt_request_t **req);

/* ------------------------------- agreement.c: the list, the order, the plan */

/* Every rank must fuse the same list with the same options: compares a
 * hash of them across ranks (TNT_ERR_MISMATCH, logged, when they differ). */
tnt_status_t tnt__fusion_check_same_list(const tnt_fusion_t *f);
/* 1 while the set's first rounds decide its plan. */
int tnt__fusion_deciding(const tnt_fusion_t *f);
/* 1 while a round must end before the next starts: while deciding, and
 * while overlap is off (a round's count of starts says when to submit). */
int tnt__fusion_sequential(const tnt_fusion_t *f);
/* Just before the round's first bucket: submits the master's readiness
 * order (round 1 of a set in readiness order) and the master's choice (the
 * deciding round of a tuning set). Called with f->mu held. */
tnt_status_t tnt__fusion_submit_choices(tnt_fusion_t *f);
/* Ends a round while the set decides its plan (see agreement.c). Called
 * with f->mu held, once every tensor has finished the round. */
tnt_status_t tnt__fusion_end_deciding_round(tnt_fusion_t *f);

#endif
