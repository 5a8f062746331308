/*
 * What the fusion runtime (fusion.c) uses of collectives.c: an allreduce
 * with its own label, for a fusion bucket the timeline names.
 */
#ifndef TNT_API_COLLECTIVES_H
#define TNT_API_COLLECTIVES_H

#include "tnt/tnt.h"

/* tnt_iallreduce labelled `label` (NULL: "allreduce of N bytes") for
 * fusion bucket `bucket` (-1: none); req == NULL runs it blocking. Does
 * not touch the error contract: callers are inside a public call. */
tnt_status_t tnt__allreduce_submit(tnt_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                   tnt_dtype_t dtype, tnt_op_t op, const char *label, long bucket,
                                   tnt_request_t **req);

#endif
