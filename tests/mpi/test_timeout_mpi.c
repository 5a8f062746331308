/*
 * Timeouts over MPI; run by check_timeout.sh with TNT_TIMEOUT_S=3, which
 * checks the output. The last rank withholds its contribution (it sleeps
 * instead of calling) and every other rank must get TNT_ERR_TIMEOUT within
 * the bound, print
 *   rank R: timed out after X s
 * and then end the job with tnt_context_abort(ctx, 3), after all of them
 * have reported. The library's log (stderr) must name the missing peer.
 *
 * Modes (argv[1]):
 *   allreduce  the withheld operation is a blocking allreduce
 *   reduce_scatter  the same with a blocking reduce-scatter
 *   fusion     the last rank never starts one member of a fusion bucket; the
 *              others' tnt_fusion_finish of that bucket must time out and
 *              the log must name the bucket (this program prints its index)
 */
#include "mpi_test_util.h"

/* How long the withholding rank waits to be killed before it gives up. */
#define WITHHOLD_S 45.0

static int g_rank, g_size;

/* The withholding rank: sleeps until the others abort the job. */
static void withhold(const char *what) {
  printf("rank %d: withholding %s\n", g_rank, what);
  double t0 = mt_now();
  while (mt_now() - t0 < WITHHOLD_S) mt_sleep(0.2);
  printf("rank %d: FAIL: nobody ended the job within %.0f s\n", g_rank, WITHHOLD_S);
  _exit(1);
}

/*
 * Reports the outcome of the withheld operation on a waiting rank, checks
 * that the context now refuses work with TNT_ERR_FAILED, waits until every
 * waiting rank has reported and ends the job.
 */
static void report_and_abort(tnt_context_t *ctx, MPI_Comm waiters, tnt_status_t st, double elapsed,
                             const char *what) {
  if (st == TNT_ERR_TIMEOUT) {
    printf("rank %d: timed out after %.2f s (%s)\n", g_rank, elapsed, what);
  } else {
    printf("rank %d: FAIL: %s: expected TNT_ERR_TIMEOUT, got %s after %.2f s\n", g_rank, what,
           mt_st(st), elapsed);
  }
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  printf("rank %d: context error %s: %s\n", g_rank, mt_st(cst), msg != NULL ? msg : "(none)");
  int32_t one = 1, sum = 0;
  double t0 = mt_now();
  tnt_status_t later = tnt_allreduce(tnt_context_world(ctx), &one, &sum, 1, TNT_INT32, TNT_SUM);
  printf("rank %d: later call returned %s after %.2f s\n", g_rank, mt_st(later), mt_now() - t0);
  fflush(stdout);
  fflush(stderr);
  MPI_Barrier(waiters);
  mt_sleep(0.5); /* lets the output of every rank reach mpirun */
  tnt_context_abort(ctx, 3);
  printf("rank %d: FAIL: tnt_context_abort returned\n", g_rank);
  _exit(1);
}

/* An allreduce, or with `scatter` a reduce-scatter, of 1000 floats. */
static void run_allreduce(tnt_context_t *ctx, MPI_Comm waiters, int scatter) {
  tnt_group_t *world = tnt_context_world(ctx);
  float in[1000], out[1000];
  for (int i = 0; i < 1000; i++) in[i] = (float)i;
  const char *what = scatter ? "reduce-scatter" : "allreduce";
  if (g_rank == g_size - 1) withhold(scatter ? "its reduce-scatter contribution"
                                             : "its allreduce contribution");
  double t0 = mt_now();
  tnt_status_t st =
      scatter ? tnt_reduce_scatter(world, in, out, 1000 / (size_t)g_size, TNT_FLOAT32, TNT_SUM)
              : tnt_allreduce(world, in, out, 1000, TNT_FLOAT32, TNT_SUM);
  report_and_abort(ctx, waiters, st, mt_now() - t0, what);
}

