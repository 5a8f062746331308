/*
 * tnt-bench: measures one libtnt collective against the MPI collective that
 * it stands in for, on every rank of an MPI job.
 *
 * For every message size the tool runs libtnt's blocking call (with the
 * algorithm libtnt picks by itself) and the MPI peer on MPI_COMM_WORLD in
 * the same process, alternating between the two in several timed trials so
 * that both sides see the same machine noise, and reports the median of
 * each side. Every result of both sides is checked against exact expected
 * values, so a fast but wrong collective cannot pass. A single-process
 * memcpy of the same size, measured on rank 0, gives the bandwidth that no
 * collective on this machine can beat.
 *
 * Exit status: 0 when every check passed, 1 when a result was wrong, 2 for
 * bad arguments, 3 when libtnt reported an error.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "tnt/tnt.h"
#include "util/values.h"

enum {
  EXIT_CHECK_FAILED = 1,
  EXIT_USAGE = 2,
  EXIT_TNT_ERROR = 3,
};

#define KIB ((size_t)1024)
#define MIB (KIB * KIB)
#define GIB (KIB * MIB)

#define DEFAULT_MIN_BYTES (4 * KIB)
#define DEFAULT_MAX_BYTES (64 * MIB)
/* MPI counts are ints: 1G keeps every byte count of the MPI peer in range. */
#define LIMIT_MAX_BYTES GIB
#define MAX_SIZES 64

/* Automatic iteration counts: about 256M bytes moved per trial, at least 5
 * calls so that a trial averages over more than one call, at most 1000 so
 * that small sizes do not dominate the run, and fewer when a single call is
 * slow enough that a trial would last longer than AUTO_TRIAL_SECONDS (ranks
 * oversubscribed on few cores). */
#define AUTO_BYTES_PER_TRIAL (256 * MIB)
#define AUTO_MIN_ITERS 5
#define AUTO_MAX_ITERS 1000
#define AUTO_TRIAL_SECONDS 0.1
#define MAX_ITERS 1000000000L

/* Odd, so that the median is the time of one trial. */
#define TRIALS 5
#define WARMUP_CALLS 3
#define BROADCAST_ROOT 0
/* Wrong elements printed per check; the count of the rest follows. */
#define MISMATCHES_REPORTED 3

/* Input patterns repeat with a short period; checks compare whole copies of
 * a template holding TEMPLATE_PERIODS periods, which keeps filling and
 * checking 64M buffers at memcpy speed. */
#define DENSE_PERIOD 7
#define SPARSE_PERIOD 16
#define TEMPLATE_PERIODS 128
#define TEMPLATE_BYTES (SPARSE_PERIOD * TEMPLATE_PERIODS * sizeof(int64_t))

typedef enum collective {
  COLL_ALLREDUCE,
  COLL_BROADCAST,
  COLL_ALLGATHER,
  COLL_REDUCE_SCATTER,
} collective_t;

static const char *const kCollectiveNames[] = {"allreduce", "broadcast", "allgather",
                                               "reduce_scatter"};
static const char *const kMpiPeerNames[] = {"MPI_Allreduce", "MPI_Bcast", "MPI_Allgather",
                                            "MPI_Reduce_scatter_block"};

typedef enum side {
  SIDE_TNT,
  SIDE_MPI,
} side_t;

static const char *const kSideNames[] = {"tnt", "mpi"};

/* "float32, float64, ... or uint8": every dtype that --dtype accepts. */
static const char *dtype_list(void) {
  static char list[160];
  if (list[0] == '\0') {
    size_t n = 0;
    for (int d = 0; d < TNT_DTYPE_COUNT; d++) {
      const char *sep = d == 0 ? "" : (d + 1 == TNT_DTYPE_COUNT ? " or " : ", ");
      n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", sep,
                            tnt_dtype_name((tnt_dtype_t)d));
    }
  }
  return list;
}

typedef struct options {
  collective_t coll;
  size_t min_bytes;
  size_t max_bytes;
  long iters; /* 0 selects the automatic count */
  const char *json_path;
  tnt_dtype_t dtype;
  tnt_dtype_t wire; /* --compression: the wire dtype of float32 (TNT_FLOAT32: none) */
} options_t;

/* One message size as run: element counts follow the collective's layout. */
typedef struct size_case {
  size_t bytes; /* message size reported and used for bandwidth */
  size_t count; /* elements per rank for allgather and reduce_scatter, of the vector otherwise */
} size_case_t;

typedef struct row {
  size_t bytes;
  const char *algorithm;
  long iters;
  double tnt_s; /* median per-call time, max over ranks */
  double mpi_s;
  double memcpy_gbps;
  bool ok;
} row_t;

typedef enum pattern {
  PATTERN_INPUT,    /* what rank `rank` contributes */
  PATTERN_SUM,      /* the sum of every rank's contribution */
  PATTERN_SENTINEL, /* what outputs hold before a call, never a valid result */
} pattern_t;

typedef struct bench {
  const options_t *opt;
  tnt_context_t *ctx;
  tnt_group_t *world;
  int rank;
  int nranks;
  int hosts;           /* hosts in the job */
  int max_per_host;    /* the most ranks that share one host */
  int cores;           /* online cores of the most crowded host */
  bool oversubscribed; /* some host runs more ranks than it has cores */
  size_t esz;
  bool sparse; /* see contribution */
  int64_t dense_rank_sum;
  unsigned char *send;
  unsigned char *recv;
  size_t capacity;
  tnt_fusion_t *fusion; /* --compression: a set of one tensor of fusion_count elements */
  size_t fusion_count;
  MPI_Datatype mpi_type;
  MPI_Op mpi_op;
  bool own_op;
  size_case_t cases[MAX_SIZES];
  int ncases;
  unsigned long mismatches; /* on this rank, over the whole run */
} bench_t;

/* ------------------------------------------------------------ arguments */

/* Before MPI is initialized the launcher's environment is the only way to
 * know the rank; it lets exactly one process print argument errors. */
static int launcher_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char *v = getenv(vars[i]);
    if (v != NULL && *v != '\0') return atoi(v);
  }
  return 0;
}

