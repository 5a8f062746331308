/*
 * Allreduce across hosts, on one machine: TNT_SPLIT_HOSTS=2 makes the ranks
 * act as two hosts (consecutive blocks), so that the algorithms for several
 * hosts run here. At 4 ranks the hosts hold 2 ranks each and the
 * hierarchical algorithm serves every size; at 2 ranks (one per host) and 3
 * ranks (hosts of 2 and 1) recursive doubling and the pipelined ring do.
 * The ring is also forced at every rank count. Segments, ring depth and
 * shared-memory slots are made small (TNT_RING_SEGMENT_KB, TNT_RING_DEPTH,
 * TNT_SHM_SLOT_KB), and the counts sit around their boundaries, so that
 * partial segments, more segments than the depth, several slot rounds and
 * empty chunks all occur.
 *
 * Checks: every dtype and op on integer-valued data gives the exact result;
 * on real-valued data every rank gets the same bits, and where the design
 * fixes the combine order (the ring's chains; the hierarchical scheme on two
 * hosts: host sums in rank order, then host 0 (op) host 1) the bits equal a
 * serial reduction in that order, computed with libtnt's own kernels.
 */
#include "mpi_test_util.h"
#include "collectives/collectives.h"
#include "util/reduce.h"

#define SEGMENT_BYTES 256 /* TNT_RING_SEGMENT_KB=0.25 */
#define SLOT_BYTES 1024   /* TNT_SHM_SLOT_KB=1 */

static const size_t kCounts[] = {0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129,
                                 255, 256, 257, 511, 512, 513, 1025, 4099};
#define NCOUNTS (sizeof kCounts / sizeof kCounts[0])
#define MAX_COUNT 4099

static int g_rank, g_size;

/* The world's ranks as a group whose allreduce is `algo` (NULL: chosen by
 * size): groups take TNT_ALLREDUCE_ALGORITHM from the settings loaded last. */
static tnt_group_t *world_with(tnt_context_t *ctx, const char *algo) {
  int ranks[64];
  for (int r = 0; r < g_size; r++) ranks[r] = r;
  if (algo != NULL) setenv("TNT_ALLREDUCE_ALGORITHM", algo, 1);
  MT_OK(tnt_settings_load());
  tnt_group_t *g = NULL;
  tnt_status_t st = tnt_group_create(ctx, ranks, g_size, &g);
  unsetenv("TNT_ALLREDUCE_ALGORITHM");
  MT_OK(tnt_settings_load());
  if (st != TNT_OK) mt_fatal("tnt_group_create (%s): %s", algo ? algo : "auto", mt_st(st));
  return g;
}

/* The algorithm that the layout calls for at `bytes`. */
static const char *expected_algo(size_t bytes) {
  if (g_size == 1) return "shm";
  if (g_size == 4) return "hier";
  return bytes <= 64 * 1024 ? "rd" : "ring";
}

static void test_selection(tnt_group_t *g) {
  mt_set_case("layout of %d ranks as 2 hosts", g_size);
  MT_CHECK(tnt_group_num_hosts(g) == (g_size >= 2 ? 2 : 1), "%d hosts", tnt_group_num_hosts(g));
  MT_CHECK(tnt_group_local_size(g) == (g_rank < (g_size + 1) / 2 ? (g_size + 1) / 2 : g_size / 2),
           "%d ranks on this host", tnt_group_local_size(g));
  static const size_t sizes[] = {4, 4096, 65536, 65540, (size_t)1 << 26};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    mt_set_case("algorithm for %zu bytes on %d ranks as 2 hosts", sizes[s], g_size);
    const char *got = tnt_allreduce_algorithm(g, sizes[s]);
    MT_CHECK(got != NULL && strcmp(got, expected_algo(sizes[s])) == 0, "expected %s, got %s",
             expected_algo(sizes[s]), got ? got : "NULL");
  }
}

static void test_exact(tnt_group_t *g, const char *name, void *in, void *out, void *want) {
  for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
    const tnt_dtype_t dt = (tnt_dtype_t)d;
    for (int o = 0; o < TNT_OP_COUNT; o++) {
      const tnt_op_t op = (tnt_op_t)o;
      for (size_t ci = 0; ci < NCOUNTS; ci++) {
        const size_t count = kCounts[ci];
        const uint64_t seed = (uint64_t)(d * 1000 + o * 100) + ci;
        mt_set_case("%s exact %s %s count=%zu", name, mt_dname(dt), mt_oname(op), count);
        mt_fill(in, count, dt, seed, g_rank);
        mt_fill_sentinel(out, count, dt);
        MT_OK(tnt_allreduce(g, in, out, count, dt, op));
        mt_expected_reduce(want, count, dt, op, seed, NULL, g_size);
        mt_compare(dt, out, want, count, "allreduce");
        /* In place as well. */
        MT_OK(tnt_allreduce(g, in, in, count, dt, op));
        mt_compare(dt, in, want, count, "allreduce in place");
      }
    }
  }
}

/* Rank r's real-valued input. */
static void fill_real(void *buf, size_t count, tnt_dtype_t dt, uint64_t seed, int r) {
  mt_rng_t rng = mt_rng(seed, (uint64_t)r, 91);
  for (size_t i = 0; i < count; i++) mt_store(dt, buf, i, mt_uniform(&rng) * 100.0 - 50.0);
}

/* The ring's order: chunk q starts at rank q + 1 and is combined at ranks
 * q + 2, q + 3, ..., ending at rank q (each adds its own input to what it
 * received). */
