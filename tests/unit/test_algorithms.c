/*
 * Tests of the allreduce's choice of algorithm by message size and group
 * size (src/collectives/algorithms.c), on communicators of up to 1024 ranks
 * with one rank per host: the choice reads only the communicator's shape
 * and the settings, so no transport is needed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "tnt/tnt.h"

/* The choice for n ranks on n hosts. */
static tnt__comm_t flat(int n) {
  tnt__comm_t c = {.rank = 0, .size = n, .local_rank = 0, .local_size = 1, .num_hosts = n};
  tnt__algo_resolve(&c);
  return c;
}

static const char *chosen(const tnt__comm_t *c, size_t bytes) {
  return tnt__algo_select(c, TNT__COLL_ALLREDUCE, bytes)->name;
}

/* The smallest size at which n ranks choose the ring (searched in powers of
 * two up to 1 GiB), 0 when none. */
static size_t ring_from(int n) {
  tnt__comm_t c = flat(n);
  for (size_t b = 1; b <= ((size_t)1 << 30); b *= 2) {
    if (strcmp(chosen(&c, b), "ring") == 0) return b;
  }
  return 0;
}

static void test_two_and_three_ranks_use_recursive_doubling_then_the_ring(void **state) {
  (void)state;
  for (int n = 2; n <= 3; n++) {
    tnt__comm_t c = flat(n);
    assert_string_equal(chosen(&c, 4), "rd");
    assert_string_equal(chosen(&c, 64 * 1024), "rd");
    assert_string_equal(chosen(&c, 64 * 1024 + 4), "ring");
    assert_string_equal(chosen(&c, (size_t)1 << 28), "ring");
  }
}

static void test_many_hosts_use_rabenseifner_for_medium_sizes(void **state) {
  (void)state;
  static const int sizes[] = {8, 16, 64, 256, 1024};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    tnt__comm_t c = flat(sizes[i]);
    assert_string_equal(chosen(&c, 16 * 1024), "rd");
    assert_string_equal(chosen(&c, 128 * 1024), "rabenseifner");
    assert_string_equal(chosen(&c, (size_t)1 << 30), "ring");
  }
}

/* The smallest size at which n ranks leave recursive doubling. */
static size_t rd_until(int n) {
  tnt__comm_t c = flat(n);
  size_t b = 1;
  while (strcmp(chosen(&c, b), "rd") == 0) b++;
  return b;
}

/* Recursive doubling gives way to Rabenseifner's algorithm where the two
 * crossed in the simulation at 100 Gbit/s (tools/research/scale_bench.py,
 * both forced, powers of two from 4 KiB): between 16 and 32 KiB on 8, 64,
 * 256 and 1024 hosts; never above the 64 KiB measured on 2 hosts. */
static void test_recursive_doubling_gives_way_where_the_simulation_crossed(void **state) {
  (void)state;
  static const int sizes[] = {8, 64, 256, 1024};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    const size_t b = rd_until(sizes[i]);
    assert_true(b > 16 * 1024 && b <= 32 * 1024);
  }
  for (int n = 2; n <= 1024; n *= 2) assert_true(rd_until(n) <= 64 * 1024 + 1);
}

/* The ring's 2(n-1) latencies make it worth its pipeline only at sizes
 * that grow with n (powers of two; between them, folding the extra ranks
 * into Rabenseifner's algorithm costs two more sends of the vector), and
 * sooner once the vectors leave the cache. */
static void test_the_ring_threshold_grows_with_the_hosts(void **state) {
  (void)state;
  size_t before = 0;
  for (int n = 4; n <= 1024; n *= 2) {
    const size_t b = ring_from(n);
    assert_true(b >= before);
    before = b;
  }
  assert_true(ring_from(4) < ring_from(64) && ring_from(64) < ring_from(1024));
  assert_true(ring_from(1024) >= ((size_t)16 << 20));
  assert_true(ring_from(8) <= ((size_t)1 << 20));
}

/* Sets (or, with NULL, unsets) a setting and reloads the registry. */
static void use_setting(const char *name, const char *value) {
  if (value != NULL) setenv(name, value, 1);
  else unsetenv(name);
  assert_int_equal(tnt_settings_load(), TNT_OK);
}

