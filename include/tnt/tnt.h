/*
 * Tarantella communication core (libtnt): the one public header.
 *
 * libtnt averages gradients across processes. It runs over MPI: a context
 * owns a duplicate of MPI_COMM_WORLD and one progress thread (the engine)
 * that executes every collective in submission order. Callers either block
 * (tnt_allreduce, ...) or get a request (tnt_iallreduce, ...) that they test
 * or wait on with a timeout.
 *
 * Conventions
 *  - Every function returns a tnt_status_t: 0 is success, a positive value
 *    means "still in progress", a negative value is an error, so `st < 0`
 *    always means failure. tnt_status_string() names every code.
 *  - Every call that returns a tnt_status_t clears the calling thread's
 *    error message when it starts, and a call that fails leaves one:
 *    tnt_last_error() says why this call failed (what is wrong, what to
 *    change), and is "" after a call that succeeded. Queries that cannot
 *    fail (names, sizes, group getters, tnt_context_error) leave it alone.
 *  - An error raised on the engine thread (a timeout, an MPI failure) is
 *    stored in the context; the failing request returns it, and every later
 *    call on the same context returns TNT_ERR_FAILED (with the first
 *    failure in its message). tnt_context_error() gives the message that
 *    explains the first failure.
 *  - Only the functions declared here (marked TNT_API) are exported from
 *    libtnt.so; everything else is built with hidden visibility.
 *  - Collectives are matched by order: every member of a group must submit
 *    the same collectives on that group in the same order.
 *  - Buffers passed to a non-blocking call belong to libtnt until the
 *    request has completed (test says done, or wait returned). Buffers passed
 *    to a blocking call are only used during the call.
 *  - Handles (contexts, groups, requests, fusion sets) are opaque; the
 *    function that creates one names the function that frees it.
 */
#ifndef TNT_TNT_H
#define TNT_TNT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TNT_VERSION_MAJOR 0
#define TNT_VERSION_MINOR 1
#define TNT_VERSION_PATCH 0
#define TNT_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------- status */

/* Marks the exported functions: libtnt is built with -fvisibility=hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define TNT_API __attribute__((visibility("default")))
#else
#define TNT_API
#endif

typedef enum tnt_status {
  TNT_OK = 0,
  TNT_IN_PROGRESS = 1,
  TNT_ERR_INVALID_ARG = -1, /* a parameter is out of range; nothing was done */
  TNT_ERR_NO_MEMORY = -2,   /* an allocation failed */
  TNT_ERR_MPI = -3,         /* the MPI library reported an error */
  TNT_ERR_TIMEOUT = -4,     /* a peer did not answer within the timeout */
  TNT_ERR_FAILED = -5,      /* an earlier operation failed; the context is unusable */
  TNT_ERR_UNSUPPORTED = -6, /* valid request that this build or MPI cannot serve */
  TNT_ERR_STATE = -7,       /* call out of order (e.g. finish before start) */
  TNT_ERR_INTERNAL = -8,    /* a bug in libtnt: please report it */
  TNT_ERR_MISMATCH = -9     /* ranks called different collectives, or the same with
                               different arguments, at the same point */
} tnt_status_t;

/* A static, human-readable name for `status` ("TNT_ERR_TIMEOUT: ..."). */
TNT_API const char *tnt_status_string(tnt_status_t status);

/* ------------------------------------------------------- types and ops */

typedef enum tnt_dtype {
  TNT_FLOAT32 = 0,
  TNT_FLOAT64 = 1,
  TNT_FLOAT16 = 2,  /* IEEE 754 binary16; reductions accumulate in float */
  TNT_BFLOAT16 = 3, /* bfloat16; reductions accumulate in float */
  TNT_INT32 = 4,
  TNT_INT64 = 5,
  TNT_INT8 = 6,  /* integer sums wrap around in the type's width, as NumPy's */
  TNT_INT16 = 7,
  TNT_UINT8 = 8,
  TNT_DTYPE_COUNT
} tnt_dtype_t;

