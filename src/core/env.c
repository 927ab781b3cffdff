/* Checked reads of settings from the environment (include/downpour/env.h),
 * over status.h's checked parsers. */
#include "downpour/env.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

int dp_env_long(const char *name, long min, long max, long def, long *out, dp_err *err)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    return dp_parse_long(v, min, max, out, name, err);
}

int dp_env_flag(const char *name, int def, int *out, dp_err *err)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return dp_errf(err, "%s: '%s' is not 0 or 1", name, v);
    *out = v[0] == '1';
    return 0;
}

static const char *const fallback_names[DP_ENV_FALLBACK_COUNT] = {
    [DP_ENV_SHM] = "DOWNPOUR_SHM",
    [DP_ENV_NCCL] = "DOWNPOUR_NCCL",
};
static int fallback_on[DP_ENV_FALLBACK_COUNT];
static char fallback_bad[DP_ENV_FALLBACK_COUNT]; /* set, and not 0 or 1 */
static pthread_once_t fallback_once = PTHREAD_ONCE_INIT;

static void fallback_load(void)
{
    for (int f = 0; f < DP_ENV_FALLBACK_COUNT; f++) {
        dp_err e;
        int on = 1;
        fallback_bad[f] = dp_env_flag(fallback_names[f], 1, &on, &e) < 0;
        fallback_on[f] = fallback_bad[f] ? 1 : on;
    }
}

const char *dp_env_fallback_name(dp_env_fallback f)
{
    return f >= 0 && f < DP_ENV_FALLBACK_COUNT ? fallback_names[f] : "?";
}

int dp_env_fallback_on(dp_env_fallback f)
{
    pthread_once(&fallback_once, fallback_load);
    return f >= 0 && f < DP_ENV_FALLBACK_COUNT ? fallback_on[f] : 1;
}

int dp_env_fallbacks_check(dp_err *err)
{
    pthread_once(&fallback_once, fallback_load);
    for (int f = 0; f < DP_ENV_FALLBACK_COUNT; f++)
        if (fallback_bad[f])
            return dp_errf(err, "%s: '%s' is not 0 or 1 (0 does as train --%s)", fallback_names[f],
                           getenv(fallback_names[f]), f == DP_ENV_SHM ? "no-shm" : "no-nccl");
    return 0;
}
