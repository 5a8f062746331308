/*
 * Definitions and shape functions of Tarantella's TensorFlow ops (see
 * tnt_tf_ops.c for what they do and why they are defined this way).
 *
 * The collective ops are not marked stateful, on purpose: inside a
 * tf.function, TensorFlow 2 chains stateful ops that take no resource input
 * in program order, which would run every TntFusionStart after the whole
 * backward pass and remove the overlap of communication with backprop.
 * Stateless ops run as soon as their inputs are ready. What keeps
 * TensorFlow from merging two of them (common subexpression elimination)
 * is that every tensor has its own attribute values (tensor_id).
 *
 * The pipeline ops (TntPipeSend, TntPipeRecv, TntPipeFlush) are stateful
 * for that very chaining: a pipeline schedule is an order of transfers
 * that every stage must keep.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tf_ops_internal.h"

/* ops.h names these structs without typedefs, which only C++ accepts. */
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
typedef struct TF_DimensionHandle TF_DimensionHandle;
#include "tensorflow/c/ops.h"

/* Output 0 has the shape of input `input`. */
static void shape_of_input(TF_ShapeInferenceContext *ctx, int input, TF_Status *status) {
  TF_ShapeHandle *shape = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, input, shape, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, shape, status);
  TF_DeleteShapeHandle(shape);
}

static void same_shape_as_tensor(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  shape_of_input(ctx, 0, status);
}

/* Output `output` is a scalar. */
static void scalar_output(TF_ShapeInferenceContext *ctx, int output, TF_Status *status) {
  TF_ShapeHandle *scalar = TF_ShapeInferenceContextScalar(ctx);
  TF_ShapeInferenceContextSetOutput(ctx, output, scalar, status);
  TF_DeleteShapeHandle(scalar);
}

/* TntFusionStart, TntPipeSend, TntPipeFlush: the token is a scalar. */
static void token_shape(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  scalar_output(ctx, 0, status);
}

/* TntFusionFinish: the token must be a scalar; the output is shaped like
 * `like` (input 1): the tensor, or for a reduce-scatter set the part (a
 * vector of hi - lo elements), so that shapes stay static. The attribute
 * `count` is the number of elements of the op's `tensor` (start) or `like`
 * (finish): the part's for an allgather set's start and a reduce-scatter
 * set's finish, the whole tensor's otherwise (the kernel checks it against
 * the set). */
static void finish_shape(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  TF_ShapeHandle *token = TF_NewShapeHandle();
  TF_ShapeHandle *checked = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, token, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextWithRank(ctx, token, 0, checked, status);
  TF_DeleteShapeHandle(checked);
  TF_DeleteShapeHandle(token);
  if (TF_GetCode(status) == TF_OK) shape_of_input(ctx, 1, status);
}

typedef void (*shape_fn_t)(TF_ShapeInferenceContext *, TF_Status *);

/* TntPipeRecv: a tensor of the shape its input holds, of unknown shape
 * while the graph is built. */
static void unknown_shape(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  TF_ShapeHandle *shape = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, shape, status);
  TF_DeleteShapeHandle(shape);
  if (TF_GetCode(status) != TF_OK) return;
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

/* TntStamp: (tensor, a scalar). */
static void vector_of_unknown_size(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  TF_ShapeHandle *vector = TF_ShapeInferenceContextVectorFromSize(ctx, -1);
  TF_ShapeInferenceContextSetOutput(ctx, 0, vector, status);
  TF_DeleteShapeHandle(vector);
}

static void stamp_shape(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  shape_of_input(ctx, 0, status);
  if (TF_GetCode(status) == TF_OK) scalar_output(ctx, 1, status);
}

/* TntSpan: the tensor (input 1). */
static void span_shape(TF_ShapeInferenceContext *ctx, TF_Status *status) {
  shape_of_input(ctx, 1, status);
}

