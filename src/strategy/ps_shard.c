/* One shard of a parameter server (ps_rules.h, "the shard"): its state,
 * opened from the start, its updates' bookkeeping and its replies.  Both
 * the server (ps.c) and its replication (ps_replica.c: a backup is a shard
 * of its own) build on it, so neither calls the other back: ps.c calls
 * ps_replica.c, and both call this. */
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/sparse.h"
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

void dp_ps_mirror_forget(server *s, const dp_ps_worker *w)
{
    if (s->mirror_ok)
        s->mirror_ok[w - s->w] = 0;
}

/* A coded answer (docs/strategies.md, "ps family: compression"): the 4-bit
 * difference from worker i's copy (k DELTA4), which the mirror takes as the
 * worker will; or the k parameters farthest from worker i's copy (top-k of params - mirror, ties:
 * the lower index), each sent as the server's own value, which the mirror
 * takes too: the worker, holding the mirror's bits, sets the same values and
 * holds them again.  What is not sent stays in the difference for the next
 * answer (error feedback on the way down).  A copy not known (mirror_ok 0)
 * is answered whole, f32, and becomes known. */
#define DELTA4 ((size_t)-1)
static int send_coded(server *s, int rank, int i, size_t k, dp_err *err)
{
    float *m = s->mirror + (size_t)i * s->n;
    long c = dp_ps_min_clock(s);
    /* the 4-bit difference of every parameter (compress.h), unless one is
     * not finite */
    if (s->mirror_ok[i] && k == DELTA4 && dp_delta4_encode(s->params, m, s->n, s->rout) == 0)
        return dp_transport_send(s->t, rank, DP_WIRE_PARAMS_CODED, (uint64_t)(c < 0 ? 0 : c),
                                 s->lo, s->rout, dp_delta4_bytes(s->n), err);
    if (!s->mirror_ok[i] || k == 0 || k > s->n) {
        memcpy(m, s->params, s->n * sizeof(float));
        s->mirror_ok[i] = 1;
        return dp_ps_send_params(s, rank, err);
    }
    for (size_t j = 0; j < s->n; j++)
        s->rdiff[j] = s->params[j] - m[j];
    uint8_t *body = s->rout + DP_CODED_HEAD_SIZE;
    dp_put_u32(s->rout, (uint32_t)DP_COMPRESS_TOPK);
    dp_put_u32(s->rout + 4, (uint32_t)k);
    dp_topk_encode(s->rdiff, s->n, k, s->rtmp, body);
    for (size_t j = 0; j < k; j++) {
        uint32_t at = dp_get_u32(body + 8 * j);
        m[at] = s->params[at];
        dp_put_f32(body + 8 * j + 4, m[at]);
    }
    return dp_transport_send(s->t, rank, DP_WIRE_PARAMS_CODED, (uint64_t)(c < 0 ? 0 : c), s->lo,
                             s->rout, DP_CODED_HEAD_SIZE + 8 * k, err);
}

/* A worker's answer: coded (--ps-reply topk, --compress auto), with
 * --ps-reply bf16 the shard rounded to bf16 (PARAMS16, half the bytes),
 * else the f32 PARAMS. */
int dp_ps_send_answer(server *s, int rank, dp_err *err)
{
    int i = rank >= 0 ? s->worker_of[rank] : -1;
    /* --compress auto: a coded push is answered with the 4-bit difference */
    if (s->mirror && i >= 0)
        return send_coded(s, rank, i,
                          s->cfg.reply_topk > 0 ? dp_topk_count(s->cfg.reply_topk, s->n)
                          : s->cfg.reply_delta4 || s->w[i].reply_k ? DELTA4
                                                                   : 0,
                          err);
    if (!s->out16)
        return dp_ps_send_params(s, rank, err);
    long m = dp_ps_min_clock(s);
    dp_compress_encode16(DP_COMPRESS_BF16, s->params, s->n, s->out16);
    return dp_transport_send(s->t, rank, DP_WIRE_PARAMS16, (uint64_t)(m < 0 ? 0 : m), s->lo,
                             s->out16, 2 * s->n, err);
}

