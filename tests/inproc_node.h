/* A worker of a local cluster over the in-process transport, as the tests
 * that run a strategy's operations on threads build it (one thread a
 * task): the node a strategy's open() reads. */
#ifndef DOWNPOUR_TEST_INPROC_NODE_H
#define DOWNPOUR_TEST_INPROC_NODE_H

#include <string.h>

#include "check.h"
#include "downpour/cluster.h"
#include "downpour/node.h"

#define INPROC_MAX_TASKS 64

/* node: worker `position` of `tasks` workers (no chief, no ps), talking
 * over t; the spec's ports are never listened on.  dp_cluster_free(&node->cluster)
 * frees it. */
static inline void inproc_node(dp_node *node, dp_transport *t, int tasks, int position)
{
    int ports[INPROC_MAX_TASKS];
    dp_err err;
    REQUIRE(tasks <= INPROC_MAX_TASKS);
    for (int i = 0; i < tasks; i++)
        ports[i] = 30000 + i;
    memset(node, 0, sizeof *node);
    REQUIRE(dp_cluster_local(&node->cluster, 0, tasks, 0, ports, &err) == 0);
    node->cluster.self = position;
    node->self = &node->cluster.tasks[position];
    node->transport = t;
}

#endif