static void print_usage(FILE *out) {
  fprintf(out,
          "Usage: tnt-bench {allreduce|broadcast|allgather|reduce_scatter} [--min BYTES]\n"
          "                 [--max BYTES] [--iters N] [--json FILE] [--dtype TYPE]\n"
          "                 [--compression fp16|bf16]\n"
          "       tnt-bench --list\n"
          "\n"
          "Measures a libtnt collective (libtnt's own choice of algorithm) against the MPI\n"
          "collective it replaces, checks every result of both, and prints one line per size.\n"
          "Run it under mpirun; every rank takes part.\n"
          "\n"
          "Options:\n"
          "  --min BYTES   smallest message size (default 4K); sizes double up to --max\n"
          "  --max BYTES   largest message size (default 64M, at most 1G)\n"
          "                BYTES is an integer with an optional K, M or G suffix (powers of\n"
          "                1024). Allgather sizes are the whole gathered buffer; each rank\n"
          "                contributes size / ranks. Reduce-scatter sizes are the whole\n"
          "                vector that is reduced; each rank receives size / ranks.\n"
          "  --iters N     calls per timed trial, or 'auto' (default): clamp(256M / size,\n"
          "                5, 1000), fewer when one trial would take longer than 0.1 s\n"
          "  --dtype TYPE  %s\n"
          "                (default float32)\n"
          "  --compression fp16|bf16\n"
          "                allreduce of float32 only: libtnt's side is a fusion set of one\n"
          "                tensor whose values travel in 16 bits (TNT_COMPRESSION), against\n"
          "                MPI_Allreduce of the float32 vector; the sizes are the float32\n"
          "                vector's\n"
          "  --json FILE   also write the results to FILE as JSON (rank 0), with the hosts,\n"
          "                ranks per host and whether they were oversubscribed\n"
          "  --list        list libtnt's algorithms of each collective, with what they do\n"
          "                (the names that TNT_ALLREDUCE_ALGORITHM, TNT_BROADCAST_ALGORITHM\n"
          "                and TNT_ALLGATHER_ALGORITHM accept); needs no mpirun\n"
          "  -h, --help    print this help\n"
          "\n"
          "Exit status: 0 all checks passed, 1 a result was wrong, 2 bad arguments,\n"
          "3 libtnt reported an error.\n"
          "Example: mpirun -np 4 tnt-bench allreduce --min 4K --max 64M\n",
          dtype_list());
}

/* Reports an argument error on the launcher's rank 0 only; every rank parses
 * the same argv, so every rank fails the same way and exits. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...) {
  if (launcher_rank() == 0) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tnt-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'tnt-bench --help'.\n", stderr);
    va_end(ap);
  }
  return EXIT_USAGE;
}

/* Parses "4096", "4K", "64M", "1G" (suffixes are powers of 1024). */
static bool parse_size(const char *s, size_t *out) {
  if (s == NULL || *s < '0' || *s > '9') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return false;
  unsigned long long unit = 1;
  if (*end != '\0') {
    switch (*end) {
      case 'K':
      case 'k':
        unit = KIB;
        break;
      case 'M':
      case 'm':
        unit = MIB;
        break;
      case 'G':
      case 'g':
        unit = GIB;
        break;
      default:
        return false;
    }
    if (end[1] != '\0') return false;
  }
  if (v == 0 || v > LIMIT_MAX_BYTES / unit) return false;
  *out = (size_t)(v * unit);
  return true;
}

static bool parse_iters(const char *s, long *out) {
  if (s == NULL) return false;
  if (strcmp(s, "auto") == 0) {
    *out = 0;
    return true;
  }
  if (*s < '0' || *s > '9') return false;
  errno = 0;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < 1 || v > MAX_ITERS) return false;
  *out = v;
  return true;
}

static bool parse_dtype(const char *s, tnt_dtype_t *out) {
  for (int d = 0; s != NULL && d < TNT_DTYPE_COUNT; d++) {
    if (strcmp(s, tnt_dtype_name((tnt_dtype_t)d)) == 0) {
      *out = (tnt_dtype_t)d;
      return true;
    }
  }
  return false;
}

static bool parse_collective(const char *s, collective_t *out) {
  for (int c = 0; c < (int)(sizeof(kCollectiveNames) / sizeof(kCollectiveNames[0])); c++) {
    if (strcmp(s, kCollectiveNames[c]) == 0) {
      *out = (collective_t)c;
      return true;
    }
  }
  return false;
}

/* Splits "--name=value" or takes the value from the next argument. Returns
 * NULL when the option has no value. */
static const char *option_value(int argc, char **argv, int *i, const char *arg) {
  const char *eq = strchr(arg, '=');
  if (eq != NULL) return eq + 1;
  if (*i + 1 >= argc) return NULL;
  *i += 1;
  return argv[*i];
}

