/*
 * The progress thread sleeps when it has nothing to do, and naps rather
 * than spins while point-to-point transfers stay pending. Each case
 * measures this process's CPU time (CLOCK_PROCESS_CPUTIME_ID, every thread
 * of the rank) across a wait:
 *
 *   - idle: nothing queued or pending, every rank sleeps 1 s;
 *   - a blocking receive (tnt_recv) whose sender comes 1.5 s late;
 *   - a non-blocking receive (tnt_irecv + tnt_request_wait), the same;
 *   - a large non-blocking send (tnt_isend + tnt_request_wait) whose
 *     receiver comes 1.5 s late (a message this size cannot leave eagerly);
 *   - a fusion finish (blocking, on a second thread) that waits 1.5 s for
 *     the other tensor of its bucket to be started on this rank.
 *
 * Each of these waits is a pthread_cond_timedwait on a deadline from the
 * monotonic clock; a condition variable made on the default clock
 * (CLOCK_REALTIME) sees that deadline decades in the past, so the wait
 * returns at once and its loop spins. A spinning thread costs a whole core,
 * about 1 s of CPU per second of waiting; the limits below are a fraction
 * of that. They hold on
 * a loaded host too: load stretches the waits but cannot add CPU time to
 * this process. With one rank only the idle and fusion cases run; from two
 * ranks on, ranks 0 and 1 run the transfers and the other ranks wait in the
 * next barrier as bystanders.
 */
#include <pthread.h>

#include "mpi_test_util.h"

/* Idle: at most this much CPU over a 1 s sleep. */
#define IDLE_SLEEP_S 1.0
#define IDLE_CPU_MAX_S 0.1
/* Pending transfer: the peer comes this late; the waiting rank may use at
 * most this fraction of the wait's wall time as CPU. */
#define LATE_S 1.5
#define PENDING_CPU_MAX_FRACTION 0.35
/* A wait shorter than this did not wait for the late peer: the case would
 * prove nothing. */
#define MIN_WAIT_S (LATE_S - 0.5)
/* float32 elements of the large send: 8 MiB, far above any eager limit. */
#define LARGE_COUNT ((size_t)2 << 20)
#define TAG 7

static int g_rank, g_size;

static double cpu_now(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) mt_fatal("CLOCK_PROCESS_CPUTIME_ID");
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A window over which this process's wall and CPU time are measured. */
typedef struct window {
  double wall, cpu;
} window_t;

static window_t window_start(void) {
  window_t w = {mt_now(), cpu_now()};
  return w;
}

/* Ends the window: returns its wall time and stores its CPU time. */
static double window_end(window_t w, double *cpu) {
  *cpu = cpu_now() - w.cpu;
  return mt_now() - w.wall;
}

static void test_idle(tnt_group_t *w) {
  mt_set_case("idle engine: sleep %.1f s with nothing pending", IDLE_SLEEP_S);
  MT_OK(tnt_barrier(w));
  window_t win = window_start();
  mt_sleep(IDLE_SLEEP_S);
  double cpu = 0;
  double wall = window_end(win, &cpu);
  printf("rank %d: idle %.2f s, CPU %.3f s\n", g_rank, wall, cpu);
  MT_CHECK(cpu < IDLE_CPU_MAX_S,
           "CPU time while idle for %.2f s: expected < %.2f s, got %.3f s (the progress thread "
           "does not sleep)",
           wall, IDLE_CPU_MAX_S, cpu);
}

/* Checks one pending wait measured on the rank that waited. */
static void check_pending(const char *what, double wall, double cpu) {
  printf("rank %d: %s waited %.2f s, CPU %.3f s (%.0f%% of a core)\n", g_rank, what, wall, cpu,
         100.0 * cpu / wall);
  MT_CHECK(wall >= MIN_WAIT_S,
           "%s: expected to wait for the peer that comes %.1f s late (>= %.1f s), returned "
           "after %.2f s",
           what, LATE_S, MIN_WAIT_S, wall);
  MT_CHECK(cpu < PENDING_CPU_MAX_FRACTION * wall,
           "CPU time while the %s was pending for %.2f s: expected < %.2f s (%.0f%% of the "
           "wait), got %.3f s (a waiting thread spins)",
           what, wall, PENDING_CPU_MAX_FRACTION * wall, 100.0 * PENDING_CPU_MAX_FRACTION, cpu);
}

