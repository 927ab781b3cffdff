/* The model as a sequence of typed layers over one flat parameter buffer
 * (docs/architecture.md, "The model"): its memory, its initial weights, and
 * forward and backward over any range of layers.  The grammar that makes the
 * layers is model_spec.c. */
#include "downpour/model.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/layer_kind.h"
#include "downpour/layers.h"
#include "downpour/optim.h"
#include "downpour/rng.h"
#include "downpour/sparse.h"
#include "nn/layer_impl.h"
#include "nn/model_spec.h"

/* Lowered layers (conv, local) lower this many floats of input at a time
 * (4 MiB: the lowered chunk and its product stay in the last-level cache),
 * or their kind's min_chunk records when more (layer_kind.h). */
#define ROWS_BUDGET (1u << 20)

static float *alloc_floats(size_t n)
{
    /* 64-byte aligned (a cache line, an AVX-512 vector) for the GEMM kernels. */
    size_t bytes = (n ? n : 1) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes);
}

/* n floats rounded up to a cache line, so the next buffer starts on one. */
static size_t line_floats(size_t n) { return (n + 15) & ~(size_t)15; }

const char *dp_layer_kind_name(dp_layer_kind kind)
{
    return (unsigned)kind < DP_LAYER_KIND_COUNT ? dp_layer_table[kind]->name : "?";
}

static bool lowered(const dp_layer *d) { return dp_layer_ops_of(d)->flags & DP_LK_LOWERED; }

/* Samples a lowered layer lowers at a time, and the rows scratch that
 * takes: see ROWS_BUDGET. */
static void size_chunks(dp_model *m)
{
    m->rows_floats = 0;
    for (int l = 0; l < m->n_layers; l++) {
        dp_layer *d = &m->layers[l];
        if (!lowered(d))
            continue;
        size_t per = (size_t)d->oh * d->ow * d->win.kh * d->win.kw * d->c;
        size_t chunk = ROWS_BUDGET / per;
        if (chunk < (size_t)dp_layer_ops_of(d)->min_chunk)
            chunk = (size_t)dp_layer_ops_of(d)->min_chunk;
        if (chunk < 1)
            chunk = 1;
        if (chunk > (size_t)m->max_batch)
            chunk = (size_t)m->max_batch;
        d->chunk = (int)chunk;
        if (chunk * per > m->rows_floats)
            m->rows_floats = line_floats(chunk * per);
        /* a direct conv repacks its filters there (conv_direct.c) */
        if (d->w_len > m->rows_floats)
            m->rows_floats = line_floats(d->w_len);
    }
}

/* Every layer's buffers at their initial values (running mean 0, variance 1). */
static void init_buffers(dp_model *m)
{
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (d->s_len && dp_layer_ops_of(d)->init_buffers)
            dp_layer_ops_of(d)->init_buffers(d, m->buffers + d->s_off);
    }
}

/* Cuts each sparse table to C = min(N, max_batch x ids a record) rows and
 * moves every later parameter earlier by what the tables lost (the parser
 * lays parameters out in layer order, weights then bias).  Only where the
 * parameter servers move the tables by rows: tables one a layer, lying
 * before every dense parameter (dp_model_init_compact). */