/* Returns true when `arg` is `name` or starts with "name=". */
static bool is_option(const char *arg, const char *name) {
  size_t n = strlen(name);
  return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

enum option_id { OPT_MIN, OPT_MAX, OPT_ITERS, OPT_JSON, OPT_DTYPE, OPT_COMPRESSION, OPT_COUNT };

static const char *const kOptionNames[OPT_COUNT] = {"--min",  "--max",   "--iters",
                                                    "--json", "--dtype", "--compression"};

/* Stores the value `v` of option `id`; returns -1 when it was fine, else
 * the exit code. */
static int set_option(enum option_id id, const char *v, options_t *opt) {
  switch (id) {
    case OPT_MIN:
    case OPT_MAX:
      if (!parse_size(v, id == OPT_MIN ? &opt->min_bytes : &opt->max_bytes)) {
        return usage_error(
            "%s: invalid size '%s' (expected a positive integer with an optional "
            "K, M or G suffix, at most 1G, e.g. 4K or 64M)",
            kOptionNames[id], v);
      }
      return -1;
    case OPT_ITERS:
      if (!parse_iters(v, &opt->iters)) {
        return usage_error("--iters: invalid count '%s' (expected 'auto' or 1 to 1000000000)", v);
      }
      return -1;
    case OPT_JSON:
      if (*v == '\0') return usage_error("--json: empty file name");
      opt->json_path = v;
      return -1;
    case OPT_COMPRESSION:
      if (strcmp(v, "fp16") == 0) {
        opt->wire = TNT_FLOAT16;
      } else if (strcmp(v, "bf16") == 0) {
        opt->wire = TNT_BFLOAT16;
      } else {
        return usage_error("--compression: unknown '%s' (expected fp16 or bf16)", v);
      }
      return -1;
    default:
      if (!parse_dtype(v, &opt->dtype)) {
        return usage_error("--dtype: unknown type '%s' (expected %s)", v, dtype_list());
      }
      return -1;
  }
}

/* Handles the option at argv[*i] and its value ("--min 4K" or "--min=4K");
 * returns -1 when it was fine, else the exit code. */
static int parse_option(int argc, char **argv, int *i, options_t *opt) {
  const char *arg = argv[*i];
  for (int id = 0; id < OPT_COUNT; id++) {
    if (!is_option(arg, kOptionNames[id])) continue;
    const char *v = option_value(argc, argv, i, arg);
    if (v == NULL) return usage_error("%s needs a value", kOptionNames[id]);
    return set_option((enum option_id)id, v, opt);
  }
  return usage_error(
      "unknown option '%s' (expected --min, --max, --iters, --json, --dtype, --compression or "
      "--help)",
      arg);
}

/* tnt-bench --list: every algorithm of libtnt's tables, by collective. */
static int list_algorithms(void) {
  for (int c = COLL_ALLREDUCE; c <= COLL_ALLGATHER; c++) {
    printf("%s:\n", kCollectiveNames[c]);
    const char *name, *description;
    for (int i = 0; tnt_algorithm_info(kCollectiveNames[c], i, &name, &description) == TNT_OK;
         i++) {
      printf("  %-6s %s\n", name, description);
    }
  }
  return 0;
}

/* Returns -1 when the run should go on, else the exit code (0 for --help
 * and --list). */
static int parse_options(int argc, char **argv, options_t *opt) {
  *opt = (options_t){.coll = COLL_ALLREDUCE,
                     .min_bytes = DEFAULT_MIN_BYTES,
                     .max_bytes = DEFAULT_MAX_BYTES,
                     .dtype = TNT_FLOAT32,
                     .wire = TNT_FLOAT32};
  bool have_coll = false;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      if (launcher_rank() == 0) print_usage(stdout);
      return 0;
    }
    if (strcmp(arg, "--list") == 0) return launcher_rank() == 0 ? list_algorithms() : 0;
    if (arg[0] == '-') {
      int rc = parse_option(argc, argv, &i, opt);
      if (rc >= 0) return rc;
      continue;
    }
    if (have_coll) {
      return usage_error("unexpected argument '%s' (the collective is already %s)", arg,
                         kCollectiveNames[opt->coll]);
    }
    if (!parse_collective(arg, &opt->coll)) {
      return usage_error(
          "unknown collective '%s' (expected allreduce, broadcast, allgather or reduce_scatter)",
          arg);
    }
    have_coll = true;
  }
  if (!have_coll) {
    return usage_error(
        "missing collective (expected allreduce, broadcast, allgather or reduce_scatter)");
  }
  if (opt->wire != TNT_FLOAT32 && (opt->coll != COLL_ALLREDUCE || opt->dtype != TNT_FLOAT32)) {
    return usage_error("--compression applies to the allreduce of float32 only");
  }
  if (opt->min_bytes > opt->max_bytes) {
    return usage_error("--min (%zu bytes) must not exceed --max (%zu bytes)", opt->min_bytes,
                       opt->max_bytes);
  }
  return -1;
}

/* MPI has no half-precision types, so the MPI peer sums float16 and
 * bfloat16 with user-defined operations on MPI_UINT16_T, which add in float
 * and round to nearest even with libtnt's own conversions. */
static void mpi_sum_float16(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) {
    b[i] = tnt__float_to_half(tnt__half_to_float(a[i]) + tnt__half_to_float(b[i]));
  }
}

static void mpi_sum_bfloat16(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) {
    b[i] = tnt__float_to_bfloat16(tnt__bfloat16_to_float(a[i]) + tnt__bfloat16_to_float(b[i]));
  }
}

/* The largest integer up to which every integer is exact in `dtype`. */
static int64_t exact_integer_limit(tnt_dtype_t dtype) {
  switch (dtype) {
    case TNT_BFLOAT16:
      return 256;
    case TNT_FLOAT16:
      return 2048;
    case TNT_FLOAT32:
      return INT64_C(1) << 24;
    case TNT_FLOAT64:
      return INT64_C(1) << 53;
    case TNT_INT32:
      return INT32_MAX;
    case TNT_INT8:
      return INT8_MAX;
    case TNT_INT16:
      return INT16_MAX;
    case TNT_UINT8:
      return UINT8_MAX;
    default:
      return INT64_MAX;
  }
}

/* ------------------------------------------------------------- patterns */

/*
 * Inputs are small positive integers, so every partial sum that any
 * reduction order forms is an integer that the dtype holds exactly, and
 * results can be compared bit for bit. The dense pattern depends on rank
 * and index: value(r, i) = r % 8 + 1 + i % 7 (sums stay below 256, exact
 * even in bfloat16, for up to 24 ranks). Beyond the point where a dtype
 * can hold the dense sums, the sparse pattern keeps them small for any
 * rank count: rank r contributes 1 where i % 16 == r % 16 and 0 elsewhere.
 */
static int64_t contribution(const bench_t *b, int rank, size_t i) {
  if (b->sparse) return (size_t)(rank % SPARSE_PERIOD) == i % SPARSE_PERIOD;
  return rank % 8 + 1 + (int64_t)(i % DENSE_PERIOD);
}

static int64_t sum_of_contributions(const bench_t *b, size_t i) {
  if (!b->sparse) return b->dense_rank_sum + (int64_t)b->nranks * (int64_t)(i % DENSE_PERIOD);
  int64_t residue = (int64_t)(i % SPARSE_PERIOD);
  int64_t full = b->nranks / SPARSE_PERIOD;
  return full + (residue < b->nranks % SPARSE_PERIOD ? 1 : 0);
}

