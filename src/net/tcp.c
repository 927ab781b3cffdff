/* The TCP transport.
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

static const dp_transport_ops tcp_ops;

/* Liveness timestamps need milliseconds, not nanoseconds: the coarse clock
 * costs a few ns where the precise one costs ~25 on every frame. */
static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static const char *pname(const tcp *t, int peer) { return t->base.names[peer]; }

/* ---- connection state ---- */

/* How conn_fail's connection ended: abruptly, orderly (the peer said
 * goodbye), or dropped here because a frame failed authentication, where the
 * loss is this side's doing and the peer may be alive
 * (dp_transport_peer_tampered). */
enum { LOST_ABRUPT, LOST_ORDERLY, LOST_TAMPERED };

/* Marks c lost with a reason (first reason wins), shuts the socket down so
 * any thread blocked on it wakes, and logs it once.  A peer this side dials
 * that left without BYE is redialed in the background. */
static void conn_fail(tcp *t, int peer, int how, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define REDIAL_FIRST 0.2 /* s after the loss: a restarted task needs that long anyway */
#define REDIAL_MAX 2.0

/* With c->mu held: after a loss (orderly: a BYE, which stops it) or a hang-up. */
static void want_redial(tcp *t, int peer, int orderly)
{
    conn *c = &t->conns[peer];
    if (orderly || peer < t->base.rank || atomic_load(&t->stopping)) {
        c->redial = 0;
        return;
    }
    if (!c->redial) {
        c->redial = 1;
        c->redial_backoff = REDIAL_FIRST;
        c->redial_due = dp_now() + REDIAL_FIRST;
        c->redial_err[0] = '\0';
    }
}

/* The same with c->mu held. */
static void mark_lost(tcp *t, int peer, int orderly, const char *reason)
{
    conn *c = &t->conns[peer];
    if (c->state == CONN_UP) {
        snprintf(c->reason, sizeof c->reason, "%s", reason);
        c->state = CONN_LOST;
        c->orderly = orderly;
        atomic_store(&c->tampered, 0); /* conn_tampered sets it after */
        c->reported = 0;
        shutdown(c->fd, SHUT_RDWR);
        want_redial(t, peer, orderly);
        if (orderly)
            dp_info("%s (%s) disconnected: %s", pname(t, peer), c->addr, c->reason);
        else
            dp_warn("lost %s (%s): %s", pname(t, peer), c->addr, c->reason);
    }
}

static void conn_fail(tcp *t, int peer, int how, const char *fmt, ...)
{
    conn *c = &t->conns[peer];
    char reason[sizeof c->reason];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    int up = c->state == CONN_UP;
    mark_lost(t, peer, how == LOST_ORDERLY, reason);
    if (how == LOST_TAMPERED && up)
        atomic_store(&c->tampered, 1);
    pthread_mutex_unlock(&c->mu);
}

/* ---- refusal log ---- */

/* Logs "refused connection from ADDR: reason", at most once per window for
 * one host and kind of reason; the rest are counted and summed up later. */
static void refused(tcp *t, const char *addr, const char *reason)
{
    char host[64], key[96];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':'); /* the port changes with every connection */
    if (colon && colon != host)
        *colon = '\0';
    snprintf(key, sizeof key, "%s|%.24s", host, reason);
    double now = dp_now();
    pthread_mutex_lock(&t->rl_mu);
    refusal *r = NULL, *oldest = &t->rl[0];
    for (int i = 0; i < REFUSE_SLOTS && !r; i++) {
        if (t->rl[i].key[0] && strcmp(t->rl[i].key, key) == 0)
            r = &t->rl[i];
        else if (t->rl[i].last_log < oldest->last_log)
            oldest = &t->rl[i];
    }
    if (r && now - r->last_log < REFUSE_WINDOW) {
        r->suppressed++;
        pthread_mutex_unlock(&t->rl_mu);
        return;
    }
    if (!r) {
        r = oldest;
        if (r->key[0] && r->suppressed)
            dp_warn("refused %" PRIu64 " more connection(s) from %s (%s)", r->suppressed,
                    r->host, r->reason);
        snprintf(r->key, sizeof r->key, "%s", key);
        snprintf(r->host, sizeof r->host, "%s", host);
        r->suppressed = 0;
    }
    snprintf(r->reason, sizeof r->reason, "%s", reason);
    if (r->suppressed)
        dp_warn("refused connection from %s: %s (and %" PRIu64 " more like it from %s in the "
                "last %.0f s, not logged)",
                addr, reason, r->suppressed, host, now - r->last_log);
    else
        dp_warn("refused connection from %s: %s", addr, reason);
    r->suppressed = 0;
    r->last_log = now;
    pthread_mutex_unlock(&t->rl_mu);
}

/* Summary lines for refusals not logged, once their window has passed (all
 * of them when force). */
static void refusals_flush(tcp *t, int force)
{
    double now = dp_now();
    pthread_mutex_lock(&t->rl_mu);
    for (int i = 0; i < REFUSE_SLOTS; i++) {
        refusal *r = &t->rl[i];
        if (r->suppressed && (force || now - r->last_log >= REFUSE_WINDOW)) {
            dp_warn("refused %" PRIu64 " more connection(s) from %s in the last %.0f s (%s)",
                    r->suppressed, r->host, now - r->last_log, r->reason);
            r->suppressed = 0;
            r->last_log = now;
        }
    }
    pthread_mutex_unlock(&t->rl_mu);
}

/* Returns the fd of an UP connection, or -1 with err saying why not. */
static int conn_fd(tcp *t, int peer, dp_err *err)
{
    conn *c = &t->conns[peer];
    if (atomic_load(&c->state) == CONN_UP)
        return c->fd; /* fd only changes while the state is not UP */
    pthread_mutex_lock(&c->mu);
    int fd = c->state == CONN_UP ? c->fd : -1;
    if (fd < 0) {
        if (c->state == CONN_NONE)
            dp_errf(err, "not connected to %s", pname(t, peer));
        else
            dp_errf(err, "connection to %s (%s) is lost: %s", pname(t, peer), c->addr,
                    c->reason);
    }
    pthread_mutex_unlock(&c->mu);
    return fd;
}

static void add_io(conn *c, const dp_auth_io *io)
{
    atomic_fetch_add_explicit(&c->st.frames_sent, io->frames_sent, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->st.bytes_sent, io->bytes_sent, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->st.frames_recv, io->frames_recv, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->st.bytes_recv, io->bytes_recv, memory_order_relaxed);
}

/* After the handshake a connection's socket blocks, with SO_RCVTIMEO and
 * SO_SNDTIMEO of t->slice so no wait outlasts a liveness check: a frame then
 * costs one system call each way, as on a plain blocking socket. */
static int make_blocking(tcp *t, int fd, dp_err *err)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        return dp_errf(err, "fcntl: %s", strerror(errno));
    struct timeval tv = {(time_t)t->slice, (long)((t->slice - (time_t)t->slice) * 1e6)};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        return dp_errf(err, "setsockopt SO_RCVTIMEO: %s", strerror(errno));
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        return dp_errf(err, "setsockopt SO_SNDTIMEO: %s", strerror(errno));
    return 0;
}

static int sock_silent(void *ctx, double *secs);

/* Makes fd the connection of c (c->send_mu and c->mu held; c is not UP and
 * its loss, if any, has been reported, so no thread reads its old state). */
static void conn_setup(conn *c, int fd, const char *addr, const dp_auth_io *io,
                       const dp_auth_session *s, dp_shm *shm)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = fd;
    dp_shm_close(c->shm);
    c->shm = shm;
    c->shm_end = 0;
    c->reported = 0;
    c->orderly = 0;
    c->hb_unread = 0;
    c->reason[0] = '\0';
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    int64_t now = now_us();
    atomic_store(&c->st.last_rx_us, now);
    atomic_store(&c->st.last_tx_us, now);
    add_io(c, io);
    c->seq0 = s->shm ? DP_SHM_SETUP_FRAMES : 0;
    dp_codec_key(&c->cd, s->suite, s->key_tx, s->key_rx, s->encrypt, c->seq0);
    dp_stream_socket_init(&c->sock, fd, sock_silent, c);
    c->io = &c->sock.base;
    if (c->owner->pause.bytes) {
        dp_stream_pause_init(&c->pause, &c->sock.base, &c->owner->pause,
                             c->owner->base.names[c - c->owner->conns], c->owner->keyed);
        c->io = &c->pause.base;
    }
    atomic_store(&c->incarnation, s->peer_incarnation);
    c->state = CONN_UP; /* last: the receiving thread reads the rest once it sees UP */
}

/* A HEARTBEAT or BYE frame into h (tagged with m's next sequence number
 * when keyed); returns its size. */
static size_t ctl_frame(tcp *t, unsigned type, dp_fmac *m, uint64_t *seq, uint8_t h[HDR_MAC])
{
    return dp_codec_control(t->keyed, (uint32_t)t->base.rank, type, m, seq, h);
}

