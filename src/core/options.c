#include "downpour/options.h"

#include <stdio.h>
#include <string.h>

const dp_opt *dp_opt_find(const dp_opt *opts, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    return NULL;
}

int dp_opt_set(const dp_opt *o, void *settings, const char *value, dp_err *err)
{
    char what[80];
    snprintf(what, sizeof what, "--%s", o->name);
    void *dst = (char *)settings + o->offset;
    long l;
    double d;
    switch (o->kind) {
    case DP_OPT_STR:
        if (!value || !*value)
            return dp_errf(err, "%s: empty value", what);
        *(const char **)dst = value;
        return 0;
    case DP_OPT_INT:
    case DP_OPT_SIZE:
        if (dp_parse_long(value ? value : "", (long)o->lo, (long)o->hi, &l, what, err) < 0)
            return -1;
        if (o->kind == DP_OPT_INT)
            *(int *)dst = (int)l;
        else
            *(size_t *)dst = (size_t)l;
        return 0;
    case DP_OPT_NUM:
        if (dp_parse_double(value ? value : "", o->lo, o->hi, &d, what, err) < 0)
            return -1;
        *(double *)dst = d;
        return 0;
    case DP_OPT_FLAG:
        if (value && *value)
            return dp_errf(err, "%s takes no value", what);
        *(bool *)dst = true;
        return 0;
    case DP_OPT_KIND_COUNT:
        break;
    }
    return dp_errf(err, "%s: not an option kind", what);
}