void dp_ps_send_reply(server *s, dp_ps_worker *w)
{
    w->owed = 0;
    if (s->fenced)
        return; /* the backups may serve its shards now: it answers nobody */
    dp_err why;
    if (dp_ps_send_answer(s, w->rank, &why) < 0 && w->live) {
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

static int tables_open(server *s, const dp_ps_layout *layout, const dp_optim_config *optim,
                       const dp_ps_start *start, size_t n_params, dp_err *err);
static void tables_free(server *s);

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
    if (s->lo + s->n > n_params || (s->n && s->lo < start->shift)) {
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
    int chunked = cfg->chunks > 0 && rules->mode == DP_PS_SYNC;
    if (chunked) {
        s->chunk_buf = malloc((size_t)(s->n_workers ? s->n_workers : 1) * (size_t)cfg->chunks *
                              nn * sizeof(float));
        s->chunk_rec = calloc((size_t)(s->n_workers ? s->n_workers : 1), sizeof *s->chunk_rec);
        s->chunk_in = calloc((size_t)(s->n_workers ? s->n_workers : 1), 1);
    }
    /* --compress auto: each worker's own top-k count, at most the shard's n */
    size_t coded = cfg->compress.kind == DP_COMPRESS_AUTO ? DP_CODED_HEAD_SIZE + 8 * nn
                                                         : dp_coded_bytes(&cfg->compress, nn);
    if (coded)
        s->coded = malloc(coded);
    if (cfg->reply16)
        s->out16 = malloc(2 * nn);
    /* coded answers: a mirror of each worker's copy, W x n floats (bounded) */
    int mirrors = (cfg->reply_topk > 0 || cfg->reply_delta4 ||
                   cfg->compress.kind == DP_COMPRESS_AUTO) &&
                  !rules->pushes_params && s->n > 0;
    size_t nw = (size_t)(s->n_workers ? s->n_workers : 1);
    if (mirrors && nw * nn > DP_PS_MIRROR_MAX_FLOATS) {
        dp_ps_shard_free(s);
        return dp_errf(err, "coded answers keep a copy of the shard per worker: %zu worker(s) "
                            "x %zu floats is above the bound of %zu floats (docs/strategies.md, "
                            "\"ps family: compression\"); use --ps-reply f32 or bf16, or more "
                            "ps tasks",
                       nw, nn, (size_t)DP_PS_MIRROR_MAX_FLOATS);
    }
    if (mirrors) {
        s->mirror = malloc(nw * nn * sizeof(float));
        s->mirror_ok = calloc(nw, 1);
        s->rdiff = malloc(nn * sizeof(float));
        s->rtmp = malloc(nn * sizeof(float));
        s->rout = malloc(DP_CODED_HEAD_SIZE + 8 * nn);
    }
    if ((mirrors && (!s->mirror || !s->mirror_ok || !s->rdiff || !s->rtmp || !s->rout)) ||
        !s->w || !s->worker_of || !s->params || !s->scratch || !s->sum ||
        (cfg->ema > 0 && !s->ema) || (coded && !s->coded) || (cfg->reply16 && !s->out16) ||
        (chunked && (!s->chunk_buf || !s->chunk_rec || !s->chunk_in))) {
        dp_ps_shard_free(s);
        return dp_errf(err, "out of memory for a shard of %zu parameters", s->n);
    }
    if (dp_optim_init(&s->opt, optim, nn, err) < 0 ||
        tables_open(s, layout, optim, start, n_params, err) < 0) {
        dp_ps_shard_free(s);
        return -1;
    }
    s->base_step = start->step;
    /* the start's vectors lack the compact tables (shift): dense j at j - shift */
    size_t at = s->n ? s->lo - start->shift : 0, len = n_params - start->shift;
    take_slice(s->params, start->params, at, s->n);
    if (s->ema)
        take_slice(s->ema, start->ema ? start->ema : start->params, at, s->n);
    if (start->slots) {
        for (int k = 0; k < dp_optim_slots(optim->kind); k++)
            take_slice(s->opt.state + (size_t)k * s->n, start->slots + (size_t)k * len, at,
                       s->n);
        s->opt.t = start->t;
    }
    /* Coded answers: every worker of a fresh or resumed run starts from the
     * start's parameters (ps_family.c), so its copy is known; a restarted
     * server's (clocks) and a backup's are not: answered whole first. */
    for (size_t i = 0; s->mirror && !start->clocks && layout->rank[s->shard] == me && i < nw;
         i++) {
        memcpy(s->mirror + i * s->n, s->params, s->n * sizeof(float));
        s->mirror_ok[i] = 1;
    }
    for (int r = 0; r < c->n_tasks; r++)
        s->worker_of[r] = -1;
    for (int i = 0; i < s->n_workers; i++) {
        s->w[i].rank = dp_cluster_rank(c, DP_ROLE_WORKER, i);
        s->w[i].spare = !start->clocks && i >= s->n_workers - start->spare_workers;
        s->w[i].live = start->clocks ? start->clocks[i] >= 0 : !s->w[i].spare;
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
    tables_free(s);
    dp_optim_free(&s->opt);
    free(s->w);
    free(s->worker_of);
    free(s->params);
    free(s->ema);
    free(s->scratch);
    free(s->sum);
    free(s->chunk_buf);
    free(s->chunk_rec);
    free(s->chunk_in);
    free(s->coded);
    free(s->out16);
    free(s->mirror);
    free(s->mirror_ok);
    free(s->rdiff);
    free(s->rtmp);
    free(s->rout);
    free(s);
}


/* ---------------------------------------------------------------- sparse rows */

/* A table's rows on shard `shard` of S: ids shard, shard + S, ... */
static long local_rows(long rows, int shard, int S)
{
    return shard >= 0 && rows > shard ? (rows - 1 - shard) / S + 1 : 0;
}

static int tables_open(server *s, const dp_ps_layout *layout, const dp_optim_config *optim,
                       const dp_ps_start *start, size_t n_params, dp_err *err)
{
    const dp_ps_config *cfg = &s->cfg;
    s->n_shards = layout->n_shards;
    if (cfg->n_tables <= 0)
        return 0;
    if (!(s->tab = calloc((size_t)cfg->n_tables, sizeof *s->tab)))
        return dp_errf(err, "out of memory");
    s->n_tab = cfg->n_tables;
    int S = s->n_shards, n_slots = dp_optim_slots(optim->kind);
    size_t fwd = 0;
    const float *from = start->rows;
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        const dp_ps_table_spec *sp = &cfg->tables[k];
        t->off = sp->off;
        t->rows = sp->rows;
        t->width = (int)sp->width;
        if (t->off + (size_t)t->rows * (size_t)t->width > n_params || t->width < 1)
            return dp_errf(err, "sparse table %d ([%zu, +%ld x %d)) lies outside the %zu "
                                "parameters", k, t->off, t->rows, t->width, n_params);
        t->local = local_rows(t->rows, s->shard, S);
        size_t nl = (size_t)t->local * (size_t)t->width, nn = nl ? nl : 1;
        size_t nr = t->local ? (size_t)t->local : 1;
        t->params = malloc(nn * sizeof(float));
        t->sum = malloc(nn * sizeof(float));
        t->grad = malloc(nn * sizeof(float));
        t->mark = calloc(nr, 1);
        t->touched = malloc(nr * sizeof(uint32_t));
        t->ids = malloc(nr * sizeof(uint32_t));
        if (!t->params || !t->sum || !t->grad || !t->mark || !t->touched || !t->ids)
            return dp_errf(err, "out of memory for %ld rows of sparse table %d", t->local, k);
        if (dp_optim_init(&t->opt, optim, nn, err) < 0)
            return -1;
        t->opt.n = nl; /* dp_optim_apply_rows never reaches past the rows held */
        size_t w = (size_t)t->width;
        if (start->rows) { /* local order already: the rows, then each slot's */
            memcpy(t->params, from, nl * sizeof(float));
            from += nl;
            for (int q = 0; q < n_slots && start->slots; q++, from += nl)
                memcpy(t->opt.state + (size_t)q * nl, from, nl * sizeof(float));
        } else if (start->read_rows && start->shift) { /* resumed: from the checkpoint, by rows */
            for (int q = 0; q <= (start->slots ? n_slots : 0); q++)
                if (start->read_rows(start->read_ctx, s->shard, S, k, q,
                                     q ? t->opt.state + (size_t)(q - 1) * nl : t->params,
                                     (size_t)t->local, err) < 0)
                    return -1;
        } else if (!start->shift) {
            for (long j = 0; j < t->local; j++) {
                size_t id = (size_t)s->shard + (size_t)j * (size_t)S;
                memcpy(t->params + j * w, start->params + t->off + id * w, w * sizeof(float));
                for (int q = 0; q < n_slots && start->slots; q++)
                    memcpy(t->opt.state + (size_t)q * nl + j * w,
                           start->slots + (size_t)q * n_params + t->off + id * w,
                           w * sizeof(float));
            }
        }
        if (start->slots)
            t->opt.t = start->t;
        fwd += 4 + (size_t)t->local * (4 + 4 * w);
    }
    /* drawn here, each row as the whole model draws it */
    if (!start->rows && !start->read_rows && start->shift && s->shard >= 0) {
        float *dst[DP_PS_MAX_TABLES];
        for (int k = 0; k < s->n_tab; k++)
            dst[k] = s->tab[k].params;
        if (!start->init_rows ||
            start->init_rows(start->init_ctx, s->shard, S, dst, s->n_tab) < 0)
            return dp_errf(err, "shard %d: cannot draw the initial rows of its %d sparse "
                                "table(s)", s->shard, s->n_tab);
    }
    if (cfg->replicas > 1 && !(s->fwd = malloc(fwd ? fwd : 1)))
        return dp_errf(err, "out of memory");
    return 0;
}

static void tables_free(server *s)
{
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        free(t->params);
        free(t->sum);
        free(t->grad);
        free(t->mark);
        free(t->touched);
        free(t->ids);
        dp_optim_free(&t->opt);
    }
    free(s->tab);
    free(s->fwd);
}

size_t dp_ps_rows_local_floats(const server *s)
{
    size_t n = 0;
    for (int k = 0; k < s->n_tab; k++)
        n += (size_t)s->tab[k].local * (size_t)s->tab[k].width;
    return n;
}

int dp_ps_rows_read(server *s, int peer, uint64_t len, int with_rows, const char *who,
                    dp_err *err)
{
    if (s->n_tab == 0)
        return dp_errf(err, "%s sent sparse rows; this run moves no table by rows", who);
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        uint8_t raw[4];
        if (len < 4)
            return dp_errf(err, "%s sent a rows section that ends before table %d's count", who,
                           k);
        if (dp_transport_recv_payload(s->t, peer, raw, 4, err) < 0)
            return -1;
        len -= 4;
        uint32_t count = dp_get_u32(raw);
        uint64_t per = 4 + (with_rows ? 4 * (uint64_t)t->width : 0);
        /* bounded before anything is read into the buffers */
        if (count > (uint64_t)t->local || (uint64_t)count * per > len)
            return dp_errf(err, "%s sent %u rows of sparse table %d; shard %d holds %ld of them "
                                "and %llu bytes are left in the frame",
                           who, count, k, s->shard, t->local, (unsigned long long)len);
        if (count && dp_transport_recv_payload(s->t, peer, t->ids, count * sizeof(uint32_t),
                                               err) < 0)
            return -1;
        len -= 4 * (uint64_t)count;
        for (uint32_t i = 0, prev = 0; i < count; i++) {
            uint32_t id = dp_get_u32((const uint8_t *)&t->ids[i]);
            if (id >= (uint64_t)t->rows || (long)(id % (uint32_t)s->n_shards) != s->shard ||
                (i > 0 && id <= prev))
                return dp_errf(err, "%s sent row id %u (entry %u) of sparse table %d: ids must be "
                                    "below its %ld rows, held by this shard (id mod %d = %d) and "
                                    "strictly increasing",
                               who, id, i, k, t->rows, s->n_shards, s->shard);
            prev = id;
            t->ids[i] = id / (uint32_t)s->n_shards; /* the local row */
        }
        t->n_ids = count;
        if (with_rows && count) {
            size_t bytes = (size_t)count * (size_t)t->width * sizeof(float);
            if (dp_transport_recv_payload(s->t, peer, t->grad, bytes, err) < 0)
                return -1;
            len -= bytes;
        }
        t->up_ids = t->ids;
        t->up_n = with_rows ? count : 0;
        t->up_g = t->grad;
        t->up_indexed = 0;
    }
    if (len != 0)
        return dp_errf(err, "%s sent %llu bytes after its rows section", who,
                       (unsigned long long)len);
    return 0;
}

