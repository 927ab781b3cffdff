/* The slice math of model parallelism: see mp_slice.h. */
#include "exec/mp_slice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/layer_kind.h"
#include "downpour/layers.h"
#include "downpour/model_parallel.h"

void mp_units(int out, int K, int j, int *lo, int *hi)
{
    *lo = (int)((long long)out * j / K);
    *hi = (int)((long long)out * (j + 1) / K);
}

/* The image kinds model parallelism runs (ROWS or FULL), for messages. */
static void image_kinds(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < DP_LAYER_KIND_COUNT && len < n; k++) {
        const dp_layer_ops *o = dp_layer_table[k];
        if (o->token && (o->mp == DP_MP_ROWS || o->mp == DP_MP_FULL))
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", o->name);
    }
}

/* Model layer i, an image layer: its mode and band by its kind's rule
 * (layer_kind.h), its parameters' slices at compact offset *off. */
static int plan_image(mp_plan *p, const dp_model *m, int K, int j, int i, size_t *off,
                      dp_err *err)
{
    const dp_layer *L = &m->layers[i];
    const dp_layer_ops *o = dp_layer_ops_of(L);
    mp_img *g = &p->img[i];
    if (o->mp != DP_MP_ROWS && o->mp != DP_MP_FULL) {
        char kinds[256];
        image_kinds(kinds, sizeof kinds);
        return dp_errf(err, "--model-parallel %d: layer %d of %s is %s, which model "
                            "parallelism does not split%s%s (image layers: %s)",
                       K, i, m->name, o->name, o->mp_reason ? ": " : "",
                       o->mp_reason ? o->mp_reason : "", kinds);
    }
    g->rows = o->mp == DP_MP_ROWS;
    if (g->rows) {
        if (L->oh < K)
            return dp_errf(err, "--model-parallel %d: layer %d of %s (%s) has only %d output "
                                "rows, fewer than the %d tasks that would split them by rows. "
                                "Hint: --model-parallel %d or less",
                           K, i, m->name, o->name, L->oh, K, L->oh);
        mp_units(L->oh, K, j, &g->y0, &g->y1);
        if (o->flags & DP_LK_MP_SAME_ROWS) {
            g->iy0 = g->y0;
            g->iy1 = g->y1;
        } else {
            dp_window_band_rows(&L->win, g->y0, g->y1, &g->iy0, &g->iy1);
        }
        if (o->mp_params)
            o->mp_params(L, K, j, g->y0, g->y1, &g->w_full, &g->w_len, &g->b_full, &g->b_len,
                         &g->lo, &g->hi);
    }
    g->w_off = *off;
    *off += g->w_len;
    g->b_off = *off;
    *off += g->b_len;
    return 0;
}

int mp_check_layers(const dp_model *m, int K, dp_err *err)
{
    for (int i = 0; i < m->n_layers; i++) { /* a refusal with its reason, wherever it is */
        const dp_layer_ops *o = dp_layer_ops_of(&m->layers[i]);
        if (o->mp != DP_MP_REFUSE)
            continue;
        char flag[64];
        if (K > 0)
            snprintf(flag, sizeof flag, "--model-parallel %d", K);
        else
            snprintf(flag, sizeof flag, "--strategy model-parallel");
        return dp_errf(err, "%s: layer %d of %s is %s, which model parallelism does not split: %s",
                       flag, i, m->name, o->name, o->mp_reason ? o->mp_reason : "not yet");
    }
    return 0;
}

