/* One model replica split over K tasks: see mp_replica.h. */
#include "exec/mp_replica.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/group.h"
#include "downpour/layer_kind.h"
#include "downpour/layers.h"
#include "downpour/wire.h"
#include "downpour/sender.h"

struct mp_replica {
    dp_transport *t;
    int K, task, replica;
    int *ranks;           /* the replica's transport ranks, in task order */
    mp_plan *plans;       /* every task's slices */
    const mp_plan *plan;  /* this task's */
    int rows;             /* the largest batch a step takes */
    float *act[DP_MAX_DENSE]; /* each dense layer's full output (rows, out) */
    float *dbuf[2];       /* input gradients, ping-pong (rows, max_width) */
    float *pack, *unpack; /* one task's columns (rows, max_units) */
    float *blocks;        /* a partial input gradient, peer by peer (rows, max_width) */
    dp_sender *tx;           /* the exchanges' sends */
    double timeout;
    /* image layers (docs/architecture.md, "Model parallelism"): every buffer in
     * the full layout, of which a ROWS layer holds its band (and halo rows) */
    int n_img;
    dp_layer L[DP_MAX_LAYERS];   /* the model's image layers */
    dp_layer loss;               /* the model's last layer, the loss */
    dp_layer units[DP_MAX_DENSE]; /* the layers split by units (dense), in order */
    float *iact[DP_MAX_LAYERS];  /* image layer i's output (rows, out) */
    float *igrad[DP_MAX_LAYERS]; /* the gradient there (rows, out) */
    float *keep[DP_MAX_LAYERS];  /* lcn: what its backward needs */
    float *filt[DP_MAX_LAYERS];  /* conv: the full filters, weights then biases */
    int chunk[DP_MAX_LAYERS];    /* lowered layers: records lowered at a time */
    float *fgrad;                /* conv: this task's part of a full filter gradient */
    float *low, *dlow, *band;    /* a chunk's lowered band, its gradient, its product */
    float *ipack, *iunpack;      /* K blocks of iblock floats to send; one received */
    size_t iblock;
    dp_group g;                  /* the replica's tasks, each loss named (group.h) */
};

/* Lowered layers (conv, local) lower this many floats of a band at a time,
 * at least their kind's min_chunk records (as src/nn/model.c does). */
#define BAND_BUDGET (1u << 20)

static int wait_sent(mp_replica *s, dp_err *err)
{
    int rank;
    if (dp_sender_wait(s->tx, dp_sender_last(s->tx), &rank, err) < 0)
        return dp_group_lost_rank(&s->g, rank, err);
    return 0;
}

/* The replica's tasks swap their columns of dense layer d's output: after
 * it every task holds the full (rows, out) output. */
static int all_gather(mp_replica *s, int d, int rows, long step, dp_err *err)
{
    const mp_layer *l = &s->plan->layer[d];
    int rank;
    mp_pack(s->pack, s->act[d], rows, l->out, l->lo, l->hi);
    size_t len = (size_t)rows * (size_t)(l->hi - l->lo) * sizeof(float);
    for (int q = 0; q < s->K; q++)
        if (q != s->task && dp_sender_push(s->tx, s->ranks[q], DP_WIRE_MP_ACT,
                                           (uint64_t)step, (uint64_t)d, s->pack, len, &rank,
                                           err) < 0)
            return dp_group_lost_rank(&s->g, rank, err);
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        const mp_layer *lq = &s->plans[q].layer[d];
        if (dp_group_recv(&s->g, q, DP_WIRE_MP_ACT, step, (uint64_t)d, s->unpack,
                          (size_t)rows * (size_t)(lq->hi - lq->lo) * sizeof(float),
                          "its columns of a layer's output", err) < 0)
            return -1;
        mp_unpack(s->act[d], s->unpack, rows, l->out, lq->lo, lq->hi);
    }
    /* everything out before the ring's inline sends (one order per peer) */
    return wait_sent(s, err);
}