typedef enum tnt_op {
  TNT_SUM = 0,
  TNT_AVERAGE = 1, /* sum divided by the group size (integer division for ints) */
  TNT_MIN = 2,
  TNT_MAX = 3,
  TNT_OP_COUNT
} tnt_op_t;

/* Size in bytes of one element of `dtype`, or 0 for an invalid dtype. */
TNT_API size_t tnt_dtype_size(tnt_dtype_t dtype);
/* Static lower-case name ("float32"), or "invalid". */
TNT_API const char *tnt_dtype_name(tnt_dtype_t dtype);
/* Static lower-case name ("sum"), or "invalid". */
TNT_API const char *tnt_op_name(tnt_op_t op);

/* --------------------------------------------------------------- context */

typedef struct tnt_context tnt_context_t;
typedef struct tnt_group tnt_group_t;
typedef struct tnt_request tnt_request_t;

typedef struct tnt_config {
  /* Default timeout in seconds for every wait; <= 0 takes TNT_TIMEOUT_S from
   * the environment, or 30 s when that is unset. */
  double timeout_s;
} tnt_config_t;

/*
 * Creates a context over MPI_COMM_WORLD. Initializes MPI (asking for
 * MPI_THREAD_MULTIPLE) only if nobody has; tnt_context_destroy finalizes
 * only what this call initialized. `config` may be NULL for defaults.
 * On success *out is owned by the caller; free it with tnt_context_destroy.
 */
TNT_API tnt_status_t tnt_context_create(const tnt_config_t *config, tnt_context_t **out);

/* Stops the engine, frees every group and the context, and finalizes MPI if
 * tnt_context_create initialized it and the context has not failed (MPI
 * cannot be finalized safely with operations still pending after a
 * failure; such a process should call tnt_context_abort). After a failure
 * it makes no MPI call that waits for the peers (they may be dead or
 * stuck), so it returns at once. NULL is a no-op. */
TNT_API tnt_status_t tnt_context_destroy(tnt_context_t *ctx);

/* Ends every process of the job (MPI_Abort) with `exit_code`. For callers
 * that cannot continue after a failure; libtnt never calls it by itself. */
TNT_API void tnt_context_abort(tnt_context_t *ctx, int exit_code);

/* The group of all processes; owned by the context, never freed by callers. */
TNT_API tnt_group_t *tnt_context_world(tnt_context_t *ctx);

/* The default timeout of `ctx`, in seconds. */
TNT_API double tnt_context_timeout(const tnt_context_t *ctx);

/* TNT_OK while the context is healthy, else the status of its first failure;
 * `message` (may be NULL) receives a static-lifetime-of-ctx explanation. */
TNT_API tnt_status_t tnt_context_error(const tnt_context_t *ctx, const char **message);

/* Why the calling thread's last call that returns a tnt_status_t failed
 * (what is wrong and what to change), or "" when it succeeded. Valid until
 * the thread's next such call. A failure of the context (raised on the
 * engine thread) appears here for the call that reported it, and stays in
 * tnt_context_error. */
TNT_API const char *tnt_last_error(void);

/* ----------------------------------------------------------------- groups */

/*
 * Creates the group of the world ranks `ranks[0..n-1]` (distinct, in the
 * order that defines group ranks). Collective over the listed ranks only;
 * every listed rank passes the same list. The group is owned by the context
 * and freed with it, or earlier by tnt_group_destroy.
 */
TNT_API tnt_status_t tnt_group_create(tnt_context_t *ctx, const int *ranks, int n,
                                      tnt_group_t **out);
TNT_API tnt_status_t tnt_group_destroy(tnt_group_t *group);

