/* The TCP transport's private header, shared by its three layers above
 * the frame codec (docs/architecture.md, "Transports"):
 *   tcp_conn.c  connection state: loss, install/replace, heartbeats sent,
 *               the refusal log (calls nothing above it)
 *   tcp_dial.c  the threads that make connections: accept and handshakes,
 *               the heartbeat thread, dial and redial (calls tcp_conn.c)
 *   tcp.c       the transport's operations: send, poll, payload reads,
 *               shared-memory glue, open and close (calls both)
 * Frames go through frame_codec.h over a stream.h stream; the codec never
 * sees a connection.
 *
 * Threads: the caller's threads send (one frame at a time per connection,
 * under conn.send_mu) and one caller thread receives (poll, recv_payload);
 * an accept thread starts a thread for the handshake of each incoming
 * connection (so a silent stranger delays nobody); a heartbeat
 * thread sends HEARTBEAT frames on idle connections, notices silent peers and
 * starts a redial thread for a lost peer this side dials (one at a time per
 * peer, each bounded by the handshake timeout).
 *
 * Liveness: last_rx_us is refreshed whenever the receiving thread reads bytes
 * and, while nobody reads, whenever the heartbeat thread sees the socket's
 * unread byte count (FIONREAD) grow.  A peer is lost by silence only when
 * nothing arrived for heartbeat_timeout and nothing is waiting unread: a full
 * receive buffer means the peer is alive and we are the slow one.
 *
 * Shared memory (shm.h, docs/transport.md "Shared memory"): a connection to
 * a task on this host may carry a dp_shm link, set up before it is
 * installed; its application frames then go through the link's rings and
 * the socket carries heartbeats and BYE only, and still tells of the loss.
 *
 * Lock order: tcp.mu -> conn.send_mu -> conn.mu.  A lost connection is shut
 * down at once but its fd (and shm link) stays open until it is replaced or
 * the transport closes, so no thread ever uses a recycled descriptor. */
#ifndef DOWNPOUR_NET_TCP_IMPL_H
#define DOWNPOUR_NET_TCP_IMPL_H

#include "downpour/tcp.h"

#include "auth.h"
#include "fmac.h"
#include "frame_codec.h"
#include "shm.h"
#include "sock.h"
#include "stream.h"
#include "transport_impl.h"

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/log.h"
#include "downpour/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Handshakes run in threads of their own, so a stranger who connects and
 * says nothing delays nobody; past this many at once, new ones are refused. */
#define MAX_HANDSHAKES 32
#define HDR_MAC DP_CODEC_HDR_MAC /* header and its tag */
/* "refused connection" lines: the first from an address and kind, then at
 * most one summary per window (an idle-connection flood wrote 11,720 lines
 * in 16 s). */
#define REFUSE_SLOTS 32
#define REFUSE_WINDOW 10.0

enum conn_state { CONN_NONE, CONN_UP, CONN_LOST };

typedef struct conn {
    pthread_mutex_t mu;      /* state, fd, addr, reason, reported, hb_unread */
    pthread_mutex_t send_mu; /* whole frames: app sends and heartbeats */
    _Atomic int state; /* written under mu; read without it on the fast paths */
    int fd;
    int reported; /* LOST already returned by poll */
    int orderly;
    int hb_unread; /* FIONREAD at the heartbeat thread's last look */
    char addr[64];
    char reason[200];
    dp_codec_stats st; /* counters and liveness stamps */
    /* The frames on the socket: the codec's state (sending side under
     * send_mu, receiving side the receiving thread's), fixed while UP. */
    dp_codec cd;
    dp_stream_socket sock;
    dp_stream_pause pause; /* the mid-frame test hook around sock, when armed */
    dp_stream *io;         /* &sock or &pause */
    struct tcp *owner;     /* for the socket stream's liveness question */
    _Atomic uint64_t incarnation; /* the peer's; 0 before it first connected */
    _Atomic int tampered; /* its newest loss was a frame that failed authentication */
    /* Shared memory, fixed while UP (NULL: TCP only).  The receiving thread
     * keeps a BYE or EOF read from the socket in shm_end until the ring has
     * handed out every frame sent before it. */
    dp_shm *shm;
    int shm_end, shm_end_orderly;
    char shm_end_reason[200];
    uint64_t seq0; /* sequence numbers the shared-memory setup spent */
    /* A reconnection of the peer that waits until the loss of the current
     * connection has been reported (then the receiving thread installs it). */
    int next_fd;
    char next_addr[64];
    dp_auth_io next_io;
    dp_auth_session next_sess;
    dp_shm *next_shm;
    /* Its sending side (send_mu): the waiting connection gets heartbeats,
     * so the peer does not take us for dead while our loss report waits. */
    dp_fmac next_tx;
    uint64_t next_tx_seq;
    int64_t next_last_tx_us;
    /* Redial of a peer this side dials (docs/transport.md, "Redial"), under
     * mu: wanted after a loss without BYE or when the old connection hung up. */
    int redial, dialing;
    double redial_due, redial_backoff;
    char redial_err[200];
    int dial_fd; /* the running attempt's socket (tcp.mu), for close to cut short */
} conn;

typedef struct refusal {
    char key[96]; /* host | start of the reason */
    char host[64];
    char reason[120];
    double last_log;
    uint64_t suppressed;
} refusal;

