/*
 * tnt-sim: an SMPI program (started by smpirun on a platform file) that
 * runs libtnt's allreduce algorithms and its reduce-scatter, or the
 * simulated MPI's own MPI_Allreduce and MPI_Reduce_scatter_block, on the
 * simulated cluster. See sim.h for how libtnt's code
 * runs unchanged on it, and docs/research/scale-study.md for the runs.
 *
 *   tnt-sim --check [--algos ring,rd,rabenseifner,hier,shm,auto]
 *       every algorithm that can serve the layout (or those listed), on the
 *       cases of sim_check.h: exact sums checked on every rank, the others
 *       against the serial sum in the algorithm's documented order (rank 0),
 *       result hashes printed by rank 0 (compared with the threads transport
 *       by the tests); with --collective reduce_scatter, each rank's block of
 *       libtnt's reduce-scatter of every case is also compared, bit for bit,
 *       with that block of the allreduce's result (the contract of
 *       tnt__reduce_scatter)
 *   tnt-sim --bench [--algos auto,ring,rd,hier] [--mpi] [--min B] [--max B]
 *       float32 sum at sizes min, 2 min, 4 min ... max: one JSON object per
 *       line on stdout (rank 0): impl, algorithm, bytes, us, busbw
 *   tnt-sim --bench --collective reduce_scatter [--algos ...] [--mpi] ...
 *       the same for libtnt's reduce-scatter (equal blocks: the allreduce's
 *       choice for the whole vector, or the algorithm forced by --algos)
 *       against MPI_Reduce_scatter_block; the lines add "collective"
 *   tnt-sim --bench --collective allgather [--algos auto,ring,bruck] [--mpi] ...
 *       libtnt's allgatherv of equal blocks (bytes: the gathered total)
 *       against MPI_Allgather; the lines add "collective"
 *   options: --collective allreduce|reduce_scatter|allgather (default
 *            allreduce; allgather with --bench only),
 *            --copy-gbps G (memcpy GB/s of one rank, default 10; 0: copies
 *            and reductions are free; libtnt's choice is told the rate
 *            through TNT_REDUCE_GBPS),
 *            --iters K (timed calls, default 1: each starts after a barrier
 *            and the simulation is deterministic, so more only repeat it)
 */
#include <math.h>
#include <mpi.h>
#include <simgrid/actor.h>
#include <simgrid/engine.h>
#include <simgrid/host.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "sim.h"
#include "sim_check.h"

typedef enum { COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER } collective_t;
static const char *const kCollectives[] = {"allreduce", "reduce_scatter", "allgather"};

typedef struct args {
  int check, bench, mpi, iters, algos_given;
  int rs; /* --collective reduce_scatter */
  collective_t coll;
  size_t min_bytes, max_bytes;
  char algos[128];
} args_t;

static size_t parse_bytes(const char *s) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || v < 0) return 0;
  switch (*end) {
    case 'K': case 'k': v *= 1024.0; break;
    case 'M': case 'm': v *= 1048576.0; break;
    case 'G': case 'g': v *= 1073741824.0; break;
    default: break;
  }
  return (size_t)v;
}

/* libtnt's choice across hosts weighs the reductions against the link
 * (TNT_REDUCE_GBPS): it is told the simulated machine's rate (a reduction
 * costs TNT_SIM_REDUCE_COPIES copies), and free reductions (--copy-gbps 0) as
 * the registry's largest rate (--bench only). A value in the environment
 * stays. */
static void tell_reduce_rate(void) {
  char rate[32];
  const double copy = tnt_sim_opts.copy_gbps;
  const double gbps = copy > 0.0 ? copy / TNT_SIM_REDUCE_COPIES : 1e9;
  snprintf(rate, sizeof rate, "%.9g", gbps);
  setenv("TNT_REDUCE_GBPS", rate, 0);
}