/* Group queries; each returns -1 for a NULL group. */
TNT_API int tnt_group_rank(const tnt_group_t *group); /* rank within the group */
TNT_API int tnt_group_size(const tnt_group_t *group);
TNT_API int tnt_group_local_rank(const tnt_group_t *group); /* rank among members on this host */
TNT_API int tnt_group_local_size(const tnt_group_t *group); /* members on this host */
TNT_API int tnt_group_num_hosts(const tnt_group_t *group);  /* distinct hosts in the group */

/* A process-wide number for `group` (> 0), for code that can only carry
 * integers (graph attributes, Python); tnt_group_lookup turns it back into
 * the group, or NULL once the group (or its context) is destroyed. */
TNT_API int64_t tnt_group_handle(const tnt_group_t *group);
TNT_API tnt_group_t *tnt_group_lookup(int64_t handle);

/* The context that `group` belongs to (NULL for a NULL group). */
TNT_API tnt_context_t *tnt_group_context(const tnt_group_t *group);

/* ----------------------------------------------------------- collectives */

/*
 * Blocking collectives. They wait at most the context timeout; on expiry
 * they return TNT_ERR_TIMEOUT and the log names the peer that was missing
 * (with the "mpi" algorithm it can only say that a peer was missing, since
 * MPI_Allreduce does not tell which).
 * `sendbuf == recvbuf` is allowed (in place) for allreduce.
 */
TNT_API tnt_status_t tnt_allreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                   tnt_dtype_t dtype, tnt_op_t op);
TNT_API tnt_status_t tnt_broadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype,
                                   int root);
/* recvbuf holds size * count elements, rank r's contribution at r * count. */
TNT_API tnt_status_t tnt_allgather(tnt_group_t *g, const void *sendbuf, size_t count, void *recvbuf,
                                   tnt_dtype_t dtype);
/* Rank r contributes counts[r] elements, placed at recvbuf + displs[r]
 * elements. counts and displs have one entry per group rank. */
TNT_API tnt_status_t tnt_allgatherv(tnt_group_t *g, const void *sendbuf, size_t count,
                                    void *recvbuf, const size_t *counts, const size_t *displs,
                                    tnt_dtype_t dtype);
/* Reduce-scatter with equal blocks (MPI_Reduce_scatter_block): sendbuf
 * holds size * count elements, and rank r receives in recvbuf the `count`
 * elements [r count, (r + 1) count) of the reduction (op) of every rank's
 * sendbuf. recvbuf may lie inside sendbuf. It runs the allreduce algorithm
 * that the group chooses for size * count elements (tnt_allreduce_algorithm,
 * and TNT_ALLREDUCE_ALGORITHM forces it): the pipelined ring's, recursive
 * halving's and shared memory's first phase, so that each rank sends about
 * (size - 1) / size of the vector; the others (recursive doubling for small
 * vectors, the hierarchy across hosts, MPI's) run the allreduce and keep
 * the block. Every rank's block is combined in one fixed order. */
TNT_API tnt_status_t tnt_reduce_scatter(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                        size_t count, tnt_dtype_t dtype, tnt_op_t op);
/* The same with counts[r] elements for rank r (MPI_Reduce_scatter): sendbuf
 * holds their sum, block r starts after the blocks of ranks 0..r-1, and
 * recvbuf receives counts[rank]. counts has one entry per group rank and
 * must be the same on every rank. With the blocks of a fusion set's parts
 * (tnt_fusion_mode_t) every block is bitwise the allreduce's elements. */
TNT_API tnt_status_t tnt_reduce_scatterv(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                         const size_t *counts, tnt_dtype_t dtype, tnt_op_t op);
TNT_API tnt_status_t tnt_barrier(tnt_group_t *g);

/* Non-blocking versions: *req is owned by the caller; free it with
 * tnt_request_free once it has completed (or at any time: an unfinished
 * request is released by the engine when it completes). */
TNT_API tnt_status_t tnt_iallreduce(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                    size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                    tnt_request_t **req);
TNT_API tnt_status_t tnt_ibroadcast(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype,
                                    int root, tnt_request_t **req);