/* The replica sums its tasks' parts of the gradient at dense layer d's
 * input, din (rows, in): each task ends with the sum in the columns it owns
 * of layer d-1 (the only ones its backward reads); the other columns of din
 * are left as they were.  Each part of a column is added by its owner in
 * task order, so the sum is the same whoever computes it. */
static int reduce_scatter(mp_replica *s, int d, float *din, int rows, long step, dp_err *err)
{
    int width = s->plan->layer[d].in, rank;
    const mp_layer *mine = &s->plan->layer[d - 1];
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        const mp_layer *lq = &s->plans[q].layer[d - 1];
        float *block = s->blocks + (size_t)rows * lq->lo;
        mp_pack(block, din, rows, width, lq->lo, lq->hi);
        if (dp_sender_push(s->tx, s->ranks[q], DP_WIRE_MP_GRAD, (uint64_t)step, (uint64_t)d,
                           block, (size_t)rows * (size_t)(lq->hi - lq->lo) * sizeof(float), &rank,
                           err) < 0)
            return dp_group_lost_rank(&s->g, rank, err);
    }
    int u = mine->hi - mine->lo;
    /* the sum starts from this task's own part, in the packed layout */
    float *sum = s->blocks + (size_t)rows * mine->lo;
    mp_pack(sum, din, rows, width, mine->lo, mine->hi);
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        if (dp_group_recv(&s->g, q, DP_WIRE_MP_GRAD, step, (uint64_t)d, s->unpack,
                          (size_t)rows * u * sizeof(float), "its part of an input gradient",
                          err) < 0)
            return -1;
        float *restrict a = sum;
        const float *restrict b = s->unpack;
        for (size_t i = 0; i < (size_t)rows * u; i++)
            a[i] += b[i];
    }
    mp_unpack(din, sum, rows, width, mine->lo, mine->hi);
    /* the packed blocks stay in use until they are out */
    return wait_sent(s, err);
}

/* ------------------------------------------------------- image layers */

/* Rows [a, b) of each of n records of a (n, per) image whose rows hold `row`
 * floats, packed into dst; back (add: added to dst). */
static void pack_rows(float *dst, const float *src, int n, size_t per, size_t row, int a, int b)
{
    size_t len = (size_t)(b - a) * row;
    for (int r = 0; r < n; r++)
        memcpy(dst + (size_t)r * len, src + (size_t)r * per + (size_t)a * row,
               len * sizeof(float));
}

static void unpack_rows(float *dst, const float *src, int n, size_t per, size_t row, int a,
                        int b, int add)
{
    size_t len = (size_t)(b - a) * row;
    for (int r = 0; r < n; r++) {
        float *restrict d = dst + (size_t)r * per + (size_t)a * row;
        const float *restrict x = src + (size_t)r * len;
        if (add)
            for (size_t e = 0; e < len; e++)
                d[e] += x[e];
        else
            memcpy(d, x, len * sizeof(float));
    }
}

/* The output rows of image layer i that task q computes (a FULL layer: all). */
static void band_of(const mp_replica *s, int q, int i, int *a, int *b)
{
    const mp_img *g = &s->plans[q].img[i];
    *a = g->rows ? g->y0 : 0;
    *b = g->rows ? g->y1 : s->L[i].oh;
}

/* The rows of layer i-1's output that task q's layer i reads (i = n_img, the
 * first dense layer: all). */
static void need_of(const mp_replica *s, int q, int i, int *a, int *b)
{
    if (i < s->n_img && s->plans[q].img[i].rows) {
        *a = s->plans[q].img[i].iy0;
        *b = s->plans[q].img[i].iy1;
    } else {
        *a = 0;
        *b = s->L[i - 1].oh;
    }
}

static int max_i(int a, int b) { return a > b ? a : b; }
static int min_i(int a, int b) { return a < b ? a : b; }

