/* One table of layer kinds (docs/architecture.md, "The layer table"), in
 * the spirit of kann's op list and ggml's backend table.  Each kind is one
 * file, src/nn/layer_<kind>.c, that fills one dp_layer_ops: its spec token,
 * its shape rule (the parser's builder), its parameter layout as the
 * checkpoint writes it (PyTorch's names and shapes), its CPU forward and
 * backward, its model-parallel rule, and its device kernels.  The table
 * (src/nn/layer_table.c) lists them; every executor (the whole model and its
 * ranges, model.c; the model-parallel slice, src/exec/; the device,
 * src/device/dmodel.c) walks a model's layers through it, and nothing else
 * switches on the kind.
 *
 * A call of a layer is one function pointer through the table with one
 * dp_layer_call, filled by the executor: the kernels stay the chunked,
 * pooled, allocation-free ones of layers.h. */
#ifndef DOWNPOUR_LAYER_KIND_H
#define DOWNPOUR_LAYER_KIND_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/model.h"

struct dp_dexec;        /* a device executor's queue and scratch (src/device/dexec.h) */
struct dp_spec_parser;  /* the --model parser's state (src/nn/model_spec.h) */

/* One call of one layer, forward or backward.  Pointers are host memory on
 * the CPU and device memory on a device. */
typedef struct dp_layer_call {
    const dp_layer *d;
    int batch;
    const float *w, *b;  /* the layer's weights and bias (NULL: none) */
    float *gw, *gb;      /* their gradients, OVERWRITTEN by the backward */
    const float *in;     /* the layer's input (batch, d->in) */
    const float *skip;   /* res: the other addend (batch, d->out): the block's input
                          * or its main branch's output; relu's backward on the CPU:
                          * a gradient to add to dout (a block's shortcut's) */
    float *out;          /* its output (batch, d->out); the backward reads what the forward wrote */
    const float *dout;   /* backward: the gradient at the output */
    float *din;          /* backward: the gradient at the input, OVERWRITTEN; NULL: not wanted */
    int relu;            /* forward: a relu follows and runs in the epilogue; backward: in is
                          * a relu's output and din gets its mask (DP_LK_TAKES_RELU_MASK) */
    int relu_after;      /* backward (DP_LK_RELU_GRAD): the relu after it ran in its forward,
                          * dout is the gradient at the relu's output, and the backward
                          * applies the relu's mask first */
    float *keep;         /* what the forward keeps for the backward (keep_floats / dev_keep) */
    float *rows, *drows; /* lowering scratch of a chunk (rows_floats), the chunk d->chunk */
    float *band;         /* model-parallel band scratch (a chunk's product) */
    int chunk;           /* lowered kinds: records lowered at a time */
    float *state;        /* the layer's buffers (d->s_len floats at buffers + d->s_off) */
    int train;           /* forward: a training forward (batch statistics), else evaluation */
    dp_batch_sum_fn sum; /* training, DP_LK_BATCH_SUM: sums over the replicas (NULL: none) */
    void *sum_ctx;
    int y0, y1;          /* model-parallel ROWS: the output rows this task computes */
    int lo, hi;          /* model-parallel UNITS: the output units this task computes */
    uint64_t seed;       /* the draw of this forward (DP_LK_DRAWS) */
    const uint64_t *key; /* device: where the step block holds that draw */
    const uint8_t *y;    /* the loss: labels; NULL in a range without them */
    int *correct;        /* the loss: adds the correct predictions when non-NULL */
    double *tally;       /* device: the loss's tally */
    int max_batch;       /* device: the batch the keep was sized for */
} dp_layer_call;

/* How model parallelism splits a kind (docs/architecture.md, "Model
 * parallelism"). */
typedef enum dp_mp_rule {
    DP_MP_REFUSE, /* cannot split: mp_reason says why */
    DP_MP_ROWS,   /* image part: task j computes output rows [y0, y1) of every record */
    DP_MP_FULL,   /* image part: every task computes the whole layer */
    DP_MP_UNITS,  /* dense part: task j holds and computes output units [lo, hi) */
    DP_MP_LOSS,   /* the loss: every task, on the full logits */
} dp_mp_rule;

