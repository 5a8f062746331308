/*
 * Collective algorithms. Each algorithm lives in its own file and is listed
 * in a table (algorithms.c) with its name, a description (tnt-bench --list
 * prints it), a predicate that says whether it can serve a communicator,
 * and its function. When a communicator is created, the table is resolved
 * once into its choice by message size; the environment variables
 * TNT_ALLREDUCE_ALGORITHM, TNT_BROADCAST_ALGORITHM and
 * TNT_ALLGATHER_ALGORITHM, read at that moment, override the choice by name.
 *
 * Algorithms run on the executor thread of their context, block until done
 * or until the wait context expires, and name the missing peer on expiry.
 */
#ifndef TNT_COLLECTIVES_COLLECTIVES_H
#define TNT_COLLECTIVES_COLLECTIVES_H

#include "transport/transport.h"
#include "util/common.h"

/* Bytes of each rank's shared region before its data slots: one cache line
 * for each of the two progress counters; the first line also holds the
 * signatures of the collectives of the last two rounds. */
#define TNT__SHM_CTRL_BYTES 128

typedef struct tnt__algo tnt__algo_t;

/* How the pipelined ring cuts its chunks: segments of `segment_bytes`, up
 * to `depth` of them in flight on each link (TNT_RING_SEGMENT_KB, default
 * 32, and TNT_RING_DEPTH, default 32, read when a communicator is created). */
typedef struct tnt__ring_cfg {
  size_t segment_bytes;
  int depth;
} tnt__ring_cfg_t;

/* The collectives that have algorithm tables; the barrier has one way only,
 * and the reduce-scatter runs the allreduce's choice (tnt__reduce_scatter). */
typedef enum tnt__coll_kind {
  TNT__COLL_ALLREDUCE = 0,
  TNT__COLL_BROADCAST = 1,
  TNT__COLL_ALLGATHERV = 2,
  TNT__COLL_BARRIER = 3,
  TNT__COLL_REDUCE_SCATTER = 4
} tnt__coll_kind_t;

/* The number of algorithm tables: one per kind before TNT__COLL_BARRIER. */
#define TNT__ALGO_TABLE_COUNT 3

/* The most algorithms one choice switches between by size. */
#define TNT__ALGO_TIERS 3

/* A communicator's choice for one kind of collective: algo[i] serves the
 * messages of at most max_bytes[i] bytes that no earlier tier serves; the
 * last tier used has SIZE_MAX. Resolved once, at creation. */
typedef struct tnt__algo_choice {
  const tnt__algo_t *algo[TNT__ALGO_TIERS];
  size_t max_bytes[TNT__ALGO_TIERS];
} tnt__algo_choice_t;

/* The choice of `a` at every size. */
static inline tnt__algo_choice_t tnt__algo_only(const tnt__algo_t *a) {
  return (tnt__algo_choice_t){{a}, {SIZE_MAX}};
}

/*
 * A communicator: one group's transports, shared memory and algorithm
 * choices.
 *  t      all members
 *  node   members on this host (shares memory when shm != NULL)
 *  cross  one member per host, those with this rank's local rank; NULL
 *         unless every host has the same number of members
 */
typedef struct tnt__comm {
  tnt__transport_t *t;
  tnt__transport_t *node;
  tnt__transport_t *cross;
  tnt__shm_t *shm;
  size_t shm_slot_bytes; /* per rank, per slot (two slots alternate) */
  uint64_t shm_seq;      /* shared-memory rounds completed, equal on every member */
  int rank, size;
  int local_rank, local_size;
  int num_hosts;
  tnt__ring_cfg_t ring;
  tnt__algo_choice_t algos[TNT__ALGO_TABLE_COUNT];
  /* The allreduce among one member per host (cross), by size: recursive
   * doubling, Rabenseifner's or the ring, as for a group of that many
   * hosts with one rank each. Set when cross != NULL. */
  tnt__algo_choice_t cross_allreduce;
} tnt__comm_t;

/* Builds a communicator over `t` (collective over t's ranks; takes
 * ownership of t). Shared memory of TNT_SHM_SLOT_KB per rank and slot
 * (default 256, or 4096 in groups that span hosts) is set up when the transport supports it, and
 * the algorithms are chosen (tnt__algo_resolve). */
tnt_status_t tnt__comm_create(tnt__transport_t *t, tnt__comm_t **out);
void tnt__comm_destroy(tnt__comm_t *c);
/* Makes a later tnt__comm_destroy free memory only, without the MPI calls
 * that wait for every peer: for a context that has failed. */
void tnt__comm_abandon(tnt__comm_t *c);

/* ---- algorithm tables ---- */

