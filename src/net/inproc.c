/* The in-process transport (include/downpour/inproc.h).
 *
 * A hub holds n endpoints.  Each endpoint keeps, for every peer, a link: the
 * FIFO of frames that peer sent it and not yet polled, and what it knows of
 * the peer's loss.  A send copies the header and the whole payload into one
 * allocation and appends it to the receiver's link of the sender; nothing
 * bounds a queue, so a send never waits for a slow receiver.  Every queued
 * item takes the next number of one hub-wide sequence, and a poll of
 * DP_PEER_ANY takes the lowest-numbered head among the peers it looks at:
 * frames come in the order they were sent, across senders as well.
 *
 * A peer's departure travels in the same FIFO as its frames: closing an
 * endpoint (BYE) or crashing it appends an end item to each peer's link,
 * which the peer's poll turns into PEER_LOST after the frames before it.
 * Cutting the links instead drops what is queued either way and marks the
 * links lost at once; the next poll that looks at them reports it first, as
 * TCP's poll reports a lost connection before reading further.
 *
 * Locking: one hub mutex guards the queues, the sequence, the endpoint table
 * and the links' loss state; each endpoint has a condition variable its
 * receiving thread sleeps on.  Payload copies happen outside the mutex: the
 * sender fills its item before taking the lock, and the frame a receiver has
 * polled (link.cur) belongs to the receiving thread alone. */
#include "downpour/inproc.h"

#include "transport_impl.h"

#include "downpour/crc32c.h"
#include "downpour/log.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_FRAME DP_FRAME_MAX_DEFAULT /* as TCP's default receiver limit */

/* One queued frame, or the end of a peer's stream. */
typedef struct item {
    struct item *next;
    uint64_t seq;
    int end;     /* 1: no frame; the sender is gone (orderly says how) */
    int orderly;
    dp_frame_header h;
    uint8_t data[]; /* h.length payload bytes */
} item;

/* What one endpoint has from, and knows of, one peer. */
typedef struct link {
    item *head, *tail; /* frames from the peer not yet polled (hub.mu) */
    _Atomic int lost;  /* set under hub.mu; read without it by recv_payload */
    int reported;      /* the loss was returned by poll (hub.mu) */
    int orderly;
    char reason[200];
    _Atomic uint64_t bytes_sent, bytes_recv, frames_sent, frames_recv;
    /* Receiving thread only: the frame last polled, its payload partly read. */
    item *cur;
    uint64_t pos;
} link;

typedef struct hub hub;

typedef struct endpoint {
    dp_transport base;
    hub *hub;
    pthread_cond_t cond; /* a frame or a loss arrived for this endpoint */
    int dead;            /* killed (hub.mu) */
    link *links;         /* n_ranks; links[rank] unused */
} endpoint;

struct hub {
    pthread_mutex_t mu;
    int n, open;     /* endpoints, and those not yet closed */
    uint64_t seq;    /* the last item's number */
    endpoint **ep;   /* n; NULL once closed */
    int *host;       /* n host ids (dp_inproc_set_hosts); NULL: all on one */
};

static const dp_transport_ops inproc_ops;

static const char *pname(const endpoint *e, int peer) { return e->base.names[peer]; }

static void free_queue(link *l)
{
    item *it = l->head;
    while (it) {
        item *next = it->next;
        free(it);
        it = next;
    }
    l->head = l->tail = NULL;
}

/* Under hub.mu: appends it to dst's link of src and wakes dst. */
static void enqueue(hub *h, endpoint *dst, int src, item *it)
{
    link *l = &dst->links[src];
    it->next = NULL;
    it->seq = ++h->seq;
    if (l->tail)
        l->tail->next = it;
    else
        l->head = it;
    l->tail = it;
    pthread_cond_signal(&dst->cond);
}

/* Under hub.mu: the link is lost now, reported by the next poll. */
static void mark_lost(endpoint *e, int peer, const char *reason)
{
    link *l = &e->links[peer];
    free_queue(l);
    if (atomic_load(&l->lost))
        return;
    atomic_store(&l->lost, 1);
    l->reported = 0;
    l->orderly = 0;
    snprintf(l->reason, sizeof l->reason, "%s", reason);
    pthread_cond_signal(&e->cond);
}

