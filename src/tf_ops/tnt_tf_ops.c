/*
 * Tarantella's TensorFlow ops, written in C against TensorFlow's C API, and
 * the kernels that run them on libtnt.
 *
 * Gradient averaging in the graph. For each gradient, the model builds
 *   token  = TntFusionStart(grad)             copies grad into its bucket
 *   result = TntFusionFinish(token, like=grad) waits for the bucket's result
 * TntFusionStart returns at once. Once every member of a fusion bucket has
 * started, libtnt's engine thread reduces the bucket while TensorFlow goes
 * on computing the remaining gradients: that is where communication
 * overlaps backprop. It requires the starts to run as soon as their
 * gradient exists, hence:
 *  - the ops are stateless: TensorFlow 2 chains stateful ops that have no
 *    resource input in program order inside a tf.function, which would run
 *    every start after the whole backward pass. Distinct attribute values
 *    (tensor_id) keep TensorFlow from merging the ops of two tensors;
 *  - the token (the tensor id, an int64 scalar) is the data dependency that
 *    orders a finish after its start, since nothing else does.
 *
 * Why TntFusionFinish blocks instead of being an asynchronous kernel. The
 * plan was TF_NewAsyncKernelBuilder: return at once and let libtnt's engine
 * thread call TensorFlow's done callback from tnt_fusion_finish_async. That
 * is not sound through the C API of TensorFlow 2.21. Its CAsyncOpKernel::
 * ComputeAsync takes the done callback by value (a std::function that lives
 * in its caller's frame) and passes the C kernel a pointer to it; the
 * object is destroyed as soon as the kernel returns, and the C API has no
 * call that copies or keeps it. Called later from another thread, it works
 * in eager mode only because the eager caller waits in that same frame; in
 * a tf.function it calls a destroyed std::function and crashes the process
 * (SIGSEGV in the executor's ProcessAsync done lambda). So the finish waits
 * in tnt_fusion_finish, on the TensorFlow thread that runs it.
 *
 * A waiting finish holds one of TensorFlow's inter-op threads. Finishes
 * that ran while gradients of earlier buckets were still missing could hold
 * every such thread and starve the backward pass until libtnt's timeout, so
 * graphs should make every finish depend on all the tokens (for example on
 * a tf.group of them): the starts still run as early as their gradients
 * allow, and a finish then only waits for communication already under way.
 *
 * TensorFlow's graph optimizers fold stateless ops whose inputs are all
 * constants: they run them once, while they optimize the graph, and the
 * graph then uses the result. Inside a tf.function the ops must therefore
 * never receive a value that TensorFlow can compute ahead of time, such as
 * a constant or tf.shape of a tensor whose shape is static; gradients,
 * function arguments and variable reads are fine.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tnt/tnt.h"
#include "tf_ops_internal.h"

/* The only file of the library that includes kernels.h (see
 * tf_ops_internal.h). */
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_tensor.h"

/* ------------------------------------------------------------- errors */

