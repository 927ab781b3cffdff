/* The TCP transport's connection state (tcp_impl.h): losses, installing
 * and replacing connections, heartbeats sent, the refusal log. */
#include "tcp_impl.h"

/* With c->mu held: after a loss (orderly: a BYE, which stops it) or a hang-up. */
void dp_tcp_want_redial(tcp *t, int peer, int orderly)
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
        dp_tcp_want_redial(t, peer, orderly);
        if (orderly) /* a normal end of a run: debug, not one line per peer */
            dp_debug("%s (%s) disconnected: %s", pname(t, peer), c->addr, c->reason);
        else
            dp_warn("lost %s (%s): %s", pname(t, peer), c->addr, c->reason);
    }
}

void dp_tcp_conn_fail(tcp *t, int peer, int how, const char *fmt, ...)
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
void dp_tcp_refused(tcp *t, const char *addr, const char *reason)
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
void dp_tcp_refusals_flush(tcp *t, int force)
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
int dp_tcp_conn_fd(tcp *t, int peer, dp_err *err)
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
int dp_tcp_make_blocking(tcp *t, int fd, dp_err *err)
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
size_t dp_tcp_ctl_frame(tcp *t, unsigned type, dp_fmac *m, uint64_t *seq, uint8_t h[HDR_MAC])
{
    return dp_codec_control(t->keyed, (uint32_t)t->base.rank, type, m, seq, h);
}

void dp_tcp_wake_waiters(tcp *t)
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
void dp_tcp_install(tcp *t, int peer, int fd, const char *addr, const dp_auth_io *io,
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
        size_t hl = dp_tcp_ctl_frame(t, DP_FRAME_BYE, &c->cd.tx, &c->cd.tx_seq, h);
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
        dp_tcp_refused(t, addr, "already connected (same incarnation)");
        close(fd);
        dp_shm_close(shm);
        return;
    }
    dp_tcp_wake_waiters(t);
    if (shm)
        /* one line per connection: debug, so a launch prints a summary per task */
        dp_debug("connected to %s (%s) through shared memory (%zu KiB rings)%s", pname(t, peer),
                addr, t->shm_ring >> 10, pend ? ", after its old connection" : "");
    else
        dp_debug("connected to %s (%s)%s", pname(t, peer), addr,
                 pend ? ", after its old connection" : "");
}

/* Receiving thread, once the loss of peer's connection has been reported:
 * installs the replacement that waited for it, if any. */
void dp_tcp_promote(tcp *t, int peer)
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
        dp_tcp_wake_waiters(t);
        dp_info("%s reconnected (%s)", pname(t, peer), c->addr);
    }
}

int dp_tcp_silent_for(tcp *t, conn *c, double *secs)
{
    *secs = (double)(now_us() - atomic_load(&c->st.last_rx_us)) * 1e-6;
    return *secs > t->hb_timeout;
}

/* The socket stream's liveness question (stream.h). */
static int sock_silent(void *ctx, double *secs)
{
    conn *c = ctx;
    return dp_tcp_silent_for(c->owner, c, secs);
}

/* ---- heartbeat thread ---- */

void dp_tcp_send_heartbeat(tcp *t, int peer, conn *c)
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
        size_t hl = dp_tcp_ctl_frame(t, DP_FRAME_HEARTBEAT, &c->cd.tx, &c->cd.tx_seq, h);
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
                dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "sending a heartbeat: %s", err.msg);
        } else if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            /* The peer has closed: what it sent before closing is still to
             * be read, and the reader's account of it (a frame cut short,
             * a clean EOF) is the reason worth reporting.  Leave it to the
             * reader; the silence check still covers a reader that never comes. */
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            dp_tcp_conn_fail(t, peer, LOST_ABRUPT, "sending a heartbeat: %s", strerror(errno));
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
int dp_tcp_hung_up(int fd)
{
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* A heartbeat on a replacement that waits for its predecessor's loss to be
 * reported (c->next_fd), so the peer hears from us meanwhile.  One that
 * cannot be sent whole, or whose peer has hung up with nothing unread, is
 * dropped (and redialed when this side dials).  send_mu and mu held. */
void dp_tcp_pending_tick(tcp *t, int peer, conn *c)
{
    int unread = 0;
    if (ioctl(c->next_fd, FIONREAD, &unread) == 0 && unread == 0 && dp_tcp_hung_up(c->next_fd)) {
        dp_info("%s's new connection (%s) closed before it was installed", pname(t, peer),
                c->next_addr);
    } else if ((double)(now_us() - c->next_last_tx_us) * 1e-6 < t->hb_interval) {
        return;
    } else {
        uint8_t h[HDR_MAC];
        struct pollfd wp = {c->next_fd, POLLOUT, 0};
        if (poll(&wp, 1, 0) != 1 || !(wp.revents & POLLOUT))
            return; /* full: the peer is reading slowly, data is in flight */
        size_t hl = dp_tcp_ctl_frame(t, DP_FRAME_HEARTBEAT, &c->next_tx, &c->next_tx_seq, h);
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
        dp_tcp_want_redial(t, peer, 0);
}