/* Before layer i (1 <= i <= n_img) reads the output of ROWS layer i-1: each
 * task sends each other the rows of its band the other reads (the halo, or
 * the whole band for a FULL layer or the first dense one) and puts the rows
 * it gets in place.  Only rows some window reads cross the wire. */
static int rows_exchange(mp_replica *s, int i, int n, long step, dp_err *err)
{
    int pl = i - 1, rank, a, b, my0, my1;
    const dp_layer *P = &s->L[pl];
    size_t per = (size_t)P->out, row = (size_t)P->ow * P->oc;
    float *act = s->iact[pl];
    band_of(s, s->task, pl, &my0, &my1);
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        need_of(s, q, i, &a, &b);
        int lo = max_i(a, my0), hi = min_i(b, my1);
        if (hi <= lo)
            continue;
        float *blk = s->ipack + (size_t)q * s->iblock;
        pack_rows(blk, act, n, per, row, lo, hi);
        if (dp_sender_push(s->tx, s->ranks[q], DP_WIRE_MP_ROWS, (uint64_t)step, (uint64_t)pl, blk,
                           (size_t)n * (size_t)(hi - lo) * row * sizeof(float), &rank, err) < 0)
            return dp_group_lost_rank(&s->g, rank, err);
    }
    need_of(s, s->task, i, &a, &b);
    for (int q = 0; q < s->K; q++) {
        int qa, qb;
        if (q == s->task)
            continue;
        band_of(s, q, pl, &qa, &qb);
        int lo = max_i(a, qa), hi = min_i(b, qb);
        if (hi <= lo)
            continue;
        if (dp_group_recv(&s->g, q, DP_WIRE_MP_ROWS, step, (uint64_t)pl, s->iunpack,
                          (size_t)n * (size_t)(hi - lo) * row * sizeof(float),
                          "rows of an image layer's output", err) < 0)
            return -1;
        unpack_rows(act, s->iunpack, n, per, row, lo, hi, 0);
    }
    return wait_sent(s, err);
}

/* The gradient at the output of layer pl = i-1, after layer i's backward
 * wrote this task's part of it:
 * - ROWS below ROWS: the part holds the rows layer i's windows read; the
 *   halo rows go back to the tasks that own them, which add them in;
 * - ROWS above FULL (or the dense layers above anything): every task needs
 *   the whole sum; each sends its part to every other and all add the parts
 *   in task order, so every task holds the same sum;
 * - FULL above anything: every task computed the whole gradient already.
 * part: this task's part in the layout of dst (rows [a, b) of each record),
 * dst the sum; they are one buffer except at the dense layers. */