static int compact_tables(dp_model *m, int max_batch)
{
    size_t end = 0;
    int n = 0, l = 0;
    for (; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *ops = dp_layer_ops_of(d);
        if (!ops->sparse)
            break;
        dp_lk_sparse t[DP_LK_MAX_SPARSE];
        if (ops->sparse(d, t) != 1 || t[0].off != end || d->w_off != end ||
            (size_t)t[0].rows * (size_t)t[0].width != d->w_len || d->b_len != 0 ||
            ++n > DP_SPARSE_MAX)
            return 0;
        end += d->w_len;
    }
    if (n == 0 || end >= m->n_params)
        return 0;
    for (int k = l; k < m->n_layers; k++) /* no table among the dense layers */
        if (dp_layer_ops_of(&m->layers[k])->sparse)
            return 0;
    /* Every table goes to slots once one is cut, a table no batch can
     * outgrow with C = N: the ids of every table then mean slots alike (a
     * table left in place among slotted ones got the rows at their ids). */
    int any = 0;
    for (int k = 0; k < l; k++) {
        dp_lk_sparse t[DP_LK_MAX_SPARSE];
        dp_layer_ops_of(&m->layers[k])->sparse(&m->layers[k], t);
        any |= (long)max_batch * t[0].per_record < t[0].rows;
    }
    if (!any)
        return 0;
    size_t cut = 0;
    for (int k = 0; k < m->n_layers; k++) {
        dp_layer *d = &m->layers[k];
        d->w_off -= cut;
        d->b_off -= cut;
        if (k >= l)
            continue;
        dp_lk_sparse t[DP_LK_MAX_SPARSE];
        dp_layer_ops_of(d)->sparse(d, t);
        long most = (long)max_batch * t[0].per_record;
        if (most > t[0].rows)
            most = t[0].rows;
        d->sparse_rows = t[0].rows;
        d->w_len = (size_t)most * (size_t)t[0].width;
        d->b_off = d->w_off + d->w_len;
        cut += (size_t)(t[0].rows - most) * (size_t)t[0].width;
    }
    m->n_params -= cut;
    return cut > 0;
}

static int init_model(dp_model *m, const char *spec, int max_batch, int slots, int compact,
                      dp_err *err);

int dp_model_init(dp_model *m, const char *spec, int max_batch, int slots, dp_err *err)
{
    return init_model(m, spec, max_batch, slots, 0, err);
}

int dp_model_init_compact(dp_model *m, const char *spec, int max_batch, int slots, dp_err *err)
{
    return init_model(m, spec, max_batch, slots, 1, err);
}

int dp_model_describe(dp_model *m, const char *spec, dp_err *err)
{
    memset(m, 0, sizeof *m);
    if (!spec)
        return dp_errf(err, "model spec: missing");
    if (strncmp(spec, "external:", 9) == 0) { /* external.h: a model this process registered */
        const dp_external_model *e = dp_external_find(spec + 9);
        if (!e)
            return dp_errf(err, "model %s: no external model is registered under '%s' in this "
                                "process (external.h; downpour.torch registers them)",
                           spec, spec + 9);
        return dp_model_init_external(m, e, spec + 9, 1, err); /* the caller's arrays */
    }
    if (model_spec_parse(m, spec, err) < 0) {
        memset(m, 0, sizeof *m);
        return -1;
    }
    return 0;
}