static void wake_waiters(tcp *t)
{
    pthread_mutex_lock(&t->mu);
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->mu);
}

/* Installs a connection that finished its handshake.  A peer that is still
 * UP but comes back with another incarnation has restarted: the old
 * connection is lost, and the new one waits (next_fd) until that loss has
 * been reported, so the receiving thread sees PEER_LOST before the new
 * peer's frames. */
static void install(tcp *t, int peer, int fd, const char *addr, const dp_auth_io *io,
                    const dp_auth_session *s, dp_shm *shm)
{
    conn *c = &t->conns[peer];
    int pend = 0, dup = 0;
    pthread_mutex_lock(&c->send_mu);
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_UP && atomic_load(&c->incarnation) == s->peer_incarnation) {
        dup = 1; /* two handshakes of one process raced past admit() */
    } else if (c->state == CONN_UP) {
        /* A BYE, best effort, so that the old process, should it still be
         * alive, takes the loss as orderly and does not redial. */
        uint8_t h[HDR_MAC];
        size_t hl = ctl_frame(t, DP_FRAME_BYE, &c->cd.tx, &c->cd.tx_seq, h);
        if (send(c->fd, h, hl, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)hl) {
            atomic_fetch_add(&c->st.frames_sent, 1);
            atomic_fetch_add(&c->st.bytes_sent, hl);
        }
        char why[128];
        snprintf(why, sizeof why, "%s restarted (new incarnation)", pname(t, peer));
        mark_lost(t, peer, 0, why);
        pend = 1;
    } else if (c->state == CONN_LOST && !c->reported) {
        pend = 1;
    }
    if (pend) {
        if (c->next_fd >= 0)
            close(c->next_fd); /* an older replacement is superseded */
        c->next_fd = fd;
        snprintf(c->next_addr, sizeof c->next_addr, "%s", addr);
        c->next_io = *io;
        c->next_sess = *s;
        dp_shm_close(c->next_shm);
        c->next_shm = shm;
        if (s->keyed)
            (void)dp_fmac_init(&c->next_tx, s->suite, s->key_tx, 0);
        c->next_tx_seq = s->shm ? DP_SHM_SETUP_FRAMES : 0;
        c->next_last_tx_us = now_us();
    } else if (!dup) {
        conn_setup(c, fd, addr, io, s, shm);
    }
    if (!dup)
        c->redial = 0;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->send_mu);
    if (dup) {
        refused(t, addr, "already connected (same incarnation)");
        close(fd);
        dp_shm_close(shm);
        return;
    }
    wake_waiters(t);
    if (shm)
        dp_info("connected to %s (%s) through shared memory (%zu KiB rings)%s", pname(t, peer),
                addr, t->shm_ring >> 10, pend ? ", after its old connection" : "");
    else
        dp_debug("connected to %s (%s)%s", pname(t, peer), addr,
                 pend ? ", after its old connection" : "");
}

/* Receiving thread, once the loss of peer's connection has been reported:
 * installs the replacement that waited for it, if any. */
static void promote(tcp *t, int peer)
{
    conn *c = &t->conns[peer];
    int done = 0;
    pthread_mutex_lock(&c->send_mu);
    pthread_mutex_lock(&c->mu);
    if (c->next_fd >= 0 && c->state == CONN_LOST && c->reported) {
        conn_setup(c, c->next_fd, c->next_addr, &c->next_io, &c->next_sess, c->next_shm);
        c->next_shm = NULL;
        /* The heartbeats it got while waiting took sequence numbers (send_mu
         * is held: no sender sees the tx state in between). */
        dp_fmac_move(&c->cd.tx, &c->next_tx);
        c->cd.tx_seq = c->next_tx_seq;
        atomic_store(&c->st.last_tx_us, c->next_last_tx_us);
        c->next_fd = -1;
        sodium_memzero(&c->next_sess, sizeof c->next_sess);
        done = 1;
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->send_mu);
    if (done) {
        wake_waiters(t);
        dp_info("%s reconnected (%s)", pname(t, peer), c->addr);
    }
}

/* Called by the receiving thread when it has reported a loss: the receive
 * state of the old connection is forgotten. */
static void reset_rx(conn *c) { dp_codec_reset_rx(&c->cd); }

static int silent_for(tcp *t, conn *c, double *secs)
{
    *secs = (double)(now_us() - atomic_load(&c->st.last_rx_us)) * 1e-6;
    return *secs > t->hb_timeout;
}

/* The socket stream's liveness question (stream.h). */
static int sock_silent(void *ctx, double *secs)
{
    conn *c = ctx;
    return silent_for(c->owner, c, secs);
}

/* ---- accept thread ---- */

/* Refuses a second connection from the same process (same incarnation)
 * while its first is UP; a new incarnation replaces it (install). */
static int admit(void *ctx, int peer, uint64_t incarnation, char *why, size_t cap)
{
    tcp *t = ctx;
    conn *c = &t->conns[peer];
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_UP && atomic_load(&c->incarnation) == incarnation) {
        snprintf(why, cap, "rank %d is already connected from %s", peer, c->addr);
        rc = -1;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A handshake or redial thread ends: one fewer running (close waits for 0).
 * Such a thread is detached: the state OpenSSL keeps for it (its error
 * queue, made when it set up a connection's AEAD contexts) is freed here,
 * before close can return, not by a destructor after the thread function
 * returned, which a process exiting right after close may never see run
 * (LeakSanitizer reported it now and then under load). */
static void thread_done(tcp *t, int *active)
{
    OPENSSL_thread_stop();
    pthread_mutex_lock(&t->mu);
    (*active)--;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->mu);
}

/* The shared-memory setup that follows a handshake which negotiated it
 * (shm.h), before the connection is installed.  Returns 0 with *shm the link
 * or NULL (TCP, with the reason logged), or -1 when the connection failed. */
static int shm_setup(tcp *t, int fd, int dialer, int peer, const dp_auth_session *s,
                     dp_auth_io *io, double deadline, dp_shm **shm, dp_err *err)
{
    char why[200];
    *shm = NULL;
    if (!s->shm)
        return 0;
    int rc = dialer ? dp_shm_dial(fd, t->base.rank, peer, t->shm_ring, s, deadline, shm, why,
                                  sizeof why, io, err)
                    : dp_shm_accept(fd, t->base.rank, peer, t->shm, s, deadline, shm, why,
                                    sizeof why, io, err);
    if (rc == 0 && !*shm) {
        if (strstr(why, "another host"))
            dp_debug("%s: TCP, not shared memory: %s", pname(t, peer), why);
        else
            dp_info("%s: TCP, not shared memory: %s", pname(t, peer), why);
    }
    return rc;
}

typedef struct handshake {
    tcp *t;
    int fd, slot;
    char addr[64];
} handshake;

/* One incoming connection: tune, authenticate, install (or refuse). */
static void *handshake_main(void *arg)
{
    handshake *h = arg;
    tcp *t = h->t;
    dp_err err;
    dp_auth_io io = {0};
    dp_auth_session sess;
    dp_shm *shm = NULL;
    int peer = -1;
    dp_auth_params ap = {t->base.rank,  t->base.n_ranks, t->secret, t->secret_len,
                         dp_now() + t->hs_timeout, admit, t, t->incarnation, t->encrypt};
    memset(&sess, 0, sizeof sess);
    int rc = dp_sock_tune(h->fd, t->sock_buf, h->addr, &err);
    if (rc == 0)
        rc = dp_auth_accept_shm(h->fd, &ap, t->shm, &peer, &io, &sess, &err);
    if (rc == 0)
        rc = shm_setup(t, h->fd, 0, peer, &sess, &io, ap.deadline, &shm, &err);
    if (rc == 0)
        rc = make_blocking(t, h->fd, &err);
    pthread_mutex_lock(&t->mu);
    t->hs_fd[h->slot] = -1;
    int stopping = atomic_load(&t->stopping);
    pthread_mutex_unlock(&t->mu);
    if (rc != 0 || stopping) {
        if (rc != 0 && !stopping)
            refused(t, h->addr, err.msg);
        close(h->fd);
        dp_shm_close(shm);
    } else {
        install(t, peer, h->fd, h->addr, &io, &sess, shm);
    }
    sodium_memzero(&sess, sizeof sess);
    thread_done(t, &t->hs_active);
    free(h);
    return NULL;
}

/* Starts a handshake thread for fd; refuses it when too many are running. */
static void start_handshake(tcp *t, int fd)
{
    handshake *h = calloc(1, sizeof *h);
    char addr[64];
    dp_sock_peer_str(fd, addr, sizeof addr);
    int slot = -1;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; h && i < MAX_HANDSHAKES && slot < 0; i++)
        if (t->hs_fd[i] < 0)
            slot = i;
    if (slot >= 0) {
        t->hs_fd[slot] = fd;
        t->hs_active++;
    }
    pthread_mutex_unlock(&t->mu);
    if (slot < 0) {
        refused(t, addr, h ? "too many handshakes in progress" : "out of memory");
        close(fd);
        free(h);
        return;
    }
    h->t = t;
    h->fd = fd;
    h->slot = slot;
    snprintf(h->addr, sizeof h->addr, "%s", addr);
    pthread_t thr;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&thr, &attr, handshake_main, h);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        char why[128];
        snprintf(why, sizeof why, "cannot start its handshake: %s", strerror(e));
        refused(t, addr, why);
        pthread_mutex_lock(&t->mu);
        t->hs_fd[slot] = -1;
        t->hs_active--;
        pthread_mutex_unlock(&t->mu);
        close(fd);
        free(h);
    }
}