static int grad_exchange(mp_replica *s, int i, float *dst, const float *part, int n, long step,
                         dp_err *err)
{
    int pl = i - 1, rank, a, b;
    const dp_layer *P = &s->L[pl];
    size_t per = (size_t)P->out, row = (size_t)P->ow * P->oc;
    int above_rows = i < s->n_img && s->plans[s->task].img[i].rows;
    int below_rows = s->plans[s->task].img[pl].rows;
    if (i < s->n_img && !above_rows)
        return 0;
    need_of(s, s->task, i, &a, &b);
    if (above_rows && below_rows) {
        int my0, my1;
        band_of(s, s->task, pl, &my0, &my1);
        for (int q = 0; q < s->K; q++) {
            int qa, qb;
            if (q == s->task)
                continue;
            band_of(s, q, pl, &qa, &qb);
            int lo = max_i(a, qa), hi = min_i(b, qb);
            if (hi <= lo)
                continue;
            float *blk = s->ipack + (size_t)q * s->iblock;
            pack_rows(blk, dst, n, per, row, lo, hi);
            if (dp_sender_push(s->tx, s->ranks[q], DP_WIRE_MP_ROWS_GRAD, (uint64_t)step,
                               (uint64_t)pl, blk,
                               (size_t)n * (size_t)(hi - lo) * row * sizeof(float), &rank,
                               err) < 0)
                return dp_group_lost_rank(&s->g, rank, err);
        }
        for (int q = 0; q < s->K; q++) {
            int qa, qb;
            if (q == s->task)
                continue;
            need_of(s, q, i, &qa, &qb);
            int lo = max_i(my0, qa), hi = min_i(my1, qb);
            if (hi <= lo)
                continue;
            if (dp_group_recv(&s->g, q, DP_WIRE_MP_ROWS_GRAD, step, (uint64_t)pl, s->iunpack,
                              (size_t)n * (size_t)(hi - lo) * row * sizeof(float),
                              "halo rows of an input gradient", err) < 0)
                return -1;
            unpack_rows(dst, s->iunpack, n, per, row, lo, hi, 1);
        }
        return wait_sent(s, err);
    }
    /* the whole sum everywhere, in task order */
    const float *mine = part;
    if (part == dst) { /* keep this task's part while the sum builds in dst */
        float *blk = s->ipack + (size_t)s->task * s->iblock;
        pack_rows(blk, dst, n, per, row, a, b);
        mine = blk;
    } else {
        a = 0, b = P->oh; /* the dense layers' part: the whole input */
    }
    size_t len = (size_t)n * (size_t)(b - a) * row;
    for (int q = 0; q < s->K; q++)
        if (q != s->task && len &&
            dp_sender_push(s->tx, s->ranks[q], DP_WIRE_MP_ROWS_GRAD, (uint64_t)step, (uint64_t)pl,
                           mine, len * sizeof(float), &rank, err) < 0)
            return dp_group_lost_rank(&s->g, rank, err);
    memset(dst, 0, (size_t)n * per * sizeof(float));
    for (int q = 0; q < s->K; q++) {
        int qa = a, qb = b;
        if (part == dst)
            need_of(s, q, i, &qa, &qb);
        if (qb <= qa)
            continue;
        const float *src = mine;
        if (q != s->task) {
            if (dp_group_recv(&s->g, q, DP_WIRE_MP_ROWS_GRAD, step, (uint64_t)pl, s->iunpack,
                              (size_t)n * (size_t)(qb - qa) * row * sizeof(float),
                              "its part of an input gradient", err) < 0)
                return -1;
            src = s->iunpack;
        }
        unpack_rows(dst, src, n, per, row, qa, qb, 1);
    }
    return wait_sent(s, err);
}

/* Conv layer i's full filters from the tasks' output channels. */
static int filters_gather(mp_replica *s, int i, const float *params, long step, dp_err *err)
{
    const dp_layer *L = &s->L[i];
    size_t per = L->w_len / (size_t)L->oc;
    int rank;
    for (int q = 0; q < s->K; q++) {
        const mp_img *g = &s->plans[q].img[i];
        size_t len = g->w_len + g->b_len;
        if (!len)
            continue;
        const float *src = params + s->plan->img[i].w_off; /* weights, then biases */
        if (q == s->task) {
            for (int p = 0; p < s->K; p++)
                if (p != s->task && dp_sender_push(s->tx, s->ranks[p], DP_WIRE_MP_FILTERS,
                                                   (uint64_t)step, (uint64_t)i, src,
                                                   len * sizeof(float), &rank, err) < 0)
                    return dp_group_lost_rank(&s->g, rank, err);
        } else {
            if (dp_group_recv(&s->g, q, DP_WIRE_MP_FILTERS, step, (uint64_t)i, s->iunpack,
                              len * sizeof(float), "its filters of a conv layer", err) < 0)
                return -1;
            src = s->iunpack;
        }
        memcpy(s->filt[i] + (size_t)g->lo * per, src, g->w_len * sizeof(float));
        memcpy(s->filt[i] + L->w_len + g->lo, src + g->w_len, g->b_len * sizeof(float));
    }
    return wait_sent(s, err);
}

/* Conv layer i: each task's part of the full filter gradient (fgrad) summed,
 * in task order, into the output channels each holds (grads, compact). */