static int init_model(dp_model *m, const char *spec, int max_batch, int slots, int compact,
                      dp_err *err)
{
    if (dp_model_describe(m, spec, err) < 0)
        return -1;
    if (m->external) {
        m->max_batch = max_batch;
        return 0;
    }
    int cut = compact && max_batch >= 1 ? compact_tables(m, max_batch) : 0;
    int n = m->n_layers;
    int max_width = 0; /* every activation and gradient buffer */
    for (int l = 0; l < n; l++) {
        if (m->layers[l].out > max_width)
            max_width = m->layers[l].out;
        if (m->layers[l].in > max_width)
            max_width = m->layers[l].in;
    }
    if (max_batch < 1 || max_batch > INT_MAX / max_width)
        return dp_errf(err, "model %s: max batch %d out of range [1, %d]", spec, max_batch,
                       INT_MAX / max_width);
    m->max_batch = max_batch;
    size_chunks(m);

    /* One slot: every layer's output for max_batch rows, each on a cache line,
     * then what each layer keeps for its backward (lcn).  act_off[0] stays 0, unused:
     * a range reads its input where the caller has it. */
    size_t per_slot = 0;
    for (int l = 0; l < n; l++) {
        m->act_off[l + 1] = per_slot;
        per_slot += line_floats((size_t)max_batch * m->layers[l].out);
    }
    for (int l = 0; l < n; l++) {
        dp_layer *d = &m->layers[l];
        if (!dp_layer_ops_of(d)->keep_floats)
            continue;
        d->keep_off = per_slot;
        per_slot += line_floats(dp_layer_ops_of(d)->keep_floats(d, max_batch));
    }
    m->slot_floats = per_slot;
    m->dact_floats = line_floats((size_t)max_batch * max_width);
    /* residual blocks: a third gradient buffer keeps the block output's
     * gradient for both branches, a fourth the shortcut's at the block's
     * input (docs/architecture.md, "Residual blocks") */
    bool blocks = false, projections = false;
    for (int l = 0; l < n; l++) {
        blocks |= (m->layers[l].res & DP_RES_ADD) != 0;
        projections |= (m->layers[l].res & DP_RES_SHORTCUT) != 0;
    }
    m->n_dacts = blocks ? 3 : 2;
    size_t max_slots = SIZE_MAX / sizeof(float) / per_slot;
    if (slots < 1 || (size_t)slots > max_slots)
        return dp_errf(err, "model %s: %d activation slots out of range [1, %zu]", spec, slots,
                       max_slots < INT_MAX ? max_slots : (size_t)INT_MAX);
    m->slots = slots;

    m->params = alloc_floats(m->n_params);
    m->grads = alloc_floats(m->n_params);
    m->buffers = m->n_buffers ? alloc_floats(m->n_buffers) : NULL;
    m->acts = alloc_floats((size_t)slots * per_slot);
    m->dacts = alloc_floats((size_t)(m->n_dacts + projections) * m->dact_floats);
    if (m->dacts && projections)
        m->dskip = m->dacts + (size_t)m->n_dacts * m->dact_floats;
    m->rows = m->rows_floats ? alloc_floats(m->rows_floats) : NULL;
    m->drows = m->rows_floats ? alloc_floats(m->rows_floats) : NULL;
    m->drop_seeds = calloc((size_t)slots * (size_t)n, sizeof *m->drop_seeds);
    if (!m->params || !m->grads || !m->acts || !m->dacts || !m->drop_seeds ||
        (m->n_buffers && !m->buffers) ||
        (m->rows_floats && (!m->rows || !m->drows))) {
        dp_model_free(m);
        return dp_errf(err, "model %s: out of memory for %zu parameters, batch %d and %d slots",
                       spec, m->n_params, max_batch, slots);
    }
    memset(m->params, 0, m->n_params * sizeof(float));
    memset(m->grads, 0, m->n_params * sizeof(float));
    init_buffers(m);
    return cut;
}

void dp_model_free(dp_model *m)
{
    if (!m)
        return;
    if (m->external) /* the caller's arrays */
        m->params = m->grads = m->buffers = NULL;
    free(m->params);
    free(m->grads);
    free(m->buffers);
    free(m->acts);
    free(m->dacts);
    free(m->rows);
    free(m->drows);
    free(m->drop_seeds);
    m->params = m->grads = m->buffers = m->acts = m->dacts = m->rows = m->drows = NULL;
    m->dskip = NULL;
    m->n_buffers = 0;
    m->drop_seeds = NULL;
    m->n_params = 0;
    m->max_batch = 0;
    m->slots = 0;
}

int dp_model_inputs(const dp_model *m) { return m->layers[0].in; }

int dp_model_binary(const dp_model *m)
{
    return m->n_layers > 0 && (dp_layer_ops_of(&m->layers[m->n_layers - 1])->flags & DP_LK_BINARY);
}

int dp_model_bags(const dp_model *m, uint32_t *rows, int *places, int cap)
{
    int n = 0;
    for (int l = 0; l < m->n_layers && m->layers[l].kind == DP_LAYER_BAG; l++, n++) {
        const dp_layer *d = &m->layers[l];
        if (n < cap) {
            rows[n] = d->sparse_rows ? (uint32_t)d->sparse_rows
                                     : (uint32_t)(d->w_len / (size_t)(d->out - d->in + d->bag_ids));
            places[n] = d->bag_ids;
        }
    }
    return n;
}

long dp_model_bag_row(const dp_layer *d, float v)
{
    long n = (long)(d->w_len / (size_t)(d->out - d->in + d->bag_ids));
    return v >= 0.0f && v < (float)n && v == floorf(v) ? (long)v : -1;
}

int dp_model_classes(const dp_model *m)
{
    return dp_model_binary(m) ? 2 : m->layers[m->n_layers - 1].out; /* bce: P(1) of 2 classes */
}

int dp_model_is_image(const dp_model *m) { return m->layers[0].h * m->layers[0].w > 1; }

