/* What tests ask of the sim backend beyond the table (private to src/device/
 * and the tests): its allocation counts, so a test can check that nothing
 * allocates device memory inside a step, and the host ranges registered
 * (host_register), so a test can see what is pinned and that it is let go. */
#ifndef DP_DEVICE_SIM_H
#define DP_DEVICE_SIM_H

#include <stddef.h>

typedef struct dp_sim_counts {
    long allocs;      /* alloc calls that succeeded */
    size_t bytes;     /* device bytes held now */
    long host_allocs; /* host_alloc calls that succeeded */
    long graph_launches; /* graph_launch calls */
    long pinned;         /* host ranges registered now (host_register) */
    size_t pinned_bytes; /* their bytes */
} dp_sim_counts;

/* ctx is the sim backend's context (dp_device_ctx of a sim device). */
dp_sim_counts dp_sim_counts_of(const void *ctx);

#endif
