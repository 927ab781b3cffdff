/* downpour ping: checks a cluster before training on it.  Every task connects
 * to every other (same spec, same secret, ports open), then each pair trades
 * round trips and reports latency and throughput.  Pairs take turns in one
 * global order, (0,1), (0,2), ..., (1,2), ..., which cannot deadlock: the
 * smallest unfinished pair always has both of its tasks waiting on it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/node.h"
#include "downpour/tcp.h"
#include "downpour/wire.h"

#define USAGE "downpour ping [--count N] [--bytes N] (as a task of launch or run)"
#define PING DP_WIRE_PING
#define PONG DP_WIRE_PONG

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Receives one frame of `type` from peer into buf (len bytes). */
static int expect(dp_transport *t, int peer, unsigned type, void *buf, size_t len, double timeout,
                  dp_err *err)
{
    dp_event ev;
    if (dp_transport_recv(t, peer, type == PING ? "ping" : "pong", timeout, &ev, err) < 0)
        return -1;
    if (ev.header.type != type || ev.header.length != len)
        return dp_errf(err, "%s sent frame type %u of %llu bytes, expected type %u of %zu bytes",
                       dp_transport_peer_name(t, peer), ev.header.type,
                       (unsigned long long)ev.header.length, type, len);
    return dp_transport_recv_payload(t, peer, buf, len, err);
}

/* One pair's exchange; the lower rank measures. */
static int ping_pair(dp_transport *t, int peer, long count, size_t bytes, double timeout,
                     unsigned char *buf, double *rtt, dp_metrics *metrics, dp_err *err)
{
    int me = dp_transport_rank(t);
    for (long i = 0; i < count; i++) {
        if (me < peer) {
            double t0 = dp_now();
            if (dp_transport_send(t, peer, PING, (uint64_t)i, 0, buf, bytes, err) < 0 ||
                expect(t, peer, PONG, buf, bytes, timeout, err) < 0)
                return -1;
            rtt[i] = dp_now() - t0;
        } else {
            if (expect(t, peer, PING, buf, bytes, timeout, err) < 0 ||
                dp_transport_send(t, peer, PONG, (uint64_t)i, 0, buf, bytes, err) < 0)
                return -1;
        }
    }
    if (me < peer) {
        qsort(rtt, (size_t)count, sizeof *rtt, cmp_double);
        double med = rtt[count / 2], total = 0;
        for (long i = 0; i < count; i++)
            total += rtt[i];
        double mbps = 2.0 * (double)bytes * (double)count / total / 1e6;
        dp_info("ping %s <-> %s: %ld round trips of %zu bytes, median %.1f us, max %.1f us, %.1f MB/s",
                dp_transport_peer_name(t, me), dp_transport_peer_name(t, peer), count, bytes,
                med * 1e6, rtt[count - 1] * 1e6, mbps);
        dp_metrics_event(metrics, "ping", DP_F_STR, "peer", dp_transport_peer_name(t, peer),
                         DP_F_INT, "count", count, DP_F_INT, "bytes", (long)bytes, DP_F_NUM,
                         "rtt_median_us", med * 1e6, DP_F_NUM, "rtt_max_us", rtt[count - 1] * 1e6,
                         DP_F_NUM, "mb_per_s", mbps, DP_F_END);
    }
    return 0;
}

int cmd_ping(int argc, char **argv)
{
    long count = 100, bytes = 64;
    double timeout = 30, connect_timeout = 60, link_delay_ms = 0;
    const char *secret_file = NULL, *metrics_path = NULL;
    bool insecure = false;
    const cli_opt opts[] = {
        {"count", CLI_INT, &count, "N", "round trips per pair of tasks", 1, 10000000},
        {"bytes", CLI_INT, &bytes, "N", "payload bytes per message", 0, 1L << 30},
        {"timeout", CLI_NUM, &timeout, "S", "seconds to wait for one reply", 0.01, 86400},
        {"connect-timeout", CLI_NUM, &connect_timeout, "S", "seconds to reach every task", 1, 86400},
        {"secret-file", CLI_STR, &secret_file, "FILE", "cluster secret (default: $DOWNPOUR_SECRET)", 0, 0},
        {"link-delay-ms", CLI_NUM, &link_delay_ms, "MS", "every frame this task sends waits MS ms first (as train's)", 0, DP_TCP_MAX_LINK_DELAY_MS},
        {"insecure", CLI_FLAG, &insecure, NULL, "allow running without a secret", 0, 0},
        {"metrics", CLI_STR, &metrics_path, "FILE", "write ping and resource events to FILE", 0, 0},
    };
    int rest;
    int r = cli_parse(USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest < argc) {
        fprintf(stderr, "downpour ping: unexpected argument '%s' (see --help)\n", argv[rest]);
        return 2;
    }

    dp_err err;
    dp_metrics *metrics = NULL;
    dp_node node;
    memset(&node, 0, sizeof node);
    unsigned char *buf = malloc((size_t)bytes + 1);
    double *rtt = malloc((size_t)count * sizeof *rtt);
    int rc = 1;
    if (!buf || !rtt) {
        fprintf(stderr, "downpour ping: out of memory for %ld round trips of %ld bytes\n", count, bytes);
        goto out;
    }
    memset(buf, 0x5a, (size_t)bytes + 1);
    if (dp_metrics_open(&metrics, metrics_path, &err) < 0)
        goto fail;
    dp_node_config nc;
    dp_node_config_init(&nc);
    nc.secret_file = secret_file;
    nc.insecure = insecure;
    nc.connect_timeout = connect_timeout;
    nc.link_delay_ms = link_delay_ms;
    nc.metrics = metrics_path ? metrics : NULL;
    double t0 = dp_now();
    r = dp_node_open(&node, &nc, &err);
    if (r == 1) {
        fprintf(stderr, "downpour ping: not a cluster task (neither DOWNPOUR_CONFIG nor "
                        "TF_CONFIG is set). Hint: "
                        "downpour launch --workers 2 -- ping, or downpour run --cluster FILE "
                        "--task worker:0 -- ping\n");
        rc = 2;
        goto out;
    }
    if (r < 0)
        goto fail;
    dp_info("%s: connected to %d task(s) in %.3f s", node.self->name, node.cluster.n_tasks - 1,
            dp_now() - t0);
    int me = node.cluster.self, n = node.cluster.n_tasks;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (a == me || b == me)
                if (ping_pair(node.transport, a == me ? b : a, count, (size_t)bytes, timeout, buf,
                              rtt, metrics, &err) < 0)
                    goto fail;
    dp_transport_stats s;
    dp_transport_stats_get(node.transport, DP_PEER_ANY, &s);
    dp_info("%s: ok; sent %llu bytes in %llu frames, received %llu bytes in %llu frames",
            node.self->name, (unsigned long long)s.bytes_sent, (unsigned long long)s.frames_sent,
            (unsigned long long)s.bytes_recv, (unsigned long long)s.frames_recv);
    dp_node_close(&node); /* stops the sampler, the other metrics writer */
    dp_metrics *done = metrics;
    metrics = NULL;
    if (dp_metrics_close_check(done, &err) < 0)
        goto fail;
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "downpour ping: %s\n", err.msg);
out:
    dp_node_close(&node);
    dp_metrics_close(metrics);
    free(buf);
    free(rtt);
    return rc;
}