int dp_model_check_input(const dp_model *m, uint32_t rows, uint32_t cols, uint32_t channels,
                         const char *dataset, dp_err *err)
{
    const dp_layer *d = &m->layers[0];
    if (channels == 0)
        channels = 1;
    uint64_t values = (uint64_t)rows * cols * channels;
    if (!dp_model_is_image(m)) {
        if ((uint64_t)d->in == values)
            return 0;
        if (channels > 1)
            return dp_errf(err, "model %s takes %d inputs but dataset %s has %ux%ux%u = %llu "
                                "values a record", m->name, d->in, dataset, rows, cols, channels,
                           (unsigned long long)values);
        return dp_errf(err, "model %s takes %d inputs but dataset %s has %ux%u = %llu pixels",
                       m->name, d->in, dataset, rows, cols, (unsigned long long)values);
    }
    if (channels > 1)
        return dp_errf(err, "model %s takes %dx%dx%d images (channel by channel, CxHxW) but "
                            "dataset %s stores its %ux%u images of %u channels pixel by pixel "
                            "(HWC): image models train on one-channel images; a flat model "
                            "(dense layers) takes these records as %llu features",
                       m->name, d->c, d->h, d->w, dataset, rows, cols, channels,
                       (unsigned long long)values);
    if (d->c != 1 || (uint32_t)d->h != rows || (uint32_t)d->w != cols)
        return dp_errf(err, "model %s takes %dx%dx%d images but dataset %s has 1x%ux%u (one "
                            "channel of %ux%u pixels)",
                       m->name, d->c, d->h, d->w, dataset, rows, cols, rows, cols);
    return 0;
}

/* splitmix64's finaliser: a well-mixed 64-bit value from any input. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void dp_model_seed_dropout(dp_model *m, uint64_t seed)
{
    m->drop_base = mix64(seed ^ 0x6a09e667f3bcc908ULL);
    m->drop_count = 0;
}

/* A drawn layer's Glorot limit.  fans: a dense layer's in and out; a
 * filter's window times channels. */
static float glorot_limit(const dp_layer *d)
{
    double fan_in = d->in, fan_out = d->out;
    if (dp_layer_ops_of(d)->fans)
        dp_layer_ops_of(d)->fans(d, &fan_in, &fan_out);
    return (float)sqrt(6.0 / (fan_in + fan_out));
}

/* The rows of a table a layer draws: its whole table's, compact or not. */
static size_t drawn_floats(const dp_layer *d)
{
    if (!d->sparse_rows)
        return d->w_len;
    dp_lk_sparse t[DP_LK_MAX_SPARSE];
    dp_layer_ops_of(d)->sparse(d, t);
    return (size_t)d->sparse_rows * (size_t)t[0].width;
}

int dp_model_init_rows(const dp_model *m, uint64_t seed, int shard, int shards,
                       float *const *dst, int n_dst)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    int k = 0;
    if (shard < 0 || shards < 1 || shard >= shards)
        return -1;
    for (int l = 0; l < m->n_layers && k < n_dst; l++) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *ops = dp_layer_ops_of(d);
        if (!d->w_len || ops->init_params) /* draws nothing */
            continue;
        float limit = glorot_limit(d);
        size_t all = drawn_floats(d);
        dp_lk_sparse t[DP_LK_MAX_SPARSE];
        if (!ops->sparse || ops->sparse(d, t) != 1) { /* a dense layer before a table */
            for (size_t j = 0; j < all; j++)
                (void)dp_rng_uniform(&rng);
            continue;
        }
        size_t w = (size_t)t[0].width, rows = all / w;
        if (rows * w != all || t[0].off != d->w_off)
            return -1; /* not one table a layer: no rows of its own to draw */
        float *out = dst[k++];
        for (size_t id = 0; id < rows; id++) {
            int mine = id % (size_t)shards == (size_t)shard;
            float *row = mine ? out + id / (size_t)shards * w : NULL;
            for (size_t e = 0; e < w; e++) {
                float v = (2.0f * dp_rng_uniform(&rng) - 1.0f) * limit;
                if (mine)
                    row[e] = v;
            }
        }
    }
    return k == n_dst ? 0 : -1;
}