/* Under hub.mu: endpoint `from` leaves; each live peer gets an end item after
 * what `from` sent it (where that item cannot be allocated, the peer loses
 * the link at once instead, with the same reason). */
static void announce_end(hub *h, int from, int orderly)
{
    for (int p = 0; p < h->n; p++) {
        endpoint *d = h->ep[p];
        if (p == from || !d || d->dead || atomic_load(&d->links[from].lost))
            continue;
        item *it = calloc(1, sizeof *it);
        if (!it) {
            mark_lost(d, from, orderly ? "said goodbye (BYE)" : "connection closed (EOF) without BYE");
            d->links[from].orderly = orderly;
            continue;
        }
        it->end = 1;
        it->orderly = orderly;
        enqueue(h, d, from, it);
    }
}

/* ---- send ---- */

static int inproc_connect(dp_transport *bt, int peer, double deadline, dp_err *err)
{
    endpoint *e = (endpoint *)bt;
    (void)deadline;
    pthread_mutex_lock(&e->hub->mu);
    int rc = 0;
    if (e->dead)
        rc = dp_errf(err, "connecting to %s: this endpoint was killed", pname(e, peer));
    else if (atomic_load(&e->links[peer].lost))
        rc = dp_errf(err, "%s is gone (%s); the in-process transport does not reconnect",
                     pname(e, peer), e->links[peer].reason);
    pthread_mutex_unlock(&e->hub->mu);
    return rc;
}

static int inproc_sendv(dp_transport *bt, int peer, dp_frame_header *h, const struct iovec *iov,
                        int iovcnt, dp_err *err)
{
    endpoint *e = (endpoint *)bt;
    hub *hb = e->hub;
    uint64_t len = 0;
    for (int i = 0; i < iovcnt; i++) {
        len += iov[i].iov_len;
        if (len > MAX_FRAME)
            return dp_errf(err, "sending %" PRIu64 "+ bytes to %s: frame larger than the maximum "
                                "%" PRIu64 " bytes",
                           len, pname(e, peer), (uint64_t)MAX_FRAME);
    }
    item *it = malloc(sizeof *it + (size_t)len);
    if (!it)
        return dp_errf(err, "sending %" PRIu64 " bytes to %s: out of memory for the copy", len,
                       pname(e, peer));
    size_t at = 0;
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len)
            memcpy(it->data + at, iov[i].iov_base, iov[i].iov_len);
        at += iov[i].iov_len;
    }
    it->end = 0;
    it->orderly = 0;
    h->version = DP_FRAME_VERSION;
    h->source = (uint32_t)e->base.rank;
    h->length = len;
    if (len > DP_FRAME_CHUNK)
        h->flags |= DP_FRAME_F_CHUNKED;
    /* The header a TCP receiver would see: the CRC of the first chunk. */
    h->payload_crc = len ? dp_crc32c(0, it->data, len < DP_FRAME_CHUNK ? (size_t)len
                                                                       : (size_t)DP_FRAME_CHUNK)
                         : 0;
    it->h = *h;

    link *l = &e->links[peer];
    pthread_mutex_lock(&hb->mu);
    if (e->dead || atomic_load(&l->lost)) {
        if (e->dead)
            dp_errf(err, "sending %s frame to %s: this endpoint was killed",
                    dp_frame_type_name(h->type), pname(e, peer));
        else
            dp_errf(err, "sending %s frame to %s: the connection is lost: %s",
                    dp_frame_type_name(h->type), pname(e, peer), l->reason);
        pthread_mutex_unlock(&hb->mu);
        free(it);
        return -1;
    }
    endpoint *d = hb->ep[peer];
    if (d && !d->dead)
        enqueue(hb, d, e->base.rank, it);
    else
        free(it); /* gone, and we have not read its goodbye yet: lost on the way */
    pthread_mutex_unlock(&hb->mu);
    atomic_fetch_add_explicit(&l->frames_sent, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->bytes_sent, dp_frame_wire_size(len), memory_order_relaxed);
    return 0;
}

