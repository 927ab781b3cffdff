/* The device executor: a model's training step as products and kernels
 * queued on one backend's stream (device.h; docs/gpu.md, "The executor").
 *
 * Memory.  Everything is allocated in dp_dmodel_open: parameters, gradients
 * and optimiser slots in the model's flat layout; every layer's output for
 * max_batch rows (act_off, as the CPU model lays out one slot); each keep
 * a kind asks for (keep_off, dev_keep: lcn's); two ping-pong gradient
 * buffers (three and a fourth for the shortcut's with residual blocks, as
 * model.c's: docs/architecture.md, "Residual blocks"); a ones vector (bias gradients as products);
 * the gathered batch x and y; the tally (loss sum, correct); and the device
 * step block.  Nothing allocates in a step.  The split's records (bytes, or
 * floats for a split of values) and labels are copied once by
 * dp_dmodel_load_split, and --ema's moving average is allocated once by
 * dp_dmodel_ema_start, before the steps.  Host arrays the caller pins
 * (dp_dmodel_pin_host) are let go at close before anything is freed.
 *
 * The step block.  Whatever changes from one step to the next (the record
 * indices, lr, adam's lr_t, the gradient scale, each dropout layer's key)
 * reaches the device in ONE H2D copy of a host step block, dp_step_block,
 * then one 64-bit key per dropout layer (n_drop), then max_batch indices,
 * into the device's twin before the step's kernels, which read it there.
 * So a captured graph replays fresh values, dropout's masks included.  The host blocks are a ring of RING
 * page-locked slots: an H2D copy reads its slot when the stream reaches it,
 * so a slot is reused only after a sync, once every RING steps.
 *
 * Products.  The model's matrices are row-major; the backend's products are
 * column-major (cuBLAS's).  A row-major (r, c) matrix is the column-major
 * (c, r) matrix with leading dimension c, its transpose for free.  So with
 * in (batch, I), out (batch, O) and W (O, I) row-major:
 *   out^T (O, batch) = W (col-major (I, O), op T) . in^T (col-major (I, batch))
 *   dW^T (I, O)      = in^T (I, batch) . dout (col-major (O, batch), op T)
 *   dX^T (I, batch)  = W (col-major (I, O)) . dout^T (col-major (O, batch))
 *   db (O)           = dout^T (col-major (O, batch)) . ones (batch)
 * tests/test_device_kernels.c checks each against layers.h through sim.
 *
 * Graphs.  A step for a full batch is captured once and replayed (the
 * launch cost of ~20 kernels goes); a shorter batch runs directly, since a
 * kernel's item count is captured by value.  A longer batch than the one
 * captured recaptures.  Models with dropout are captured too: the keys are
 * drawn on the host for each step, in the CPU model's order (slot_keys), and
 * the dropout kernels read them from the step block. */
#include "downpour/device.h"
#include "downpour/env.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_impl.h"
#include "device/dexec.h"
#include "downpour/layer_kind.h"

#define RING 64 /* host step blocks in flight before a sync */
#define GOLDEN 0x9e3779b97f4a7c15ULL

struct dp_dmodel {
    dp_device *dev;
    const dp_backend *be;
    void *ctx;
    char name[16]; /* the backend's, for messages */

    int n_layers;
    dp_layer layers[DP_MAX_LAYERS];
    size_t n_params;
    int max_batch, inputs;

    dp_optim opt; /* host: the config and the update count t; no state (n = 0) */
    int has_opt, n_slots;

    /* device memory */
    float *params, *grads, *state; /* state: n_slots * n_params */
    float *buffers;                /* n_buffers (batch norm's statistics), or NULL */
    size_t n_buffers;
    float *ema;                    /* --ema's average (dp_dmodel_ema_start), or NULL */
    float ema_decay;
    float *acts;                   /* act_off[l]: the output of layer l-1 */
    size_t act_off[DP_MAX_LAYERS + 1];
    float *dacts[3];   /* ping-pong gradients; the third only with residual blocks */
    float *dskip;      /* residual blocks with a projection: the shortcut's gradient at the
                        * block's input (NULL: none) */
    float *keeps;                      /* every layer's keep (dev_keep), or NULL */
    size_t keep_off[DP_MAX_LAYERS];    /* layer l's in keeps */
    float *ones, *x;
    uint8_t *y;
    dp_dexec ex;   /* what the kinds' kernels share: ones and the lowering scratch */
    double *tally;
    dp_step_block *block; /* followed by max_batch indices */
    const uint8_t *images, *labels; /* the loaded split: images or values */
    const float *values;
    void *split_records; /* device memory behind images or values */
    uint8_t *split_labels;
    uint32_t split_n;

    /* host step blocks */
    unsigned char *ring;
    size_t slot_bytes;
    int cur, used; /* the slot the next stage or step writes; slots used since a sync */
    int staged;    /* records staged in the current slot; 0: none */
    uint32_t *last_idx; /* the last batch staged (max_batch), for dp_dmodel_restage */
    int last_n;

    uint64_t drop_base, drop_count; /* a copy of the model's, drawn in the same order */
    int n_drop;                      /* layers that draw (dropout): keys in each step block */
    int drop_at[DP_MAX_LAYERS];      /* such a layer's key's place among them */

    int graphs;  /* the backend has them and DOWNPOUR_DEVICE_GRAPH is not 0 */
    void *graph; /* the captured step for graph_n records */
    int graph_n;

    void *comm;