void dp_model_init_params(dp_model *m, uint64_t seed)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (!d->w_len)
            continue;
        if (dp_layer_ops_of(d)->init_params) { /* draws nothing: the others' draws stay */
            dp_layer_ops_of(d)->init_params(d, m->params + d->w_off, m->params + d->b_off);
            continue;
        }
        float limit = glorot_limit(d);
        float *w = m->params + d->w_off;
        for (size_t k = 0; k < d->w_len; k++)
            w[k] = (2.0f * dp_rng_uniform(&rng) - 1.0f) * limit;
        /* a compact table draws what the whole one draws, so the layers
         * after it start as the whole model's do */
        for (size_t k = d->w_len, all = drawn_floats(d); k < all; k++)
            (void)dp_rng_uniform(&rng);
        memset(m->params + d->b_off, 0, d->b_len * sizeof(float));
    }
    init_buffers(m);
    dp_model_seed_dropout(m, seed);
}

/* The input of layer l (1 <= l <= n_layers) in a slot; arguments unchecked. */
static float *act(const dp_model *m, int slot, int l)
{
    return m->acts + (size_t)slot * m->slot_floats + m->act_off[l];
}

float *dp_model_act(const dp_model *m, int slot, int l)
{
    if (!m->acts || slot < 0 || slot >= m->slots || l < 1 || l > m->n_layers)
        return NULL;
    return act(m, slot, l);
}

int dp_model_cut_ok(const dp_model *m, int j)
{
    if (j < 0 || j > m->n_layers)
        return 0;
    if (j == m->n_layers)
        return 1;
    unsigned r = m->layers[j].res;
    return !(r & DP_RES_IN) || (r & DP_RES_BEGIN);
}

static bool range_ok(const dp_model *m, int slot, int a, int b, int batch)
{
    return m->acts && slot >= 0 && slot < m->slots && a >= 0 && a < b && b <= m->n_layers &&
           batch >= 1 && batch <= m->max_batch && dp_model_cut_ok(m, a) && dp_model_cut_ok(m, b);
}

/* Where a branch of a residual block starts, the layer reads the block's
 * input: no relu fuses across that edge, forward or backward. */
static bool branch_start(const dp_layer *d) { return d->res & (DP_RES_BEGIN | DP_RES_SHORTCUT); }

static _Atomic int cpu_fusions = 1;

void dp_model_cpu_fusions(int on) { atomic_store(&cpu_fusions, on != 0); }

/* A layer that a relu follows inside [.., b) runs with the relu fused
 * (DP_LK_FUSES_RELU: dense, conv, local; DP_LK_CPU_FUSES_RELU: bn, res,
 * whose relu the device runs on its own). */
static bool fuses_relu(const dp_model *m, int l, int b)
{
    unsigned want = DP_LK_FUSES_RELU | (atomic_load(&cpu_fusions) ? DP_LK_CPU_FUSES_RELU : 0);
    return (dp_layer_ops_of(&m->layers[l])->flags & want) && l + 1 < b &&
           (dp_layer_ops_of(&m->layers[l + 1])->flags & DP_LK_RELU) &&
           !branch_start(&m->layers[l + 1]);
}

/* Whether layer l in [a, b) is a relu that runs its backward alone (no
 * layer before it takes it: DP_LK_RELU_GRAD) outside any block: then the
 * block after it hands it the shortcut's gradient at the block's input
 * (c->skip), which it adds to its dout in its pass instead of a pass of
 * its own (the same addition, so the same bits). */
static bool relu_takes_skip(const dp_model *m, int l, int a, int b)
{
    if (!atomic_load(&cpu_fusions) || l < a ||
        !(dp_layer_ops_of(&m->layers[l])->flags & DP_LK_RELU) || m->layers[l].res)
        return false;
    return !(l - 1 >= a && (dp_layer_ops_of(&m->layers[l - 1])->flags & DP_LK_RELU_GRAD) &&
             fuses_relu(m, l - 1, b));
}

/* A call of layer d of a slot with the weights params and the gradients
 * grads (NULL in a forward): what every kind may read (layer_kind.h). */