static void fail(TF_OpKernelContext *ctx, TF_Code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fails the running op with a formatted message. */
static void fail(TF_OpKernelContext *ctx, TF_Code code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  TF_Status *status = TF_NewStatus();
  TF_SetStatus(status, code, msg);
  TF_OpKernelContext_Failure(ctx, status);
  TF_DeleteStatus(status);
}

/* True when `status` is OK; otherwise fails the running op with it. */
static bool ok(TF_OpKernelContext *ctx, TF_Status *status) {
  if (TF_GetCode(status) == TF_OK) return true;
  TF_OpKernelContext_Failure(ctx, status);
  return false;
}

static TF_Code tf_code_of(tnt_status_t st) {
  switch (st) {
    case TNT_ERR_INVALID_ARG:
      return TF_INVALID_ARGUMENT;
    case TNT_ERR_NO_MEMORY:
      return TF_RESOURCE_EXHAUSTED;
    case TNT_ERR_TIMEOUT:
      return TF_DEADLINE_EXCEEDED;
    case TNT_ERR_STATE:
      return TF_FAILED_PRECONDITION;
    case TNT_ERR_MISMATCH: /* the ranks' programs disagree: fix the program, do not retry */
      return TF_FAILED_PRECONDITION;
    case TNT_ERR_MPI: /* the transport failed, as TensorFlow's collectives report lost peers */
      return TF_UNAVAILABLE;
    case TNT_ERR_UNSUPPORTED:
      return TF_UNIMPLEMENTED;
    case TNT_ERR_FAILED:
      return TF_ABORTED;
    case TNT_ERR_INTERNAL: /* reserved for bugs in libtnt */
      return TF_INTERNAL;
    default:
      return TF_UNKNOWN;
  }
}

/* Fails the running op with libtnt's status `st` and its explanation:
 * libtnt's reason for the failing call (tnt_last_error, which names the
 * context's first failure when that is the cause). A caller that made
 * other libtnt calls since the failing one (waiting for several sends)
 * gets the context's first failure instead. */
static void fail_tnt(TF_OpKernelContext *ctx, const tnt_group_t *g, const char *what,
                     tnt_status_t st) {
  const char *why = tnt_last_error();
  const char *first = NULL;
  if (*why != '\0') {
    fail(ctx, tf_code_of(st), "%s: %s: %s", what, tnt_status_string(st), why);
  } else if (tnt_context_error(tnt_group_context(g), &first) != TNT_OK) {
    fail(ctx, tf_code_of(st), "%s: %s; the communication context failed: %s", what,
         tnt_status_string(st), first);
  } else {
    fail(ctx, tf_code_of(st), "%s: %s (the [tnt] lines of the log say why)", what,
         tnt_status_string(st));
  }
}

/* ------------------------------------------------ kernel construction */

/* The libtnt dtype of TensorFlow's `type`; false for any other type. */
static bool tnt_dtype_of(TF_DataType type, tnt_dtype_t *dtype) {
  switch (type) {
    case TF_FLOAT:
      *dtype = TNT_FLOAT32;
      return true;
    case TF_DOUBLE:
      *dtype = TNT_FLOAT64;
      return true;
    case TF_HALF:
      *dtype = TNT_FLOAT16;
      return true;
    case TF_BFLOAT16:
      *dtype = TNT_BFLOAT16;
      return true;
    case TF_INT32:
      *dtype = TNT_INT32;
      return true;
    case TF_INT64:
      *dtype = TNT_INT64;
      return true;
    case TF_INT8:
      *dtype = TNT_INT8;
      return true;
    case TF_INT16:
      *dtype = TNT_INT16;
      return true;
    case TF_UINT8:
      *dtype = TNT_UINT8;
      return true;
    default:
      return false;
  }
}

static bool get_dtype(TF_OpKernelConstruction *ctx, tnt_dtype_t *dtype, TF_Status *status) {
  TF_DataType type = TF_FLOAT;
  TF_OpKernelConstruction_GetAttrType(ctx, "T", &type, status);
  if (TF_GetCode(status) != TF_OK) return false;
  if (!tnt_dtype_of(type, dtype)) {
    /* The op definitions admit only libtnt's types; this is a safety net. */
    TF_SetStatus(status, TF_INVALID_ARGUMENT, "T is not a type that libtnt can reduce");
    return false;
  }
  return true;
}

static bool get_int(TF_OpKernelConstruction *ctx, const char *name, int64_t *value,
                    TF_Status *status) {
  TF_OpKernelConstruction_GetAttrInt64(ctx, name, value, status);
  return TF_GetCode(status) == TF_OK;
}

/* Reads the attribute `op` ("sum", "average", ...) as a libtnt op. */
static bool get_reduce_op(TF_OpKernelConstruction *ctx, tnt_op_t *op, TF_Status *status) {
  int32_t list_size = 0, total_size = 0;
  char name[16] = {0};
  TF_OpKernelConstruction_GetAttrSize(ctx, "op", &list_size, &total_size, status);
  if (TF_GetCode(status) != TF_OK) return false;
  /* GetAttrString copies the bytes without a terminating NUL. */
  if (total_size > 0 && (size_t)total_size < sizeof name) {
    TF_OpKernelConstruction_GetAttrString(ctx, "op", name, sizeof name - 1, status);
    if (TF_GetCode(status) != TF_OK) return false;
    for (int k = 0; k < TNT_OP_COUNT; ++k) {
      if (strcmp(name, tnt_op_name((tnt_op_t)k)) == 0) {
        *op = (tnt_op_t)k;
        return true;
      }
    }
  }
  TF_SetStatus(status, TF_INVALID_ARGUMENT, "op must be sum, average, min or max");
  return false;
}

/* Attributes of TntFusionStart and TntFusionFinish. */
typedef struct fusion_kernel {
  int64_t fusion;    /* tnt_fusion_handle of the set */
  int64_t tensor_id; /* the tensor's id in the set */
  int64_t count;     /* elements of the op's `tensor` (start) or `like` (finish) */
  tnt_dtype_t dtype;
} fusion_kernel_t;

/* Attributes of TntAllreduce and TntBroadcast. */
typedef struct collective_kernel {
  int64_t group; /* tnt_group_handle */
  tnt_dtype_t dtype;
  tnt_op_t op;  /* TntAllreduce */
  int64_t root; /* TntBroadcast */
} collective_kernel_t;

/* TntAllgatherv: the elements each rank of the group contributes. */
typedef struct allgatherv_kernel {
  int64_t group;
  tnt_dtype_t dtype;
  int32_t nranks;
  size_t *counts, *displs; /* [nranks] each, one allocation */
} allgatherv_kernel_t;

/* Ends a create function: on failure, tells TensorFlow and frees `kernel`. */
static void *created(TF_OpKernelConstruction *ctx, void *kernel, TF_Status *status) {
  if (TF_GetCode(status) != TF_OK) {
    TF_OpKernelConstruction_Failure(ctx, status);
    free(kernel);
    kernel = NULL;
  }
  TF_DeleteStatus(status);
  return kernel;
}

static void *fusion_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  fusion_kernel_t *k = calloc(1, sizeof *k);
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else if (get_dtype(ctx, &k->dtype, status) && get_int(ctx, "fusion", &k->fusion, status) &&
             get_int(ctx, "tensor_id", &k->tensor_id, status)) {
    get_int(ctx, "count", &k->count, status);
  }
  return created(ctx, k, status);
}

static void *allreduce_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  collective_kernel_t *k = calloc(1, sizeof *k);
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else if (get_dtype(ctx, &k->dtype, status) && get_int(ctx, "group", &k->group, status)) {
    get_reduce_op(ctx, &k->op, status);
  }
  return created(ctx, k, status);
}