static void choose_pattern(bench_t *b) {
  b->dense_rank_sum = 0;
  for (int r = 0; r < b->nranks; r++) b->dense_rank_sum += r % 8 + 1;
  int64_t max_sum = b->dense_rank_sum + (int64_t)b->nranks * (DENSE_PERIOD - 1);
  /* Compressed, the sums must also be exact in the wire dtype. */
  tnt_dtype_t exact = b->opt->wire != TNT_FLOAT32 ? b->opt->wire : b->opt->dtype;
  b->sparse = max_sum > exact_integer_limit(exact);
}

static size_t template_elems(const bench_t *b) {
  return (size_t)(b->sparse ? SPARSE_PERIOD : DENSE_PERIOD) * TEMPLATE_PERIODS;
}

/* Fills `tmpl` with template_elems() elements of `pattern`, those of the
 * indices from `first` on. */
static void make_template(const bench_t *b, pattern_t pattern, int rank, size_t first,
                          unsigned char *tmpl) {
  size_t n = template_elems(b);
  for (size_t i = 0; i < n; i++) {
    int64_t v = -1;
    if (pattern == PATTERN_INPUT) v = contribution(b, rank, first + i);
    if (pattern == PATTERN_SUM) v = sum_of_contributions(b, first + i);
    tnt__store_value(b->opt->dtype, tmpl, i, (double)v);
  }
}

/* Writes elements [0, count) of `buf` from the periodic template. */
static void fill(const bench_t *b, void *buf, size_t count, const unsigned char *tmpl) {
  size_t chunk = template_elems(b);
  for (size_t i = 0; i < count; i += chunk) {
    size_t n = count - i < chunk ? count - i : chunk;
    memcpy((unsigned char *)buf + i * b->esz, tmpl, n * b->esz);
  }
}

static void fill_pattern(const bench_t *b, void *buf, size_t count, pattern_t p, int rank) {
  unsigned char tmpl[TEMPLATE_BYTES];
  make_template(b, p, rank, 0, tmpl);
  fill(b, buf, count, tmpl);
}

/* What a check reports when it finds a wrong element. */
typedef struct check_label {
  side_t side;
  size_t bytes;
  const char *when;
} check_label_t;

/* Compares elements [0, count) of `buf` with the template; `base` is the
 * index of buf[0] in the whole result, for the message. Adds the number of
 * wrong elements to *wrong and reports the first few of the check. */
static void check_region(const bench_t *b, const void *buf, size_t base, size_t count,
                         const unsigned char *tmpl, const check_label_t *label,
                         unsigned long *wrong) {
  size_t chunk = template_elems(b);
  for (size_t i = 0; i < count; i += chunk) {
    size_t n = count - i < chunk ? count - i : chunk;
    const unsigned char *got = (const unsigned char *)buf + i * b->esz;
    if (memcmp(got, tmpl, n * b->esz) == 0) continue;
    for (size_t k = 0; k < n; k++) {
      if (memcmp(got + k * b->esz, tmpl + k * b->esz, b->esz) == 0) continue;
      if (*wrong < MISMATCHES_REPORTED) {
        fprintf(stderr,
                "tnt-bench: rank %d: %s %s of %zu bytes, %s: index %zu: expected %g, got %g\n",
                b->rank, kSideNames[label->side], kCollectiveNames[b->opt->coll], label->bytes,
                label->when, base + i + k, tnt__load_value(b->opt->dtype, tmpl, k),
                tnt__load_value(b->opt->dtype, got, k));
      }
      *wrong += 1;
    }
  }
}

/* Checks the outputs of the last call of `c` and counts wrong elements. */
static void check_result(bench_t *b, const size_case_t *c, const check_label_t *label) {
  unsigned char tmpl[TEMPLATE_BYTES];
  unsigned long wrong = 0;
  switch (b->opt->coll) {
    case COLL_ALLREDUCE:
      make_template(b, PATTERN_SUM, 0, 0, tmpl);
      check_region(b, b->recv, 0, c->count, tmpl, label, &wrong);
      break;
    case COLL_BROADCAST:
      make_template(b, PATTERN_INPUT, BROADCAST_ROOT, 0, tmpl);
      check_region(b, b->recv, 0, c->count, tmpl, label, &wrong);
      break;
    case COLL_REDUCE_SCATTER: {
      const size_t base = (size_t)b->rank * c->count;
      make_template(b, PATTERN_SUM, 0, base, tmpl);
      check_region(b, b->recv, base, c->count, tmpl, label, &wrong);
      break;
    }
    default:
      for (int r = 0; r < b->nranks; r++) {
        make_template(b, PATTERN_INPUT, r, 0, tmpl);
        size_t base = (size_t)r * c->count;
        check_region(b, b->recv + base * b->esz, base, c->count, tmpl, label, &wrong);
      }
      break;
  }
  if (wrong > 0) {
    fprintf(stderr, "tnt-bench: rank %d: %s %s of %zu bytes, %s: %lu wrong element%s\n", b->rank,
            kSideNames[label->side], kCollectiveNames[b->opt->coll], label->bytes, label->when,
            wrong, wrong == 1 ? "" : "s");
  }
  b->mismatches += wrong;
}

/* Sets inputs to this rank's contribution and outputs to the sentinel, so
 * that a call that does nothing (or only part of its work) fails the check.
 * Broadcast works in place: only the root holds the input. */
static void prepare(const bench_t *b, const size_case_t *c) {
  switch (b->opt->coll) {
    case COLL_ALLREDUCE:
      fill_pattern(b, b->send, c->count, PATTERN_INPUT, b->rank);
      fill_pattern(b, b->recv, c->count, PATTERN_SENTINEL, 0);
      break;
    case COLL_BROADCAST:
      fill_pattern(b, b->recv, c->count,
                   b->rank == BROADCAST_ROOT ? PATTERN_INPUT : PATTERN_SENTINEL, BROADCAST_ROOT);
      break;
    case COLL_REDUCE_SCATTER:
      fill_pattern(b, b->send, c->count * (size_t)b->nranks, PATTERN_INPUT, b->rank);
      fill_pattern(b, b->recv, c->count, PATTERN_SENTINEL, 0);
      break;
    default:
      fill_pattern(b, b->send, c->count, PATTERN_INPUT, b->rank);
      fill_pattern(b, b->recv, c->count * (size_t)b->nranks, PATTERN_SENTINEL, 0);
      break;
  }
}

