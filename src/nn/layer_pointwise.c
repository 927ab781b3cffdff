/* What the element-wise kinds (tanh, sigmoid, gelu) share: their pooled
 * loop over a call's elements, whole or a band of rows, and their device
 * launch (layer_impl.h).  The formulas are kernels.h's, one per kind. */
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