    /* host ranges page-locked for the model's life (dp_dmodel_pin_host) */
    void *pins[DP_DMODEL_MAX_PINS];
    int n_pins;
    size_t pinned_bytes;
};

/* splitmix64's finaliser, as model.c and dropout.c draw their seeds */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t line_floats(size_t n) { return (n + 15) & ~(size_t)15; }

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* A failure of queued work, as the backend kept it. */
static int sync_err(dp_dmodel *g, const char *what, dp_err *err)
{
    char msg[256] = "";
    if (g->be->sync(g->ctx, msg, sizeof msg) == 0)
        return 0;
    return dp_errf(err, "%s: device %s: %s", what, g->name, msg);
}

/* ---- layers ---- */

static float *act(const dp_dmodel *g, int l) { return g->acts + g->act_off[l]; }

/* A layer a relu follows (DP_LK_FUSES_RELU: dense, conv, local): the relu
 * runs in its product's epilogue, and only the relu's output is written. */
/* Where a branch of a residual block starts, the layer reads the block's
 * input: no relu fuses across that edge. */
static bool branch_start(const dp_layer *d) { return d->res & (DP_RES_BEGIN | DP_RES_SHORTCUT); }

static int fuses_relu(const dp_dmodel *g, int l)
{
    return (dp_layer_ops_of(&g->layers[l])->flags & DP_LK_FUSES_RELU) &&
           l + 1 < g->n_layers && (dp_layer_ops_of(&g->layers[l + 1])->flags & DP_LK_RELU) &&
           !branch_start(&g->layers[l + 1]);
}

static void launch(dp_dmodel *g, const dp_kernel *k) { g->be->launch(g->ctx, k); }

/* The dropout keys after a step block (host or device), and the indices
 * after them. */
_Static_assert(sizeof(dp_step_block) % sizeof(uint64_t) == 0, "the keys must be aligned");
static uint64_t *block_keys(dp_step_block *b) { return (uint64_t *)(b + 1); }

static uint32_t *block_idx(const dp_dmodel *g, dp_step_block *b)
{
    return (uint32_t *)(block_keys(b) + g->n_drop);
}

static void gather(dp_dmodel *g, int batch)
{
    dp_kernel k = {.id = g->values ? DP_K_GATHER_F32 : DP_K_GATHER,
                   .items = (long)batch * g->inputs};
    k.u.gather = (dp_ka_gather){g->x, g->y, g->images, g->values, g->labels,
                                block_idx(g, g->block), g->inputs, g->tally};
    launch(g, &k);
}

/* A call of layer l (layer_kind.h) on the device's buffers. */
static dp_layer_call call_of(dp_dmodel *g, int l, int batch)
{
    const dp_layer *d = &g->layers[l];
    dp_layer_call c = {.d = d, .batch = batch, .y = g->y, .tally = g->tally,
                       .max_batch = g->max_batch};
    if (d->w_len) {
        c.w = g->params + d->w_off, c.b = g->params + d->b_off;
        c.gw = g->grads + d->w_off, c.gb = g->grads + d->b_off;
    }
    if (d->s_len)
        c.state = g->buffers + d->s_off;
    if (dp_layer_ops_of(d)->dev_keep)
        c.keep = g->keeps + g->keep_off[l];
    if (dp_layer_ops_of(d)->flags & DP_LK_DRAWS) /* the step's key, in the step block */
        c.key = block_keys(g->block) + g->drop_at[l];
    return c;
}

/* Layers 0..n-1 from x, each through the layer table's device kernels; a
 * layer a relu follows writes the relu's output only (bias and relu in one
 * kernel after the product). */
static void forward(dp_dmodel *g, int batch)
{
    const float *inp = g->x;
    const float *block_in = NULL, *main_out = NULL; /* residual blocks, as model.c */
    for (int l = 0; l < g->n_layers;) {
        const dp_layer *d = &g->layers[l];
        if (d->res & DP_RES_BEGIN)
            block_in = inp;
        if (d->res & DP_RES_SHORTCUT)
            main_out = inp, inp = block_in;
        int last = fuses_relu(g, l) ? l + 1 : l;
        dp_layer_call c = call_of(g, l, batch);
        c.in = inp;
        if (d->res & DP_RES_ADD)
            c.skip = d->res_sc ? main_out : block_in;
        c.out = act(g, last + 1);
        c.relu = last > l;
        dp_layer_ops_of(c.d)->dev_forward(&g->ex, &c);
        inp = c.out;
        l = last + 1;
    }
}

/* Layers n-1..0 from the labels: every parameter gradient OVERWRITTEN, no
 * gradient at the input.  A layer fed by a relu that takes its mask on a
 * device (DP_LK_DEV_TAKES_RELU_MASK: dense) masks its input gradient with
 * the relu's output (kept by the forward), so the relu costs no pass of its
 * own; gradients ping-pong between the dacts.  A residual block runs as in
 * model.c (docs/architecture.md, "Residual blocks"): its output's gradient
 * is kept for both branches, the shortcut's first layer writes into dskip,
 * and one RES_ADD kernel adds it (or the kept gradient) at the block's
 * input. */
