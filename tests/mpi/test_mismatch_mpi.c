/*
 * Ranks that disagree on the collective: the last rank calls something
 * else than the others, and every rank must get TNT_ERR_MISMATCH within a
 * fraction of the timeout (not a hang, not a result made of unrelated
 * buffers), with a context error that names the rank and both calls.
 *
 * Cases (a fresh context each, since a mismatch fails the context):
 *  - an allreduce of one element more;
 *  - an allreduce of float64 instead of float32;
 *  - a barrier instead of the allreduce.
 * On one rank there is no one to disagree with: the calls succeed.
 */
#include "mpi_test_util.h"

typedef enum { CASE_COUNT, CASE_DTYPE, CASE_BARRIER, CASE_COUNT_OF_CASES } mm_case_t;

static const char *const kNames[] = {"count", "dtype", "barrier instead of allreduce"};

static void run_case(mm_case_t which) {
  mt_state_t *s = mt_state();
  const int deviant = s->rank == s->size - 1 && s->size > 1;
  mt_set_case("mismatch: %s", kNames[which]);
  tnt_config_t config = {.timeout_s = 20.0};
  tnt_context_t *ctx = NULL;
  MT_OK(tnt_context_create(&config, &ctx));
  tnt_group_t *w = tnt_context_world(ctx);
  double buf[1001] = {0};
  const double t0 = mt_now();
  tnt_status_t st;
  if (deviant && which == CASE_BARRIER) {
    st = tnt_barrier(w);
  } else if (deviant && which == CASE_DTYPE) {
    st = tnt_allreduce(w, buf, buf, 500, TNT_FLOAT64, TNT_SUM);
  } else {
    st = tnt_allreduce(w, buf, buf, deviant ? 1001 : 1000, TNT_FLOAT32, TNT_SUM);
  }
  const double took = mt_now() - t0;
  if (s->size == 1) {
    MT_CHECK(st == TNT_OK, "one rank: expected TNT_OK, got %s", mt_st(st));
  } else {
    MT_CHECK(st == TNT_ERR_MISMATCH, "expected TNT_ERR_MISMATCH, got %s", mt_st(st));
    MT_CHECK(took < 5.0, "the mismatch took %.1f s to show (timeout 20 s)", took);
    const char *msg = NULL;
    tnt_context_error(ctx, &msg);
    MT_CHECK(msg != NULL && strstr(msg, "disagree on the collective") != NULL,
             "context error does not say the ranks disagree: %s", msg ? msg : "(null)");
    if (!deviant) {
      char want[64];
      snprintf(want, sizeof want, "rank %d runs %s", s->size - 1,
               which == CASE_BARRIER  ? "barrier"
               : which == CASE_DTYPE  ? "allreduce of 500 float64"
                                      : "allreduce of 1001 float32");
      MT_CHECK(msg != NULL && strstr(msg, want) != NULL, "context error lacks \"%s\": %s", want,
               msg ? msg : "(null)");
    }
  }
  /* Destroying a failed context reports the failure. */
  MT_EXPECT_ST(tnt_context_destroy(ctx), s->size == 1 ? TNT_OK : TNT_ERR_FAILED);
}

int main(int argc, char **argv) {
  mt_init("test_mismatch_mpi", &argc, &argv, 1);
  for (int c = 0; c < CASE_COUNT_OF_CASES; ++c) run_case((mm_case_t)c);
  const int rc = mt_verdict();
  MPI_Finalize();
  return rc;
}
