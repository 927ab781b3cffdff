/* The in-process transport: n endpoints (ranks 0..n-1) in one process,
 * connected through a shared hub of queues, for deterministic tests of
 * strategies (docs/architecture.md, "Transports").  Each endpoint is a dp_transport with the
 * contract of transport.h, as TCP keeps it:
 *   - per-peer FIFO order; with DP_PEER_ANY, frames come in the order they
 *     were sent (one sequence over the whole hub), so a test driving several
 *     endpoints from one thread knows which event a poll returns;
 *   - two-step receive: poll gives the header, recv_payload copies the
 *     payload into the caller's memory in one or several pieces, an unread
 *     payload is discarded (with a warning) at the next poll of that peer;
 *   - sends are thread-safe and never block: each frame is copied into an
 *     unbounded queue of the receiver (memory is the only limit);
 *   - poll with timeout 0 just looks; a poll with a timeout sleeps on a
 *     condition variable until a frame or a loss arrives.
 * Each endpoint is used by one thread, or all of them by one thread.  There
 * is no handshake, no heartbeat and no collective fast path
 * (dp_transport_has_allreduce is 0: strategies run their ring).
 * docs/transport.md has the details. */
#ifndef DOWNPOUR_INPROC_H
#define DOWNPOUR_INPROC_H

#include "downpour/transport.h"

/* Creates n connected endpoints, ts[0..n) (rank i is ts[i]); names (NULL, or
 * n strings, copied) name the ranks in logs, else "rank N".  Close every
 * endpoint with dp_transport_close: closing one is an orderly goodbye (its
 * peers get what it sent, then a PEER_LOST with orderly = 1); the hub goes
 * with the last one.  On failure nothing is left open. */
int dp_inproc_open(dp_transport **ts, int n, dp_err *err);
int dp_inproc_open_named(dp_transport **ts, int n, const char *const *names, dp_err *err);

/* How dp_inproc_kill takes an endpoint down. */
typedef enum dp_inproc_fault {
    /* A process killed (SIGKILL): its peers still get the frames it had
     * sent, then a PEER_LOST (orderly = 0) "connection closed (EOF) without
     * BYE", each where it falls in that peer's FIFO. */
    DP_INPROC_CRASH,
    /* Every link of the endpoint cut: frames in flight either way are
     * dropped, and each peer's next poll that looks at it reports the
     * PEER_LOST (orderly = 0) before anything else. */
    DP_INPROC_CUT,
    DP_INPROC_FAULT_COUNT
} dp_inproc_fault;

/* Takes endpoint t down as `how` says, without closing it.  Afterwards t's
 * own sends fail, its polls report each peer lost once, and frames sent to it
 * are dropped; its owner still closes it.  Fails on an endpoint that is not
 * in-process, or that was killed already. */
int dp_inproc_kill(dp_transport *t, dp_inproc_fault how, dp_err *err);

/* A fake host map for tests of topology (dp_transport_same_host): rank i
 * runs on host host_of_rank[i] (n entries, copied), for every endpoint of
 * t's hub.  Without one, all endpoints are on one host. */
int dp_inproc_set_hosts(dp_transport *t, const int *host_of_rank, dp_err *err);

#endif
