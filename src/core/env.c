/* Checked reads of settings from the environment (include/downpour/env.h),
 * over status.h's checked parsers. */
#include "downpour/env.h"

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