/* ---------------------------------------------------------------- calls */

/* Returns a failed status from the enclosing function. */
#define TNT_CHECK_BENCH(expr)  \
  do {                         \
    tnt_status_t st_ = (expr); \
    if (st_ < 0) return st_;   \
  } while (0)

/* A libtnt error leaves the other ranks waiting in collectives that will
 * never complete, so the whole job ends here with EXIT_TNT_ERROR. */
static void fail_tnt(bench_t *b, tnt_status_t st, const char *what) {
  const char *msg = NULL;
  if (b->ctx != NULL) tnt_context_error(b->ctx, &msg);
  fprintf(stderr, "tnt-bench: rank %d: %s failed: %s (%s)\n", b->rank, what, tnt_status_string(st),
          msg != NULL ? msg : "no further detail");
  fflush(stderr);
  tnt_context_abort(b->ctx, EXIT_TNT_ERROR);
  exit(EXIT_TNT_ERROR);
}

/* --compression: one fusion round of a set holding the whole vector; the
 * set is made anew when the size changes (every rank runs the sizes in the
 * same order, so creation, which is collective, matches). */
static tnt_status_t call_compressed(bench_t *b, const size_case_t *c, const char **what) {
  if (b->fusion == NULL || b->fusion_count != c->count) {
    *what = "tnt_fusion_destroy";
    TNT_CHECK_BENCH(tnt_fusion_destroy(b->fusion));
    b->fusion = NULL;
    *what = "tnt_fusion_create";
    tnt_tensor_info_t info = {0, c->count, TNT_FLOAT32};
    tnt_fusion_options_t o = {
        .size = sizeof o, .threshold_bytes = 0, .op = TNT_SUM, .wire_dtype = b->opt->wire};
    TNT_CHECK_BENCH(tnt_fusion_create(b->world, &info, 1, &o, &b->fusion));
    b->fusion_count = c->count;
  }
  *what = "tnt_fusion_start";
  TNT_CHECK_BENCH(tnt_fusion_start(b->fusion, 0, b->send));
  *what = "tnt_fusion_finish";
  return tnt_fusion_finish(b->fusion, 0, b->recv, -1);
}

static void call_tnt(bench_t *b, const size_case_t *c) {
  tnt_status_t st;
  const char *what;
  if (b->opt->wire != TNT_FLOAT32) {
    st = call_compressed(b, c, &what);
    if (st < 0) fail_tnt(b, st, what);
    return;
  }
  switch (b->opt->coll) {
    case COLL_ALLREDUCE:
      what = "tnt_allreduce";
      st = tnt_allreduce(b->world, b->send, b->recv, c->count, b->opt->dtype, TNT_SUM);
      break;
    case COLL_BROADCAST:
      what = "tnt_broadcast";
      st = tnt_broadcast(b->world, b->recv, c->count, b->opt->dtype, BROADCAST_ROOT);
      break;
    case COLL_REDUCE_SCATTER:
      what = "tnt_reduce_scatter";
      st = tnt_reduce_scatter(b->world, b->send, b->recv, c->count, b->opt->dtype, TNT_SUM);
      break;
    default:
      what = "tnt_allgather";
      st = tnt_allgather(b->world, b->send, c->count, b->recv, b->opt->dtype);
      break;
  }
  if (st < 0) fail_tnt(b, st, what);
}

/* MPI errors on MPI_COMM_WORLD abort the job (MPI_ERRORS_ARE_FATAL). */
static void call_mpi(bench_t *b, const size_case_t *c) {
  int bytes = (int)(c->count * b->esz);
  switch (b->opt->coll) {
    case COLL_ALLREDUCE:
      MPI_Allreduce(b->send, b->recv, (int)c->count, b->mpi_type, b->mpi_op, MPI_COMM_WORLD);
      break;
    case COLL_BROADCAST:
      MPI_Bcast(b->recv, bytes, MPI_BYTE, BROADCAST_ROOT, MPI_COMM_WORLD);
      break;
    case COLL_REDUCE_SCATTER:
      MPI_Reduce_scatter_block(b->send, b->recv, (int)c->count, b->mpi_type, b->mpi_op,
                               MPI_COMM_WORLD);
      break;
    default:
      MPI_Allgather(b->send, bytes, MPI_BYTE, b->recv, bytes, MPI_BYTE, MPI_COMM_WORLD);
      break;
  }
}

static void call_side(bench_t *b, side_t side, const size_case_t *c) {
  if (side == SIDE_TNT) {
    call_tnt(b, c);
  } else {
    call_mpi(b, c);
  }
}

/* Runs `iters` calls after a barrier and returns the slowest rank's
 * average time per call: a collective is as fast as its slowest member. */
static double time_calls(bench_t *b, side_t side, const size_case_t *c, long iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (long k = 0; k < iters; k++) call_side(b, side, c);
  double mine = (MPI_Wtime() - t0) / (double)iters;
  double slowest = 0.0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

/* ------------------------------------------------------------ measuring */

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), compare_doubles);
  return v[n / 2];
}

/* The automatic count; `per_call` is the warm-up's per-call time, equal on
 * every rank, so every rank picks the same count. */
static long auto_iters(size_t bytes, double per_call) {
  double by_bytes = (double)AUTO_BYTES_PER_TRIAL / (double)bytes;
  double by_time = per_call > 0.0 ? AUTO_TRIAL_SECONDS / per_call : by_bytes;
  double n = by_bytes < by_time ? by_bytes : by_time;
  if (n < AUTO_MIN_ITERS) return AUTO_MIN_ITERS;
  if (n > AUTO_MAX_ITERS) return AUTO_MAX_ITERS;
  return (long)n;
}

/* Times WARMUP_CALLS calls one by one and returns the slowest rank's median
 * call: one call delayed by a descheduled rank must not shrink the automatic
 * iteration count of the whole size. */