typedef struct tcp {
    dp_transport base;
    int listen_fd, port;
    int wake[2]; /* written once at close: wakes the accept and heartbeat threads */
    char **addrs;
    unsigned char secret[DP_SECRET_MAX];
    size_t secret_len;
    double hb_interval, hb_timeout, hs_timeout;
    double slice; /* longest single blocking wait: SO_RCVTIMEO and SO_SNDTIMEO */
    uint64_t max_frame;
    int sock_buf;
    int keyed, encrypt; /* frames carry tags (a secret); payloads encrypted */
    int shm;            /* offer and take shared memory with tasks on this host */
    size_t shm_ring;    /* bytes per direction */
    long delay_ns;      /* link delay of every application frame; 0: none */
    /* Test hook (docs/faults.md, "Testing"), read once at open: when armed,
     * each connection's stream is wrapped in a dp_stream_pause. */
    dp_pause_hook pause;
    uint64_t incarnation;
    pthread_mutex_t rl_mu; /* refusal log */
    refusal rl[REFUSE_SLOTS];
    _Atomic int stopping;
    _Atomic int joining; /* dp_tcp_config.joining, until dp_tcp_joined */
    char secret_refusal[200]; /* joining: a handshake that failed on the secret (under mu) */
    char *spec;               /* dp_tcp_config.spec_json (a copy), or NULL */
    size_t spec_len;
    pthread_mutex_t mu;  /* install/wait for a connection; the handshakes below */
    pthread_cond_t cond; /* a connection was installed, or a handshake ended */
    int hs_fd[MAX_HANDSHAKES]; /* fds of the handshakes in progress, or -1 */
    int hs_active;       /* handshake threads running */
    int rd_active;       /* redial threads running */
    pthread_t accept_thr, hb_thr;
    int threads;
    int rr; /* poll's round-robin start */
    struct pollfd *pf; /* poll's arrays, 2 x n_ranks each (socket and doorbell) */
    int *who;
    conn *conns;
} tcp;

/* Liveness timestamps need milliseconds, not nanoseconds: the coarse clock
 * costs a few ns where the precise one costs ~25 on every frame. */
static inline int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline const char *pname(const tcp *t, int peer) { return t->base.names[peer]; }

/* How dp_tcp_conn_fail's connection ended: abruptly, orderly (the peer said
 * goodbye), or dropped here because a frame failed authentication, where the
 * loss is this side's doing and the peer may be alive
 * (dp_transport_peer_tampered). */
enum { LOST_ABRUPT, LOST_ORDERLY, LOST_TAMPERED };

#define REDIAL_FIRST 0.2 /* s after the loss: a restarted task needs that long anyway */
#define REDIAL_MAX 2.0

/* ---- tcp_conn.c ---- */

/* Marks c lost with a reason (first reason wins), shuts the socket down so
 * any thread blocked on it wakes, and logs it once.  A peer this side dials
 * that left without BYE is redialed in the background. */
void dp_tcp_conn_fail(tcp *t, int peer, int how, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* With c->mu held: after a loss (orderly: a BYE, which stops it) or a
 * hang-up, a redial of a peer this side dials is wanted. */
void dp_tcp_want_redial(tcp *t, int peer, int orderly);

/* Logs "refused connection from ADDR: reason", rate-limited per host and kind. */
void dp_tcp_refused(tcp *t, const char *addr, const char *reason);

/* The summaries of refusals not yet logged (force: all of them). */
void dp_tcp_refusals_flush(tcp *t, int force);

/* The socket of peer's connection while it is UP; else -1 with err. */
int dp_tcp_conn_fd(tcp *t, int peer, dp_err *err);

/* After the handshake: blocking, with send and receive timeouts of one slice. */
int dp_tcp_make_blocking(tcp *t, int fd, dp_err *err);

/* A HEARTBEAT or BYE into h (keyed: tagged with m's next number); its size. */
size_t dp_tcp_ctl_frame(tcp *t, unsigned type, dp_fmac *m, uint64_t *seq, uint8_t h[HDR_MAC]);

/* Wakes threads waiting on tcp.cond (a connection installed, a thread ended). */
void dp_tcp_wake_waiters(tcp *t);

/* Installs a connection that finished its handshake (or keeps it waiting
 * until the old one's loss has been reported). */
void dp_tcp_install(tcp *t, int peer, int fd, const char *addr, const dp_auth_io *io, const dp_auth_session *s, dp_shm *shm);

/* Receiving thread, after reporting a loss: installs the waiting replacement. */
void dp_tcp_promote(tcp *t, int peer);

/* Has the peer been silent longer than the heartbeat timeout? (*secs: how long) */
int dp_tcp_silent_for(tcp *t, conn *c, double *secs);

/* Heartbeat thread: a HEARTBEAT on an idle connection. */
void dp_tcp_send_heartbeat(tcp *t, int peer, conn *c);

/* Has the peer closed its end (FIN or reset)?  Consumes nothing. */
int dp_tcp_hung_up(int fd);

/* Heartbeat thread: heartbeats and hang-up checks for a waiting replacement. */
void dp_tcp_pending_tick(tcp *t, int peer, conn *c);

/* ---- tcp_dial.c ---- */

/* The accept thread: a handshake thread per incoming connection. */
void *dp_tcp_accept_main(void *arg);

/* The heartbeat thread: heartbeats, silence, hang-ups and redials. */
void *dp_tcp_heartbeat_main(void *arg);

/* dp_transport_ops.connect: dial (lower rank) or wait for the peer. */
int dp_tcp_connect_peer(dp_transport *bt, int peer, double deadline, dp_err *err);

#endif