TNT_API tnt_status_t tnt_iallgather(tnt_group_t *g, const void *sendbuf, size_t count,
                                    void *recvbuf, tnt_dtype_t dtype, tnt_request_t **req);
/* counts and displs are copied; they need not outlive the call. */
TNT_API tnt_status_t tnt_iallgatherv(tnt_group_t *g, const void *sendbuf, size_t count,
                                     void *recvbuf, const size_t *counts, const size_t *displs,
                                     tnt_dtype_t dtype, tnt_request_t **req);
TNT_API tnt_status_t tnt_ireduce_scatter(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                         size_t count, tnt_dtype_t dtype, tnt_op_t op,
                                         tnt_request_t **req);
/* counts are copied; they need not outlive the call. */
TNT_API tnt_status_t tnt_ireduce_scatterv(tnt_group_t *g, const void *sendbuf, void *recvbuf,
                                          const size_t *counts, tnt_dtype_t dtype, tnt_op_t op,
                                          tnt_request_t **req);
TNT_API tnt_status_t tnt_ibarrier(tnt_group_t *g, tnt_request_t **req);

/*
 * Tagged point-to-point messages between group ranks, matched by
 * (source, tag) in order, independent of collectives. 0 <= tag < 32768.
 * The receiver's count must equal the sender's.
 */
TNT_API tnt_status_t tnt_send(tnt_group_t *g, const void *buf, size_t count, tnt_dtype_t dtype,
                              int dst, int tag);
TNT_API tnt_status_t tnt_recv(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int src,
                              int tag);
TNT_API tnt_status_t tnt_isend(tnt_group_t *g, const void *buf, size_t count, tnt_dtype_t dtype,
                               int dst, int tag, tnt_request_t **req);
TNT_API tnt_status_t tnt_irecv(tnt_group_t *g, void *buf, size_t count, tnt_dtype_t dtype, int src,
                               int tag, tnt_request_t **req);

/* ---------------------------------------------------------------- requests */

/* TNT_OK when done, TNT_IN_PROGRESS while running, < 0 when it failed. */
TNT_API tnt_status_t tnt_request_test(tnt_request_t *req);
/* Waits at most `timeout_s` seconds (< 0: the context default). Returns
 * TNT_ERR_TIMEOUT if the request is still running then; it stays valid. */
TNT_API tnt_status_t tnt_request_wait(tnt_request_t *req, double timeout_s);
/* Releases the caller's reference. NULL is a no-op. */
TNT_API void tnt_request_free(tnt_request_t *req);

/* ----------------------------------------------------------- tensor fusion */

typedef struct tnt_fusion tnt_fusion_t;

typedef struct tnt_tensor_info {
  uint64_t id;  /* caller's name for the tensor, unique in the set */
  size_t count; /* elements */
  tnt_dtype_t dtype;
} tnt_tensor_info_t;

/* The order in which a fusion set's tensors fill its buckets. */
typedef enum tnt_fusion_order {
  TNT_FUSION_ORDER_LIST = 0,      /* the order of the list given to tnt_fusion_create */
  TNT_FUSION_ORDER_READINESS = 1, /* the order in which the master started them in round 0 */
  TNT_FUSION_ORDER_COUNT
} tnt_fusion_order_t;

/* When a fusion set's buckets are reduced. */
typedef enum tnt_fusion_overlap {
  TNT_FUSION_OVERLAP_ON = 0,   /* each as soon as its tensors have started */
  TNT_FUSION_OVERLAP_OFF = 1,  /* all once every tensor of the set has started */
  TNT_FUSION_OVERLAP_TUNE = 2, /* the faster of the two in the first rounds */
  TNT_FUSION_OVERLAP_COUNT
} tnt_fusion_overlap_t;