static double time_warm_up_calls(bench_t *b, side_t side, const size_case_t *c) {
  double t[WARMUP_CALLS];
  for (int k = 0; k < WARMUP_CALLS; k++) {
    double t0 = MPI_Wtime();
    call_side(b, side, c);
    t[k] = MPI_Wtime() - t0;
  }
  double mine = median(t, WARMUP_CALLS), slowest = 0.0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

/* The first call of each side is checked on its own, then a few more calls
 * warm caches and connections. Returns the slower side's warm-up time per
 * call, for the automatic iteration count. */
static double warm_up(bench_t *b, const size_case_t *c) {
  double slowest = 0.0;
  for (int s = SIDE_TNT; s <= SIDE_MPI; s++) {
    check_label_t label = {(side_t)s, c->bytes, "after the first call"};
    prepare(b, c);
    call_side(b, (side_t)s, c);
    check_result(b, c, &label);
    double t = time_warm_up_calls(b, (side_t)s, c);
    if (t > slowest) slowest = t;
  }
  return slowest;
}

static void measure_size(bench_t *b, const size_case_t *c, row_t *row) {
  double times[2][TRIALS];
  double warm = warm_up(b, c);
  long iters = b->opt->iters > 0 ? b->opt->iters : auto_iters(c->bytes, warm);
  for (int t = 0; t < TRIALS; t++) {
    /* Alternating which side goes first keeps drift (thermal, other jobs)
     * from favouring one side. */
    for (int k = 0; k < 2; k++) {
      side_t side = (side_t)((t + k) % 2);
      check_label_t label = {side, c->bytes, "after the timed loop"};
      prepare(b, c);
      times[side][t] = time_calls(b, side, c, iters);
      check_result(b, c, &label);
    }
  }
  row->bytes = c->bytes;
  row->iters = iters;
  row->tnt_s = median(times[SIDE_TNT], TRIALS);
  row->mpi_s = median(times[SIDE_MPI], TRIALS);
  row->algorithm = "auto";
  /* The reduce-scatter runs the allreduce's choice for the whole vector. */
  if (b->opt->coll == COLL_ALLREDUCE || b->opt->coll == COLL_REDUCE_SCATTER) {
    /* Compressed, the allreduce moves 16-bit elements. */
    const size_t wire_bytes = b->opt->wire != TNT_FLOAT32 ? c->count * 2 : c->bytes;
    const char *name = tnt_allreduce_algorithm(b->world, wire_bytes);
    row->algorithm = name != NULL ? name : "?";
  }
}

/* Single-process copy bandwidth of `bytes` (median of TRIALS trials). */
static double memcpy_gbps(bench_t *b, size_t bytes) {
  double times[TRIALS];
  long reps = auto_iters(bytes, 0.0);
  for (int t = 0; t < TRIALS; t++) {
    double t0 = MPI_Wtime();
    for (long k = 0; k < reps; k++) {
      /* Alternating the direction keeps the copy from being skipped as a
       * repeat of the previous one. */
      if (k % 2 == 0) {
        memcpy(b->recv, b->send, bytes);
      } else {
        memcpy(b->send, b->recv, bytes);
      }
    }
    times[t] = (MPI_Wtime() - t0) / (double)reps;
  }
  double s = median(times, TRIALS);
  return s > 0.0 ? (double)bytes / s / 1e9 : 0.0;
}

/* Ranks other than 0 sleep instead of spinning in a barrier while rank 0
 * copies, so that the copy has the cores to itself. */
static void wait_quietly(void) {
  MPI_Request req;
  int done = 0;
  struct timespec nap = {0, 1000000};
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) nanosleep(&nap, NULL);
  }
}

static void measure_memcpy(bench_t *b, row_t *rows) {
  if (b->rank == 0) {
    memset(b->send, 1, b->capacity);
    for (int i = 0; i < b->ncases; i++) rows[i].memcpy_gbps = memcpy_gbps(b, b->cases[i].bytes);
  }
  wait_quietly();
}

/* ------------------------------------------------------------ reporting */

static double bus_factor(const bench_t *b) {
  double n = b->nranks;
  switch (b->opt->coll) {
    case COLL_ALLREDUCE:
      return 2.0 * (n - 1.0) / n;
    case COLL_BROADCAST:
      return 1.0;
    default:
      return (n - 1.0) / n;
  }
}

static double algbw(size_t bytes, double seconds) {
  return seconds > 0.0 ? (double)bytes / seconds / 1e9 : 0.0;
}

/* tnt busbw over MPI busbw. Both sides move the same bytes with the same
 * factor, so this is MPI's time over tnt's; at one rank the bus factors of
 * allreduce and allgather are 0, and the ratio falls back to algbw so that
 * the summary still compares the two sides. */
static double ratio(const bench_t *b, const row_t *r) {
  double f = bus_factor(b) > 0.0 ? bus_factor(b) : 1.0;
  double tnt = algbw(r->bytes, r->tnt_s) * f;
  double mpi = algbw(r->bytes, r->mpi_s) * f;
  return mpi > 0.0 ? tnt / mpi : 0.0;
}

static void print_header(const bench_t *b) {
  const options_t *o = b->opt;
  printf("# tnt-bench %s: %d rank%s, dtype %s, op sum, %d trials (median), iters %s\n",
         kCollectiveNames[o->coll], b->nranks, b->nranks == 1 ? "" : "s", tnt_dtype_name(o->dtype),
         TRIALS, o->iters > 0 ? "fixed" : "auto");
  bool half = o->dtype == TNT_FLOAT16 || o->dtype == TNT_BFLOAT16;
  const bool reduces = o->coll == COLL_ALLREDUCE || o->coll == COLL_REDUCE_SCATTER;
  printf("# MPI peer: %s on MPI_COMM_WORLD%s\n", kMpiPeerNames[o->coll],
         half && reduces ? " (MPI_UINT16_T with a user-defined sum)" : "");
  if (o->coll == COLL_ALLGATHER) printf("# bytes: the whole gathered buffer\n");
  if (o->coll == COLL_REDUCE_SCATTER) printf("# bytes: the whole vector that is reduced\n");
  if (b->oversubscribed) {
    printf("# oversubscribed: %d ranks on a host with %d cores\n", b->max_per_host, b->cores);
  }
  printf("# times: per call, slowest rank; bandwidths in GB/s; memcpy: one process, rank 0\n");
  printf("%11s  %-9s %10s %9s %9s %10s %9s %9s %6s %8s %6s  %s\n", "bytes", "algorithm", "tnt_us",
         "tnt_algbw", "tnt_busbw", "mpi_us", "mpi_algbw", "mpi_busbw", "ratio", "memcpy", "iters",
         "check");
  fflush(stdout);
}

