/* A model is a sequence of typed layers (docs/architecture.md, "The model";
 * the --model grammar is docs/models.md), run forward or backward over any
 * range of layers [a, b).  One process runs the whole range; a pipeline stage
 * or a model-parallel task runs its part with the same calls.
 *
 * Layers.  Layer l maps (batch, layers[l].in) to (batch, layers[l].out)
 * features; an image layer's features are an (h, w, c) image stored NHWC
 * (layers.h, "spatial layers").  The spec "784-300-100-10" becomes
 *     0 dense 784->300, 1 relu 300, 2 dense 300->100, 3 relu 100,
 *     4 dense 100->10,  5 softmax_xent 10 (the loss; its output is the probabilities)
 * and "cnn-mnist" (1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10)
 *     conv, relu, maxpool, conv, relu, maxpool, flatten, dense, relu, dense,
 *     softmax_xent.
 * Dense, conv and local layers have parameters.  All parameters live in ONE
 * flat float buffer and all gradients in a twin buffer of the same layout
 * (docs/architecture.md, "The flat parameter buffer"), layer after layer,
 * weights at w_off then bias at b_off; a layer only knows its offsets.
 * Dense weights are (out, in), PyTorch Linear's layout; conv weights are
 * (oc, kh, kw, c), which the checkpoint turns into Conv2d's (oc, c, kh, kw).
 * Parameters and gradients are arguments of the range calls, so evaluation
 * runs any weights (an EMA, the best epoch's) without touching m->params.
 * Buffers, state that is not trained (batch norm's running mean and
 * variance and its count of batches), are a second flat array beside the
 * parameters, m->buffers: the training calls update them, evaluation reads
 * them (docs/architecture.md, "Buffers").
 *
 * Activations.  dp_model_init sizes activation scratch for `slots`
 * micro-batches in flight, each with room for max_batch rows of every layer's
 * output: a pipeline stage runs the forwards of slots 0, 1, 2 and later their
 * backwards, each from its own slot.  A range's input is the caller's memory,
 * never copied: it must stay unchanged until that slot's backward.  Inside a
 * range a dense, conv or local layer followed by a relu runs as one fused
 * kernel (the relu in the product's epilogue; for dense, its mask also in the
 * next dense's input-gradient product), so a range costs the same as the old
 * dense stack; a range boundary between a layer and its relu runs them apart
 * and gives the same numbers.  Conv and local layers lower their input
 * (im2row) a chunk of samples at a time into scratch shared by the slots, and
 * lower it again in the backward, so the scratch stays a few MiB whatever the
 * batch.  Nothing allocates after dp_model_init.  Calls on one model run one
 * at a time (each product is split over the arithmetic pool inside the call).
 *
 * Dropout is on in the training calls (the range calls and
 * dp_model_forward_backward) and off in dp_model_forward (evaluation).  Its
 * masks come from dp_model_seed_dropout's seed and a count of forwards, and
 * the backward of a slot draws the same mask its forward did. */
#ifndef DOWNPOUR_MODEL_H
#define DOWNPOUR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

#include "downpour/external.h"
#include "downpour/layers.h"
#include "downpour/optim.h"

#define DP_MAX_DENSE 48      /* layers with parameters (dense, conv, local, bn, ln):
                              * resnet-fashion has 31 */
#define DP_MAX_LAYERS 64     /* layers of every kind, the inserted ones included
                              * (resnet-fashion: 52) */
