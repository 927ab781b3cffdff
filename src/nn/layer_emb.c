/* emb<N>x<D>: an embedding from integer ids, as nn.Embedding(N, D).  The
 * model's input is T ids (a flat input of T features, each an id in
 * [0, N) stored as a float); the output is T tokens of width D, an NHWC
 * image of h = T, w = 1, c = D (docs/models.md, "Images as tokens"), which
 * ln, mha, pos, conv1x1 and gap take.  Its one parameter is weight (N, D) in files,
 * as nn.Embedding's; its initial values are uniform with standard
 * deviation 1 (nn.Embedding draws normal(0, 1)): the Glorot draw with fans
 * 1 and 1.
 *
 * An id is rounded to the nearest integer and clamped to [0, N): a bad id
 * never reads outside the table.  The forward counts the ids it had to
 * change (not an integer, or out of range) in the keep's last float
 * (bad_inputs): evaluation sums it, and the run warns once when it is not
 * zero (dp_model_bad_inputs, dp_evaluate).  The passes are
 * kernels.h's bodies ("tokens"), called by the CPU's loops and launched on
 * a device alike, so the two give the same bits.  The forward's pass over
 * the ids runs on the calling thread (T ids a record: a few thousand per
 * batch) and keeps the ids it used; the row copies split over the pool.
 * The backward's weight gradient is dense: zero, then each token's output
 * gradient added into its id's row, records and tokens in order, split over
 * the pool by columns of the table, so no result depends on the thread
 * count.  The gradient at the input is zero (ids are not differentiable).
 * It must be the model's first layer.  Model parallelism refuses it.
 *
 * Its table is a sparse table (layer_kind.h, sparse): a batch reads only
 * the rows its ids name, and those ids are the model's input, so they are
 * known before the forward; a parameter server then moves only those rows
 * (docs/strategies.md, "Sparse rows"). */
#include "nn/layer_impl.h"

#include <math.h>
#include <string.h>

#include "device/dexec.h"

#define MAX_ROWS (1L << 24) /* ids a float holds exactly */

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long n = dp_spec_num(&s, end, 1, MAX_ROWS), dim = -1;
    if (n > 0 && s < end && *s == 'x') {
        s++;
        dim = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    }
    if (n < 1 || dim < 1 || s != end)
        return dp_spec_fail(p, "expected emb<N>x<D>: N ids in [1, %ld] and a width D in "
                               "[1, %d], like emb1000x64",
                            MAX_ROWS, DP_SPEC_MAX_WIDTH);
    if (p->m->n_layers != 0 || p->h * p->w > 1)
        return dp_spec_fail(p, "an embedding takes the model's input of integer ids, so it "
                               "must be the first layer, on a flat input of T ids (like "
                               "16-emb1000x64), not on %s",
                            p->m->n_layers ? "another layer's output" : "an image");
    dp_layer *d = dp_spec_add(p, DP_LAYER_EMB);
    if (!d || dp_spec_out(p, d, (int)dim, d->in, 1) < 0 ||
        dp_spec_params(p, d, (size_t)n * (size_t)dim, 0) < 0)
        return -1;
    p->hwc = true; /* T tokens of width D, token after token */
    return 0;
}

static void emit(dp_spec_parser *p, const dp_layer *d)
{
    dp_spec_emit(p, "-emb%zux%d", d->w_len / (size_t)d->oc, d->oc);
}

static long rows_of(const dp_layer *d) { return (long)(d->w_len / (size_t)d->oc); }

static void fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    (void)d;
    *fan_in = *fan_out = 1.0; /* sqrt(6 / 2) / sqrt(3) = 1 */
}

static int tensors(const dp_layer *d, dp_lk_tensor out[DP_LK_MAX_TENSORS])
{
    out[0] = (dp_lk_tensor){"weight", 0, 2, {rows_of(d), d->oc}};
    return 1;
}

static double cost(const dp_layer *d) { return d->out; }

/* The ids used (as floats, exact below 2^24) and the count of changed ones. */
static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return (size_t)max_batch * d->in + 1;
}

static dp_kernel kernel(const dp_layer_call *c, dp_kernel_id id, long items)
{
    dp_kernel k = {.id = id, .items = items};
    long R = (long)c->batch * c->d->in;
    k.u.tok = (dp_ka_tok){.dst = id == DP_K_EMB_GRAD ? c->gw : c->out,
                          .src = id == DP_K_EMB_GRAD ? c->dout : c->in, .p = c->w,
                          .ids = c->keep, .R = R, .F = c->d->oc, .N = rows_of(c->d)};
    return k;
}