/* Rank 1 receives (blocking or not) what rank 0 sends LATE_S late. */
static void test_late_sender(tnt_group_t *w, int blocking) {
  const char *what = blocking ? "blocking receive" : "non-blocking receive";
  mt_set_case("%s from a sender %.1f s late", what, LATE_S);
  float msg[16], got[16], want[16];
  mt_fill(msg, 16, TNT_FLOAT32, 11 + (uint64_t)blocking, 0);
  mt_fill(want, 16, TNT_FLOAT32, 11 + (uint64_t)blocking, 0);
  mt_fill_sentinel(got, 16, TNT_FLOAT32);
  MT_OK(tnt_barrier(w));
  if (g_rank == 0) {
    mt_sleep(LATE_S);
    MT_OK(tnt_send(w, msg, 16, TNT_FLOAT32, 1, TAG));
  } else if (g_rank == 1) {
    window_t win = window_start();
    if (blocking) {
      MT_OK(tnt_recv(w, got, 16, TNT_FLOAT32, 0, TAG));
    } else {
      tnt_request_t *req = NULL;
      MT_OK(tnt_irecv(w, got, 16, TNT_FLOAT32, 0, TAG, &req));
      MT_OK(tnt_request_wait(req, -1));
      tnt_request_free(req);
    }
    double cpu = 0;
    double wall = window_end(win, &cpu);
    mt_compare(TNT_FLOAT32, got, want, 16, "message from rank 0");
    check_pending(what, wall, cpu);
  }
  MT_OK(tnt_barrier(w));
}

/* Rank 0 sends a large message that rank 1 receives LATE_S late. */
static void test_late_receiver(tnt_group_t *w) {
  mt_set_case("large non-blocking send to a receiver %.1f s late", LATE_S);
  float *buf = NULL, *want = NULL;
  if (g_rank <= 1) {
    buf = mt_alloc(LARGE_COUNT * sizeof *buf);
    want = mt_alloc(LARGE_COUNT * sizeof *want);
    mt_fill(want, LARGE_COUNT, TNT_FLOAT32, 13, 0);
  }
  MT_OK(tnt_barrier(w));
  if (g_rank == 0) {
    mt_fill(buf, LARGE_COUNT, TNT_FLOAT32, 13, 0);
    window_t win = window_start();
    tnt_request_t *req = NULL;
    MT_OK(tnt_isend(w, buf, LARGE_COUNT, TNT_FLOAT32, 1, TAG, &req));
    MT_OK(tnt_request_wait(req, -1));
    tnt_request_free(req);
    double cpu = 0;
    double wall = window_end(win, &cpu);
    check_pending("large non-blocking send", wall, cpu);
  } else if (g_rank == 1) {
    mt_fill_sentinel(buf, LARGE_COUNT, TNT_FLOAT32);
    mt_sleep(LATE_S);
    MT_OK(tnt_recv(w, buf, LARGE_COUNT, TNT_FLOAT32, 0, TAG));
    mt_compare(TNT_FLOAT32, buf, want, LARGE_COUNT, "large message from rank 0");
  }
  MT_OK(tnt_barrier(w));
  free(buf);
  free(want);
}

/* The fusion set of the fusion cases: two tensors in one bucket, so that
 * finishing the first waits until the second is started. */
#define FUSION_COUNT 4
static const uint64_t kFusionIds[2] = {41, 42};

typedef struct finisher {
  tnt_fusion_t *f;
  float out[FUSION_COUNT];
  tnt_status_t st;
} finisher_t;

static void *finish_first(void *arg) {
  finisher_t *fin = arg;
  fin->st = tnt_fusion_finish(fin->f, kFusionIds[0], fin->out, -1);
  return NULL;
}

/* Each rank contributes rank + i + 1 at index i (exact averages). */
static void fusion_data(float *buf, int rank, int which) {
  for (int i = 0; i < FUSION_COUNT; i++) buf[i] = (float)(rank + i + 1 + 10 * which);
}