/* One op: NULL-terminated lists of input, output and attribute specs. */
static void define_op(const char *name, const char *const *inputs, const char *const *outputs,
                      const char *const *attrs, shape_fn_t shape_fn, bool stateful,
                      TF_Status *status) {
  TF_OpDefinitionBuilder *b = TF_NewOpDefinitionBuilder(name);
  /* Only for stateful ops: TensorFlow 2.21 marks an op stateful when this
   * is called at all, whatever the flag says. */
  if (stateful) TF_OpDefinitionBuilderSetIsStateful(b, true);
  for (const char *const *s = inputs; *s != NULL; ++s) TF_OpDefinitionBuilderAddInput(b, *s);
  for (const char *const *s = outputs; *s != NULL; ++s) TF_OpDefinitionBuilderAddOutput(b, *s);
  for (const char *const *s = attrs; *s != NULL; ++s) TF_OpDefinitionBuilderAddAttr(b, *s);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, shape_fn);
  TF_RegisterOpDefinition(b, status);
  if (TF_GetCode(status) != TF_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "cannot register the op %s: %s", name, TF_Message(status));
    TF_SetStatus(status, TF_GetCode(status), msg);
  }
}

static void define(const char *name, const char *const *inputs, const char *const *outputs,
                   const char *const *attrs, shape_fn_t shape_fn, TF_Status *status) {
  define_op(name, inputs, outputs, attrs, shape_fn, false, status);
}

void tnt_tf__register_op_defs(TF_Status *status) {
  static const char *const tensor_in[] = {"tensor: T", NULL};
  /* scale: the start multiplies the tensor by it, the finish divides the
   * result by it (float32 scalars; 1 leaves the data as it is). */
  static const char *const start_in[] = {"tensor: T", "scale: float", NULL};
  static const char *const token_out[] = {"token: int64", NULL};
  static const char *const finish_in[] = {"token: int64", "like: T", "scale: float", NULL};
  static const char *const tensor_out[] = {"output: T", NULL};
  static const char *const fusion_attrs[] = {TNT_TF_TYPE_ATTR, "fusion: int", "tensor_id: int >= 0",
                                             "count: int >= 0", NULL};
  static const char *const allreduce_attrs[] = {TNT_TF_TYPE_ATTR, "group: int",
                                                "op: {'sum', 'average', 'min', 'max'}", NULL};
  static const char *const broadcast_attrs[] = {TNT_TF_TYPE_ATTR, "group: int", "root: int >= 0",
                                                NULL};

  TF_SetStatus(status, TF_OK, "");
  define("TntFusionStart", start_in, token_out, fusion_attrs, token_shape, status);
  if (TF_GetCode(status) != TF_OK) return;
  define("TntFusionFinish", finish_in, tensor_out, fusion_attrs, finish_shape, status);
  if (TF_GetCode(status) != TF_OK) return;
  define("TntAllreduce", tensor_in, tensor_out, allreduce_attrs, same_shape_as_tensor, status);
  if (TF_GetCode(status) != TF_OK) return;
  define("TntBroadcast", tensor_in, tensor_out, broadcast_attrs, same_shape_as_tensor, status);
  if (TF_GetCode(status) != TF_OK) return;
  static const char *const allgatherv_attrs[] = {TNT_TF_TYPE_ATTR, "group: int",
                                                 "counts: list(int)", NULL};
  define("TntAllgatherv", tensor_in, tensor_out, allgatherv_attrs, vector_of_unknown_size,
         status);
  if (TF_GetCode(status) != TF_OK) return;

  static const char *const none[] = {NULL};
  static const char *const shape_in[] = {"shape: int64", NULL};
  static const char *const pipe_attrs[] = {TNT_TF_TYPE_ATTR, "group: int", "peer: int >= 0",
                                           "tag: int >= 0", NULL};
  static const char *const flush_attrs[] = {"group: int", NULL};
  define_op("TntPipeSend", tensor_in, token_out, pipe_attrs, token_shape, true, status);
  if (TF_GetCode(status) != TF_OK) return;
  define_op("TntPipeRecv", shape_in, tensor_out, pipe_attrs, unknown_shape, true, status);
  if (TF_GetCode(status) != TF_OK) return;
  define_op("TntPipeFlush", none, token_out, flush_attrs, token_shape, true, status);
  if (TF_GetCode(status) != TF_OK) return;

  static const char *const any_in[] = {"tensor: U", NULL};
  static const char *const stamp_out[] = {"output: U", "stamp: double", NULL};
  static const char *const span_in[] = {"stamp: double", "tensor: U", NULL};
  static const char *const any_out[] = {"output: U", NULL};
  static const char *const span_attrs[] = {"U: type", "label: string", NULL};
  define("TntStamp", any_in, stamp_out, span_attrs, stamp_shape, status);
  if (TF_GetCode(status) != TF_OK) return;
  define("TntSpan", span_in, any_out, span_attrs, span_shape, status);
}
