/* bce: the binary loss of a click-through model (docs/models.md,
 * "Click-through models"), as torch's BCEWithLogitsLoss.  It takes one
 * logit z a record (the spec ends ...-dense1-bce) and gives p = sigmoid(z),
 * the probability of label 1; with labels (0 or 1: the model has two
 * classes, dp_model_classes) the mean of
 *
 *     max(z, 0) - z y + log1p(exp(-|z|))    (= -y log p - (1-y) log(1-p))
 *
 * summed in double, and a record is correct when (z > 0) == y.  The
 * backward is (p - y) / batch.  It is the spec's last token and the model's
 * loss in place of softmax_xent, so evaluation reports AUC and log loss for
 * it (docs/metrics.md).  No device kernels yet: --device refuses the model. */
#include "nn/layer_impl.h"

#include <math.h>

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    if (!p->last)
        return dp_spec_fail(p, "bce is the loss, so it is the spec's last token (like "
                               "...-dense1-bce)");
    if (p->c * p->h * p->w != 1)
        return dp_spec_fail(p, "bce takes one logit a record, but its input has %d features "
                               "(end the spec with dense1-bce)",
                            p->c * p->h * p->w);
    return dp_spec_add(p, DP_LAYER_BCE) ? 0 : -1;
}

static float forward(const dp_layer_call *c)
{
    double loss = 0.0;
    int correct = 0;
    for (int r = 0; r < c->batch; r++) {
        float z = c->in[r];
        c->out[r] = 1.0f / (1.0f + expf(-z));
        if (!c->y)
            continue;
        int y = c->y[r] != 0;
        loss += (z > 0 ? (double)z : 0.0) - (double)z * y + log1p(exp(-fabs((double)z)));
        correct += (z > 0) == y;
    }
    if (c->correct)
        *c->correct += correct;
    return c->y ? (float)(loss / c->batch) : 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (!c->din)
        return;
    float inv = 1.0f / (float)c->batch;
    for (int r = 0; r < c->batch; r++)
        c->din[r] = (c->out[r] - (c->y[r] != 0 ? 1.0f : 0.0f)) * inv;
}

const dp_layer_ops dp_layer_bce = {
    .kind = DP_LAYER_BCE, .name = "bce", .token = 2, .flags = DP_LK_LOSS | DP_LK_BINARY,
    .example = "bce", .help = "the last token: sigmoid + binary cross-entropy on one logit",
    .parse = parse,
    .forward = forward, .backward = backward,
    .mp = DP_MP_LOSS,
    .dev_reason = "click-through models (bag, lead, dot, bce) train on the CPU for now; "
                  "leave out --device (docs/models.md, \"Click-through models\")",
};
