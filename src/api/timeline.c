/* The public calls of the timeline; the writer is src/util/timeline.c. */
#include "api/api.h"
#include "util/timeline.h"

int tnt_timeline_enabled(void) {
  return TNT__TIMELINE_ON() ? 1 : 0;
}

tnt_status_t tnt_timeline_event(const char *name, const char *category, char phase) {
  tnt__error_clear();
  if (name == NULL || (phase != 'B' && phase != 'E' && phase != 'i')) {
    TNT_LOG_ERROR("tnt_timeline_event: need a name and phase 'B', 'E' or 'i'");
    return TNT_ERR_INVALID_ARG;
  }
  if (!TNT__TIMELINE_ON()) return TNT_OK;
  if (category == NULL) category = "user";
  if (phase == 'i') {
    tnt__timeline_instant(category, name, NULL);
  } else {
    tnt__timeline_mark(phase, category, name);
  }
  return TNT_OK;
}

tnt_status_t tnt_timeline_span(const char *name, const char *category, double begin,
                               double end) {
  tnt__error_clear();
  if (name == NULL || !(begin <= end)) {
    TNT_LOG_ERROR("tnt_timeline_span: need a name and begin <= end");
    return TNT_ERR_INVALID_ARG;
  }
  tnt__timeline_complete(category == NULL ? "user" : category, name, begin, end, NULL);
  return TNT_OK;
}