static void backward(dp_dmodel *g, int batch)
{
    const float *dout = NULL; /* the gradient at layer l's output */
    const float *keep = NULL, *skip = NULL;
    for (int l = g->n_layers - 1; l >= 0;) {
        const dp_layer *d = &g->layers[l];
        const dp_layer_ops *o = dp_layer_ops_of(d);
        if (d->res & DP_RES_ADD) {
            keep = dout;
            skip = d->res_sc ? g->dskip : dout;
            l--;
            continue;
        }
        int first = l;
        if ((o->flags & DP_LK_DEV_TAKES_RELU_MASK) && l >= 1 && !branch_start(d) &&
            (dp_layer_ops_of(&g->layers[l - 1])->flags & DP_LK_RELU))
            first = l - 1;
        const dp_layer *f = &g->layers[first];
        float *free_buf = g->dacts[0] != dout && g->dacts[0] != keep ? g->dacts[0]
                          : g->dacts[1] != dout && g->dacts[1] != keep ? g->dacts[1]
                                                                       : g->dacts[2];
        dp_layer_call c = call_of(g, l, batch);
        c.din = first == 0 ? NULL : free_buf; /* at layer first's input */
        c.in = l == 0 ? g->x : act(g, l);
        if (f->res & DP_RES_SHORTCUT)
            c.din = f->res_from == 0 ? NULL : g->dskip;
        if (d->res & DP_RES_SHORTCUT)
            c.in = d->res_from == 0 ? g->x : act(g, d->res_from);
        c.out = act(g, l + 1);
        c.dout = dout; /* for a fused relu's layer, already masked by its backward */
        c.relu = first < l;
        o->dev_backward(&g->ex, &c);
        if (f->res & DP_RES_SHORTCUT) { /* the main branch starts from the block's output */
            dout = keep;
            l = first - 1;
            continue;
        }
        if ((f->res & DP_RES_BEGIN) && c.din) {
            dp_kernel k = {.id = DP_K_RES_ADD, .items = (long)batch * f->in};
            k.u.res = (dp_ka_res){c.din, c.din, skip};
            launch(g, &k);
        }
        if (f->res & DP_RES_BEGIN)
            keep = skip = NULL;
        if (first > 0)
            dout = c.din;
        l = first - 1;
    }
}

static void update(dp_dmodel *g)
{
    const dp_optim_config *c = &g->opt.cfg;
    static const dp_kernel_id ids[DP_OPTIM_COUNT] = {
        [DP_OPTIM_SGD] = DP_K_SGD,         [DP_OPTIM_MOMENTUM] = DP_K_MOMENTUM,
        [DP_OPTIM_NESTEROV] = DP_K_NESTEROV, [DP_OPTIM_ADAGRAD] = DP_K_ADAGRAD,
        [DP_OPTIM_ADAM] = DP_K_ADAM,       [DP_OPTIM_ADAMW] = DP_K_ADAM,
    };
    dp_kernel k = {.id = ids[c->kind], .items = (long)g->n_params};
    float *s1 = g->n_slots == 2 ? g->state + g->n_params : NULL;
    k.u.optim = (dp_ka_optim){g->params, g->grads, g->state, s1, g->block,
                              c->momentum, c->beta1, c->beta2, c->eps,
                              dp_optim_adam_exact(&g->opt), c->weight_decay,
                              c->kind == DP_OPTIM_ADAMW};
    launch(g, &k);
    if (g->ema) { /* the average follows every update, as the loop's on the host */
        k.id = DP_K_EMA;
        k.u.ema = (dp_ka_ema){g->ema, g->params, g->ema_decay, 1.0f - g->ema_decay};
        launch(g, &k);
    }
}

/* ---- the host step blocks ---- */

static dp_step_block *slot(const dp_dmodel *g)
{
    return (dp_step_block *)(g->ring + (size_t)g->cur * g->slot_bytes);
}

/* Makes the current slot writable: after RING slots, waits until the
 * stream has read them all. */
static int slot_acquire(dp_dmodel *g, const char *what, dp_err *err)
{
    if (g->used < RING)
        return 0;
    if (sync_err(g, what, err) < 0)
        return -1;
    g->used = 0;
    return 0;
}

/* Bytes of a step block with its keys and `staged` indices. */
static size_t block_bytes(const dp_dmodel *g, int staged)
{
    return sizeof(dp_step_block) + (size_t)g->n_drop * sizeof(uint64_t) +
           (size_t)staged * sizeof(uint32_t);
}

/* Queues the current slot's copy (with its keys and staged indices when
 * `batch`) and moves to the next slot. */
static void slot_send(dp_dmodel *g, int batch)
{
    size_t bytes = batch ? block_bytes(g, g->staged) : sizeof(dp_step_block);
    g->be->copy(g->ctx, g->block, slot(g), bytes, DP_COPY_H2D);
    g->cur = (g->cur + 1) % RING;
    g->used++;
}

/* The keys of the next forward's dropout layers: model.c's seed for each,
 * drawn in layer order as the CPU's forward draws them, then dropout.c's
 * key from it. */
static void slot_keys(dp_dmodel *g)
{
    uint64_t *keys = block_keys(slot(g));
    for (int l = 0; l < g->n_layers; l++)
        if (dp_layer_ops_of(&g->layers[l])->flags & DP_LK_DRAWS)
            keys[g->drop_at[l]] =
                mix64(mix64(g->drop_base + ++g->drop_count * GOLDEN + (uint64_t)l));
}

/* lr and lr_t for the next update, t counted as dp_optim_begin does. */
static void slot_rates(dp_dmodel *g, float lr, float scale)
{
    dp_optim_step st = dp_optim_begin(&g->opt, lr);
    dp_step_block *b = slot(g);
    b->lr = st.lr;
    b->lr_t = st.lr_t;
    b->scale = scale;
}

