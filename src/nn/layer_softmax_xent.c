/* softmax_xent: the loss.  out = softmax(in); with labels, the mean
 * cross-entropy, and backward its gradient (probabilities minus the one-hot
 * label, over the batch).  The grammar adds it after the last token. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/layers.h"

static float forward(const dp_layer_call *c)
{
    return dp_softmax_xent_forward(c->out, c->in, c->y, c->batch, c->d->out, c->correct);
}

static void backward(const dp_layer_call *c)
{
    if (c->din) /* the gradient of the mean loss */
        dp_softmax_xent_backward(c->din, c->out, c->y, c->batch, c->d->out);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_kernel k = {.id = DP_K_XENT_FWD, .items = c->batch};
    k.u.xent_fwd = (dp_ka_xent_fwd){c->out, c->in, c->y, c->tally, c->d->out};
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (!c->din)
        return;
    dp_kernel k = {.id = DP_K_XENT_BWD, .items = (long)c->batch * c->d->in};
    k.u.xent_bwd = (dp_ka_xent_bwd){c->din, c->out, c->y, c->d->out, 1.0f / (float)c->batch};
    dp_dexec_launch(x, &k);
}

const dp_layer_ops dp_layer_softmax_xent = {
    .kind = DP_LAYER_SOFTMAX_XENT, .name = "softmax_xent", .flags = DP_LK_LOSS,
    .forward = forward, .backward = backward,
    .mp = DP_MP_LOSS,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