typedef tnt_status_t (*tnt__allreduce_fn)(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                          const tnt__wait_ctx_t *w);
typedef tnt_status_t (*tnt__broadcast_fn)(tnt__comm_t *c, void *buf, size_t bytes, int root,
                                          const tnt__wait_ctx_t *w);
/* Byte-level allgatherv: rank r's `counts[r]` bytes land at recvbuf + displs[r]. */
typedef tnt_status_t (*tnt__allgatherv_fn)(tnt__comm_t *c, const void *sendbuf, void *recvbuf,
                                           const size_t *counts, const size_t *displs,
                                           const tnt__wait_ctx_t *w);
/* The blocks of an allgatherv gathered into a buffer of the algorithm's
 * own, one after another from block `first` on (allgatherv_blocks.c):
 * at[j] is where block (first + j) mod n starts, at[n] the total (a new
 * array, NULL when out of memory); tnt__blocks_to_place copies each block
 * from the buffer to recvbuf + displs[block]. */
size_t *tnt__blocks_at(const size_t *counts, int n, int first);
void tnt__blocks_to_place(uint8_t *out, const size_t *displs, const uint8_t *buf,
                          const size_t *at, const size_t *counts, int n, int first);
/* The reduce-scatter phase of an allreduce algorithm, in place: `buf`
 * holds this rank's `bounds[n]` elements (n = c->size), and on return
 * elements [bounds[r], bounds[r + 1]) of it hold block r of the reduction
 * on rank r, bitwise what the algorithm's allreduce gives there when
 * `bounds` are the tnt__slice partition; the rest of buf is scratch. */
typedef tnt_status_t (*tnt__reduce_scatter_fn)(tnt__comm_t *c, void *buf, const size_t *bounds,
                                               tnt_dtype_t dtype, tnt_op_t op,
                                               const tnt__wait_ctx_t *w);

struct tnt__algo {
  const char *name;
  const char *description;
  int (*usable)(const tnt__comm_t *c);
  union {
    tnt__allreduce_fn allreduce;
    tnt__broadcast_fn broadcast;
    tnt__allgatherv_fn allgatherv;
  } fn;
  /* Allreduce algorithms whose first phase is a reduce-scatter; NULL for
   * the others, whose reduce-scatter is their allreduce. */
  tnt__reduce_scatter_fn reduce_scatter;
};

extern const tnt__algo_t tnt__allreduce_ring;  /* allreduce_ring.c */
extern const tnt__algo_t tnt__allreduce_rd;    /* allreduce_rd.c */
extern const tnt__algo_t tnt__allreduce_mpi;   /* allreduce_mpi.c */
extern const tnt__algo_t tnt__allreduce_shm;   /* allreduce_shm.c */
extern const tnt__algo_t tnt__allreduce_hier;  /* allreduce_hier.c */
extern const tnt__algo_t tnt__allreduce_rabenseifner; /* allreduce_rabenseifner.c */
extern const tnt__algo_t tnt__broadcast_tree;  /* broadcast_tree.c */
extern const tnt__algo_t tnt__broadcast_shm;   /* broadcast_shm.c */
extern const tnt__algo_t tnt__allgatherv_ring; /* allgatherv_ring.c */
extern const tnt__algo_t tnt__allgatherv_shm;  /* allgatherv_shm.c */
extern const tnt__algo_t tnt__allgatherv_bruck; /* allgatherv_bruck.c */
extern const tnt__algo_t tnt__allgatherv_rd;    /* allgatherv_rd.c */

/*
 * What a collective call is, in the terms every member must agree on.
 * Shared-memory rounds publish it next to their counters and every rank
 * compares it with its own, so ranks that call different collectives (or
 * the same one with different arguments) at the same point get
 * TNT_ERR_MISMATCH, naming both calls, instead of combining unrelated
 * buffers. Sixteen bytes without padding, compared with memcmp.
 */
typedef struct tnt__coll_sig {
  uint64_t count; /* elements (allreduce, broadcast, reduce-scatter: the whole vector),
                     total bytes (allgatherv) */
  int32_t root;   /* broadcast root, a hash of the blocks (reduce-scatter), else 0 */
  uint8_t kind;   /* tnt__coll_kind_t */
  uint8_t dtype;  /* tnt_dtype_t (allreduce, broadcast, reduce-scatter), else 0 */
  uint8_t op;     /* tnt_op_t (allreduce, reduce-scatter), else 0 */
  uint8_t set;    /* 1; 0 marks a round without a signature */
} tnt__coll_sig_t;

/* "allreduce of 1024 float32 (sum)" and the like. */
void tnt__coll_sig_describe(const tnt__coll_sig_t *s, char *buf, size_t len);