static int parse_args(int argc, char **argv, args_t *a) {
  *a = (args_t){.iters = 1, .min_bytes = 4096, .max_bytes = 256u << 20};
  snprintf(a->algos, sizeof a->algos, "auto");
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(o, "--check") == 0) a->check = 1;
    else if (strcmp(o, "--bench") == 0) a->bench = 1;
    else if (strcmp(o, "--mpi") == 0) a->mpi = 1;
    else if (v != NULL && strcmp(o, "--algos") == 0) {
      snprintf(a->algos, sizeof a->algos, "%s", argv[++i]);
      a->algos_given = 1;
    }
    else if (v != NULL && strcmp(o, "--collective") == 0) {
      const char *name = argv[++i];
      int k = 0;
      while (k < 3 && strcmp(name, kCollectives[k]) != 0) k++;
      if (k == 3) {
        fprintf(stderr, "tnt-sim: --collective is allreduce, reduce_scatter or allgather, not "
                        "'%s'\n", name);
        return -1;
      }
      a->coll = (collective_t)k;
      a->rs = a->coll == COLL_REDUCE_SCATTER;
    }
    else if (v != NULL && strcmp(o, "--min") == 0) a->min_bytes = parse_bytes(argv[++i]);
    else if (v != NULL && strcmp(o, "--max") == 0) a->max_bytes = parse_bytes(argv[++i]);
    else if (v != NULL && strcmp(o, "--iters") == 0) a->iters = atoi(argv[++i]);
    else if (v != NULL && strcmp(o, "--copy-gbps") == 0) tnt_sim_opts.copy_gbps = atof(argv[++i]);
    else {
      fprintf(stderr, "tnt-sim: unknown or incomplete option '%s'; see the top of src/sim/tnt_sim.c\n", o);
      return -1;
    }
  }
  if (a->check == a->bench) {
    fprintf(stderr, "tnt-sim: give exactly one of --check and --bench\n");
    return -1;
  }
  if (a->check && a->coll == COLL_ALLGATHER) {
    fprintf(stderr, "tnt-sim: --check takes --collective allreduce or reduce_scatter\n");
    return -1;
  }
  if (a->iters < 1 || a->min_bytes < 4 || a->max_bytes < a->min_bytes) {
    fprintf(stderr, "tnt-sim: need --iters >= 1 and 4 <= --min <= --max\n");
    return -1;
  }
  tnt_sim_opts.data = a->check;
  /* --check compares the results with the threads transport's, which
   * chooses with libtnt's default rate. */
  if (a->bench) tell_reduce_rate();
  return 0;
}

/* Host index of every rank, by first appearance (rank 0 computes it). */
static sg_host_t *g_hosts;

