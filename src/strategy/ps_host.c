/* One push per host under ps-sync: see ps_host.h. */
#include "strategy/ps_host.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/testhooks.h"
#include "downpour/wire.h"

#define ECHO_REPS 3     /* auto: echoes with a member, the best taken */
#define ECHO_FLOATS ((size_t)1 << 20) /* auto: an echo's floats at most (4 MiB) */
#define HOST_MARGIN 2.0 /* auto: the servers' link must be this many times slower a byte */
enum { DECIDE_HOST = 1, DECIDE_WORKER = 2 }; /* a HOST_PARAMS decision's offset */

int dp_ps_push_parse(const char *name)
{
    static const char *const names[] = {"worker", "host", "auto"};
    if (!name)
        return DP_PS_PUSH_WORKER;
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

void dp_ps_host_close(dp_ps_host *h)
{
    free(h->rank);
    free(h->index);
    free(h->live);
    free(h->members);
    free(h->buf);
    free(h->share);
    memset(h, 0, sizeof *h);
}

/* Every worker's row of the map (row[j] 1: j on its host, by its own
 * transport), sent to every other worker and received from each, so all
 * hold the same map.  map is W x W. */
static int share_map(dp_transport *t, const int *wrank, int W, int me, uint8_t *map,
                     double timeout, dp_err *err)
{
    uint8_t *row = map + (size_t)me * W;
    for (int j = 0; j < W; j++)
        row[j] = j == me || dp_transport_same_host(t, wrank[j]) == 1;
    for (int j = 0; j < W; j++)
        if (j != me && dp_transport_send(t, wrank[j], DP_WIRE_HOST_MAP, 0, (uint64_t)me, row,
                                         (size_t)W, err) < 0)
            return dp_err_prefix(err, "--ps-push: telling worker %d who shares this host", j);
    for (int j = 0; j < W; j++)
        if (j != me && dp_transport_recv_exact(t, wrank[j], DP_WIRE_HOST_MAP, 0, (uint64_t)j,
                                               map + (size_t)j * W, (size_t)W,
                                               "the workers that share its host", timeout,
                                               err) != 0)
            return dp_err_prefix(err, "--ps-push: hearing from worker %d who shares its host", j);
    return 0;
}

/* auto, the leader: one pull of the whole model from the servers (as
 * --compress auto times the link, ps.c dp_ps_client_auto) against an echo
 * of up to ECHO_FLOATS with its first member (the best of a few), per
 * byte.  DOWNPOUR_TEST_LINK_NS fakes the servers' link (docs/faults.md,
 * "Test hooks"). */
static int measure(dp_ps_host *h, dp_ps_client *client, float *params, double *link,
                   double *local, dp_err *err)
{
    size_t k = h->np < ECHO_FLOATS ? h->np : ECHO_FLOATS;
    *local = 0;
    double t0 = dp_now();
    if (dp_ps_client_pull(client, params, 0, err) < 0)
        return -1;
    *link = (dp_now() - t0) / ((double)h->np * sizeof(float));
    for (int rep = 0; rep < ECHO_REPS; rep++) {
        double t1 = dp_now();
        if (dp_transport_send(h->t, h->rank[1], DP_WIRE_HOST_PARAMS, 0, 0, params,
                              k * sizeof(float), err) < 0 ||
            dp_transport_recv_exact(h->t, h->rank[1], DP_WIRE_HOST_GRAD, 0, 0, h->buf,
                                    k * sizeof(float), "auto's echo", h->timeout, err) != 0)
            return dp_err_prefix(err, "--ps-push auto: timing the host's link");
        double b = (dp_now() - t1) / (2.0 * (double)k * sizeof(float));
        *local = rep == 0 || b < *local ? b : *local;
    }
    if (dp_hook_link_ns() > 0)
        *link = dp_hook_link_ns() * 1e-9;
    return 0;
}

/* The leader's choice, told to every member (HOST_PARAMS, no payload). */
static int decide(dp_ps_host *h, int mode, dp_ps_client *client, const dp_ps_layout *layout,
                  float *params, dp_err *err)
{
    int host = 1, away = -1;
    for (int k = 0; k < layout->n_shards && away < 0; k++)
        if (dp_transport_same_host(h->t, layout->rank[k]) != 1)
            away = layout->rank[k];
    if (mode == DP_PS_PUSH_AUTO && away < 0) {
        /* every shard's server shares this host: its link is the host's
         * own, and the pushes go to it side by side */
        host = 0;
        snprintf(h->why, sizeof h->why, "auto: by worker: every ps shard is on this host");
    } else if (mode == DP_PS_PUSH_AUTO) {
        double link, local;
        if (measure(h, client, params, &link, &local, err) < 0)
            return -1;
        /* The host's link carries k pushes and k answers a step by worker,
         * one of each by host, which adds k-1 shares in and k-1 answers out
         * through the host's own (shared memory): by host when the
         * servers' link is the slower a byte, by a margin (on one host
         * both are shared memory: by worker). */
        host = link > HOST_MARGIN * local;
        snprintf(h->why, sizeof h->why,
                 "auto: %s: %s is on another host; the servers' link %.3f ns/B (a pull), the "
                 "host's %.3f ns/B (an echo with worker %u); by host when the servers' is over "
                 "%.0fx slower",
                 host ? "by host" : "by worker", dp_transport_peer_name(h->t, away), link * 1e9,
                 local * 1e9, h->index[1], HOST_MARGIN);
    } else {
        snprintf(h->why, sizeof h->why, "host: forced");
    }
    for (int j = 1; j < h->n; j++)
        if (dp_transport_send(h->t, h->rank[j], DP_WIRE_HOST_PARAMS, 0,
                              host ? DECIDE_HOST : DECIDE_WORKER, NULL, 0, err) < 0)
            return dp_err_prefix(err, "--ps-push: telling worker %u", h->index[j]);
    h->on = host;
    return 0;
}

/* A member: auto's echoes, then the leader's choice. */
static int hear(dp_ps_host *h, dp_err *err)
{
    for (;;) {
        dp_event ev;
        if (dp_transport_recv(h->t, h->rank[0], "its host leader's choice of pushes",
                              h->timeout, &ev, err) < 0)
            return dp_err_prefix(err, "--ps-push");
        uint64_t len = ev.header.length;
        if (ev.header.type == DP_WIRE_HOST_PARAMS && ev.header.step == 0 &&
            ev.header.offset == 0 && len > 0 && len <= h->np * sizeof(float) && len % 4 == 0) {
            if (dp_transport_recv_payload(h->t, h->rank[0], h->buf, (size_t)len, err) < 0 ||
                dp_transport_send(h->t, h->rank[0], DP_WIRE_HOST_GRAD, 0, 0, h->buf, (size_t)len,
                                  err) < 0)
                return dp_err_prefix(err, "--ps-push auto: the echo with its host leader");
            continue;
        }
        if (ev.header.type != DP_WIRE_HOST_PARAMS || ev.header.step != 0 || len != 0 ||
            (ev.header.offset != DECIDE_HOST && ev.header.offset != DECIDE_WORKER))
            return dp_errf(err, "--ps-push: %s sent frame type %u step %llu offset %llu, %llu "
                                "bytes; expected its choice of pushes",
                           dp_transport_peer_name(h->t, h->rank[0]), ev.header.type,
                           (unsigned long long)ev.header.step,
                           (unsigned long long)ev.header.offset, (unsigned long long)len);
        h->on = ev.header.offset == DECIDE_HOST;
        snprintf(h->why, sizeof h->why, "its host's leader, worker %u, chose", h->index[0]);
        return 0;
    }
}

int dp_ps_host_open(dp_ps_host *h, dp_transport *t, const dp_cluster *c, int worker, int mode,
                    dp_ps_client *client, const dp_ps_layout *layout, float *params, size_t np,
                    double timeout, dp_err *err)
{
    memset(h, 0, sizeof *h);
    h->t = t;
    h->np = np;
    h->timeout = timeout;
    int W = c->count[DP_ROLE_WORKER];
    int *wrank = malloc((size_t)W * sizeof *wrank), *lead = malloc((size_t)W * sizeof *lead);
    uint8_t *map = calloc((size_t)W * W, 1);
    h->rank = malloc((size_t)W * sizeof *h->rank);
    h->index = malloc((size_t)W * sizeof *h->index);
    if (!wrank || !lead || !map || !h->rank || !h->index) {
        dp_errf(err, "--ps-push: out of memory for the host map");
        goto fail;
    }
    for (int j = 0; j < W; j++)
        wrank[j] = dp_cluster_rank(c, DP_ROLE_WORKER, j);
    if (share_map(t, wrank, W, worker, map, timeout, err) < 0)
        goto fail;
    /* A host: the lowest unplaced worker leads it; each later one joins
     * it where both say they share a host, up to the most one push names. */
    for (int j = 0; j < W; j++)
        lead[j] = -1;
    for (int i = 0; i < W; i++) {
        if (lead[i] >= 0)
            continue;
        lead[i] = i;
        for (int j = i + 1, k = 1; j < W && k < DP_PS_HOST_MAX; j++)
            if (lead[j] < 0 && map[(size_t)i * W + j] && map[(size_t)j * W + i]) {
                lead[j] = i;
                k++;
            }
    }
    for (int j = 0; j < W; j++)
        if (lead[j] == lead[worker]) {
            h->rank[h->n] = wrank[j];
            h->index[h->n++] = (uint32_t)j;
        }
    h->lead = lead[worker] == worker;
    free(wrank);
    free(lead);
    free(map);
    wrank = lead = NULL;
    map = NULL;
    if (h->n < 2) {
        snprintf(h->why, sizeof h->why, "%s: no other worker shares its host",
                 mode == DP_PS_PUSH_AUTO ? "auto" : "host");
        return 0;
    }
    h->live = malloc((size_t)h->n);
    h->members = malloc(4 + 4 * (size_t)h->n);
    h->buf = malloc(np * sizeof(float));
    h->share = malloc(DP_PUSH_HEAD_SIZE + np * sizeof(float));
    if (!h->live || !h->members || !h->buf || !h->share) {
        dp_errf(err, "--ps-push: out of memory for the host's sums");
        goto fail;
    }
    memset(h->live, 1, (size_t)h->n);
    if ((h->lead ? decide(h, mode, client, layout, params, err) : hear(h, err)) < 0)
        goto fail;
    return 0;
fail:
    free(wrank);
    free(lead);
    free(map);
    dp_ps_host_close(h);
    return -1;
}

/* The leader: member j is lost, or could not be told; it is left out. */
static void drop(dp_ps_host *h, int j, const char *why)
{
    h->live[j] = 0;
    dp_warn("--ps-push host: worker %u is lost (%s); its host's pushes go on without it",
            h->index[j], why);
}

static int lead_step(dp_ps_host *h, dp_ps_client *client, float *params, const float *grads,
                     int records, float lr, long step, dp_err *err)
{
    float r = (float)records;
    for (size_t i = 0; i < h->np; i++)
        h->buf[i] = grads[i] * r; /* the product a server takes of a worker's push */
    uint32_t m = 1;
    long total = records;
    dp_put_u32(h->members + 4, h->index[0]);
    const float *g = (const float *)(h->share + DP_PUSH_HEAD_SIZE);
    for (int j = 1; j < h->n; j++) {
        if (!h->live[j])
            continue;
        dp_err why;
        int rc = dp_transport_recv_exact(h->t, h->rank[j], DP_WIRE_HOST_GRAD, (uint64_t)step, 0,
                                         h->share, DP_PUSH_HEAD_SIZE + h->np * sizeof(float),
                                         "its share of the host's push", h->timeout, &why);
        if (rc == DP_RECV_LOST) {
            drop(h, j, why.msg);
            continue;
        }
        if (rc != 0)
            return dp_errf(err, "--ps-push host: %s", why.msg);
        dp_push_head head;
        dp_push_head_get(&head, h->share);
        if (head.records > (uint32_t)(INT_MAX - total))
            return dp_errf(err, "--ps-push host: worker %u gave a share of %u records; the host's "
                                "push holds at most %d", h->index[j], head.records, INT_MAX);
        for (size_t i = 0; i < h->np; i++)
            h->buf[i] += g[i];
        total += head.records;
        dp_put_u32(h->members + 4 + 4 * m++, h->index[j]);
    }
    dp_put_u32(h->members, m);
    if (dp_ps_client_push_host(client, params, h->buf, (int)total, lr, h->members, 4 + 4 * m,
                               err) < 0)
        return -1;
    for (int j = 1; j < h->n; j++) {
        dp_err why;
        if (h->live[j] && dp_transport_send(h->t, h->rank[j], DP_WIRE_HOST_PARAMS,
                                            (uint64_t)step, 0, params,
                                            h->np * sizeof(float), &why) < 0)
            drop(h, j, why.msg);
    }
    return 0;
}

int dp_ps_host_step(dp_ps_host *h, dp_ps_client *client, float *params, const float *grads,
                    int records, float lr, long step, dp_err *err)
{
    if (h->lead)
        return lead_step(h, client, params, grads, records, lr, step, err);
    float r = (float)records;
    for (size_t i = 0; i < h->np; i++)
        h->buf[i] = grads[i] * r;
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head head = {(uint32_t)records, 1, lr, (uint32_t)step};
    dp_push_head_put(raw, &head);
    struct iovec iov[2] = {{raw, sizeof raw}, {h->buf, h->np * sizeof(float)}};
    dp_err why;
    int rc = dp_transport_sendv(h->t, h->rank[0], DP_WIRE_HOST_GRAD, (uint64_t)step, 0, iov, 2,
                                &why) < 0
                 ? DP_RECV_LOST
                 : dp_transport_recv_exact(h->t, h->rank[0], DP_WIRE_HOST_PARAMS, (uint64_t)step,
                                           0, params, h->np * sizeof(float),
                                           "the parameters from its host's leader", h->timeout,
                                           &why);
    if (rc == 0) {
        dp_ps_client_hosted(client);
        return 0;
    }
    if (rc != DP_RECV_LOST)
        return dp_errf(err, "--ps-push host: %s", why.msg);
    /* The leader is gone: this worker pushes on its own from this step,
     * the step's gradient again (docs/faults.md, "One push per host"). */
    h->on = 0;
    dp_warn("--ps-push host: its host's leader, worker %u, is lost (%s); this worker pushes on "
            "its own from step %ld", h->index[0], why.msg, step);
    return dp_ps_client_step(client, params, grads, records, lr, err);
}
