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

/* A settings struct, its defaults and its table from one list, so that a
 * new option is one line (docs/architecture.md, "A strategy's settings").
 * A strategy's private header lists its options in --help order,
 *
 *   #define MY_OPTIONS(X) \
 *       X(int, period, 8, "period", DP_OPT_INT, "K", 1, 1000000, 0, "model-avg: ...")
 *
 * (field type, field, default, then the dp_opt: name, kind, meta, lo, hi,
 * flags, help), declares `typedef struct { MY_OPTIONS(DP_OPT_FIELD) } my_settings;`,
 * and its options file makes `{MY_OPTIONS(DP_OPT_DEFAULT)}` and, with
 * DP_OPT_SETTINGS defined as my_settings, `{MY_OPTIONS(DP_OPT_LINE)}`.
 * The type goes with the kind: const char * for STR, int, size_t, double,
 * bool for FLAG (DP_OPT_LINE checks the size). */
#define DP_OPT_FIELD(type, field, def, name, kind, meta, lo, hi, flags, help) type field;
#define DP_OPT_DEFAULT(type, field, def, name, kind, meta, lo, hi, flags, help) .field = def,
#define DP_OPT_LINE(type, field, def, name, kind, meta, lo, hi, flags, help)                  \
    {name, kind, offsetof(DP_OPT_SETTINGS, field) +                                            \
                     0 * sizeof(char[sizeof(((DP_OPT_SETTINGS *)0)->field) ==                  \
                                          dp_opt_kind_size(kind) ? 1 : -1]),                   \
     meta, help, lo, hi, flags},
/* The size of a kind's field, for DP_OPT_LINE's check. */
#define dp_opt_kind_size(kind)                                                                 \
    ((kind) == DP_OPT_STR    ? sizeof(const char *)                                            \
     : (kind) == DP_OPT_INT  ? sizeof(int)                                                     \
     : (kind) == DP_OPT_SIZE ? sizeof(size_t)                                                  \
     : (kind) == DP_OPT_NUM  ? sizeof(double)                                                  \
                             : sizeof(bool))

/* The option called `name` in opts[0..n), or NULL. */
const dp_opt *dp_opt_find(const dp_opt *opts, int n, const char *name);
/* Sets o's field in `settings` from the text `value` (NULL or "" for a
 * flag), checking its range: 0, or -1 with err naming "--<name>" as the CLI
 * words it. */
int dp_opt_set(const dp_opt *o, void *settings, const char *value, dp_err *err);

#endif
