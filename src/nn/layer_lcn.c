/* lcn: local contrast normalisation over an odd n x n neighbourhood
 * (layers.h, lcn.c).  Its forward keeps what its backward needs.  Its
 * divisor is a mean over the whole map, so model parallelism runs it whole
 * on every task.
 *
 * On a device, lcn.c's per-sample passes are each one kernel over every
 * sample of the batch (kernels.h, "lcn"), so the device gives the CPU's bits
 * (docs/gpu.md, "Layers").  lcn.c keeps, per sample, v, s, two maps of
 * scratch, the taps and the mean; on a device each is one array over
 * max_batch samples, so a kernel's item finds its sample's part by its
 * index: v (max_batch, N, c), then s, a, b (max_batch, N), then mean and gm
 * (max_batch), then the n taps, each on its own 64-byte line. */
#include "nn/layer_impl.h"

#include <stdlib.h>

#include "device/dexec.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long n = dp_spec_num(&s, end, 1, DP_SPEC_MAX_DIM);
    if (n < 1 || s != end || n % 2 == 0)
        return dp_spec_fail(p, "expected an odd neighbourhood size, like lcn5");
    if (dp_spec_need_image(p) < 0)
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_LCN);
    return !d || dp_spec_window(p, d, (int)n, (int)n, 1, (int)n / 2) < 0 ? -1 : 0;
}

static void emit(dp_spec_parser *p, const dp_layer *d) { dp_spec_emit(p, "-lcn%d", d->win.kh); }

static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return (size_t)max_batch * dp_lcn_keep_floats(&d->win);
}

static float forward(const dp_layer_call *c)
{
    dp_lcn_forward(c->out, c->keep, c->in, &c->d->win, c->batch);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din)
        dp_lcn_backward(c->din, c->dout, c->keep, &c->d->win, c->batch);
}

/* ---- device ---- */

static size_t line(size_t n) { return (n + 15) & ~(size_t)15; }

/* Where each of the keep's arrays starts, in floats. */
typedef struct keep_at {
    size_t v, s, a, b, mean, gm, u, floats;
} keep_at;

static keep_at keep_layout(const dp_layer *L, int max_batch)
{
    const dp_window *g = &L->win;
    size_t mb = (size_t)max_batch, np = (size_t)g->h * g->w;
    keep_at k;
    k.v = 0;
    k.s = k.v + line(mb * np * g->c);
    k.a = k.s + line(mb * np);
    k.b = k.a + line(mb * np);
    k.mean = k.b + line(mb * np);
    k.gm = k.mean + line(mb);
    k.u = k.gm + line(mb);
    k.floats = k.u + line((size_t)g->kh);
    return k;
}

/* The kernels' arguments over layer L's keep. */
static dp_ka_lcn lcn_args(const dp_layer *L, float *keep, int max_batch)
{
    const dp_window *g = &L->win;
    keep_at k = keep_layout(L, max_batch);
    return (dp_ka_lcn){.v = keep + k.v, .s = keep + k.s, .a = keep + k.a, .b = keep + k.b,
                       .mean = keep + k.mean, .gm = keep + k.gm, .u = keep + k.u,
                       .c = g->c, .h = g->h, .w = g->w, .n = g->kh, .eps = DP_LCN_EPS};
}

static size_t dev_keep(const dp_layer *L, int max_batch)
{
    return keep_layout(L, max_batch).floats;
}

/* The taps, queued once into the keep. */
static int dev_init(const dp_dexec *x, const dp_layer *L, float *keep, int max_batch)
{
    dp_ka_lcn a = lcn_args(L, keep, max_batch);
    float *u = malloc((size_t)a.n * sizeof *u);
    if (!u)
        return -1;
    dp_lcn_taps(u, a.n);
    /* pageable memory: read before the call returns (backend.h) */
    x->be->copy(x->ctx, (float *)a.u, u, (size_t)a.n * sizeof *u, DP_COPY_H2D);
    free(u);
    return 0;
}

static void run(const dp_dexec *x, dp_kernel_id id, long items, const dp_ka_lcn *a)
{
    dp_kernel k = {.id = id, .items = items};
    k.u.lcn = *a;
    x->be->launch(x->ctx, &k);
}

/* a = blur(a) / c through b, as lcn.c's blur with scale 1/c */
static void blur(const dp_dexec *x, long pixels, const dp_ka_lcn *a)
{
    run(x, DP_K_LCN_BLUR_H, pixels, a);
    run(x, DP_K_LCN_BLUR_V, pixels, a);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_ka_lcn a = lcn_args(c->d, c->keep, c->max_batch);
    a.in = c->in;
    a.out = c->out;
    long pixels = (long)c->batch * a.h * a.w;
    run(x, DP_K_LCN_SUM, pixels, &a);
    blur(x, pixels, &a); /* a = m */
    run(x, DP_K_LCN_CENTER, pixels, &a);
    blur(x, pixels, &a); /* a = S */
    run(x, DP_K_LCN_MEAN, c->batch, &a);
    run(x, DP_K_LCN_DIV, pixels * a.c, &a);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (!c->din)
        return;
    dp_ka_lcn a = lcn_args(c->d, c->keep, c->max_batch);
    a.in = c->dout;
    a.out = c->din;
    long pixels = (long)c->batch * a.h * a.w;
    run(x, DP_K_LCN_GD, pixels, &a);
    run(x, DP_K_LCN_GM, c->batch, &a);
    run(x, DP_K_LCN_GS, pixels, &a);
    blur(x, pixels, &a); /* a = dL/dQ */
    run(x, DP_K_LCN_GV, pixels, &a);
    blur(x, pixels, &a); /* a = dL/dxs */
    run(x, DP_K_LCN_ADD, pixels * a.c, &a);
}

const dp_layer_ops dp_layer_lcn = {
    .kind = DP_LAYER_LCN, .name = "lcn", .token = 1,
    .example = "lcn5", .help = "local contrast normalisation over 5x5",
    .parse = parse, .emit = emit, .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_FULL,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
    .dev_keep = dev_keep, .dev_init = dev_init,
};
