/*
 * The fusion set's tuner (see tuner.h).
 */
#include "fusion/tuner.h"

#include <string.h>

const size_t TNT__TUNER_THRESHOLDS_KB[TNT__TUNER_NTHRESHOLDS] = {32, 128, 512, 2048, 8192};

void tnt__tuner_init(tnt__tuner_t *t, int tune_threshold, size_t threshold, int tune_hold,
                     int hold) {
  memset(t, 0, sizeof *t); /* chosen = 0: a tuner with one candidate keeps it */
  const int nthr = tune_threshold ? TNT__TUNER_NTHRESHOLDS : 1;
  for (int i = 0; i < nthr; ++i) {
    const size_t thr = tune_threshold ? TNT__TUNER_THRESHOLDS_KB[i] * 1024 : threshold;
    for (int h = 0; h < (tune_hold ? 2 : 1); ++h) {
      t->candidates[t->ncandidates++] = (tnt__tuner_plan_t){thr, tune_hold ? h : hold};
    }
  }
}

/* Rounds before the DECIDING one: the warm-up, then every candidate's. */
static size_t trying_rounds(const tnt__tuner_t *t) {
  return TNT__TUNER_WARMUP + (size_t)t->ncandidates * TNT__TUNER_ROUNDS;
}

size_t tnt__tuner_rounds(const tnt__tuner_t *t) {
  return t->ncandidates > 1 ? trying_rounds(t) + 1 : 0;
}

tnt__tuner_phase_t tnt__tuner_phase(const tnt__tuner_t *t) {
  if (t->ncandidates <= 1) return TNT__TUNER_DONE;
  if (t->round < trying_rounds(t)) return TNT__TUNER_TRYING;
  return t->round == trying_rounds(t) ? TNT__TUNER_DECIDING : TNT__TUNER_DONE;
}

/* The candidate that round `round` tries: the warm-up tries the first; then
 * the candidates take turns, one round each, TNT__TUNER_ROUNDS times over,
 * so that a drift of the step time over the first rounds (caches,
 * allocations, the network settling) weighs on every candidate alike; the
 * DECIDING round keeps the last. */
static int candidate_of(const tnt__tuner_t *t, size_t round) {
  if (round < TNT__TUNER_WARMUP) return 0;
  if (round >= trying_rounds(t)) return t->ncandidates - 1;
  return (int)((round - TNT__TUNER_WARMUP) % (size_t)t->ncandidates);
}

tnt__tuner_plan_t tnt__tuner_plan(const tnt__tuner_t *t) {
  int c = tnt__tuner_phase(t) == TNT__TUNER_DONE ? t->chosen : candidate_of(t, t->round);
  return t->candidates[c];
}

int tnt__tuner_fastest(const tnt__tuner_t *t) {
  int best = 0;
  for (int c = 1; c < t->ncandidates; c++) {
    if (t->best_s[c] < t->best_s[best]) best = c;
  }
  return best;
}

int tnt__tuner_end_round(tnt__tuner_t *t, double seconds, int chosen) {
  const tnt__tuner_phase_t phase = tnt__tuner_phase(t);
  if (phase == TNT__TUNER_DONE) return 0;
  const size_t before = tnt__tuner_plan(t).threshold;
  if (phase == TNT__TUNER_TRYING && t->round >= TNT__TUNER_WARMUP) {
    const int c = candidate_of(t, t->round);
    if (t->best_s[c] == 0.0 || seconds < t->best_s[c]) t->best_s[c] = seconds;
  }
  if (phase == TNT__TUNER_DECIDING) {
    t->chosen = chosen >= 0 && chosen < t->ncandidates ? chosen : 0;
  }
  t->round++;
  return tnt__tuner_plan(t).threshold != before;
}
