/* For transport implementations only (TCP here; MPI and in-process later):
 * the table of operations behind include/downpour/transport.h, in the manner
 * of ggml-backend-impl.h.  Strategies never include this. */
#ifndef DOWNPOUR_NET_TRANSPORT_IMPL_H
#define DOWNPOUR_NET_TRANSPORT_IMPL_H

#include "downpour/transport.h"

typedef struct dp_transport_ops {
    const char *name;
    int (*connect)(dp_transport *t, int peer, double deadline, dp_err *err);
    /* h has type, step, offset set; the implementation fills source,
     * length and payload_crc. */
    int (*sendv)(dp_transport *t, int peer, dp_frame_header *h, const struct iovec *iov,
                 int iovcnt, dp_err *err);
    int (*poll)(dp_transport *t, int peer, double timeout_s, dp_event *ev, dp_err *err);
    int (*recv_payload)(dp_transport *t, int peer, void *dst, size_t len, dp_err *err);
    int (*skip_payload)(dp_transport *t, int peer, dp_err *err);
    /* Optional: adds count payload floats to dst (shared memory: straight
     * from the ring).  NULL: dp_transport_base_recv_add. */
    int (*recv_payload_add)(dp_transport *t, int peer, float *dst, size_t count, dp_err *err);
    void (*stats)(const dp_transport *t, int peer, dp_transport_stats *out);
    void (*close)(dp_transport *t);
    /* Optional collective fast path (MPI_Allreduce): sums buf over ranks[]
     * in place.  NULL: strategies run their own ring over sendv and poll. */
    int (*allreduce)(dp_transport *t, float *buf, size_t len, const int *ranks, int n_ranks,
                     dp_err *err);
    /* Optional: the incarnation of peer's process (peer == own rank: this
     * one's), 0 when unknown.  NULL: always 0. */
    uint64_t (*incarnation)(const dp_transport *t, int peer);
    /* Optional: whether peer's newest loss was a frame of it that failed
     * authentication (dp_transport_peer_tampered).  NULL: never. */
    int (*tampered)(const dp_transport *t, int peer);
    /* Optional: whether peer's newest loss was its BYE, an orderly leave
     * (dp_transport_peer_left).  NULL: never. */
    int (*left)(const dp_transport *t, int peer);
    /* Optional: 1 when peer runs on this task's host, 0 when not, -1 when
     * unknown (dp_transport_same_host).  NULL: unknown. */
    int (*same_host)(const dp_transport *t, int peer);
} dp_transport_ops;

/* Every implementation's handle starts with this. */
struct dp_transport {
    const dp_transport_ops *ops;
    int rank, n_ranks;
    double late_log; /* seconds between "waiting for" lines */
    char **names;    /* n_ranks peer names, owned */
    int failed;      /* dp_transport_close_failed: close without saying BYE */
};

/* Fills the common part; names may be NULL ("rank N").  Returns -1 on ENOMEM. */
int dp_transport_base_init(dp_transport *t, const dp_transport_ops *ops, int rank, int n_ranks,
                           const char *const *names, double late_log, dp_err *err);
void dp_transport_base_free(dp_transport *t);

/* What every implementation's poll does the same way. */
/* Is rank i one that a poll of `want` (a rank or DP_PEER_ANY) looks at? */
int dp_transport_base_wants(const dp_transport *t, int want, int i);
/* A payload the caller left unread before polling its peer again: warned
 * about and skipped through the implementation's skip_payload. */
void dp_transport_base_discard(dp_transport *t, int peer, uint64_t left, unsigned type);
/* recv_payload_add through recv_payload and a buffer on the stack. */
int dp_transport_base_recv_add(dp_transport *t, int peer, float *dst, size_t count, dp_err *err);
/* Fills ev as the PEER_LOST event of peer. */
void dp_transport_base_lost(dp_event *ev, int peer, int orderly, const char *reason);

#define DP_TRANSPORT_MAX_IOV 64

#endif