static void ring_reference(void *want, size_t count, tnt_dtype_t dt, tnt_op_t op, uint64_t seed,
                           uint8_t *scratch) {
  const size_t esz = mt_dsize(dt);
  uint8_t *x = scratch; /* every rank's input, one after the other */
  for (int r = 0; r < g_size; r++) fill_real(x + (size_t)r * count * esz, count, dt, seed, r);
  for (int q = 0; q < g_size; q++) {
    size_t lo, hi;
    tnt__slice(count, esz, g_size, q, &lo, &hi);
    uint8_t *acc = (uint8_t *)want + lo * esz;
    memcpy(acc, x + ((size_t)((q + 1) % g_size) * count + lo) * esz, (hi - lo) * esz);
    for (int i = 2; i <= g_size; i++) {
      uint8_t *mine = x + ((size_t)((q + i) % g_size) * count + lo) * esz;
      tnt__reduce(mine, acc, hi - lo, dt, op);
      memcpy(acc, mine, (hi - lo) * esz);
    }
  }
  tnt__reduce_finish(want, count, dt, op, g_size);
}

/* Two hosts of two ranks: host sums in rank order, then host 0 (op) host 1. */
static void hier_reference(void *want, size_t count, tnt_dtype_t dt, tnt_op_t op, uint64_t seed,
                           uint8_t *scratch) {
  const size_t esz = mt_dsize(dt);
  const tnt_op_t sum_op = op == TNT_AVERAGE ? TNT_SUM : op;
  uint8_t *x = scratch, *h1 = scratch + 4 * count * esz;
  for (int r = 0; r < 4; r++) fill_real(x + (size_t)r * count * esz, count, dt, seed, r);
  const void *host0[2] = {x, x + count * esz}, *host1[2] = {x + 2 * count * esz,
                                                            x + 3 * count * esz};
  tnt__reduce_many(want, host0, 2, count, dt, sum_op, 4);
  tnt__reduce_many(h1, host1, 2, count, dt, sum_op, 4);
  tnt__reduce(want, h1, count, dt, sum_op);
  tnt__reduce_finish(want, count, dt, op, 4);
}

static void test_order(tnt_group_t *g, const char *name, int is_ring, void *in, void *out,
                       void *want, uint8_t *scratch) {
  static const tnt_dtype_t dts[] = {TNT_FLOAT32, TNT_FLOAT64, TNT_FLOAT16, TNT_BFLOAT16};
  static const tnt_op_t ops[] = {TNT_SUM, TNT_AVERAGE};
  const int fixed_order = is_ring || g_size == 4;
  for (size_t di = 0; di < 4; di++) {
    for (size_t oi = 0; oi < 2; oi++) {
      for (size_t ci = 0; ci < NCOUNTS; ci++) {
        const size_t count = kCounts[ci];
        const tnt_dtype_t dt = dts[di];
        const uint64_t seed = 7000 + di * 100 + oi * 10 + ci;
        mt_set_case("%s real %s %s count=%zu", name, mt_dname(dt), mt_oname(ops[oi]), count);
        fill_real(in, count, dt, seed, g_rank);
        MT_OK(tnt_allreduce(g, in, out, count, dt, ops[oi]));
        /* Every rank holds the same bits. */
        uint64_t h = mt_hash(out, count * mt_dsize(dt), 1), h0 = h;
        MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        MT_CHECK(h == h0, "rank %d's result differs from rank 0's", g_rank);
        if (!fixed_order) continue;
        if (is_ring) {
          ring_reference(want, count, dt, ops[oi], seed, scratch);
        } else {
          hier_reference(want, count, dt, ops[oi], seed, scratch);
        }
        mt_compare(dt, out, want, count, "allreduce against the serial order");
      }
    }
  }
}

int main(int argc, char **argv) {
  mt_init("test_hosts_mpi", &argc, &argv, 1);
  g_rank = mt_state()->rank;
  g_size = mt_state()->size;
  if (g_size > 64) mt_fatal("at most 64 ranks");
  /* Read when the context and its groups are created. */
  setenv("TNT_SPLIT_HOSTS", g_size >= 2 ? "2" : "1", 1);
  setenv("TNT_RING_SEGMENT_KB", "0.25", 1);
  setenv("TNT_RING_DEPTH", "3", 1);
  setenv("TNT_SHM_SLOT_KB", "1", 1);
  tnt_context_t *ctx = mt_context(NULL);
  const double t0 = mt_now();
  const size_t bytes = MAX_COUNT * 8;
  void *in = mt_alloc(bytes), *out = mt_alloc(bytes), *want = mt_alloc(bytes);
  uint8_t *scratch = mt_alloc(bytes * (size_t)(g_size + 1));

  tnt_group_t *chosen = world_with(ctx, NULL), *ring = world_with(ctx, "ring");
  test_selection(chosen);
  test_exact(chosen, "chosen", in, out, want);
  test_exact(ring, "ring", in, out, want);
  test_order(chosen, "chosen", 0, in, out, want, scratch);
  test_order(ring, "ring", 1, in, out, want, scratch);

  /* A value that cannot be a host count fails with a message. */
  mt_set_case("TNT_SPLIT_HOSTS out of range");
  setenv("TNT_SPLIT_HOSTS", "0", 1);
  tnt_context_t *bad = NULL;
  MT_EXPECT_ST(tnt_context_create(NULL, &bad), TNT_ERR_INVALID_ARG);

  if (g_rank == 0) printf("test_hosts_mpi: %.1f s\n", mt_now() - t0);
  tnt_group_destroy(chosen);
  tnt_group_destroy(ring);
  free(in);
  free(out);
  free(want);
  free(scratch);
  MT_OK(tnt_context_destroy(ctx));
  int rc = mt_verdict();
  MPI_Finalize();
  return rc;
}