int mp_plan_make(mp_plan *p, const dp_model *m, int K, int j, dp_err *err)
{
    memset(p, 0, sizeof *p);
    size_t off = 0;
    int first = 0; /* the first layer split by units (dense) */
    if (mp_check_layers(m, K, err) < 0)
        return -1;
    while (first < m->n_layers && dp_layer_ops_of(&m->layers[first])->mp != DP_MP_UNITS)
        first++;
    if (first == m->n_layers)
        return dp_errf(err, "--model-parallel: model %s has no dense layer", m->name);
    for (int i = 0; i < first; i++)
        if (plan_image(p, m, K, j, i, &off, err) < 0)
            return -1;
    p->n_img = first;
    for (int i = first; i < m->n_layers; i++) {
        const dp_layer *L = &m->layers[i];
        if (dp_layer_ops_of(L)->mp != DP_MP_UNITS)
            continue;
        /* every dense layer is followed by a relu, the last by the loss */
        unsigned next = i + 1 < m->n_layers ? dp_layer_ops_of(&m->layers[i + 1])->flags : 0;
        int last = i + 2 == m->n_layers;
        if (!(last ? dp_layer_ops_of(&m->layers[i + 1])->mp == DP_MP_LOSS
                   : (next & DP_LK_RELU) != 0) ||
            (i > first && !(dp_layer_ops_of(&m->layers[i - 1])->flags & DP_LK_RELU)))
            return dp_errf(err, "--model-parallel splits stacks of dense layers (dense, relu, "
                                "..., dense, softmax_xent), after image layers if any; layer "
                                "%d of %s is %s after %s",
                           i, m->name, dp_layer_kind_name(L->kind),
                           i > 0 ? dp_layer_kind_name(m->layers[i - 1].kind) : "the input");
        if (L->out < K)
            return dp_errf(err, "--model-parallel %d: layer %d of %s has only %d output units, "
                                "fewer than the %d tasks that would split them. Hint: "
                                "--model-parallel %d or less",
                           K, i, m->name, L->out, K, L->out);
        mp_layer *l = &p->layer[p->n++];
        l->in = L->in;
        l->out = L->out;
        mp_units(L->out, K, j, &l->lo, &l->hi);
        l->w_full = L->w_off + (size_t)l->lo * L->in;
        l->b_full = L->b_off + (size_t)l->lo;
        int u = l->hi - l->lo;
        l->w_off = off;
        off += (size_t)u * L->in;
        l->b_off = off;
        off += (size_t)u;
        int umax = (L->out + K - 1) / K;
        p->max_units = umax > p->max_units ? umax : p->max_units;
        p->max_width = L->in > p->max_width ? L->in : p->max_width;
        p->max_width = L->out > p->max_width ? L->out : p->max_width;
    }
    p->floats = off;
    return 0;
}

void mp_gather(float *compact, const float *full, const mp_plan *p)
{
    for (int i = 0; i < p->n_img; i++) {
        const mp_img *g = &p->img[i];
        memcpy(compact + g->w_off, full + g->w_full, g->w_len * sizeof(float));
        memcpy(compact + g->b_off, full + g->b_full, g->b_len * sizeof(float));
    }
    for (int k = 0; k < p->n; k++) {
        const mp_layer *l = &p->layer[k];
        size_t u = (size_t)(l->hi - l->lo);
        memcpy(compact + l->w_off, full + l->w_full, u * l->in * sizeof(float));
        memcpy(compact + l->b_off, full + l->b_full, u * sizeof(float));
    }
}

void mp_scatter(float *full, const float *compact, const mp_plan *p)
{
    for (int i = 0; i < p->n_img; i++) {
        const mp_img *g = &p->img[i];
        memcpy(full + g->w_full, compact + g->w_off, g->w_len * sizeof(float));
        memcpy(full + g->b_full, compact + g->b_off, g->b_len * sizeof(float));
    }
    for (int k = 0; k < p->n; k++) {
        const mp_layer *l = &p->layer[k];
        size_t u = (size_t)(l->hi - l->lo);
        memcpy(full + l->w_full, compact + l->w_off, u * l->in * sizeof(float));
        memcpy(full + l->b_full, compact + l->b_off, u * sizeof(float));
    }
}

size_t mp_order_offset(const mp_plan *plans, int j)
{
    size_t off = 0;
    for (int q = 0; q < j; q++)
        off += plans[q].floats;
    return off;
}

void mp_order_gather(float *v, const float *full, const mp_plan *plans, int K)
{
    size_t off = 0;
    for (int j = 0; j < K; off += plans[j].floats, j++)
        mp_gather(v + off, full, &plans[j]);
}

void mp_order_scatter(float *full, const float *v, const mp_plan *plans, int K)
{
    size_t off = 0;
    for (int j = 0; j < K; off += plans[j].floats, j++)
        mp_scatter(full, v + off, &plans[j]);
}

void mp_pack(float *dst, const float *src, int rows, int width, int lo, int hi)
{
    size_t u = (size_t)(hi - lo);
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * u, src + (size_t)r * width + lo, u * sizeof(float));
}

void mp_unpack(float *dst, const float *src, int rows, int width, int lo, int hi)
{
    size_t u = (size_t)(hi - lo);
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * width + lo, src + (size_t)r * u, u * sizeof(float));
}

int dp_mp_check(const dp_model *m, int K, dp_err *err)
{
    if (K <= 0)
        return mp_check_layers(m, 0, err);
    mp_plan *p = malloc(sizeof *p); /* tens of kB: not on the stack */
    if (!p)
        return dp_errf(err, "out of memory");
    int rc = mp_plan_make(p, m, K, 0, err);
    free(p);
    return rc;
}