static void print_row(const bench_t *b, const row_t *r) {
  double f = bus_factor(b);
  double tnt_bw = algbw(r->bytes, r->tnt_s), mpi_bw = algbw(r->bytes, r->mpi_s);
  printf("%11zu  %-9s %10.2f %9.3f %9.3f %10.2f %9.3f %9.3f %6.2f %8.2f %6ld  %s\n", r->bytes,
         r->algorithm, r->tnt_s * 1e6, tnt_bw, tnt_bw * f, r->mpi_s * 1e6, mpi_bw, mpi_bw * f,
         ratio(b, r), r->memcpy_gbps, r->iters, r->ok ? "ok" : "FAILED");
  fflush(stdout);
}

static void summarize(const bench_t *b, const row_t *rows, double *min_ratio, double *geomean) {
  double lo = 0.0, log_sum = 0.0;
  int n = 0;
  for (int i = 0; i < b->ncases; i++) {
    double q = ratio(b, &rows[i]);
    if (q <= 0.0) continue;
    lo = n == 0 || q < lo ? q : lo;
    log_sum += log(q);
    n++;
  }
  *min_ratio = lo;
  *geomean = n > 0 ? exp(log_sum / n) : 0.0;
}

/* Writes `s` as a JSON string; algorithm names are plain words, but the
 * escaping keeps the file valid whatever libtnt returns. */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s != '\0'; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      fprintf(f, "\\%c", ch);
    } else if (ch < 0x20) {
      fprintf(f, "\\u%04x", ch);
    } else {
      fputc(ch, f);
    }
  }
  fputc('"', f);
}

static void json_row(FILE *f, const bench_t *b, const row_t *r) {
  double fac = bus_factor(b);
  double tnt_bw = algbw(r->bytes, r->tnt_s), mpi_bw = algbw(r->bytes, r->mpi_s);
  fprintf(f, "    {\"bytes\": %zu, \"algorithm\": ", r->bytes);
  json_string(f, r->algorithm);
  fprintf(f,
          ", \"tnt_us\": %.3f, \"tnt_algbw\": %.6f, \"tnt_busbw\": %.6f, \"mpi_us\": %.3f, "
          "\"mpi_algbw\": %.6f, \"mpi_busbw\": %.6f, \"ratio\": %.6f, \"memcpy_gbps\": %.6f, "
          "\"iters\": %ld, \"ok\": %s}",
          r->tnt_s * 1e6, tnt_bw, tnt_bw * fac, r->mpi_s * 1e6, mpi_bw, mpi_bw * fac, ratio(b, r),
          r->memcpy_gbps, r->iters, r->ok ? "true" : "false");
}

static int write_json(FILE *f, const bench_t *b, const row_t *rows, double min_ratio,
                      double geomean) {
  fprintf(f, "{\n  \"collective\": \"%s\",\n  \"ranks\": %d,\n  \"dtype\": \"%s\",\n",
          kCollectiveNames[b->opt->coll], b->nranks, tnt_dtype_name(b->opt->dtype));
  fprintf(f, "  \"compression\": \"%s\",\n",
          b->opt->wire == TNT_FLOAT16    ? "fp16"
          : b->opt->wire == TNT_BFLOAT16 ? "bf16"
                                         : "none");
  fprintf(f,
          "  \"hosts\": %d,\n  \"max_ranks_per_host\": %d,\n  \"cores_per_host\": %d,\n"
          "  \"oversubscribed\": %s,\n  \"trials\": %d,\n  \"iters\": \"%s\",\n",
          b->hosts, b->max_per_host, b->cores, b->oversubscribed ? "true" : "false", TRIALS,
          b->opt->iters > 0 ? "fixed" : "auto");
  fprintf(f, "  \"rows\": [\n");
  for (int i = 0; i < b->ncases; i++) {
    json_row(f, b, &rows[i]);
    fputs(i + 1 < b->ncases ? ",\n" : "\n", f);
  }
  fprintf(f, "  ],\n  \"min_ratio\": %.6f,\n  \"geomean_ratio\": %.6f\n}\n", min_ratio, geomean);
  return ferror(f) ? -1 : 0;
}

/* ---------------------------------------------------------------- setup */

/* The swept sizes become element counts: allreduce and broadcast move
 * size / esz elements, allgather gathers size / (ranks * esz) elements from
 * each rank, and reduce_scatter gives each rank that many. Every case moves
 * at least one element, and sizes that round to the same message are run
 * once. */
static size_t next_size(size_t s, size_t max) {
  return s * 2 > max && s < max ? max : s * 2;
}

static void plan_cases(bench_t *b) {
  const options_t *o = b->opt;
  const bool per_rank = o->coll == COLL_ALLGATHER || o->coll == COLL_REDUCE_SCATTER;
  size_t per = per_rank ? b->esz * (size_t)b->nranks : b->esz;
  b->ncases = 0;
  b->capacity = 0;
  for (size_t s = o->min_bytes;; s = next_size(s, o->max_bytes)) {
    size_t count = s / per > 0 ? s / per : 1;
    size_t bytes = count * per;
    if (b->ncases == 0 || b->cases[b->ncases - 1].bytes != bytes) {
      b->cases[b->ncases++] = (size_case_t){bytes, count};
      if (bytes > b->capacity) b->capacity = bytes;
    }
    if (s >= o->max_bytes || b->ncases == MAX_SIZES) break;
  }
}

/* Allocates page-aligned, touched buffers; returns false (on every rank)
 * when any rank could not. */