void dp_ps_rows_apply(server *s, float lr)
{
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        dp_optim_step st = dp_optim_begin(&t->opt, lr);
        dp_optim_apply_rows(&t->opt, &st, t->params, t->up_g, t->up_ids, (size_t)t->up_n,
                            (size_t)t->width, t->up_indexed);
        t->up_n = 0;
    }
}

size_t dp_ps_rows_put(server *s)
{
    uint8_t *p = s->fwd;
    for (int k = 0; k < s->n_tab; k++) {
        const dp_ps_table *t = &s->tab[k];
        size_t w = (size_t)t->width;
        dp_put_u32(p, (uint32_t)t->up_n);
        p += 4;
        for (long i = 0; i < t->up_n; i++, p += 4)
            dp_put_u32(p, t->up_ids[i] * (uint32_t)s->n_shards + (uint32_t)s->shard);
        for (long i = 0; i < t->up_n; i++, p += 4 * w)
            memcpy(p, t->up_g + (t->up_indexed ? t->up_ids[i] : (size_t)i) * w, 4 * w);
    }
    return (size_t)(p - s->fwd);
}

/* In the order first pushed, each row's sum starts from its first push, as
 * the dense round's does (a row no push touched is a zero that stays zero). */
void dp_ps_rows_round_add(server *s, float r)
{
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        size_t w = (size_t)t->width;
        for (long i = 0; i < t->n_ids; i++) {
            uint32_t j = t->ids[i];
            float *dst = t->sum + (size_t)j * w;
            const float *g = t->grad + (size_t)i * w;
            if (!t->mark[j]) {
                t->mark[j] = 1;
                t->touched[t->n_touched++] = j;
                for (size_t e = 0; e < w; e++)
                    dst[e] = g[e] * r;
            } else {
                for (size_t e = 0; e < w; e++)
                    dst[e] += g[e] * r;
            }
        }
        t->up_n = 0; /* the push is in the round now */
    }
}

