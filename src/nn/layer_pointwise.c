/* What the element-wise kinds (tanh, sigmoid, gelu) share: their pooled
 * loop over a call's elements, whole or a band of rows, and their device
 * launch (layer_impl.h).  The formulas are kernels.h's, one per kind.  And
 * any kernels.h kernel run on the CPU over the pool (dp_lk_pool_kernel),
 * which the kinds whose CPU path is their device bodies call. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/pool.h"

typedef struct job {
    const dp_layer_call *c;
    dp_lk_span_fn fn;
    size_t seg, nseg, stride, base; /* segment s: [s*stride + base, + seg) */
} job;

static void task(void *ctx, int i, int n)
{
    const job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->seg * j->nseg, 64, i, n, &lo, &hi);
    for (size_t v = lo; v < hi;) {
        size_t s = v / j->seg, o = v % j->seg, len = j->seg - o;
        if (len > hi - v)
            len = hi - v;
        size_t at = s * j->stride + j->base + o;
        j->fn(j->c, at, at + len);
        v += len;
    }
}

void dp_lk_pointwise(const dp_layer_call *c, bool band, dp_lk_span_fn fn)
{
    const dp_layer *L = c->d;
    job j = {c, fn, (size_t)c->batch * L->in, 1, 0, 0};
    if (band) {
        size_t row = (size_t)L->ow * L->oc;
        j.seg = (size_t)(c->y1 - c->y0) * row;
        j.nseg = (size_t)c->batch;
        j.stride = (size_t)L->out;
        j.base = (size_t)c->y0 * row;
    }
    if (j.seg && j.nseg)
        dp_pool_run(task, &j);
}

void dp_lk_pointwise_dev(const dp_dexec *x, const dp_layer_call *c, int kernel_id,
                         bool backward)
{
    if (c->batch < 1 || (backward && !c->din))
        return;
    dp_kernel k = {.id = (dp_kernel_id)kernel_id, .items = (long)c->batch * c->d->in};
    k.u.act = backward ? (dp_ka_act){c->din, c->in, c->dout, c->out}
                       : (dp_ka_act){c->out, c->in, NULL, NULL};
    dp_dexec_launch(x, &k);
}

/* Items [lo, hi) of k through its kernels.h body, as the sim device picks
 * it (src/device/sim.c). */
static void run_items(const dp_kernel *k, long lo, long hi)
{
    switch (k->id) {
#define CPU_CASE(ID, name)                                                                       \
    case DP_K_##ID:                                                                              \
        for (long i = lo; i < hi; i++)                                                           \
            dp_k_##name(k, i);                                                                   \
        break;
        DP_KERNELS(CPU_CASE)
#undef CPU_CASE
    default:
        break;
    }
}

typedef struct kernel_job {
    const dp_kernel *k;
    size_t align;
} kernel_job;

static void kernel_task(void *ctx, int i, int n)
{
    const kernel_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->k->items, j->align, i, n, &lo, &hi);
    run_items(j->k, (long)lo, (long)hi);
}

void dp_lk_pool_kernel(const dp_kernel *k, size_t align)
{
    if (k->items < 1)
        return;
    kernel_job j = {k, align};
    dp_pool_run(kernel_task, &j);
}
