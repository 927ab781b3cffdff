/* The connection handshake of the TCP transport (docs/transport.md):
 *
 *   dialer   -> HELLO     {n_ranks u32, target rank u32, nonce_d[32]}
 *   acceptor -> CHALLENGE {nonce_a[32], mac_a[32]}   mac_a = HMAC(secret, ctx | 'A')
 *   dialer   -> AUTH      {mac_d[32]}                mac_d = HMAC(secret, ctx | 'D')
 *   acceptor -> WELCOME   {}
 *   ctx = "downpour-auth-v1" | nonce_d | nonce_a | dialer u32 | acceptor u32 | n_ranks u32
 *
 * Either side may send REJECT {reason text} instead and close.  Both sides
 * prove they hold the secret; the direction byte stops a reflected answer and
 * the two fresh nonces stop a replayed one.  The protocol version is checked
 * by every frame header.  Internal to src/net (and the fault tests). */
#ifndef DOWNPOUR_NET_AUTH_H
#define DOWNPOUR_NET_AUTH_H

#include "downpour/status.h"

#include <stddef.h>
#include <stdint.h>

#define DP_AUTH_NONCE 32
#define DP_AUTH_MAC 32

typedef struct dp_auth_params {
    int self_rank, n_ranks;
    const unsigned char *secret;
    size_t secret_len;
    double deadline; /* dp_now() seconds for the whole handshake */
    /* Acceptor only: called once the dialer has proved itself, before
     * WELCOME; returns 0 to admit rank peer, or -1 with why filled. */
    int (*admit)(void *ctx, int peer, char *why, size_t why_cap);
    void *admit_ctx;
} dp_auth_params;

/* Frames and bytes the handshake put on and took off the wire. */
typedef struct dp_auth_io {
    uint64_t frames_sent, bytes_sent, frames_recv, bytes_recv;
} dp_auth_io;

/* Both return 0, or -1 on a failure worth retrying (timeout, EOF: the peer
 * may be restarting) or -2 on a final one (wrong secret, rejected by the
 * peer, wrong rank at that address). */
int dp_auth_dial(int fd, const dp_auth_params *p, int peer, dp_auth_io *io, dp_err *err);
int dp_auth_accept(int fd, const dp_auth_params *p, int *peer_out, dp_auth_io *io, dp_err *err);

/* Sends a REJECT frame with a reason, best effort, waiting at most 0.2 s. */
void dp_auth_send_reject(int fd, int self_rank, const char *reason);

#endif
