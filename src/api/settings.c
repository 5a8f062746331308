/* tnt_settings_*: the public face of the settings registry (util/settings.c). */
#include "api/api.h"
#include "util/settings.h"

tnt_status_t tnt_settings_load(void) {
  tnt__error_clear();
  char err[512];
  tnt_status_t st = TNT_OK;
  if (tnt__settings_read(NULL, err, sizeof err) != 0) {
    tnt__error_set("%s", err); /* the caller reports it: an error or an exception */
    st = TNT_ERR_INVALID_ARG;
  } else if (tnt__log_enabled(TNT__LOG_DEBUG)) {
    static const char *const sources[] = {"default", "environment", "command line"};
    for (int i = 0; i < TNT__S_COUNT; ++i) {
      tnt__setting_view_t v;
      tnt__setting_view((tnt__setting_id_t)i, &v);
      TNT_LOG_DEBUG("setting %s=%s (%s)", v.name, v.value, sources[v.source]);
    }
  }
  return tnt__api_end("tnt_settings_load", NULL, st);
}

size_t tnt_settings_count(void) {
  return TNT__S_COUNT;
}

tnt_status_t tnt_setting_info(size_t index, tnt_setting_info_t *info) {
  tnt__error_clear();
  if (info == NULL || index >= TNT__S_COUNT) {
    return tnt__api_invalid("tnt_setting_info", "index %zu: settings are 0 to %d, info not NULL",
                            index, TNT__S_COUNT - 1);
  }
  tnt__setting_view_t v;
  tnt__setting_view((tnt__setting_id_t)index, &v);
  *info = (tnt_setting_info_t){v.name,  v.kind,  v.default_value, v.words, v.user,
                               v.help,  v.value, v.error,         (tnt_setting_source_t)v.source};
  return TNT_OK;
}
