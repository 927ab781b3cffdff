/* bag<N>x<D>[m<M>][mean]: an embedding bag, as nn.EmbeddingBag(N, D,
 * mode="sum" or "mean"), for one categorical feature of a click-through
 * model (docs/models.md, "Click-through models").  A record holds M ids for
 * the feature (M = 1: a single-valued feature; -1 marks an empty place of a
 * multi-valued one).  The layer takes those M ids from the FRONT of its
 * input and appends the pooled embedding at the BACK:
 *
 *     in  = [ids (M), rest (W - M)]   ->   out = [rest (W - M), pooled (D)]
 *
 * so a run of bags over a record [f1 ids, f2 ids, ..., numeric] ends as
 * [numeric, e1, e2, ...]: the embeddings concatenated with the numeric
 * features, for an MLP.  Bags must be the model's first layers; each one's
 * ids are therefore columns [bag_col, bag_col + M) of the model's input (a
 * pure function of the record, which the sparse exchange reads without a
 * forward), and its table is one contiguous (N, D) block of the flat
 * parameter buffer, file name weight as nn.EmbeddingBag's.
 *
 * Ids are floats (exact below 2^24, so N <= 2^24).  An id that is -1 is an
 * empty place; any other id that is not an integer in [0, N) is skipped and
 * counted in the keep (bad_inputs: evaluation sums it, the run warns once;
 * the readers refuse such ids in files, docs/datasets.md).  Mean pooling
 * divides by the ids used; a bag with none gives zeros, as nn.EmbeddingBag.
 * Initial weights uniform in +-1/sqrt(D) (fans 3D and 3D).
 *
 * The forward's pass over the ids runs on the calling thread (M ids a
 * record) and keeps them; the copies and sums split over the pool by
 * records.  The backward's table gradient is dense, as emb's: each thread
 * owns a range of the table's rows, zeroes them and adds every record's
 * output gradient into the rows it owns, records and places in order, so no
 * result depends on the thread count.  The gradient at the input is zero
 * at the ids and the output's gradient passed back at the rest.  Its
 * table is a sparse table (layer_kind.h: sparse, sparse_ids, sparse_slots):
 * a parameter server moves only the rows a batch names, and a worker may
 * hold it compact, the ids rewritten to slots (docs/architecture.md,
 * "Sparse tables").  Model parallelism and the device refuse it (no
 * kernels yet). */
#include "nn/layer_impl.h"

#include <math.h>
#include <string.h>

#include "downpour/pool.h"

#define MAX_ROWS (1L << 24) /* ids a float holds exactly */
#define MAX_IDS 4096        /* places of a multi-valued feature */

/* D: what the layer appends */
static int dim_of(const dp_layer *d) { return d->out - d->in + d->bag_ids; }

static long rows_of(const dp_layer *d) { return (long)(d->w_len / (size_t)dim_of(d)); }

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long n = dp_spec_num(&s, end, 1, MAX_ROWS), dim = -1, ids = 1;
    int mean = 0;
    if (n > 0 && s < end && *s == 'x') {
        s++;
        dim = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    }
    if (dim > 0 && end - s >= 2 && s[0] == 'm' && s[1] >= '0' && s[1] <= '9') {
        s++;
        ids = dp_spec_num(&s, end, 1, MAX_IDS);
    }
    if (ids > 0 && end - s == 4 && memcmp(s, "mean", 4) == 0)
        mean = 1, s = end;
    if (n < 1 || dim < 1 || ids < 1 || s != end)
        return dp_spec_fail(p, "expected bag<N>x<D>[m<M>][mean]: N ids in [1, %ld], a width D "
                               "in [1, %d], M ids a record in [1, %d] (default 1), sum pooled "
                               "unless 'mean', like bag1000x16 or bag1000x16m4mean",
                            MAX_ROWS, DP_SPEC_MAX_WIDTH, MAX_IDS);
    dp_model *m = p->m;
    int col = 0;
    for (int l = 0; l < m->n_layers; l++) {
        if (m->layers[l].kind != DP_LAYER_BAG)
            return dp_spec_fail(p, "an embedding bag takes its ids from the model's input, so "
                                   "bags must be the first layers (like "
                                   "12-bag1000x16-bag50x8-...), not after a %s",
                                dp_layer_kind_name(m->layers[l].kind));
        col += m->layers[l].bag_ids;
    }
    int input = m->n_layers ? m->layers[0].in : p->c;
    if (p->h * p->w > 1)
        return dp_spec_fail(p, "an embedding bag takes a flat input of ids and numeric "
                               "features (like 12-bag1000x16-...), not an image");
    if (ids > input - col)
        return dp_spec_fail(p, "needs %ld ids a record but only %d input columns are left "
                               "after the bags before it (input %d, %d ids taken)",
                            ids, input - col, input, col);
    dp_layer *d = dp_spec_add(p, DP_LAYER_BAG);
    if (!d)
        return -1;
    d->bag_ids = (int)ids;
    d->bag_col = col;
    d->bag_mean = mean;
    if (dp_spec_out(p, d, d->in - (int)ids + (int)dim, 1, 1) < 0 ||
        dp_spec_params(p, d, (size_t)n * (size_t)dim, 0) < 0)
        return -1;
    p->flat = true;
    return 0;
}

