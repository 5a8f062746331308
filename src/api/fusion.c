/*
 * The public tnt_fusion_* calls: each checks its arguments (an invalid call
 * does nothing and says why) and calls the fusion runtime (src/fusion/
 * runtime.h), which keeps the set's buckets and rounds.
 */
#include <string.h>

#include "api/api.h"
#include "fusion/runtime.h"
#include "util/handles.h"

/* The context of `f`, for the end of its calls (NULL for a NULL set). */
static const tnt_context_t *ctx_of(const tnt_fusion_t *f) {
  return f == NULL ? NULL : f->g->ctx;
}

/* The index of tensor `id`, or -1 after logging that `call` got an id
 * that is not in the set. */
static long find_tensor(const tnt_fusion_t *f, uint64_t id, const char *call) {
  const long i = tnt__fusion_plan_find(&f->plan, id);
  if (i < 0) {
    TNT_LOG_ERROR("%s: tensor id %llu is not in the fusion set", call, (unsigned long long)id);
  }
  return i;
}

static tnt_status_t fusion_create(tnt_group_t *g, const tnt_tensor_info_t *tensors, size_t n,
                                  const tnt_fusion_options_t *options, tnt_fusion_t **out) {
  static const char call[] = "tnt_fusion_create";
  /* Only the first `size` bytes are the caller's: a caller built against
   * an older tnt.h has a shorter struct, whose missing fields keep their
   * zero defaults. */
  tnt_fusion_options_t opt = {.size = sizeof opt};
  if (options != NULL) {
    if (options->size < sizeof options->size || options->size > sizeof opt) {
      return tnt__api_invalid(call,
                              "options.size is %zu: set it to sizeof(tnt_fusion_options_t) (%zu "
                              "in this libtnt), e.g. with TNT_FUSION_OPTIONS_INIT; a larger size "
                              "means a tnt.h newer than this libtnt",
                              options->size, sizeof opt);
    }
    memcpy(&opt, options, options->size);
  }
  if (g == NULL || out == NULL || (tensors == NULL && n > 0)) {
    return tnt__api_invalid(call, "need a group, a tensor list and an output");
  }
  if (!tnt__op_valid(opt.op)) return tnt__api_invalid(call, "invalid op %d", (int)opt.op);
  if (opt.wire_dtype != TNT_FLOAT32 && opt.wire_dtype != TNT_FLOAT16 &&
      opt.wire_dtype != TNT_BFLOAT16) {
    return tnt__api_invalid(call,
                            "wire_dtype %d (%s): float32 tensors travel as float32 (no "
                            "compression), float16 or bfloat16",
                            (int)opt.wire_dtype, tnt_dtype_name(opt.wire_dtype));
  }
  if ((unsigned)opt.order >= TNT_FUSION_ORDER_COUNT) {
    return tnt__api_invalid(call, "order %d: TNT_FUSION_ORDER_LIST or TNT_FUSION_ORDER_READINESS",
                            (int)opt.order);
  }
  if (opt.tune_threshold != 0 && opt.tune_threshold != 1) {
    return tnt__api_invalid(call, "tune_threshold %d: 0 (use threshold_bytes) or 1 (tune it)",
                            opt.tune_threshold);
  }
  if ((unsigned)opt.overlap >= TNT_FUSION_OVERLAP_COUNT) {
    return tnt__api_invalid(call,
                            "overlap %d: TNT_FUSION_OVERLAP_ON, TNT_FUSION_OVERLAP_OFF or "
                            "TNT_FUSION_OVERLAP_TUNE",
                            (int)opt.overlap);
  }
  if ((unsigned)opt.mode >= TNT_FUSION_MODE_COUNT) {
    return tnt__api_invalid(call,
                            "mode %d: TNT_FUSION_MODE_ALLREDUCE, TNT_FUSION_MODE_REDUCE_SCATTER "
                            "or TNT_FUSION_MODE_ALLGATHER",
                            (int)opt.mode);
  }
  /* A part is a fixed function of the plan: the plan may not change. */
  if (opt.mode != TNT_FUSION_MODE_ALLREDUCE &&
      (opt.tune_threshold || opt.order == TNT_FUSION_ORDER_READINESS)) {
    return tnt__api_invalid(
        call,
        "the %s mode needs a plan fixed at creation, whose parts stay the "
        "same: set tune_threshold to 0 and order to TNT_FUSION_ORDER_LIST "
        "(they are %d and %s)",
        opt.mode == TNT_FUSION_MODE_REDUCE_SCATTER ? "reduce-scatter" : "allgather",
        opt.tune_threshold, opt.order == TNT_FUSION_ORDER_LIST ? "list" : "readiness");
  }
  return tnt__fusion_create(g, tnt__context_engine(g->ctx), g->comm, tensors, n, &opt, out);
}

tnt_status_t tnt_fusion_create(tnt_group_t *g, const tnt_tensor_info_t *tensors, size_t n,
                               const tnt_fusion_options_t *options, tnt_fusion_t **out) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_create", g != NULL ? g->ctx : NULL,
                      fusion_create(g, tensors, n, options, out));
}

