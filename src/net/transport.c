/* The transport interface's common part: argument checks, names, and the
 * blocking receive with its "waiting for" log lines, written once for every
 * implementation. */
#include "transport_impl.h"

#include "downpour/clock.h"
#include "downpour/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dp_transport_base_init(dp_transport *t, const dp_transport_ops *ops, int rank, int n_ranks,
                           const char *const *names, double late_log, dp_err *err)
{
    t->ops = ops;
    t->rank = rank;
    t->n_ranks = n_ranks;
    t->late_log = late_log > 0 ? late_log : 5.0;
    t->names = calloc((size_t)n_ranks, sizeof *t->names);
    if (!t->names)
        return dp_errf(err, "out of memory for %d peer names", n_ranks);
    for (int i = 0; i < n_ranks; i++) {
        char buf[32];
        const char *s = names && names[i] ? names[i] : NULL;
        if (!s) {
            snprintf(buf, sizeof buf, "rank %d", i);
            s = buf;
        }
        t->names[i] = strdup(s);
        if (!t->names[i]) {
            dp_transport_base_free(t);
            return dp_errf(err, "out of memory for peer names");
        }
    }
    return 0;
}

void dp_transport_base_free(dp_transport *t)
{
    if (!t->names)
        return;
    for (int i = 0; i < t->n_ranks; i++)
        free(t->names[i]);
    free(t->names);
    t->names = NULL;
}

int dp_transport_rank(const dp_transport *t) { return t->rank; }
int dp_transport_size(const dp_transport *t) { return t->n_ranks; }
const char *dp_transport_name(const dp_transport *t) { return t->ops->name; }

const char *dp_transport_peer_name(const dp_transport *t, int peer)
{
    if (peer < 0 || peer >= t->n_ranks)
        return "invalid rank";
    return t->names[peer];
}

static int check_peer(const dp_transport *t, int peer, int any_ok, dp_err *err)
{
    if (any_ok && peer == DP_PEER_ANY)
        return 0;
    if (peer < 0 || peer >= t->n_ranks || peer == t->rank)
        return dp_errf(err, "invalid peer rank %d (this is rank %d of %d)", peer, t->rank,
                       t->n_ranks);
    return 0;
}

int dp_transport_connect(dp_transport *t, int peer, double deadline, dp_err *err)
{
    if (check_peer(t, peer, 0, err))
        return -1;
    return t->ops->connect(t, peer, deadline, err);
}

int dp_transport_connect_all(dp_transport *t, double deadline, dp_err *err)
{
    /* Higher ranks first: with TCP those are the ones this rank dials, so no
     * rank waits for an accept while its own dials are still pending. */
    for (int p = t->n_ranks - 1; p >= 0; p--) {
        if (p == t->rank)
            continue;
        if (t->ops->connect(t, p, deadline, err))
            return -1;
    }
    return 0;
}

int dp_transport_sendv(dp_transport *t, int peer, unsigned type, uint64_t step, uint64_t offset,
                       const struct iovec *iov, int iovcnt, dp_err *err)
{
    if (check_peer(t, peer, 0, err))
        return -1;
    if (type < DP_FRAME_APP_FIRST || type >= DP_FRAME_COUNT)
        return dp_errf(err, "frame type %u is not an application type [%d, %d)", type,
                       DP_FRAME_APP_FIRST, DP_FRAME_COUNT);
    if (iovcnt < 0 || iovcnt > DP_TRANSPORT_MAX_IOV)
        return dp_errf(err, "%d payload pieces (at most %d)", iovcnt, DP_TRANSPORT_MAX_IOV);
    dp_frame_header h = {0};
    h.type = (uint16_t)type;
    h.step = step;
    h.offset = offset;
    return t->ops->sendv(t, peer, &h, iov, iovcnt, err);
}

int dp_transport_send(dp_transport *t, int peer, unsigned type, uint64_t step, uint64_t offset,
                      const void *payload, size_t len, dp_err *err)
{
    struct iovec iov = {(void *)payload, len};
    return dp_transport_sendv(t, peer, type, step, offset, &iov, len ? 1 : 0, err);
}

int dp_transport_poll(dp_transport *t, int peer, double timeout_s, dp_event *ev, dp_err *err)
{
    if (check_peer(t, peer, 1, err))
        return -1;
    return t->ops->poll(t, peer, timeout_s < 0 ? 0 : timeout_s, ev, err);
}

int dp_transport_recv_payload(dp_transport *t, int peer, void *dst, size_t len, dp_err *err)
{
    if (check_peer(t, peer, 0, err))
        return -1;
    return t->ops->recv_payload(t, peer, dst, len, err);
}

int dp_transport_base_recv_add(dp_transport *t, int peer, float *dst, size_t count, dp_err *err)
{
    float buf[2048]; /* 8 KiB: the piece stays in L1 between the read and the add */
    while (count) {
        size_t k = count < sizeof buf / sizeof buf[0] ? count : sizeof buf / sizeof buf[0];
        if (t->ops->recv_payload(t, peer, buf, k * sizeof(float), err) < 0)
            return -1;
        for (size_t j = 0; j < k; j++)
            dst[j] += buf[j];
        dst += k;
        count -= k;
    }
    return 0;
}

int dp_transport_recv_payload_add(dp_transport *t, int peer, float *dst, size_t count,
                                  dp_err *err)
{
    if (check_peer(t, peer, 0, err))
        return -1;
    if (!dst && count)
        return dp_errf(err, "recv_payload_add: NULL destination");
    if (t->ops->recv_payload_add)
        return t->ops->recv_payload_add(t, peer, dst, count, err);
    return dp_transport_base_recv_add(t, peer, dst, count, err);
}