/* ---- open and close ---- */

static void *dalloc(dp_dmodel *g, size_t bytes, const char *what, dp_err *err)
{
    void *p = g->be->alloc(g->ctx, bytes ? bytes : 1);
    if (p)
        return p;
    /* A device that failed earlier refuses every allocation: say why, not
     * "out of memory". */
    char msg[256] = "";
    if (g->be->sync(g->ctx, msg, sizeof msg) < 0)
        dp_errf(err, "device %s: cannot allocate the %s: %s", g->name, what, msg);
    else
        dp_errf(err, "device %s: out of memory for the %s (%.1f MiB)", g->name, what, mib(bytes));
    return NULL;
}

int dp_dmodel_open(dp_dmodel **out, dp_device *d, const dp_model *m, const dp_optim_config *oc,
                   dp_err *err)
{
    *out = NULL;
    for (int l = 0; l < m->n_layers; l++)
        if (!dp_layer_ops_of(&m->layers[l])->dev_forward) {
            const char *why = dp_layer_ops_of(&m->layers[l])->dev_reason;
            return dp_errf(err, "model %s: layer %d (%s) has no device kernel yet%s%s", m->name,
                           l, dp_layer_kind_name(m->layers[l].kind), why ? ": " : "",
                           why ? why : "");
        }
    dp_dmodel *g = calloc(1, sizeof *g);
    if (!g)
        return dp_errf(err, "dp_dmodel_open: out of memory");
    g->dev = d;
    g->be = dp_device_backend(d);
    g->ctx = dp_device_ctx(d);
    snprintf(g->name, sizeof g->name, "%s", g->be->name);
    g->n_layers = m->n_layers;
    memcpy(g->layers, m->layers, sizeof g->layers);
    g->n_params = m->n_params;
    g->n_buffers = m->n_buffers;
    g->max_batch = m->max_batch;
    g->inputs = dp_model_inputs(m);
    g->drop_base = m->drop_base;
    g->drop_count = m->drop_count;
    for (int l = 0; l < m->n_layers; l++)
        if (dp_layer_ops_of(&m->layers[l])->flags & DP_LK_DRAWS)
            g->drop_at[l] = g->n_drop++;
    if (oc) {
        if (dp_optim_init(&g->opt, oc, 0, err) < 0) /* checks oc; n = 0 holds no state */
            goto fail;
        g->has_opt = 1;
        g->n_slots = dp_optim_slots(oc->kind);
    }
    int graphs;
    if (dp_env_flag("DOWNPOUR_DEVICE_GRAPH", 1, &graphs, err) < 0)
        goto fail;
    g->graphs = g->be->capture_begin && graphs;

    size_t mb = (size_t)g->max_batch, pbytes = g->n_params * sizeof(float);
    size_t acts = 0, width = 0;
    for (int l = 0; l < g->n_layers; l++) {
        const dp_layer *L = &g->layers[l];
        g->act_off[l + 1] = acts;
        acts += line_floats(mb * (size_t)L->out);
        if ((size_t)L->in > width)
            width = (size_t)L->in;
        if ((size_t)L->out > width)
            width = (size_t)L->out;
    }
    size_t dact = line_floats(mb * width);
    int n_dacts = 2; /* 3 with residual blocks, 4 with a projection (model.c's) */
    for (int l = 0; l < g->n_layers; l++) {
        if ((g->layers[l].res & DP_RES_ADD) && n_dacts < 3)
            n_dacts = 3;
        if (g->layers[l].res & DP_RES_SHORTCUT)
            n_dacts = 4;
    }
    size_t keeps = 0;
    for (int l = 0; l < g->n_layers; l++)
        if (dp_layer_ops_of(&g->layers[l])->dev_keep) {
            g->keep_off[l] = keeps;
            keeps += dp_layer_ops_of(&g->layers[l])->dev_keep(&g->layers[l], g->max_batch);
        }
    size_t scratch = 0, ones = mb;
    for (int l = 0; l < g->n_layers; l++) {
        const dp_layer_ops *o = dp_layer_ops_of(&g->layers[l]);
        size_t s = o->dev_scratch ? o->dev_scratch(&g->layers[l], g->max_batch) : 0;
        long n1 = o->dev_ones ? o->dev_ones(&g->layers[l], g->max_batch) : 0;
        scratch = s > scratch ? s : scratch;
        ones = n1 > 0 && (size_t)n1 > ones ? (size_t)n1 : ones;
    }
    if (!(g->params = dalloc(g, pbytes, "parameters", err)) ||
        !(g->grads = dalloc(g, pbytes, "gradients", err)) ||
        (g->n_buffers && !(g->buffers = dalloc(g, g->n_buffers * sizeof(float), "buffers", err))) ||
        (g->n_slots && !(g->state = dalloc(g, (size_t)g->n_slots * pbytes,
                                           "optimiser state", err))) ||
        !(g->acts = dalloc(g, acts * sizeof(float), "activations", err)) ||
        !(g->dacts[0] = dalloc(g, (size_t)n_dacts * dact * sizeof(float),
                               "activation gradients", err)) ||
        !(g->ones = dalloc(g, ones * sizeof(float), "ones vector", err)) ||
        (keeps && !(g->keeps = dalloc(g, keeps * sizeof(float), "layer state", err))) ||
        (scratch && (!(g->ex.rows = dalloc(g, scratch * sizeof(float), "lowering scratch", err)) ||
                     !(g->ex.drows = dalloc(g, scratch * sizeof(float), "lowering scratch",
                                            err)))) ||
        !(g->x = dalloc(g, mb * (size_t)g->inputs * sizeof(float), "batch", err)) ||
        !(g->y = dalloc(g, mb, "batch labels", err)) ||
        !(g->tally = dalloc(g, DP_TALLY_DOUBLES * sizeof(double), "tally", err)))
        goto fail;
    g->dacts[1] = g->dacts[0] + dact;
    if (n_dacts > 2) /* residual blocks: a kept gradient, then the shortcut's */
        g->dacts[2] = g->dacts[1] + dact;
    if (n_dacts > 3)
        g->dskip = g->dacts[2] + dact;
    g->ex = (dp_dexec){g->be, g->ctx, g->ones, (long)ones, g->ex.rows, g->ex.drows, scratch};
    g->slot_bytes = (block_bytes(g, g->max_batch) + 63) & ~(size_t)63;
    if (!(g->block = dalloc(g, g->slot_bytes, "step block", err)))
        goto fail;
    g->ring = g->be->host_alloc(g->ctx, RING * g->slot_bytes);
    if (!g->ring) {
        dp_errf(err, "device %s: out of page-locked host memory for %d step blocks (%.1f MiB)",
                g->name, RING, mib(RING * g->slot_bytes));
        goto fail;
    }
    memset(g->ring, 0, RING * g->slot_bytes);
    if (!(g->last_idx = malloc((size_t)g->max_batch * sizeof *g->last_idx))) {
        dp_errf(err, "out of memory");
        goto fail;
    }

    dp_kernel k = {.id = DP_K_FILL, .items = (long)ones};
    k.u.fill = (dp_ka_fill){g->ones, 1.0f};
    launch(g, &k);
    if (g->has_opt && oc->kind == DP_OPTIM_ADAGRAD) { /* as dp_optim_init leaves it */
        k.items = (long)g->n_params;
        k.u.fill = (dp_ka_fill){g->state, oc->initial_accumulator};
        launch(g, &k);
    }
    for (int l = 0; l < g->n_layers; l++) {
        const dp_layer_ops *o = dp_layer_ops_of(&g->layers[l]);
        if (o->dev_init &&
            o->dev_init(&g->ex, &g->layers[l], g->keeps + g->keep_off[l], g->max_batch) < 0) {
            dp_errf(err, "dp_dmodel_open: out of memory for layer %d's (%s) state", l, o->name);
            goto fail;
        }
    }
    g->be->copy(g->ctx, g->params, m->params, pbytes, DP_COPY_H2D);
    if (g->n_buffers)
        g->be->copy(g->ctx, g->buffers, m->buffers, g->n_buffers * sizeof(float), DP_COPY_H2D);
    if (sync_err(g, "dp_dmodel_open", err) < 0)
        goto fail;
    *out = g;
    return 0;
fail:
    dp_dmodel_close(g);
    return -1;
}

