/* A replica group: see group.h. */
#include "downpour/group.h"

#include <stdio.h>

const char *dp_group_name(const dp_group *g, int p)
{
    return dp_transport_peer_name(g->t, g->ranks[p]);
}

int dp_group_lost(const dp_group *g, int p, dp_err *err)
{
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return dp_errf(err, "lost %s %d of replica %d, %s (%s): %s, so the run stops", g->member,
                   p % g->width, g->replica0 + p / g->width, dp_group_name(g, p), why, g->cost);
}

int dp_group_lost_rank(const dp_group *g, int rank, dp_err *err)
{
    for (int p = 0; p < g->n; p++)
        if (g->ranks[p] == rank)
            return dp_group_lost(g, p, err);
    return -1;
}

int dp_group_recv(const dp_group *g, int p, unsigned type, long step, uint64_t offset, void *dst,
                  size_t len, const char *what, dp_err *err)
{
    int rc = dp_transport_recv_exact(g->t, g->ranks[p], type, (uint64_t)step, offset, dst, len,
                                     what, g->timeout, err);
    return rc == DP_RECV_LOST ? dp_group_lost(g, p, err) : rc;
}

int dp_group_send(const dp_group *g, int p, unsigned type, long step, uint64_t offset,
                  const void *buf, size_t len, dp_err *err)
{
    if (dp_transport_send(g->t, g->ranks[p], type, (uint64_t)step, offset, buf, len, err) < 0)
        return dp_group_lost(g, p, err);
    return 0;
}

double dp_group_step_records(const uint32_t *sizes, int R, long step, long steps_per_epoch,
                             int batch, int n)
{
    if (R == 1)
        return n;
    long k = (step - 1) % steps_per_epoch;
    double total = 0;
    for (int r = 0; r < R; r++) {
        long left = (long)sizes[r] - k * batch;
        total += left < 0 ? 0 : (left < batch ? left : batch);
    }
    return total;
}