static void run_fusion(tnt_context_t *ctx, MPI_Comm waiters) {
  /* With an 800-byte threshold: bucket 0 = {1, 2}, bucket 1 = {3, 5},
   * bucket 2 = {4}. Tensor 5 is withheld. */
  const tnt_tensor_info_t info[5] = {{1, 100, TNT_FLOAT32},
                                     {2, 100, TNT_FLOAT32},
                                     {3, 100, TNT_FLOAT32},
                                     {4, 50, TNT_FLOAT16},
                                     {5, 100, TNT_FLOAT32}};
  tnt_fusion_t *f = NULL;
  mt_set_case("tnt_fusion_create");
  MT_OK(tnt_fusion_create(tnt_context_world(ctx), info, 5,
                          &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = 800, .op = TNT_AVERAGE}, &f));
  long bucket = tnt_fusion_bucket_of(f, 5);
  if (g_rank == 0) printf("rank 0: withheld tensor 5 is in bucket %ld\n", bucket);
  if (bucket < 0 || tnt_fusion_bucket_of(f, 3) != bucket || tnt_fusion_bucket_of(f, 1) == bucket) {
    printf("rank %d: FAIL: unexpected plan: buckets of tensors 1, 3, 5 are %ld, %ld, %ld\n", g_rank,
           tnt_fusion_bucket_of(f, 1), tnt_fusion_bucket_of(f, 3), bucket);
  }
  float data[100], out[100];
  uint16_t half[50] = {0};
  for (int i = 0; i < 100; i++) data[i] = (float)i;
  mt_set_case("fusion step");
  for (uint64_t id = 1; id <= 4; id++)
    MT_OK(tnt_fusion_start(f, id, id == 4 ? (void *)half : data));
  if (g_rank == g_size - 1) {
    MT_OK(tnt_fusion_finish(f, 1, out, -1));
    MT_OK(tnt_fusion_finish(f, 2, out, -1));
    withhold("tensor 5 of the fusion set");
  }
  MT_OK(tnt_fusion_start(f, 5, data));
  MT_OK(tnt_fusion_finish(f, 1, out, -1));
  MT_OK(tnt_fusion_finish(f, 2, out, -1));
  printf("rank %d: bucket 0 completed\n", g_rank);
  double t0 = mt_now();
  tnt_status_t st = tnt_fusion_finish(f, 3, out, -1);
  report_and_abort(ctx, waiters, st, mt_now() - t0, "tnt_fusion_finish of tensor 3");
}

int main(int argc, char **argv) {
  mt_init("test_timeout_mpi", &argc, &argv, 1);
  const char *mode = argc > 1 ? argv[1] : "allreduce";
  tnt_context_t *ctx = mt_context(NULL);
  g_rank = mt_state()->rank;
  g_size = mt_state()->size;
  if (g_size < 2) {
    if (g_rank == 0) printf("test_timeout_mpi needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (strcmp(mode, "allreduce") != 0 && strcmp(mode, "fusion") != 0 &&
      strcmp(mode, "reduce_scatter") != 0) {
    if (g_rank == 0) printf("unknown mode %s (allreduce, reduce_scatter or fusion)\n", mode);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (g_rank == 0) {
    const char *algo = tnt_allreduce_algorithm(tnt_context_world(ctx), 4000);
    printf("rank 0: mode %s, %d ranks, timeout %.1f s, allreduce algorithm %s\n", mode, g_size,
           tnt_context_timeout(ctx), algo != NULL ? algo : "NULL");
  }
  MPI_Comm waiters;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank == g_size - 1 ? MPI_UNDEFINED : 0, g_rank, &waiters);

  /* A first allreduce that everybody joins, so that set-up costs are not
   * counted in the timed wait. */
  mt_set_case("warm-up allreduce");
  int32_t one = 1, sum = 0;
  MT_OK(tnt_allreduce(tnt_context_world(ctx), &one, &sum, 1, TNT_INT32, TNT_SUM));
  MT_CHECK(sum == g_size, "warm-up allreduce: expected %d, got %d", g_size, sum);
  MT_OK(tnt_barrier(tnt_context_world(ctx)));

  if (strcmp(mode, "fusion") == 0) {
    run_fusion(ctx, waiters);
  } else {
    run_allreduce(ctx, waiters, strcmp(mode, "reduce_scatter") == 0);
  }
  return 1; /* not reached */
}
