/* The TCP transport's connection-making threads (tcp_impl.h): accept and
 * handshakes, the heartbeat thread, dial and redial. */
#include "tcp_impl.h"

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
    dp_auth_params ap = {t->base.rank,  t->base.n_ranks, t->secret,     t->secret_len,
                         dp_now() + t->hs_timeout, admit, t, t->incarnation, t->encrypt,
                         t->spec, t->spec_len};
    memset(&sess, 0, sizeof sess);
    int rc = dp_sock_tune(h->fd, t->sock_buf, h->addr, &err);
    if (rc == 0)
        rc = dp_auth_accept_shm(h->fd, &ap, t->shm, &peer, &io, &sess, &err);
    if (rc == 0)
        rc = shm_setup(t, h->fd, 0, peer, &sess, &io, ap.deadline, &shm, &err);
    if (rc == 0)
        rc = dp_tcp_make_blocking(t, h->fd, &err);
    pthread_mutex_lock(&t->mu);
    t->hs_fd[h->slot] = -1;
    int stopping = atomic_load(&t->stopping);
    pthread_mutex_unlock(&t->mu);
    if (rc == DP_AUTH_SERVED_SPEC) { /* a joiner had the spec: no peer, no refusal */
        dp_info("sent the cluster spec to %s (a task joining by this address)", h->addr);
        close(h->fd);
    } else if (rc != 0 || stopping) {
        if (rc != 0 && !stopping)
            dp_tcp_refused(t, h->addr, err.msg);
        if (rc != 0 && atomic_load(&t->joining) && strstr(err.msg, "secret")) {
            pthread_mutex_lock(&t->mu);
            snprintf(t->secret_refusal, sizeof t->secret_refusal, "%.199s", err.msg);
            pthread_cond_broadcast(&t->cond);
            pthread_mutex_unlock(&t->mu);
        }
        close(h->fd);
        dp_shm_close(shm);
    } else {
        dp_tcp_install(t, peer, h->fd, h->addr, &io, &sess, shm);
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
        dp_tcp_refused(t, addr, h ? "too many handshakes in progress" : "out of memory");
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
        dp_tcp_refused(t, addr, why);
        pthread_mutex_lock(&t->mu);
        t->hs_fd[slot] = -1;
        t->hs_active--;
        pthread_mutex_unlock(&t->mu);
        close(fd);
        free(h);
    }
}

void *dp_tcp_accept_main(void *arg)
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


static void start_redial(tcp *t, int peer);

void *dp_tcp_heartbeat_main(void *arg)
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
        dp_tcp_refusals_flush(t, 0);
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
            if (up && unread == 0 && i > t->base.rank && !c->redial && dp_tcp_hung_up(c->fd)) {
                dp_tcp_want_redial(t, i, 0);
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
                    dp_tcp_pending_tick(t, i, c);
                pthread_mutex_unlock(&c->mu);
                pthread_mutex_unlock(&c->send_mu);
            }
            if (!up)
                continue;
            double silent;
            if (unread == 0 && dp_tcp_silent_for(t, c, &silent)) {
                dp_tcp_conn_fail(t, i, LOST_ABRUPT, "no frame or heartbeat for %.1f s (heartbeat timeout %.1f s)",
                          silent, t->hb_timeout);
                continue;
            }
            double idle = (double)(now_us() - atomic_load(&c->st.last_tx_us)) * 1e-6;
            if (idle >= t->hb_interval)
                dp_tcp_send_heartbeat(t, i, c);
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
                         t->encrypt,  NULL, 0}; /* a dialer serves no spec */
    int rc = dp_auth_dial_shm(fd, &ap, t->shm, peer, &io, &sess, last);
    if (rc == 0 && shm_setup(t, fd, 1, peer, &sess, &io, ap.deadline, &shm, last))
        rc = -1;
    if (rc == 0 && dp_tcp_make_blocking(t, fd, last))
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
        dp_tcp_install(t, peer, fd, addr, &io, &sess, shm);
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

int dp_tcp_connect_peer(dp_transport *bt, int peer, double deadline, dp_err *err)
{
    tcp *t = (tcp *)bt;
    conn *c = &t->conns[peer];
    pthread_mutex_lock(&c->mu);
    int state = c->state;
    if (state == CONN_LOST && !c->reported) { /* the caller reconnects: the loss is known */
        c->reported = 1;
        dp_codec_reset_rx(&c->cd);
    }
    pthread_mutex_unlock(&c->mu);
    if (state == CONN_LOST) {
        dp_tcp_promote(t, peer); /* the peer may have dialed again already */
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
        if (atomic_load(&t->joining) && t->secret_refusal[0]) {
            /* joining: a member dialed and the secrets differ; waiting
             * longer changes nothing */
            dp_errf(err, "joining the running job: waiting for %s to dial this task, a "
                         "handshake failed (%s): this task's cluster secret is not the job's; "
                         "a task joins only with the job's secret (DOWNPOUR_SECRET, "
                         "--secret-file)",
                    pname(t, peer), t->secret_refusal);
            pthread_mutex_unlock(&t->mu);
            return -1;
        }
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

int dp_tcp_query_spec(const char *addr, const unsigned char *secret, size_t secret_len,
                      double timeout_s, char **json, dp_err *err)
{
    *json = NULL;
    if (sodium_init() < 0)
        return dp_errf(err, "libsodium failed to initialise");
    dp_sockaddr sa;
    int fd = -1, eno = 0;
    if (dp_sock_resolve(addr, 0, &sa, err) < 0)
        return dp_err_prefix(err, "the job's address %s", addr);
    if (dp_sock_dial(&sa, 0, timeout_s, &fd, &eno, err) < 0)
        return dp_err_prefix(err, "cannot reach a task of the job at %s", addr);
    dp_auth_params p;
    memset(&p, 0, sizeof p);
    p.secret = secret;
    p.secret_len = secret_len;
    p.deadline = dp_now() + timeout_s;
    while (p.incarnation == 0)
        randombytes_buf(&p.incarnation, sizeof p.incarnation);
    dp_auth_io io = {0};
    int acceptor = -1;
    int rc = dp_auth_query_spec(fd, &p, json, &acceptor, &io, err);
    close(fd);
    if (rc != 0)
        return dp_err_prefix(err, "asking the task at %s for the cluster spec", addr);
    return 0;
}