static float forward(const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_EMB_IDS, 0);
    c->keep[k.u.tok.R] = 0.0f;
    for (long t = 0; t < k.u.tok.R; t++)
        dp_k_emb_ids(&k, t);
    k = kernel(c, DP_K_EMB_FWD, (long)c->batch * c->d->out);
    dp_lk_pool_kernel(&k, 64);
    return 0.0f;
}

/* The count the forward left after the ids. */
static long bad_inputs(const dp_layer *d, const float *keep, int batch)
{
    return (long)keep[(size_t)batch * d->in];
}

/* the table's gradient a column at a time (dp_lk_pool_kernel) */
static void backward(const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_EMB_GRAD, c->d->oc);
    dp_lk_pool_kernel(&k, 1);
    if (c->din)
        memset(c->din, 0, (size_t)c->batch * c->d->in * sizeof(float));
}

static int sparse(const dp_layer *d, dp_lk_sparse out[DP_LK_MAX_SPARSE])
{
    out[0] = (dp_lk_sparse){d->w_off, rows_of(d), d->oc, d->in};
    return 1;
}

/* The forward's ids (dp_k_emb_ids: rounded, clamped into the table). */
static long sparse_ids(const dp_layer *d, int k, const float *x, int width, int batch,
                       uint32_t *ids)
{
    (void)k;
    (void)width; /* the first layer: its input is the model's */
    long n = (long)batch * d->in;
    float top = (float)((d->sparse_rows ? d->sparse_rows : rows_of(d)) - 1);
    for (long t = 0; t < n; t++) {
        float id = nearbyintf(x[t]);
        id = !(id >= 0.0f) ? 0.0f : id > top ? top : id;
        ids[t] = (uint32_t)id;
    }
    return n;
}

/* Each id (rounded and clamped into the whole table, as sparse_ids) to
 * its slot. */
static void sparse_slots(const dp_layer *d, int k, float *x, int width, int batch,
                         long (*slot)(const void *ctx, uint32_t row), const void *ctx)
{
    (void)k;
    (void)width;
    long n = (long)batch * d->in;
    float top = (float)((d->sparse_rows ? d->sparse_rows : rows_of(d)) - 1);
    for (long t = 0; t < n; t++) {
        float id = nearbyintf(x[t]);
        id = !(id >= 0.0f) ? 0.0f : id > top ? top : id;
        x[t] = (float)slot(ctx, (uint32_t)id);
    }
}

static size_t dev_keep(const dp_layer *d, int max_batch) { return keep_floats(d, max_batch); }

static void fill(const dp_dexec *x, float *p, long n)
{
    dp_kernel k = {.id = DP_K_FILL, .items = n};
    k.u.fill = (dp_ka_fill){p, 0.0f};
    dp_dexec_launch(x, &k);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_EMB_IDS, (long)c->batch * c->d->in);
    fill(x, c->keep + k.u.tok.R, 1);
    dp_dexec_launch(x, &k);
    k = kernel(c, DP_K_EMB_FWD, (long)c->batch * c->d->out);
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_EMB_GRAD, c->d->oc);
    dp_dexec_launch(x, &k);
    if (c->din)
        fill(x, c->din, (long)c->batch * c->d->in);
}

const dp_layer_ops dp_layer_emb = {
    .kind = DP_LAYER_EMB, .name = "emb", .token = 1,
    .example = "emb1000x64", .help = "integer ids (the input) to tokens of width 64 (nn.Embedding)",
    .parse = parse, .emit = emit, .fans = fans, .tensors = tensors, .cost = cost,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .bad_inputs = bad_inputs,
    .sparse = sparse, .sparse_ids = sparse_ids, .sparse_slots = sparse_slots,
    .bad_inputs_what = "ids that are not integers or lie outside its table's rows (emb<N>x<D>: "
                       "[0, N)), each rounded and clamped into the table",
    .mp = DP_MP_REFUSE,
    .mp_reason = "its table would be needed whole on every task (parameter servers move "
                 "it by sparse rows instead: docs/strategies.md), and a layer run whole on "
                 "every task (FULL) holds no parameters",
    .dev_forward = dev_forward, .dev_backward = dev_backward, .dev_keep = dev_keep,
};