int dp_transport_skip_payload(dp_transport *t, int peer, dp_err *err)
{
    if (check_peer(t, peer, 0, err))
        return -1;
    return t->ops->skip_payload(t, peer, err);
}

int dp_transport_recv(dp_transport *t, int peer, const char *what, double timeout_s,
                      dp_event *ev, dp_err *err)
{
    if (check_peer(t, peer, 0, err))
        return -1;
    const char *name = t->names[peer];
    what = what ? what : "a frame";
    double start = dp_now(), deadline = start + timeout_s, next_log = start + t->late_log;
    for (;;) {
        double now = dp_now();
        double slice = (next_log < deadline ? next_log : deadline) - now;
        if (slice < 0)
            slice = 0;
        if (t->ops->poll(t, peer, slice, ev, err))
            return -1;
        if (ev->kind == DP_EVENT_FRAME)
            return 0;
        if (ev->kind == DP_EVENT_PEER_LOST)
            return dp_errf(err, "waiting for %s (%s): peer lost: %s", name, what, ev->reason);
        now = dp_now();
        if (now >= deadline)
            return dp_errf(err, "waiting for %s (%s): no frame after %.0f s", name, what,
                           now - start);
        if (now >= next_log) {
            dp_warn("waiting for %s (%s) for %.0f s", name, what, now - start);
            next_log = now + t->late_log;
        }
    }
}

int dp_transport_stats_get(const dp_transport *t, int peer, dp_transport_stats *out)
{
    memset(out, 0, sizeof *out);
    if (peer != DP_PEER_ANY && (peer < 0 || peer >= t->n_ranks))
        return -1;
    t->ops->stats(t, peer, out);
    return 0;
}

void dp_transport_close(dp_transport *t)
{
    if (t)
        t->ops->close(t);
}

void dp_transport_close_failed(dp_transport *t)
{
    if (t) {
        t->failed = 1;
        t->ops->close(t);
    }
}

int dp_transport_recv_exact(dp_transport *t, int peer, unsigned type, uint64_t step,
                            uint64_t offset, void *dst, size_t len, const char *what,
                            double timeout_s, dp_err *err)
{
    dp_event ev;
    if (dp_transport_recv(t, peer, what, timeout_s, &ev, err) < 0)
        return DP_RECV_LOST;
    if (ev.header.type != type || ev.header.step != step || ev.header.offset != offset ||
        ev.header.length != len)
        return dp_errf(err, "%s sent frame type %u (step %llu, offset %llu, %llu bytes) where "
                            "%s (type %u, step %llu, offset %llu, %zu bytes) was due",
                       dp_transport_peer_name(t, peer), ev.header.type,
                       (unsigned long long)ev.header.step, (unsigned long long)ev.header.offset,
                       (unsigned long long)ev.header.length, what, type,
                       (unsigned long long)step, (unsigned long long)offset, len);
    if (len && dp_transport_recv_payload(t, peer, dst, len, err) < 0)
        return DP_RECV_LOST;
    return 0;
}

const char *dp_event_kind_name(dp_event_kind k)
{
    static const char *const names[DP_EVENT_KIND_COUNT] = {"timeout", "frame", "peer lost"};
    return (unsigned)k < DP_EVENT_KIND_COUNT ? names[k] : "invalid";
}

uint64_t dp_transport_peer_incarnation(const dp_transport *t, int peer)
{
    if (!t || peer < 0 || peer >= t->n_ranks || !t->ops->incarnation)
        return 0;
    return t->ops->incarnation(t, peer);
}

int dp_transport_peer_tampered(const dp_transport *t, int peer)
{
    if (!t || peer < 0 || peer >= t->n_ranks || !t->ops->tampered)
        return 0;
    return t->ops->tampered(t, peer);
}

int dp_transport_peer_left(const dp_transport *t, int peer)
{
    if (!t || peer < 0 || peer >= t->n_ranks || !t->ops->left)
        return 0;
    return t->ops->left(t, peer);
}

uint64_t dp_transport_incarnation(const dp_transport *t)
{
    return t && t->ops->incarnation ? t->ops->incarnation(t, t->rank) : 0;
}

int dp_transport_same_host(const dp_transport *t, int peer)
{
    if (!t || peer < 0 || peer >= t->n_ranks)
        return -1;
    if (peer == t->rank)
        return 1;
    return t->ops->same_host ? t->ops->same_host(t, peer) : -1;
}

int dp_transport_has_allreduce(const dp_transport *t) { return t->ops->allreduce != NULL; }

int dp_transport_allreduce(dp_transport *t, float *buf, size_t len, const int *ranks, int n_ranks,
                           dp_err *err)
{
    if (!t->ops->allreduce)
        return dp_errf(err, "the %s transport has no collective all-reduce", t->ops->name);
    return t->ops->allreduce(t, buf, len, ranks, n_ranks, err);
}

int dp_transport_base_wants(const dp_transport *t, int want, int i)
{
    return i != t->rank && (want == DP_PEER_ANY || want == i);
}

void dp_transport_base_discard(dp_transport *t, int peer, uint64_t left, unsigned type)
{
    dp_err e;
    dp_warn("discarding %llu unread payload bytes of %s frame from %s", (unsigned long long)left,
            dp_frame_type_name(type), dp_transport_peer_name(t, peer));
    t->ops->skip_payload(t, peer, &e);
}

void dp_transport_base_lost(dp_event *ev, int peer, int orderly, const char *reason)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = DP_EVENT_PEER_LOST;
    ev->peer = peer;
    ev->orderly = orderly;
    snprintf(ev->reason, sizeof ev->reason, "%s", reason);
}