static int filters_reduce(mp_replica *s, int i, float *grads, long step, dp_err *err)
{
    const dp_layer *L = &s->L[i];
    size_t per = L->w_len / (size_t)L->oc;
    int rank;
    for (int q = 0; q < s->K; q++) {
        const mp_img *g = &s->plans[q].img[i];
        if (q == s->task || !(g->w_len + g->b_len))
            continue;
        float *blk = s->ipack + (size_t)q * s->iblock;
        memcpy(blk, s->fgrad + (size_t)g->lo * per, g->w_len * sizeof(float));
        memcpy(blk + g->w_len, s->fgrad + L->w_len + g->lo, g->b_len * sizeof(float));
        if (dp_sender_push(s->tx, s->ranks[q], DP_WIRE_MP_FILTERS, (uint64_t)step,
                           (uint64_t)(i + DP_MAX_LAYERS), blk,
                           (g->w_len + g->b_len) * sizeof(float), &rank, err) < 0)
            return dp_group_lost_rank(&s->g, rank, err);
    }
    const mp_img *g = &s->plan->img[i];
    size_t len = g->w_len + g->b_len;
    float *dst = grads + g->w_off; /* weights, then biases */
    memset(dst, 0, len * sizeof(float));
    for (int q = 0; q < s->K && len; q++) {
        const float *w, *b;
        if (q == s->task) {
            w = s->fgrad + (size_t)g->lo * per;
            b = s->fgrad + L->w_len + g->lo;
        } else {
            if (dp_group_recv(&s->g, q, DP_WIRE_MP_FILTERS, step, (uint64_t)(i + DP_MAX_LAYERS),
                              s->iunpack, len * sizeof(float),
                              "its part of a conv layer's filter gradient", err) < 0)
                return -1;
            w = s->iunpack;
            b = s->iunpack + g->w_len;
        }
        for (size_t e = 0; e < g->w_len; e++)
            dst[e] += w[e];
        for (size_t e = 0; e < g->b_len; e++)
            dst[g->w_len + e] += b[e];
    }
    return wait_sent(s, err);
}

/* Image layer i's call (layer_kind.h): its weights are this task's (a
 * band's, in the compact buffer) or, for shared filters, the whole filters
 * gathered (filt) with their gradient in fgrad; its output and the gradient
 * there in the full layout. */
static dp_layer_call image_call(mp_replica *s, int i, const float *params, float *grads,
                                const float *in, int n)
{
    const dp_layer *L = &s->L[i];
    const mp_img *g = &s->plan->img[i];
    dp_layer_call c = {.d = L, .batch = n, .in = in, .out = s->iact[i], .dout = s->igrad[i],
                       .keep = s->keep[i], .rows = s->low, .drows = s->dlow, .band = s->band,
                       .chunk = s->chunk[i], .y0 = g->y0, .y1 = g->y1};
    if (s->filt[i]) {
        c.w = s->filt[i], c.b = s->filt[i] + L->w_len;
        c.gw = s->fgrad, c.gb = s->fgrad + L->w_len;
    } else if (L->w_len) {
        c.w = params + g->w_off, c.b = params + g->b_off;
        if (grads)
            c.gw = grads + g->w_off, c.gb = grads + g->b_off;
    }
    return c;
}

/* A ROWS layer computes its band, a FULL one the whole layer. */
static void image_layer_forward(mp_replica *s, int i, const float *params, const float *in,
                                int n)
{
    const dp_layer_ops *o = dp_layer_ops_of(&s->L[i]);
    dp_layer_call c = image_call(s, i, params, NULL, in, n);
    if (s->plan->img[i].rows)
        o->mp_forward(&c);
    else
        o->forward(&c);
}

/* din: the gradient at the layer's input (NULL for layer 0: never needed);
 * a ROWS layer writes its input rows' part, the rest of din zero. */