void dp_dmodel_close(dp_dmodel *g)
{
    if (!g)
        return;
    char msg[256];
    g->be->sync(g->ctx, msg, sizeof msg); /* nothing may still read what is freed */
    while (g->n_pins > 0) /* the caller's arrays, before anything of ours goes */
        g->be->host_unregister(g->ctx, g->pins[--g->n_pins]);
    if (g->comm)
        g->be->comm_free(g->ctx, g->comm);
    if (g->graph)
        g->be->graph_free(g->ctx, g->graph);
    void *dev[] = {g->params, g->grads, g->buffers, g->state, g->ema, g->acts, g->dacts[0], g->keeps,
                   g->ones, g->x, g->y, g->tally, g->block, g->split_records,
                   g->split_labels, g->ex.rows, g->ex.drows};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            g->be->free(g->ctx, dev[i]);
    if (g->ring)
        g->be->host_free(g->ctx, g->ring);
    dp_optim_free(&g->opt);
    free(g->last_idx);
    free(g);
}

dp_device *dp_dmodel_device(const dp_dmodel *g) { return g->dev; }

/* ---- data ---- */

int dp_dmodel_load_split(dp_dmodel *g, const dp_split *s, dp_err *err)
{
    if (!dp_split_in_memory(s)) /* the device gathers from a copy of every record */
        return dp_errf(err, "dp_dmodel_load_split: the split's records are %s; a device needs "
                            "them in memory",
                       s->stream ? "streamed from their files" : "not loaded");
    if (s->dim != (uint32_t)g->inputs)
        return dp_errf(err, "dp_dmodel_load_split: records of %u values, the model takes %d",
                       s->dim, g->inputs);
    if (sync_err(g, "dp_dmodel_load_split", err) < 0) /* nothing queued reads the old one */
        return -1;
    if (g->graph) { /* its gather reads the old split's addresses */
        g->be->graph_free(g->ctx, g->graph);
        g->graph = NULL;
        g->graph_n = 0;
    }
    if (g->split_records)
        g->be->free(g->ctx, g->split_records);
    if (g->split_labels)
        g->be->free(g->ctx, g->split_labels);
    g->split_records = NULL;
    g->split_labels = NULL;
    g->images = g->labels = NULL;
    g->values = NULL;
    g->split_n = 0;
    /* Float records take four times the bytes: the same split of values
     * gathers as it is, with no scaling (kernels.h, GATHER_F32). */
    size_t bytes = (size_t)s->n * s->dim * (s->values ? sizeof(float) : 1);
    const void *src = s->values ? (const void *)s->values : (const void *)s->images;
    if (!(g->split_records = dalloc(g, bytes, s->values ? "split's values" : "split's images",
                                    err)) ||
        !(g->split_labels = dalloc(g, s->n, "split's labels", err))) {
        if (g->split_records)
            g->be->free(g->ctx, g->split_records);
        g->split_records = NULL;
        return -1;
    }
    g->be->copy(g->ctx, g->split_records, src, bytes, DP_COPY_H2D);
    g->be->copy(g->ctx, g->split_labels, s->labels, s->n, DP_COPY_H2D);
    if (s->values)
        g->values = g->split_records;
    else
        g->images = g->split_records;
    g->labels = g->split_labels;
    g->split_n = s->n;
    return 0;
}

