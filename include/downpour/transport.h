/* The transport interface: typed frames to and from tasks identified by rank
 * 0..n-1.  Strategies use only these calls; TCP (tcp.h) is the first
 * implementation, an MPI and an in-process transport plug in behind the same
 * table of operations (src/net/transport_impl.h).
 *
 * Sending is thread-safe (frames to one peer never interleave).  Receiving
 * (dp_transport_poll, dp_transport_recv, dp_transport_recv_payload) is done by
 * one thread at a time.
 *
 * Receiving is two-step so payloads land straight in the caller's memory:
 * poll returns a FRAME event with the header only; the caller then reads the
 * payload with dp_transport_recv_payload into, for example, params + offset,
 * in one or several pieces.  The CRC of each chunk (1 MiB, see frame.h) is
 * checked as soon as its last byte has been read.  A payload not read before
 * the next poll of that peer is discarded with a warning. */
#ifndef DOWNPOUR_TRANSPORT_H
#define DOWNPOUR_TRANSPORT_H

#include "downpour/frame.h"
#include "downpour/status.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct dp_transport dp_transport;

#define DP_PEER_ANY (-1) /* poll: any peer; stats: totals over every peer */

typedef enum dp_event_kind {
    DP_EVENT_TIMEOUT = 0, /* nothing arrived before the timeout */
    DP_EVENT_FRAME,       /* a frame header from ev->peer; payload not read yet */
    DP_EVENT_PEER_LOST,   /* ev->peer is gone: EOF, reset, silence, bad frame or BYE */
    DP_EVENT_KIND_COUNT
} dp_event_kind;

typedef struct dp_event {
    dp_event_kind kind;
    int peer;               /* FRAME, PEER_LOST */
    int orderly;            /* PEER_LOST: 1 when the peer said BYE */
    dp_frame_header header; /* FRAME */
    char reason[256];       /* PEER_LOST: what happened, for the log */
} dp_event;

typedef struct dp_transport_stats {
    uint64_t bytes_sent, bytes_recv;   /* every byte on the wire: headers + payloads */
    uint64_t frames_sent, frames_recv; /* every frame, handshake and heartbeats included */
    uint64_t heartbeats_sent, heartbeats_recv;
} dp_transport_stats;

/* This task's rank, the number of ranks, the implementation's name ("tcp"),
 * and a peer's name for logs ("worker:2", or "rank 2" when none was given). */
int dp_transport_rank(const dp_transport *t);
int dp_transport_size(const dp_transport *t);
const char *dp_transport_name(const dp_transport *t);
const char *dp_transport_peer_name(const dp_transport *t, int peer);

/* Makes sure a connection to peer is up, waiting at most until deadline
 * (dp_now() seconds).  Which side dials is the implementation's business (TCP:
 * the lower rank dials, the higher one waits for it); both sides call this. */
int dp_transport_connect(dp_transport *t, int peer, double deadline, dp_err *err);
/* Connects to every other rank. */
int dp_transport_connect_all(dp_transport *t, double deadline, dp_err *err);

/* Sends one frame: header plus payload, straight from the caller's memory
 * (payloads up to 512 bytes are copied next to the header for one send). */
int dp_transport_send(dp_transport *t, int peer, unsigned type, uint64_t step, uint64_t offset,
                      const void *payload, size_t len, dp_err *err);
/* The same with the payload gathered from iovcnt pieces (at most 64). */
int dp_transport_sendv(dp_transport *t, int peer, unsigned type, uint64_t step, uint64_t offset,
                       const struct iovec *iov, int iovcnt, dp_err *err);

/* Waits up to timeout_s seconds (0: just look) for the next event from peer
 * (or DP_PEER_ANY).  Heartbeats are consumed here.  Returns 0 with ev filled
 * (including DP_EVENT_TIMEOUT), or -1 on misuse (bad peer). */
int dp_transport_poll(dp_transport *t, int peer, double timeout_s, dp_event *ev, dp_err *err);

/* Reads the next len bytes of the payload of the frame last polled from peer
 * into dst.  A CRC mismatch (or EOF, or a peer silent past the timeout)
 * returns -1, closes that connection and is reported as a PEER_LOST event by
 * the next poll; the bytes already in dst must then be treated as garbage. */
