/* The connection handshake of the TCP transport (docs/transport.md):
 *
 *   dialer   -> HELLO     {n_ranks u32, target rank u32, nonce_d[32], inc_d u64, opt_d u32}
 *   acceptor -> CHALLENGE {nonce_a[32], mac_a[32], inc_a u64, opt_a u32}
 *   dialer   -> AUTH      {mac_d[32]}
 *   acceptor -> WELCOME   {}
 *   mac_x = HMAC-SHA256(secret, "downpour-auth-v2" | transcript | 'A' or 'D')
 *   transcript = nonce_d | nonce_a | dialer u32 | acceptor u32 | n_ranks u32 |
 *                inc_d u64 | inc_a u64 | opt_d u32 | opt_a u32
 *   session = HMAC-SHA256(secret, "downpour-session-v2" | transcript), then
 *   crypto_kdf subkeys 1 (dialer -> acceptor) and 2 (acceptor -> dialer)
 *
 * inc: the process's incarnation (random per dp_tcp_open); opt bit 0: payload
 * encryption, bit 1: AES-256-GCM (dialer: available; acceptor: chosen), bit 2:
 * shared memory (dialer: offered; acceptor: taken, so the setup of shm.h
 * follows WELCOME).
 *
 * Asking for the cluster spec (`downpour run --join HOST:PORT`): the dialer,
 * which knows no rank yet, sends HELLO with opt bit 3 (query), n_ranks 0,
 * target and source DP_AUTH_QUERY_RANK; the transcript names the dialer as
 * DP_AUTH_QUERY_RANK and n_ranks as 0, the acceptor as the source of its
 * CHALLENGE.  Once the dialer's AUTH checks out, the acceptor sends, instead
 * of WELCOME:
 *
 *   acceptor -> SPEC {length u32}, SPEC {up to 1024 bytes}..., SPEC {mac_s[32]}
 *   mac_s = HMAC-SHA256(secret, "downpour-spec-v1" | transcript | 'S' | spec)
 *
 * and closes.  An acceptor that serves no spec sends REJECT.
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
#define DP_AUTH_OPT_ENCRYPT 1u
#define DP_AUTH_OPT_AES 2u
#define DP_AUTH_OPT_SHM 4u /* shared-memory setup follows WELCOME (shm.h) */
#define DP_AUTH_OPT_QUERY 8u /* dialer: asks for the cluster spec, not a connection */
#define DP_AUTH_QUERY_RANK 0xffffffffu /* a querying dialer's rank (it has none) */
#define DP_AUTH_SPEC_MAX (1u << 20)    /* the longest cluster spec a query takes */

typedef struct dp_auth_params {
    int self_rank, n_ranks;
    const unsigned char *secret;
    size_t secret_len;
    double deadline; /* dp_now() seconds for the whole handshake */
    /* Acceptor only: called once the dialer has proved itself, before
     * WELCOME; returns 0 to admit rank peer (of that incarnation), or -1 with
     * why filled. */
    int (*admit)(void *ctx, int peer, uint64_t incarnation, char *why, size_t why_cap);
    void *admit_ctx;
    uint64_t incarnation; /* this process's, sent to the peer */
    int encrypt;          /* encrypt payloads: both sides must agree */
    /* Acceptor only: the cluster spec (JSON, spec_len bytes, at most
     * DP_AUTH_SPEC_MAX) for a dialer that asks for it; NULL: refused. */
    const char *spec;
    size_t spec_len;
} dp_auth_params;

/* What a finished handshake agreed on.  keyed is 0 with an empty secret
 * (insecure): then frames carry CRCs only. */
typedef struct dp_auth_session {
    int keyed, encrypt, suite; /* suite: DP_FMAC_AESGCM or DP_FMAC_CHACHA (fmac.h) */
    int shm; /* both offered shared memory: its setup frames follow WELCOME (shm.h) */
    uint64_t peer_incarnation;
    unsigned char key_tx[32], key_rx[32]; /* this side's sending and receiving keys */
} dp_auth_session;

/* Frames and bytes the handshake put on and took off the wire. */
typedef struct dp_auth_io {
    uint64_t frames_sent, bytes_sent, frames_recv, bytes_recv;
} dp_auth_io;

/* Both return 0, or -1 on a failure worth retrying (timeout, EOF: the peer
 * may be restarting) or -2 on a final one (wrong secret, rejected by the
 * peer, wrong rank at that address). */
int dp_auth_dial(int fd, const dp_auth_params *p, int peer, dp_auth_io *io, dp_auth_session *s,
                 dp_err *err);
int dp_auth_accept(int fd, const dp_auth_params *p, int *peer_out, dp_auth_io *io,
                   dp_auth_session *s, dp_err *err);

/* The same with shared memory (shm.h) offered (dialer) or taken (acceptor)
 * when shm is 1: s->shm then says both did, and the setup frames follow. */
int dp_auth_dial_shm(int fd, const dp_auth_params *p, int shm, int peer, dp_auth_io *io,
                     dp_auth_session *s, dp_err *err);
int dp_auth_accept_shm(int fd, const dp_auth_params *p, int shm, int *peer_out, dp_auth_io *io,
                       dp_auth_session *s, dp_err *err);
/* The acceptors' answer (1, *peer_out -1) when the dialer asked for the
 * cluster spec and was sent it: close the connection, there is no peer. */
#define DP_AUTH_SERVED_SPEC 1

/* Dialer: asks the task at the other end of fd for the cluster spec
 * (p->self_rank and p->n_ranks unused).  0 with *spec a malloc'd,
 * NUL-terminated copy, *acceptor its rank; -1 (retry) or -2 (final) as
 * dp_auth_dial. */
int dp_auth_query_spec(int fd, const dp_auth_params *p, char **spec, int *acceptor,
                       dp_auth_io *io, dp_err *err);

/* Sends a REJECT frame with a reason, best effort, waiting at most 0.2 s. */
void dp_auth_send_reject(int fd, int self_rank, const char *reason);

#endif