static int make_world(int rank, int size) {
  if (rank == 0) g_hosts = calloc((size_t)size, sizeof *g_hosts);
  MPI_Barrier(MPI_COMM_WORLD);
  g_hosts[rank] = sg_host_self();
  MPI_Barrier(MPI_COMM_WORLD);
  int st = 0;
  if (rank == 0) {
    int *host_of = malloc((size_t)size * sizeof(int)), nh = 0;
    sg_host_t *seen = malloc((size_t)size * sizeof *seen);
    for (int r = 0; r < size && host_of && seen; r++) {
      int h = 0;
      while (h < nh && seen[h] != g_hosts[r]) h++;
      if (h == nh) seen[nh++] = g_hosts[r];
      host_of[r] = h;
    }
    st = host_of && seen ? tnt_sim_world_init(size, host_of, nh) : TNT_ERR_NO_MEMORY;
    free(host_of);
    free(seen);
  }
  MPI_Bcast(&st, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (st == 0) st = tnt_sim_bind(rank);
  return st;
}

static tnt_status_t run_allreduce(tnt__comm_t *c, const void *in, void *out, size_t count) {
  tnt__wait_ctx_t w = {.deadline = INFINITY, .timeout = INFINITY, .warn_at = INFINITY,
                       .label = "simulated allreduce"};
  const tnt__algo_t *a = tnt__algo_select(c, TNT__COLL_ALLREDUCE, count * sizeof(float));
  return a->fn.allreduce(c, in, out, count, TNT_FLOAT32, TNT_SUM, &w);
}

/* libtnt's reduce-scatter of `count` float32 in buf (overwritten) in equal
 * blocks (the tnt__slice partition): this rank's block goes to recv. */
static tnt_status_t run_reduce_scatter(tnt__comm_t *c, void *buf, void *recv, size_t count) {
  tnt__wait_ctx_t w = {.deadline = INFINITY, .timeout = INFINITY, .warn_at = INFINITY,
                       .label = "simulated reduce-scatter"};
  return tnt__reduce_scatter(c, buf, recv, count, NULL, TNT_FLOAT32, TNT_SUM, &w, NULL);
}

/* libtnt's allgatherv of `bytes` in all into buf, in equal blocks: this
 * rank's is its block of buf, as the fusion set gathers parts in place. */
static tnt_status_t run_allgather(tnt__comm_t *c, uint8_t *buf, size_t bytes) {
  tnt__wait_ctx_t w = {.deadline = INFINITY, .timeout = INFINITY, .warn_at = INFINITY,
                       .label = "simulated allgather"};
  const size_t n = (size_t)c->size, block = bytes / n;
  size_t *counts = malloc(2 * n * sizeof *counts);
  if (counts == NULL) return TNT_ERR_NO_MEMORY;
  size_t *displs = counts + n;
  for (size_t r = 0; r < n; r++) counts[r] = block, displs[r] = r * block;
  const tnt__algo_t *a = tnt__algo_select(c, TNT__COLL_ALLGATHERV, bytes);
  tnt_status_t st = a->fn.allgatherv(c, buf + (size_t)c->rank * block, buf, counts, displs, &w);
  free(counts);
  return st;
}

/* For --bench --collective allgather: forces the allgatherv algorithm
 * `name` on c ("auto": libtnt's choice, `resolved`); 0 when c cannot run it. */
static int choose_allgather(tnt__comm_t *c, const char *name, const tnt__algo_choice_t *resolved) {
  if (strcmp(name, "auto") == 0) {
    c->algos[TNT__COLL_ALLGATHERV] = *resolved;
    return 1;
  }
  const tnt__algo_t *a = tnt__algo_find(TNT__COLL_ALLGATHERV, name);
  if (a == NULL || !a->usable(c)) return 0;
  c->algos[TNT__COLL_ALLGATHERV] = tnt__algo_only(a);
  return 1;
}

/* Runs the reduce-scatter of `in` (n elements) and compares this rank's
 * block, bit for bit, with that block of the allreduce's result `sum`;
 * `work` and `block` hold n elements. 0 when they match. */
static int block_differs(tnt__comm_t *c, const char *choice, const float *in, const float *sum,
                         float *work, float *block, size_t n) {
  size_t lo, hi;
  tnt__slice(n, sizeof(float), c->size, c->rank, &lo, &hi);
  memcpy(work, in, n * sizeof *in);
  tnt_status_t st = run_reduce_scatter(c, work, block, n);
  if (st != TNT_OK) {
    fprintf(stderr, "rank %d: reduce-scatter (%s) of %zu failed: %s\n", c->rank, choice, n,
            tnt_status_string(st));
    return 1;
  }
  for (size_t i = lo; i < hi; i++) {
    if (memcmp(&block[i - lo], &sum[i], sizeof *sum) != 0) {
      fprintf(stderr, "rank %d: reduce-scatter (%s) of %zu: element %zu is %.9g, the "
              "allreduce gives %.9g\n", c->rank, choice, n, i, block[i - lo], sum[i]);
      return 1;
    }
  }
  return 0;
}

/* Compares a "bits" result with the serial sum in the order of the
 * algorithm that ran it (sim_check_ordered); 0 when it matches or there is
 * no serial reference for that algorithm. */
static int ordered_differs(tnt__comm_t *c, const char *choice, const float *out, size_t n) {
  const char *used = tnt__algo_select(c, TNT__COLL_ALLREDUCE, n * sizeof(float))->name;
  for (size_t i = 0; i < n; i++) {
    float want;
    if (sim_check_ordered(used, c->size, n, i, &want) == NULL) return 0;
    if (memcmp(&want, &out[i], sizeof want) != 0) {
      fprintf(stderr, "%s (%s) of %zu: element %zu is %.9g, the serial sum in %s's order is "
              "%.9g\n", choice, used, n, i, out[i], used, want);
      return 1;
    }
  }
  return 0;
}

/* Whether `name` is in the comma-separated `list`. */
static int listed(const char *list, const char *name) {
  const size_t len = strlen(name);
  for (const char *p = list; (p = strstr(p, name)) != NULL; p += len) {
    if ((p == list || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return 1;
  }
  return 0;
}

static int check(tnt__comm_t *c, const args_t *a, const tnt__algo_choice_t *resolved) {
  size_t max = kSimCheckCounts[SIM_CHECK_NCOUNTS - 1];
  float *in = malloc(max * sizeof *in), *out = malloc(max * sizeof *out);
  float *work = a->rs ? malloc(max * sizeof *work) : NULL;
  float *block = a->rs ? malloc(max * sizeof *block) : NULL;
  uint64_t *hashes = malloc((size_t)c->size * sizeof *hashes);
  int bad = 0;
  const int ready = in && out && hashes && (!a->rs || (work && block));
  for (size_t ai = 0; ai < SIM_CHECK_NALGOS && ready; ai++) {
    if (a->algos_given && !listed(a->algos, kSimCheckAlgos[ai])) continue;
    if (!sim_check_choose(c, kSimCheckAlgos[ai], resolved)) continue;
    for (size_t ci = 0; ci < SIM_CHECK_NCOUNTS; ci++) {
      for (int exact = 1; exact >= 0; exact--) {
        size_t n = kSimCheckCounts[ci];
        for (size_t i = 0; i < n; i++) in[i] = sim_check_input(exact, c->rank, i);
        tnt_status_t st = run_allreduce(c, in, out, n);
        if (st != TNT_OK) {
          fprintf(stderr, "rank %d: %s of %zu failed: %s\n", c->rank, kSimCheckAlgos[ai], n,
                  tnt_status_string(st));
          return 1;
        }
        for (size_t i = 0; exact && i < n; i++) {
          if (out[i] != sim_check_sum(c->size, i)) {
            fprintf(stderr, "rank %d: %s of %zu: element %zu is %g, the sum is %g\n", c->rank,
                    kSimCheckAlgos[ai], n, i, out[i], sim_check_sum(c->size, i));
            bad = 1;
            break;
          }
        }
        if (!exact && c->rank == 0 && ordered_differs(c, kSimCheckAlgos[ai], out, n)) bad = 1;
        if (a->rs && block_differs(c, kSimCheckAlgos[ai], in, out, work, block, n)) bad = 1;
        uint64_t h = sim_check_hash(out, n * sizeof *out);
        MPI_Gather(&h, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        if (c->rank != 0) continue;
        for (int r = 1; r < c->size; r++) {
          if (hashes[r] != h) {
            fprintf(stderr, "%s of %zu: rank %d's result differs from rank 0's\n",
                    kSimCheckAlgos[ai], n, r);
            bad = 1;
          }
        }
        printf("%s %zu %s %016llx\n", kSimCheckAlgos[ai], n, exact ? "exact" : "bits",
               (unsigned long long)h);
      }
    }
  }
  free(in);
  free(out);
  free(work);
  free(block);
  free(hashes);
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}

/* Simulated seconds between the barrier's end and the common start of a
 * timed call: far more than the allreduce of one double that agrees on the
 * start takes, even on 1024 hosts at 10 Gbit/s. */
#define START_MARGIN_S 1e-3

/* Seconds per collective (a->coll) of `bytes`, of libtnt or (a->mpi) of
 * MPI, in buf (recv: this rank's block of a reduce-scatter; an allgather's
 * bytes are the gathered total): the mean over `iters` calls of the
 * slowest rank's time, after one untimed call. Every call starts on every
 * rank at the same simulated instant: a barrier releases the ranks at
 * different times (how far apart depends on its algorithm, hence on the
 * MPI selector), and a call that ranks start apart runs slower in the
 * simulation, more so on a multi-level tree (docs/research/scale-study.md);
 * so the ranks agree on the latest time any of them left the
 * barrier and all start START_MARGIN_S after it. */
static double time_one(tnt__comm_t *c, const args_t *a, float *buf, float *recv, size_t bytes) {
  size_t count = bytes / sizeof(float);
  double sum = 0.0;
  for (int i = 0; i <= a->iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double left = simgrid_get_clock(), latest = 0.0;
    MPI_Allreduce(&left, &latest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double start = latest + START_MARGIN_S;
    if (simgrid_get_clock() > start) {
      fprintf(stderr, "tnt-sim: agreeing on a common start took more than %g s\n",
              START_MARGIN_S);
      return -1.0;
    }
    sg_actor_sleep_until(start);
    tnt_status_t st = TNT_OK;
    if (a->mpi && a->rs) {
      MPI_Reduce_scatter_block(buf, recv, (int)(count / (size_t)c->size), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    } else if (a->mpi && a->coll == COLL_ALLGATHER) {
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(count / (size_t)c->size),
                    MPI_FLOAT, MPI_COMM_WORLD);
    } else if (a->mpi) {
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (a->coll == COLL_ALLGATHER) {
      st = run_allgather(c, (uint8_t *)buf, bytes);
    } else {
      st = a->rs ? run_reduce_scatter(c, buf, recv, count) : run_allreduce(c, buf, buf, count);
    }
    if (st != TNT_OK) return -1.0;
    double mine = simgrid_get_clock() - start, worst = 0.0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i > 0) sum += worst;
  }
  return sum / a->iters;
}

static int bench(tnt__comm_t *c, const args_t *a, const tnt__algo_choice_t *resolved) {
  /* One buffer for every rank (and one for the reduce-scatter's blocks): a
   * timing run moves no data (sim.h), and SMPI's shared allocation keeps
   * MPI's buffers from costing memory per rank. MPI_Reduce_scatter_block
   * and MPI_Allgather take equal blocks: every size must split into them. */
  static float *buf, *recv;
  const size_t block_unit = sizeof(float) * (size_t)c->size;
  const tnt__algo_choice_t gather_resolved = c->algos[TNT__COLL_ALLGATHERV];
  const int blocks = a->coll != COLL_ALLREDUCE;
  const tnt__coll_kind_t kind = a->coll == COLL_ALLGATHER ? TNT__COLL_ALLGATHERV
                                                            : TNT__COLL_ALLREDUCE;
  for (size_t bytes = a->min_bytes; blocks && bytes <= a->max_bytes; bytes *= 2) {
    if (bytes % block_unit != 0) {
      if (c->rank == 0) {
        fprintf(stderr, "tnt-sim: %zu bytes do not split into %d equal float32 blocks\n",
                bytes, c->size);
      }
      return 1;
    }
  }
  if (c->rank == 0) {
    buf = SMPI_SHARED_MALLOC(a->max_bytes);
    if (a->rs) recv = SMPI_SHARED_MALLOC(a->max_bytes / (size_t)c->size);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  char list[128];
  snprintf(list, sizeof list, "%s", a->mpi ? "mpi" : a->algos);
  for (char *save = NULL, *name = strtok_r(list, ",", &save); name != NULL;
       name = strtok_r(NULL, ",", &save)) {
    if (!a->mpi && !(a->coll == COLL_ALLGATHER ? choose_allgather(c, name, &gather_resolved)
                                               : sim_check_choose(c, name, resolved))) {
      continue;
    }
    for (size_t bytes = a->min_bytes; bytes <= a->max_bytes; bytes *= 2) {
      static const char *const kMpiNames[] = {"MPI_Allreduce", "MPI_Reduce_scatter_block",
                                              "MPI_Allgather"};
      const char *used = a->mpi ? kMpiNames[a->coll] : tnt__algo_select(c, kind, bytes)->name;
      double s = time_one(c, a, buf, recv, bytes);
      if (s < 0) return 1;
      if (c->rank == 0) {
        /* busbw: what each rank's link must carry per second for the
         * bandwidth-optimal algorithm, the NCCL-tests convention: an
         * allreduce sends 2(n-1)/n of the bytes, a reduce-scatter and an
         * allgather (n-1)/n. */
        double busbw = (double)bytes / s * (blocks ? 1.0 : 2.0) * (c->size - 1) / c->size / 1e9;
        char field[64] = "";
        if (blocks) snprintf(field, sizeof field, "\"collective\": \"%s\", ", kCollectives[a->coll]);
        printf("{\"impl\": \"%s\", \"choice\": \"%s\", \"algorithm\": \"%s\", %s\"ranks\": %d, "
               "\"hosts\": %d, \"bytes\": %zu, \"us\": %.3f, \"busbw\": %.6f}\n",
               a->mpi ? "mpi" : "tnt", a->mpi ? "mpi" : name, used, field, c->size,
               c->num_hosts, bytes, s * 1e6, busbw);
        fflush(stdout);
      }
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, rc = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  args_t a;
  tnt__transport_t *t = NULL;
  tnt__comm_t *c = NULL;
  if (parse_args(argc, argv, &a) != 0 || make_world(rank, size) != 0) goto out;
  if (tnt_sim_transport_create(rank, &t) != TNT_OK || tnt__comm_create(t, &c) != TNT_OK) {
    fprintf(stderr, "rank %d: cannot set up the simulated communicator\n", rank);
    goto out;
  }
  tnt__algo_choice_t resolved = c->algos[TNT__COLL_ALLREDUCE];
  rc = a.check ? check(c, &a, &resolved) : bench(c, &a, &resolved);
out:
  MPI_Finalize();
  return rc;
}