/* What a fusion set does with each bucket. Rank r's part of a bucket of
 * `count` elements on n ranks is elements [r s, (r + 1) s) of it, cut to
 * [0, count), where s is count / n rounded up to a multiple of 16 (8 for
 * 8-byte dtypes); the part of a tensor is the piece of its bucket's part
 * that falls in the tensor, one contiguous element range (tnt_fusion_part;
 * possibly empty). Parts depend only on the plan and the group, so sets
 * created with the same list, threshold and group have the same parts in
 * every mode and with every wire dtype. */
typedef enum tnt_fusion_mode {
  /* Every rank gets every tensor reduced (the default). */
  TNT_FUSION_MODE_ALLREDUCE = 0,
  /* Starts take whole tensors; each bucket is reduce-scattered, and
   * finishes give only the tensor's part, reduced: bitwise the elements
   * that TNT_FUSION_MODE_ALLREDUCE gives there, with the same moves on
   * the wire as the allreduce's first half. */
  TNT_FUSION_MODE_REDUCE_SCATTER = 1,
  /* Starts take only the tensor's part (hi - lo elements); each bucket is
   * allgathered (no arithmetic, op is ignored), and finishes give whole
   * tensors, every rank's part in its place. */
  TNT_FUSION_MODE_ALLGATHER = 2,
  TNT_FUSION_MODE_COUNT
} tnt_fusion_mode_t;

/*
 * How a fusion set is planned and reduced. Options with only `size` set
 * (TNT_FUSION_OPTIONS_INIT), or a NULL pointer, mean: one tensor per bucket,
 * TNT_SUM, no compression.
 */
typedef struct tnt_fusion_options {
  /* sizeof(tnt_fusion_options_t) as the caller was compiled: libtnt reads
   * only that many bytes, so a caller built against an older tnt.h (a
   * shorter struct) gets the defaults for the fields it lacks, and a size
   * of 0 or larger than libtnt's struct is TNT_ERR_INVALID_ARG. */
  size_t size;
  /* A bucket closes once it holds this many bytes of its tensors (counted
   * in their own dtype); 0: one tensor per bucket. */
  size_t threshold_bytes;
  tnt_op_t op;
  /* The dtype that float32 tensors travel in: TNT_FLOAT32 (the default)
   * sends them as they are; TNT_FLOAT16 or TNT_BFLOAT16 sends them in 16
   * bits (rounded to nearest even), and every step of the reduction adds
   * in float32 and rounds its result to the wire dtype. Other dtypes always
   * travel as they are. float16 holds magnitudes up to 65504 (larger sums
   * become infinities) with 11 significant bits; bfloat16 has float32's
   * range with 8. The result is bitwise identical on every rank. */
  tnt_dtype_t wire_dtype;
  /* 1: the set tunes its threshold itself and threshold_bytes is ignored.
   * After three rounds of warm-up it tries 32, 128, 512, 2048 and 8192 KiB,
   * taking turns twice over (two rounds each), and keeps the one with which
   * the master's fastest round was fastest; one more round takes the master's choice to every
   * rank, so every rank uses the same plan (14 rounds in all). The master
   * logs the choice. While tuning, a tensor's start for the next round
   * waits until every tensor has finished the current one (as in a
   * training loop); the plan, and so tnt_fusion_num_buckets and
   * tnt_fusion_bucket_of, change between those rounds. */
  int tune_threshold;
  /* TNT_FUSION_ORDER_READINESS: the master notes the order in which the
   * tensors are started in the first round; the second round carries that
   * order to every rank (one more allreduce before its first bucket), and
   * from the third round on, buckets are filled in that order, on every
   * rank alike. Buckets then close in the order their tensors become
   * ready, so no bucket waits for a tensor that comes much later. As with
   * tune_threshold, a tensor's start for the next round waits until every
   * tensor has finished the current one during those first rounds. The
   * plan depends on the master's timing, so two runs may fuse differently
   * (and round differently); TNT_FUSION_ORDER_LIST keeps them identical. */
  tnt_fusion_order_t order;
  /* TNT_FUSION_OVERLAP_ON (the default) reduces each bucket as soon as its
   * tensors have started, so communication overlaps the computation that
   * gives the later tensors. TNT_FUSION_OVERLAP_OFF submits the round's
   * buckets only once every tensor of the set has started it: where ranks
   * have no core to spare (CPU training with a rank per core), the
   * communication's own CPU work then no longer slows that computation
   * down. Every tensor must be started before any is finished, and a
   * tensor's start for the next round waits until every tensor has finished
   * the current one. TNT_FUSION_OVERLAP_TUNE times both in the first rounds,
   * like tune_threshold (with it, every threshold with each), and keeps the
   * master's faster one on every rank (8 rounds alone, 24 with
   * tune_threshold); the master logs the choice. */
  tnt_fusion_overlap_t overlap;
  /* TNT_FUSION_MODE_ALLREDUCE (the default), _REDUCE_SCATTER or _ALLGATHER.
   * The other two modes need a plan fixed at creation: tune_threshold = 1
   * or TNT_FUSION_ORDER_READINESS with them is TNT_ERR_INVALID_ARG. In
   * them a set holds, per bucket, only its part between rounds (reduce-
   * scatter) or nothing (allgather); a bucket's whole vector is allocated
   * when its first tensor starts a round and freed once its reduce-scatter
   * is done (at the first finish that follows) or once its last tensor has
   * finished (allgather). */
  tnt_fusion_mode_t mode;
} tnt_fusion_options_t;