int dp_transport_recv_payload(dp_transport *t, int peer, void *dst, size_t len, dp_err *err);
/* The same for a payload of floats that the caller sums: dst[i] += payload
 * float i for i < count (the next count * 4 payload bytes, little-endian
 * floats as the sender's memory held them).  Shared memory reads them
 * straight from the ring; other paths go through a small buffer. */
int dp_transport_recv_payload_add(dp_transport *t, int peer, float *dst, size_t count,
                                  dp_err *err);
/* Discards what is left of that payload. */
int dp_transport_skip_payload(dp_transport *t, int peer, dp_err *err);

/* Waits for the next frame from one peer.  Every late_log seconds (the
 * transport's setting) it logs "waiting for worker:2 (what) for 10 s".
 * Returns 0 with a FRAME in ev; -1 with ev->kind PEER_LOST or TIMEOUT and err
 * naming the peer and what was awaited. */
int dp_transport_recv(dp_transport *t, int peer, const char *what, double timeout_s,
                      dp_event *ev, dp_err *err);

/* Waits for the one frame a protocol step expects from peer: `type` with
 * this step and offset and exactly len bytes, read into dst.  Returns 0;
 * DP_RECV_LOST when the peer is lost (err says how: the caller names what
 * the loss costs); -1 when something else came (err names it and what was
 * due). */
#define DP_RECV_LOST (-2)
int dp_transport_recv_exact(dp_transport *t, int peer, unsigned type, uint64_t step,
                            uint64_t offset, void *dst, size_t len, const char *what,
                            double timeout_s, dp_err *err);

/* The transport's own all-reduce (MPI_Allreduce), when it has one: sums
 * buf[0..len) in place over the given ranks (this one among them).
 * dp_transport_allreduce fails when dp_transport_has_allreduce says 0. */
int dp_transport_has_allreduce(const dp_transport *t);
int dp_transport_allreduce(dp_transport *t, float *buf, size_t len, const int *ranks, int n_ranks,
                           dp_err *err);

/* A random 64-bit number drawn by each process when it opens its transport
 * (TCP: sent in the handshake), so a task that restarted and rejoined can be
 * told from its old self.  dp_transport_peer_incarnation gives the one of
 * peer's current connection, 0 when unknown (not connected yet, or a
 * transport without incarnations: in-process, MPI); dp_transport_incarnation
 * gives this task's own. */
uint64_t dp_transport_peer_incarnation(const dp_transport *t, int peer);

/* 1 when the newest loss of peer was this side dropping its connection
 * because a frame from it failed authentication (altered, forged or replayed
 * on the way, docs/transport.md "Frame MAC"): the peer itself may be alive
 * and well, so the caller says so rather than "lost".  0 otherwise, and on a
 * transport without frame MACs. */
int dp_transport_peer_tampered(const dp_transport *t, int peer);
/* 1 when peer is lost and its loss was its BYE: it left the run in order
 * (a drained worker, docs/faults.md "Draining", or one that ended well),
 * rather than dying.  0 otherwise, and on a transport without BYE (MPI). */
int dp_transport_peer_left(const dp_transport *t, int peer);
uint64_t dp_transport_incarnation(const dp_transport *t);

/* Whether peer runs on this task's host: 1 yes, 0 no, -1 unknown.  TCP
 * knows it from the shared-memory handshake (a peer with a shared-memory
 * link is on this host; without --shm, or before connecting, unknown); the
 * in-process transport from the host map a test gives it (dp_inproc_set_hosts;
 * without one, every endpoint is on one host); MPI does not tell (unknown).
 * The all-reduce's hierarchy reads it (docs/transport.md, "Hosts"). */
int dp_transport_same_host(const dp_transport *t, int peer);

/* Counters of one peer, or of all with DP_PEER_ANY.  Safe from any thread. */
int dp_transport_stats_get(const dp_transport *t, int peer, dp_transport_stats *out);

/* Says BYE to every peer, stops background threads, closes everything.
 * NULL is a no-op. */
void dp_transport_close(dp_transport *t);
/* Closes as a task that failed: its peers take it as lost, not finished
 * (TCP: no BYE), so those that dial it redial and find it again when a
 * supervisor restarts it (docs/faults.md). */
void dp_transport_close_failed(dp_transport *t);

const char *dp_event_kind_name(dp_event_kind k);

#endif
