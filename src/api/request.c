/* Requests of non-blocking calls; the engine (src/engine) completes them. */
#include "api/api.h"

/* A request that failed, failed on the executor: the engine's record of
 * the failure says why. */
static tnt_status_t request_end(const char *call, const tnt_request_t *req, tnt_status_t st) {
  if (st < 0 && *tnt__error_message() == '\0') {
    const char *why = "";
    tnt__engine_error(req->engine, &why);
    tnt__error_set("%s: %s%s%s", call, tnt__status_string(st), *why ? ": " : "", why);
  }
  return tnt__api_end(call, NULL, st);
}

tnt_status_t tnt_request_test(tnt_request_t *req) {
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid("tnt_request_test", "req is NULL");
  return request_end("tnt_request_test", req, tnt__request_test(req));
}

tnt_status_t tnt_request_wait(tnt_request_t *req, double timeout_s) {
  tnt__error_clear();
  if (req == NULL) return tnt__api_invalid("tnt_request_wait", "req is NULL");
  return request_end("tnt_request_wait", req, tnt__request_wait(req, timeout_s));
}

void tnt_request_free(tnt_request_t *req) {
  tnt__request_unref(req);
}