#define DP_MAX_SPEC 1024     /* a canonical spec's characters, with the NUL
                              * (resnet-fashion's: 353) */

/* The kinds of layers.  Each is one entry of the layer table (layer_kind.h):
 * a new kind is its file src/nn/layer_<kind>.c, a name here and its line in
 * src/nn/layer_table.c. */
typedef enum dp_layer_kind {
    DP_LAYER_DENSE,        /* out = in W^T + b */
    DP_LAYER_RELU,         /* out = max(in, 0) */
    DP_LAYER_SOFTMAX_XENT, /* out = softmax(in); with labels, the mean cross-entropy loss */
    DP_LAYER_CONV,         /* 2-D convolution: im2row, then one product for the batch */
    DP_LAYER_LOCAL,        /* locally connected: a convolution with untied weights */
    DP_LAYER_MAXPOOL,      /* max over each window, per channel */
    DP_LAYER_AVGPOOL,      /* mean over each window, per channel */
    DP_LAYER_LCN,          /* local contrast normalisation (layers.h) */
    DP_LAYER_DROPOUT,      /* inverted dropout while training, the identity in evaluation */
    DP_LAYER_FLATTEN,      /* an NHWC image to PyTorch's CHW feature order */
    DP_LAYER_HWC,          /* a CHW input image to NHWC (inputs of more than one channel) */
    DP_LAYER_BATCHNORM,    /* batch normalisation over features or channels */
    DP_LAYER_TANH,         /* out = tanh(in) */
    DP_LAYER_SIGMOID,      /* out = 1 / (1 + exp(-in)) */
    DP_LAYER_GELU,         /* out = in Phi(in), the exact erf form */
    DP_LAYER_GAP,          /* global average pooling: C x H x W to C features */
    DP_LAYER_LAYERNORM,    /* layer normalisation over a record's features or a token's */
    DP_LAYER_MHA,          /* multi-head self-attention over the tokens (positions) */
    DP_LAYER_POS,          /* a learned position embedding added to the tokens */
    DP_LAYER_EMB,          /* an embedding of integer ids into tokens */
    DP_LAYER_RES,          /* a residual block's sum: main(x) + shortcut(x) */
    DP_LAYER_BAG,          /* an embedding bag: a record's ids of one feature, pooled */
    DP_LAYER_BCE,          /* the binary loss: sigmoid, with labels binary cross-entropy */
    DP_LAYER_LEAD,         /* a dense layer on the leading features, the rest passed on */
    DP_LAYER_DOT,          /* pairwise dot products of a record's vectors (DLRM's interaction) */
    DP_LAYER_KIND_COUNT
} dp_layer_kind;

/* The kind's name in the layer table ("dense", "relu", "softmax_xent",
 * "conv", ...); "?" outside the enum. */
const char *dp_layer_kind_name(dp_layer_kind kind);

typedef struct dp_layer {
    dp_layer_kind kind;
    int in, out;      /* features per sample in and out: c*h*w and oc*oh*ow */
    int c, h, w;      /* input shape; a flat vector is (in, 1, 1) */
    int oc, oh, ow;   /* output shape */
    dp_window win;    /* conv, local, maxpool, avgpool, lcn: the window over the input */
    float rate;       /* dropout: the fraction of features dropped */
    size_t w_off, w_len; /* weights at params + w_off, w_len floats (0: no parameters) */
    size_t b_off, b_len; /* bias at params + b_off, b_len floats */
    size_t s_off, s_len; /* buffers (state not trained) at buffers + s_off, s_len floats */
    size_t keep_off;  /* lcn: what its backward needs, at this offset in each slot */
    int chunk;        /* conv, local: samples lowered at a time */
    int heads;        /* mha: attention heads */
    /* Residual blocks (docs/architecture.md, "Residual blocks"): the
     * block's layers in the sequence are its main branch, then its
     * shortcut's layers (none for an identity shortcut), then the res
     * layer that sums the two.  res: DP_RES_* roles; res_from: the block's
     * first layer (shortcut and res layers); res_sc: the res layer's first
     * shortcut layer, 0 for an identity shortcut. */
    unsigned res;
    int res_from, res_sc;
    /* bag (docs/models.md, "Click-through models"): the ids a record holds
     * for it (bag_ids, M), read from columns [bag_col, bag_col + M) of the
     * MODEL'S INPUT (a pure function of the record: the sparse exchange
     * reads a batch's ids there without running the forward), pooled by sum
     * or, bag_mean, by mean.  Its table is weights (N, D) at w_off. */
    int bag_ids, bag_col, bag_mean;
    /* lead: the leading input features it reads (K) and whether a relu
     * follows its product; dot: the vectors' width (D) */
    int lead_in, lead_relu, dot_dim;
    /* A sparse table held compact (dp_model_init_compact): its rows on the
     * parameter servers, N, of which this model holds w_len / D slots, the
     * rows of the batch in flight; 0: the table is whole. */
    long sparse_rows;
} dp_layer;

enum {
    DP_RES_IN = 1 << 0,       /* inside a block: no range, stage or cut starts here... */
    DP_RES_BEGIN = 1 << 1,    /* ...except at its first layer, which reads the block's input */
    DP_RES_SHORTCUT = 1 << 2, /* the shortcut's first layer: reads the block's input too */
    DP_RES_ADD = 1 << 3,      /* the block's sum, its last layer */
};

/* Told during dp_model_forward_backward each time the gradients [lo,
 * n_params) are final, last layer first, so a gradient all-reduce can start
 * on them while backprop goes on (see reducer.h).  The range calls never call
 * it. */
typedef void (*dp_grad_ready_fn)(void *ctx, size_t lo);

/* Sums buf[0..n) in place over the replicas that train one batch together
 * (allreduce --sync-bn, docs/strategies.md "Buffers"), so a layer whose
 * training forward takes statistics over the batch (bn) gets the whole
 * batch's.  Every replica calls it in the same order with the same n.
 * Returns 0, or -1 when the sum failed: the layer then goes on with its own
 * rows, and the strategy fails the step (it remembers why). */
typedef int (*dp_batch_sum_fn)(void *ctx, float *buf, size_t n);

typedef struct dp_model {
    char spec[DP_MAX_SPEC]; /* canonical spelling, "784-300-100-10" */
    char name[DP_MAX_SPEC]; /* preset name if any, else the spec */
    int n_layers;
    dp_layer layers[DP_MAX_LAYERS]; /* the truth: the sequence the range calls run */
    int n_dense;        /* how many of them have parameters (dense, conv, local) */
    size_t n_params;
    float *params;      /* n_params floats */
    float *grads;       /* n_params floats, same layout */
    size_t n_buffers;   /* state that is not trained: batch norm's running statistics */
    float *buffers;     /* n_buffers floats, layer after layer (s_off), or NULL when none */
    int max_batch;
    int slots;          /* micro-batches whose activations can be in flight */
    float *acts;        /* slots * slot_floats: every layer's output, per slot */
    size_t slot_floats;
    size_t act_off[DP_MAX_LAYERS + 1]; /* [l], l >= 1: output of layer l-1 in a slot */
    float *dacts;       /* the gradient buffers, shared by the slots: two that
                         * ping-pong, three with residual blocks (one keeps the
                         * block output's gradient), then dskip */
    size_t dact_floats; /* floats in each */
    int n_dacts;        /* 2, or 3 with residual blocks */
    float *dskip;       /* residual blocks with a projection: the shortcut's
                         * gradient at the block's input (in dacts; NULL: none) */
    float *rows, *drows; /* conv and local: a chunk's lowered input and its gradient */
    size_t rows_floats; /* floats in each */
    uint64_t *drop_seeds; /* (slots, n_layers): the seed of each dropout's last forward */
    uint64_t drop_base, drop_count; /* dp_model_seed_dropout, forwards drawn so far */
    dp_grad_ready_fn grad_ready; /* NULL: nobody listens */
    void *grad_ready_ctx;
    dp_batch_sum_fn batch_sum; /* NULL: each replica's batch statistics are its own */
    void *batch_sum_ctx;
    /* an external model (external.h): no layers; params and grads are its
     * caller's buffers, which dp_model_free leaves alone.  NULL: our own */
    const dp_external_model *external;
} dp_model;

/* Parses spec (docs/models.md), allocates params, grads and activation scratch for `slots`
 * (>= 1) micro-batches of up to max_batch rows; params are zero until
 * dp_model_init_params. */
int dp_model_init(dp_model *m, const char *spec, int max_batch, int slots, dp_err *err);
/* As dp_model_init, with each sparse table (sparse.h) cut to the rows one
 * batch can name, C = min(N, max_batch x ids a record): a parameter-server
 * worker's model, which holds only the rows of the batch in flight, in
 * slots 0..C-1 (docs/strategies.md, "Tables larger than a worker").  The
 * other parameters follow in the same order, earlier by what the tables
 * lost; the layer keeps N in sparse_rows.  Cuts nothing (and returns 0)
 * unless the tables lie before every dense parameter, one a layer, at
 * most DP_SPARSE_MAX; returns 1 when it cut, -1 on error. */
int dp_model_init_compact(dp_model *m, const char *spec, int max_batch, int slots, dp_err *err);
/* The layers, parameter and buffer counts of spec, allocating nothing (no
 * params, grads or scratch): what a check of a run's settings needs before
 * the run builds its model.  dp_model_free is safe on it. */
int dp_model_describe(dp_model *m, const char *spec, dp_err *err);
void dp_model_free(dp_model *m); /* safe on a zeroed or freed model */
/* An external model's dp_model (external.h): its n_params, its caller's
 * buffers as params and grads, no layers; spec and name "external:NAME"
 * (name NULL: "external").  dp_model_init does it for the spec
 * "external:NAME" of a registered model. */
int dp_model_init_external(dp_model *m, const dp_external_model *e, const char *name,
                           int max_batch, dp_err *err);

/* The preset names, for messages and --help: "mlp-300-100, mlp-128, ...". */
const char *dp_model_presets(void);
/* --model's help: the presets and a line for each kind's token, from the
 * layer table (the grammar in full: docs/models.md). */
const char *dp_model_spec_help(void);

int dp_model_inputs(const dp_model *m);
int dp_model_classes(const dp_model *m);
/* True when the model ends in the binary loss (bce): one output, the
 * probability of label 1, of two classes; evaluation reports its AUC and
 * log loss (docs/metrics.md). */
int dp_model_binary(const dp_model *m);
/* The model's embedding bags, first layers first: each one's table rows (a
 * compact table's rows on the servers, sparse_rows) and the ids a record
 * holds for it (bag_ids); returns how many (the first cap
 * written).  The readers check named categorical columns' ids against
 * these rows (docs/datasets.md, "Categorical and numeric columns"). */
int dp_model_bags(const dp_model *m, uint32_t *rows, int *places, int cap);
/* The table row a bag's forward reads for the value v of one of its places
 * (column bag_col + j of a record): v when it is an integer in [0, N), else
 * -1 (an empty place -1, or a bad id, which the forward skips and counts).
 * The one rule, so that whoever gathers a batch's rows (the sparse
 * exchange) reads the rows the forward reads. */
long dp_model_bag_row(const dp_layer *d, float v);
/* Whether the model takes a dataset's records of rows x cols x channels
 * values, stored pixel by pixel (HWC, as PNG and NumPy images are; IDX has
 * one channel): a flat input needs them all as features, an image input is
 * 1 x rows x cols (an image model takes channels apart, CxHxW: records of
 * several channels are refused for it, saying so).  Fails naming the model
 * and the dataset. */
int dp_model_check_input(const dp_model *m, uint32_t rows, uint32_t cols, uint32_t channels,
                         const char *dataset, dp_err *err);
/* True when the model's input is an image (c x h x w with h*w > 1). */
int dp_model_is_image(const dp_model *m);

/* Whether a range, a pipeline stage or a model-parallel part may start at
 * layer j (0 <= j <= n_layers): anywhere but inside a residual block. */
int dp_model_cut_ok(const dp_model *m, int j);

/* On (the default) or off for the whole process: the CPU executor's fusions
 * of a relu into the bn or residual sum before it and of that relu's
 * backward into the bn's (docs/architecture.md, "Residual blocks").  Off,
 * each runs alone: the same bits (tests hold the two to it; benchmarks
 * compare their times). */
void dp_model_cpu_fusions(int on);

/* Glorot-uniform weights, limit sqrt(6/(fan_in+fan_out)), zero biases (Keras
 * defaults; a conv or local filter's fans are kh*kw*c and kh*kw*oc).  Also
 * seeds dropout with the same seed. */
void dp_model_init_params(dp_model *m, uint64_t seed);
/* Dropout's masks from now on come from this seed (a replica of a cluster
 * seeds with its rank mixed in, so replicas drop different features). */
void dp_model_seed_dropout(dp_model *m, uint64_t seed);

/* ---- ranges of layers [a, b), 0 <= a < b <= n_layers ----
 * Neither a nor b may lie inside a residual block (dp_model_cut_ok).
 * Common arguments: slot in [0, slots); batch in [1, max_batch]; params is a
 * buffer of n_params floats in the model's layout (m->params or any other
 * weights).  A call with an argument out of range does nothing and returns
 * NULL, NAN or -1. */

/* Forward over [a, b): in (batch, layers[a].in) -> returns the output (batch,
 * layers[b-1].out), which lives in the slot's scratch until the slot's next
 * forward over layer b-1.  A range that holds the loss layer gets no labels
 * here: its output is the probabilities and no loss is computed. */
const float *dp_model_forward_range(dp_model *m, int slot, const float *params,
                                    const float *in, int a, int b, int batch);

/* Forward over [a, n_layers), a range that ends with the loss: in (batch,
 * layers[a].in), labels y (batch), each < classes.  Returns the mean loss and
 * ADDS the count of correct argmax predictions to *correct when non-NULL; the
 * probabilities are dp_model_act(m, slot, n_layers). */
float dp_model_forward_range_loss(dp_model *m, int slot, const float *params, const float *in,
                                  const uint8_t *y, int a, int batch, int *correct);

/* Backward over [a, b), b < n_layers (a range without the loss layer), after
 * the forwards of this slot over those layers with the same params, in and
 * batch:
 *   din (batch, layers[a].in) = the gradient at the range's input (for
 *       a = 0, with respect to x); NULL: not wanted, and layer a's
 *       input-gradient product is skipped (training never needs layer 0's).
 *   grads (n_params): each parameter layer's weight and bias gradients in [a, b)
 *       are OVERWRITTEN (no zeroing pass; the products run with beta 0);
 *       every other float of grads is left alone.
 *   dout (batch, layers[b-1].out): the gradient at the range's output.
 *   in: the input the forward got (read when layer a is dense, conv, local
 *       or maxpool; may be NULL otherwise).
 * din may not alias dout, in, or the model's scratch.  Returns 0, or -1 for
 * arguments out of range. */
int dp_model_backward_range(dp_model *m, int slot, float *din, float *grads,
                            const float *params, const float *dout, const float *in, int a,
                            int b, int batch);

/* Backward over [a, n_layers), a range that ends with the loss, after
 * dp_model_forward_range_loss of this slot with the same a, params, in, y and
 * batch: the gradient of the mean loss.  din and grads as in
 * dp_model_backward_range.  Returns 0, or -1 for arguments out of range. */
int dp_model_backward_range_loss(dp_model *m, int slot, float *din, float *grads,
                                 const float *params, const float *in, const uint8_t *y, int a,
                                 int batch);

/* The input of layer l in a slot, 1 <= l <= n_layers: (max_batch,
 * layers[l-1].out), the output of layer l-1 as the slot's last forward over it
 * left it; l = n_layers is the probabilities.  Inside a range a fused dense
 * (conv, local) + relu writes only the relu's output, so the first layer's
 * own output is stale there.  NULL for l or slot out of range. */
float *dp_model_act(const dp_model *m, int slot, int l);

/* ---- the whole model, slot 0 ---- */

/* Forward only (evaluation: dropout off) with any weights params (n_params floats).  x
 * (batch, inputs); returns mean loss; adds the count of correct predictions to
 * *correct when non-NULL.  Every label must be < classes.  A batch outside
 * [1, max_batch] does nothing and returns NAN. */
float dp_model_forward(dp_model *m, const float *params, const float *x, const uint8_t *y,
                       int batch, int *correct);

/* After dp_model_forward of `batch` records: how many inputs its layers had
 * to change (emb: ids that are not integers in [0, N), rounded and
 * clamped), by each kind's bad_inputs (layer_kind.h); 0 for a model
 * without such a layer. */
long dp_model_bad_inputs(const dp_model *m, int batch);

/* Forward and backward with m->params: OVERWRITES m->grads with the gradient
 * of the mean loss over the batch (each layer's weight GEMM runs with beta 0
 * and the bias sums overwrite, so there is no zeroing pass); returns the mean
 * loss.  The first layer's input gradient is never computed.  Calls
 * m->grad_ready after each dense layer's gradients are final.  Allocates
 * nothing. */
float dp_model_forward_backward(dp_model *m, const float *x, const uint8_t *y, int batch,
                                int *correct);

/* A replica with no records this step (its shard ran out) while
 * m->batch_sum is set: the layers that sum over the batch (DP_LK_BATCH_SUM)
 * run their training forward and backward on no rows, so the replicas' sums
 * still meet, and the running statistics move as the others' do.  Nothing
 * else runs; m->grads is left alone. */
void dp_model_batch_sum_idle(dp_model *m);

/* dp_model_forward_backward with o's update of m->params fused into backprop
 * (docs/architecture.md, "Fast paths"), for a process whose update is local:
 * each layer's parameters are updated with rate lr as soon as its input
 * gradient has read the old weights, while its gradients are in cache.  The
 * same bits as dp_model_forward_backward then dp_optim_apply(o, m->params,
 * m->grads, lr), and m->grads holds the same gradients afterwards.  A loss
 * that is not finite is returned before backprop, with nothing updated (o->t
 * unchanged).  o must hold n_params parameters; NAN for a bad batch. */
float dp_model_train_step(dp_model *m, dp_optim *o, const float *x, const uint8_t *y,
                          int batch, float lr, int *correct);

#endif