static void *broadcast_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  collective_kernel_t *k = calloc(1, sizeof *k);
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else if (get_dtype(ctx, &k->dtype, status) && get_int(ctx, "group", &k->group, status)) {
    get_int(ctx, "root", &k->root, status);
  }
  return created(ctx, k, status);
}

static void allgatherv_delete(void *kernel) {
  allgatherv_kernel_t *k = kernel;
  if (k != NULL) free(k->counts);
  free(k);
}

static void *allgatherv_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  allgatherv_kernel_t *k = calloc(1, sizeof *k);
  int32_t n = 0, total = 0;
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else if (get_dtype(ctx, &k->dtype, status) && get_int(ctx, "group", &k->group, status)) {
    TF_OpKernelConstruction_GetAttrSize(ctx, "counts", &n, &total, status);
  }
  int64_t *counts = NULL;
  if (TF_GetCode(status) == TF_OK) {
    counts = malloc((size_t)(n > 0 ? n : 1) * sizeof *counts);
    k->counts = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *k->counts);
    if (counts == NULL || k->counts == NULL) {
      TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      TF_OpKernelConstruction_GetAttrInt64List(ctx, "counts", counts, n, status);
    }
  }
  if (TF_GetCode(status) == TF_OK) {
    k->nranks = n;
    k->displs = k->counts + n;
    size_t at = 0;
    for (int32_t r = 0; r < n; ++r) {
      k->counts[r] = (size_t)counts[r];
      k->displs[r] = at;
      at += (size_t)counts[r];
    }
  }
  free(counts);
  if (TF_GetCode(status) != TF_OK && k != NULL) {
    free(k->counts);
    k->counts = NULL;
  }
  return created(ctx, k, status);
}

/* --------------------------------------------------------- helpers */

/* The fusion set of `k`, or NULL after failing the op: the set must exist
 * and know the tensor. */
static tnt_fusion_t *find_fusion(TF_OpKernelContext *ctx, const char *op,
                                 const fusion_kernel_t *k) {
  tnt_fusion_t *f = tnt_fusion_lookup(k->fusion);
  if (f == NULL) {
    fail(ctx, TF_FAILED_PRECONDITION,
         "%s: fusion set %lld does not exist: create the model's fusion set before running "
         "the graph",
         op, (long long)k->fusion);
    return NULL;
  }
  if (tnt_fusion_bucket_of(f, (uint64_t)k->tensor_id) < 0) {
    fail(ctx, TF_INVALID_ARGUMENT, "%s: tensor %lld is not in fusion set %lld", op,
         (long long)k->tensor_id, (long long)k->fusion);
    return NULL;
  }
  return f;
}

/* The group named by `handle`, or NULL after failing the op. */
static tnt_group_t *find_group(TF_OpKernelContext *ctx, const char *op, int64_t handle) {
  tnt_group_t *g = tnt_group_lookup(handle);
  if (g == NULL) {
    fail(ctx, TF_FAILED_PRECONDITION,
         "%s: group %lld does not exist: create the context and the group before running the "
         "graph",
         op, (long long)handle);
  }
  return g;
}

/* The op carries the count of elements it hands libtnt (start) or takes
 * from it (finish) and checks the tensor against it: a mismatch would make
 * libtnt read or write past the tensor. */
static bool check_count(TF_OpKernelContext *ctx, const char *op, const fusion_kernel_t *k,
                        const TF_Tensor *t) {
  const int64_t n = TF_TensorElementCount(t);
  if (n == k->count) return true;
  fail(ctx, TF_INVALID_ARGUMENT,
       "%s: tensor %lld has %lld elements, but its fusion set expects count=%lld", op,
       (long long)k->tensor_id, (long long)n, (long long)k->count);
  return false;
}

/* The count must be what the set reads (finish == false) or writes for
 * the tensor: the whole tensor, or its part in an allgather set's start
 * and a reduce-scatter set's finish. */
static bool check_set_count(TF_OpKernelContext *ctx, const char *op, const fusion_kernel_t *k,
                            const tnt_fusion_t *f, bool finish) {
  static const char *const modes[TNT_FUSION_MODE_COUNT] = {"allreduce", "reduce-scatter",
                                                           "allgather"};
  const uint64_t id = (uint64_t)k->tensor_id;
  const tnt_fusion_mode_t mode = tnt_fusion_mode(f);
  tnt_tensor_info_t info;
  size_t lo = 0, hi = 0;
  tnt_fusion_tensor(f, id, &info);
  const bool part = mode == (finish ? TNT_FUSION_MODE_REDUCE_SCATTER : TNT_FUSION_MODE_ALLGATHER);
  if (part && tnt_fusion_part(f, id, &lo, &hi) < 0) {
    fail(ctx, TF_INTERNAL, "%s: no part of tensor %lld", op, (long long)k->tensor_id);
    return false;
  }
  const size_t want = part ? hi - lo : info.count;
  if ((size_t)k->count == want) return true;
  fail(ctx, TF_INVALID_ARGUMENT,
       "%s: count=%lld, but the %s of tensor %lld in its %s fusion set has %zu elements", op,
       (long long)k->count, part ? "part" : "whole", (long long)k->tensor_id, modes[mode], want);
  return false;
}

