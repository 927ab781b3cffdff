/* dropout: inverted dropout of a fraction while training, the identity in
 * evaluation.  Its mask is a hash of (seed, element), the seed drawn by the
 * executor for each training forward (DP_LK_DRAWS), so the backward
 * recomputes it and nothing is stored (docs/architecture.md, "Image
 * layers").  Model parallelism does not split it yet. */
#include "nn/layer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/dexec.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    char buf[80]; /* emit's longest spelling: a float's fixed digits */
    int n = (int)(end - s);
    double r = -1;
    char *stop = NULL;
    if (n > 0 && n < (int)sizeof buf && (*s == '0' || *s == '.')) {
        memcpy(buf, s, (size_t)n);
        buf[n] = '\0';
        r = strtod(buf, &stop);
    }
    if (!stop || *stop || !(r >= 0.0 && r < 1.0))
        return dp_spec_fail(p, "expected the fraction dropped in [0, 1), like dropout0.5");
    dp_layer *d = dp_spec_add(p, DP_LAYER_DROPOUT);
    if (!d)
        return -1;
    d->rate = (float)r;
    return 0;
}

/* %g, as checkpoints have it, except for a tiny rate, which %g writes as
 * 6e-13, whose '-' the grammar reads as the next token (found by
 * fuzz_model_spec): then the shortest fixed-point spelling that parses
 * back to the same float. */
static void emit(dp_spec_parser *p, const dp_layer *d)
{
    char buf[80];
    snprintf(buf, sizeof buf, "%g", (double)d->rate);
    if (strchr(buf, 'e'))
        for (int digits = 1; digits <= 60; digits++) {
            snprintf(buf, sizeof buf, "%.*f", digits, (double)d->rate);
            if ((float)strtod(buf, NULL) == d->rate)
                break;
        }
    dp_spec_emit(p, "-dropout%s", buf);
}

static float forward(const dp_layer_call *c)
{
    dp_dropout_forward(c->out, c->in, (size_t)c->batch * c->d->in, c->d->rate, c->seed);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din)
        dp_dropout_backward(c->din, c->dout, (size_t)c->batch * c->d->in, c->d->rate, c->seed);
}

/* The step's key, read from the step block (src/device/dmodel.c). */
static void dev_mask(const dp_dexec *x, float *dst, const float *src, const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    dp_kernel k = {.id = DP_K_DROPOUT, .items = (long)c->batch * d->in};
    k.u.dropout = (dp_ka_dropout){dst, src, c->key, (uint64_t)((double)d->rate * 4294967296.0),
                                  1.0f / (1.0f - d->rate)};
    dp_dexec_launch(x, &k);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dev_mask(x, c->out, c->in, c);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->din) /* the forward's mask, applied to dout */
        dev_mask(x, c->din, c->dout, c);
}

const dp_layer_ops dp_layer_dropout = {
    .kind = DP_LAYER_DROPOUT, .name = "dropout", .token = 1,
    .example = "dropout0.5", .help = "drop that fraction while training",
    .flags = DP_LK_EVAL_IDENTITY | DP_LK_DRAWS,
    .parse = parse, .emit = emit,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its mask is drawn over the whole tensor; not split yet",
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