int dp_dmodel_stage(dp_dmodel *g, const uint32_t *idx, int n, dp_err *err)
{
    if (n < 1)
        return dp_errf(err, "dp_dmodel_stage: batch of %d records (at least 1)", n);
    if (n > g->max_batch)
        return dp_errf(err, "dp_dmodel_stage: batch of %d records is more than the model's %d "
                            "rows",
                       n, g->max_batch);
    if (!g->labels)
        return dp_errf(err, "dp_dmodel_stage: no split loaded (dp_dmodel_load_split first)");
    for (int i = 0; i < n; i++) /* here, so the device never reads out of bounds */
        if (idx[i] >= g->split_n)
            return dp_errf(err, "dp_dmodel_stage: record %u (batch position %d) is past the "
                                "loaded split's %u",
                           idx[i], i, g->split_n);
    if (slot_acquire(g, "dp_dmodel_stage", err) < 0)
        return -1;
    dp_step_block *b = slot(g);
    memcpy(block_idx(g, b), idx, (size_t)n * sizeof *idx);
    b->n = (uint32_t)n;
    g->staged = n;
    if (idx != g->last_idx)
        memcpy(g->last_idx, idx, (size_t)n * sizeof *idx);
    g->last_n = n;
    return 0;
}

/* The last batch again, for a step that failed before its update: its
 * loss, tallied by its forward, is taken back so the retry counts it once
 * (kernels.h, dp_tally_open). */
int dp_dmodel_restage(dp_dmodel *g, dp_err *err)
{
    static const double zero[2] = {0.0, 0.0};
    if (!g->last_n)
        return dp_errf(err, "dp_dmodel_restage: no batch was staged");
    if (g->staged)
        return 0; /* its forward never ran */
    g->be->copy(g->ctx, g->tally + DP_TALLY_STEP, zero, sizeof zero, DP_COPY_H2D);
    return dp_dmodel_stage(g, g->last_idx, g->last_n, err);
}

/* ---- steps ---- */

static void run_step(dp_dmodel *g, int batch, int with_update)
{
    gather(g, batch);
    forward(g, batch);
    backward(g, batch);
    if (with_update)
        update(g);
}

/* Captures the step for `batch` records (recorded, not run). */
static int capture(dp_dmodel *g, int batch, dp_err *err)
{
    char msg[256] = "";
    if (g->graph) {
        g->be->graph_free(g->ctx, g->graph);
        g->graph = NULL;
        g->graph_n = 0;
    }
    if (g->be->capture_begin(g->ctx, msg, sizeof msg) < 0)
        return dp_errf(err, "dp_dmodel_step: device %s: %s", g->name, msg);
    run_step(g, batch, 1);
    if (g->be->capture_end(g->ctx, &g->graph, msg, sizeof msg) < 0) {
        g->graph = NULL;
        return dp_errf(err, "dp_dmodel_step: device %s: %s", g->name, msg);
    }
    g->graph_n = batch;
    return 0;
}

int dp_dmodel_step(dp_dmodel *g, float lr, dp_err *err)
{
    if (!g->has_opt)
        return dp_errf(err, "dp_dmodel_step: the model was opened without an optimiser");
    int n = g->staged;
    if (!n)
        return dp_errf(err, "dp_dmodel_step: no batch staged (dp_dmodel_stage first)");
    int replay = g->graphs && n >= g->graph_n;
    if (replay && n > g->graph_n && capture(g, n, err) < 0)
        return -1;
    slot_rates(g, lr, 1.0f);
    slot_keys(g);
    slot_send(g, 1);
    g->staged = 0;
    if (replay) {
        if (g->be->graph_launch(g->ctx, g->graph) < 0)
            return dp_errf(err, "dp_dmodel_step: device %s: the graph did not launch", g->name);
    } else {
        run_step(g, n, 1);
    }
    return 0;
}

int dp_dmodel_grads(dp_dmodel *g, dp_err *err)
{
    int n = g->staged;
    if (!n)
        return dp_errf(err, "dp_dmodel_grads: no batch staged (dp_dmodel_stage first)");
    slot_keys(g);
    slot_send(g, 1);
    g->staged = 0;
    run_step(g, n, 0);
    return 0;
}

