/* Cluster spec: which tasks make up a run, where each listens, and which one
 * this process is.  The format is TensorFlow's TF_CONFIG:
 *   {"cluster": {"chief": ["host:port"], "worker": ["host:port", ..], "ps": [..]},
 *    "task": {"type": "worker", "index": 0}}
 * read from a string, a file (--cluster FILE, with --task TYPE:INDEX), or the
 * environment variable DOWNPOUR_CONFIG (else TF_CONFIG, TensorFlow's own).
 *
 * Ranks follow one fixed order: the chief (if any) is rank 0, then the workers
 * by index, then the ps tasks by index.  So with a chief, worker:i is rank 1+i;
 * without one, worker:i is rank i. */
#ifndef DOWNPOUR_CLUSTER_H
#define DOWNPOUR_CLUSTER_H

#include <stddef.h>

#include "downpour/status.h"

#define DP_CLUSTER_MAX_TASKS 4096
#define DP_CLUSTER_MAX_ADDR 255            /* characters of "host:port" */
#define DP_CLUSTER_MAX_SPEC (8 << 20)      /* bytes of spec JSON we accept */
#define DP_CLUSTER_ENV "DOWNPOUR_CONFIG"
#define DP_CLUSTER_ENV_TF "TF_CONFIG"       /* read when DP_CLUSTER_ENV is unset or empty */

typedef enum dp_role {
    DP_ROLE_CHIEF,  /* coordinates, evaluates, checkpoints; worker 0 in all-reduce */
    DP_ROLE_WORKER, /* trains on its shard of the data */
    DP_ROLE_PS,     /* holds a shard of the parameters */
    DP_ROLE_COUNT
} dp_role;

#define DP_ROLE_BIT(role) (1u << (role)) /* a role in a set of roles */

/* One task of the cluster: plain data. */
typedef struct dp_task {
    dp_role role;
    int index;                          /* within its role */
    int rank;                           /* position in the rank order above */
    int port;                           /* 1..65535 */
    char name[24];                      /* "worker:2", for logs and metrics */
    char host[DP_CLUSTER_MAX_ADDR + 1]; /* "10.0.0.5", "node-3", "::1" (no brackets) */
    char addr[DP_CLUSTER_MAX_ADDR + 1]; /* as written: "[::1]:2222" */
} dp_task;

typedef struct dp_cluster {
    dp_task *tasks;             /* n_tasks entries, tasks[r].rank == r */
    int n_tasks;
    int count[DP_ROLE_COUNT];   /* tasks per role */
    int self;                   /* rank of this process's task */
} dp_cluster;

/* "chief", "worker", "ps"; NULL for an invalid role. */
const char *dp_role_name(dp_role role);

/* Parses "worker:2" (also "chief" alone for chief:0).  Checks the type only;
 * the index is range-checked against a spec by dp_cluster_parse. */
int dp_task_parse(const char *s, dp_role *role, int *index, dp_err *err);

/* Parses "host:port" or "[v6addr]:port" into host (no brackets, hostsz bytes)
 * and port (1..65535).  `what` names the field in the message. */
int dp_hostport_parse(const char *s, char *host, size_t hostsz, int *port, const char *what,
                      dp_err *err);

/* Parses a spec (NUL-terminated JSON).  `task` ("worker:0"), when not NULL,
 * overrides or provides the spec's "task".  Fills *c (free it with
 * dp_cluster_free); on failure *c is left empty and err names the field. */
int dp_cluster_parse(dp_cluster *c, const char *json, const char *task, dp_err *err);

/* Reads the spec from a file (at most DP_CLUSTER_MAX_SPEC bytes). */
int dp_cluster_load(dp_cluster *c, const char *path, const char *task, dp_err *err);

/* Reads the spec from DOWNPOUR_CONFIG, or from TF_CONFIG when DOWNPOUR_CONFIG
 * is unset or empty (when both are set and differ, DOWNPOUR_CONFIG wins and
 * an info line says so).  Returns 1 (and leaves *c empty) when neither is
 * set, 0 on success, -1 on a bad spec (the message names the variable). */
int dp_cluster_from_env(dp_cluster *c, const char *task, dp_err *err);

/* A local cluster on 127.0.0.1: `chief` (0 or 1) chief, `workers` workers,
 * `ps` ps tasks, listening on ports[rank].  self is set to 0. */
int dp_cluster_local(dp_cluster *c, int chief, int workers, int ps, const int *ports,
                     dp_err *err);

/* Rank of role:index, or -1 when the spec has no such task. */
int dp_cluster_rank(const dp_cluster *c, dp_role role, int index);

/* Whether the task of `rank` is one of the spec's last `spare` worker slots,
 * which start empty (train --spare-workers; docs/cluster.md, "Spare slots:
 * growing a running job"). */
int dp_cluster_is_spare(const dp_cluster *c, int rank, int spare);

/* The spec as compact JSON with "task" set to the task of rank `self`
 * (self < 0: no "task" member).  Returns a malloc'd string (free()) or NULL
 * with a message.  dp_cluster_parse of the result gives the same cluster. */
char *dp_cluster_to_json(const dp_cluster *c, int self, dp_err *err);

void dp_cluster_free(dp_cluster *c); /* leaves *c empty; NULL is a no-op */

#endif
