/* Names of status codes. */
#include "tnt/tnt.h"

const char *tnt_status_string(tnt_status_t status) {
  switch (status) {
    case TNT_OK: return "TNT_OK: success";
    case TNT_IN_PROGRESS: return "TNT_IN_PROGRESS: the operation is still running";
    case TNT_ERR_INVALID_ARG: return "TNT_ERR_INVALID_ARG: an argument is invalid";
    case TNT_ERR_NO_MEMORY: return "TNT_ERR_NO_MEMORY: out of memory";
    case TNT_ERR_MPI: return "TNT_ERR_MPI: the MPI library reported an error";
    case TNT_ERR_TIMEOUT: return "TNT_ERR_TIMEOUT: a peer did not answer within the timeout";
    case TNT_ERR_FAILED:
      return "TNT_ERR_FAILED: an earlier operation failed and the context is unusable";
    case TNT_ERR_UNSUPPORTED: return "TNT_ERR_UNSUPPORTED: not supported by this build or MPI";
    case TNT_ERR_STATE: return "TNT_ERR_STATE: call out of order";
    case TNT_ERR_INTERNAL: return "TNT_ERR_INTERNAL: internal error in libtnt";
    case TNT_ERR_MISMATCH:
      return "TNT_ERR_MISMATCH: the ranks called different collectives at the same point";
  }
  return "unknown tnt_status_t value";
}