enum {
    DP_LK_FUSES_RELU = 1 << 0,      /* a relu after it runs in its forward's epilogue */
    DP_LK_TAKES_RELU_MASK = 1 << 1, /* a relu before it: its backward applies the mask */
    DP_LK_EVAL_IDENTITY = 1 << 2,   /* the identity in evaluation (the executor skips it) */
    DP_LK_DRAWS = 1 << 3,           /* draws a seed per training forward (dp_layer_call.seed) */
    DP_LK_LOSS = 1 << 4,            /* the loss: its forward returns the mean loss */
    DP_LK_LOWERED = 1 << 5,         /* lowers its input a chunk at a time (d->chunk, rows) */
    DP_LK_RELU = 1 << 6,            /* is the relu others fuse */
    DP_LK_FILTER_ORDER = 1 << 7,    /* weights (.., kh, kw, c) here, (.., c, kh, kw) in files */
    DP_LK_DEV_TAKES_RELU_MASK = 1 << 8, /* as TAKES_RELU_MASK, on a device */
    DP_LK_MP_SAME_ROWS = 1 << 9,    /* ROWS: reads the same rows it writes (no window) */
    DP_LK_MP_SHARED_FILTERS = 1 << 10, /* ROWS: every task needs the whole weights */
    DP_LK_CLASSIFIER = 1 << 11,     /* may be the spec's last token (its width: the classes) */
    DP_LK_BATCH_SUM = 1 << 12,      /* training sums over the batch through c->sum (--sync-bn) */
    DP_LK_BINARY = 1 << 13,         /* the loss of one output, P(label 1): two classes */
    DP_LK_CPU_FUSES_RELU = 1 << 14, /* as FUSES_RELU on the CPU only (the device runs it alone) */
    DP_LK_RELU_GRAD = 1 << 15,      /* with CPU_FUSES_RELU: its backward takes the relu's too */
};

/* One buffer of a kind, as files name it (PyTorch's): rank 1 of len floats,
 * or rank 0 (a scalar, len 1). */
#define DP_LK_MAX_BUFFERS 4
typedef struct dp_lk_buffer {
    const char *name;
    size_t len;
    int ndim;
} dp_lk_buffer;

/* One parameter tensor of a kind whose parameters are not one weight and one
 * bias (mha's four, pos's and emb's one): its name after layers.{i}. as
 * PyTorch's state_dict has it, where it starts from the layer's w_off, and
 * its file shape (docs/models.md, "Checkpoints and PyTorch"). */
#define DP_LK_MAX_TENSORS 4
typedef struct dp_lk_tensor {
    const char *name;
    size_t off;
    int ndim;
    int64_t shape[3];
} dp_lk_tensor;

/* A sparse table of a kind (docs/architecture.md, "Sparse tables"): rows x
 * width floats at off in the flat parameter buffer, row r at off + r*width,
 * read by a batch only at the rows its ids name, so a parameter server can
 * move just those rows.  per_record: the most ids one record names. */
#define DP_LK_MAX_SPARSE 8
typedef struct dp_lk_sparse {
    size_t off;
    long rows;
    int width;
    long per_record;
} dp_lk_sparse;

