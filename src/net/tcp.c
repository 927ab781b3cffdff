/* The TCP transport's operations (tcp_impl.h has the layers and the
 * threads): send, poll, payload reads, the shared-memory glue, open and
 * close.  Frames go through the codec (frame_codec.h) on each connection's
 * stream. */
#include "tcp_impl.h"

#include "downpour/env.h"

static const dp_transport_ops tcp_ops;

_Static_assert(DP_TRANSPORT_MAX_IOV <= DP_CODEC_MAX_IOV, "the codec takes every piece a send may have");

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
        if (dp_tcp_hung_up(w->fd))
            return dp_errf(err, "the peer closed the connection");
        if (dp_tcp_silent_for(t, c, &silent))
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
    if (dp_tcp_silent_for(t, c, &silent))
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
    dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "sending %s frame: %s", dp_frame_type_name(h->type), werr.msg);
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
    int fd = dp_tcp_conn_fd(t, peer, err), rc = -1;
    if (fd >= 0 && c->shm) {
        rc = send_shm(t, peer, c, fd, h, src, ns, len, err);
    } else if (fd >= 0) {
        dp_err werr;
        rc = dp_codec_send(&c->cd, c->io, (uint32_t)t->base.rank, h, src, ns, len, &werr);
        if (rc != 0) {
            dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "sending %s frame: %s", dp_frame_type_name(h->type),
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
        dp_tcp_conn_fail(t, peer, orderly, "%s", reason);
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
            dp_tcp_conn_fail(t, peer, LOST_TAMPERED, "%s", why.msg);
            return RX_LOST;
        default:
            dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "%s", why.msg);
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
            dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "%s", why);
            return RX_LOST;
        }
        if (r > 0) {
            if (h.source != (uint32_t)peer || h.type < DP_FRAME_APP_FIRST) {
                if (h.source != (uint32_t)peer)
                    dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "frame claims to come from rank %u", h.source);
                else
                    dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "unexpected %s frame in shared memory",
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
            dp_tcp_conn_fail(t, peer, c->shm_end_orderly, "%s", c->shm_end_reason);
            return RX_LOST;
        }
        if (pass)
            return RX_NOTHING;
        r = next_frame(t, peer, 0, ev);
        if (r == RX_FRAME) {
            dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "%s frame on the socket of a shared-memory connection",
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
    *fd = dp_tcp_conn_fd(t, peer, err);
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
        dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "%s", werr.msg);
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
    dp_tcp_conn_fail(t, peer, r == DP_CODEC_TAMPERED ? LOST_TAMPERED : LOST_ABRUPT, "%s", why.msg);
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
            dp_codec_reset_rx(&c->cd);
            dp_transport_base_lost(ev, i, c->orderly, c->reason);
        }
        pthread_mutex_unlock(&c->mu);
        if (lost) {
            dp_tcp_promote(t, i); /* a restarted peer's new connection, if it is waiting */
            return 1;
        }
    }
    return 0;
}

static void check_silence(tcp *t, int peer)
{
    double silent;
    if (dp_tcp_silent_for(t, &t->conns[peer], &silent))
        dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "no frame or heartbeat for %.1f s (heartbeat timeout %.1f s)",
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
        dp_tcp_refusals_flush(t, 1);
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
            size_t hl = dp_tcp_ctl_frame(t, DP_FRAME_BYE, &c->cd.tx, &c->cd.tx_seq, h);
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
            size_t hl = dp_tcp_ctl_frame(t, DP_FRAME_BYE, &c->next_tx, &c->next_tx_seq, h);
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
    free(t->spec);
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
    cfg->shm = dp_env_fallback_on(DP_ENV_SHM); /* DOWNPOUR_SHM=0: off */
}

int dp_tcp_listen(const char *addr, int sock_buf_bytes, int *fd_out, int *port_out, dp_err *err)
{
    return dp_sock_listen(addr, sock_buf_bytes, fd_out, port_out, err);
}

int dp_tcp_port(const dp_transport *t) { return t->ops == &tcp_ops ? ((const tcp *)t)->port : -1; }

void dp_tcp_dial_later(dp_transport *bt, int peer)
{
    if (!bt || bt->ops != &tcp_ops || peer <= bt->rank || peer >= bt->n_ranks)
        return;
    tcp *t = (tcp *)bt;
    conn *c = &t->conns[peer];
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_NONE)
        dp_tcp_want_redial(t, peer, 0);
    pthread_mutex_unlock(&c->mu);
}

void dp_tcp_joined(dp_transport *bt)
{
    if (!bt || bt->ops != &tcp_ops)
        return;
    tcp *t = (tcp *)bt;
    pthread_mutex_lock(&t->mu);
    atomic_store(&t->joining, 0);
    t->secret_refusal[0] = '\0';
    pthread_mutex_unlock(&t->mu);
}

static int tcp_tampered(const dp_transport *bt, int peer)
{
    const tcp *t = (const tcp *)bt;
    return peer != t->base.rank && atomic_load(&((tcp *)t)->conns[peer].tampered);
}

static int tcp_left(const dp_transport *bt, int peer)
{
    tcp *t = (tcp *)bt;
    if (peer == t->base.rank)
        return 0;
    conn *c = &t->conns[peer];
    pthread_mutex_lock(&c->mu);
    int left = c->state == CONN_LOST && c->orderly;
    pthread_mutex_unlock(&c->mu);
    return left;
}

/* A peer on this host is one with a shared-memory link (the handshake
 * compared boot id, network namespace and uid, docs/transport.md). */
static int tcp_same_host(const dp_transport *bt, int peer)
{
    tcp *t = (tcp *)bt;
    if (!t->shm)
        return -1;
    conn *c = &t->conns[peer];
    pthread_mutex_lock(&c->mu);
    int up = c->state == CONN_UP, yes = c->shm != NULL;
    pthread_mutex_unlock(&c->mu);
    return yes ? 1 : up ? 0 : -1;
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
    t->shm = cfg->shm != 0;
    t->shm_ring = cfg->shm_ring_bytes ? cfg->shm_ring_bytes : DP_SHM_RING_DEFAULT;
    atomic_store(&t->joining, cfg->joining != 0);
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
    t->spec_len = cfg->spec_json ? strlen(cfg->spec_json) : 0;
    if (t->spec_len > DP_AUTH_SPEC_MAX) { /* served to nobody: the run goes on */
        dp_warn("tcp transport: the cluster spec is %zu bytes, above the %u a `run --join "
                "HOST:PORT` takes: this task serves it to none", t->spec_len, DP_AUTH_SPEC_MAX);
        t->spec_len = 0;
    }
    t->spec = t->spec_len ? strdup(cfg->spec_json) : NULL;
    if (!t->conns || !t->addrs || !t->pf || !t->who || (t->spec_len && !t->spec)) {
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
    if (pthread_create(&t->accept_thr, NULL, dp_tcp_accept_main, t) != 0) {
        dp_errf(err, "cannot start the accept thread");
        goto fail;
    }
    if (pthread_create(&t->hb_thr, NULL, dp_tcp_heartbeat_main, t) != 0) {
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
    .connect = dp_tcp_connect_peer,
    .sendv = tcp_sendv,
    .poll = tcp_poll,
    .recv_payload = tcp_recv_payload,
    .skip_payload = tcp_skip_payload,
    .recv_payload_add = tcp_recv_payload_add,
    .stats = tcp_stats,
    .close = tcp_close,
    .incarnation = tcp_incarnation,
    .tampered = tcp_tampered,
    .left = tcp_left,
    .same_host = tcp_same_host,
};