/*
 * Output 0 with the shape of `like`: input `input` itself when TensorFlow
 * can hand its buffer over (nobody else uses it), else a new tensor.
 * *forwarded tells which. NULL after failing the op.
 */
static TF_Tensor *output_like(TF_OpKernelContext *ctx, const TF_Tensor *like, int input,
                              bool *forwarded) {
  int64_t small[8];
  const int ndims = TF_NumDims(like);
  int64_t *dims = ndims <= 8 ? small : malloc((size_t)ndims * sizeof *dims);
  if (dims == NULL) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  for (int d = 0; d < ndims; ++d) dims[d] = TF_Dim(like, d);
  TF_Status *status = TF_NewStatus();
  int from = -1;
  TF_Tensor *out = TF_ForwardInputOrAllocateOutput(ctx, &input, 1, 0, dims, ndims, &from, status);
  if (dims != small) free(dims);
  if (!ok(ctx, status)) {
    if (out != NULL) TF_DeleteTensor(out);
    out = NULL;
  }
  TF_DeleteStatus(status);
  *forwarded = from == input;
  return out;
}

static void delete_tensors(TF_Tensor *a, TF_Tensor *b, TF_Tensor *c) {
  if (a != NULL) TF_DeleteTensor(a);
  if (b != NULL) TF_DeleteTensor(b);
  if (c != NULL) TF_DeleteTensor(c);
}

/* Input `index` of a fusion kernel (0: the start's tensor, 1: the
 * finish's like), checked against the count the set expects, and the
 * kernel's fusion set; false after failing the op. The caller deletes
 * *tensor. */
static bool fusion_input(TF_OpKernelContext *ctx, const char *op, const fusion_kernel_t *k,
                         int index, TF_Tensor **tensor, tnt_fusion_t **f, TF_Status *status) {
  TF_GetInput(ctx, index, tensor, status);
  if (!ok(ctx, status) || !check_count(ctx, op, k, *tensor)) return false;
  return (*f = find_fusion(ctx, op, k)) != NULL && check_set_count(ctx, op, k, *f, index == 1);
}

/* The float32 scalar `scale` of a fusion op (input `index`), in *out; false
 * after failing the op. */
static bool scale_input(TF_OpKernelContext *ctx, const char *op, int index, double *out,
                        TF_Status *status) {
  TF_Tensor *t = NULL;
  TF_GetInput(ctx, index, &t, status);
  if (!ok(ctx, status)) return false;
  const bool scalar = TF_TensorType(t) == TF_FLOAT && TF_TensorElementCount(t) == 1;
  if (scalar) *out = *(const float *)TF_TensorData(t);
  TF_DeleteTensor(t);
  if (!scalar) fail(ctx, TF_INVALID_ARGUMENT, "%s: the scale must be a float32 scalar", op);
  return scalar;
}

/* Fails the op when libtnt's call on the kernel's tensor returned an error
 * `st`, naming the tensor. */
static void check_fusion_status(TF_OpKernelContext *ctx, const char *op, const fusion_kernel_t *k,
                                const tnt_fusion_t *f, tnt_status_t st) {
  if (st >= 0) return;
  char what[96];
  snprintf(what, sizeof what, "%s of tensor %lld", op, (long long)k->tensor_id);
  fail_tnt(ctx, tnt_fusion_group(f), what, st);
}

/* The libtnt call of a collective kernel: reads `in`, leaves the result in
 * `out`, which is `in` itself when `forwarded`. */
typedef tnt_status_t (*collective_fn)(const collective_kernel_t *k, tnt_group_t *g,
                                      const TF_Tensor *in, TF_Tensor *out, bool forwarded);

/*
 * What TntAllreduce and TntBroadcast share: input 0, the kernel's group,
 * an output shaped like the input (the input itself when TensorFlow hands
 * it over), then `run`, whose failure fails the op (libtnt checks the
 * root, and its message says what is wrong).
 */
static void collective_compute(TF_OpKernelContext *ctx, const char *op,
                               const collective_kernel_t *k, collective_fn run) {
  TF_Status *status = TF_NewStatus();
  TF_Tensor *in = NULL, *out = NULL;
  tnt_group_t *g = NULL;
  bool forwarded = false;
  TF_GetInput(ctx, 0, &in, status);
  if (!ok(ctx, status)) goto out;
  if ((g = find_group(ctx, op, k->group)) == NULL) goto out;
  if ((out = output_like(ctx, in, 0, &forwarded)) == NULL) goto out;
  tnt_status_t st = run(k, g, in, out, forwarded);
  if (st < 0) fail_tnt(ctx, g, op, st);
out:
  delete_tensors(in, out, NULL);
  TF_DeleteStatus(status);
}

/* ---------------------------------------------------------- kernels */

/* TntFusionStart: (tensor, scale) -> token. Copies the tensor times scale
 * into its bucket (done when tnt_fusion_start_scaled returns) and returns
 * at once. For an allgather set, `tensor` is the part (tnt_fusion_part). */