static void emit(dp_spec_parser *p, const dp_layer *d)
{
    dp_spec_emit(p, "-bag%ldx%d", rows_of(d), dim_of(d));
    if (d->bag_ids > 1)
        dp_spec_emit(p, "m%d", d->bag_ids);
    if (d->bag_mean)
        dp_spec_emit(p, "mean");
}

static void fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    *fan_in = *fan_out = 3.0 * dim_of(d); /* sqrt(6 / 6D) = 1 / sqrt(D) */
}

static int tensors(const dp_layer *d, dp_lk_tensor out[DP_LK_MAX_TENSORS])
{
    out[0] = (dp_lk_tensor){"weight", 0, 2, {rows_of(d), dim_of(d)}};
    return 1;
}

static double cost(const dp_layer *d) { return (double)d->bag_ids * dim_of(d) + d->out; }

/* Per slot: the ids used (batch x M, -1 for none), each record's scale (1,
 * or 1 / ids used for mean), and the count of skipped ids. */
static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return (size_t)max_batch * ((size_t)d->bag_ids + 1) + 1;
}

typedef struct bag_task {
    const dp_layer_call *c;
} bag_task;

/* Forward: records [lo, hi) of thread i. */
static void fwd_task(void *ctx, int i, int n)
{
    const dp_layer_call *c = ((bag_task *)ctx)->c;
    const dp_layer *d = c->d;
    int M = d->bag_ids, D = dim_of(d), W = d->in;
    const float *ids = c->keep, *scale = c->keep + (size_t)c->batch * M;
    size_t lo, hi;
    dp_pool_range((size_t)c->batch, 1, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        const float *x = c->in + r * W;
        float *o = c->out + r * d->out, *e = o + (W - M);
        memcpy(o, x + M, (size_t)(W - M) * sizeof *o);
        memset(e, 0, (size_t)D * sizeof *e);
        for (int j = 0; j < M; j++) {
            float id = ids[r * M + j];
            if (id < 0)
                continue;
            const float *row = c->w + (size_t)id * D;
            for (int k = 0; k < D; k++)
                e[k] += row[k];
        }
        if (scale[r] != 1.0f)
            for (int k = 0; k < D; k++)
                e[k] *= scale[r];
    }
}

/* Checks each id, keeps the ones used and each record's scale: on the
 * calling thread, so the count of skipped ids needs no reduction. */
static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int M = d->bag_ids;
    long bad = 0;
    float *ids = c->keep, *scale = c->keep + (size_t)c->batch * M;
    for (int r = 0; r < c->batch; r++) {
        const float *x = c->in + (size_t)r * d->in;
        int used = 0;
        for (int j = 0; j < M; j++) {
            long row = dp_model_bag_row(d, x[j]); /* the rule the sparse exchange reads too */
            if (row < 0 && x[j] != -1.0f)
                bad++;
            ids[(size_t)r * M + j] = (float)row;
            used += row >= 0;
        }
        scale[r] = d->bag_mean && used > 1 ? 1.0f / (float)used : 1.0f;
    }
    c->keep[(size_t)c->batch * (M + 1)] = (float)bad;
    bag_task t = {.c = c};
    dp_pool_run(fwd_task, &t);
    return 0.0f;
}

static long bad_inputs(const dp_layer *d, const float *keep, int batch)
{
    return (long)keep[(size_t)batch * (d->bag_ids + 1)];
}

/* Backward: the table's rows [lo, hi) of thread i, zeroed, then every
 * record's gradient added into the rows it used, in order. */
