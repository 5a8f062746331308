/*
 * The fusion threshold tuner: which threshold a self-tuning fusion set uses
 * in each round, and which one it keeps. A pure state machine, apart from
 * the runtime so it can be tested on its own.
 *
 * Schedule: round 0 warms up with the first candidate and is not timed;
 * then each candidate (TNT__TUNER_CANDIDATES_KB, in order) runs
 * TNT__TUNER_ROUNDS rounds and its fastest round counts; then one more
 * round carries the master's choice to every rank (the runtime reduces it
 * along with the round's buckets); from the round after, the chosen
 * threshold stays. The schedule depends only on the round number, so every
 * rank switches plans at the same rounds without communicating.
 */
#ifndef TNT_FUSION_TUNER_H
#define TNT_FUSION_TUNER_H

#include <stddef.h>

#define TNT__TUNER_NCANDIDATES 5
#define TNT__TUNER_ROUNDS 2

/* The candidate thresholds, in KiB. */
extern const size_t TNT__TUNER_CANDIDATES_KB[TNT__TUNER_NCANDIDATES];

typedef enum tnt__tuner_phase {
  TNT__TUNER_TRYING,   /* rounds with candidate thresholds */
  TNT__TUNER_DECIDING, /* the round that carries the master's choice */
  TNT__TUNER_DONE      /* the chosen threshold stays */
} tnt__tuner_phase_t;

typedef struct tnt__tuner {
  size_t round;                          /* rounds completed */
  double best_s[TNT__TUNER_NCANDIDATES]; /* fastest round per candidate (0: none yet) */
  int chosen;                            /* index of the kept candidate, once DONE */
} tnt__tuner_t;

void tnt__tuner_init(tnt__tuner_t *t);

/* The phase of the round now running (round t->round). */
tnt__tuner_phase_t tnt__tuner_phase(const tnt__tuner_t *t);

/* The threshold, in bytes, of the round now running. */
size_t tnt__tuner_threshold(const tnt__tuner_t *t);

/* The fastest candidate by this rank's timings (the master's is the one
 * that counts); the smallest threshold wins ties. */
int tnt__tuner_fastest(const tnt__tuner_t *t);

/*
 * Ends the round now running, which took `seconds` on this rank; `chosen`
 * is the master's choice when that round was the DECIDING one (ignored
 * otherwise). Returns 1 when the next round uses another threshold than
 * this one (the runtime replans), else 0.
 */
int tnt__tuner_end_round(tnt__tuner_t *t, double seconds, int chosen);

#endif
