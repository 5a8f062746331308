/*
 * The fusion set's tuner: which plan a self-tuning fusion set uses in each
 * round, and which one it keeps. A plan is a threshold and whether the
 * buckets are reduced while backprop goes on (overlap) or only once every
 * tensor of the round has started (hold). A set tunes the threshold, the
 * overlap or both; the candidates are every combination of the values it
 * tunes with the fixed values of the rest. A pure state machine, apart from
 * the runtime so it can be tested on its own.
 *
 * Schedule: TNT__TUNER_WARMUP rounds warm up with the first candidate and
 * are not timed;
 * then the candidates take turns, one round each in order, until each has
 * run TNT__TUNER_ROUNDS rounds, and each one's fastest round counts (taking
 * turns, a drift of the step time over the first rounds weighs on every
 * candidate alike); then one more round carries the master's choice to
 * every rank (the runtime reduces it along with the round's buckets); from
 * the round after, the chosen plan stays. The schedule depends only on the
 * round number, so every rank switches plans at the same rounds without
 * communicating.
 */
#ifndef TNT_FUSION_TUNER_H
#define TNT_FUSION_TUNER_H

#include <stddef.h>

#define TNT__TUNER_NTHRESHOLDS 5
#define TNT__TUNER_WARMUP 3 /* untimed rounds first: a fit's first steps are slow and noisy */
#define TNT__TUNER_ROUNDS 2
#define TNT__TUNER_MAX_CANDIDATES (2 * TNT__TUNER_NTHRESHOLDS)

/* The thresholds a set that tunes its threshold tries, in KiB. */
extern const size_t TNT__TUNER_THRESHOLDS_KB[TNT__TUNER_NTHRESHOLDS];

typedef enum tnt__tuner_phase {
  TNT__TUNER_TRYING,   /* rounds with candidate plans */
  TNT__TUNER_DECIDING, /* the round that carries the master's choice */
  TNT__TUNER_DONE      /* the chosen plan stays (also: nothing to tune) */
} tnt__tuner_phase_t;

typedef struct tnt__tuner_plan {
  size_t threshold; /* bytes */
  int hold;         /* 1: no bucket is reduced before every tensor of the round started */
} tnt__tuner_plan_t;

typedef struct tnt__tuner {
  size_t round; /* rounds completed */
  int ncandidates;
  tnt__tuner_plan_t candidates[TNT__TUNER_MAX_CANDIDATES];
  double best_s[TNT__TUNER_MAX_CANDIDATES]; /* fastest round per candidate (0: none yet) */
  int chosen;                               /* index of the kept candidate, once DONE */
} tnt__tuner_t;

/* A tuner that tries TNT__TUNER_THRESHOLDS_KB when `tune_threshold` (else
 * keeps `threshold`), and overlap then hold when `tune_hold` (else keeps
 * `hold`). With nothing to tune it is DONE from the start. */
void tnt__tuner_init(tnt__tuner_t *t, int tune_threshold, size_t threshold, int tune_hold,
                     int hold);

/* The number of rounds before the plan stays (0: nothing to tune). */
size_t tnt__tuner_rounds(const tnt__tuner_t *t);

/* The phase of the round now running (round t->round). */
tnt__tuner_phase_t tnt__tuner_phase(const tnt__tuner_t *t);

/* The plan of the round now running. */
tnt__tuner_plan_t tnt__tuner_plan(const tnt__tuner_t *t);

/* The fastest candidate by this rank's timings (the master's is the one
 * that counts); the earlier candidate wins ties. */
int tnt__tuner_fastest(const tnt__tuner_t *t);

/*
 * Ends the round now running, which took `seconds` on this rank; `chosen`
 * is the master's choice when that round was the DECIDING one (ignored
 * otherwise). Returns 1 when the next round uses another threshold than
 * this one (the runtime replans), else 0.
 */
int tnt__tuner_end_round(tnt__tuner_t *t, double seconds, int chosen);

#endif
