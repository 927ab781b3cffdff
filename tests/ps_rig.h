/* A chief (rank 0), its workers and two parameter servers on the
 * in-process transport, each server polled by a thread of its own until
 * the chief's SHUTDOWN (test_ps_sparse, test_ps_compress, test_ps_reply).
 * Each test opens the servers its own way, then rig_serve; rig_close and
 * crash_ps are shared, and so are the dense tests' opening steps
 * (rig_begin, then the test's own cfg fields, then rig_open_servers). */
#ifndef DP_TEST_PS_RIG_H
#define DP_TEST_PS_RIG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/cluster.h"
#include "downpour/inproc.h"
#include "downpour/ps.h"
#include "downpour/wire.h"

typedef struct rig {
    dp_cluster c;
    dp_transport *ts[8];
    int n, ps0, workers;
    dp_ps_layout layout;
    dp_ps_config cfg;
    dp_ps_server *s[2];
    pthread_t th[2];
    atomic_int stop[2];
    int stopped[2];
    struct serving {
        dp_ps_server *s;
        atomic_int *stop;
    } sv[2];
} rig;

/* A chief, one worker and two ps tasks on ports from base_port, and an
 * asynchronous ps configuration sending cz's pushes, every shard as small
 * as one float allows. */
static inline void rig_begin(rig *r, int base_port, const dp_compress *cz)
{
    int ports[8];
    const char *names[8];
    dp_err e;
    memset(r, 0, sizeof *r);
    r->n = 4; /* chief, worker, 2 ps */
    r->ps0 = 2;
    for (int i = 0; i < r->n; i++)
        ports[i] = base_port + i;
    REQUIRE(dp_cluster_local(&r->c, 1, 1, 2, ports, &e) == 0);
    for (int i = 0; i < r->n; i++)
        names[i] = r->c.tasks[i].name;
    REQUIRE(dp_inproc_open_named(r->ts, r->n, names, &e) == 0);
    dp_ps_config_init(&r->cfg);
    r->cfg.mode = DP_PS_ASYNC;
    r->cfg.min_shard_bytes = sizeof(float);
    r->cfg.compress = *cz;
}

/* The layout (two shards of np parameters) and both servers, sgd at lr
 * 0.05, starting from start. */
static inline void rig_open_servers(rig *r, const float *start, size_t np)
{
    dp_err e;
    REQUIRE(dp_ps_layout_make(&r->layout, &r->c, np, &r->cfg, &e) == 0);
    REQUIRE(r->layout.n_shards == 2);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 0.05f;
    dp_ps_start st = {.params = start};
    for (int k = 0; k < 2; k++)
        REQUIRE(dp_ps_server_open(&r->s[k], r->ts[r->ps0 + k], &r->c, &r->layout, &r->cfg, &oc,
                                  &st, np, &e) == 0);
}

static inline void *serve_thread(void *arg)
{
    struct serving *v = arg;
    dp_err e;
    int rc;
    while (!atomic_load(v->stop) && (rc = dp_ps_server_poll(v->s, 0.02, &e)) == 0)
        ;
    if (!atomic_load(v->stop) && rc < 0)
        fprintf(stderr, "server: %s\n", e.msg);
    return NULL;
}

/* Both servers open: each polled by its own thread. */
static void rig_serve(rig *r)
{
    for (int k = 0; k < 2; k++) {
        r->sv[k] = (struct serving){r->s[k], &r->stop[k]};
        REQUIRE(pthread_create(&r->th[k], NULL, serve_thread, &r->sv[k]) == 0);
    }
}

static void rig_close(rig *r, int threads)
{
    dp_err e;
    for (int k = 0; k < 2; k++) {
        if (threads && !r->stopped[k]) {
            REQUIRE(dp_transport_send(r->ts[0], r->ps0 + k, DP_WIRE_SHUTDOWN, 0, 0, NULL, 0,
                                      &e) == 0);
            pthread_join(r->th[k], NULL);
        }
        dp_ps_server_close(r->s[k]);
    }
    for (int i = 0; i < r->n; i++)
        dp_transport_close(r->ts[i]);
    dp_cluster_free(&r->c);
}

/* Server k stops dead: its thread ends, its transport crashes. */
static inline void crash_ps(rig *r, int k)
{
    dp_err e;
    atomic_store(&r->stop[k], 1);
    pthread_join(r->th[k], NULL);
    r->stopped[k] = 1;
    REQUIRE(dp_inproc_kill(r->ts[r->ps0 + k], DP_INPROC_CRASH, &e) == 0);
}

#endif