/* ---- receive ---- */

static int inproc_recv_payload(dp_transport *bt, int peer, void *dst, size_t len, dp_err *err)
{
    endpoint *e = (endpoint *)bt;
    link *l = &e->links[peer];
    if (len == 0)
        return 0;
    if (!dst)
        return dp_errf(err, "recv_payload: NULL destination");
    if (!l->cur)
        return dp_errf(err, "no payload pending from %s: poll a frame first", pname(e, peer));
    uint64_t left = l->cur->h.length - l->pos;
    if (len > left)
        return dp_errf(err, "reading %zu payload bytes from %s but only %" PRIu64 " are left",
                       len, pname(e, peer), left);
    if (atomic_load(&l->lost)) { /* cut while the payload was on its way */
        pthread_mutex_lock(&e->hub->mu);
        dp_errf(err, "receiving from %s: %s (%" PRIu64 " of %" PRIu64 " payload bytes missing)",
                pname(e, peer), l->reason, left, l->cur->h.length);
        pthread_mutex_unlock(&e->hub->mu);
        free(l->cur);
        l->cur = NULL;
        return -1;
    }
    memcpy(dst, l->cur->data + l->pos, len);
    l->pos += len;
    if (l->pos == l->cur->h.length) {
        free(l->cur);
        l->cur = NULL;
    }
    return 0;
}

static int inproc_skip_payload(dp_transport *bt, int peer, dp_err *err)
{
    endpoint *e = (endpoint *)bt;
    link *l = &e->links[peer];
    (void)err;
    free(l->cur);
    l->cur = NULL;
    return 0;
}

static void fill_lost(dp_event *ev, int peer, link *l)
{
    l->reported = 1;
    dp_transport_base_lost(ev, peer, l->orderly, l->reason);
}

/* Under hub.mu: the next event for a poll of `want`, if there is one. */
static int take_event(endpoint *e, int want, dp_event *ev)
{
    int n = e->base.n_ranks, best = -1;
    for (int i = 0; i < n; i++) {
        if (!dp_transport_base_wants(&e->base, want, i))
            continue;
        link *l = &e->links[i];
        if (atomic_load(&l->lost)) {
            if (!l->reported) {
                fill_lost(ev, i, l);
                return 1;
            }
            continue;
        }
        if (l->head && (best < 0 || l->head->seq < e->links[best].head->seq))
            best = i;
    }
    if (best < 0)
        return 0;
    link *l = &e->links[best];
    item *it = l->head;
    l->head = it->next;
    if (!l->head)
        l->tail = NULL;
    if (it->end) {
        atomic_store(&l->lost, 1);
        l->orderly = it->orderly;
        snprintf(l->reason, sizeof l->reason, "%s",
                 it->orderly ? "said goodbye (BYE)" : "connection closed (EOF) without BYE");
        free(it);
        if (l->orderly)
            dp_info("%s disconnected: %s", pname(e, best), l->reason);
        else
            dp_warn("lost %s: %s", pname(e, best), l->reason);
        fill_lost(ev, best, l);
        return 1;
    }
    atomic_fetch_add_explicit(&l->frames_recv, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->bytes_recv, dp_frame_wire_size(it->h.length),
                              memory_order_relaxed);
    memset(ev, 0, sizeof *ev);
    ev->kind = DP_EVENT_FRAME;
    ev->peer = best;
    ev->header = it->h;
    if (it->h.length) {
        l->cur = it;
        l->pos = 0;
    } else {
        free(it);
    }
    return 1;
}

static void deadline_after(struct timespec *ts, double secs)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    if (secs > 1e6)
        secs = 1e6; /* "forever" stays representable */
    time_t whole = (time_t)secs;
    long ns = ts->tv_nsec + (long)((secs - (double)whole) * 1e9);
    ts->tv_sec += whole + ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

