/*
 * Tarantella's TensorFlow op library (libtnt_tf_ops.so), loaded with
 * tf.load_op_library. Loading it registers the ops TntFusionStart,
 * TntFusionFinish, TntAllreduce and TntBroadcast; this header declares the
 * one function the library exports besides them.
 */
#ifndef TNT_TF_OPS_H
#define TNT_TF_OPS_H

#include "tnt/tnt.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Names the context whose groups and fusion sets the ops use, so that an op
 * which fails can quote tnt_context_error's explanation of the first
 * failure (libtnt has no call that finds the context of a group or of a
 * fusion set). Call it after tnt_context_create and with NULL before
 * tnt_context_destroy. Without it, errors still carry the status and point
 * at libtnt's log.
 */
__attribute__((visibility("default"))) void tnt_tf_ops_set_context(tnt_context_t *ctx);

#ifdef __cplusplus
}
#endif
#endif /* TNT_TF_OPS_H */