static int image_layer_backward(mp_replica *s, int i, const float *params, float *grads,
                                const float *in, float *din, int n, long step, dp_err *err)
{
    const dp_layer *L = &s->L[i];
    const dp_layer_ops *o = dp_layer_ops_of(L);
    const mp_img *g = &s->plan->img[i];
    if (din && g->rows)
        memset(din, 0, (size_t)n * L->in * sizeof(float));
    dp_layer_call c = image_call(s, i, params, grads, in, n);
    c.din = din;
    if (!g->rows) {
        o->backward(&c);
        return 0;
    }
    o->mp_backward(&c);
    if (o->flags & DP_LK_MP_SHARED_FILTERS)
        return filters_reduce(s, i, grads, step, err);
    return 0;
}

/* The image layers forward: conv filters gathered, then layer by layer with
 * the rows exchanges between them; the last one's output whole on every
 * task (the dense layers' input). */
static int image_forward(mp_replica *s, const float *params, const float *x, int n, long step,
                         dp_err *err)
{
    for (int i = 0; i < s->n_img; i++)
        if ((dp_layer_ops_of(&s->L[i])->flags & DP_LK_MP_SHARED_FILTERS) &&
            filters_gather(s, i, params, step, err) < 0)
            return -1;
    for (int i = 0; i <= s->n_img; i++) {
        if (i > 0 && s->plan->img[i - 1].rows && s->K > 1 &&
            rows_exchange(s, i, n, step, err) < 0)
            return -1;
        if (i < s->n_img)
            image_layer_forward(s, i, params, i ? s->iact[i - 1] : x, n);
    }
    return 0;
}

/* The image layers backward from the gradient at the last one's output. */
static int image_backward(mp_replica *s, const float *params, float *grads, const float *x,
                          int n, long step, dp_err *err)
{
    for (int i = s->n_img - 1; i >= 0; i--) {
        float *din = i ? s->igrad[i - 1] : NULL;
        if (image_layer_backward(s, i, params, grads, i ? s->iact[i - 1] : x, din, n, step,
                                 err) < 0)
            return -1;
        if (din && s->K > 1 && grad_exchange(s, i, din, din, n, step, err) < 0)
            return -1;
    }
    return 0;
}


/* Dense layer d's slice call: its units, its weights in the compact buffer. */
static dp_layer_call unit_call(const mp_replica *s, int d, const float *params, float *grads,
                               const float *in, int n)
{
    const mp_layer *l = &s->plan->layer[d];
    dp_layer_call c = {.d = &s->units[d], .batch = n, .in = in, .lo = l->lo, .hi = l->hi,
                       .w = params + l->w_off, .b = params + l->b_off};
    if (grads)
        c.gw = grads + l->w_off, c.gb = grads + l->b_off;
    return c;
}

/* Forward and backward of n records: the loss and this task's gradients,
 * weighted by w (its replica's share of the step's records). */