static void fusion_start_compute(void *kernel, TF_OpKernelContext *ctx) {
  static const char op[] = "TntFusionStart";
  const fusion_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *tensor = NULL, *token = NULL;
  tnt_fusion_t *f = NULL;
  double scale = 1.0;
  if (!fusion_input(ctx, op, k, 0, &tensor, &f, status)) goto out;
  if (!scale_input(ctx, op, 1, &scale, status)) goto out;
  /* The token first: an op that fails after starting would leave the
   * tensor started with nobody to finish it. */
  token = TF_AllocateOutput(ctx, 0, TF_INT64, NULL, 0, sizeof(int64_t), status);
  if (!ok(ctx, status)) goto out;
  *(int64_t *)TF_TensorData(token) = k->tensor_id;
  check_fusion_status(ctx, op, k, f,
                      tnt_fusion_start_scaled(f, (uint64_t)k->tensor_id, TF_TensorData(tensor),
                                              scale));
out:
  delete_tensors(tensor, token, NULL);
  TF_DeleteStatus(status);
}

/* TntFusionFinish: (token, like, scale) -> the reduced tensor divided by
 * scale, shaped like `like`. Waits for the tensor's bucket (see the top of
 * the file for why). For a reduce-scatter set, `like` has the part's
 * elements (tnt_fusion_part) and the output is the part. */
static void fusion_finish_compute(void *kernel, TF_OpKernelContext *ctx) {
  static const char op[] = "TntFusionFinish";
  const fusion_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *token = NULL, *like = NULL, *out = NULL;
  tnt_fusion_t *f = NULL;
  bool forwarded = false;
  TF_GetInput(ctx, 0, &token, status);
  if (!ok(ctx, status)) goto out;
  /* The token ties the finish to its start; one of another tensor means
   * the graph was wired wrongly. */
  if (TF_TensorElementCount(token) != 1 || *(const int64_t *)TF_TensorData(token) != k->tensor_id) {
    fail(ctx, TF_INVALID_ARGUMENT,
         "%s: the token input is not the token of tensor %lld: pass the output of the "
         "TntFusionStart of the same tensor",
         op, (long long)k->tensor_id);
    goto out;
  }
  double divisor = 1.0;
  if (!fusion_input(ctx, op, k, 1, &like, &f, status)) goto out;
  if (!scale_input(ctx, op, 2, &divisor, status)) goto out;
  /* `like` is usually the gradient that the start has already copied, so
   * its buffer can often hold the result. */
  if ((out = output_like(ctx, like, 1, &forwarded)) == NULL) goto out;
  check_fusion_status(ctx, op, k, f,
                      tnt_fusion_finish_scaled(f, (uint64_t)k->tensor_id, TF_TensorData(out),
                                               divisor, -1.0));
out:
  delete_tensors(token, like, out);
  TF_DeleteStatus(status);
}

static tnt_status_t run_allreduce(const collective_kernel_t *k, tnt_group_t *g, const TF_Tensor *in,
                                  TF_Tensor *out, bool forwarded) {
  (void)forwarded;
  return tnt_allreduce(g, TF_TensorData(in), TF_TensorData(out), (size_t)TF_TensorElementCount(in),
                       k->dtype, k->op);
}

/* TntAllreduce: tensor -> its reduction over the group, in place when the
 * input's buffer can be reused. */
static void allreduce_compute(void *kernel, TF_OpKernelContext *ctx) {
  collective_compute(ctx, "TntAllreduce", kernel, run_allreduce);
}

/* The input is never written: the broadcast runs on the output, a copy
 * unless the input was handed over. */
static tnt_status_t run_broadcast(const collective_kernel_t *k, tnt_group_t *g, const TF_Tensor *in,
                                  TF_Tensor *out, bool forwarded) {
  if (!forwarded && TF_TensorByteSize(in) > 0) {
    memcpy(TF_TensorData(out), TF_TensorData(in), TF_TensorByteSize(in));
  }
  return tnt_broadcast(g, TF_TensorData(out), (size_t)TF_TensorElementCount(in), k->dtype,
                       (int)k->root);
}

/* TntBroadcast: tensor -> the root's tensor. */
static void broadcast_compute(void *kernel, TF_OpKernelContext *ctx) {
  collective_compute(ctx, "TntBroadcast", kernel, run_broadcast);
}

/* ---------------------------------------------------- pipeline transfers */

/*
 * Pipeline parallelism moves activations forward and their gradients
 * backward between neighbouring stages, micro-batch by micro-batch:
 *   TntPipeSend(tensor) -> token   posts the send and returns at once
 *   TntPipeRecv(shape)  -> tensor  waits for the peer's tensor
 *   TntPipeFlush()      -> token   waits until every posted send is done
 * Unlike the fusion ops these are stateful: a pipeline schedule is an order
 * of sends and receives that every stage must follow exactly (else two
 * stages wait for each other), and TensorFlow keeps stateful ops in program
 * order inside a tf.function.
 *
 * A send never blocks, so that neighbours that send to each other at the
 * same time (a forward one way, a backward the other, as 1F1B does) both go
 * on to their receives. The op keeps its input tensor, whose buffer libtnt
 * reads until the send is done; TensorFlow does not reuse a buffer that
 * someone else still references.
 *
 * The tag names the transfer: 2 * micro-batch + 0 for activations, + 1 for
 * their gradients; the peer is a rank of the pipeline's group, which is the
 * stage index. Both are only used to say what a failed wait waited for.
 */

typedef struct pipe_kernel {
  int64_t group;
  int64_t peer;
  int64_t tag;
  tnt_dtype_t dtype;
} pipe_kernel_t;

