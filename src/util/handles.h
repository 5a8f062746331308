/*
 * Process-wide integer handles for libtnt objects, for code that can only
 * carry integers (TensorFlow graph attributes, Python). Handles count up
 * from 1 and are never reused, so a stale handle finds NULL, never another
 * object.
 */
#ifndef TNT_UTIL_HANDLES_H
#define TNT_UTIL_HANDLES_H

#include <stdint.h>

#include "tnt/tnt.h"

typedef enum tnt__handle_kind { TNT__HANDLE_GROUP = 1, TNT__HANDLE_FUSION = 2 } tnt__handle_kind_t;

/* Registers `obj`; *handle receives its number. */
tnt_status_t tnt__handle_add(tnt__handle_kind_t kind, void *obj, int64_t *handle);
/* The object of `handle` if it is of `kind` and still registered, else NULL. */
void *tnt__handle_get(tnt__handle_kind_t kind, int64_t handle);
void tnt__handle_remove(int64_t handle);

#endif