static int inproc_poll(dp_transport *bt, int want, double timeout_s, dp_event *ev, dp_err *err)
{
    endpoint *e = (endpoint *)bt;
    (void)err;
    /* Payloads the caller left unread go before anything else of their peer. */
    for (int i = 0; i < e->base.n_ranks; i++)
        if (dp_transport_base_wants(&e->base, want, i) && e->links[i].cur)
            dp_transport_base_discard(&e->base, i, e->links[i].cur->h.length - e->links[i].pos,
                                      e->links[i].cur->h.type);
    struct timespec until;
    if (timeout_s > 0)
        deadline_after(&until, timeout_s);
    pthread_mutex_lock(&e->hub->mu);
    int got;
    while (!(got = take_event(e, want, ev)) && timeout_s > 0) {
        int rc = pthread_cond_timedwait(&e->cond, &e->hub->mu, &until);
        if (rc == ETIMEDOUT) {
            got = take_event(e, want, ev);
            break;
        }
    }
    pthread_mutex_unlock(&e->hub->mu);
    if (!got) {
        memset(ev, 0, sizeof *ev);
        ev->kind = DP_EVENT_TIMEOUT;
        ev->peer = -1;
    }
    return 0;
}

/* ---- stats, open, close, faults ---- */

static void inproc_stats(const dp_transport *bt, int peer, dp_transport_stats *out)
{
    const endpoint *e = (const endpoint *)bt;
    for (int i = 0; i < e->base.n_ranks; i++) {
        if (peer != DP_PEER_ANY && peer != i)
            continue;
        const link *l = &e->links[i];
        out->bytes_sent += atomic_load_explicit(&l->bytes_sent, memory_order_relaxed);
        out->bytes_recv += atomic_load_explicit(&l->bytes_recv, memory_order_relaxed);
        out->frames_sent += atomic_load_explicit(&l->frames_sent, memory_order_relaxed);
        out->frames_recv += atomic_load_explicit(&l->frames_recv, memory_order_relaxed);
    }
}

/* Frees what an endpoint owns (its queues are empty or freed by the caller). */
static void endpoint_free(endpoint *e)
{
    for (int i = 0; e->links && i < e->base.n_ranks; i++) {
        free_queue(&e->links[i]);
        free(e->links[i].cur);
    }
    free(e->links);
    pthread_cond_destroy(&e->cond);
    dp_transport_base_free(&e->base);
    free(e);
}

static void inproc_close(dp_transport *bt)
{
    endpoint *e = (endpoint *)bt;
    hub *h = e->hub;
    pthread_mutex_lock(&h->mu);
    if (!e->dead)
        announce_end(h, e->base.rank, 1);
    h->ep[e->base.rank] = NULL;
    int last = --h->open == 0;
    pthread_mutex_unlock(&h->mu);
    endpoint_free(e);
    if (last) {
        pthread_mutex_destroy(&h->mu);
        free(h->host);
        free(h->ep);
        free(h);
    }
}