/* A posted send and the tensor it reads. */
typedef struct pending_send {
  tnt_request_t *req;
  TF_Tensor *tensor;
  int64_t group, peer, tag;
  struct pending_send *next;
} pending_send_t;

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static pending_send_t *pending_sends;

static void *pipe_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  pipe_kernel_t *k = calloc(1, sizeof *k);
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else if (get_dtype(ctx, &k->dtype, status) && get_int(ctx, "group", &k->group, status) &&
             get_int(ctx, "peer", &k->peer, status)) {
    get_int(ctx, "tag", &k->tag, status);
  }
  return created(ctx, k, status);
}

static void *pipe_flush_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  pipe_kernel_t *k = calloc(1, sizeof *k);
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    get_int(ctx, "group", &k->group, status);
  }
  return created(ctx, k, status);
}

/* Seconds of CLOCK_MONOTONIC, the clock of tnt_timeline_span. */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "the activations of micro-batch 3" or "the gradients of micro-batch 3". */
static void describe_transfer(char *buf, size_t len, int64_t tag) {
  snprintf(buf, len, "the %s of micro-batch %lld", tag % 2 == 0 ? "activations" : "gradients",
           (long long)(tag / 2));
}

/* The group of a pipe kernel with its peer checked; NULL after failing. */
static tnt_group_t *pipe_group(TF_OpKernelContext *ctx, const char *op, const pipe_kernel_t *k) {
  tnt_group_t *g = find_group(ctx, op, k->group);
  if (g != NULL && (k->peer >= tnt_group_size(g) || k->peer == tnt_group_rank(g))) {
    fail(ctx, TF_INVALID_ARGUMENT, "%s: peer %lld is not another rank of group %lld (%d ranks)",
         op, (long long)k->peer, (long long)k->group, tnt_group_size(g));
    return NULL;
  }
  return g;
}

/* Frees the sends of `group` (every group when 0) that are done, or all of
 * them with `wait`, waiting for each; returns the first failure, described
 * in `what`. */
static tnt_status_t complete_sends(int64_t group, bool wait, char *what, size_t len) {
  tnt_status_t first = TNT_OK;
  pthread_mutex_lock(&pending_lock);
  pending_send_t **link = &pending_sends;
  while (*link != NULL) {
    pending_send_t *p = *link;
    if (group != 0 && p->group != group) {
      link = &p->next;
      continue;
    }
    tnt_status_t st = wait ? tnt_request_wait(p->req, -1.0) : tnt_request_test(p->req);
    if (st == TNT_IN_PROGRESS) {
      link = &p->next;
      continue;
    }
    if (st < 0 && first == TNT_OK) {
      first = st;
      char transfer[64];
      describe_transfer(transfer, sizeof transfer, p->tag);
      snprintf(what, len, "sending %s to stage %lld", transfer, (long long)p->peer);
    }
    if (st == TNT_ERR_TIMEOUT) {
      link = &p->next; /* still libtnt's: keep its tensor */
      continue;
    }
    *link = p->next;
    tnt_request_free(p->req);
    TF_DeleteTensor(p->tensor);
    free(p);
  }
  pthread_mutex_unlock(&pending_lock);
  return first;
}

/* TntPipeSend: tensor -> token. Posts the send and returns. */
static void pipe_send_compute(void *kernel, TF_OpKernelContext *ctx) {
  static const char op[] = "TntPipeSend";
  const pipe_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *tensor = NULL, *token = NULL;
  pending_send_t *p = NULL;
  char what[160];
  tnt_group_t *g = pipe_group(ctx, op, k);
  if (g == NULL) goto out;
  token = TF_AllocateOutput(ctx, 0, TF_INT64, NULL, 0, sizeof(int64_t), status);
  if (!ok(ctx, status)) goto out;
  *(int64_t *)TF_TensorData(token) = k->tag;
  TF_GetInput(ctx, 0, &tensor, status);
  if (!ok(ctx, status)) goto out;
  tnt_status_t st = complete_sends(k->group, false, what, sizeof what);
  if (st < 0) {
    fail_tnt(ctx, g, what, st);
    goto out;
  }
  if ((p = calloc(1, sizeof *p)) == NULL) {
    fail(ctx, TF_RESOURCE_EXHAUSTED, "%s: out of memory", op);
    goto out;
  }
  if (tnt_timeline_enabled()) {
    char instant[96];
    snprintf(instant, sizeof instant, "send %s %lld",
             k->tag % 2 == 0 ? "activations" : "gradients", (long long)(k->tag / 2));
    tnt_timeline_event(instant, "pipeline", 'i');
  }
  st = tnt_isend(g, TF_TensorData(tensor), (size_t)TF_TensorElementCount(tensor), k->dtype,
                 (int)k->peer, (int)k->tag, &p->req);
  if (st < 0) {
    char transfer[64];
    describe_transfer(transfer, sizeof transfer, k->tag);
    snprintf(what, sizeof what, "%s: sending %s to stage %lld", op, transfer, (long long)k->peer);
    fail_tnt(ctx, g, what, st);
    free(p);
    goto out;
  }
  p->tensor = tensor; /* kept until the send is done */
  tensor = NULL;
  p->group = k->group;
  p->peer = k->peer;
  p->tag = k->tag;
  pthread_mutex_lock(&pending_lock);
  p->next = pending_sends;
  pending_sends = p;
  pthread_mutex_unlock(&pending_lock);
out:
  delete_tensors(tensor, token, NULL);
  TF_DeleteStatus(status);
}

