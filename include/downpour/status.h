/* Status and error messages: every library call that can fail returns 0 on
 * success or -1 on failure and fills a dp_err the caller may print.  Library
 * code never exits; only the program's main turns an error into an exit. */
#ifndef DOWNPOUR_STATUS_H
#define DOWNPOUR_STATUS_H

#include <stddef.h>

#define DP_ERR_MAX 512

/* The program's exit statuses beyond 0 (done), 1 (failed) and 2 (usage):
 * a run that trained, evaluated and wrote --save, but could not write every
 * checkpoint it was asked for (each one a warning and a "fault" event).
 * downpour launch passes it on (launcher.h); docs/checkpoints.md, "A
 * checkpoint that cannot be written". */
#define DP_EXIT_CHECKPOINTS_MISSED 3

typedef struct dp_err {
    char msg[DP_ERR_MAX];
} dp_err;

/* Formats a message into err (err may be NULL) and returns -1, so a failing
 * path reads `return dp_errf(err, "cannot open %s: %s", path, strerror(errno));`. */
int dp_errf(dp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends context to an existing message: "loading checkpoint: <old msg>". */
int dp_err_prefix(dp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Strict number parsing: the whole string must be a number in range.
 * Returns 0 or -1 with a message naming `what`. */
int dp_parse_long(const char *s, long lo, long hi, long *out, const char *what, dp_err *err);
int dp_parse_double(const char *s, double lo, double hi, double *out, const char *what, dp_err *err);

#endif
