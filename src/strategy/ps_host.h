/* --ps-push host|auto under ps-sync (docs/strategies.md, "ps-sync: one push
 * per host"): the workers that share a host sum their gradients inside it
 * (through the transport's shared memory) and one of them, the host's
 * leader, pushes the sum to every shard and hands the answer to the others.
 *   the hosts   at the start every worker tells every other which workers
 *               share its host (dp_transport_same_host), so all of them
 *               hold one map; a host is the workers both sides say share
 *               it with its lowest-indexed worker, who leads it;
 *   the choice  host: pushes by host wherever a host has several workers;
 *               auto: by worker where every shard's server shares the
 *               host; else the leader times a pull from the servers and an
 *               echo with a member, and pushes by host where the servers'
 *               link is the slower by a margin; it tells its members;
 *   a step      member: its gradient times its records to the leader, the
 *               parameters back; leader: the sum, own share first and the
 *               members' in index order, pushed as one PUSH_HOST;
 *   faults      a lost member is left out from then on; a member whose
 *               leader is lost pushes on its own from that step (a server
 *               that counted its share through the leader only answers it),
 *               docs/faults.md, "One push per host". */
#ifndef DOWNPOUR_STRATEGY_PS_HOST_H
#define DOWNPOUR_STRATEGY_PS_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/cluster.h"
#include "downpour/ps.h"
#include "downpour/transport.h"

enum { DP_PS_PUSH_WORKER, DP_PS_PUSH_HOST, DP_PS_PUSH_AUTO };
/* "worker", "host" or "auto" (NULL: worker); -1 otherwise. */
int dp_ps_push_parse(const char *name);

typedef struct dp_ps_host {
    dp_transport *t;
    int on;           /* pushes by host are in effect for this worker */
    int lead;         /* it leads its host */
    int n;            /* its host's workers (itself included), leader first */
    int *rank;        /* their transport ranks */
    uint32_t *index;  /* their worker indices */
    unsigned char *live; /* leader: a member not lost */
    uint8_t *members; /* leader: a push's [u32 m][m u32 worker indices] */
    float *buf;       /* leader: the sum; member: its weighted gradient */
    uint8_t *share;   /* leader: a member's share as it comes (head, floats) */
    size_t np;
    double timeout;
    char why[384];    /* the choice, and why */
} dp_ps_host;

/* Forms the hosts and makes the choice (mode DP_PS_PUSH_HOST or _AUTO;
 * worker = this worker's index; layout: the shards, whose servers auto
 * asks the transport about; params: a buffer of np floats auto's pull may
 * fill with the servers' parameters, the ones the worker holds).  At
 * the run's first start only, every first-started worker at once.  0, or
 * -1 with err. */
int dp_ps_host_open(dp_ps_host *h, dp_transport *t, const dp_cluster *c, int worker, int mode,
                    dp_ps_client *client, const dp_ps_layout *layout, float *params, size_t np,
                    double timeout, dp_err *err);
/* One step while h->on: the leader's or a member's part; a member whose
 * leader is lost turns h->on off and pushes on its own. */
int dp_ps_host_step(dp_ps_host *h, dp_ps_client *client, float *params, const float *grads,
                    int records, float lr, long step, dp_err *err);
void dp_ps_host_close(dp_ps_host *h);

#endif