/* TntPipeRecv: shape -> the peer's tensor of that shape. */
static void pipe_recv_compute(void *kernel, TF_OpKernelContext *ctx) {
  static const char op[] = "TntPipeRecv";
  const pipe_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *shape = NULL, *out = NULL;
  int64_t dims[16];
  tnt_group_t *g = pipe_group(ctx, op, k);
  if (g == NULL) goto out;
  TF_GetInput(ctx, 0, &shape, status);
  if (!ok(ctx, status)) goto out;
  const int64_t ndims = TF_TensorElementCount(shape);
  if (TF_NumDims(shape) != 1 || ndims > 16) {
    fail(ctx, TF_INVALID_ARGUMENT, "%s: shape must be a vector of at most 16 dimensions", op);
    goto out;
  }
  int64_t count = 1;
  for (int64_t d = 0; d < ndims; ++d) {
    dims[d] = ((const int64_t *)TF_TensorData(shape))[d];
    if (dims[d] < 0) {
      fail(ctx, TF_INVALID_ARGUMENT, "%s: dimension %lld of the shape is negative", op,
           (long long)d);
      goto out;
    }
    count *= dims[d];
  }
  const size_t bytes = (size_t)count * tnt_dtype_size(k->dtype);
  out = TF_AllocateOutput(ctx, 0, TF_ExpectedOutputDataType(ctx, 0), dims, (int)ndims, bytes,
                          status);
  if (!ok(ctx, status)) goto out;
  const double begin = now_s();
  tnt_status_t st = tnt_recv(g, TF_TensorData(out), (size_t)count, k->dtype, (int)k->peer,
                             (int)k->tag);
  if (tnt_timeline_enabled()) {
    char span[96];
    snprintf(span, sizeof span, "recv %s %lld", k->tag % 2 == 0 ? "activations" : "gradients",
             (long long)(k->tag / 2));
    tnt_timeline_span(span, "pipeline", begin, now_s());
  }
  if (st < 0) {
    char transfer[64], what[160];
    describe_transfer(transfer, sizeof transfer, k->tag);
    snprintf(what, sizeof what, "%s: waiting for %s from stage %lld", op, transfer,
             (long long)k->peer);
    fail_tnt(ctx, g, what, st);
  }
out:
  delete_tensors(shape, out, NULL);
  TF_DeleteStatus(status);
}

/* TntPipeFlush: -> token. Waits until every send of the group is done. */
static void pipe_flush_compute(void *kernel, TF_OpKernelContext *ctx) {
  static const char op[] = "TntPipeFlush";
  const pipe_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *token = NULL;
  char what[160];
  tnt_group_t *g = find_group(ctx, op, k->group);
  if (g == NULL) goto out;
  token = TF_AllocateOutput(ctx, 0, TF_INT64, NULL, 0, sizeof(int64_t), status);
  if (!ok(ctx, status)) goto out;
  *(int64_t *)TF_TensorData(token) = 0;
  tnt_status_t st = complete_sends(k->group, true, what, sizeof what);
  if (st < 0) {
    char full[200];
    snprintf(full, sizeof full, "%s: %s", op, what);
    fail_tnt(ctx, g, full, st);
  }
out:
  delete_tensors(token, NULL, NULL);
  TF_DeleteStatus(status);
}

/* ------------------------------------------------------- timeline spans */

/*
 * Spans of work that TensorFlow runs on several threads (a stage's forward
 * of a micro-batch), for the timeline:
 *   (tensor, stamp) = TntStamp(tensor)        stamp: when tensor was ready
 *   tensor          = TntSpan(stamp, tensor)  a span from stamp to now
 * Both pass their tensor through (the same buffer), so that the graph
 * places them on the data path of the work they measure. The attribute
 * `label` names the span, and keeps TensorFlow from merging two of them.
 */

typedef struct span_kernel {
  char name[96];
} span_kernel_t;

static void *span_create(TF_OpKernelConstruction *ctx) {
  TF_Status *status = TF_NewStatus();
  span_kernel_t *k = calloc(1, sizeof *k);
  int32_t list_size = 0, total_size = 0;
  if (k == NULL) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    TF_OpKernelConstruction_GetAttrSize(ctx, "label", &list_size, &total_size, status);
    if (TF_GetCode(status) == TF_OK) {
      if (total_size < 0 || (size_t)total_size >= sizeof k->name) {
        TF_SetStatus(status, TF_INVALID_ARGUMENT, "label must be shorter than 96 bytes");
      } else {
        /* GetAttrString copies the bytes without a terminating NUL. */
        TF_OpKernelConstruction_GetAttrString(ctx, "label", k->name, sizeof k->name - 1, status);
      }
    }
  }
  return created(ctx, k, status);
}

/* Output `output` is input `input`, the same buffer. */
static void pass_through(TF_OpKernelContext *ctx, int input, int output) {
  TF_Status *status = TF_NewStatus();
  TF_Tensor *in = NULL;
  TF_GetInput(ctx, input, &in, status);
  if (ok(ctx, status)) {
    TF_SetOutput(ctx, output, in, status);
    ok(ctx, status);
  }
  if (in != NULL) TF_DeleteTensor(in);
  TF_DeleteStatus(status);
}