/* Options with every field at its default; set fields after it:
 *   tnt_fusion_options_t opt = TNT_FUSION_OPTIONS_INIT;  opt.op = TNT_AVERAGE; */
#define TNT_FUSION_OPTIONS_INIT {.size = sizeof(tnt_fusion_options_t)}

/*
 * Plans fusion buckets for `tensors[0..n-1]`, given in the order in which
 * they are expected to become ready (backprop order), as `options` say
 * (NULL: the defaults). Buckets hold one dtype each. Every member of `g`
 * must pass the same list and options (TNT_ERR_MISMATCH otherwise). The
 * set is owned by the caller; free it with tnt_fusion_destroy.
 */
TNT_API tnt_status_t tnt_fusion_create(tnt_group_t *g, const tnt_tensor_info_t *tensors, size_t n,
                                       const tnt_fusion_options_t *options, tnt_fusion_t **out);
TNT_API tnt_status_t tnt_fusion_destroy(tnt_fusion_t *f);

/* Copies tensor `id` into its bucket: the whole tensor, or in
 * TNT_FUSION_MODE_ALLGATHER its part (the hi - lo elements that
 * tnt_fusion_part names). Once every member of a bucket has started, the
 * bucket's allreduce (reduce-scatter, allgather) is submitted (buckets
 * always in plan order, so ranks may start tensors in any order). Returns
 * at once; TNT_ERR_STATE when the tensor was started already in this round
 * (a round ends when every member of the bucket has finished). */
TNT_API tnt_status_t tnt_fusion_start(tnt_fusion_t *f, uint64_t id, const void *data);
/* Waits (at most `timeout_s`, < 0: context default) for the bucket of `id`
 * and copies the result to `out`: the whole tensor, or in
 * TNT_FUSION_MODE_REDUCE_SCATTER its part (hi - lo elements). After every
 * member of a bucket has finished, the bucket is ready for the next round
 * of starts. */
TNT_API tnt_status_t tnt_fusion_finish(tnt_fusion_t *f, uint64_t id, void *out, double timeout_s);

/* As tnt_fusion_start and tnt_fusion_finish, scaling the data where libtnt
 * copies it anyway: start multiplies every element by `scale` on its way
 * into the bucket, finish divides every element of the result by `divisor`
 * on its way out (Horovod's prescale and postscale). Both compute in the
 * tensor's dtype as TensorFlow's Mul and RealDiv do, after converting the
 * factor to it (float16 and bfloat16 in float, rounded once; float32
 * tensors that travel in 16 bits are scaled in float32 before narrowing
 * and after widening), so `g * n` and `sum / total` give the same bits as
 * TensorFlow would. Integer tensors multiply and divide as integers (a
 * divisor of 0 is TNT_ERR_INVALID_ARG). */
