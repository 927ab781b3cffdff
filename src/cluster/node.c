#include "downpour/node.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/launcher.h"
#include "downpour/log.h"
#include "downpour/mpi.h"
#include "downpour/secret.h"
#include "downpour/tcp.h"

void dp_node_config_init(dp_node_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->transport = "tcp";
    /* Generous: tasks started by hand or by a scheduler may come up minutes
     * apart (docs/cluster.md, "Startup and heartbeat timeouts"). */
    cfg->connect_timeout = 600;
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

/* The MPI job is the cluster: world rank 0 is the chief, ranks 1..mpi_ps the
 * ps tasks, the rest the workers (docs/mpi.md).  The spec is built locally
 * with placeholder addresses, which MPI never uses; there is no secret: the
 * MPI job (its launcher) is the trust boundary. */
static int open_mpi(dp_node *n, const dp_node_config *cfg, dp_err *err)
{
    int wrank, wsize, *ports = NULL, *world_of = NULL;
    const char **names = NULL;
    if (dp_mpi_init(&wrank, &wsize, err) < 0)
        return -1;
    int ps = cfg->mpi_ps;
    if (ps < 0)
        return dp_errf(err, "--ps %d: the number of ps ranks cannot be negative", ps);
    if (wsize > DP_CLUSTER_MAX_TASKS)
        return dp_errf(err, "an MPI job of %d ranks; downpour clusters have at most %d tasks",
                       wsize, DP_CLUSTER_MAX_TASKS);
    if (ps > 0 && wsize < 3)
        return dp_errf(err, "--ps %d needs at least 3 MPI ranks (a chief, %d ps, a worker) but the "
                            "job has %d. Hint: mpirun -np %d ... (rank 0 is the chief, ranks 1..%d "
                            "the ps tasks, the rest workers)",
                       ps, ps, wsize, ps + 2, ps);
    if (ps > 0 && ps > wsize - 2)
        return dp_errf(err, "--ps %d leaves no worker in an MPI job of %d ranks (rank 0 is the "
                            "chief, ranks 1..%d the ps tasks). Hint: mpirun -np %d or more, or "
                            "fewer --ps",
                       ps, wsize, ps, ps + 2);
    int workers = wsize - 1 - ps;
    ports = malloc((size_t)wsize * sizeof *ports);
    world_of = malloc((size_t)wsize * sizeof *world_of);
    names = calloc((size_t)wsize, sizeof *names);
    if (!ports || !world_of || !names) {
        dp_errf(err, "out of memory for %d ranks", wsize);
        goto fail;
    }
    for (int r = 0; r < wsize; r++)
        ports[r] = 1 + r; /* placeholders: MPI does not use addresses */
    if (dp_cluster_local(&n->cluster, 1, workers, ps, ports, err) < 0)
        goto fail;
    /* Cluster order: chief, workers, ps.  World order: chief, ps, workers. */
    for (int r = 0; r < wsize; r++) {
        const dp_task *tk = &n->cluster.tasks[r];
        world_of[r] = tk->role == DP_ROLE_CHIEF ? 0
                      : tk->role == DP_ROLE_PS  ? 1 + tk->index
                                                : 1 + ps + tk->index;
        if (world_of[r] == wrank)
            n->cluster.self = r;
        names[r] = tk->name;
    }
    n->self = &n->cluster.tasks[n->cluster.self];
    dp_mpi_config mc;
    dp_mpi_config_init(&mc);
    mc.rank = n->cluster.self;
    mc.n_ranks = wsize;
    mc.world_rank_of = world_of;
    mc.names = names;
    if (dp_mpi_open(&mc, &n->transport, err) < 0) {
        dp_err_prefix(err, "%s (MPI rank %d)", n->self->name, wrank);
        goto fail;
    }
    if (wrank == 0 && ps > 0)
        dp_info("MPI job of %d ranks: chief (rank 0), %d ps (ranks 1..%d), %d worker(s) (ranks "
                "%d..%d)", wsize, ps, ps, workers, ps + 1, wsize - 1);
    else if (wrank == 0)
        dp_info("MPI job of %d ranks: chief (rank 0), %d worker(s) (ranks 1..%d)", wsize, workers,
                wsize - 1);
    free(ports);
    free(world_of);
    free(names);
    return 0;
fail:
    free(ports);
    free(world_of);
    free(names);
    return -1;
}

int dp_node_sample(dp_node *n, dp_metrics *m, double interval, dp_err *err)
{
    if (n->sampler)
        return dp_errf(err, "%s: the resource sampler is already running", n->self->name);
    return dp_resource_sampler_start(&n->sampler, m, n->self->name, interval, transport_bytes,
                                     n->transport, err);
}

/* The listening socket `downpour launch` bound for this task and handed
 * down as DOWNPOUR_LISTEN_FD (launcher.h), so that no other process could
 * take its port in between: *fd stays -1 without one.  It must listen on
 * this task's own port; the variable is consumed. */
static int inherited_listener(const dp_task *self, int *fd, dp_err *err)
{
    const char *v = getenv(DP_LAUNCH_LISTEN_FD_ENV);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 3 || x > INT_MAX)
        return dp_errf(err, "%s: %s=%s is not a descriptor number", self->name,
                       DP_LAUNCH_LISTEN_FD_ENV, v);
    int acc = 0;
    socklen_t al = sizeof acc;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockopt((int)x, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) != 0 || !acc ||
        getsockname((int)x, (struct sockaddr *)&ss, &sl) != 0)
        return dp_errf(err, "%s: %s=%ld is not a listening socket", self->name,
                       DP_LAUNCH_LISTEN_FD_ENV, x);
    int port = ss.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
               : ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                          : -1;
    if (port != self->port)
        return dp_errf(err, "%s: %s=%ld listens on port %d, but this task's address is %s",
                       self->name, DP_LAUNCH_LISTEN_FD_ENV, x, port, self->addr);
    fcntl((int)x, F_SETFD, FD_CLOEXEC); /* not passed on to what this task starts */
    unsetenv(DP_LAUNCH_LISTEN_FD_ENV);
    *fd = (int)x;
    return 0;
}

