#include "downpour/node.h"

#include <stdlib.h>
#include <string.h>

#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/secret.h"
#include "downpour/tcp.h"

void dp_node_config_init(dp_node_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->transport = "tcp";
    cfg->connect_timeout = 60;
    cfg->heartbeat_timeout = 10;
    cfg->sample_interval = 1;
}

static void transport_bytes(void *ctx, uint64_t *tx, uint64_t *rx)
{
    dp_transport_stats s;
    if (dp_transport_stats_get(ctx, DP_PEER_ANY, &s) == 0) {
        *tx = s.bytes_sent;
        *rx = s.bytes_recv;
    } else {
        *tx = *rx = 0;
    }
}

int dp_node_open(dp_node *n, const dp_node_config *cfg, dp_err *err)
{
    memset(n, 0, sizeof *n);
    if (cfg->transport && strcmp(cfg->transport, "tcp") != 0)
        return dp_errf(err, "unknown transport '%s' (valid: tcp, mpi)", cfg->transport);
    int rc = dp_cluster_from_env(&n->cluster, NULL, err);
    if (rc != 0)
        return rc;
    n->self = &n->cluster.tasks[n->cluster.self];

    dp_secret secret;
    memset(&secret, 0, sizeof secret);
    if (dp_secret_load(&secret, cfg->secret_file, err) < 0) {
        if (!cfg->insecure)
            goto fail;
        dp_warn("%s: no cluster secret (%s); running insecure as asked", n->self->name, err->msg);
        secret.len = 0;
    }

    int count = n->cluster.n_tasks;
    const char **addrs = calloc((size_t)count, sizeof *addrs);
    const char **names = calloc((size_t)count, sizeof *names);
    if (!addrs || !names) {
        free(addrs);
        free(names);
        dp_secret_wipe(&secret);
        dp_errf(err, "out of memory for %d tasks", count);
        goto fail;
    }
    for (int r = 0; r < count; r++) {
        addrs[r] = n->cluster.tasks[r].addr;
        names[r] = n->cluster.tasks[r].name;
    }
    dp_tcp_config tc;
    dp_tcp_config_init(&tc);
    tc.rank = n->cluster.self;
    tc.n_ranks = count;
    tc.addrs = addrs;
    tc.names = names;
    tc.secret = secret.bytes;
    tc.secret_len = secret.len;
    tc.insecure = cfg->insecure;
    if (cfg->heartbeat_timeout > 0)
        tc.heartbeat_timeout = cfg->heartbeat_timeout;
    rc = dp_tcp_open(&tc, &n->transport, err);
    dp_secret_wipe(&secret); /* the transport keeps its own copy */
    free(addrs);
    free(names);
    if (rc < 0) {
        dp_err_prefix(err, "%s", n->self->name);
        goto fail;
    }
    if (cfg->metrics &&
        dp_resource_sampler_start(&n->sampler, cfg->metrics, n->self->name, cfg->sample_interval,
                                  transport_bytes, n->transport, err) < 0)
        goto fail;
    if (dp_transport_connect_all(n->transport, dp_now() + cfg->connect_timeout, err) < 0) {
        dp_err_prefix(err, "%s: connecting to the cluster", n->self->name);
        goto fail;
    }
    return 0;
fail:
    dp_node_close(n);
    return -1;
}

void dp_node_close(dp_node *n)
{
    dp_resource_sampler_stop(n->sampler);
    n->sampler = NULL;
    dp_transport_close(n->transport);
    n->transport = NULL;
    dp_cluster_free(&n->cluster);
    n->self = NULL;
}