void dp_ps_rows_round_mean(server *s, float scale)
{
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        size_t w = (size_t)t->width;
        dp_sort_u32(t->touched, (size_t)t->n_touched); /* a section's ids increase */
        for (long i = 0; i < t->n_touched; i++) {
            float *v = t->sum + (size_t)t->touched[i] * w;
            for (size_t e = 0; e < w; e++)
                v[e] *= scale;
        }
        t->up_ids = t->touched;
        t->up_n = t->n_touched;
        t->up_g = t->sum;
        t->up_indexed = 1;
    }
}

void dp_ps_rows_round_clear(server *s)
{
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        for (long i = 0; i < t->n_touched; i++)
            t->mark[t->touched[i]] = 0;
        t->n_touched = 0;
    }
}

int dp_ps_rows_send(server *s, int rank, dp_err *err)
{
    struct iovec iov[DP_PS_MAX_TABLES];
    int n = 0;
    for (int k = 0; k < s->n_tab; k++) {
        dp_ps_table *t = &s->tab[k];
        size_t w = (size_t)t->width;
        for (long i = 0; i < t->n_ids; i++)
            memcpy(t->grad + (size_t)i * w, t->params + (size_t)t->ids[i] * w, w * sizeof(float));
        iov[n++] = (struct iovec){t->grad, (size_t)t->n_ids * w * sizeof(float)};
    }
    long m = dp_ps_min_clock(s);
    return dp_transport_sendv(s->t, rank, DP_WIRE_ROWS, (uint64_t)(m < 0 ? 0 : m), s->lo, iov, n,
                              err);
}

