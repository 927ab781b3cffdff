/* A replica group (src/exec/group.c): the positions of a strategy that
 * splits one model over several tasks, R replicas of `width` positions,
 * position p being member p % width of replica replica0 + p / width.  The
 * model-parallel strategy and executor (a model's slices) and the pipeline
 * (its stages) share it.  A member that is gone, silent or off the protocol
 * takes its part of the model with it, so every loss ends the run with one
 * message naming the member:
 *   "lost MEMBER i of replica r, NAME (why): COST, so the run stops". */
#ifndef DOWNPOUR_GROUP_H
#define DOWNPOUR_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"
#include "downpour/transport.h"

typedef struct dp_group {
    dp_transport *t;
    const int *ranks;   /* transport rank of each position */
    int n;              /* positions */
    int width;          /* positions per replica */
    int replica0;       /* the replica of position 0 */
    const char *member; /* "pipeline stage" */
    const char *cost;   /* what a loss costs: "a pipeline cannot go on without ..." */
    double timeout;     /* s a member may stay silent */
} dp_group;

/* Position p's peer name. */
const char *dp_group_name(const dp_group *g, int p);
/* Ends the run for position p's loss: err (what happened) becomes the
 * message above; -1. */
int dp_group_lost(const dp_group *g, int p, dp_err *err);
/* As dp_group_lost for the position of transport rank `rank`; -1 with err
 * as it is when no position has it. */
int dp_group_lost_rank(const dp_group *g, int rank, dp_err *err);
/* Waits for frame `type` of `step` (offset, len bytes) from position p and
 * reads it into dst: dp_transport_recv_exact, a loss named as above. */
int dp_group_recv(const dp_group *g, int p, unsigned type, long step, uint64_t offset, void *dst,
                  size_t len, const char *what, dp_err *err);
/* Sends position p a frame: 0, or -1 naming p's loss. */
int dp_group_send(const dp_group *g, int p, unsigned type, long step, uint64_t offset,
                  const void *buf, size_t len, dp_err *err);

/* Records all R replicas contribute to step `step` (1-based) when replica
 * r's shard holds sizes[r] records, batch a step: every replica knows the
 * shards' sizes, so nobody sends them.  R == 1: n, this step's own. */
double dp_group_step_records(const uint32_t *sizes, int R, long step, long steps_per_epoch,
                             int batch, int n);

#endif
