#include "downpour/status.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dp_errf(dp_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int dp_err_prefix(dp_err *err, const char *fmt, ...)
{
    if (err) {
        char head[DP_ERR_MAX], joined[2 * DP_ERR_MAX + 2];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(head, sizeof head, fmt, ap);
        va_end(ap);
        snprintf(joined, sizeof joined, "%s: %s", head, err->msg);
        size_t n = strnlen(joined, sizeof err->msg - 1); /* keep the head, cut the tail */
        memcpy(err->msg, joined, n);
        err->msg[n] = '\0';
    }
    return -1;
}

int dp_parse_long(const char *s, long lo, long hi, long *out, const char *what, dp_err *err)
{
    char *end;
    if (!s || !*s)
        return dp_errf(err, "%s: empty value, expected an integer", what);
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0')
        return dp_errf(err, "%s: '%s' is not an integer", what, s);
    if (errno == ERANGE || v < lo || v > hi)
        return dp_errf(err, "%s: %s is out of range [%ld, %ld]", what, s, lo, hi);
    *out = v;
    return 0;
}

int dp_parse_double(const char *s, double lo, double hi, double *out, const char *what, dp_err *err)
{
    char *end;
    if (!s || !*s)
        return dp_errf(err, "%s: empty value, expected a number", what);
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || isnan(v))
        return dp_errf(err, "%s: '%s' is not a number", what, s);
    if (errno == ERANGE || v < lo || v > hi)
        return dp_errf(err, "%s: %s is out of range [%g, %g]", what, s, lo, hi);
    *out = v;
    return 0;
}