/* Fills c->algos: for each kind the algorithm forced by the environment,
 * when it names one that can serve c, else the choice by message size.
 * Reads the environment; called once per communicator. */
void tnt__algo_resolve(tnt__comm_t *c);

/* The algorithm of choice `ch` for a message of `bytes`. */
static inline const tnt__algo_t *tnt__algo_choose(const tnt__algo_choice_t *ch, size_t bytes) {
  int i = 0;
  while (bytes > ch->max_bytes[i]) i++;
  return ch->algo[i];
}

/* The algorithm for `kind` (< TNT__ALGO_TABLE_COUNT) on `c` and a message
 * of `bytes` (the full vector for allreduce and broadcast, the gathered
 * total for allgatherv): a lookup in c->algos. */
static inline const tnt__algo_t *tnt__algo_select(const tnt__comm_t *c, tnt__coll_kind_t kind,
                                                  size_t bytes) {
  return tnt__algo_choose(&c->algos[kind], bytes);
}

/* Looks an algorithm up by name; NULL when unknown. */
const tnt__algo_t *tnt__algo_find(tnt__coll_kind_t kind, const char *name);
/* The `index`-th algorithm of the table of `kind`, or NULL past its end. */
const tnt__algo_t *tnt__algo_at(tnt__coll_kind_t kind, int index);

/* Barrier over every member of c (shared-memory counters on one host,
 * dissemination over the transport otherwise). */
tnt_status_t tnt__barrier(tnt__comm_t *c, const tnt__wait_ctx_t *w);

/* ---- shared-memory synchronisation (comm.c) ---- */

/* Pointer to data slot `slot` (0 or 1) of node rank `r`. */
uint8_t *tnt__shm_slot(const tnt__comm_t *c, int r, int slot);
/* Publishes that this rank reached `value` on counter `which` (0 or 1). */
void tnt__shm_publish(tnt__comm_t *c, int which, uint64_t value);
/* Waits until node rank `r` published at least `value` on `which`. A wait
 * on counter 0 for the current round (value == c->shm_seq) also checks
 * that r runs the collective w->sig describes (TNT_ERR_MISMATCH if not). */
tnt_status_t tnt__shm_wait_one(tnt__comm_t *c, int which, int r, uint64_t value,
                               const tnt__wait_ctx_t *w);
/* Waits until every node rank published at least `value` on `which`. */
tnt_status_t tnt__shm_wait_all(tnt__comm_t *c, int which, uint64_t value, const tnt__wait_ctx_t *w);
/*
 * Starts a shared-memory round: *seq becomes the round's number, and the
 * call returns once slot (seq & 1) is free, i.e. every rank has finished
 * round seq - 2 (reading its slots and signatures); it then writes this
 * rank's signature of the round (w->sig). Every rank publishes counter
 * 0 = seq only after it finished reading the slots of round seq - 1.
 */
tnt_status_t tnt__shm_round_begin(tnt__comm_t *c, const tnt__wait_ctx_t *w, uint64_t *seq);

/*
 * The frame of recursive doubling and Rabenseifner's algorithm
 * (allreduce_rd.c): n ranks run the exchanges among p participants, p the
 * largest power of two <= n. The first 2(n - p) ranks pair up: even ones hand
 * their vector to the odd one next to them and sit out until it sends them
 * the result. `among` runs the exchanges on participant v (buf holds its
 * vector, tmp room for a whole one); the frame then takes the average, if
 * any (AVERAGE divides by t->size), and hands results back. sendbuf is
 * copied into recvbuf first unless they are the same. tnt__participant_rank
 * is participant v's rank.
 */
typedef tnt_status_t (*tnt__participants_fn)(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp,
                                             size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                             int p, int extra, int v,
                                             const tnt__ring_cfg_t *pieces,
                                             const tnt__wait_ctx_t *w);
/* `pieces`: how the exchanges cut large transfers (the comm's ring
 * segments, tnt__xsendrecv_pieces). */
tnt_status_t tnt__allreduce_folded(tnt__transport_t *t, const void *sendbuf, void *recvbuf,
                                   size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                   tnt__participants_fn among, const tnt__ring_cfg_t *pieces,
                                   const tnt__wait_ctx_t *w);
int tnt__participant_rank(int v, int extra);
/* The frame's first step on the `count` elements of buf (n = t->size > 1,
 * p and extra as above): an even rank of the first 2 * extra sends its
 * vector to the odd one next to it (*v = -1: it sits out), which adds it
 * (reading it into tmp); the others learn their participant number *v. */
tnt_status_t tnt__fold_in(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp, size_t count,
                          tnt_dtype_t dtype, tnt_op_t op, int extra, int *v,
                          const tnt__wait_ctx_t *w);