static void *accept_main(void *arg)
{
    tcp *t = arg;
    while (!atomic_load(&t->stopping)) {
        struct pollfd p[2] = {{t->listen_fd, POLLIN, 0}, {t->wake[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno != EINTR)
                dp_warn("accept thread: poll: %s", strerror(errno));
            continue;
        }
        if (p[1].revents || atomic_load(&t->stopping))
            break;
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != ECONNABORTED) {
                dp_warn("accept on port %d: %s", t->port, strerror(errno));
                usleep(100 * 1000); /* EMFILE and friends: do not spin */
            }
            continue;
        }
        start_handshake(t, fd);
    }
    return NULL;
}

/* ---- heartbeat thread ---- */

static void send_heartbeat(tcp *t, int peer, conn *c)
{
    if (pthread_mutex_trylock(&c->send_mu) != 0)
        return; /* a frame is being sent: the connection is not idle */
    pthread_mutex_lock(&c->mu);
    int fd = c->state == CONN_UP ? c->fd : -1;
    pthread_mutex_unlock(&c->mu);
    /* A tagged heartbeat takes a sequence number, which must then go out:
     * only send one when the socket has room. */
    struct pollfd wp = {fd, POLLOUT, 0};
    if (fd >= 0 && t->keyed && (poll(&wp, 1, 0) != 1 || !(wp.revents & POLLOUT)))
        fd = -1;
    if (fd >= 0) {
        uint8_t h[HDR_MAC];
        size_t hl = ctl_frame(t, DP_FRAME_HEARTBEAT, &c->cd.tx, &c->cd.tx_seq, h);
        ssize_t n;
        do
            n = send(fd, h, hl, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        int ok = n == (ssize_t)hl;
        if (t->keyed && n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            n = 0; /* its sequence number is spent: send it whole */
        if (n >= 0 && !ok) { /* partial: finish it, or the stream is torn */
            dp_err err;
            ok = dp_sock_write_full(fd, h + n, hl - (size_t)n, dp_now() + t->hb_timeout,
                                    &err) == 0;
            if (!ok)
                conn_fail(t, peer, LOST_ABRUPT, "sending a heartbeat: %s", err.msg);
        } else if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            /* The peer has closed: what it sent before closing is still to
             * be read, and the reader's account of it (a frame cut short,
             * a clean EOF) is the reason worth reporting.  Leave it to the
             * reader; the silence check still covers a reader that never comes. */
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            conn_fail(t, peer, LOST_ABRUPT, "sending a heartbeat: %s", strerror(errno));
        }
        /* n < 0 with EAGAIN: the send buffer is full, data is in flight. */
        if (ok) {
            atomic_fetch_add_explicit(&c->st.hb_sent, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->st.frames_sent, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->st.bytes_sent, hl, memory_order_relaxed);
            atomic_store(&c->st.last_tx_us, now_us());
        }
    }
    pthread_mutex_unlock(&c->send_mu);
}

/* Has the peer closed its end (FIN or reset)?  poll does not consume a
 * pending error, so the reader still gets its own account of the end. */
static int hung_up(int fd)
{
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* A heartbeat on a replacement that waits for its predecessor's loss to be
 * reported (c->next_fd), so the peer hears from us meanwhile.  One that
 * cannot be sent whole, or whose peer has hung up with nothing unread, is
 * dropped (and redialed when this side dials).  send_mu and mu held. */
static void pending_tick(tcp *t, int peer, conn *c)
{
    int unread = 0;
    if (ioctl(c->next_fd, FIONREAD, &unread) == 0 && unread == 0 && hung_up(c->next_fd)) {
        dp_info("%s's new connection (%s) closed before it was installed", pname(t, peer),
                c->next_addr);
    } else if ((double)(now_us() - c->next_last_tx_us) * 1e-6 < t->hb_interval) {
        return;
    } else {
        uint8_t h[HDR_MAC];
        struct pollfd wp = {c->next_fd, POLLOUT, 0};
        if (poll(&wp, 1, 0) != 1 || !(wp.revents & POLLOUT))
            return; /* full: the peer is reading slowly, data is in flight */
        size_t hl = ctl_frame(t, DP_FRAME_HEARTBEAT, &c->next_tx, &c->next_tx_seq, h);
        if (send(c->next_fd, h, hl, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)hl) {
            atomic_fetch_add_explicit(&c->st.hb_sent, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->st.frames_sent, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->st.bytes_sent, hl, memory_order_relaxed);
            c->next_last_tx_us = now_us();
            return;
        }
        dp_info("%s's new connection (%s) failed before it was installed: %s", pname(t, peer),
                c->next_addr, strerror(errno));
    }
    close(c->next_fd);
    c->next_fd = -1;
    dp_shm_close(c->next_shm);
    c->next_shm = NULL;
    dp_fmac_wipe(&c->next_tx);
    sodium_memzero(&c->next_sess, sizeof c->next_sess);
    if (c->state == CONN_LOST && !c->orderly)
        want_redial(t, peer, 0);
}

static void start_redial(tcp *t, int peer);

static void *heartbeat_main(void *arg)
{
    tcp *t = arg;
    double tick = t->hb_interval / 2 < t->hb_timeout / 4 ? t->hb_interval / 2 : t->hb_timeout / 4;
    if (tick < 0.005)
        tick = 0.005;
    double wait = tick;
    while (!atomic_load(&t->stopping)) {
        struct pollfd p = {t->wake[0], POLLIN, 0};
        if (poll(&p, 1, (int)(wait * 1000)) > 0)
            break;
        refusals_flush(t, 0);
        double now = dp_now();
        wait = tick;
        for (int i = 0; i < t->base.n_ranks; i++) {
            conn *c = &t->conns[i];
            int unread = 0, up, redial = 0;
            pthread_mutex_lock(&c->mu);
            up = c->state == CONN_UP;
            if (up && ioctl(c->fd, FIONREAD, &unread) == 0) {
                if (c->shm) { /* frames waiting in the ring: the peer is alive too */
                    uint64_t r = dp_shm_rx_ready(c->shm);
                    unread += r > INT_MAX / 2 ? INT_MAX / 2 : (int)r;
                }
                if (unread > c->hb_unread)
                    atomic_store(&c->st.last_rx_us, now_us());
                c->hb_unread = unread;
            }
            /* A peer we dial that hung up with nothing unread has exited or
             * restarted: dial it now rather than after the heartbeat timeout
             * (a new incarnation replaces the old connection; a BYE still in
             * the read-ahead buffer stops the redial once it is read). */
            if (up && unread == 0 && i > t->base.rank && !c->redial && hung_up(c->fd)) {
                want_redial(t, i, 0);
                c->redial_due = now;
            }
            if (c->redial && !c->dialing && c->next_fd < 0) {
                if (now >= c->redial_due) {
                    c->dialing = redial = 1;
                } else if (c->redial_due - now < wait) {
                    wait = c->redial_due - now;
                }
            }
            pthread_mutex_unlock(&c->mu);
            if (redial)
                start_redial(t, i);
            if (!pthread_mutex_trylock(&c->send_mu)) { /* busy: that connection is not idle */
                pthread_mutex_lock(&c->mu);
                if (c->next_fd >= 0)
                    pending_tick(t, i, c);
                pthread_mutex_unlock(&c->mu);
                pthread_mutex_unlock(&c->send_mu);
            }
            if (!up)
                continue;
            double silent;
            if (unread == 0 && silent_for(t, c, &silent)) {
                conn_fail(t, i, LOST_ABRUPT, "no frame or heartbeat for %.1f s (heartbeat timeout %.1f s)",
                          silent, t->hb_timeout);
                continue;
            }
            double idle = (double)(now_us() - atomic_load(&c->st.last_tx_us)) * 1e-6;
            if (idle >= t->hb_interval)
                send_heartbeat(t, i, c);
        }
        if (wait < 0.005)
            wait = 0.005;
    }
    return NULL;
}

/* ---- connect ---- */

static int is_retryable(int e)
{
    return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
           e == ECONNRESET || e == EAGAIN || e == EINTR || e == ECONNABORTED || e == EADDRNOTAVAIL;
}

/* One attempt to dial peer and authenticate, by deadline.  Returns 0 (the
 * connection is installed), -1 with *eno set when it is worth retrying, or
 * -2 when it is not (rejected, wrong secret, wrong rank at that address).
 * bg: a redial thread, whose socket tcp_close may cut short. */
static int dial_once(tcp *t, int peer, double deadline, int bg, int *eno, dp_err *last)
{
    const char *addr = t->addrs[peer];
    dp_sockaddr sa;
    int fd = -1;
    *eno = 0;
    if (dp_sock_resolve(addr, 0, &sa, last)) /* names may appear late too */
        return -1;
    double left = deadline - dp_now();
    if (dp_sock_dial(&sa, t->sock_buf, left < 2 ? left : 2, &fd, eno, last))
        return is_retryable(*eno) ? -1 : -2;
    if (bg) {
        pthread_mutex_lock(&t->mu);
        int stop = atomic_load(&t->stopping);
        if (!stop)
            t->conns[peer].dial_fd = fd;
        pthread_mutex_unlock(&t->mu);
        if (stop) {
            close(fd);
            dp_errf(last, "transport closing");
            return -2;
        }
    }
    dp_auth_io io = {0};
    dp_auth_session sess;
    dp_shm *shm = NULL;
    double hs = dp_now() + t->hs_timeout;
    dp_auth_params ap = {t->base.rank, t->base.n_ranks, t->secret,     t->secret_len,
                         hs < deadline ? hs : deadline,  NULL, NULL, t->incarnation,
                         t->encrypt};
    int rc = dp_auth_dial_shm(fd, &ap, t->shm, peer, &io, &sess, last);
    if (rc == 0 && shm_setup(t, fd, 1, peer, &sess, &io, ap.deadline, &shm, last))
        rc = -1;
    if (rc == 0 && make_blocking(t, fd, last))
        rc = -2;
    if (bg) {
        pthread_mutex_lock(&t->mu);
        t->conns[peer].dial_fd = -1;
        if (atomic_load(&t->stopping) && rc == 0) {
            dp_errf(last, "transport closing");
            rc = -2;
        }
        pthread_mutex_unlock(&t->mu);
    }
    if (rc == 0) {
        install(t, peer, fd, addr, &io, &sess, shm);
    } else {
        close(fd);
        dp_shm_close(shm);
    }
    sodium_memzero(&sess, sizeof sess);
    if (rc == -1)
        dp_err_prefix(last, "handshake");
    return rc;
}

static int dial(tcp *t, int peer, double deadline, dp_err *err)
{
    const char *addr = t->addrs[peer];
    double backoff = 0.01, start = dp_now(), next_log = start + t->base.late_log;
    dp_err last;
    snprintf(last.msg, sizeof last.msg, "no attempt made");
    for (;;) {
        double now = dp_now();
        if (now >= deadline) /* the limit, not the time it took a loaded machine to see it */
            return dp_errf(err, "cannot connect to %s at %s within %.1f s: %s", pname(t, peer),
                           addr, deadline - start, last.msg);
        if (now >= next_log) {
            dp_info("waiting for %s at %s (connect) for %.0f s: %s", pname(t, peer), addr,
                    now - start, last.msg);
            next_log = now + t->base.late_log;
        }
        int eno;
        int rc = dial_once(t, peer, deadline, 0, &eno, &last);
        if (rc == 0)
            return 0;
        if (rc == -2 && eno) /* a socket error no retry cures */
            return dp_errf(err, "%s", last.msg);
        if (rc == -2) {
            dp_warn("handshake with %s at %s failed: %s", pname(t, peer), addr, last.msg);
            return dp_errf(err, "handshake with %s at %s: %s", pname(t, peer), addr, last.msg);
        }
        double left = deadline - dp_now();
        double nap = backoff < left ? backoff : left;
        if (nap > 0)
            nanosleep(&(struct timespec){(time_t)nap, (long)((nap - (time_t)nap) * 1e9)}, NULL);
        backoff = backoff * 2 < 0.5 ? backoff * 2 : 0.5;
    }
}

/* ---- redial ---- */

typedef struct redial_job {
    tcp *t;
    int peer;
} redial_job;

/* One background attempt to reach a lost peer this side dials; on failure
 * the next is scheduled with a doubled backoff (REDIAL_FIRST..REDIAL_MAX).
 * Every failure is retried, a refusal too: the peer may not yet have noticed
 * that our old connection is gone ("already connected"). */
static void *redial_main(void *arg)
{
    redial_job *j = arg;
    tcp *t = j->t;
    int peer = j->peer, eno;
    conn *c = &t->conns[peer];
    dp_err last;
    snprintf(last.msg, sizeof last.msg, "no attempt made");
    int rc = dial_once(t, peer, dp_now() + t->hs_timeout, 1, &eno, &last);
    if (rc == 0)
        dp_info("redialed %s at %s", pname(t, peer), t->addrs[peer]);
    pthread_mutex_lock(&c->mu);
    c->dialing = 0;
    if (rc != 0) {
        if (rc == -2 && strncmp(c->redial_err, last.msg, 190) != 0)
            dp_warn("redialing %s at %s: %s", pname(t, peer), t->addrs[peer], last.msg);
        else
            dp_debug("redialing %s at %s: %s", pname(t, peer), t->addrs[peer], last.msg);
        snprintf(c->redial_err, sizeof c->redial_err, "%.190s", last.msg);
        c->redial_due = dp_now() + c->redial_backoff;
        c->redial_backoff = c->redial_backoff * 2 < REDIAL_MAX ? c->redial_backoff * 2 : REDIAL_MAX;
    }
    pthread_mutex_unlock(&c->mu);
    thread_done(t, &t->rd_active);
    free(j);
    return NULL;
}

/* Heartbeat thread: starts redial_main for peer (c->dialing already set). */
static void start_redial(tcp *t, int peer)
{
    conn *c = &t->conns[peer];
    redial_job *j = malloc(sizeof *j);
    int e = ENOMEM;
    pthread_mutex_lock(&t->mu);
    int stop = atomic_load(&t->stopping);
    if (!stop && j)
        t->rd_active++;
    pthread_mutex_unlock(&t->mu);
    if (!stop && j) {
        j->t = t;
        j->peer = peer;
        pthread_t thr;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        e = pthread_create(&thr, &attr, redial_main, j);
        pthread_attr_destroy(&attr);
        if (e == 0)
            return;
        pthread_mutex_lock(&t->mu);
        t->rd_active--;
        pthread_cond_broadcast(&t->cond);
        pthread_mutex_unlock(&t->mu);
    }
    free(j);
    pthread_mutex_lock(&c->mu);
    c->dialing = 0;
    c->redial_due = dp_now() + REDIAL_MAX;
    if (!stop)
        snprintf(c->redial_err, sizeof c->redial_err, "cannot start a redial thread: %s",
                 strerror(e));
    pthread_mutex_unlock(&c->mu);
}

static int tcp_connect(dp_transport *bt, int peer, double deadline, dp_err *err)
{
    tcp *t = (tcp *)bt;
    conn *c = &t->conns[peer];
    pthread_mutex_lock(&c->mu);
    int state = c->state;
    if (state == CONN_LOST && !c->reported) { /* the caller reconnects: the loss is known */
        c->reported = 1;
        reset_rx(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (state == CONN_LOST) {
        promote(t, peer); /* the peer may have dialed again already */
        state = atomic_load(&c->state);
    }
    if (state == CONN_UP)
        return 0;
    pthread_mutex_lock(&c->mu);
    int redial = c->redial; /* a second dialer would be refused as a duplicate */
    pthread_mutex_unlock(&c->mu);
    if (t->base.rank < peer && !redial)
        return dial(t, peer, deadline, err);
    /* The peer dials us: wait for the accept thread to install it. */
    double start = dp_now(), next_log = start + t->base.late_log;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        state = c->state;
        pthread_mutex_unlock(&c->mu);
        if (state == CONN_UP)
            break;
        double now = dp_now();
        if (now >= deadline) {
            pthread_mutex_unlock(&t->mu);
            if (redial) {
                pthread_mutex_lock(&c->mu);
                dp_errf(err, "cannot reconnect to %s at %s within %.1f s: %s", pname(t, peer),
                        t->addrs[peer], deadline - start,
                        c->redial_err[0] ? c->redial_err : "no attempt finished");
                pthread_mutex_unlock(&c->mu);
                return -1;
            }
            return dp_errf(err, "%s did not connect to this task (rank %d, port %d) within %.1f s",
                           pname(t, peer), t->base.rank, t->port, deadline - start);
        }
        if (now >= next_log) {
            dp_info("waiting for %s (connect) for %.0f s", pname(t, peer), now - start);
            next_log = now + t->base.late_log;
        }
        double until = deadline < next_log ? deadline : next_log;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double wait = until - now;
        ts.tv_sec += (time_t)wait;
        ts.tv_nsec += (long)((wait - (time_t)wait) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&t->cond, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

/* ---- send ---- */

/* ---- shared memory ---- */

#define SHM_NAP 0.05 /* s a sender waits for room before it checks on the peer */

typedef struct shm_ctx {
    tcp *t;
    int peer, fd, counted;
} shm_ctx;

/* Before this task waits (for room, a payload, a frame): a ring holds
 * less than TCP's socket buffers, which take a peer's bytes whatever the
 * task is doing, so every link whose peer sleeps waiting for room is drained
 * into its overflow (dp_shm_drain).  Otherwise tasks that send each other
 * more than a ring before reading, in a pair or around a cycle (a ps
 * forwarding to its backup while that one answers a worker that pushes to
 * the first), wait on each other for ever.  Links being replaced are
 * skipped (trylock: c->mu guards c->shm). */
static void shm_relieve(tcp *t)
{
    for (int i = 0; i < t->base.n_ranks; i++) {
        conn *c = &t->conns[i];
        if (pthread_mutex_trylock(&c->mu) != 0)
            continue;
        if (c->shm && c->state == CONN_UP && dp_shm_peer_waits(c->shm))
            dp_shm_drain(c->shm);
        pthread_mutex_unlock(&c->mu);
    }
}

/* dp_shm_waiter.wait: one nap on the ring, then the liveness checks a
 * socket read or write would make. */
static int shm_wait(void *ctx, int sending, dp_err *err)
{
    shm_ctx *w = ctx;
    tcp *t = w->t;
    conn *c = &t->conns[w->peer];
    double silent;
    shm_relieve(t);
    if (atomic_load(&c->state) != CONN_UP) {
        pthread_mutex_lock(&c->mu);
        dp_errf(err, "%s", c->reason);
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    if (sending) {
        dp_shm_tx_wait(c->shm, SHM_NAP);
        if (hung_up(w->fd))
            return dp_errf(err, "the peer closed the connection");
        if (silent_for(t, c, &silent))
            return dp_errf(err, "peer stopped reading and has been silent for %.1f s", silent);
        return 0;
    }
    int hup = dp_shm_rx_wait(c->shm, w->fd, t->slice);
    if (dp_shm_rx_ready(c->shm)) {
        atomic_store(&c->st.last_rx_us, now_us());
        return 0;
    }
    if (hup) /* what it wrote before closing is in the ring already */
        return dp_errf(err, "connection closed mid-frame: %" PRIu64 " of %" PRIu64
                            " payload bytes missing",
                       dp_shm_pending(c->shm), c->cd.pay_h.length);
    if (silent_for(t, c, &silent))
        return dp_errf(err, "silent for %.1f s in the middle of %s frame (%" PRIu64
                            " bytes missing)",
                       silent, dp_frame_type_name(c->cd.pay_h.type), dp_shm_pending(c->shm));
    return 0;
}

static void shm_progress(void *ctx, uint64_t done, uint64_t len)
{
    shm_ctx *w = ctx;
    dp_pause_hook_progress(&w->t->pause, pname(w->t, w->peer), done, len, &w->counted);
}

/* A frame through the shared-memory ring, with c->send_mu held: header and
 * payload, no CRCs or tags (docs/transport.md, "Shared memory").  Counted as
 * the bytes it would take on the socket, so the counters do not depend on
 * where the tasks run. */
static int send_shm(tcp *t, int peer, conn *c, int fd, dp_frame_header *h,
                    const struct iovec *src, int ns, uint64_t len, dp_err *err)
{
    uint8_t hb[DP_FRAME_HEADER_SIZE];
    h->payload_crc = 0;
    dp_frame_encode(hb, h);
    shm_ctx w = {t, peer, fd, 0};
    dp_shm_waiter wt = {shm_wait, t->pause.bytes ? shm_progress : NULL, &w};
    dp_err werr;
    if (dp_shm_send(c->shm, hb, src, ns, len, &wt, &werr) == 0) {
        atomic_fetch_add_explicit(&c->st.frames_sent, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->st.bytes_sent,
                                  t->keyed ? dp_frame_wire_size_mac(len) : dp_frame_wire_size(len),
                                  memory_order_relaxed);
        atomic_store(&c->st.last_tx_us, now_us());
        return 0;
    }
    conn_fail(t, peer, LOST_ABRUPT, "sending %s frame: %s", dp_frame_type_name(h->type), werr.msg);
    return dp_errf(err, "sending to %s (%s): %s", pname(t, peer), c->addr, werr.msg);
}

/* The link delay (dp_tcp_config.link_delay_ms): the kernel here has no
 * netem, so latency is added where a frame leaves.  The sending thread
 * sleeps before it takes the connection, so frames from different threads
 * overlap their delays while frames one thread sends back to back pay one
 * each.  Heartbeats and the handshake are not delayed. */
static void link_delay(const tcp *t)
{
    if (!t->delay_ns)
        return;
    struct timespec ts = {.tv_sec = t->delay_ns / 1000000000L, .tv_nsec = t->delay_ns % 1000000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int tcp_sendv(dp_transport *bt, int peer, dp_frame_header *h, const struct iovec *iov,
                     int iovcnt, dp_err *err)
{
    tcp *t = (tcp *)bt;
    link_delay(t);
    conn *c = &t->conns[peer];
    struct iovec src[DP_TRANSPORT_MAX_IOV];
    uint64_t len = 0;
    int ns = 0;
    for (int i = 0; i < iovcnt; i++) {
        if (!iov[i].iov_len)
            continue;
        len += iov[i].iov_len;
        src[ns++] = iov[i];
    }
    if (len > t->max_frame)
        return dp_errf(err, "sending %" PRIu64 " bytes to %s: frame larger than the maximum %" PRIu64
                            " bytes",
                       len, pname(t, peer), t->max_frame);
    h->source = (uint32_t)t->base.rank;
    h->length = len;
    if (len > DP_FRAME_CHUNK)
        h->flags |= DP_FRAME_F_CHUNKED;
    /* Keyed, the sequence number and the tags are taken under send_mu. */
    pthread_mutex_lock(&c->send_mu);
    int fd = conn_fd(t, peer, err), rc = -1;
    if (fd >= 0 && c->shm) {
        rc = send_shm(t, peer, c, fd, h, src, ns, len, err);
    } else if (fd >= 0) {
        dp_err werr;
        rc = dp_codec_send(&c->cd, c->io, (uint32_t)t->base.rank, h, src, ns, len, &werr);
        if (rc != 0) {
            conn_fail(t, peer, LOST_ABRUPT, "sending %s frame: %s", dp_frame_type_name(h->type),
                      werr.msg);
            dp_errf(err, "sending to %s (%s): %s", pname(t, peer), c->addr, werr.msg);
        }
    }
    pthread_mutex_unlock(&c->send_mu);
    return rc;
}

/* ---- receive ---- */

enum { RX_NOTHING, RX_FRAME, RX_LOST, RX_MORE /* a header's tag is still on its way */ };

/* The end of a connection read from its socket (BYE, EOF, reset).  On a
 * shared-memory connection it is held (RX_NOTHING) until the ring has
 * handed out every frame sent before it (next_frame_shm); else the
 * connection is lost now. */
static int rx_end(tcp *t, int peer, int orderly, const char *reason)
{
    conn *c = &t->conns[peer];
    if (!c->shm) {
        conn_fail(t, peer, orderly, "%s", reason);
        return RX_LOST;
    }
    if (!c->shm_end) {
        c->shm_end = 1;
        c->shm_end_orderly = orderly;
        snprintf(c->shm_end_reason, sizeof c->shm_end_reason, "%.*s", (int)sizeof c->shm_end_reason - 1, reason);
    }
    return RX_NOTHING;
}

/* Fills ev as the FRAME event of h from peer: its payload is still unread. */
static int frame_event(dp_event *ev, int peer, const dp_frame_header *h)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = DP_EVENT_FRAME;
    ev->peer = peer;
    ev->header = *h;
    return RX_FRAME;
}

/* The next application frame from peer, if one is (or, with wait, becomes)
 * available; heartbeats are consumed on the way.  At most one read waits. */
static int next_frame(tcp *t, int peer, int wait, dp_event *ev)
{
    conn *c = &t->conns[peer];
    for (;;) {
        dp_frame_header h;
        dp_err why;
        switch (dp_codec_next(&c->cd, c->io, wait, &h, &why)) {
        case DP_CODEC_FRAME:
            return frame_event(ev, peer, &h);
        case DP_CODEC_NONE:
            return RX_NOTHING;
        case DP_CODEC_BYE:
            if (rx_end(t, peer, 1, "said goodbye (BYE)") == RX_LOST)
                return RX_LOST;
            wait = 0; /* held for the ring: read on behind it */
            continue;
        case DP_CODEC_END:
            return rx_end(t, peer, 0, why.msg) == RX_LOST ? RX_LOST : RX_NOTHING;
        case DP_CODEC_TAMPERED:
            conn_fail(t, peer, LOST_TAMPERED, "%s", why.msg);
            return RX_LOST;
        default:
            conn_fail(t, peer, LOST_ABRUPT, "%s", why.msg);
            return RX_LOST;
        }
    }
}

/* next_frame on a shared-memory connection, without waiting: frames come
 * from the ring; the socket gives heartbeats and the end, which is reported
 * only once the ring is empty. */
static int next_frame_shm(tcp *t, int peer, dp_event *ev)
{
    conn *c = &t->conns[peer];
    for (int pass = 0;; pass++) {
        dp_frame_header h;
        char why[200];
        int r = dp_shm_next(c->shm, t->max_frame, &h, why, sizeof why);
        if (r < 0) {
            conn_fail(t, peer, LOST_ABRUPT, "%s", why);
            return RX_LOST;
        }
        if (r > 0) {
            if (h.source != (uint32_t)peer || h.type < DP_FRAME_APP_FIRST) {
                if (h.source != (uint32_t)peer)
                    conn_fail(t, peer, LOST_ABRUPT, "frame claims to come from rank %u", h.source);
                else
                    conn_fail(t, peer, LOST_ABRUPT, "unexpected %s frame in shared memory",
                              dp_frame_type_name(h.type));
                return RX_LOST;
            }
            atomic_fetch_add_explicit(&c->st.frames_recv, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->st.bytes_recv,
                                      t->keyed ? dp_frame_wire_size_mac(h.length)
                                               : dp_frame_wire_size(h.length),
                                      memory_order_relaxed);
            atomic_store(&c->st.last_rx_us, now_us());
            c->cd.pay_pending = h.length > 0;
            c->cd.pay_left = h.length;
            c->cd.pay_h = h;
            return frame_event(ev, peer, &h);
        }
        if (c->shm_end) {
            conn_fail(t, peer, c->shm_end_orderly, "%s", c->shm_end_reason);
            return RX_LOST;
        }
        if (pass)
            return RX_NOTHING;
        r = next_frame(t, peer, 0, ev);
        if (r == RX_FRAME) {
            conn_fail(t, peer, LOST_ABRUPT, "%s frame on the socket of a shared-memory connection",
                      dp_frame_type_name(ev->header.type));
            return RX_LOST;
        }
        if (r == RX_LOST)
            return RX_LOST;
    }
}

/* A payload read that lost the connection: the payload is forgotten and
 * err says why the connection went.  Returns -1. */
static int payload_failed(tcp *t, int peer, dp_err *err)
{
    conn *c = &t->conns[peer];
    c->cd.pay_pending = 0;
    pthread_mutex_lock(&c->mu);
    dp_errf(err, "receiving from %s (%s): %s", pname(t, peer), c->addr, c->reason);
    pthread_mutex_unlock(&c->mu);
    return -1;
}

/* Checks a payload read of len bytes from peer and gives the connection's
 * fd; -1 with err when nothing is pending, len is too long, or the
 * connection is gone (the payload is then forgotten). */
static int payload_fd(tcp *t, int peer, size_t len, int *fd, dp_err *err)
{
    conn *c = &t->conns[peer];
    if (!c->cd.pay_pending)
        return dp_errf(err, "no payload pending from %s: poll a frame first", pname(t, peer));
    if (len > c->cd.pay_left)
        return dp_errf(err, "reading %zu payload bytes from %s but only %" PRIu64 " are left",
                       len, pname(t, peer), c->cd.pay_left);
    *fd = conn_fd(t, peer, err);
    if (*fd < 0) {
        c->cd.pay_pending = 0;
        return -1;
    }
    return 0;
}

/* The pending payload from the ring: copied into dst, added to the floats
 * at dst (add), or dropped (dst NULL). */
static int read_payload_shm(tcp *t, int peer, int fd, uint8_t *dst, size_t len, int add,
                            dp_err *err)
{
    conn *c = &t->conns[peer];
    shm_ctx w = {t, peer, fd, 0};
    dp_shm_waiter wt = {shm_wait, NULL, &w};
    dp_err werr;
    if (dp_shm_recv(c->shm, dst, len, add, &wt, &werr)) {
        conn_fail(t, peer, LOST_ABRUPT, "%s", werr.msg);
        return payload_failed(t, peer, err);
    }
    atomic_store(&c->st.last_rx_us, now_us());
    c->cd.pay_left -= len;
    if (c->cd.pay_left == 0)
        c->cd.pay_pending = 0;
    return 0;
}

/* The next len bytes of the pending payload into dst (NULL: discard; add:
 * added to the floats there, shared memory only), on whichever read path
 * the connection takes. */
static int read_pending(tcp *t, int peer, uint8_t *dst, size_t len, int add, dp_err *err)
{
    int fd = -1;
    if (len == 0)
        return 0;
    if (payload_fd(t, peer, len, &fd, err) < 0)
        return -1;
    conn *c = &t->conns[peer];
    if (c->shm)
        return read_payload_shm(t, peer, fd, dst, len, add, err);
    dp_err why;
    int r = dp_codec_read(&c->cd, c->io, dst, len, &why);
    if (r == 0)
        return 0;
    conn_fail(t, peer, r == DP_CODEC_TAMPERED ? LOST_TAMPERED : LOST_ABRUPT, "%s", why.msg);
    if (r == DP_CODEC_BAD) {
        c->cd.pay_pending = 0;
        return dp_errf(err, "receiving from %s: payload CRC mismatch", pname(t, peer));
    }
    if (r == DP_CODEC_TAMPERED) {
        c->cd.pay_pending = 0;
        return dp_errf(err, "receiving from %s: frame %" PRIu64 " failed authentication",
                       pname(t, peer), c->cd.pay_seq);
    }
    return payload_failed(t, peer, err);
}

static int tcp_recv_payload(dp_transport *bt, int peer, void *dst, size_t len, dp_err *err)
{
    tcp *t = (tcp *)bt;
    if (!dst && len)
        return dp_errf(err, "recv_payload: NULL destination");
    return read_pending(t, peer, dst, len, 0, err);
}

/* Shared memory: the floats are added straight from the ring (no copy
 * besides the sender's); else through a buffer on the stack. */
static int tcp_recv_payload_add(dp_transport *bt, int peer, float *dst, size_t count,
                                dp_err *err)
{
    tcp *t = (tcp *)bt;
    if (atomic_load(&t->conns[peer].state) == CONN_UP && t->conns[peer].shm)
        return read_pending(t, peer, (uint8_t *)dst, count * sizeof(float), 1, err);
    return dp_transport_base_recv_add(bt, peer, dst, count, err);
}

static int tcp_skip_payload(dp_transport *bt, int peer, dp_err *err)
{
    tcp *t = (tcp *)bt;
    conn *c = &t->conns[peer];
    while (c->cd.pay_pending) {
        size_t n = c->cd.pay_left < DP_CODEC_RECV_CHUNK ? (size_t)c->cd.pay_left : DP_CODEC_RECV_CHUNK;
        if (read_pending(t, peer, NULL, n, 0, err))
            return -1;
    }
    return 0;
}

/* A loss not yet reported, as an event. */
static int report_lost(tcp *t, int want, dp_event *ev)
{
    for (int i = 0; i < t->base.n_ranks; i++) {
        if (!dp_transport_base_wants(&t->base, want, i))
            continue;
        conn *c = &t->conns[i];
        if (c->cd.pay_pending)
            dp_transport_base_discard(&t->base, i, c->cd.pay_left, c->cd.pay_h.type);
        if (atomic_load(&c->state) != CONN_LOST)
            continue;
        pthread_mutex_lock(&c->mu);
        int lost = c->state == CONN_LOST && !c->reported;
        if (lost) {
            c->reported = 1;
            reset_rx(c);
            dp_transport_base_lost(ev, i, c->orderly, c->reason);
        }
        pthread_mutex_unlock(&c->mu);
        if (lost) {
            promote(t, i); /* a restarted peer's new connection, if it is waiting */
            return 1;
        }
    }
    return 0;
}

static void check_silence(tcp *t, int peer)
{
    double silent;
    if (silent_for(t, &t->conns[peer], &silent))
        conn_fail(t, peer, LOST_ABRUPT, "no frame or heartbeat for %.1f s (heartbeat timeout %.1f s)",
                  silent, t->hb_timeout);
}

#define SHM_SPIN 20e-6 /* s poll looks at the rings before it sleeps (a wake-up costs more) */

/* Before poll() sleeps on the doorbells of pf[0..np) (who < 0): a short
 * spin, then each ring is told that its reader sleeps.  Returns 1 (and
 * sleeps on none) when a ring has something meanwhile. */
static int shm_sleep(tcp *t, int np)
{
    double until = dp_now() + SHM_SPIN;
    do {
        for (int k = 0; k < np; k++)
            if (t->who[k] < 0 && dp_shm_rx_ready(t->conns[-1 - t->who[k]].shm))
                return 1;
    } while (dp_now() < until);
    for (int k = 0; k < np; k++) {
        if (t->who[k] < 0 && dp_shm_rx_sleep(t->conns[-1 - t->who[k]].shm)) {
            for (int j = 0; j < k; j++)
                if (t->who[j] < 0)
                    dp_shm_rx_awake(t->conns[-1 - t->who[j]].shm);
            return 1;
        }
    }
    return 0;
}

static int tcp_poll(dp_transport *bt, int want, double timeout_s, dp_event *ev, dp_err *err)
{
    tcp *t = (tcp *)bt;
    int n = t->base.n_ranks;
    double deadline = dp_now() + timeout_s;
    (void)err;
    for (;;) {
        if (report_lost(t, want, ev))
            return 0;
        /* Collect the live connections; frames already buffered (or in a
         * ring) go first. */
        int np = 0, lost = 0, nshm = 0;
        for (int k = 0; k < n; k++) {
            int i = (t->rr + k) % n;
            if (!dp_transport_base_wants(&t->base, want, i))
                continue;
            conn *c = &t->conns[i];
            int fd = atomic_load(&c->state) == CONN_UP ? c->fd : -1;
            if (fd < 0)
                continue;
            if (c->shm || dp_codec_buffered(&c->cd) >= DP_FRAME_HEADER_SIZE) {
                int r = c->shm ? next_frame_shm(t, i, ev) : next_frame(t, i, 0, ev);
                if (r == RX_FRAME) {
                    t->rr = (i + 1) % n;
                    return 0;
                }
                if (r == RX_LOST) {
                    lost = 1;
                    continue;
                }
            }
            t->pf[np].fd = fd;
            t->pf[np].events = POLLIN;
            t->pf[np].revents = 0;
            t->who[np++] = i;
            if (c->shm) { /* its doorbell; who < 0 marks it */
                t->pf[np].fd = dp_shm_bell_fd(c->shm);
                t->pf[np].events = POLLIN;
                t->pf[np].revents = 0;
                t->who[np++] = -1 - i;
                nshm++;
            }
        }
        if (lost)
            continue;
        shm_relieve(t); /* about to wait */
        double left = deadline - dp_now();
        if (np == 1 && want != DP_PEER_ANY && left >= t->slice) {
            /* One peer and time to spare: a blocking read, one system call
             * per frame as with a plain socket. */
            int r = next_frame(t, want, 1, ev);
            if (r == RX_FRAME)
                return 0;
            if (r == RX_NOTHING)
                check_silence(t, want);
        } else if (nshm && left > 0 && shm_sleep(t, np)) {
            /* a ring has something: no sleep, look again */
        } else {
            double slice = left < t->slice ? left : t->slice;
            int rc = poll(t->pf, (nfds_t)np, slice <= 0 ? 0 : (int)(slice * 1000.0 + 0.999));
            if (rc < 0 && errno != EINTR)
                dp_warn("poll: %s", strerror(errno));
            for (int k = 0; nshm && k < np; k++)
                if (t->who[k] < 0)
                    dp_shm_rx_awake(t->conns[-1 - t->who[k]].shm);
            for (int k = 0; k < np; k++) {
                int i = t->who[k];
                if (i < 0)
                    continue;
                int shm = t->conns[i].shm != NULL;
                if (rc > 0 && (t->pf[k].revents || (shm && t->pf[k + 1].revents))) {
                    int r = shm ? next_frame_shm(t, i, ev) : next_frame(t, i, 0, ev);
                    if (r == RX_FRAME) {
                        t->rr = (i + 1) % n;
                        return 0;
                    }
                } else {
                    check_silence(t, i);
                }
            }
        }
        if (dp_now() >= deadline) {
            if (report_lost(t, want, ev))
                return 0;
            memset(ev, 0, sizeof *ev);
            ev->kind = DP_EVENT_TIMEOUT;
            ev->peer = -1;
            return 0;
        }
    }
}

/* ---- stats, open, close ---- */

static void add_stats(dp_transport_stats *s, conn *c)
{
    s->bytes_sent += atomic_load_explicit(&c->st.bytes_sent, memory_order_relaxed);
    s->bytes_recv += atomic_load_explicit(&c->st.bytes_recv, memory_order_relaxed);
    s->frames_sent += atomic_load_explicit(&c->st.frames_sent, memory_order_relaxed);
    s->frames_recv += atomic_load_explicit(&c->st.frames_recv, memory_order_relaxed);
    s->heartbeats_sent += atomic_load_explicit(&c->st.hb_sent, memory_order_relaxed);
    s->heartbeats_recv += atomic_load_explicit(&c->st.hb_recv, memory_order_relaxed);
}

static void tcp_stats(const dp_transport *bt, int peer, dp_transport_stats *out)
{
    const tcp *t = (const tcp *)bt;
    for (int i = 0; i < t->base.n_ranks; i++)
        if (peer == DP_PEER_ANY || peer == i)
            add_stats(out, &t->conns[i]);
}

static void tcp_close(dp_transport *bt)
{
    tcp *t = (tcp *)bt;
    if (t->threads) {
        atomic_store(&t->stopping, 1);
        ssize_t w;
        do
            w = write(t->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(t->accept_thr, NULL);
        /* Cut strangers' slow handshakes short and wait for every one to end. */
        pthread_mutex_lock(&t->mu);
        for (int i = 0; i < MAX_HANDSHAKES; i++)
            if (t->hs_fd[i] >= 0)
                shutdown(t->hs_fd[i], SHUT_RDWR);
        while (t->hs_active > 0)
            pthread_cond_wait(&t->cond, &t->mu);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->hb_thr, NULL);
        /* No redial starts now; cut the running ones short. */
        pthread_mutex_lock(&t->mu);
        for (int i = 0; i < t->base.n_ranks; i++)
            if (t->conns[i].dial_fd >= 0)
                shutdown(t->conns[i].dial_fd, SHUT_RDWR);
        while (t->rd_active > 0)
            pthread_cond_wait(&t->cond, &t->mu);
        pthread_mutex_unlock(&t->mu);
        refusals_flush(t, 1);
    }
    for (int i = 0; t->conns && i < t->base.n_ranks; i++) {
        conn *c = &t->conns[i];
        if (c->state == CONN_UP) {
            /* BYE (unless this task failed: its peers must take it as
             * lost), then drain what the peer sent so close() sends FIN,
             * not a reset that could destroy data the peer has not read. */
            uint8_t h[HDR_MAC];
            pthread_mutex_lock(&c->send_mu);
            /* a BYE is tagged too: nobody else can say it for us */
            size_t hl = ctl_frame(t, DP_FRAME_BYE, &c->cd.tx, &c->cd.tx_seq, h);
            if (!t->base.failed && dp_sock_write_full(c->fd, h, hl, dp_now() + 1.0, NULL) == 0) {
                atomic_fetch_add(&c->st.frames_sent, 1);
                atomic_fetch_add(&c->st.bytes_sent, hl);
            }
            pthread_mutex_unlock(&c->send_mu);
            shutdown(c->fd, SHUT_WR);
            char sink[4096];
            double until = dp_now() + 0.5;
            while (recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0 && dp_now() < until)
                ;
        }
        if (c->fd >= 0)
            close(c->fd);
        if (c->next_fd >= 0) { /* a waiting replacement is told too, or its peer redials */
            uint8_t h[HDR_MAC];
            size_t hl = ctl_frame(t, DP_FRAME_BYE, &c->next_tx, &c->next_tx_seq, h);
            if (send(c->next_fd, h, hl, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)hl) {
                atomic_fetch_add(&c->st.frames_sent, 1);
                atomic_fetch_add(&c->st.bytes_sent, hl);
            }
            close(c->next_fd);
        }
        dp_shm_close(c->shm);
        dp_shm_close(c->next_shm);
        dp_codec_free(&c->cd);
        dp_fmac_free(&c->next_tx);
        sodium_memzero(&c->next_sess, sizeof c->next_sess);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->send_mu);
    }
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    for (int k = 0; k < 2; k++)
        if (t->wake[k] >= 0)
            close(t->wake[k]);
    if (t->addrs)
        for (int i = 0; i < t->base.n_ranks; i++)
            free(t->addrs[i]);
    free(t->addrs);
    free(t->conns);
    free(t->pf);
    free(t->who);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->rl_mu);
    pthread_cond_destroy(&t->cond);
    dp_transport_base_free(&t->base);
    sodium_memzero(t->secret, sizeof t->secret);
    free(t);
}

void dp_tcp_config_init(dp_tcp_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->listen_fd = -1;
    cfg->heartbeat_interval = 1.0;
    cfg->heartbeat_timeout = 10.0;
    cfg->handshake_timeout = 5.0;
    cfg->late_log = 5.0;
    cfg->max_frame_bytes = DP_FRAME_MAX_DEFAULT;
    cfg->sock_buf_bytes = 4 << 20;
    cfg->shm = 1;
}

int dp_tcp_listen(const char *addr, int sock_buf_bytes, int *fd_out, int *port_out, dp_err *err)
{
    return dp_sock_listen(addr, sock_buf_bytes, fd_out, port_out, err);
}

int dp_tcp_port(const dp_transport *t) { return t->ops == &tcp_ops ? ((const tcp *)t)->port : -1; }

static int tcp_tampered(const dp_transport *bt, int peer)
{
    const tcp *t = (const tcp *)bt;
    return peer != t->base.rank && atomic_load(&((tcp *)t)->conns[peer].tampered);
}

static uint64_t tcp_incarnation(const dp_transport *bt, int peer)
{
    tcp *t = (tcp *)bt;
    return peer == t->base.rank ? t->incarnation : atomic_load(&t->conns[peer].incarnation);
}

int dp_tcp_open(const dp_tcp_config *cfg, dp_transport **out, dp_err *err)
{
    *out = NULL;
    if (cfg->n_ranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->n_ranks)
        return dp_errf(err, "tcp transport: rank %d of %d is out of range", cfg->rank,
                       cfg->n_ranks);
    if (!cfg->addrs)
        return dp_errf(err, "tcp transport: no address list");
    if (cfg->secret_len == 0 && !cfg->insecure)
        return dp_errf(err, "no cluster secret: refusing to accept unauthenticated connections. "
                            "Hint: set DOWNPOUR_SECRET (the launcher does this), or run "
                            "insecure only on a trusted private network");
    if (cfg->secret_len && !cfg->secret)
        return dp_errf(err, "tcp transport: secret_len %zu with a NULL secret", cfg->secret_len);
    if (cfg->encrypt && cfg->secret_len == 0)
        return dp_errf(err, "encryption needs a cluster secret (its keys are derived from it): "
                            "set DOWNPOUR_SECRET, or run without --encrypt");
    if (cfg->secret_len > DP_SECRET_MAX)
        return dp_errf(err, "cluster secret of %zu bytes (at most %d)", cfg->secret_len,
                       DP_SECRET_MAX);
    if (!(cfg->heartbeat_interval > 0) || !(cfg->heartbeat_timeout > cfg->heartbeat_interval))
        return dp_errf(err, "heartbeat interval %g s and timeout %g s: need 0 < interval < "
                            "timeout",
                       cfg->heartbeat_interval, cfg->heartbeat_timeout);
    if (!(cfg->link_delay_ms >= 0 && cfg->link_delay_ms <= DP_TCP_MAX_LINK_DELAY_MS))
        return dp_errf(err, "link delay %g ms: must be in 0..%d ms", cfg->link_delay_ms,
                       DP_TCP_MAX_LINK_DELAY_MS);
    if (cfg->shm_ring_bytes && (cfg->shm_ring_bytes < DP_SHM_RING_MIN ||
                                cfg->shm_ring_bytes > DP_SHM_RING_MAX ||
                                (cfg->shm_ring_bytes & (cfg->shm_ring_bytes - 1))))
        return dp_errf(err, "shared-memory ring of %zu bytes: must be a power of two in %zu..%zu",
                       cfg->shm_ring_bytes, DP_SHM_RING_MIN, DP_SHM_RING_MAX);
    if (sodium_init() < 0)
        return dp_errf(err, "libsodium failed to initialise");
    if (cfg->secret_len == 0)
        dp_warn("tcp transport: no cluster secret, connections are NOT authenticated");

    tcp *t = calloc(1, sizeof *t);
    if (!t)
        return dp_errf(err, "out of memory");
    t->listen_fd = -1;
    for (int i = 0; i < MAX_HANDSHAKES; i++)
        t->hs_fd[i] = -1;
    t->wake[0] = t->wake[1] = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->rl_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (dp_transport_base_init(&t->base, &tcp_ops, cfg->rank, cfg->n_ranks, cfg->names,
                               cfg->late_log, err)) {
        free(t);
        return -1;
    }
    if (cfg->secret_len)
        memcpy(t->secret, cfg->secret, cfg->secret_len);
    t->secret_len = cfg->secret_len;
    t->keyed = cfg->secret_len > 0;
    t->encrypt = cfg->encrypt != 0;
    t->delay_ns = (long)(cfg->link_delay_ms * 1e6);
    const char *env_shm = getenv("DOWNPOUR_SHM");
    t->shm = cfg->shm && !(env_shm && strcmp(env_shm, "0") == 0);
    t->shm_ring = cfg->shm_ring_bytes ? cfg->shm_ring_bytes : DP_SHM_RING_DEFAULT;
    dp_pause_hook_load(&t->pause);
    while (t->incarnation == 0) /* 0 means "unknown" to dp_transport_peer_incarnation */
        randombytes_buf(&t->incarnation, sizeof t->incarnation);
    t->hb_interval = cfg->heartbeat_interval;
    t->hb_timeout = cfg->heartbeat_timeout;
    t->hs_timeout = cfg->handshake_timeout > 0 ? cfg->handshake_timeout : 5.0;
    t->max_frame = cfg->max_frame_bytes ? cfg->max_frame_bytes : DP_FRAME_MAX_DEFAULT;
    t->sock_buf = cfg->sock_buf_bytes;
    t->slice = t->hb_timeout / 4 < 0.5 ? t->hb_timeout / 4 : 0.5;
    t->conns = calloc((size_t)cfg->n_ranks, sizeof *t->conns);
    t->addrs = calloc((size_t)cfg->n_ranks, sizeof *t->addrs);
    t->pf = calloc(2 * (size_t)cfg->n_ranks, sizeof *t->pf);
    t->who = calloc(2 * (size_t)cfg->n_ranks, sizeof *t->who);
    if (!t->conns || !t->addrs || !t->pf || !t->who) {
        free(t->conns);
        t->conns = NULL;
        dp_errf(err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->n_ranks; i++) {
        conn *c = &t->conns[i];
        pthread_mutex_init(&c->mu, NULL);
        pthread_mutex_init(&c->send_mu, NULL);
        c->fd = -1;
        c->next_fd = -1;
        c->dial_fd = -1;
    }
    for (int i = 0; i < cfg->n_ranks; i++) {
        conn *c = &t->conns[i];
        c->owner = t;
        /* Tagged connections hold their codec's buffers and EVP contexts
         * (frame_codec.h), and one for a waiting replacement's heartbeats. */
        int keyed = t->keyed && i != cfg->rank;
        if (dp_codec_init(&c->cd, keyed, t->encrypt, t->max_frame, (uint32_t)i, pname(t, i),
                          &c->st, err) ||
            (keyed && dp_fmac_alloc(&c->next_tx))) {
            dp_errf(err, "out of memory");
            goto fail;
        }
    }
    for (int i = 0; i < cfg->n_ranks; i++) {
        const char *a = cfg->addrs[i];
        if (!a || !(t->addrs[i] = strdup(a))) {
            dp_errf(err, "address of %s: %s", pname(t, i), a ? "out of memory" : "missing");
            goto fail;
        }
    }
    if (cfg->listen_fd >= 0) {
        int acc = 0;
        socklen_t sl = sizeof acc;
        if (getsockopt(cfg->listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) != 0 || !acc) {
            dp_errf(err, "listen_fd %d is not a listening socket (use dp_tcp_listen, or -1)",
                    cfg->listen_fd);
            goto fail;
        }
        t->listen_fd = cfg->listen_fd;
        t->port = dp_sock_local_port(t->listen_fd);
    } else if (dp_sock_listen(t->addrs[cfg->rank], t->sock_buf, &t->listen_fd, &t->port, err)) {
        dp_err_prefix(err, "%s", pname(t, cfg->rank));
        goto fail;
    }
    if (pipe2(t->wake, O_CLOEXEC) != 0) {
        dp_errf(err, "pipe: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&t->accept_thr, NULL, accept_main, t) != 0) {
        dp_errf(err, "cannot start the accept thread");
        goto fail;
    }
    if (pthread_create(&t->hb_thr, NULL, heartbeat_main, t) != 0) {
        atomic_store(&t->stopping, 1);
        ssize_t w = write(t->wake[1], "x", 1);
        (void)w;
        pthread_join(t->accept_thr, NULL);
        dp_errf(err, "cannot start the heartbeat thread");
        goto fail;
    }
    t->threads = 1;
    *out = &t->base;
    return 0;
fail:
    tcp_close(&t->base);
    return -1;
}

static const dp_transport_ops tcp_ops = {
    .name = "tcp",
    .connect = tcp_connect,
    .sendv = tcp_sendv,
    .poll = tcp_poll,
    .recv_payload = tcp_recv_payload,
    .skip_payload = tcp_skip_payload,
    .recv_payload_add = tcp_recv_payload_add,
    .stats = tcp_stats,
    .close = tcp_close,
    .incarnation = tcp_incarnation,
    .tampered = tcp_tampered,
};
