/*
 * The cases of src/sim/sim_check.h on the threads transport: ranks as
 * threads of this process, hosts as the fixture's host labels. Prints the
 * lines tnt-sim --check prints (rank 0's results), so that check_sim.sh can
 * compare the simulated run with this one bit for bit.
 *
 *   tnt_sim_reference LAYOUT
 *
 * LAYOUT: HOSTSxRANKS_PER_HOST (e.g. 4x2), or the ranks of each host
 * joined by '+' (e.g. 3+1+2: uneven hosts).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "sim_check.h"
#include "transport_threads.h"

typedef struct rank_arg {
  tnt__threads_world_t *world;
  int rank, failed;
} rank_arg_t;

static void *rank_main(void *p) {
  rank_arg_t *ra = p;
  tnt__transport_t *t = NULL;
  tnt__comm_t *c = NULL;
  size_t max = kSimCheckCounts[SIM_CHECK_NCOUNTS - 1];
  float *in = malloc(max * sizeof *in), *out = malloc(max * sizeof *out);
  ra->failed = 1;
  if (in == NULL || out == NULL || tnt__threads_transport_create(ra->world, ra->rank, &t) != TNT_OK ||
      tnt__comm_create(t, &c) != TNT_OK) {
    goto done;
  }
  tnt__algo_choice_t resolved = c->algos[TNT__COLL_ALLREDUCE];
  for (size_t ai = 0; ai < SIM_CHECK_NALGOS; ai++) {
    if (!sim_check_choose(c, kSimCheckAlgos[ai], &resolved)) continue;
    for (size_t ci = 0; ci < SIM_CHECK_NCOUNTS; ci++) {
      for (int exact = 1; exact >= 0; exact--) {
        size_t n = kSimCheckCounts[ci];
        for (size_t i = 0; i < n; i++) in[i] = sim_check_input(exact, c->rank, i);
        tnt__wait_ctx_t w = tnt__wait_ctx(60.0, "reference allreduce");
        const tnt__algo_t *a = tnt__algo_select(c, TNT__COLL_ALLREDUCE, n * sizeof(float));
        if (a->fn.allreduce(c, in, out, n, TNT_FLOAT32, TNT_SUM, &w) != TNT_OK) goto done;
        if (c->rank == 0) {
          printf("%s %zu %s %016llx\n", kSimCheckAlgos[ai], n, exact ? "exact" : "bits",
                 (unsigned long long)sim_check_hash(out, n * sizeof *out));
        }
      }
    }
  }
  ra->failed = 0;
done:
  if (c != NULL) tnt__comm_destroy(c);
  free(in);
  free(out);
  return NULL;
}

#define MAX_RANKS 64

/* Fills host_of from LAYOUT; returns the number of ranks, or 0 when LAYOUT
 * is not one (or has more than MAX_RANKS ranks). */
static int parse_layout(const char *s, int *host_of) {
  int hosts = 0, per = 0, n = 0;
  char tail = 0;
  if (sscanf(s, "%dx%d%c", &hosts, &per, &tail) == 2) {
    if (hosts < 1 || per < 1 || hosts * per > MAX_RANKS) return 0;
    for (n = 0; n < hosts * per; n++) host_of[n] = n / per;
    return n;
  }
  for (int h = 0;; h++) {
    char *end = NULL;
    long k = strtol(s, &end, 10);
    if (end == s || k < 1 || n + k > MAX_RANKS) return 0;
    while (k-- > 0) host_of[n++] = h;
    if (*end == '\0') return n;
    if (*end != '+') return 0;
    s = end + 1;
  }
}

int main(int argc, char **argv) {
  int host_of[MAX_RANKS];
  int n = argc == 2 ? parse_layout(argv[1], host_of) : 0;
  if (n == 0) {
    fprintf(stderr, "usage: tnt_sim_reference HOSTSxRANKS_PER_HOST | R0+R1+... (ranks of each "
                    "host; at most %d ranks)\n", MAX_RANKS);
    return 2;
  }
  tnt__threads_world_t *world = NULL;
  if (tnt__threads_world_create(n, host_of, &world) != TNT_OK) return 1;
  pthread_t th[MAX_RANKS];
  rank_arg_t ra[MAX_RANKS];
  for (int r = 0; r < n; r++) {
    ra[r] = (rank_arg_t){world, r, 0};
    pthread_create(&th[r], NULL, rank_main, &ra[r]);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    failed |= ra[r].failed;
  }
  tnt__threads_world_destroy(world);
  return failed;
}