/* The exchanges of recursive doubling and of Rabenseifner's algorithm
 * (allreduce_rd.c, allreduce_rabenseifner.c), for tnt__allreduce_folded;
 * the hierarchy runs them directly for its step across hosts. */
tnt_status_t tnt__rd_exchanges(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp, size_t count,
                               tnt_dtype_t dtype, tnt_op_t op, int p, int extra, int v,
                               const tnt__ring_cfg_t *pieces, const tnt__wait_ctx_t *w);
tnt_status_t tnt__rabenseifner_exchanges(tnt__transport_t *t, uint8_t *buf, uint8_t *tmp,
                                         size_t count, tnt_dtype_t dtype, tnt_op_t op, int p,
                                         int extra, int v, const tnt__ring_cfg_t *pieces,
                                         const tnt__wait_ctx_t *w);

/* A position in a ring's sequence of transfers: step k and segment j of the
 * chunk of that step. Positions run in (k, j) order; k == steps is the end. */
typedef struct tnt__ring_pos {
  int k;
  size_t j;
} tnt__ring_pos_t;

/*
 * The same ring allreduce, run in the background of other work: started by
 * tnt__ring_start, moved on by tnt__ring_progress (which never waits) until
 * `done`, and released by tnt__ring_end in every case (which abandons the
 * transfers of a ring that did not finish). Hierarchical algorithms run the
 * ring of one block this way while their ranks reduce the next block and
 * broadcast the one before through shared memory.
 */
typedef struct tnt__ring_run {
  tnt__transport_t *t;
  uint8_t *data;
  const size_t *bounds;   /* chunk q is [bounds[q], bounds[q + 1]); NULL: tnt__slice's */
  size_t count, esz, seg; /* seg: elements per segment */
  tnt_dtype_t dtype;
  tnt_op_t op;
  int n, r, steps, depth, right, left;
  int done;
  uint8_t *tmp; /* `depth` segments of the reduce-scatter waiting to be reduced */
  tnt__xreq_t *rreq, *sreq;
  tnt__ring_pos_t *rpos;
  tnt__ring_pos_t rpost, rdone, spost;
  size_t nrpost, nrdone, nspost, nsdone;
} tnt__ring_run_t;

/* `bounds` (NULL: tnt__slice's chunks) must stay valid until the end;
 * with `scatter` set the ring stops after its reduce-scatter, which leaves
 * chunk r, reduced, on rank r. */
tnt_status_t tnt__ring_start(tnt__ring_run_t *g, tnt__transport_t *t, const tnt__ring_cfg_t *cfg,
                             void *buf, size_t count, tnt_dtype_t dtype, tnt_op_t op,
                             const size_t *bounds, int scatter);
/* Posts and completes what can be posted and completed now; *progress = 1
 * when anything moved. */
tnt_status_t tnt__ring_progress(tnt__ring_run_t *g, int *progress);
/* Moves the ring on until it is done, within w's deadline. */
tnt_status_t tnt__ring_wait(tnt__ring_run_t *g, const tnt__wait_ctx_t *w);
void tnt__ring_end(tnt__ring_run_t *g);

/* Splits `n` elements of `esz` bytes into `parts` slices whose starts are
 * cache-line aligned (for elements of 2 bytes and 1, multiples of 16
 * elements, as for float32); slice `i` is [*lo, *hi). */
void tnt__slice(size_t n, size_t esz, int parts, int i, size_t *lo, size_t *hi);
/* The starts of the `parts` slices of tnt__slice and then n: parts + 1
 * offsets, the block bounds of a reduce-scatter's default partition. */
void tnt__slice_bounds(size_t n, size_t esz, int parts, size_t *bounds);

/*
 * Reduce-scatter over every member of c, through the allreduce algorithm
 * that c chooses (or is forced to use) for the whole vector's size: its
 * reduce-scatter phase where it has one (ring, Rabenseifner's, shared
 * memory), else the allreduce itself. buf holds this rank's `count`
 * elements and is overwritten (scratch); block r of the result, elements
 * [bounds[r], bounds[r + 1]) (bounds: c->size + 1 offsets ending at count;
 * NULL: tnt__slice_bounds), is copied to recvbuf, which may be that range
 * of buf itself. With the tnt__slice partition the block is bitwise the
 * allreduce's result on those elements. *algorithm (may be NULL) names the
 * algorithm that ran.
 */
tnt_status_t tnt__reduce_scatter(tnt__comm_t *c, void *buf, void *recvbuf, size_t count,
                                 const size_t *bounds, tnt_dtype_t dtype, tnt_op_t op,
                                 const tnt__wait_ctx_t *w, const char **algorithm);

#endif
