/* The TCP transport: one connection per pair of ranks, the lower rank dials
 * the higher (both sides call dp_transport_connect), authenticated by an
 * HMAC challenge on the cluster secret, kept alive by heartbeats.  A peer
 * this side dials that is lost without BYE is redialed in the background
 * until it is back (a restarted task rejoins) or the transport closes.
 * Details and the wire format: docs/transport.md. */
#ifndef DOWNPOUR_TCP_H
#define DOWNPOUR_TCP_H

#include "downpour/transport.h"

#include <stdint.h>

typedef struct dp_tcp_config {
    int rank, n_ranks;
    const char *const *addrs; /* n_ranks "host:port"; addrs[rank] is where to listen */
    const char *const *names; /* optional n_ranks names for logs ("worker:2") */
    const unsigned char *secret; /* cluster secret (dp_secret_load), copied */
    size_t secret_len;
    int insecure;           /* 1 allows secret_len == 0: anyone who can connect is trusted */
    int listen_fd;          /* -1: bind addrs[rank]; else a socket from dp_tcp_listen, which
                               dp_tcp_open takes over (and closes, also when it fails) once
                               it has checked that it is a listening socket */
    double heartbeat_interval; /* s between heartbeats on an idle connection (1) */
    double heartbeat_timeout;  /* s of silence before a peer is lost (10) */
    double handshake_timeout;  /* s for a connection's handshake (5) */
    double late_log;           /* s between "waiting for" lines (5) */
    uint64_t max_frame_bytes;  /* largest payload accepted (DP_FRAME_MAX_DEFAULT, 1 GiB) */
    int sock_buf_bytes;        /* SO_SNDBUF/SO_RCVBUF (4 MiB); 0 leaves the kernel's autotuning */
    int encrypt;               /* 1: encrypt payloads (needs a secret; every task must agree) */
    double link_delay_ms;      /* every application frame waits this long before it is
                                  written: a one-way latency per message, for experiments
                                  (0..DP_TCP_MAX_LINK_DELAY_MS; 0 off; docs/cluster.md,
                                  "A virtual cluster on one machine") */
    int shm;                   /* 1 (default): frames to tasks on this host (same boot, network
                                  namespace and uid) go through shared memory; 0: TCP only.
                                  dp_tcp_config_init makes it 0 when DOWNPOUR_SHM=0 is in
                                  the environment (env.h's fallback; docs/transport.md,
                                  "Shared memory") */
    size_t shm_ring_bytes;     /* bytes per direction of a link's rings, a power of two
                                  (0: 4 MiB) */
    int joining;               /* 1: this task joins a running job (a spare slot): while it
                                  waits for a peer to dial it, a handshake that fails on the
                                  secret ends the wait at once with that reason, rather than
                                  after the whole connect deadline (docs/cluster.md, "Spare
                                  slots") */
    const char *spec_json;     /* the cluster spec (dp_cluster_to_json, no "task"), copied:
                                  handed to a task that proves the secret and asks for it
                                  (`downpour run --join HOST:PORT`; docs/transport.md,
                                  "Asking for the cluster spec").  NULL, or above 1 MiB (a
                                  warning): such a query is refused */
} dp_tcp_config;

#define DP_TCP_MAX_LINK_DELAY_MS 10000

/* Defaults as above; listen_fd -1; shm from DOWNPOUR_SHM (read once, env.h).
 * Always start from this. */
void dp_tcp_config_init(dp_tcp_config *cfg);

/* Binds and listens on "host:port" (port 0: an ephemeral port, returned in
 * *port_out) before the transport exists, so a launcher or a test can learn
 * every port first and then give the full address list to dp_tcp_open. */
int dp_tcp_listen(const char *addr, int sock_buf_bytes, int *fd_out, int *port_out, dp_err *err);

/* Listens, starts the accept and heartbeat threads.  No connection is made
 * until dp_transport_connect. */
int dp_tcp_open(const dp_tcp_config *cfg, dp_transport **out, dp_err *err);

/* Dials `peer` (a higher rank, not connected yet) in the background, as a
 * lost peer is redialed, instead of waiting for it now: a spare worker slot
 * whose task may start at any time (docs/cluster.md, "Spare slots").  A
 * no-op for a lower rank (it dials this side), a peer already connected or
 * a transport that is not TCP. */
void dp_tcp_dial_later(dp_transport *t, int peer);

/* A joining task (dp_tcp_config.joining) is connected: from now on a
 * handshake that fails on the secret is a stranger's, logged and refused as
 * any, and ends no wait.  A no-op on a transport that is not TCP. */
void dp_tcp_joined(dp_transport *t);

/* Asks the task listening at addr ("host:port") for its cluster's spec,
 * proving the secret and checking the task's proof (docs/transport.md,
 * "Asking for the cluster spec").  0 with *json a malloc'd spec (free()),
 * else -1 with a message naming addr.  One attempt, within timeout_s. */
int dp_tcp_query_spec(const char *addr, const unsigned char *secret, size_t secret_len,
                      double timeout_s, char **json, dp_err *err);
/* The port this transport listens on (-1 if t is not TCP). */
int dp_tcp_port(const dp_transport *t);

#endif