static bool allocate_buffers(bench_t *b) {
  size_t bytes = (b->capacity + 4095) / 4096 * 4096;
  b->send = aligned_alloc(4096, bytes);
  b->recv = aligned_alloc(4096, bytes);
  int ok = b->send != NULL && b->recv != NULL;
  if (ok) {
    memset(b->send, 0, bytes);
    memset(b->recv, 0, bytes);
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (!all_ok && b->rank == 0) {
    fprintf(stderr, "tnt-bench: cannot allocate 2 x %zu bytes on every rank; lower --max\n", bytes);
  }
  return all_ok != 0;
}

static void setup_mpi_peer(bench_t *b) {
  b->own_op = false;
  b->mpi_op = MPI_SUM;
  switch (b->opt->dtype) {
    case TNT_FLOAT32:
      b->mpi_type = MPI_FLOAT;
      break;
    case TNT_FLOAT64:
      b->mpi_type = MPI_DOUBLE;
      break;
    case TNT_INT32:
      b->mpi_type = MPI_INT32_T;
      break;
    case TNT_INT64:
      b->mpi_type = MPI_INT64_T;
      break;
    case TNT_INT8:
      b->mpi_type = MPI_INT8_T;
      break;
    case TNT_INT16:
      b->mpi_type = MPI_INT16_T;
      break;
    case TNT_UINT8:
      b->mpi_type = MPI_UINT8_T;
      break;
    default:
      b->mpi_type = MPI_UINT16_T;
      MPI_Op_create(b->opt->dtype == TNT_FLOAT16 ? mpi_sum_float16 : mpi_sum_bfloat16, 1,
                    &b->mpi_op);
      b->own_op = true;
      break;
  }
}

/* Rank 0 opens the JSON file before the run so that a bad path fails fast;
 * every rank learns whether it could. */
static bool open_json(const bench_t *b, FILE **out) {
  *out = NULL;
  int ok = 1;
  if (b->rank == 0 && b->opt->json_path != NULL) {
    *out = fopen(b->opt->json_path, "w");
    if (*out == NULL) {
      fprintf(stderr, "tnt-bench: --json: cannot write '%s': %s\n", b->opt->json_path,
              strerror(errno));
      ok = 0;
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

/* libtnt's engine thread uses MPI while the bench calls MPI directly, which
 * is only safe with MPI_THREAD_MULTIPLE. */
static bool thread_level_ok(const bench_t *b) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE && b->rank == 0) {
    fprintf(stderr,
            "tnt-bench: MPI does not provide MPI_THREAD_MULTIPLE; the MPI peer cannot "
            "run next to libtnt\n");
  }
  return provided >= MPI_THREAD_MULTIPLE;
}

static tnt_status_t create_context(bench_t *b) {
  tnt_status_t st = tnt_context_create(NULL, &b->ctx);
  if (st < 0) {
    fprintf(stderr, "tnt-bench: tnt_context_create failed: %s\n", tnt_status_string(st));
    /* A rank that failed alone would leave the others waiting forever. */
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Abort(MPI_COMM_WORLD, EXIT_TNT_ERROR);
    return st;
  }
  b->world = tnt_context_world(b->ctx);
  b->rank = tnt_group_rank(b->world);
  b->nranks = tnt_group_size(b->world);
  return TNT_OK;
}

/* Counts hosts and the ranks on each, so that results of ranks that share
 * too few cores are marked as oversubscribed. */
static void survey_hosts(bench_t *b) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, b->rank, MPI_INFO_NULL, &local);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? (int)online : 1;
  int leader = local_rank == 0;
  int crowding[2] = {local_size, local_size > cores};
  int worst[2] = {0, 0};
  MPI_Allreduce(&leader, &b->hosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(crowding, worst, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  /* The cores of the most crowded host: ties take the fewest cores. */
  int mine = local_size == worst[0] ? cores : INT32_MAX;
  MPI_Allreduce(&mine, &b->cores, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  b->max_per_host = worst[0];
  b->oversubscribed = worst[1] != 0;
}

/* ----------------------------------------------------------------- main */

/* Measures every size and prints the table; returns the exit code. */
static int run(bench_t *b, FILE *json) {
  static row_t rows[MAX_SIZES];
  measure_memcpy(b, rows);
  if (b->rank == 0) print_header(b);
  for (int i = 0; i < b->ncases; i++) {
    unsigned long before = b->mismatches;
    measure_size(b, &b->cases[i], &rows[i]);
    int mine = b->mismatches == before, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    rows[i].ok = all != 0;
    if (b->rank == 0) print_row(b, &rows[i]);
  }
  int failed = b->mismatches > 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  int code = any_failed ? EXIT_CHECK_FAILED : 0;
  if (b->rank != 0) return code;
  double min_ratio, geomean;
  summarize(b, rows, &min_ratio, &geomean);
  if (json != NULL && write_json(json, b, rows, min_ratio, geomean) != 0) {
    fprintf(stderr, "tnt-bench: --json: error writing '%s'\n", b->opt->json_path);
  }
  if (any_failed) printf("# correctness: FAILED (wrong elements are listed on stderr)\n");
  printf("min busbw ratio tnt/mpi: %.2f\n", min_ratio);
  printf("geomean busbw ratio tnt/mpi: %.2f\n", geomean);
  fflush(stdout);
  return code;
}

int main(int argc, char **argv) {
  options_t opt;
  int code = parse_options(argc, argv, &opt);
  if (code >= 0) return code;

  bench_t b = {.opt = &opt, .esz = tnt_dtype_size(opt.dtype)};
  if (create_context(&b) < 0) return EXIT_TNT_ERROR;
  FILE *json = NULL;
  bool own_op_created = false;
  code = EXIT_TNT_ERROR;
  if (!thread_level_ok(&b)) goto done;
  survey_hosts(&b);
  code = EXIT_USAGE;
  plan_cases(&b);
  choose_pattern(&b);
  if (!allocate_buffers(&b) || !open_json(&b, &json)) goto done;
  setup_mpi_peer(&b);
  own_op_created = b.own_op;
  code = run(&b, json);

done:
  if (json != NULL && fclose(json) != 0) {
    fprintf(stderr, "tnt-bench: --json: error closing '%s'\n", opt.json_path);
  }
  if (own_op_created) MPI_Op_free(&b.mpi_op);
  if (b.fusion != NULL) tnt_fusion_destroy(b.fusion);
  free(b.send);
  free(b.recv);
  tnt_status_t st = tnt_context_destroy(b.ctx);
  if (st < 0) {
    fprintf(stderr, "tnt-bench: rank %d: tnt_context_destroy failed: %s\n", b.rank,
            tnt_status_string(st));
    if (code == 0) code = EXIT_TNT_ERROR;
  }
  return code;
}
