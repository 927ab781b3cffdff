/* Option tables over a settings struct: how a strategy declares its knobs
 * (strategy.h, dp_strategy_conf) so that one parser -- downpour train's,
 * launch's check of it, a binding's dp_strategy_set -- reads them all the
 * same way, with the same bounds and messages (docs/architecture.md,
 * "A strategy's settings"). */
#ifndef DOWNPOUR_OPTIONS_H
#define DOWNPOUR_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "downpour/status.h"

typedef enum dp_opt_kind {
    DP_OPT_STR,   /* const char * (the value is not copied: argv outlives the run) */
    DP_OPT_INT,   /* int, in [lo, hi] */
    DP_OPT_SIZE,  /* size_t, in [lo, hi] */
    DP_OPT_NUM,   /* double, in [lo, hi] */
    DP_OPT_FLAG,  /* bool, takes no value */
    DP_OPT_KIND_COUNT
} dp_opt_kind;

/* The option is read by this strategy too, but --help shows it where the
 * strategy listed first in dp_strategies declares it (one line each). */
#define DP_OPT_ALSO 1u

typedef struct dp_opt {
    const char *name;  /* "fetch-every" for --fetch-every */
    dp_opt_kind kind;
    size_t offset;     /* of the field in the owner's settings struct */
    const char *meta;  /* value placeholder in --help, "N" */
    const char *help;  /* as cli_opt's: the default is added from the defaults */
    double lo, hi;     /* range for INT, SIZE and NUM */
    unsigned flags;    /* DP_OPT_ALSO */
} dp_opt;

/* The option called `name` in opts[0..n), or NULL. */
const dp_opt *dp_opt_find(const dp_opt *opts, int n, const char *name);
/* Sets o's field in `settings` from the text `value` (NULL or "" for a
 * flag), checking its range: 0, or -1 with err naming "--<name>" as the CLI
 * words it. */
int dp_opt_set(const dp_opt *o, void *settings, const char *value, dp_err *err);

#endif
