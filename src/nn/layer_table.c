/* The table of layer kinds (layer_kind.h; docs/architecture.md, "The layer
 * table"): one line per kind, each kind's entry in its own file. */
#include "downpour/layer_kind.h"

extern const dp_layer_ops dp_layer_dense, dp_layer_relu, dp_layer_softmax_xent, dp_layer_conv,
    dp_layer_local, dp_layer_maxpool, dp_layer_avgpool, dp_layer_lcn, dp_layer_dropout,
    dp_layer_flatten, dp_layer_hwc, dp_layer_batchnorm, dp_layer_tanh, dp_layer_sigmoid, dp_layer_gelu,
    dp_layer_gap, dp_layer_ln, dp_layer_mha, dp_layer_pos, dp_layer_emb, dp_layer_res,
    dp_layer_bag, dp_layer_bce, dp_layer_lead, dp_layer_dot;

const dp_layer_ops *const dp_layer_table[DP_LAYER_KIND_COUNT] = {
    [DP_LAYER_DENSE] = &dp_layer_dense,
    [DP_LAYER_RELU] = &dp_layer_relu,
    [DP_LAYER_SOFTMAX_XENT] = &dp_layer_softmax_xent,
    [DP_LAYER_CONV] = &dp_layer_conv,
    [DP_LAYER_LOCAL] = &dp_layer_local,
    [DP_LAYER_MAXPOOL] = &dp_layer_maxpool,
    [DP_LAYER_AVGPOOL] = &dp_layer_avgpool,
    [DP_LAYER_LCN] = &dp_layer_lcn,
    [DP_LAYER_DROPOUT] = &dp_layer_dropout,
    [DP_LAYER_FLATTEN] = &dp_layer_flatten,
    [DP_LAYER_HWC] = &dp_layer_hwc,
    [DP_LAYER_BATCHNORM] = &dp_layer_batchnorm,
    [DP_LAYER_TANH] = &dp_layer_tanh,
    [DP_LAYER_SIGMOID] = &dp_layer_sigmoid,
    [DP_LAYER_GELU] = &dp_layer_gelu,
    [DP_LAYER_GAP] = &dp_layer_gap,
    [DP_LAYER_LAYERNORM] = &dp_layer_ln,
    [DP_LAYER_MHA] = &dp_layer_mha,
    [DP_LAYER_POS] = &dp_layer_pos,
    [DP_LAYER_EMB] = &dp_layer_emb,
    [DP_LAYER_RES] = &dp_layer_res,
    [DP_LAYER_BAG] = &dp_layer_bag,
    [DP_LAYER_BCE] = &dp_layer_bce,
    [DP_LAYER_LEAD] = &dp_layer_lead,
    [DP_LAYER_DOT] = &dp_layer_dot,
};
