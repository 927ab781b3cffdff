/* A stack of dense layers over one flat parameter buffer (DESIGN decision 1). */
#include "downpour/model.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/layers.h"
#include "downpour/rng.h"

#define MAX_WIDTH 65536
#define MAX_CLASSES 256 /* labels are uint8 */

static const struct {
    const char *name, *widths;
} presets[] = {
    {"mlp-300-100", "784-300-100-10"},
    {"mlp-128", "784-128-10"},
};

/* Parses "784-300-100-10" into widths[]; returns the count or -1. */
static int parse_widths(const char *spec, const char *shown, int *widths, dp_err *err)
{
    int n = 0;
    const char *s = spec;
    for (;;) {
        if (*s < '0' || *s > '9') {
            if (*s == '\0')
                return dp_errf(err, "model spec '%s': %s", shown,
                               n ? "ends with '-' (a width is missing)"
                                 : "is empty (expected a preset mlp-300-100 or mlp-128, "
                                   "or widths like 784-300-100-10)");
            if (*s == '-')
                return dp_errf(err, "model spec '%s': empty width at position %d", shown,
                               (int)(s - spec) + 1);
            if (s == spec)
                return dp_errf(err,
                               "model spec '%s': not a preset (mlp-300-100, mlp-128) nor "
                               "widths joined by '-' like 784-300-100-10",
                               shown);
            return dp_errf(err, "model spec '%s': unexpected '%c' at position %d", shown, *s,
                           (int)(s - spec) + 1);
        }
        long v = 0;
        const char *start = s;
        while (*s >= '0' && *s <= '9') {
            if (v <= MAX_WIDTH)
                v = v * 10 + (*s - '0');
            s++;
        }
        if (v < 1 || v > MAX_WIDTH)
            return dp_errf(err, "model spec '%s': width %.*s is out of range [1, %d]", shown,
                           (int)(s - start), start, MAX_WIDTH);
        if (n == DP_MAX_DENSE + 1)
            return dp_errf(err, "model spec '%s': more than %d layers (at most %d widths)",
                           shown, DP_MAX_DENSE, DP_MAX_DENSE + 1);
        widths[n++] = (int)v;
        if (*s == '\0')
            break;
        if (*s != '-')
            return dp_errf(err, "model spec '%s': unexpected '%c' at position %d", shown, *s,
                           (int)(s - spec) + 1);
        s++;
    }
    if (n < 2)
        return dp_errf(err, "model spec '%s': needs at least two widths (inputs-classes)",
                       shown);
    if (widths[n - 1] > MAX_CLASSES)
        return dp_errf(err, "model spec '%s': %d classes, at most %d (labels are 8-bit)", shown,
                       widths[n - 1], MAX_CLASSES);
    return n;
}

static float *alloc_floats(size_t n)
{
    /* 64-byte aligned (a cache line, an AVX-512 vector) for the GEMM kernels. */
    size_t bytes = (n ? n : 1) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes);
}

/* Floats in each of the two ping-pong gradient buffers: max_batch rows of the
 * widest layer output, rounded up so the second starts on a cache line. */
static size_t dacts_half(const dp_model *m)
{
    int max_width = 0;
    for (int i = 0; i < m->n_dense; i++)
        if (m->dense[i].out > max_width)
            max_width = m->dense[i].out;
    return ((size_t)m->max_batch * max_width + 15) & ~(size_t)15;
}

int dp_model_init(dp_model *m, const char *spec, int max_batch, dp_err *err)
{
    memset(m, 0, sizeof *m);
    if (!spec)
        return dp_errf(err, "model spec: missing");
    const char *widths_str = spec;
    const char *preset = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(spec, presets[i].name) == 0) {
            preset = presets[i].name;
            widths_str = presets[i].widths;
        }
    }
    int widths[DP_MAX_DENSE + 1];
    int nw = parse_widths(widths_str, spec, widths, err);
    if (nw < 0)
        return -1;
    int max_width = 0; /* over widths[1..]: every activation and gradient buffer */
    for (int i = 1; i < nw; i++)
        if (widths[i] > max_width)
            max_width = widths[i];
    if (max_batch < 1 || max_batch > INT_MAX / max_width || max_batch > INT_MAX / widths[0])
        return dp_errf(err, "model %s: max batch %d out of range [1, %d]", spec, max_batch,
                       INT_MAX / (max_width > widths[0] ? max_width : widths[0]));

    m->n_dense = nw - 1;
    size_t off = 0, len = 0, act = 0;
    for (int i = 0; i < m->n_dense; i++) {
        dp_dense *d = &m->dense[i];
        d->in = widths[i];
        d->out = widths[i + 1];
        d->w_off = off;
        off += (size_t)d->in * d->out;
        d->b_off = off;
        off += (size_t)d->out;
        d->relu = i + 1 < m->n_dense;
        len += (size_t)snprintf(m->spec + len, sizeof m->spec - len, "%s%d", i ? "-" : "",
                                d->in);
        /* act_off[i+1]: output of dense i = input of dense i+1 (or the logits). */
        m->act_off[i + 1] = act;
        act += (size_t)max_batch * d->out;
    }
    snprintf(m->spec + len, sizeof m->spec - len, "-%d", widths[nw - 1]);
    snprintf(m->name, sizeof m->name, "%s", preset ? preset : m->spec);
    m->act_off[0] = 0; /* unused: dense 0 reads the caller's x, never copied */
    m->n_params = off;
    m->max_batch = max_batch;

    size_t psize = (size_t)max_batch * widths[nw - 1];
    m->params = alloc_floats(m->n_params);
    m->grads = alloc_floats(m->n_params);
    m->acts = alloc_floats(act);
    m->dacts = alloc_floats(2 * dacts_half(m));
    m->probs = alloc_floats(psize);
    if (!m->params || !m->grads || !m->acts || !m->dacts || !m->probs) {
        dp_model_free(m);
        return dp_errf(err, "model %s: out of memory for %zu parameters and batch %d", spec,
                       off, max_batch);
    }
    memset(m->params, 0, m->n_params * sizeof(float));
    memset(m->grads, 0, m->n_params * sizeof(float));
    return 0;
}

