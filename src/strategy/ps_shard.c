/* One shard of a parameter server (ps_rules.h, "the shard"): its state,
 * opened from the start, its updates' bookkeeping and its replies.  Both
 * the server (ps.c) and its replication (ps_replica.c: a backup is a shard
 * of its own) build on it, so neither calls the other back: ps.c calls
 * ps_replica.c, and both call this. */
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/wire.h"
#include "strategy/ps_rules.h"

typedef struct dp_ps_server server;

static const char *self_name(const server *s)
{
    return dp_transport_peer_name(s->t, dp_transport_rank(s->t));
}

long dp_ps_min_clock(const server *s)
{
    long m = -1;
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].live && !s->w[i].unsynced && (m < 0 || s->w[i].clock < m))
            m = s->w[i].clock;
    return m;
}

int dp_ps_send_params(server *s, int rank, dp_err *err)
{
    long m = dp_ps_min_clock(s);
    return dp_transport_send(s->t, rank, DP_WIRE_PARAMS, (uint64_t)(m < 0 ? 0 : m), s->lo,
                             s->params, s->n * sizeof(float), err);
}

void dp_ps_send_reply(server *s, dp_ps_worker *w)
{
    w->owed = 0;
    if (s->fenced)
        return; /* the backups may serve its shards now: it answers nobody */
    dp_err why;
    if (dp_ps_send_params(s, w->rank, &why) < 0 && w->live) {
        dp_warn("fault: cannot send %s its parameters (%s); %s goes on without it",
                dp_transport_peer_name(s->t, w->rank), why.msg, self_name(s));
        w->live = 0;
        s->dropped = 1;
    }
}

/* The pushes an update carries: the one being handled (a rule that applies
 * at once), or every push of the round being closed. */
void dp_ps_note_applied(server *s)
{
    if (s->pusher && s->round_pushes == 0) {
        s->pusher->applied = s->pusher->step;
        return;
    }
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].pending)
            s->w[i].applied = s->w[i].step;
}

/* Every change of the shard's parameters (an optimiser update, or a
 * model-avg round) counts as an update and moves the moving average. */
void dp_ps_shard_changed(server *s)
{
    s->updates++;
    if (s->ema) {
        float d = s->cfg.ema, e = 1.0f - d;
        float *restrict a = s->ema;
        const float *restrict p = s->params;
        for (size_t i = 0; i < s->n; i++)
            a[i] = d * a[i] + e * p[i];
    }
}

/* Copies this shard's slice of a full-length vector (or of each slot of a
 * full-length optimiser state) into the server. */
static void take_slice(float *dst, const float *full, size_t lo, size_t n)
{
    memcpy(dst, full + lo, n * sizeof(float));
}

int dp_ps_shard_open(dp_ps_server **out, dp_transport *t, const dp_cluster *c,
                     const dp_ps_layout *layout, const dp_ps_config *cfg,
                     const dp_ps_rules *rules, const dp_optim_config *optim,
                     const dp_ps_start *start, size_t n_params, int shard, dp_err *err)
{
    server *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->t = t;
    s->cfg = *cfg;
    s->rules = rules;
    s->chief = dp_cluster_rank(c, DP_ROLE_CHIEF, 0);
    s->chief_live = s->chief >= 0;
    s->backup_rank = -1;
    s->primary_rank = -1;
    int me = dp_transport_rank(t);
    s->shard = shard;
    if (s->shard < 0) {
        if (cfg->replicas < 2)
            dp_info("%s holds no shard (%d shard(s) for %d ps task(s)); it idles until the end",
                    dp_transport_peer_name(t, me), layout->n_shards, c->count[DP_ROLE_PS]);
    } else {
        s->lo = layout->range[s->shard].lo;
        s->n = layout->range[s->shard].hi - s->lo;
    }
    if (s->lo + s->n > n_params) {
        dp_ps_shard_free(s);
        return dp_errf(err, "shard [%zu, %zu) lies outside the %zu parameters", s->lo,
                       s->lo + s->n, n_params);
    }
    s->n_workers = c->count[DP_ROLE_WORKER];
    s->w = calloc((size_t)(s->n_workers ? s->n_workers : 1), sizeof *s->w);
    s->worker_of = malloc((size_t)c->n_tasks * sizeof *s->worker_of);
    size_t nn = s->n ? s->n : 1;
    s->params = malloc(nn * sizeof(float));
    if (cfg->ema > 0)
        s->ema = malloc(nn * sizeof(float));
    s->scratch = malloc(nn * sizeof(float));
    s->sum = malloc(nn * sizeof(float));
    if (!s->w || !s->worker_of || !s->params || !s->scratch || !s->sum ||
        (cfg->ema > 0 && !s->ema)) {
        dp_ps_shard_free(s);
        return dp_errf(err, "out of memory for a shard of %zu parameters", s->n);
    }
    if (dp_optim_init(&s->opt, optim, nn, err) < 0) {
        dp_ps_shard_free(s);
        return -1;
    }
    s->base_step = start->step;
    take_slice(s->params, start->params, s->lo, s->n);
    if (s->ema)
        take_slice(s->ema, start->ema ? start->ema : start->params, s->lo, s->n);
    if (start->slots) {
        for (int k = 0; k < dp_optim_slots(optim->kind); k++)
            take_slice(s->opt.state + (size_t)k * s->n, start->slots + (size_t)k * n_params,
                       s->lo, s->n);
        s->opt.t = start->t;
    }
    for (int r = 0; r < c->n_tasks; r++)
        s->worker_of[r] = -1;
    for (int i = 0; i < s->n_workers; i++) {
        s->w[i].rank = dp_cluster_rank(c, DP_ROLE_WORKER, i);
        s->w[i].live = start->clocks ? start->clocks[i] >= 0 : 1;
        s->w[i].clock = start->clocks && start->clocks[i] > 0 ? start->clocks[i] : 0;
        s->w[i].unsynced = start->clocks && start->clocks[i] >= 0;
        s->restored |= s->w[i].unsynced;
        s->worker_of[s->w[i].rank] = i;
    }
    if (s->n && layout->rank[s->shard] == me) /* debug: the task's summary line said the rest */
        dp_debug("%s serves parameters [%zu, %zu) (%zu floats, %.1f KiB) in %s mode%s",
                dp_transport_peer_name(t, me), s->lo, s->lo + s->n, s->n, s->n * 4 / 1024.0,
                s->rules->name, start->slots ? ", resumed" : "");
    *out = s;
    return 0;
}

void dp_ps_shard_free(dp_ps_server *s)
{
    if (!s)
        return;
    free(s->table);
    dp_optim_free(&s->opt);
    free(s->w);
    free(s->worker_of);
    free(s->params);
    free(s->ema);
    free(s->scratch);
    free(s->sum);
    free(s);
}