static void bwd_task(void *ctx, int i, int n)
{
    const dp_layer_call *c = ((bag_task *)ctx)->c;
    const dp_layer *d = c->d;
    int M = d->bag_ids, D = dim_of(d), W = d->in;
    const float *ids = c->keep, *scale = c->keep + (size_t)c->batch * M;
    size_t lo, hi;
    dp_pool_range((size_t)rows_of(d), 64, i, n, &lo, &hi);
    if (hi <= lo)
        return;
    memset(c->gw + lo * D, 0, (hi - lo) * (size_t)D * sizeof *c->gw);
    for (int r = 0; r < c->batch; r++) {
        const float *g = c->dout + (size_t)r * d->out + (W - M);
        for (int j = 0; j < M; j++) {
            float id = ids[(size_t)r * M + j];
            if (id < (float)lo || id >= (float)hi)
                continue; /* -1, or another thread's row */
            float *row = c->gw + (size_t)id * D, s = scale[r];
            for (int k = 0; k < D; k++)
                row[k] += s * g[k];
        }
    }
}

static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    bag_task t = {.c = c};
    dp_pool_run(bwd_task, &t);
    if (!c->din)
        return;
    int M = d->bag_ids, W = d->in;
    for (int r = 0; r < c->batch; r++) {
        float *g = c->din + (size_t)r * W;
        memset(g, 0, (size_t)M * sizeof *g);
        memcpy(g + M, c->dout + (size_t)r * d->out, (size_t)(W - M) * sizeof *g);
    }
}

/* Its table is a sparse table (layer_kind.h): a batch reads only the rows
 * its ids name, columns [bag_col, bag_col + M) of the model's input. */
static int sparse(const dp_layer *d, dp_lk_sparse out[DP_LK_MAX_SPARSE])
{
    out[0] = (dp_lk_sparse){d->w_off, rows_of(d), dim_of(d), d->bag_ids};
    return 1;
}

/* The row of the whole table a record's value names: dp_model_bag_row's
 * rule, over the table's rows on the servers when this one is compact. */
static long whole_row(const dp_layer *d, float v)
{
    if (!d->sparse_rows)
        return dp_model_bag_row(d, v);
    return v >= 0.0f && v < (float)d->sparse_rows && v == floorf(v) ? (long)v : -1;
}

/* The rows the forward reads: dp_model_bag_row's, empty places (-1) and
 * skipped ids left out. */
static long sparse_ids(const dp_layer *d, int k, const float *x, int width, int batch,
                       uint32_t *ids)
{
    (void)k;
    long n = 0;
    for (int r = 0; r < batch; r++)
        for (int j = 0; j < d->bag_ids; j++) {
            long row = whole_row(d, x[(size_t)r * width + d->bag_col + j]);
            if (row >= 0)
                ids[n++] = (uint32_t)row;
        }
    return n;
}

/* Each id to its slot; an empty place stays -1, a bad id becomes NaN, which
 * the forward skips and counts as it would have the id. */
static void sparse_slots(const dp_layer *d, int k, float *x, int width, int batch,
                         long (*slot)(const void *ctx, uint32_t row), const void *ctx)
{
    (void)k;
    for (int r = 0; r < batch; r++)
        for (int j = 0; j < d->bag_ids; j++) {
            float *v = &x[(size_t)r * width + d->bag_col + j];
            long row = whole_row(d, *v);
            *v = row >= 0 ? (float)slot(ctx, (uint32_t)row) : *v == -1.0f ? -1.0f : NAN;
        }
}

const dp_layer_ops dp_layer_bag = {
    .kind = DP_LAYER_BAG, .name = "bag", .token = 1,
    .example = "bag1000x16",
    .help = "a feature's ids (the input's first) pooled to width 16 (nn.EmbeddingBag)",
    .parse = parse, .emit = emit, .fans = fans, .tensors = tensors, .cost = cost,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .bad_inputs = bad_inputs,
    .sparse = sparse, .sparse_ids = sparse_ids, .sparse_slots = sparse_slots,
    .bad_inputs_what = "ids that are not integers in its table's rows (bag<N>x<D>: [0, N)) "
                       "nor -1 (an empty place), each skipped",
    .mp = DP_MP_REFUSE,
    .mp_reason = "its table would be needed whole on every task (parameter servers move "
                 "it by sparse rows instead: docs/strategies.md), and a layer run "
                 "whole on every task (FULL) holds no parameters",
    .dev_reason = "click-through models (bag, lead, dot, bce) train on the CPU for now; "
                  "leave out --device (docs/models.md, \"Click-through models\")",
};