static void stamp_compute(void *kernel, TF_OpKernelContext *ctx) {
  (void)kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *stamp = TF_AllocateOutput(ctx, 1, TF_DOUBLE, NULL, 0, sizeof(double), status);
  if (ok(ctx, status)) {
    *(double *)TF_TensorData(stamp) = now_s();
    pass_through(ctx, 0, 0);
  }
  if (stamp != NULL) TF_DeleteTensor(stamp);
  TF_DeleteStatus(status);
}

static void span_compute(void *kernel, TF_OpKernelContext *ctx) {
  const span_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *stamp = NULL;
  TF_GetInput(ctx, 0, &stamp, status);
  if (ok(ctx, status)) {
    if (tnt_timeline_enabled()) {
      tnt_timeline_span(k->name, "pipeline", *(const double *)TF_TensorData(stamp), now_s());
    }
    pass_through(ctx, 1, 0);
  }
  if (stamp != NULL) TF_DeleteTensor(stamp);
  TF_DeleteStatus(status);
}

/* TntAllgatherv: this rank's part (a vector of counts[rank] elements) ->
 * every rank's part, in rank order (a vector of sum(counts) elements). */
static void allgatherv_compute(void *kernel, TF_OpKernelContext *ctx) {
  static const char op[] = "TntAllgatherv";
  const allgatherv_kernel_t *k = kernel;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *in = NULL, *out = NULL;
  tnt_group_t *g = NULL;
  TF_GetInput(ctx, 0, &in, status);
  if (!ok(ctx, status)) goto out;
  if ((g = find_group(ctx, op, k->group)) == NULL) goto out;
  const int rank = tnt_group_rank(g);
  if (k->nranks != tnt_group_size(g)) {
    fail(ctx, TF_INVALID_ARGUMENT, "%s: counts has %d entries, but group %lld has %d ranks", op,
         (int)k->nranks, (long long)k->group, tnt_group_size(g));
    goto out;
  }
  if ((size_t)TF_TensorElementCount(in) != k->counts[rank]) {
    fail(ctx, TF_INVALID_ARGUMENT, "%s: rank %d contributes %lld elements, but counts says %zu",
         op, rank, (long long)TF_TensorElementCount(in), k->counts[rank]);
    goto out;
  }
  const int64_t total = (int64_t)(k->displs[k->nranks - 1] + k->counts[k->nranks - 1]);
  out = TF_AllocateOutput(ctx, 0, TF_ExpectedOutputDataType(ctx, 0), &total, 1,
                          (size_t)total * tnt_dtype_size(k->dtype), status);
  if (!ok(ctx, status)) goto out;
  tnt_status_t st = tnt_allgatherv(g, TF_TensorData(in), k->counts[rank], TF_TensorData(out),
                                   k->counts, k->displs, k->dtype);
  if (st < 0) fail_tnt(ctx, g, op, st);
out:
  delete_tensors(in, out, NULL);
  TF_DeleteStatus(status);
}

/* ---------------------------------------------------------- registration */

/*
 * Registers the ops and their CPU kernels when the library is loaded:
 * tf.load_op_library collects the ops registered while it loads the
 * library and builds their Python wrappers from them. A library opened by
 * other means first (ctypes) registers them outside that window, and
 * tf.load_op_library then finds no op in it, so it must come first.
 * Each kernel serves every T of its op, so no type constraint is needed.
 */
__attribute__((constructor)) static void register_ops(void) {
  static const struct {
    const char *op;
    void *(*create)(TF_OpKernelConstruction *);
    void (*compute)(void *, TF_OpKernelContext *);
    void (*destroy)(void *);
  } kernels[] = {
      {"TntFusionStart", fusion_create, fusion_start_compute, free},
      {"TntFusionFinish", fusion_create, fusion_finish_compute, free},
      {"TntAllreduce", allreduce_create, allreduce_compute, free},
      {"TntBroadcast", broadcast_create, broadcast_compute, free},
      {"TntAllgatherv", allgatherv_create, allgatherv_compute, allgatherv_delete},
      {"TntPipeSend", pipe_create, pipe_send_compute, free},
      {"TntPipeRecv", pipe_create, pipe_recv_compute, free},
      {"TntPipeFlush", pipe_flush_create, pipe_flush_compute, free},
      {"TntStamp", span_create, stamp_compute, free},
      {"TntSpan", span_create, span_compute, free},
  };
  TF_Status *status = TF_NewStatus();
  tnt_tf__register_op_defs(status);
  for (size_t i = 0; TF_GetCode(status) == TF_OK && i < sizeof kernels / sizeof *kernels; ++i) {
    TF_KernelBuilder *b =
        TF_NewKernelBuilder(kernels[i].op, "CPU", kernels[i].create, kernels[i].compute,
                            kernels[i].destroy);
    TF_RegisterKernelBuilder(kernels[i].op, b, status);
  }
  if (TF_GetCode(status) != TF_OK) {
    fprintf(stderr, "[tnt] ERROR: cannot register Tarantella's TensorFlow ops: %s\n",
            TF_Message(status));
  }
  TF_DeleteStatus(status);
}