tnt_status_t tnt_fusion_destroy(tnt_fusion_t *f) {
  tnt__error_clear();
  if (f == NULL) return TNT_OK;
  const tnt_context_t *ctx = ctx_of(f);
  return tnt__api_end("tnt_fusion_destroy", ctx, tnt__fusion_free(f));
}

tnt_fusion_t *tnt_fusion_lookup(int64_t handle) {
  return tnt__handle_get(TNT__HANDLE_FUSION, handle);
}

int64_t tnt_fusion_handle(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->handle;
}

static tnt_status_t fusion_start(tnt_fusion_t *f, uint64_t id, const void *data, double scale) {
  static const char call[] = "tnt_fusion_start";
  if (f == NULL) return tnt__api_invalid(call, "the fusion set is NULL");
  const long i = find_tensor(f, id, call);
  if (i < 0) return TNT_ERR_INVALID_ARG;
  size_t lo = 0, hi = f->tensors[i].count;
  if (f->opt.mode == TNT_FUSION_MODE_ALLGATHER) tnt__fusion_part(f, (size_t)i, &lo, &hi);
  if (data == NULL && hi > lo) {
    return tnt__api_invalid(call, "tensor %llu: data is NULL with count %zu > 0",
                            (unsigned long long)id, hi - lo);
  }
  return tnt__fusion_start(f, (size_t)i, data, scale, call);
}

tnt_status_t tnt_fusion_start(tnt_fusion_t *f, uint64_t id, const void *data) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_start", ctx_of(f), fusion_start(f, id, data, 1.0));
}

tnt_status_t tnt_fusion_start_scaled(tnt_fusion_t *f, uint64_t id, const void *data,
                                     double scale) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_start_scaled", ctx_of(f), fusion_start(f, id, data, scale));
}

static tnt_status_t fusion_finish(tnt_fusion_t *f, uint64_t id, void *out, double divisor,
                                  double timeout_s) {
  static const char call[] = "tnt_fusion_finish";
  if (f == NULL) return tnt__api_invalid(call, "the fusion set is NULL");
  const long i = find_tensor(f, id, call);
  if (i < 0) return TNT_ERR_INVALID_ARG;
  const tnt_tensor_info_t *t = &f->tensors[i];
  if (tnt__dtype_is_integer(t->dtype) && (long long)divisor == 0) {
    return tnt__api_invalid(call, "tensor %llu: an integer tensor cannot be divided by %g",
                            (unsigned long long)id, divisor);
  }
  size_t lo = 0, hi = t->count;
  if (f->opt.mode == TNT_FUSION_MODE_REDUCE_SCATTER) tnt__fusion_part(f, (size_t)i, &lo, &hi);
  if (out == NULL && hi > lo) {
    return tnt__api_invalid(call, "tensor %llu: out is NULL with count %zu > 0",
                            (unsigned long long)id, hi - lo);
  }
  return tnt__fusion_finish(f, (size_t)i, out, divisor, timeout_s, call);
}

tnt_status_t tnt_fusion_finish(tnt_fusion_t *f, uint64_t id, void *out, double timeout_s) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_finish", ctx_of(f), fusion_finish(f, id, out, 1.0, timeout_s));
}

tnt_status_t tnt_fusion_finish_scaled(tnt_fusion_t *f, uint64_t id, void *out, double divisor,
                                      double timeout_s) {
  tnt__error_clear();
  return tnt__api_end("tnt_fusion_finish_scaled", ctx_of(f),
                      fusion_finish(f, id, out, divisor, timeout_s));
}

tnt_group_t *tnt_fusion_group(const tnt_fusion_t *f) {
  return f == NULL ? NULL : f->g;
}

size_t tnt_fusion_num_buckets(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->plan.nbuckets;
}

size_t tnt_fusion_threshold(const tnt_fusion_t *f) {
  return f == NULL ? 0 : f->threshold;
}

int tnt_fusion_overlaps(const tnt_fusion_t *f) {
  return f != NULL && !f->hold;
}

long tnt_fusion_bucket_of(const tnt_fusion_t *f, uint64_t id) {
  if (f == NULL) return -1;
  long i = tnt__fusion_plan_find(&f->plan, id);
  return i < 0 ? -1 : (long)f->plan.bucket_of[i];
}

int tnt_fusion_tensor(const tnt_fusion_t *f, uint64_t id, tnt_tensor_info_t *info) {
  if (f == NULL) return 0;
  long i = tnt__fusion_plan_find(&f->plan, id);
  if (i < 0) return 0;
  if (info != NULL) *info = f->tensors[i];
  return 1;
}

tnt_fusion_mode_t tnt_fusion_mode(const tnt_fusion_t *f) {
  return f == NULL ? TNT_FUSION_MODE_ALLREDUCE : f->opt.mode;
}

tnt_status_t tnt_fusion_part(const tnt_fusion_t *f, uint64_t id, size_t *lo, size_t *hi) {
  static const char call[] = "tnt_fusion_part";
  tnt__error_clear();
  if (f == NULL || lo == NULL || hi == NULL) {
    return tnt__api_invalid(call, "need a fusion set, lo and hi");
  }
  const long i = find_tensor(f, id, call);
  if (i >= 0) tnt__fusion_part(f, (size_t)i, lo, hi);
  return tnt__api_end(call, ctx_of(f), i < 0 ? TNT_ERR_INVALID_ARG : TNT_OK);
}
