/* Checked reads of settings from the environment (include/downpour/env.h). */
#include "downpour/env.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int dp_env_parse_long(const char *name, const char *text, long min, long max, long *out,
                      dp_err *err)
{
    /* strtol alone takes " 12", "12abc" and "" as numbers: refuse all three */
    char *end = NULL;
    errno = 0;
    long v = (text[0] == '-' || (text[0] >= '0' && text[0] <= '9')) ? strtol(text, &end, 10) : 0;
    if (!end || end == text || *end || errno == ERANGE || v < min || v > max)
        return dp_errf(err, "%s is '%s': expected a whole number from %ld to %ld", name, text,
                       min, max);
    *out = v;
    return 0;
}

int dp_env_long(const char *name, long min, long max, long def, long *out, dp_err *err)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    return dp_env_parse_long(name, v, min, max, out, err);
}

int dp_env_flag(const char *name, int def, int *out, dp_err *err)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return dp_errf(err, "%s is '%s': expected 0 or 1", name, v);
    *out = v[0] == '1';
    return 0;
}
