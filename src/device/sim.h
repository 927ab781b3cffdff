/* What tests ask of the sim backend beyond the table (private to src/device/
 * and the tests): its allocation counts, so a test can check that nothing
 * allocates device memory inside a step, and the host ranges registered
 * (host_register), so a test can see what is pinned and that it is let go.
 * Also what sim.c and sim_comm.c (its collectives) share. */
#ifndef DP_DEVICE_SIM_H
#define DP_DEVICE_SIM_H

#include <stddef.h>
#include <stdint.h>

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

/* sim.c, for sim_comm.c: the head of the context's list of communicators
 * (so sim_close ends those left over), and whether a graph is being
 * captured (sim records no collectives). */
typedef struct dp_sim_comm dp_sim_comm;
dp_sim_comm **dp_sim_comm_list(void *ctx);
int dp_sim_capturing(const void *ctx);

/* sim_comm.c: the table's six collectives (backend.h), and the end of every
 * communicator a closing context still holds. */
int dp_sim_comm_id(void *ctx, uint8_t *id, size_t id_len, char *msg, size_t len);
int dp_sim_comm_join(void *ctx, const uint8_t *id, size_t id_len, int ranks, int rank,
                     void **comm, char *msg, size_t len);
int dp_sim_comm_allreduce(void *ctx, void *comm, float *buf, size_t n);
/* Every sum in flight on ctx's communicators finished (or failed): what sim
 * runs after one on the stream calls this first. */
void dp_sim_comm_settle(void *ctx);
int dp_sim_comm_wait(void *ctx, void *comm, double timeout_s, char *msg, size_t len);
void dp_sim_comm_abort(void *ctx, void *comm);
void dp_sim_comm_free(void *ctx, void *comm);
void dp_sim_comm_close_all(void *ctx);

#endif
