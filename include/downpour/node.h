/* A task's runtime in a cluster: who it is (the cluster spec), how it talks
 * (an authenticated transport to every other task) and what it costs (the
 * resource sampler writing "resource" events).  Every distributed command
 * opens one node and closes it at the end. */
#ifndef DOWNPOUR_NODE_H
#define DOWNPOUR_NODE_H

#include "downpour/cluster.h"
#include "downpour/metrics.h"
#include "downpour/resource.h"
#include "downpour/status.h"
#include "downpour/transport.h"

typedef struct dp_node_config {
    const char *transport;     /* "tcp" (the spec in DOWNPOUR_CONFIG) or "mpi" (roles
                                  from the MPI rank: 0 chief, 1..mpi_ps ps, the rest workers) */
    int mpi_ps;                /* mpi: how many ps ranks follow the chief */
    const char *secret_file;   /* NULL: DOWNPOUR_SECRET */
    int insecure;              /* allow no secret (trusted networks only) */
    int encrypt;               /* tcp: encrypt payloads too (every task must agree) */
    double link_delay_ms;      /* tcp: latency added to every frame sent (dp_tcp_config) */
    int no_shm;                /* tcp: no shared memory with tasks on this host (dp_tcp_config.shm) */
    double connect_timeout;    /* s to reach every peer (600) */
    double heartbeat_timeout;  /* s of silence before a peer is lost (10); the
                                  heartbeat interval is at most a quarter of it */
    dp_metrics *metrics;       /* resource events go here; NULL: no sampler */
    double sample_interval;    /* s between resource samples (1) */
    int spare_workers;         /* tcp: the spec's last N worker slots start empty: not waited
                               for at open, dialed in the background (dp_cluster_is_spare) */
    const unsigned *talks_to;  /* tcp: per role, the DP_ROLE_BITs it connects to (the
                                  strategy's); NULL: every other task */
} dp_node_config;

typedef struct dp_node {
    dp_cluster cluster;
    const dp_task *self;
    dp_transport *transport;
    dp_resource_sampler *sampler;
    int failed; /* the task ends in failure: dp_node_close says no goodbye
                   (dp_transport_close_failed) */
} dp_node;

void dp_node_config_init(dp_node_config *cfg);

/* tcp: reads the spec from DOWNPOUR_CONFIG, loads the secret, listens on
 * this task's address and connects to every other task.  Returns 1 (and
 * leaves *n empty) when DOWNPOUR_CONFIG is not set: not a cluster task.
 * mpi: the cluster is the MPI job (mpirun, srun); never returns 1. */
int dp_node_open(dp_node *n, const dp_node_config *cfg, dp_err *err);

/* Starts the resource sampler on an open node (when the metrics file could
 * only be named after the node knew its task, as under MPI). */
int dp_node_sample(dp_node *n, dp_metrics *m, double interval, dp_err *err);

/* Stops the sampler (one last sample), says BYE, closes.  Safe on an empty node. */
void dp_node_close(dp_node *n);

#endif