int mp_replica_step(mp_replica *s, const float *params, float *grads, const float *x,
                    const uint8_t *y, int n, float w, long step, dp_step_out *out, dp_err *err)
{
    const mp_plan *p = s->plan;
    int last = p->n - 1;
    out->loss = 0;
    out->correct = 0;
    if (n < 1 || n > s->rows)
        return dp_errf(err, "model-parallel: a step of %d records, but room for %d", n, s->rows);
    const float *xin = x; /* the first dense layer's input */
    if (s->n_img) {
        if (image_forward(s, params, x, n, step, err) < 0)
            return -1;
        xin = s->iact[s->n_img - 1];
    }
    for (int d = 0; d <= last; d++) {
        dp_layer_call c = unit_call(s, d, params, NULL, d ? s->act[d - 1] : xin, n);
        c.out = s->act[d];
        c.relu = d < last;
        dp_layer_ops_of(&s->units[d])->mp_forward(&c);
        if (s->K > 1 && all_gather(s, d, n, step, err) < 0)
            return -1;
    }
    /* every task: the same logits, the same loss and gradient */
    float *logits = s->act[last];
    int classes = p->layer[last].out;
    const dp_layer_ops *lo = dp_layer_ops_of(&s->loss); /* in place, on every task */
    dp_layer_call lc = {.d = &s->loss, .batch = n, .in = logits, .out = logits, .y = y,
                        .correct = &out->correct, .train = 1};
    out->loss = lo->forward(&lc);
    if (!isfinite(out->loss))
        return dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                       (double)out->loss, step);
    lc.din = logits;
    lo->backward(&lc);
    if (w != 1.0f)
        for (size_t i = 0; i < (size_t)n * classes; i++)
            logits[i] *= w;
    const float *dz = logits;
    int cur = 0;
    for (int d = last; d >= 0; d--) {
        const mp_layer *l = &p->layer[d];
        /* never the input's gradient; the image layers' only then */
        float *din = d || s->n_img ? s->dbuf[cur] : NULL;
        dp_layer_call c = unit_call(s, d, params, grads, d ? s->act[d - 1] : xin, n);
        c.dout = dz;
        c.din = din;
        dp_layer_ops_of(&s->units[d])->mp_backward(&c);
        if (!d) {
            if (!s->n_img)
                break;
            float *top = s->igrad[s->n_img - 1];
            if (s->K > 1) {
                if (grad_exchange(s, s->n_img, top, din, n, step, err) < 0)
                    return -1;
            } else {
                memcpy(top, din, (size_t)n * l->in * sizeof(float));
            }
            return image_backward(s, params, grads, x, n, step, err);
        }
        if (s->K > 1 && reduce_scatter(s, d, din, n, step, err) < 0)
            return -1;
        /* through the relu before layer d (its output is act[d-1]), on the
         * columns this task owns (K = 1: all of them) */
        const mp_layer *prev = &p->layer[d - 1];
        for (int r = 0; r < n; r++)
            dp_relu_backward(din + (size_t)r * l->in + prev->lo,
                             din + (size_t)r * l->in + prev->lo,
                             s->act[d - 1] + (size_t)r * l->in + prev->lo, prev->hi - prev->lo);
        dz = din;
        cur ^= 1;
    }
    return 0;
}


const mp_plan *mp_replica_plan(const mp_replica *r, int j)
{
    return &r->plans[j];
}

void mp_replica_close(mp_replica *s)
{
    if (!s)
        return;
    dp_sender_close(s->tx);
    for (int d = 0; d < DP_MAX_DENSE; d++)
        free(s->act[d]);
    free(s->dbuf[0]);
    free(s->dbuf[1]);
    free(s->pack);
    free(s->unpack);
    free(s->blocks);
    for (int i = 0; i < DP_MAX_LAYERS; i++) {
        free(s->iact[i]);
        free(s->igrad[i]);
        free(s->keep[i]);
        free(s->filt[i]);
    }
    free(s->fgrad);
    free(s->low);
    free(s->dlow);
    free(s->band);
    free(s->ipack);
    free(s->iunpack);
    free(s->plans);
    free(s->ranks);
    free(s);
}

/* The image layers' buffers: each layer's output and gradient in the full
 * layout, lcn's keep, conv's filters, the lowering scratch of a chunk. */
