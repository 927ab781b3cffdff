/* The model as a sequence of typed layers over one flat parameter buffer
 * (docs/architecture.md, "The model"): forward and backward over any range of layers. */
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

/* n floats rounded up to a cache line, so the next buffer starts on one. */
static size_t line_floats(size_t n) { return (n + 15) & ~(size_t)15; }

const char *dp_layer_kind_name(dp_layer_kind kind)
{
    static const char *const names[DP_LAYER_KIND_COUNT] = {
        [DP_LAYER_DENSE] = "dense",
        [DP_LAYER_RELU] = "relu",
        [DP_LAYER_SOFTMAX_XENT] = "softmax_xent",
    };
    return (unsigned)kind < DP_LAYER_KIND_COUNT ? names[kind] : "?";
}

int dp_model_init(dp_model *m, const char *spec, int max_batch, int slots, dp_err *err)
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

    /* dense, relu, dense, relu, ..., dense, softmax_xent */
    int n = 0;
    size_t off = 0, len = 0;
    for (int i = 0; i + 1 < nw; i++) {
        dp_layer *d = &m->layers[n++];
        *d = (dp_layer){DP_LAYER_DENSE, widths[i], widths[i + 1], off, 0};
        off += (size_t)d->in * d->out;
        d->b_off = off;
        off += (size_t)d->out;
        m->layers[n++] = (dp_layer){i + 2 < nw ? DP_LAYER_RELU : DP_LAYER_SOFTMAX_XENT,
                                    d->out, d->out, 0, 0};
        len += (size_t)snprintf(m->spec + len, sizeof m->spec - len, "%s%d", i ? "-" : "",
                                d->in);
    }
    snprintf(m->spec + len, sizeof m->spec - len, "-%d", widths[nw - 1]);
    snprintf(m->name, sizeof m->name, "%s", preset ? preset : m->spec);
    m->n_layers = n;
    m->n_dense = nw - 1;
    m->n_params = off;
    m->max_batch = max_batch;

    /* One slot: every layer's output for max_batch rows, each on a cache line.
     * act_off[0] stays 0, unused: a range reads its input where the caller has it. */
    size_t per_slot = 0;
    for (int l = 0; l < n; l++) {
        m->act_off[l + 1] = per_slot;
        per_slot += line_floats((size_t)max_batch * m->layers[l].out);
    }
    m->slot_floats = per_slot;
    m->dact_floats = line_floats((size_t)max_batch * max_width);
    size_t max_slots = SIZE_MAX / sizeof(float) / per_slot;
    if (slots < 1 || (size_t)slots > max_slots)
        return dp_errf(err, "model %s: %d activation slots out of range [1, %zu]", spec, slots,
                       max_slots < INT_MAX ? max_slots : (size_t)INT_MAX);
    m->slots = slots;

    m->params = alloc_floats(m->n_params);
    m->grads = alloc_floats(m->n_params);
    m->acts = alloc_floats((size_t)slots * per_slot);
    m->dacts = alloc_floats(2 * m->dact_floats);
    if (!m->params || !m->grads || !m->acts || !m->dacts) {
        dp_model_free(m);
        return dp_errf(err, "model %s: out of memory for %zu parameters, batch %d and %d slots",
                       spec, off, max_batch, slots);
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
    m->params = m->grads = m->acts = m->dacts = NULL;
    m->n_params = 0;
    m->max_batch = 0;
    m->slots = 0;
}

int dp_model_inputs(const dp_model *m) { return m->layers[0].in; }

int dp_model_classes(const dp_model *m) { return m->layers[m->n_layers - 1].out; }

void dp_model_init_params(dp_model *m, uint64_t seed)
{
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (d->kind != DP_LAYER_DENSE)
            continue;
        float limit = sqrtf(6.0f / (float)(d->in + d->out));
        float *w = m->params + d->w_off;
        size_t nw = (size_t)d->in * d->out;
        for (size_t k = 0; k < nw; k++)
            w[k] = (2.0f * dp_rng_uniform(&rng) - 1.0f) * limit;
        memset(m->params + d->b_off, 0, (size_t)d->out * sizeof(float));
    }
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

static bool range_ok(const dp_model *m, int slot, int a, int b, int batch)
{
    return m->acts && slot >= 0 && slot < m->slots && a >= 0 && a < b && b <= m->n_layers &&
           batch >= 1 && batch <= m->max_batch;
}

/* Layers [a, b) of a slot from `in`.  A dense layer followed by a relu in the
 * range runs as one kernel and writes only the relu's output.  Returns the mean
 * loss when the range holds the loss layer and y is given, else 0. */