int dp_inproc_set_hosts(dp_transport *t, const int *host_of_rank, dp_err *err)
{
    if (!t || t->ops != &inproc_ops)
        return dp_errf(err, "dp_inproc_set_hosts: the %s transport is not in-process",
                       t ? t->ops->name : "NULL");
    hub *h = ((endpoint *)t)->hub;
    int *m = malloc((size_t)h->n * sizeof *m);
    if (!m)
        return dp_errf(err, "dp_inproc_set_hosts: out of memory");
    memcpy(m, host_of_rank, (size_t)h->n * sizeof *m);
    pthread_mutex_lock(&h->mu);
    free(h->host);
    h->host = m;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

static int inproc_same_host(const dp_transport *bt, int peer)
{
    hub *h = ((const endpoint *)bt)->hub;
    pthread_mutex_lock(&h->mu);
    int same = !h->host || h->host[peer] == h->host[bt->rank];
    pthread_mutex_unlock(&h->mu);
    return same;
}

static int inproc_left(const dp_transport *bt, int peer)
{
    const endpoint *e = (const endpoint *)bt;
    if (peer == bt->rank)
        return 0;
    pthread_mutex_lock(&e->hub->mu);
    int left = atomic_load(&e->links[peer].lost) && e->links[peer].orderly;
    pthread_mutex_unlock(&e->hub->mu);
    return left;
}

int dp_inproc_kill(dp_transport *t, dp_inproc_fault how, dp_err *err)
{
    if (!t || t->ops != &inproc_ops)
        return dp_errf(err, "dp_inproc_kill: the %s transport is not in-process",
                       t ? t->ops->name : "NULL");
    if ((unsigned)how >= DP_INPROC_FAULT_COUNT)
        return dp_errf(err, "dp_inproc_kill: unknown fault %d", (int)how);
    endpoint *e = (endpoint *)t;
    hub *h = e->hub;
    int me = e->base.rank;
    pthread_mutex_lock(&h->mu);
    if (e->dead) {
        pthread_mutex_unlock(&h->mu);
        return dp_errf(err, "dp_inproc_kill: %s was killed already", pname(e, me));
    }
    if (how == DP_INPROC_CRASH) {
        announce_end(h, me, 0);
    } else {
        for (int p = 0; p < h->n; p++)
            if (p != me && h->ep[p] && !h->ep[p]->dead)
                mark_lost(h->ep[p], me, "link cut (dp_inproc_kill)");
    }
    e->dead = 1;
    for (int p = 0; p < h->n; p++)
        if (p != me)
            mark_lost(e, p, "this endpoint was killed (dp_inproc_kill)");
    pthread_mutex_unlock(&h->mu);
    dp_warn("%s killed (%s)", pname(e, me), how == DP_INPROC_CRASH ? "crash" : "links cut");
    return 0;
}

int dp_inproc_open_named(dp_transport **ts, int n, const char *const *names, dp_err *err)
{
    if (n < 1 || n > 4096)
        return dp_errf(err, "in-process transport: %d ranks (1 to 4096)", n);
    for (int i = 0; i < n; i++)
        ts[i] = NULL;
    hub *h = calloc(1, sizeof *h);
    if (!h || !(h->ep = calloc((size_t)n, sizeof *h->ep))) {
        free(h);
        return dp_errf(err, "in-process transport: out of memory for %d ranks", n);
    }
    pthread_mutex_init(&h->mu, NULL);
    h->n = n;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int made = 0;
    for (; made < n; made++) {
        endpoint *e = calloc(1, sizeof *e);
        if (!e) {
            dp_errf(err, "in-process transport: out of memory");
            goto fail;
        }
        if (dp_transport_base_init(&e->base, &inproc_ops, made, n, names, 5.0, err) < 0) {
            free(e);
            goto fail;
        }
        e->hub = h;
        pthread_cond_init(&e->cond, &ca);
        e->links = calloc((size_t)n, sizeof *e->links);
        if (!e->links) {
            endpoint_free(e);
            dp_errf(err, "in-process transport: out of memory");
            goto fail;
        }
        h->ep[made] = e;
        ts[made] = &e->base;
    }
    pthread_condattr_destroy(&ca);
    h->open = n;
    return 0;
fail:
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < made; i++) {
        endpoint_free(h->ep[i]);
        ts[i] = NULL;
    }
    pthread_mutex_destroy(&h->mu);
    free(h->ep);
    free(h);
    return -1;
}

int dp_inproc_open(dp_transport **ts, int n, dp_err *err)
{
    return dp_inproc_open_named(ts, n, NULL, err);
}

static const dp_transport_ops inproc_ops = {
    .name = "inproc",
    .connect = inproc_connect,
    .sendv = inproc_sendv,
    .poll = inproc_poll,
    .recv_payload = inproc_recv_payload,
    .skip_payload = inproc_skip_payload,
    .stats = inproc_stats,
    .close = inproc_close,
    .allreduce = NULL,
    .same_host = inproc_same_host,
    .left = inproc_left,
};