static void set_reduce_gbps(const char *value) { use_setting("TNT_REDUCE_GBPS", value); }

/* The ring wins only by hiding the reductions: where a rank reduces as fast
 * as it likes (the simulated clusters), a power of two never chooses it and
 * keeps Rabenseifner's algorithm up to 1 GiB and beyond, while the fold of n > p
 * still makes the ring worth it from some size; the slower the reductions,
 * the sooner the ring. */
static void test_the_ring_follows_the_reduction_rate(void **state) {
  (void)state;
  const size_t default_from = ring_from(64);
  set_reduce_gbps("1000000000");
  for (int n = 4; n <= 1024; n *= 2) {
    tnt__comm_t c = flat(n);
    assert_int_equal(ring_from(n), 0);
    assert_string_equal(chosen(&c, (size_t)1 << 30), "rabenseifner");
  }
  assert_true(ring_from(48) > 0 && ring_from(1000) > 0);
  set_reduce_gbps("2");
  const size_t slow_from = ring_from(64);
  set_reduce_gbps(NULL);
  assert_true(slow_from > 0 && slow_from < default_from);
  assert_int_equal(ring_from(64), default_from);
}

static void set_network(const char *gbit, const char *latency_us) {
  use_setting("TNT_NETWORK_GBIT", gbit);
  use_setting("TNT_NETWORK_LATENCY_US", latency_us);
}

/* Recursive doubling gives way at 2 latencies x the link's rate: where the
 * simulated fat-trees crossed at 10 Gbit/s with 2 us between hosts (4 to
 * 8 KiB) and at 400 Gbit/s with 1 us (64 to 128 KiB: recursive doubling
 * up to the 64 KiB cap), on 8 and 64 hosts; 2 and 3 ranks keep the cap. */
static void test_recursive_doubling_follows_the_network(void **state) {
  (void)state;
  set_network("10", "2");
  for (int n = 8; n <= 64; n *= 8) assert_true(rd_until(n) > 4 * 1024 && rd_until(n) <= 8 * 1024);
  assert_int_equal(rd_until(2), 64 * 1024 + 1);
  set_network("400", "1");
  for (int n = 8; n <= 64; n *= 8) assert_int_equal(rd_until(n), 64 * 1024 + 1);
  set_network(NULL, NULL);
}

/* The ring's crossing grows with the latency it pays 2(n-1) times, and
 * comes sooner when the link outruns the reductions more (400 Gbit/s at a
 * quarter of the latency: the same latency x rate, reductions 4 times
 * slower next to the link). */
static void test_the_ring_follows_the_network(void **state) {
  (void)state;
  const size_t base = ring_from(64);
  set_network("100", "4");
  const size_t slow_network = ring_from(64);
  set_network("400", "0.25");
  const size_t fast_link = ring_from(64);
  set_network(NULL, NULL);
  assert_true(slow_network > base && fast_link < base);
}

static void test_a_forced_algorithm_serves_every_size(void **state) {
  (void)state;
  use_setting("TNT_ALLREDUCE_ALGORITHM", "rabenseifner");
  tnt__comm_t c = flat(2);
  use_setting("TNT_ALLREDUCE_ALGORITHM", NULL);
  assert_string_equal(chosen(&c, 4), "rabenseifner");
  assert_string_equal(chosen(&c, (size_t)1 << 30), "rabenseifner");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_and_three_ranks_use_recursive_doubling_then_the_ring),
      cmocka_unit_test(test_many_hosts_use_rabenseifner_for_medium_sizes),
      cmocka_unit_test(test_the_ring_threshold_grows_with_the_hosts),
      cmocka_unit_test(test_recursive_doubling_gives_way_where_the_simulation_crossed),
      cmocka_unit_test(test_the_ring_follows_the_reduction_rate),
      cmocka_unit_test(test_recursive_doubling_follows_the_network),
      cmocka_unit_test(test_the_ring_follows_the_network),
      cmocka_unit_test(test_a_forced_algorithm_serves_every_size),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