TNT_API tnt_status_t tnt_fusion_start_scaled(tnt_fusion_t *f, uint64_t id, const void *data,
                                             double scale);
TNT_API tnt_status_t tnt_fusion_finish_scaled(tnt_fusion_t *f, uint64_t id, void *out,
                                              double divisor, double timeout_s);

/* A process-wide number for `f` (> 0), so that code which can only carry
 * integers (graph attributes) can name it; tnt_fusion_lookup turns it back
 * into the set, or NULL once the set is destroyed. */
TNT_API int64_t tnt_fusion_handle(const tnt_fusion_t *f);
TNT_API tnt_fusion_t *tnt_fusion_lookup(int64_t handle);

/* The group that `f` reduces over (NULL for a NULL set). */
TNT_API tnt_group_t *tnt_fusion_group(const tnt_fusion_t *f);

TNT_API size_t tnt_fusion_num_buckets(const tnt_fusion_t *f);
/* The threshold in bytes of the plan in use (the tuned one once a tuning
 * set has decided); 0 for NULL. */
TNT_API size_t tnt_fusion_threshold(const tnt_fusion_t *f);
/* 1 when the plan in use reduces buckets while tensors are still to start
 * (overlap on, or the tuned choice once a set that tunes it has decided);
 * 0 for overlap off and for NULL. */
TNT_API int tnt_fusion_overlaps(const tnt_fusion_t *f);
/* Bucket index of tensor `id`, or -1 when unknown. */
TNT_API long tnt_fusion_bucket_of(const tnt_fusion_t *f, uint64_t id);
/* 1 when tensor `id` is in the set, with its entry of the list copied to
 * `info` (may be NULL); 0 when it is not (or f is NULL). */
TNT_API int tnt_fusion_tensor(const tnt_fusion_t *f, uint64_t id, tnt_tensor_info_t *info);
/* The mode of `f` (TNT_FUSION_MODE_ALLREDUCE for NULL). */
TNT_API tnt_fusion_mode_t tnt_fusion_mode(const tnt_fusion_t *f);
/* This rank's part of tensor `id`: its elements [*lo, *hi) (hi == lo when
 * it has none), in every mode (see tnt_fusion_mode_t). TNT_ERR_INVALID_ARG
 * for an unknown id or a NULL argument. */
TNT_API tnt_status_t tnt_fusion_part(const tnt_fusion_t *f, uint64_t id, size_t *lo, size_t *hi);

/* ---------------------------------------------------------------- settings */

/*
 * Every TNT_* environment setting of Tarantella (libtnt's, the Keras
 * layer's and the launcher's) is declared once in libtnt's registry, with
 * its kind, default, accepted values and a line of help. The environment is
 * read in one place: tnt_settings_load, which tnt_context_create calls, so
 * a context (and the groups created in it) uses the settings in force when
 * it was created. A bad value fails that call with TNT_ERR_INVALID_ARG and
 * a message (tnt_last_error) that names the setting and lists what it
 * accepts; the setting keeps its default meanwhile.
 */

typedef enum tnt_setting_source {
  TNT_SETTING_DEFAULT = 0,      /* unset or empty */
  TNT_SETTING_ENVIRONMENT = 1,  /* from the environment */
  TNT_SETTING_COMMAND_LINE = 2, /* from an option of the `tarantella` launcher */
} tnt_setting_source_t;