int dp_node_open(dp_node *n, const dp_node_config *cfg, dp_err *err)
{
    memset(n, 0, sizeof *n);
    int rc;
    if (cfg->transport && strcmp(cfg->transport, "mpi") == 0) {
        if (open_mpi(n, cfg, err) < 0 ||
            (cfg->metrics && dp_node_sample(n, cfg->metrics, cfg->sample_interval, err) < 0))
            goto fail;
        return 0;
    }
    if (cfg->transport && strcmp(cfg->transport, "tcp") != 0)
        return dp_errf(err, "unknown transport '%s' (valid: tcp, mpi)", cfg->transport);
    rc = dp_cluster_from_env(&n->cluster, NULL, err);
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
    if (inherited_listener(n->self, &tc.listen_fd, err) < 0) {
        free(addrs);
        free(names);
        dp_secret_wipe(&secret);
        goto fail;
    }
    tc.rank = n->cluster.self;
    tc.n_ranks = count;
    tc.addrs = addrs;
    tc.names = names;
    tc.secret = secret.bytes;
    tc.secret_len = secret.len;
    tc.insecure = cfg->insecure;
    tc.encrypt = cfg->encrypt;
    tc.link_delay_ms = cfg->link_delay_ms;
    tc.joining = dp_cluster_is_spare(&n->cluster, n->cluster.self, cfg->spare_workers);
    /* every task hands the spec to a joiner that proves the secret (`run
     * --join HOST:PORT`): any one address of the job is enough */
    char *spec = dp_cluster_to_json(&n->cluster, -1, err);
    if (!spec) {
        if (tc.listen_fd >= 0)
            close(tc.listen_fd);
        free(addrs);
        free(names);
        dp_secret_wipe(&secret);
        goto fail;
    }
    tc.spec_json = spec;
    if (cfg->no_shm) {
        tc.shm = 0;
        dp_info("%s: shared memory off (--no-shm): tasks on this host talk over TCP",
                n->self->name);
    }
    if (cfg->heartbeat_timeout > 0) {
        tc.heartbeat_timeout = cfg->heartbeat_timeout;
        /* The interval must stay below the timeout: at most a quarter of it,
         * so a short timeout (1 s) still sees several heartbeats in time. */
        if (tc.heartbeat_interval > tc.heartbeat_timeout / 4)
            tc.heartbeat_interval = tc.heartbeat_timeout / 4;
    }
    rc = dp_tcp_open(&tc, &n->transport, err);
    dp_secret_wipe(&secret); /* the transport keeps its own copy */
    free(spec);
    free(addrs);
    free(names);
    if (rc < 0) {
        /* A spare slot's address held by another process: a task already
         * fills that slot (one slot, one address). */
        if (tc.joining && strstr(err->msg, strerror(EADDRINUSE))) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            dp_errf(err, "the spare slot %s is taken: a task already runs at %s (%s); a job "
                         "takes one task a slot, so start this one for a free spare slot",
                    n->self->name, n->self->addr, why);
        }
        dp_err_prefix(err, "%s", n->self->name);
        goto fail;
    }
    if (cfg->metrics && dp_node_sample(n, cfg->metrics, cfg->sample_interval, err) < 0)
        goto fail;
    /* Higher ranks first: those are the ones this rank dials, so no rank
     * waits for an accept while its own dials are still pending.  A ps does
     * not wait for the workers: they dial it, and it serves only requests
     * that come on their connections.  A ps restarted into a running job
     * would otherwise wait on a worker that is not reading its old
     * connection (one at a checkpoint barrier), and so has not noticed the
     * loss that makes it dial again (docs/faults.md, "A restarted ps"). */
    double deadline = dp_now() + cfg->connect_timeout;
    for (int p = n->cluster.n_tasks - 1; p >= 0; p--) {
        dp_role peer = n->cluster.tasks[p].role;
        if (p == n->cluster.self ||
            (cfg->talks_to && !(cfg->talks_to[n->self->role] & DP_ROLE_BIT(peer))) ||
            (n->self->role == DP_ROLE_PS && peer == DP_ROLE_WORKER && p < n->cluster.self))
            continue;
        /* A spare slot may start at any time, or never: not waited for;
         * dialed in the background when this side dials it. */
        if (dp_cluster_is_spare(&n->cluster, p, cfg->spare_workers)) {
            dp_tcp_dial_later(n->transport, p);
            continue;
        }
        if (dp_transport_connect(n->transport, p, deadline, err) < 0) {
            dp_err_prefix(err, "%s: connecting to the cluster", n->self->name);
            goto fail;
        }
    }
    dp_tcp_joined(n->transport); /* a failed handshake is a stranger's again */
    return 0;
fail:
    dp_node_close(n);
    return -1;
}

void dp_node_close(dp_node *n)
{
    dp_resource_sampler_stop(n->sampler);
    n->sampler = NULL;
    if (n->failed)
        dp_transport_close_failed(n->transport);
    else
        dp_transport_close(n->transport);
    n->transport = NULL;
    dp_cluster_free(&n->cluster);
    n->self = NULL;
    /* No dp_mpi_finalize here: this cannot tell a finished run from a failed
     * one, and a failed rank that finalises hangs in MPI_Finalize while its
     * peers wait for it.  dp_mpi_init finalises at a zero exit (on_exit). */
}