static dp_layer_call call_of(dp_model *m, int slot, const dp_layer *d, const float *params,
                             float *grads, int batch)
{
    dp_layer_call c = {.d = d, .batch = batch, .rows = m->rows, .drows = m->drows,
                       .chunk = d->chunk};
    if (d->w_len) {
        c.w = params + d->w_off, c.b = params + d->b_off;
        if (grads)
            c.gw = grads + d->w_off, c.gb = grads + d->b_off;
    }
    if (dp_layer_ops_of(d)->keep_floats)
        c.keep = m->acts + (size_t)slot * m->slot_floats + d->keep_off;
    if (d->s_len)
        c.state = m->buffers + d->s_off;
    c.sum = m->batch_sum, c.sum_ctx = m->batch_sum_ctx;
    return c;
}

/* Layers [a, b) of a slot from `in`, each through the layer table.  A
 * layer a relu follows in the range (DP_LK_FUSES_RELU) runs with it as one
 * kernel and writes only the relu's output.  train: a layer that draws
 * (dropout) draws, and one that is the identity in evaluation runs (else the
 * next layer reads its input).  Returns the mean loss when the range holds
 * the loss layer and y is given, else 0. */
static float forward(dp_model *m, int slot, const float *params, const float *in,
                     const uint8_t *y, int a, int b, int batch, int *correct, bool train)
{
    float loss = 0.0f;
    const float *inp = in;
    const float *block_in = NULL, *main_out = NULL; /* residual blocks: what res adds */
    for (int l = a; l < b;) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *o = dp_layer_ops_of(d);
        if (d->res & DP_RES_BEGIN)
            block_in = inp;
        if (d->res & DP_RES_SHORTCUT) /* the shortcut reads the block's input */
            main_out = inp, inp = block_in;
        if (!train && (o->flags & DP_LK_EVAL_IDENTITY)) {
            l++;
            continue;
        }
        int last = fuses_relu(m, l, b) ? l + 1 : l; /* the last layer this step covers */
        dp_layer_call c = call_of(m, slot, d, params, NULL, batch);
        c.in = inp;
        if (d->res & DP_RES_ADD) /* identity: the block's input; else the main branch's output */
            c.skip = d->res_sc ? main_out : block_in;
        c.out = act(m, slot, last + 1);
        c.relu = last > l;
        c.y = y;
        c.correct = correct;
        c.train = train;
        if (o->flags & DP_LK_DRAWS) {
            c.seed = mix64(m->drop_base + ++m->drop_count * 0x9e3779b97f4a7c15ULL + (uint64_t)l);
            m->drop_seeds[(size_t)slot * m->n_layers + l] = c.seed;
        }
        float r = o->forward(&c);
        if (o->flags & DP_LK_LOSS)
            loss = r;
        inp = c.out;
        l = last + 1;
    }
    return loss;
}

/* An optimiser update fused into backprop: o updates params from grads
 * layer by layer (dp_model_train_step). */
typedef struct fused_update {
    const dp_optim *o;
    const dp_optim_step *st;
    float *params;
} fused_update;

/* A gradient buffer that is neither g (the gradient a layer reads) nor keep
 * (a block output's gradient, kept for both branches). */
static float *free_dact(const dp_model *m, const float *g, const float *keep)
{
    for (int i = 0;; i++) {
        float *x = m->dacts + (size_t)i * m->dact_floats;
        if (x != g && x != keep)
            return x;
    }
}

/* Layers [a, b) of a slot backwards, from dout (or, when the range holds the
 * loss layer, from the labels y) to din.  A layer whose input is a relu in
 * the range and that takes its mask (DP_LK_TAKES_RELU_MASK: dense, maxpool)
 * produces the gradient at the relu's input in one kernel; one whose relu
 * after it ran in its forward and that takes that relu's backward too
 * (DP_LK_RELU_GRAD: bn) starts from the gradient at the relu's output.  Intermediate
 * gradients ping-pong between m->dacts' buffers.  A residual block
 * (docs/architecture.md, "Residual blocks") runs backwards from its res
 * layer: the gradient at its output, kept, goes to the shortcut's layers
 * (their gradient at the block's input lands in m->dskip), then to the main
 * branch's, and the block's first layer adds the shortcut's gradient (or,
 * for an identity, the kept one) to its own at the block's input (in the
 * pass of a relu before the block, relu_takes_skip).  notify: call
 * m->grad_ready after each layer with parameters.  u: update each layer's
 * parameters once both its products are done (its input gradient has read
 * the old weights), while its gradients are still in cache. */