void dp_model_free(dp_model *m)
{
    if (!m)
        return;
    free(m->params);
    free(m->grads);
    free(m->acts);
    free(m->dacts);
    free(m->probs);
    m->params = m->grads = m->acts = m->dacts = m->probs = NULL;
    m->n_params = 0;
    m->max_batch = 0;
}

int dp_model_inputs(const dp_model *m) { return m->dense[0].in; }

int dp_model_classes(const dp_model *m) { return m->dense[m->n_dense - 1].out; }

void dp_model_init_params(dp_model *m, uint64_t seed)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (int i = 0; i < m->n_dense; i++) {
        const dp_dense *d = &m->dense[i];
        float limit = sqrtf(6.0f / (float)(d->in + d->out));
        float *w = m->params + d->w_off;
        size_t nw = (size_t)d->in * d->out;
        for (size_t k = 0; k < nw; k++)
            w[k] = (2.0f * dp_rng_uniform(&rng) - 1.0f) * limit;
        memset(m->params + d->b_off, 0, (size_t)d->out * sizeof(float));
    }
}

/* Runs every dense layer; leaves the logits at acts + act_off[n_dense]. */
static void forward_layers(dp_model *m, const float *x, int batch)
{
    const float *inp = x;
    for (int i = 0; i < m->n_dense; i++) {
        const dp_dense *d = &m->dense[i];
        float *out = m->acts + m->act_off[i + 1];
        const float *w = m->params + d->w_off, *b = m->params + d->b_off;
        if (d->relu)
            dp_dense_relu_forward(out, inp, w, b, batch, d->in, d->out);
        else
            dp_dense_forward(out, inp, w, b, batch, d->in, d->out);
        inp = out;
    }
}

float dp_model_forward(dp_model *m, const float *x, const uint8_t *y, int batch, int *correct)
{
    if (batch < 1 || batch > m->max_batch)
        return NAN;
    forward_layers(m, x, batch);
    return dp_softmax_xent_forward(m->probs, m->acts + m->act_off[m->n_dense], y, batch,
                                   dp_model_classes(m), correct);
}

float dp_model_forward_backward(dp_model *m, const float *x, const uint8_t *y, int batch,
                                int *correct)
{
    if (batch < 1 || batch > m->max_batch)
        return NAN;
    float loss = dp_model_forward(m, x, y, batch, correct);
    float *cur = m->dacts, *next = m->dacts + dacts_half(m);

    dp_softmax_xent_backward(cur, m->probs, y, batch, dp_model_classes(m));
    for (int i = m->n_dense - 1; i >= 0; i--) {
        const dp_dense *d = &m->dense[i];
        const float *inp = i ? m->acts + m->act_off[i] : x;
        if (i == 0) { /* the first layer needs no input gradient */
            dp_dense_backward_overwrite(NULL, m->grads + d->w_off, m->grads + d->b_off, cur,
                                        inp, m->params + d->w_off, batch, d->in, d->out);
            if (m->grad_ready)
                m->grad_ready(m->grad_ready_ctx, d->w_off);
            break;
        }
        /* inp is the previous layer's relu output: the mask fuses into the product */
        dp_dense_backward_relu_overwrite(next, m->grads + d->w_off, m->grads + d->b_off, cur,
                                         inp, m->params + d->w_off, batch, d->in, d->out);
        if (m->grad_ready) /* this layer's weights and bias: [w_off, b_off + out) */
            m->grad_ready(m->grad_ready_ctx, d->w_off);
        float *t = cur;
        cur = next;
        next = t;
    }
    return loss;
}