static int open_image(mp_replica *s, const dp_model *m, int rows)
{
    const mp_plan *p = s->plan;
    size_t r = (size_t)rows, low = 0, band = 0, fg = 0, blk = 0;
    s->n_img = p->n_img;
    for (int i = 0; i < s->n_img; i++) {
        const dp_layer *L = &m->layers[i];
        s->L[i] = *L;
        if (!(s->iact[i] = malloc(r * L->out * sizeof(float))) ||
            !(s->igrad[i] = malloc(r * L->out * sizeof(float))))
            return -1;
        blk = r * L->out > blk ? r * L->out : blk;
        const dp_layer_ops *o = dp_layer_ops_of(L);
        if (o->keep_floats && !(s->keep[i] = malloc(o->keep_floats(L, rows) * sizeof(float))))
            return -1;
        if (!(o->flags & DP_LK_LOWERED))
            continue;
        size_t P = (size_t)((L->oh + s->K - 1) / s->K) * L->ow;
        size_t k = (size_t)L->win.kh * L->win.kw * L->c;
        size_t chunk = BAND_BUDGET / (P * k);
        if (chunk < (size_t)o->min_chunk)
            chunk = (size_t)o->min_chunk;
        chunk = chunk < 1 ? 1 : chunk > r ? r : chunk;
        s->chunk[i] = (int)chunk;
        low = chunk * P * k > low ? chunk * P * k : low;
        band = chunk * P * L->oc > band ? chunk * P * L->oc : band;
        if (o->flags & DP_LK_MP_SHARED_FILTERS) {
            size_t all = L->w_len + L->b_len;
            fg = all > fg ? all : fg;
            blk = all > blk ? all : blk;
            if (!(s->filt[i] = malloc(all * sizeof(float))))
                return -1;
        }
    }
    s->iblock = blk;
    s->ipack = malloc((size_t)s->K * blk * sizeof(float));
    s->iunpack = malloc(blk * sizeof(float));
    s->fgrad = fg ? malloc(fg * sizeof(float)) : NULL;
    s->low = low ? malloc(low * sizeof(float)) : NULL;
    s->dlow = low ? malloc(low * sizeof(float)) : NULL;
    s->band = band ? malloc(band * sizeof(float)) : NULL;
    if (!s->ipack || !s->iunpack || (fg && !s->fgrad) || (low && (!s->low || !s->dlow)) ||
        (band && !s->band))
        return -1;
    return 0;
}


int mp_replica_open(mp_replica **out, dp_transport *t, const dp_model *m, const int *ranks,
                    int K, int task, int replica, int rows, double timeout, dp_err *err)
{
    mp_replica *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->t = t;
    s->K = K;
    s->task = task;
    s->replica = replica;
    s->rows = rows;
    s->timeout = timeout;
    s->ranks = malloc((size_t)K * sizeof *s->ranks);
    s->plans = calloc((size_t)K, sizeof *s->plans);
    if (!s->ranks || !s->plans) {
        mp_replica_close(s);
        return dp_errf(err, "out of memory");
    }
    memcpy(s->ranks, ranks, (size_t)K * sizeof *ranks);
    s->g = (dp_group){.t = t, .ranks = s->ranks, .n = K, .width = K, .replica0 = replica,
                      .member = "model-parallel task",
                      .cost = "a replica cannot go on without a slice of its model",
                      .timeout = timeout};
    for (int j = 0; j < K; j++)
        if (mp_plan_make(&s->plans[j], m, K, j, err) < 0) {
            mp_replica_close(s);
            return -1;
        }
    s->plan = &s->plans[task];
    s->loss = m->layers[m->n_layers - 1];
    for (int l = 0, d = 0; l < m->n_layers; l++)
        if (dp_layer_ops_of(&m->layers[l])->mp == DP_MP_UNITS)
            s->units[d++] = m->layers[l];
    const mp_plan *p = s->plan;
    size_t r = (size_t)rows;
    s->dbuf[0] = malloc(r * p->max_width * sizeof(float));
    s->dbuf[1] = malloc(r * p->max_width * sizeof(float));
    s->pack = malloc(r * p->max_units * sizeof(float));
    s->unpack = malloc(r * p->max_units * sizeof(float));
    s->blocks = malloc(r * p->max_width * sizeof(float));
    int ok = s->dbuf[0] && s->dbuf[1] && s->pack && s->unpack && s->blocks;
    for (int d = 0; d < p->n && ok; d++)
        ok = (s->act[d] = malloc(r * p->layer[d].out * sizeof(float))) != NULL;
    if (ok && p->n_img)
        ok = open_image(s, m, rows) == 0;
    if (!ok) {
        mp_replica_close(s);
        return dp_errf(err, "out of memory for a batch of %d records", rows);
    }
    if (dp_sender_open(&s->tx, t, 2 * K, err) < 0) {
        mp_replica_close(s);
        return -1;
    }
    *out = s;
    return 0;
}