static void backward(dp_model *m, int slot, float *din, float *grads, const float *params,
                     const float *dout, const float *in, const uint8_t *y, int a, int b,
                     int batch, bool notify, const fused_update *u)
{
    const float *g = dout; /* the gradient at the output of layer l */
    const float *keep = NULL, *skip = NULL; /* in a block: its output's gradient, and
                                             * the shortcut's at its input */
    const float *pend = NULL; /* a block's shortcut gradient the relu before it adds */
    for (int l = b - 1; l >= a;) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *o = dp_layer_ops_of(d);
        if (d->res & DP_RES_ADD) { /* both branches get g as it is */
            keep = g;
            skip = d->res_sc ? m->dskip : g;
            l--;
            continue;
        }
        int top = l; /* the last layer this step covers */
        if ((o->flags & DP_LK_RELU) && l - 1 >= a &&
            (dp_layer_ops_of(&m->layers[l - 1])->flags & DP_LK_RELU_GRAD) &&
            fuses_relu(m, l - 1, b)) { /* the relu's mask fuses into the layer before */
            d = &m->layers[--l];
            o = dp_layer_ops_of(d);
        }
        int first = l; /* the first layer this step covers */
        if ((o->flags & DP_LK_TAKES_RELU_MASK) && l - 1 >= a && !branch_start(d) &&
            (dp_layer_ops_of(&m->layers[l - 1])->flags & DP_LK_RELU))
            first = l - 1; /* the relu's mask fuses into this layer's input gradient */
        const dp_layer *f = &m->layers[first];
        /* the block's input: the range's, or the output of the layer before */
        const float *block_in = f->res & DP_RES_SHORTCUT
                                    ? (f->res_from == a ? in : act(m, slot, f->res_from))
                                    : NULL;
        dp_layer_call c = call_of(m, slot, d, params, grads, batch);
        /* the gradient at layer first's input */
        c.din = first == a ? din : free_dact(m, g, pend ? pend : keep);
        /* the shortcut's gradient at the block's input: not wanted when the
         * block starts the range and din is NULL */
        if (f->res & DP_RES_SHORTCUT)
            c.din = f->res_from == a && !din ? NULL : m->dskip;
        c.in = l == a ? in : act(m, slot, l); /* layer l's input */
        if (d->res & DP_RES_SHORTCUT)
            c.in = block_in;
        c.out = act(m, slot, top + 1);
        c.dout = g;
        c.relu = first < l;
        c.relu_after = top > l;
        c.skip = pend;
        pend = NULL;
        c.y = y;
        if (o->flags & DP_LK_DRAWS)
            c.seed = m->drop_seeds[(size_t)slot * m->n_layers + l];
        o->backward(&c);
        if (u && d->w_len) {
            dp_optim_apply_split(u->o, u->st, u->params, grads, d->w_off, d->w_off + d->w_len);
            dp_optim_apply_split(u->o, u->st, u->params, grads, d->b_off, d->b_off + d->b_len);
        }
        if (notify && m->grad_ready && d->w_len) /* this layer's [w_off, b_off + b_len) */
            m->grad_ready(m->grad_ready_ctx, d->w_off);
        if (f->res & DP_RES_SHORTCUT) { /* the main branch starts from the block's output */
            g = keep;
            l = first - 1;
            continue;
        }
        if ((f->res & DP_RES_BEGIN) && c.din) { /* the block's input gets both branches' */
            if (relu_takes_skip(m, first - 1, a, b))
                pend = skip; /* added in the relu's pass */
            else
                dp_lk_res_add(c.din, c.din, skip, (size_t)batch * f->in);
        }
        if (f->res & DP_RES_BEGIN)
            keep = skip = NULL;
        if (first > a)
            g = c.din;
        l = first - 1;
    }
}