typedef struct tnt_setting_info {
  const char *name;          /* "TNT_TIMEOUT_S" */
  const char *kind;          /* "switch", "number", "integer", "choice" or "text" */
  const char *default_value; /* as a user would write it */
  const char *words;         /* "|"-separated words it takes, or NULL */
  const char *user;          /* who reads it: "libtnt", "python" or "launcher" */
  const char *help;          /* one line */
  const char *value;         /* the value in force, canonical ("on", "30", "auto", a path) */
  const char *error;         /* why the environment's value was rejected, or NULL */
  tnt_setting_source_t source;
} tnt_setting_info_t;

/* Reads every setting from the process environment. TNT_ERR_INVALID_ARG
 * (with tnt_last_error naming the first bad one) when a value is invalid. */
TNT_API tnt_status_t tnt_settings_load(void);
/* The number of settings. */
TNT_API size_t tnt_settings_count(void);
/* Describes the `index`-th setting (0 <= index < tnt_settings_count()) and
 * its value as of the last load (the process environment when none ran
 * yet). The strings stay valid until the next tnt_settings_load.
 * TNT_ERR_INVALID_ARG past the last one or for a NULL info. */
TNT_API tnt_status_t tnt_setting_info(size_t index, tnt_setting_info_t *info);

/* ---------------------------------------------------------------- timeline */

/*
 * With the setting TNT_TIMELINE=PATH when tnt_context_create runs,
 * every rank writes a Chrome trace (the JSON array format of the Trace
 * Event Format, for ui.perfetto.dev or chrome://tracing) of its
 * communication: each fusion tensor started, each bucket's allreduce on the
 * thread that ran it, the time callers waited in tnt_fusion_finish, and
 * every other collective. With more than one rank, rank R writes PATH with
 * ".rank<R>" before its extension (trace.json -> trace.rank1.json). pid is
 * the rank; tids are named threads ("main", "progress", "caller N"). The
 * file is written at least once a second and closed (a valid JSON array)
 * when the context is destroyed; a crashed run leaves a file the viewers
 * still read.
 */

/* 1 while this process writes a timeline, else 0. */
TNT_API int tnt_timeline_enabled(void);

/* Adds an event of the calling thread to the timeline (a no-op without
 * one): phase 'B' begins a span called `name`, 'E' ends the thread's
 * innermost span (same name), 'i' marks an instant. `category` may be NULL
 * ("user"). TNT_ERR_INVALID_ARG for a NULL name or another phase. */
TNT_API tnt_status_t tnt_timeline_event(const char *name, const char *category, char phase);

/* Adds a span of the calling thread that began at `begin` and ended at
 * `end`, in seconds of CLOCK_MONOTONIC (as clock_gettime gives them), for
 * spans whose two ends are seen by different threads. A no-op without a
 * timeline; TNT_ERR_INVALID_ARG for a NULL name or end < begin. */
TNT_API tnt_status_t tnt_timeline_span(const char *name, const char *category, double begin,
                                       double end);

/* -------------------------------------------------------------- algorithms */

/* Name of the allreduce algorithm that `g` uses for `bytes` ("shm", "ring",
 * "rd", "mpi", "hier"). Each group chooses its algorithms once, when it is created
 * (the world group: in tnt_context_create): by message size, or as the
 * settings TNT_ALLREDUCE_ALGORITHM, TNT_BROADCAST_ALGORITHM and
 * TNT_ALLGATHER_ALGORITHM of the last tnt_settings_load say (a name, or
 * "auto"). Changing them later does not change existing groups. */
TNT_API const char *tnt_allreduce_algorithm(const tnt_group_t *g, size_t bytes);

/* The `index`-th (from 0) algorithm that libtnt has for `collective`
 * ("allreduce", "broadcast" or "allgather"): static strings with its name
 * (the value of the environment variable that forces it) and a one-line
 * description. TNT_ERR_INVALID_ARG past the last one or for another
 * collective. */
TNT_API tnt_status_t tnt_algorithm_info(const char *collective, int index, const char **name,
                                        const char **description);

#ifdef __cplusplus
}
#endif
#endif /* TNT_TNT_H */
