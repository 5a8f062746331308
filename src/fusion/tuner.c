/*
 * The fusion threshold tuner (see tuner.h).
 */
#include "fusion/tuner.h"

#include <string.h>

const size_t TNT__TUNER_CANDIDATES_KB[TNT__TUNER_NCANDIDATES] = {32, 128, 512, 2048, 8192};

/* Rounds before the DECIDING one: the warm-up, then every candidate's. */
#define TRYING_ROUNDS (1 + (size_t)TNT__TUNER_NCANDIDATES * TNT__TUNER_ROUNDS)

void tnt__tuner_init(tnt__tuner_t *t) {
  memset(t, 0, sizeof *t);
  t->chosen = -1;
}

tnt__tuner_phase_t tnt__tuner_phase(const tnt__tuner_t *t) {
  if (t->round < TRYING_ROUNDS) return TNT__TUNER_TRYING;
  return t->round == TRYING_ROUNDS ? TNT__TUNER_DECIDING : TNT__TUNER_DONE;
}

/* The candidate that round `round` tries (the warm-up tries the first; the
 * DECIDING round keeps the last). */
static int candidate_of(size_t round) {
  if (round == 0) return 0;
  size_t c = (round - 1) / TNT__TUNER_ROUNDS;
  return c < TNT__TUNER_NCANDIDATES ? (int)c : TNT__TUNER_NCANDIDATES - 1;
}

size_t tnt__tuner_threshold(const tnt__tuner_t *t) {
  int c = tnt__tuner_phase(t) == TNT__TUNER_DONE ? t->chosen : candidate_of(t->round);
  return TNT__TUNER_CANDIDATES_KB[c] * 1024;
}

int tnt__tuner_fastest(const tnt__tuner_t *t) {
  int best = 0;
  for (int c = 1; c < TNT__TUNER_NCANDIDATES; c++) {
    if (t->best_s[c] < t->best_s[best]) best = c;
  }
  return best;
}

int tnt__tuner_end_round(tnt__tuner_t *t, double seconds, int chosen) {
  const tnt__tuner_phase_t phase = tnt__tuner_phase(t);
  if (phase == TNT__TUNER_DONE) return 0;
  const size_t before = tnt__tuner_threshold(t);
  if (phase == TNT__TUNER_TRYING && t->round > 0) {
    const int c = candidate_of(t->round);
    if (t->best_s[c] == 0.0 || seconds < t->best_s[c]) t->best_s[c] = seconds;
  }
  if (phase == TNT__TUNER_DECIDING) {
    t->chosen = chosen >= 0 && chosen < TNT__TUNER_NCANDIDATES ? chosen : 0;
  }
  t->round++;
  return tnt__tuner_threshold(t) != before;
}