static float forward(dp_model *m, int slot, const float *params, const float *in,
                     const uint8_t *y, int a, int b, int batch, int *correct)
{
    float loss = 0.0f;
    const float *inp = in;
    for (int l = a; l < b;) {
        const dp_layer *d = &m->layers[l];
        int last = l; /* the last layer this step covers */
        if (d->kind == DP_LAYER_DENSE && l + 1 < b && m->layers[l + 1].kind == DP_LAYER_RELU)
            last = l + 1;
        float *out = act(m, slot, last + 1);
        if (d->kind == DP_LAYER_DENSE) {
            const float *w = params + d->w_off, *bias = params + d->b_off;
            if (last > l) /* the relu in the product's epilogue */
                dp_dense_relu_forward(out, inp, w, bias, batch, d->in, d->out);
            else
                dp_dense_forward(out, inp, w, bias, batch, d->in, d->out);
        } else if (d->kind == DP_LAYER_RELU) {
            dp_relu_forward(out, inp, batch * d->out);
        } else { /* DP_LAYER_SOFTMAX_XENT */
            loss = dp_softmax_xent_forward(out, inp, y, batch, d->out, correct);
        }
        inp = out;
        l = last + 1;
    }
    return loss;
}

/* Layers [a, b) of a slot backwards, from dout (or, when the range holds the
 * loss layer, from the labels y) to din.  A dense layer whose input is a relu
 * in the range produces the gradient at the relu's input in one kernel (the
 * mask in the product's epilogue).  Intermediate gradients ping-pong between
 * the two halves of m->dacts.  notify: call m->grad_ready after each dense
 * layer. */
static void backward(dp_model *m, int slot, float *din, float *grads, const float *params,
                     const float *dout, const float *in, const uint8_t *y, int a, int b,
                     int batch, bool notify)
{
    float *buf[2] = {m->dacts, m->dacts + m->dact_floats};
    int next = 0;        /* the buffer the next intermediate gradient goes to */
    const float *g = dout; /* the gradient at the output of layer l */
    for (int l = b - 1; l >= a;) {
        const dp_layer *d = &m->layers[l];
        int first = l; /* the first layer this step covers */
        if (d->kind == DP_LAYER_DENSE && l - 1 >= a && m->layers[l - 1].kind == DP_LAYER_RELU)
            first = l - 1;
        float *dst = first == a ? din : buf[next]; /* gradient at layer first's input */
        if (d->kind == DP_LAYER_DENSE) {
            const float *inp = l == a ? in : act(m, slot, l);
            float *gw = grads + d->w_off, *gb = grads + d->b_off;
            const float *w = params + d->w_off;
            if (first < l && dst) /* inp is the relu's output: the mask fuses in */
                dp_dense_backward_relu_overwrite(dst, gw, gb, g, inp, w, batch, d->in, d->out);
            else
                dp_dense_backward_overwrite(dst, gw, gb, g, inp, w, batch, d->in, d->out);
            if (notify && m->grad_ready) /* this layer's weights and bias: [w_off, b_off + out) */
                m->grad_ready(m->grad_ready_ctx, d->w_off);
        } else if (d->kind == DP_LAYER_RELU) {
            if (dst)
                dp_relu_backward(dst, g, act(m, slot, l + 1), batch * d->out);
        } else { /* DP_LAYER_SOFTMAX_XENT: the gradient of the mean loss */
            if (dst)
                dp_softmax_xent_backward(dst, act(m, slot, l + 1), y, batch, d->out);
        }
        if (first > a) {
            g = dst;
            next ^= 1;
        }
        l = first - 1;
    }
}

const float *dp_model_forward_range(dp_model *m, int slot, const float *params,
                                    const float *in, int a, int b, int batch)
{
    if (!range_ok(m, slot, a, b, batch))
        return NULL;
    forward(m, slot, params, in, NULL, a, b, batch, NULL);
    return act(m, slot, b);
}

float dp_model_forward_range_loss(dp_model *m, int slot, const float *params, const float *in,
                                  const uint8_t *y, int a, int batch, int *correct)
{
    if (!y || !range_ok(m, slot, a, m->n_layers, batch))
        return NAN;
    return forward(m, slot, params, in, y, a, m->n_layers, batch, correct);
}

int dp_model_backward_range(dp_model *m, int slot, float *din, float *grads,
                            const float *params, const float *dout, const float *in, int a,
                            int b, int batch)
{
    if (!range_ok(m, slot, a, b, batch) || b == m->n_layers)
        return -1;
    backward(m, slot, din, grads, params, dout, in, NULL, a, b, batch, false);
    return 0;
}

int dp_model_backward_range_loss(dp_model *m, int slot, float *din, float *grads,
                                 const float *params, const float *in, const uint8_t *y, int a,
                                 int batch)
{
    if (!y || !range_ok(m, slot, a, m->n_layers, batch))
        return -1;
    backward(m, slot, din, grads, params, NULL, in, y, a, m->n_layers, batch, false);
    return 0;
}

float dp_model_forward(dp_model *m, const float *params, const float *x, const uint8_t *y,
                       int batch, int *correct)
{
    return dp_model_forward_range_loss(m, 0, params, x, y, 0, batch, correct);
}

float dp_model_forward_backward(dp_model *m, const float *x, const uint8_t *y, int batch,
                                int *correct)
{
    if (!y || !range_ok(m, 0, 0, m->n_layers, batch))
        return NAN;
    float loss = forward(m, 0, m->params, x, y, 0, m->n_layers, batch, correct);
    backward(m, 0, NULL, m->grads, m->params, NULL, x, y, 0, m->n_layers, batch, true);
    return loss;
}