int dp_ps_table_send(server *s, int rank, const uint8_t *ask, const char *who, dp_err *err)
{
    uint32_t k = dp_get_u32(ask), part = dp_get_u32(ask + 4), first = dp_get_u32(ask + 8),
             n = dp_get_u32(ask + 12);
    if (k >= (uint32_t)s->n_tab)
        return dp_errf(err, "%s asked for rows of sparse table %u; this run moves %d table(s) by "
                            "rows", who, k, s->n_tab);
    dp_ps_table *t = &s->tab[k];
    size_t w = (size_t)t->width, per = dp_ps_state_chunk_rows(&s->cfg, w);
    uint32_t parts = 1 + (t->opt.state ? (uint32_t)dp_optim_slots(t->opt.cfg.kind) : 0);
    if (part >= parts)
        return dp_errf(err, "%s asked for part %u of sparse table %u; it has %u (the rows and "
                            "each optimiser slot)", who, part, k, parts);
    if (n == 0 || n > per || first > (uint64_t)t->local || n > (uint64_t)t->local - first)
        return dp_errf(err, "%s asked for rows [%u, +%u) of sparse table %u; this shard holds "
                            "%ld, and a chunk is 1 to %zu rows", who, first, n, k, t->local, per);
    const float *v = part == 0 ? t->params : t->opt.state + (size_t)(part - 1) * t->opt.n;
    uint8_t h[DP_PS_STATE_ROWS_HEAD];
    memcpy(h, ask, sizeof h); /* the chunk's head: what was asked, checked */
    /* straight from the table: no copy, and no frame above a chunk */
    struct iovec iov[2] = {{h, sizeof h}, {(void *)(v + (size_t)first * w), n * w * sizeof(float)}};
    long m = dp_ps_min_clock(s);
    return dp_transport_sendv(s->t, rank, DP_WIRE_TABLE_ROWS, (uint64_t)(m < 0 ? 0 : m), s->lo,
                              iov, 2, err);
}