int dp_dmodel_update(dp_dmodel *g, float lr, float scale, dp_err *err)
{
    if (!g->has_opt)
        return dp_errf(err, "dp_dmodel_update: the model was opened without an optimiser");
    if (slot_acquire(g, "dp_dmodel_update", err) < 0)
        return -1;
    int staged = g->staged;
    const dp_step_block *sent = slot(g);
    slot_rates(g, lr, scale);
    slot_send(g, 0); /* the rates only: the device's indices stay */
    update(g);
    if (staged) { /* a batch staged before this update moves to the next slot */
        g->staged = 0;
        if (slot_acquire(g, "dp_dmodel_update", err) < 0)
            return -1;
        memcpy(slot(g), sent, block_bytes(g, staged));
        g->staged = staged;
    }
    return 0;
}

int dp_dmodel_collect(dp_dmodel *g, double *loss_sum, long *correct, dp_err *err)
{
    static const double zero[DP_TALLY_DOUBLES] = {0.0};
    double t[DP_TALLY_DOUBLES] = {0.0};
    g->be->copy(g->ctx, t, g->tally, sizeof t, DP_COPY_D2H);
    if (sync_err(g, "dp_dmodel_collect", err) < 0)
        return -1;
    g->be->copy(g->ctx, g->tally, zero, sizeof zero, DP_COPY_H2D);
    *loss_sum += t[DP_TALLY_STEP] + t[DP_TALLY_BEFORE];
    *correct += (long)(t[DP_TALLY_STEP + 1] + t[DP_TALLY_BEFORE + 1]);
    return 0;
}

/* ---- host <-> device ---- */

static int to_host(dp_dmodel *g, void *dst, const void *src, size_t bytes, const char *what,
                   dp_err *err)
{
    g->be->copy(g->ctx, dst, src, bytes, DP_COPY_D2H);
    return sync_err(g, what, err);
}

/* Waits: from pinned memory (dp_dmodel_pin_host) the copy reads the source
 * only when the stream reaches it, and the caller may change it on return. */
static int to_device(dp_dmodel *g, void *dst, const void *src, size_t bytes, const char *what,
                     dp_err *err)
{
    g->be->copy(g->ctx, dst, src, bytes, DP_COPY_H2D);
    return sync_err(g, what, err);
}

int dp_dmodel_get_params(dp_dmodel *g, float *params, dp_err *err)
{
    return to_host(g, params, g->params, g->n_params * sizeof(float), "dp_dmodel_get_params",
                   err);
}

int dp_dmodel_set_params(dp_dmodel *g, const float *params, dp_err *err)
{
    return to_device(g, g->params, params, g->n_params * sizeof(float), "dp_dmodel_set_params",
                     err);
}

int dp_dmodel_get_buffers(dp_dmodel *g, float *buffers, dp_err *err)
{
    if (!g->n_buffers)
        return 0;
    return to_host(g, buffers, g->buffers, g->n_buffers * sizeof(float), "dp_dmodel_get_buffers",
                   err);
}

int dp_dmodel_get_grads(dp_dmodel *g, float *grads, dp_err *err)
{
    return to_host(g, grads, g->grads, g->n_params * sizeof(float), "dp_dmodel_get_grads", err);
}

int dp_dmodel_set_grads(dp_dmodel *g, const float *grads, dp_err *err)
{
    return to_device(g, g->grads, grads, g->n_params * sizeof(float), "dp_dmodel_set_grads",
                     err);
}

int dp_dmodel_get_optim(dp_dmodel *g, float *slots, long *t, dp_err *err)
{
    if (!g->has_opt)
        return dp_errf(err, "dp_dmodel_get_optim: the model was opened without an optimiser");
    size_t bytes = (size_t)g->n_slots * g->n_params * sizeof(float);
    if (bytes && to_host(g, slots, g->state, bytes, "dp_dmodel_get_optim", err) < 0)
        return -1;
    *t = g->opt.t;
    return 0;
}

int dp_dmodel_set_optim(dp_dmodel *g, const float *slots, long t, dp_err *err)
{
    if (!g->has_opt)
        return dp_errf(err, "dp_dmodel_set_optim: the model was opened without an optimiser");
    if (t < 0)
        return dp_errf(err, "dp_dmodel_set_optim: update count %ld is negative", t);
    size_t bytes = (size_t)g->n_slots * g->n_params * sizeof(float);
    if (bytes && to_device(g, g->state, slots, bytes, "dp_dmodel_set_optim", err) < 0)
        return -1;
    g->opt.t = t;
    return 0;
}

/* ---- page-locked host memory ---- */

int dp_dmodel_pin_host(dp_dmodel *g, void *p, size_t bytes, dp_err *err)
{
    if (!g->be->host_register || bytes == 0) /* nothing to lock with, or nothing to lock */
        return 0;
    if (!p)
        return dp_errf(err, "dp_dmodel_pin_host: no memory given for %zu bytes", bytes);
    if (g->n_pins == DP_DMODEL_MAX_PINS)
        return dp_errf(err, "dp_dmodel_pin_host: %d ranges are pinned already (at most %d)",
                       g->n_pins, DP_DMODEL_MAX_PINS);
    char msg[256] = "";
    if (g->be->host_register(g->ctx, p, bytes, msg, sizeof msg) < 0)
        return dp_errf(err, "dp_dmodel_pin_host: device %s: %s", g->name,
                       msg[0] ? msg : "the backend refused to page-lock the memory");
    g->pins[g->n_pins++] = p;
    g->pinned_bytes += bytes;
    return 0;
}

size_t dp_dmodel_pinned_bytes(const dp_dmodel *g) { return g->pinned_bytes; }

/* ---- --ema ---- */