static void fusion_check(const float *got, int which, const char *what) {
  float want[FUSION_COUNT];
  for (int i = 0; i < FUSION_COUNT; i++) {
    want[i] = (float)((g_size - 1) / 2.0 + i + 1 + 10 * which);
  }
  mt_compare(TNT_FLOAT32, got, want, FUSION_COUNT, what);
}

/* The first tensor of the bucket is finished (blocking, on a second
 * thread) LATE_S before the second is started. */
static void test_fusion_wait(tnt_group_t *w) {
  const char *what = "blocking fusion finish";
  mt_set_case("%s waiting %.1f s for its bucket", what, LATE_S);
  tnt_tensor_info_t info[2];
  for (int t = 0; t < 2; t++)
    info[t] = (tnt_tensor_info_t){kFusionIds[t], FUSION_COUNT, TNT_FLOAT32};
  finisher_t fin = {.st = TNT_IN_PROGRESS};
  MT_OK(tnt_fusion_create(
      w, info, 2, &(tnt_fusion_options_t){.size = sizeof(tnt_fusion_options_t), .threshold_bytes = (size_t)64 << 20, .op = TNT_AVERAGE},
      &fin.f));
  if (tnt_fusion_num_buckets(fin.f) != 1) {
    mt_fatal("expected one fusion bucket, got %zu", tnt_fusion_num_buckets(fin.f));
  }
  float in[2][FUSION_COUNT], out2[FUSION_COUNT];
  fusion_data(in[0], g_rank, 0);
  fusion_data(in[1], g_rank, 1);
  MT_OK(tnt_barrier(w));
  MT_OK(tnt_fusion_start(fin.f, kFusionIds[0], in[0]));
  pthread_t thread;
  window_t win = window_start();
  if (pthread_create(&thread, NULL, finish_first, &fin) != 0) {
    mt_fatal("pthread_create failed");
  }
  mt_sleep(LATE_S);
  double cpu = 0;
  double wall = window_end(win, &cpu);
  MT_OK(tnt_fusion_start(fin.f, kFusionIds[1], in[1]));
  MT_OK(tnt_fusion_finish(fin.f, kFusionIds[1], out2, -1));
  pthread_join(thread, NULL);
  MT_CHECK(fin.st == TNT_OK, "%s of the first tensor: expected TNT_OK, got %s", what,
           mt_st(fin.st));
  fusion_check(fin.out, 0, "first tensor of the bucket");
  fusion_check(out2, 1, "second tensor of the bucket");
  check_pending(what, wall, cpu);
  MT_OK(tnt_fusion_destroy(fin.f));
  MT_OK(tnt_barrier(w));
}

int main(int argc, char **argv) {
  mt_init("test_progress_cpu_mpi", &argc, &argv, 0);
  tnt_config_t config = {25.0};
  tnt_context_t *ctx = mt_context(&config);
  g_rank = mt_state()->rank;
  g_size = mt_state()->size;
  tnt_group_t *w = tnt_context_world(ctx);
  if (w == NULL) mt_fatal("tnt_context_world returned NULL");

  test_idle(w);
  if (g_size >= 2) {
    test_late_sender(w, 1);
    test_late_sender(w, 0);
    test_late_receiver(w);
  }
  test_fusion_wait(w);
  /* The engine is idle again once the transfers are over. */
  test_idle(w);

  mt_set_case("teardown");
  const char *msg = NULL;
  tnt_status_t cst = tnt_context_error(ctx, &msg);
  MT_CHECK(cst == TNT_OK, "tnt_context_error at the end: expected TNT_OK, got %s (%s)", mt_st(cst),
           msg != NULL ? msg : "");
  int rc = mt_verdict();
  tnt_status_t st = tnt_context_destroy(ctx);
  mt_state()->ctx = NULL;
  if (st != TNT_OK) {
    fprintf(stderr, "[test_progress_cpu_mpi] FAIL rank %d: tnt_context_destroy returned %s\n",
            g_rank, mt_st(st));
    rc = 1;
  }
  return rc;
}
