/* allreduce's settings (allreduce_options.c): read by allreduce.c where
 * the ring and the reducer open.  Private to src/strategy. */
#ifndef DOWNPOUR_STRATEGY_ALLREDUCE_OPTIONS_H
#define DOWNPOUR_STRATEGY_ALLREDUCE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "downpour/reducer.h"
#include "downpour/strategy.h"

/* A new option of allreduce is a field here and a line in allreduce_options.c's opts. */
typedef struct dp_allreduce_settings {
    size_t bucket_bytes; /* gradients reduced in buckets of this size */
    const char *overlap; /* --overlap auto, on or off (NULL: not given, auto) */
    bool no_overlap;     /* --no-overlap: --overlap off */
    bool sync_bn;        /* batch norm's batch statistics over every replica's rows */
    bool dense;          /* --allreduce-dense: sparse tables all-reduced whole */
} dp_allreduce_settings;

extern const dp_strategy_conf dp_allreduce_conf;

/* The reducer's mode: --sync-bn and --no-overlap make it off. */
dp_overlap dp_allreduce_overlap(const dp_allreduce_settings *a);

#endif