const float *dp_model_forward_range(dp_model *m, int slot, const float *params,
                                    const float *in, int a, int b, int batch)
{
    if (!range_ok(m, slot, a, b, batch))
        return NULL;
    forward(m, slot, params, in, NULL, a, b, batch, NULL, true);
    return act(m, slot, b);
}

float dp_model_forward_range_loss(dp_model *m, int slot, const float *params, const float *in,
                                  const uint8_t *y, int a, int batch, int *correct)
{
    if (!y || !range_ok(m, slot, a, m->n_layers, batch))
        return NAN;
    return forward(m, slot, params, in, y, a, m->n_layers, batch, correct, true);
}

int dp_model_backward_range(dp_model *m, int slot, float *din, float *grads,
                            const float *params, const float *dout, const float *in, int a,
                            int b, int batch)
{
    if (!range_ok(m, slot, a, b, batch) || b == m->n_layers)
        return -1;
    backward(m, slot, din, grads, params, dout, in, NULL, a, b, batch, false, NULL);
    return 0;
}

int dp_model_backward_range_loss(dp_model *m, int slot, float *din, float *grads,
                                 const float *params, const float *in, const uint8_t *y, int a,
                                 int batch)
{
    if (!y || !range_ok(m, slot, a, m->n_layers, batch))
        return -1;
    backward(m, slot, din, grads, params, NULL, in, y, a, m->n_layers, batch, false, NULL);
    return 0;
}

float dp_model_forward(dp_model *m, const float *params, const float *x, const uint8_t *y,
                       int batch, int *correct)
{
    if (!y || !range_ok(m, 0, 0, m->n_layers, batch))
        return NAN;
    return forward(m, 0, params, x, y, 0, m->n_layers, batch, correct, false);
}

long dp_model_bad_inputs(const dp_model *m, int batch)
{
    long n = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *o = dp_layer_ops_of(d);
        if (o->bad_inputs && o->keep_floats)
            n += o->bad_inputs(d, m->acts + d->keep_off, batch); /* slot 0 */
    }
    return n;
}

float dp_model_forward_backward(dp_model *m, const float *x, const uint8_t *y, int batch,
                                int *correct)
{
    if (!y || !range_ok(m, 0, 0, m->n_layers, batch))
        return NAN;
    float loss = forward(m, 0, m->params, x, y, 0, m->n_layers, batch, correct, true);
    backward(m, 0, NULL, m->grads, m->params, NULL, x, y, 0, m->n_layers, batch, true, NULL);
    return loss;
}

void dp_model_batch_sum_idle(dp_model *m)
{
    if (!m->batch_sum || !m->acts)
        return;
    /* the order of the real step: forwards first to last, backwards back;
     * layer 0's backward wants no input gradient there either */
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (!(dp_layer_ops_of(d)->flags & DP_LK_BATCH_SUM))
            continue;
        dp_layer_call c = call_of(m, 0, d, m->params, NULL, 0);
        c.in = c.out = act(m, 0, l + 1);
        c.train = 1;
        dp_layer_ops_of(d)->forward(&c);
    }
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const dp_layer *d = &m->layers[l];
        if (!(dp_layer_ops_of(d)->flags & DP_LK_BATCH_SUM))
            continue;
        dp_layer_call c = call_of(m, 0, d, m->params, m->grads, 0);
        c.in = c.out = act(m, 0, l + 1);
        c.dout = m->dacts;
        c.din = l > 0 ? m->dacts + m->dact_floats : NULL;
        dp_layer_ops_of(d)->backward(&c);
    }
}

float dp_model_train_step(dp_model *m, dp_optim *o, const float *x, const uint8_t *y,
                          int batch, float lr, int *correct)
{
    if (!y || !range_ok(m, 0, 0, m->n_layers, batch) || o->n != m->n_params)
        return NAN;
    float loss = forward(m, 0, m->params, x, y, 0, m->n_layers, batch, correct, true);
    if (!isfinite(loss)) /* as the unfused step: no update from a diverged loss */
        return loss;
    dp_optim_step st = dp_optim_begin(o, lr);
    fused_update u = {o, &st, m->params};
    backward(m, 0, NULL, m->grads, m->params, NULL, x, y, 0, m->n_layers, batch, true, &u);
    return loss;
}
