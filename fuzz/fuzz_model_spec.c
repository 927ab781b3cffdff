/* libFuzzer target for the --model grammar (src/nn/model_spec.c): any bytes
 * give either a consistent model (every layer's input is the previous one's
 * output, or for a residual block's shortcut the block's input, and a
 * block's sum adds two addends of its shape; the parameter ranges tile
 * [0, n_params), the last layer is the loss, and the canonical spelling
 * parses again to the same model) or a message
 * naming the spec, never a crash, a leak or a hang.  Only the parser runs:
 * nothing is allocated, so a valid spec of a huge model costs nothing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/model.h"
#include "nn/model_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const dp_model *m)
{
    size_t next = 0;
    /* a model ends in its loss: softmax cross-entropy, or the binary one */
    if (m->n_layers < 2 || m->n_layers > DP_MAX_LAYERS ||
        (m->layers[m->n_layers - 1].kind != DP_LAYER_SOFTMAX_XENT &&
         m->layers[m->n_layers - 1].kind != DP_LAYER_BCE))
        abort();
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        /* a residual block's shortcut reads the block's input, and its sum
         * adds two addends of its own shape */
        int from = d->res & DP_RES_SHORTCUT ? d->res_from : l - 1;
        if (from < -1 || from >= l || (d->res & DP_RES_SHORTCUT && from < 0))
            abort();
        int prev = d->res & DP_RES_SHORTCUT ? m->layers[from].in : l > 0 ? m->layers[l - 1].out : 0;
        if (d->in < 1 || d->out < 1 || d->in != d->c * d->h * d->w ||
            d->out != d->oc * d->oh * d->ow || (l > 0 && d->in != prev))
            abort();
        if (d->res & DP_RES_ADD) {
            if (d->res_from < 0 || d->res_from >= l || d->res_sc < 0 || d->res_sc >= l ||
                d->out != (d->res_sc ? m->layers[d->res_sc - 1].out : m->layers[d->res_from].in))
                abort();
        }
        /* a layer's weight then its bias (none for a table: emb, bag),
         * inside the flat parameters and apart from every other layer's
         * (sparse tables are placed before the dense layers) */
        if (d->w_len) {
            if ((d->b_len && d->b_off != d->w_off + d->w_len) ||
                d->w_off + d->w_len + d->b_len > m->n_params)
                abort();
            for (int k = 0; k < l; k++) {
                const dp_layer *e = &m->layers[k];
                if (e->w_len && d->w_off < e->w_off + e->w_len + e->b_len &&
                    e->w_off < d->w_off + d->w_len + d->b_len)
                    abort();
            }
            next += d->w_len + d->b_len;
        }
    }
    if (next != m->n_params)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char s[4097];
    memcpy(s, data, size);
    s[size] = '\0';
    static dp_model a, b;
    dp_err err;
    memset(&a, 0, sizeof a);
    if (model_spec_parse(&a, s, &err) < 0) {
        if (!strstr(err.msg, "model spec"))
            abort();
        return 0;
    }
    check(&a);
    memset(&b, 0, sizeof b);
    if (model_spec_parse(&b, a.spec, &err) < 0 || strcmp(a.spec, b.spec) != 0 ||
        a.n_layers != b.n_layers || a.n_params != b.n_params)
        abort();
    for (int l = 0; l < a.n_layers; l++)
        if (a.layers[l].kind != b.layers[l].kind || a.layers[l].out != b.layers[l].out)
            abort();
    return 0;
}