int dp_dmodel_ema_start(dp_dmodel *g, float decay, const float *start, dp_err *err)
{
    if (!(decay > 0.0f && decay < 1.0f))
        return dp_errf(err, "dp_dmodel_ema_start: decay %g is not in (0, 1)", (double)decay);
    if (!g->has_opt)
        return dp_errf(err, "dp_dmodel_ema_start: the model was opened without an optimiser, "
                            "so it has no updates to average");
    if (sync_err(g, "dp_dmodel_ema_start", err) < 0)
        return -1;
    if (!g->ema && !(g->ema = dalloc(g, g->n_params * sizeof(float), "moving average", err)))
        return -1;
    if (g->graph) { /* captured without the average's kernel */
        g->be->graph_free(g->ctx, g->graph);
        g->graph = NULL;
        g->graph_n = 0;
    }
    g->ema_decay = decay;
    size_t bytes = g->n_params * sizeof(float);
    if (start)
        return to_device(g, g->ema, start, bytes, "dp_dmodel_ema_start", err);
    g->be->copy(g->ctx, g->ema, g->params, bytes, DP_COPY_D2D);
    return sync_err(g, "dp_dmodel_ema_start", err);
}

int dp_dmodel_get_ema(dp_dmodel *g, float *ema, dp_err *err)
{
    if (!g->ema)
        return dp_errf(err, "dp_dmodel_get_ema: no moving average (dp_dmodel_ema_start first)");
    return to_host(g, ema, g->ema, g->n_params * sizeof(float), "dp_dmodel_get_ema", err);
}

/* ---- collectives ---- */

static int no_comm(const dp_dmodel *g, const char *what, dp_err *err)
{
    return dp_errf(err, "%s: the %s device has no collectives (NCCL)", what, g->name);
}

int dp_dmodel_comm_id(dp_dmodel *g, uint8_t id[DP_COMM_ID_BYTES], dp_err *err)
{
    char msg[256] = "";
    if (!g->be->comm_id)
        return no_comm(g, "dp_dmodel_comm_id", err);
    if (g->be->comm_id(g->ctx, id, DP_COMM_ID_BYTES, msg, sizeof msg) < 0)
        return dp_errf(err, "dp_dmodel_comm_id: device %s: %s", g->name, msg);
    return 0;
}

int dp_dmodel_comm_join(dp_dmodel *g, const uint8_t id[DP_COMM_ID_BYTES], int ranks, int rank,
                        dp_err *err)
{
    char msg[256] = "";
    if (!g->be->comm_join)
        return no_comm(g, "dp_dmodel_comm_join", err);
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return dp_errf(err, "dp_dmodel_comm_join: rank %d of %d is out of range", rank, ranks);
    if (g->comm) {
        g->be->comm_free(g->ctx, g->comm);
        g->comm = NULL;
    }
    if (g->be->comm_join(g->ctx, id, DP_COMM_ID_BYTES, ranks, rank, &g->comm, msg, sizeof msg) <
        0) {
        g->comm = NULL;
        return dp_errf(err, "dp_dmodel_comm_join: device %s, rank %d of %d: %s", g->name, rank,
                       ranks, msg);
    }
    return 0;
}

int dp_dmodel_scale_grads(dp_dmodel *g, float w, dp_err *err)
{
    (void)err;
    dp_kernel k = {.id = w == 0.0f ? DP_K_FILL : DP_K_SCALE, .items = (long)g->n_params};
    if (w == 0.0f) /* grads of no batch may be anything: zero, not times zero */
        k.u.fill = (dp_ka_fill){g->grads, 0.0f};
    else
        k.u.scale = (dp_ka_scale){g->grads, w};
    launch(g, &k);
    return 0;
}

int dp_dmodel_comm_wait(dp_dmodel *g, double timeout_s, dp_err *err)
{
    char msg[512] = "";
    if (!g->be->comm_wait)
        return no_comm(g, "dp_dmodel_comm_wait", err);
    if (!g->comm)
        return dp_errf(err, "dp_dmodel_comm_wait: no communicator (dp_dmodel_comm_join first)");
    int rc = g->be->comm_wait(g->ctx, g->comm, timeout_s, msg, sizeof msg);
    if (rc < 0)
        return dp_errf(err, "device %s: the all-reduce of %zu gradients failed: %s", g->name,
                       g->n_params, msg);
    return rc;
}

void dp_dmodel_comm_abort(dp_dmodel *g)
{
    if (g && g->comm) {
        g->be->comm_abort(g->ctx, g->comm);
        g->comm = NULL;
    }
}

int dp_dmodel_allreduce_grads(dp_dmodel *g, dp_err *err)
{
    if (!g->be->comm_allreduce)
        return no_comm(g, "dp_dmodel_allreduce_grads", err);
    if (!g->comm)
        return dp_errf(err, "dp_dmodel_allreduce_grads: no communicator (dp_dmodel_comm_join "
                            "first)");
    if (g->be->comm_allreduce(g->ctx, g->comm, g->grads, g->n_params) < 0) {
        /* comm_allreduce has no message of its own: the failed
         * communicator's or device's reason comes from comm_wait */
        char msg[256] = "";
        g->be->comm_wait(g->ctx, g->comm, 0.0, msg, sizeof msg);
        return dp_errf(err, "dp_dmodel_allreduce_grads: device %s: the all-reduce of %zu "
                            "gradients did not start%s%s",
                       g->name, g->n_params, msg[0] ? ": " : "", msg);
    }
    return 0;
}