typedef struct dp_layer_ops {
    dp_layer_kind kind;
    const char *name;  /* "conv": messages, and the spec token's prefix when token is set */
    int token;         /* 1: a --model token starts with name; 2: the token is exactly name */
    unsigned flags;    /* DP_LK_* */
    const char *example, *help; /* --help's line for its token: "conv5x5x32", what it is */

    /* The spec: builds the layer from its token's text after the name
     * (parse), and the canonical spelling of the layer it built (emit, NULL:
     * the token as given).  Both through the parser's helpers (model_spec.h). */
    int (*parse)(struct dp_spec_parser *p, const char *s, const char *end);
    void (*emit)(struct dp_spec_parser *p, const dp_layer *d);

    /* Parameters: Glorot's fans, and the file's shapes (PyTorch's) of the
     * weight and the bias.  Returns the weight's dims and sets *bdim. */
    void (*fans)(const dp_layer *d, double *fan_in, double *fan_out);
    int (*shapes)(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim);
    double (*cost)(const dp_layer *d); /* multiply-adds per sample (pipeline cuts); NULL: in */
    /* Files' tensors when not weight and bias (NULL: shapes' two); returns
     * how many.  Their lengths cover [w_off, b_off + b_len). */
    int (*tensors)(const dp_layer *d, dp_lk_tensor out[DP_LK_MAX_TENSORS]);
    /* Initial weights and bias when not Glorot's and zero (NULL: those). */
    void (*init_params)(const dp_layer *d, float *w, float *b);
    /* Buffers: their names and sizes in order (returns how many; NULL: none),
     * and their initial values. */
    int (*buffers)(const dp_layer *d, dp_lk_buffer out[DP_LK_MAX_BUFFERS]);
    void (*init_buffers)(const dp_layer *d, float *state);

    /* CPU memory: floats kept per slot for the backward (NULL: none); a
     * lowered kind's fewest records a chunk (its products' efficiency). */
    size_t (*keep_floats)(const dp_layer *d, int max_batch);
    int min_chunk;

    /* CPU: the forward returns the mean loss for a loss layer with labels,
     * else 0; the backward writes din (when non-NULL) and the gradients. */
    float (*forward)(const dp_layer_call *c);
    void (*backward)(const dp_layer_call *c);
    /* Inputs the last forward of `batch` records had to change, read from
     * its keep (NULL: the kind changes none), and what they are, for the
     * warning (dp_model_bad_inputs). */
    long (*bad_inputs)(const dp_layer *d, const float *keep, int batch);
    const char *bad_inputs_what;

    /* Sparse tables (NULL: none): the kind's tables, returning how many; and
     * the rows of table k that a batch touches, from the model's input x
     * alone (batch records of `width` floats, the model's input width),
     * before any forward: each record's rows in order, as the forward reads
     * them (clamped, or places it skips left out), into ids (batch *
     * per_record at most); returns how many it wrote.  Only a kind that
     * reads the model's input (the first layers) can say this. */
    int (*sparse)(const dp_layer *d, dp_lk_sparse out[DP_LK_MAX_SPARSE]);
    long (*sparse_ids)(const dp_layer *d, int k, const float *x, int width, int batch,
                       uint32_t *ids);
    /* A compact table (model.h, sparse_rows): rewrites each place of x that
     * sparse_ids reads as a row to that row's slot, slot(row), so the
     * forward reads the slot instead; places naming no row keep naming none
     * (NULL: the kind cannot be held compact). */
    void (*sparse_slots)(const dp_layer *d, int k, float *x, int width, int batch,
                         long (*slot)(const void *ctx, uint32_t row), const void *ctx);

    /* Model parallelism: the rule, the reason when refused, and the part's
     * forward and backward: for ROWS the band of output rows [c->y0, c->y1)
     * of every record (the backward writes its part of din on the input
     * rows its windows read); for UNITS the output units [c->lo, c->hi),
     * written in place in the full-width output, from the slice's weights
     * (the backward's din is this task's part of the sum).  The LOSS runs
     * its CPU forward and backward on every task. */
    dp_mp_rule mp;
    const char *mp_reason;
    void (*mp_forward)(const dp_layer_call *c);
    void (*mp_backward)(const dp_layer_call *c);
    /* ROWS parameters of a band: the ranges of the flat buffer task j holds
     * (lo, hi: the output channels for shared filters). */
    void (*mp_params)(const dp_layer *d, int K, int j, int y0, int y1, size_t *w_full,
                      size_t *w_len, size_t *b_full, size_t *b_len, int *lo, int *hi);

    /* Device kernels (NULL dev_forward: none yet, the device refuses the
     * model naming the layer).  dev_scratch and dev_ones: the lowering
     * scratch and ones vector floats it needs; dev_keep its keep; dev_init
     * queues the keep's constant part once. */
    void (*dev_forward)(const struct dp_dexec *x, const dp_layer_call *c);
    void (*dev_backward)(const struct dp_dexec *x, const dp_layer_call *c);
    size_t (*dev_scratch)(const dp_layer *d, int max_batch);
    long (*dev_ones)(const dp_layer *d, int max_batch);
    size_t (*dev_keep)(const dp_layer *d, int max_batch);
    int (*dev_init)(const struct dp_dexec *x, const dp_layer *d, float *keep, int max_batch);
    /* Without device kernels: why, for the refusal (NULL: "yet"). */
    const char *dev_reason;
} dp_layer_ops;

/* The table, indexed by kind; every kind has an entry. */
extern const dp_layer_ops *const dp_layer_table[DP_LAYER_KIND_COUNT];

static inline const dp_layer_ops *dp_layer_ops_of(const dp_layer *d)
{
    return dp_layer_table[d->kind];
}

#endif
