/* Training-state checkpoints: see include/downpour/checkpoint.h. */
#include "downpour/checkpoint.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "downpour/crc32c.h"
#include "downpour/file.h"
#include "downpour/layer_kind.h"
#include "downpour/layers.h"
#include "downpour/log.h"
#include "downpour/safetensors.h"
#include "downpour/sparse.h"

#define MAX_WORKERS 4096
#define MAX_TENSORS \
    ((2 + DP_LK_MAX_BUFFERS) * DP_MAX_DENSE + 8 + 3 * MAX_WORKERS + DP_STATE_MAX_VECS)
#define NAME_LEN 48

static float *alloc_floats(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

/* A state read for a model with compact tables (a task of a run on rows:
 * docs/checkpoints.md, "Reading in pieces"): its file kept open, verified,
 * and where each table's rows and each optimiser slot's lie in it. */
typedef struct rows_src {
    dp_safetensors *f;
    char *path;
    int n_tables;
    const dp_st_tensor *table[DP_SPARSE_MAX]; /* layers.{i}.weight of table k */
    size_t width[DP_SPARSE_MAX];
    long rows[DP_SPARSE_MAX];
    size_t flat[DP_SPARSE_MAX];               /* its first float in a flat slot vector */
    const dp_st_tensor *slot[2];              /* optimizer.slot{q} */
    const dp_st_tensor *best;                 /* 'best' (DP_CKPT_PART_BEST), or NULL */
    float *buf;                               /* one piece: PIECE_BYTES */
} rows_src;

#define PIECE_BYTES ((size_t)1 << 20) /* a piece of rows read at once */

static void rows_src_free(void *p)
{
    rows_src *r = p;
    if (!r)
        return;
    dp_safetensors_free(r->f);
    free(r->path);
    free(r->buf);
    free(r);
}

int dp_train_state_alloc(dp_train_state *st, size_t n_params, int n_slots, int parts,
                         int max_history, int n_workers, dp_err *err)
{
    memset(st, 0, sizeof *st);
    st->n_params = n_params;
    st->n_slots = n_slots;
    st->best_accuracy = -1;
    st->max_history = max_history;
    st->n_workers = n_workers;
    st->params = alloc_floats(n_params);
    int ok = st->params != NULL;
    if (n_slots > 0)
        ok &= (st->slots = alloc_floats((size_t)n_slots * n_params)) != NULL;
    if (parts & DP_STATE_EMA)
        ok &= (st->ema = alloc_floats(n_params)) != NULL;
    if (parts & DP_STATE_BEST)
        ok &= (st->best = alloc_floats(n_params)) != NULL;
    if (max_history > 0)
        ok &= (st->history = calloc((size_t)max_history * 3, sizeof(float))) != NULL;
    if (n_workers > 0) {
        ok &= (st->worker_slots = alloc_floats((size_t)n_workers * n_slots * n_params)) != NULL;
        ok &= (st->worker_t = calloc((size_t)n_workers, sizeof(long))) != NULL;
    }
    if (!ok) {
        dp_train_state_free(st);
        return dp_errf(err, "out of memory for the training state of %zu parameters", n_params);
    }
    return 0;
}

void dp_train_state_free(dp_train_state *st)
{
    if (!st)
        return;
    free(st->params);
    free(st->slots);
    free(st->ema);
    free(st->best);
    free(st->history);
    free(st->worker_slots);
    free(st->worker_t);
    free(st->buffers);
    free(st->residuals);
    free(st->vec_names);
    free(st->vecs);
    free(st->scalars);
    free(st->path);
    rows_src_free(st->rows_src);
    memset(st, 0, sizeof *st);
}

int dp_train_state_alloc_residuals(dp_train_state *st, int n, dp_err *err)
{
    free(st->residuals);
    st->residuals = NULL;
    st->n_residuals = 0;
    if (n <= 0)
        return 0;
    if (n > MAX_WORKERS)
        return dp_errf(err, "%d replicas' compression residuals, at most %d", n, MAX_WORKERS);
    if (!(st->residuals = calloc((size_t)n * (st->n_params ? st->n_params : 1), sizeof(float))))
        return dp_errf(err, "out of memory for %d replicas' compression residuals (%zu floats "
                            "each)", n, st->n_params);
    st->n_residuals = n;
    return 0;
}

/* ------------------------------------------------------------ writing */

typedef struct writer {
    dp_st_tensor t[MAX_TENSORS];
    float *owned[DP_MAX_DENSE]; /* filters turned into PyTorch's order for the file */
    int n_owned;
    char names[MAX_TENSORS][NAME_LEN];
    int nt;
    dp_st_meta meta[64 + MAX_WORKERS];
    char values[64 + MAX_WORKERS][48];
    char keys[MAX_WORKERS][NAME_LEN];
    int nm;
    /* compact tables (dp_checkpoint_write_rows): tensor i's table (-1: its
     * data is in memory), where the rows come from, and the checksum made
     * as the data goes by */
    int table_of[MAX_TENSORS];
    int part_of[MAX_TENSORS];  /* a flat tensor of compact tables: 1 + its slot, or
                                  DP_CKPT_PART_BEST (0: none) */
    size_t flat_at[MAX_TENSORS]; /* where its fill is, in the whole model's order */
    size_t table_len[DP_SPARSE_MAX]; /* each compact table's floats, whole */
    size_t tables_end, cut;      /* the tables' floats whole; what the model lacks of them */
    const dp_train_state *st;
    int n_tables;
    dp_ckpt_rows_fn rows;
    void *rows_ctx;
    uint32_t crc;
    int crc_tensor_at; /* the tensor whose name the checksum took last */
    int crc_meta;      /* the crc32c entry, written again once the data is */
} writer;

static uint32_t crc_text(uint32_t crc, const char *key, const char *value)
{
    crc = dp_crc32c(crc, key, strlen(key) + 1);
    return dp_crc32c(crc, value, strlen(value) + 1);
}

static uint32_t crc_tensor(uint32_t crc, const dp_st_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    crc = dp_crc32c(crc, t->name, strlen(t->name) + 1);
    return dp_crc32c(crc, t->data, n * sizeof(float));
}

static void add_tensor(writer *w, const float *data, int ndim, int64_t d0, int64_t d1,
                       const char *fmt, int i, int k)
{
    snprintf(w->names[w->nt], NAME_LEN, fmt, i, k);
    w->t[w->nt] = (dp_st_tensor){w->names[w->nt], data, ndim, {d0, d1}};
    w->nt++;
}

/* The file's shape of a layer's weights and bias (docs/models.md,
 * "Checkpoints and PyTorch"): its kind's (layer_kind.h). */
static int weight_shape(const dp_layer *d, int64_t *w, int64_t *b, int *bdim)
{
    return dp_layer_ops_of(d)->shapes(d, w, b, bdim);
}

/* Whether the kind's weights are stored in another order in files. */
static bool filter_order(const dp_layer *d)
{
    return dp_layer_ops_of(d)->flags & DP_LK_FILTER_ORDER;
}

/* A filter layer's weights are (.., kh, kw, c) in the model (the lowering's
 * order) and (.., c, kh, kw) in the file: one transpose per filter. */
static int filters(const dp_layer *d) { return (int)(d->w_len / ((size_t)d->win.kh * d->win.kw * d->c)); }

/* Layer d's buffers (layer_kind.h) as layers.{idx}.<name>, PyTorch's names:
 * running_mean, running_var, num_batches_tracked. */
static void add_layer_buffers(writer *w, const dp_layer *d, const float *buffers, int idx)
{
    dp_lk_buffer b[DP_LK_MAX_BUFFERS];
    int n = d->s_len && dp_layer_ops_of(d)->buffers ? dp_layer_ops_of(d)->buffers(d, b) : 0;
    size_t off = d->s_off;
    for (int i = 0; i < n; off += b[i].len, i++) {
        snprintf(w->names[w->nt], NAME_LEN, "layers.%d.%s", idx, b[i].name);
        w->t[w->nt] = (dp_st_tensor){w->names[w->nt], buffers + off, b[i].ndim,
                                     {(int64_t)b[i].len}};
        w->nt++;
    }
}

/* A kind's own tensors (layer_kind.h: mha's four, pos's and emb's one)
 * as layers.{idx}.<name>. */
static void add_kind_tensors(writer *w, const dp_layer *d, const float *params, int idx)
{
    dp_lk_tensor t[DP_LK_MAX_TENSORS];
    int n = dp_layer_ops_of(d)->tensors(d, t);
    for (int i = 0; i < n; i++) {
        snprintf(w->names[w->nt], NAME_LEN, "layers.%d.%s", idx, t[i].name);
        w->t[w->nt] = (dp_st_tensor){w->names[w->nt], params + d->w_off + t[i].off, t[i].ndim,
                                     {0}};
        memcpy(w->t[w->nt].shape, t[i].shape, (size_t)t[i].ndim * sizeof *t[i].shape);
        w->nt++;
    }
}

static int add_layer_tensors(writer *w, const dp_layer *d, const float *params, int idx)
{
    if (dp_layer_ops_of(d)->tensors) {
        int first = w->nt;
        add_kind_tensors(w, d, params, idx);
        if (d->sparse_rows) { /* a compact table: the file holds it whole, from w->rows */
            if (w->nt != first + 1)
                return -1;
            if (w->n_tables >= DP_SPARSE_MAX)
                return -1;
            w->t[first].shape[0] = d->sparse_rows;
            w->t[first].data = NULL;
            w->table_len[w->n_tables] = (size_t)d->sparse_rows * (size_t)w->t[first].shape[1];
            w->tables_end += w->table_len[w->n_tables];
            w->cut += w->table_len[w->n_tables] - d->w_len;
            w->table_of[first] = w->n_tables++;
        }
        return 0;
    }
    int64_t ws[6], bs[3];
    int bdim, wdim = weight_shape(d, ws, bs, &bdim);
    const float *data = params + d->w_off;
    if (filter_order(d)) {
        float *t = malloc(d->w_len * sizeof *t);
        if (!t)
            return -1;
        dp_hwc_to_chw(t, data, filters(d), d->c, d->win.kh * d->win.kw);
        w->owned[w->n_owned++] = t;
        data = t;
    }
    snprintf(w->names[w->nt], NAME_LEN, "layers.%d.weight", idx);
    w->t[w->nt] = (dp_st_tensor){w->names[w->nt], data, wdim, {0}};
    memcpy(w->t[w->nt].shape, ws, (size_t)wdim * sizeof *ws);
    w->nt++;
    snprintf(w->names[w->nt], NAME_LEN, "layers.%d.bias", idx);
    w->t[w->nt] = (dp_st_tensor){w->names[w->nt], params + d->b_off, bdim, {0}};
    memcpy(w->t[w->nt].shape, bs, (size_t)bdim * sizeof *bs);
    w->nt++;
    return 0;
}

static void add_meta(writer *w, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_meta(writer *w, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->values[w->nm], sizeof w->values[w->nm], fmt, ap);
    va_end(ap);
    w->meta[w->nm] = (dp_st_meta){key, w->values[w->nm]};
    w->nm++;
}

/* A string value as it is (a dataset path, a model spec): no copy, so no
 * length limit. */
static void add_text(writer *w, const char *key, const char *value)
{
    w->meta[w->nm++] = (dp_st_meta){key, value};
}

/* dp_st_source for compact tables: their rows from w->rows, the checksum
 * over every piece in file order (as crc_tensor takes them: each tensor's
 * name, empty ones' too, then its data), then the crc32c value written in
 * place. */
static int fill_rows(void *ctx, int i, float *buf, size_t n, dp_err *err)
{
    writer *w = ctx;
    if (!w->part_of[i])
        return w->rows(w->rows_ctx, 0, w->table_of[i], buf, n, err);
    /* a flat slot vector in the whole model's order: the tables' part from
     * the rows source, table after table, then the dense part from memory
     * (dense j of the whole model at j - cut) */
    int part = w->part_of[i];
    const float *dense = part == DP_CKPT_PART_BEST
                             ? w->st->best
                             : w->st->slots + (size_t)(part - 1) * w->st->n_params;
    while (n > 0) {
        size_t at = w->flat_at[i], m = n;
        if (at < w->tables_end) {
            size_t lo = 0;
            int k = 0;
            while (at >= lo + w->table_len[k])
                lo += w->table_len[k++];
            if (m > lo + w->table_len[k] - at)
                m = lo + w->table_len[k] - at;
            if (w->rows(w->rows_ctx, part, k, buf, m, err) < 0)
                return -1;
        } else {
            memcpy(buf, dense + (at - w->cut), m * sizeof(float));
        }
        w->flat_at[i] += m;
        buf += m;
        n -= m;
    }
    return 0;
}

static void crc_piece(void *ctx, int i, const void *data, size_t bytes)
{
    writer *w = ctx;
    if (w->crc_tensor_at != i) {
        w->crc_tensor_at = i;
        w->crc = dp_crc32c(w->crc, w->t[i].name, strlen(w->t[i].name) + 1);
    }
    if (bytes)
        w->crc = dp_crc32c(w->crc, data, bytes);
}

static int crc_done(void *ctx, dp_err *err)
{
    (void)err;
    writer *w = ctx;
    snprintf(w->values[w->crc_meta], sizeof w->values[w->crc_meta], "%08x", w->crc);
    return 0;
}

static int write_file(const char *path, const dp_model *m, const dp_train_state *st,
                      const dp_run_identity *id, dp_ckpt_rows_fn rows, void *rows_ctx,
                      dp_err *err);

int dp_checkpoint_write(const char *path, const dp_model *m, const dp_train_state *st,
                        const dp_run_identity *id, dp_err *err)
{
    return write_file(path, m, st, id, NULL, NULL, err);
}

int dp_checkpoint_write_rows(const char *path, const dp_model *m, const dp_train_state *st,
                             const dp_run_identity *id, dp_ckpt_rows_fn rows, void *ctx,
                             dp_err *err)
{
    if (!rows)
        return dp_errf(err, "%s: no source of the sparse tables' rows", path);
    /* the weights and optimiser slots: no other flat vector is made whole */
    if (st->ema || st->n_workers || st->n_residuals || st->n_vecs || m->external)
        return dp_errf(err, "%s: a model with compact tables writes its weights, optimiser "
                            "slots and best weights only", path);
    return write_file(path, m, st, id, rows, ctx, err);
}

static int write_file(const char *path, const dp_model *m, const dp_train_state *st,
                      const dp_run_identity *id, dp_ckpt_rows_fn rows, void *rows_ctx,
                      dp_err *err)
{
    if (st->n_params != m->n_params)
        return dp_errf(err, "%s: the state holds %zu parameters, the model %zu", path,
                       st->n_params, m->n_params);
    if (st->n_workers > MAX_WORKERS)
        return dp_errf(err, "%s: %d workers' optimisers, at most %d", path, st->n_workers,
                       MAX_WORKERS);
    if (st->n_residuals > MAX_WORKERS)
        return dp_errf(err, "%s: %d replicas' residuals, at most %d", path, st->n_residuals,
                       MAX_WORKERS);
    if (st->n_vecs < 0 || st->n_vecs > DP_STATE_MAX_VECS)
        return dp_errf(err, "%s: %d vectors of the strategy's own, at most %d", path,
                       st->n_vecs, DP_STATE_MAX_VECS);
    writer *w = calloc(1, sizeof *w);
    if (!w)
        return dp_errf(err, "out of memory");
    for (int i = 0; i < MAX_TENSORS; i++)
        w->table_of[i] = -1;
    w->rows = rows;
    w->rows_ctx = rows_ctx;
    w->st = st;
    w->crc_tensor_at = -1;
    /* buffers: the state's when it holds them, else the writing task's model's
     * (docs/strategies.md, "Buffers") */
    const float *buffers = st->buffers ? st->buffers : m->buffers;
    for (int l = 0, idx = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (d->w_len && add_layer_tensors(w, d, st->params, idx) < 0) {
            for (int i = 0; i < w->n_owned; i++)
                free(w->owned[i]);
            free(w);
            return dp_errf(err, "%s: out of memory for layer %d's weights", path, l);
        }
        if (d->w_len)
            add_layer_buffers(w, d, buffers, idx++);
    }
    size_t n = st->n_params;
    if (m->external) { /* no layers to name (external.h): the flat arrays as they are */
        add_tensor(w, st->params, 1, (int64_t)n, 0, "params", 0, 0);
        if (m->n_buffers && buffers)
            add_tensor(w, buffers, 1, (int64_t)m->n_buffers, 0, "buffers", 0, 0);
    }
    for (int k = 0; k < st->n_slots && st->slots; k++) {
        int at = w->nt;
        add_tensor(w, st->slots + (size_t)k * n, 1, (int64_t)n, 0, "optimizer.slot%d", k, 0);
        if (rows && w->n_tables) { /* whole in the file: the tables' part streamed */
            w->t[at].data = NULL;
            w->t[at].shape[0] = (int64_t)(n + w->cut);
            w->part_of[at] = 1 + k;
        }
    }
    for (int i = 0; i < st->n_workers; i++)
        for (int k = 0; k < st->n_slots; k++)
            add_tensor(w, st->worker_slots + ((size_t)i * st->n_slots + k) * n, 1, (int64_t)n, 0,
                       "worker.%d.optimizer.slot%d", i, k);
    for (int i = 0; i < st->n_residuals && st->residuals; i++)
        add_tensor(w, st->residuals + (size_t)i * n, 1, (int64_t)n, 0, "replica.%d.residual", i,
                   0);
    if (st->ema)
        add_tensor(w, st->ema, 1, (int64_t)n, 0, "ema", 0, 0);
    if (st->best && st->best_epoch > 0) {
        int at = w->nt;
        add_tensor(w, st->best, 1, (int64_t)n, 0, "best", 0, 0);
        if (rows && w->n_tables) { /* whole in the file: the tables' part streamed */
            w->t[at].data = NULL;
            w->t[at].shape[0] = (int64_t)(n + w->cut);
            w->part_of[at] = DP_CKPT_PART_BEST;
        }
    }
    if (st->n_history > 0)
        add_tensor(w, st->history, 2, st->n_history, 3, "loop.history", 0, 0);
    for (int i = 0; i < st->n_vecs; i++) { /* the names fit: DP_STATE_NAME_LEN < NAME_LEN */
        snprintf(w->names[w->nt], NAME_LEN, "%s", st->vec_names[i]);
        w->t[w->nt] = (dp_st_tensor){w->names[w->nt], st->vecs + (size_t)i * n, 1, {(int64_t)n}};
        w->nt++;
    }

    long spe = id ? id->steps_per_epoch : 0;
    add_text(w, "format", DP_CKPT_FORMAT);
    add_text(w, "model", m->spec);
    add_text(w, "model_name", m->name);
    add_meta(w, "step", "%ld", st->step);
    add_meta(w, "epoch", "%ld", spe > 0 ? st->step / spe : 0L);
    add_meta(w, "optimizer_t", "%ld", st->optim_t);
    add_meta(w, "best_accuracy", "%.17g", st->best_accuracy);
    add_meta(w, "best_epoch", "%d", st->best_epoch);
    if (id) {
        add_text(w, "strategy", id->strategy);
        add_text(w, "dataset", id->dataset);
        add_text(w, "optimizer", id->optimizer);
        add_meta(w, "lr", "%.9g", (double)id->lr);
        add_text(w, "lr_schedule", id->lr_schedule);
        add_meta(w, "workers", "%d", id->workers);
        add_meta(w, "ps", "%d", id->ps);
        add_meta(w, "batch", "%d", id->batch);
        add_meta(w, "seed", "%" PRIu64, id->seed);
        add_meta(w, "train_size", "%" PRIu32, id->train_size);
        add_meta(w, "val_size", "%" PRIu32, id->val_size);
        add_meta(w, "steps_per_epoch", "%ld", id->steps_per_epoch);
        add_meta(w, "epochs", "%d", id->epochs);
        add_text(w, "settings", id->settings ? id->settings : "");
    }
    if (st->scalars)
        add_text(w, "strategy_state", st->scalars);
    for (int i = 0; i < st->n_workers; i++) {
        snprintf(w->keys[i], NAME_LEN, "worker.%d.optimizer_t", i);
        add_meta(w, w->keys[i], "%ld", st->worker_t[i]);
    }
    /* A checksum over every metadata value and every tensor, so a flipped
     * byte anywhere is caught on reading.  With compact tables their rows
     * exist only as they are written: the checksum is made as the data goes
     * by, and the header written again with it (same length: 8 digits). */
    uint32_t crc = 0;
    for (int i = 0; i < w->nm; i++)
        crc = crc_text(crc, w->meta[i].key, w->meta[i].value);
    int rc;
    if (w->n_tables > 0 && !rows) {
        rc = dp_errf(err, "%s: the model holds %d compact table(s) and no source of their rows "
                          "was given", path, w->n_tables);
    } else if (rows) {
        w->crc = crc;
        w->crc_meta = w->nm;
        add_meta(w, "crc32c", "%08x", 0u);
        dp_st_source src = {fill_rows, crc_piece, crc_done, w};
        rc = dp_safetensors_save_source(path, w->t, w->nt, w->meta, w->nm, &src, err);
    } else {
        for (int i = 0; i < w->nt; i++)
            crc = crc_tensor(crc, &w->t[i]);
        add_meta(w, "crc32c", "%08x", crc);
        rc = dp_safetensors_save(path, w->t, w->nt, w->meta, w->nm, err);
    }
    for (int i = 0; i < w->n_owned; i++)
        free(w->owned[i]);
    free(w);
    return rc;
}

/* ------------------------------------------------------------ reading */

static void shape_text(char *buf, size_t len, const int64_t *shape, int ndim)
{
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, ")");
}

static int copy_tensor(float *dst, const dp_safetensors *f, const char *name, int ndim,
                       const int64_t *shape, const char *path, dp_err *err)
{
    const dp_st_tensor *t = dp_safetensors_find(f, name);
    if (!t)
        return dp_errf(err, "%s: tensor '%s' is missing", path, name);
    size_t n = 1;
    int same = t->ndim == ndim;
    for (int d = 0; d < ndim; d++) {
        same = same && t->shape[d] == shape[d];
        n *= (size_t)shape[d];
    }
    if (!same) {
        char want[96], got[96];
        shape_text(want, sizeof want, shape, ndim);
        shape_text(got, sizeof got, t->shape, t->ndim);
        return dp_errf(err, "%s: tensor '%s' has shape %s, the model needs %s", path, name, got,
                       want);
    }
    if (dp_safetensors_read(f, t, 0, dst, n * sizeof *dst, err) < 0)
        return dp_err_prefix(err, "%s", path);
    return 0;
}

/* A tensor whose shape must be `shape` and whose data is not read here (a
 * compact table's rows: dp_checkpoint_read_rows); NULL with err. */
static const dp_st_tensor *find_shaped(const dp_safetensors *f, const char *name, int ndim,
                                       const int64_t *shape, const char *path, dp_err *err)
{
    const dp_st_tensor *t = dp_safetensors_find(f, name);
    if (!t) {
        dp_errf(err, "%s: tensor '%s' is missing", path, name);
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int d = 0; d < ndim; d++)
        same = same && t->shape[d] == shape[d];
    if (!same) {
        char want[96], got[96];
        shape_text(want, sizeof want, shape, ndim);
        shape_text(got, sizeof got, t->shape, t->ndim);
        dp_errf(err, "%s: tensor '%s' has shape %s, the model needs %s", path, name, got, want);
        return NULL;
    }
    return t;
}

/* A tensor of rank 1 (d0) or 2 (d0, d1). */
static int copy_2d(float *dst, const dp_safetensors *f, const char *name, int ndim, int64_t d0,
                   int64_t d1, const char *path, dp_err *err)
{
    int64_t shape[2] = {d0, d1};
    return copy_tensor(dst, f, name, ndim, shape, path, err);
}

/* Layer d's buffers, layers.{idx}.<name>, into buffers (the model's layout). */
static int read_buffers(const dp_safetensors *f, const dp_layer *d, float *buffers, int idx,
                        const char *path, dp_err *err)
{
    dp_lk_buffer b[DP_LK_MAX_BUFFERS];
    int n = d->s_len && dp_layer_ops_of(d)->buffers ? dp_layer_ops_of(d)->buffers(d, b) : 0;
    size_t off = d->s_off;
    char name[NAME_LEN];
    for (int i = 0; i < n; off += b[i].len, i++) {
        int64_t shape[1] = {(int64_t)b[i].len};
        snprintf(name, sizeof name, "layers.%d.%s", idx, b[i].name);
        if (copy_tensor(buffers + off, f, name, b[i].ndim, shape, path, err) < 0)
            return -1;
    }
    return 0;
}

/* A kind's own tensors (layer_kind.h), layers.{idx}.<name>, into params.
 * A compact table (d->sparse_rows) is the whole table's tensor in the file:
 * its shape is checked and its place kept in rs (its slots in params are
 * zeros: a task of a run on rows pulls them), nothing of it read. */
static int read_kind_tensors(const dp_safetensors *f, const dp_layer *d, float *params, int idx,
                             rows_src *rs, const char *path, dp_err *err)
{
    dp_lk_tensor t[DP_LK_MAX_TENSORS];
    int n = dp_layer_ops_of(d)->tensors(d, t);
    char name[NAME_LEN];
    if (d->sparse_rows) {
        if (n != 1 || t[0].ndim != 2 || !rs || rs->n_tables >= DP_SPARSE_MAX)
            return dp_errf(err, "%s: layer %d: a compact table of another shape", path, idx);
        int64_t shape[2] = {d->sparse_rows, t[0].shape[1]};
        snprintf(name, sizeof name, "layers.%d.%s", idx, t[0].name);
        int k = rs->n_tables;
        if (!(rs->table[k] = find_shaped(f, name, 2, shape, path, err)))
            return -1;
        rs->width[k] = (size_t)shape[1];
        rs->rows[k] = d->sparse_rows;
        rs->flat[k] = k ? rs->flat[k - 1] + (size_t)rs->rows[k - 1] * rs->width[k - 1] : 0;
        rs->n_tables++;
        memset(params + d->w_off, 0, d->w_len * sizeof(float));
        return 0;
    }
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "layers.%d.%s", idx, t[i].name);
        if (copy_tensor(params + d->w_off + t[i].off, f, name, t[i].ndim, t[i].shape, path,
                        err) < 0)
            return -1;
    }
    return 0;
}

/* Every parameter layer's layers.{i}.weight and .bias into params (the
 * model's layout; filters back from PyTorch's order), and its buffers into
 * buffers when non-NULL. */
static int read_weights(const dp_safetensors *f, const dp_model *m, float *params,
                        float *buffers, rows_src *rs, const char *path, dp_err *err)
{
    char name[NAME_LEN];
    if (m->external)
        return copy_2d(params, f, "params", 1, (int64_t)m->n_params, 0, path, err) < 0 ||
                       (buffers && m->n_buffers &&
                        copy_2d(buffers, f, "buffers", 1, (int64_t)m->n_buffers, 0, path,
                                err) < 0)
                   ? -1
                   : 0;
    for (int l = 0, idx = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (!d->w_len)
            continue;
        if (dp_layer_ops_of(d)->tensors) {
            if (read_kind_tensors(f, d, params, idx++, rs, path, err) < 0)
                return -1;
            continue;
        }
        int64_t ws[6], bs[3];
        int bdim, wdim = weight_shape(d, ws, bs, &bdim);
        float *dst = params + d->w_off, *tmp = NULL;
        if (filter_order(d) && !(dst = tmp = malloc(d->w_len * sizeof *tmp)))
            return dp_errf(err, "%s: out of memory for layer %d's weights", path, l);
        snprintf(name, sizeof name, "layers.%d.weight", idx);
        int rc = copy_tensor(dst, f, name, wdim, ws, path, err);
        if (tmp && rc == 0)
            dp_chw_to_hwc(params + d->w_off, tmp, filters(d), d->c, d->win.kh * d->win.kw);
        free(tmp);
        snprintf(name, sizeof name, "layers.%d.bias", idx);
        if (rc < 0 || copy_tensor(params + d->b_off, f, name, bdim, bs, path, err) < 0)
            return -1;
        if (buffers && read_buffers(f, d, buffers, idx, path, err) < 0)
            return -1;
        idx++;
    }
    return 0;
}

static int meta_str(const dp_safetensors *f, const char *key, const char **out, const char *path,
                    dp_err *err)
{
    *out = dp_safetensors_meta(f, key);
    if (!*out)
        return dp_errf(err, "%s: metadata '%s' is missing", path, key);
    return 0;
}

static int meta_long(const dp_safetensors *f, const char *key, long lo, long hi, long *out,
                     const char *path, dp_err *err)
{
    const char *v;
    if (meta_str(f, key, &v, path, err) < 0)
        return -1;
    char what[DP_ERR_MAX]; /* the path and the key whole, however long the path */
    snprintf(what, sizeof what, "%s: metadata '%s'", path, key);
    return dp_parse_long(v, lo, hi, out, what, err);
}

static int meta_double(const dp_safetensors *f, const char *key, double *out, const char *path,
                       dp_err *err)
{
    const char *v;
    if (meta_str(f, key, &v, path, err) < 0)
        return -1;
    char what[DP_ERR_MAX];
    snprintf(what, sizeof what, "%s: metadata '%s'", path, key);
    return dp_parse_double(v, -1, 1, out, what, err);
}

/* A metadata value that must equal this run's. */
static int same(const dp_safetensors *f, const char *key, const char *want, const char *path,
                dp_err *err)
{
    const char *v;
    if (meta_str(f, key, &v, path, err) < 0)
        return -1;
    if (strcmp(v, want) != 0)
        return dp_errf(err, "%s belongs to another run: its %s is %s, this run's is %s", path, key,
                       v, want);
    return 0;
}

/* The token "key=value" (or a bare "key") of list whose key is key[0, klen),
 * or NULL; *len gets the token's length. */
static const char *find_setting(const char *list, const char *key, size_t klen, size_t *len)
{
    for (const char *t = list; *t;) {
        size_t n = strcspn(t, " ");
        if (strcspn(t, "= ") == klen && strncmp(t, key, klen) == 0) {
            *len = n;
            return t;
        }
        t += n;
        while (*t == ' ')
            t++;
    }
    return NULL;
}

/* "key=value ..." lists: names the first setting that differs, by key, so a
 * setting written only when on (--sync-bn, --compress, the warm-up, ...)
 * that one run has and the other not is named as such. */
static int same_settings(const dp_safetensors *f, const char *want, const char *path, dp_err *err)
{
    const char *have;
    if (meta_str(f, "settings", &have, path, err) < 0)
        return -1;
    if (strcmp(have, want) == 0)
        return 0;
    for (int side = 0; side < 2; side++) {
        const char *mine = side ? want : have, *other = side ? have : want;
        for (const char *t = mine; *t;) {
            size_t n = strcspn(t, " "), klen = strcspn(t, "= "), olen = 0;
            const char *o = find_setting(other, t, klen, &olen);
            if (!o && side == 0)
                return dp_errf(err, "%s belongs to another run: its %.*s, this run has no %.*s",
                               path, (int)n, t, (int)klen, t);
            if (!o)
                return dp_errf(err, "%s belongs to another run: it has no %.*s, this run's %.*s",
                               path, (int)klen, t, (int)n, t);
            if (olen != n || strncmp(o, t, n) != 0)
                return side == 0 ? dp_errf(err, "%s belongs to another run: its %.*s, this run's "
                                                "%.*s", path, (int)n, t, (int)olen, o)
                                 : dp_errf(err, "%s belongs to another run: its %.*s, this run's "
                                                "%.*s", path, (int)olen, o, (int)n, t);
            t += n;
            while (*t == ' ')
                t++;
        }
    }
    return dp_errf(err, "%s belongs to another run: its settings are '%s', this run's '%s'", path,
                   have, want);
}

static int same_long(const dp_safetensors *f, const char *key, long want, const char *path,
                     dp_err *err)
{
    char s[32];
    snprintf(s, sizeof s, "%ld", want);
    return same(f, key, s, path, err);
}

static int check_identity(const dp_safetensors *f, const dp_model *m, const dp_run_identity *id,
                          const char *path, dp_err *err)
{
    const char *v;
    if (meta_str(f, "format", &v, path, err) < 0)
        return -1;
    if (strcmp(v, DP_CKPT_FORMAT) != 0)
        return dp_errf(err, "%s: format '%s', this build reads %s", path, v, DP_CKPT_FORMAT);
    char seed[32], lr[32];
    snprintf(seed, sizeof seed, "%" PRIu64, id->seed);
    snprintf(lr, sizeof lr, "%.9g", (double)id->lr);
    if (same(f, "model", m->spec, path, err) < 0 || same(f, "strategy", id->strategy, path, err) < 0 ||
        same(f, "dataset", id->dataset, path, err) < 0 ||
        same(f, "optimizer", id->optimizer, path, err) < 0 ||
        same(f, "lr_schedule", id->lr_schedule, path, err) < 0 || same(f, "lr", lr, path, err) < 0 ||
        same(f, "seed", seed, path, err) < 0 ||
        /* under --global-batch the settings hold the global batch; a worker's
         * share follows from it and the workers, which may change */
        (id->global_batch <= 0 && same_long(f, "batch", id->batch, path, err) < 0) ||
        same_long(f, "train_size", (long)id->train_size, path, err) < 0 ||
        same_long(f, "val_size", (long)id->val_size, path, err) < 0 ||
        same_settings(f, id->settings ? id->settings : "", path, err) < 0)
        return -1;
    long workers, ps;
    if (meta_long(f, "workers", 0, INT_MAX, &workers, path, err) < 0 ||
        meta_long(f, "ps", 0, INT_MAX, &ps, path, err) < 0)
        return -1;
    if ((workers != id->workers || ps != id->ps) && id->reshards == DP_RESHARD_NONE)
        return dp_errf(err, "%s was written by a run of %ld worker(s) and %ld ps task(s); this run "
                            "has %d and %d. Hint: resume with the cluster it was written by",
                       path, workers, ps, id->workers, id->ps);
    /* The ps family's state is whole vectors the shards re-slice, so any
     * ps count takes it up; another worker count only where a step still
     * takes the same records (docs/checkpoints.md, "Resuming on another
     * cluster"). */
    if (workers != id->workers && id->reshards == DP_RESHARD_PS) {
        if (id->global_batch <= 0)
            return dp_errf(err, "%s was written by a run of %ld worker(s); this run has %d, whose "
                                "steps would take another number of records (--batch is each "
                                "worker's). Hint: resume with %ld worker(s), or train with "
                                "--global-batch N (from the first run on) to resume on any "
                                "number of workers that divides N",
                           path, workers, id->workers, workers);
        if (!id->same_records)
            return dp_errf(err, "%s was written by a run of %ld worker(s); this run has %d, and "
                                "its --shard deals each worker records of its own, so a step "
                                "would take other records. Hint: resume with %ld worker(s); "
                                "--shard data (the default) resumes on any number",
                           path, workers, id->workers, workers);
    }
    long epochs;
    if (meta_long(f, "epochs", 1, INT_MAX, &epochs, path, err) < 0)
        return -1;
    if (epochs != id->epochs && strcmp(id->lr_schedule, "constant") != 0)
        return dp_errf(err, "%s was written by a run of %ld epochs with a %s learning rate; the "
                            "schedule of %d epochs differs", path, epochs, id->lr_schedule,
                       id->epochs);
    return 0;
}

/* The metadata keys in the order dp_checkpoint_write adds them. */
static const char *const meta_keys[] = {
    "format", "model", "model_name", "step", "epoch", "optimizer_t", "best_accuracy", "best_epoch",
    "strategy", "dataset", "optimizer", "lr", "lr_schedule", "workers", "ps", "batch", "seed",
    "train_size", "val_size", "steps_per_epoch", "epochs", "settings", "strategy_state"};

/* Recomputes the writer's checksum: every value of meta_keys present, the
 * workers' keys, then every tensor in file order. */
static int check_crc(const dp_safetensors *f, const char *path, dp_err *err)
{
    const char *format = dp_safetensors_meta(f, "format");
    if (!format || strcmp(format, DP_CKPT_FORMAT) != 0)
        return dp_errf(err, "%s: not a downpour training checkpoint (format '%s', expected %s)",
                       path, format ? format : "(none)", DP_CKPT_FORMAT);
    const char *want = dp_safetensors_meta(f, "crc32c");
    if (!want)
        return dp_errf(err, "%s: metadata 'crc32c' is missing", path);
    uint32_t crc = 0;
    for (size_t i = 0; i < sizeof meta_keys / sizeof meta_keys[0]; i++) {
        const char *v = dp_safetensors_meta(f, meta_keys[i]);
        if (v)
            crc = crc_text(crc, meta_keys[i], v);
    }
    for (int i = 0; i < MAX_WORKERS; i++) {
        char key[NAME_LEN];
        snprintf(key, sizeof key, "worker.%d.optimizer_t", i);
        const char *v = dp_safetensors_meta(f, key);
        if (!v)
            break;
        crc = crc_text(crc, key, v);
    }
    /* an opened file's data is read here in pieces (dp_safetensors_open):
     * the same checksum, never the file whole in memory */
    float *piece = NULL;
    for (int i = 0; i < dp_safetensors_count(f); i++) {
        const dp_st_tensor *t = dp_safetensors_at(f, i);
        if (t->data) {
            crc = crc_tensor(crc, t);
            continue;
        }
        size_t bytes = 4;
        for (int d = 0; d < t->ndim; d++)
            bytes *= (size_t)t->shape[d];
        crc = dp_crc32c(crc, t->name, strlen(t->name) + 1);
        if (bytes && !piece && !(piece = malloc(PIECE_BYTES)))
            return dp_errf(err, "%s: out of memory for a piece of %zu bytes", path, PIECE_BYTES);
        for (size_t at = 0; at < bytes; at += PIECE_BYTES) {
            size_t m = bytes - at < PIECE_BYTES ? bytes - at : PIECE_BYTES;
            if (dp_safetensors_read(f, t, at, piece, m, err) < 0) {
                free(piece);
                return dp_err_prefix(err, "%s", path);
            }
            crc = dp_crc32c(crc, piece, m);
        }
    }
    free(piece);
    char got[16];
    snprintf(got, sizeof got, "%08x", crc);
    if (strcmp(got, want) != 0)
        return dp_errf(err, "%s: checksum mismatch (stored %s, computed %s): the file is damaged",
                       path, want, got);
    return 0;
}

/* The strategy's own state: every tensor named "<strategy>.*", each a
 * vector over the parameters, and the "strategy_state" text. */
static int read_strategy_state(const dp_safetensors *f, const char *strategy, dp_train_state *st,
                               const char *path, dp_err *err)
{
    size_t plen = strlen(strategy), n = st->n_params;
    int count = 0;
    for (int i = 0; i < dp_safetensors_count(f); i++) {
        const dp_st_tensor *t = dp_safetensors_at(f, i);
        if (strncmp(t->name, strategy, plen) != 0 || t->name[plen] != '.')
            continue;
        if (strlen(t->name) >= DP_STATE_NAME_LEN)
            return dp_errf(err, "%s: tensor '%s': a name of %zu characters, at most %d", path,
                           t->name, strlen(t->name), DP_STATE_NAME_LEN - 1);
        if (t->ndim != 1 || t->shape[0] != (int64_t)n)
            return dp_errf(err, "%s: tensor '%s' is not a vector of the model's %zu parameters",
                           path, t->name, n);
        if (++count > DP_STATE_MAX_VECS)
            return dp_errf(err, "%s: more than %d tensors named %s.*", path, DP_STATE_MAX_VECS,
                           strategy);
    }
    const char *text = dp_safetensors_meta(f, "strategy_state");
    if (text && !(st->scalars = strdup(text)))
        return dp_errf(err, "%s: out of memory", path);
    if (count == 0)
        return 0;
    st->vec_names = calloc((size_t)count, sizeof *st->vec_names);
    st->vecs = malloc((size_t)count * n * sizeof(float));
    if (!st->vec_names || !st->vecs)
        return dp_errf(err, "%s: out of memory for %d vectors of %zu floats", path, count, n);
    for (int i = 0; i < dp_safetensors_count(f); i++) {
        const dp_st_tensor *t = dp_safetensors_at(f, i);
        if (strncmp(t->name, strategy, plen) != 0 || t->name[plen] != '.')
            continue;
        snprintf(st->vec_names[st->n_vecs], DP_STATE_NAME_LEN, "%s", t->name);
        if (dp_safetensors_read(f, t, 0, st->vecs + (size_t)st->n_vecs * n, n * sizeof(float),
                                err) < 0)
            return dp_err_prefix(err, "%s", path);
        st->n_vecs++;
    }
    return 0;
}

/* The floats a model with compact tables lacks of the whole one's (0: none). */
static size_t compact_cut(const dp_model *m)
{
    size_t cut = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        if (d->sparse_rows && d->w_len) {
            dp_lk_tensor t[DP_LK_MAX_TENSORS];
            if (dp_layer_ops_of(d)->tensors && dp_layer_ops_of(d)->tensors(d, t) == 1 &&
                t[0].ndim == 2)
                cut += (size_t)d->sparse_rows * (size_t)t[0].shape[1] - d->w_len;
        }
    }
    return cut;
}

/* A flat vector of the whole model (an optimiser slot, the best weights)
 * for a model with compact tables: whole in the file, the tables' rows
 * first (read by rows: dp_checkpoint_read_rows), then the dense part, which
 * is this model's after its tables' slots (zeros); NULL with err. */
static const dp_st_tensor *read_flat(const dp_safetensors *f, const char *name,
                                     const rows_src *rs, const dp_model *m, size_t cut, float *v,
                                     const char *path, dp_err *err)
{
    size_t n = m->n_params;
    int64_t whole = (int64_t)(n + cut);
    size_t tables = rs->n_tables ? rs->flat[rs->n_tables - 1] +
                                       (size_t)rs->rows[rs->n_tables - 1] *
                                           rs->width[rs->n_tables - 1]
                                 : 0;
    const dp_st_tensor *t = find_shaped(f, name, 1, &whole, path, err);
    if (!t)
        return NULL;
    memset(v, 0, (tables - cut) * sizeof(float));
    if (dp_safetensors_read(f, t, tables * sizeof(float), v + (tables - cut),
                            (n + cut - tables) * sizeof(float), err) < 0) {
        dp_err_prefix(err, "%s", path);
        return NULL;
    }
    return t;
}

/* Reads f (opened or loaded) into st.  For a model with compact tables
 * (dp_model_init_compact) the state is in its layout: the dense parts read,
 * the tables' slots zeros, and the file kept open in st for the tables'
 * rows (dp_checkpoint_read_rows): *f is then the state's, and NULL here. */
static int read_state(dp_safetensors **fp, const char *path, const dp_model *m,
                      const dp_run_identity *id, dp_train_state *st, dp_err *err)
{
    const dp_safetensors *f = *fp; /* its checksum verified by the caller */
    if (check_identity(f, m, id, path, err) < 0)
        return -1;
    dp_optim_kind kind;
    if (dp_optim_parse_kind(id->optimizer, &kind, err) < 0)
        return -1;
    int n_slots = dp_optim_slots(kind);
    long step, t, best_epoch;
    double best_acc;
    if (meta_long(f, "step", 0, LONG_MAX, &step, path, err) < 0 ||
        meta_long(f, "optimizer_t", 0, LONG_MAX, &t, path, err) < 0 ||
        meta_long(f, "best_epoch", 0, id->epochs, &best_epoch, path, err) < 0 ||
        meta_double(f, "best_accuracy", &best_acc, path, err) < 0)
        return -1;
    const dp_st_tensor *hist = dp_safetensors_find(f, "loop.history");
    int n_hist = hist ? (int)hist->shape[0] : 0;
    if (hist && (hist->ndim != 2 || hist->shape[1] != 3 || hist->shape[0] > id->epochs))
        return dp_errf(err, "%s: tensor 'loop.history' is not (epochs <= %d, 3)", path, id->epochs);
    /* model-avg keeps one optimiser per worker (found by its t: sgd has no
     * slot tensors); the others one in all.  Resumed on another number of
     * workers, worker k takes the file's worker k mod W (docs/checkpoints.md,
     * "Resuming on another cluster"). */
    long file_workers = 0;
    int n_workers = dp_safetensors_meta(f, "worker.0.optimizer_t") ? id->workers : 0;
    if (n_workers > 0 && (meta_long(f, "workers", 1, MAX_WORKERS, &file_workers, path, err) < 0))
        return -1;
    int parts = (dp_safetensors_find(f, "ema") ? DP_STATE_EMA : 0) |
                (dp_safetensors_find(f, "best") ? DP_STATE_BEST : 0);
    if (dp_train_state_alloc(st, m->n_params, n_slots, parts, id->epochs, n_workers, err) < 0)
        return -1;
    st->step = step;
    st->optim_t = t;
    st->best_epoch = (int)best_epoch;
    st->best_accuracy = best_acc;
    st->n_history = n_hist;
    if (m->n_buffers) {
        if (!(st->buffers = malloc(m->n_buffers * sizeof *st->buffers)))
            return dp_errf(err, "%s: out of memory for %zu buffers", path, m->n_buffers);
        st->n_buffers = m->n_buffers;
    }
    size_t cut = compact_cut(m);
    rows_src *rs = NULL;
    if (cut && !(rs = calloc(1, sizeof *rs)))
        return dp_errf(err, "%s: out of memory", path);
    if (rs && !(rs->path = strdup(path))) {
        free(rs);
        return dp_errf(err, "%s: out of memory", path);
    }
    st->rows_src = rs;
    if (read_weights(f, m, st->params, st->buffers, rs, path, err) < 0)
        return -1;
    char name[NAME_LEN];
    size_t n = m->n_params;
    for (int k = 0; k < n_slots; k++) {
        snprintf(name, sizeof name, "optimizer.slot%d", k);
        if (!rs) {
            if (copy_2d(st->slots + (size_t)k * n, f, name, 1, (int64_t)n, 0, path, err) < 0)
                return -1;
            continue;
        }
        if (k >= 2 || !(rs->slot[k] = read_flat(f, name, rs, m, cut, st->slots + (size_t)k * n,
                                                 path, err)))
            return k >= 2 ? dp_errf(err, "%s: %d optimiser slots", path, n_slots) : -1;
    }
    for (int i = 0; i < n_workers; i++) {
        int from = (int)(i % file_workers);
        for (int k = 0; k < n_slots; k++) {
            snprintf(name, sizeof name, "worker.%d.optimizer.slot%d", from, k);
            if (copy_2d(st->worker_slots + ((size_t)i * n_slots + k) * n, f, name, 1,
                            (int64_t)n, 0, path, err) < 0)
                return -1;
        }
        snprintf(name, sizeof name, "worker.%d.optimizer_t", from);
        if (meta_long(f, name, 0, LONG_MAX, &st->worker_t[i], path, err) < 0)
            return -1;
    }
    /* allreduce with --compress: each replica's residual, replica.{p}.residual
     * from 0 up (the strategy checks their count against its replicas) */
    int n_resid = 0;
    for (; n_resid < MAX_WORKERS; n_resid++) {
        snprintf(name, sizeof name, "replica.%d.residual", n_resid);
        if (!dp_safetensors_find(f, name))
            break;
    }
    if (dp_train_state_alloc_residuals(st, n_resid, err) < 0)
        return dp_err_prefix(err, "%s", path);
    for (int i = 0; i < n_resid; i++) {
        snprintf(name, sizeof name, "replica.%d.residual", i);
        if (copy_2d(st->residuals + (size_t)i * n, f, name, 1, (int64_t)n, 0, path, err) < 0)
            return -1;
    }
    /* a run on rows keeps no moving average (the tables would move whole);
     * the best weights' dense part is read, their rows by rows */
    if (rs && st->ema)
        return dp_errf(err, "%s: tensor 'ema': a task holding its sparse tables compact reads "
                            "no moving average", path);
    if (rs && st->best && !(rs->best = read_flat(f, "best", rs, m, cut, st->best, path, err)))
        return -1;
    if (st->ema && copy_2d(st->ema, f, "ema", 1, (int64_t)n, 0, path, err) < 0)
        return -1;
    if (st->best && !rs && copy_2d(st->best, f, "best", 1, (int64_t)n, 0, path, err) < 0)
        return -1;
    if (!st->best && best_epoch > 0)
        return dp_errf(err, "%s: best_epoch is %ld but tensor 'best' is missing", path, best_epoch);
    if (n_hist > 0 && copy_2d(st->history, f, "loop.history", 2, n_hist, 3, path, err) < 0)
        return -1;
    if (!(st->path = strdup(path)))
        return dp_errf(err, "%s: out of memory", path);
    if (read_strategy_state(f, id->strategy, st, path, err) < 0)
        return -1;
    if (rs) { /* the file stays open for the tables' rows */
        if (!(rs->buf = malloc(PIECE_BYTES)))
            return dp_errf(err, "%s: out of memory", path);
        rs->f = *fp;
        *fp = NULL;
    }
    return 0;
}

int dp_checkpoint_read(const char *path, const dp_model *m, const dp_run_identity *id,
                       dp_train_state *st, dp_err *err)
{
    dp_safetensors *f = NULL;
    memset(st, 0, sizeof *st);
    /* opened, not loaded: the checksum and the state read a piece at a time */
    if (dp_safetensors_open(path, &f, err) < 0 || check_crc(f, path, err) < 0) {
        dp_safetensors_free(f);
        return -1;
    }
    int rc = read_state(&f, path, m, id, st, err);
    dp_safetensors_free(f);
    if (rc < 0)
        dp_train_state_free(st);
    return rc;
}

/* The tensor of sparse table `table`'s part (0 its rows, DP_CKPT_PART_BEST
 * the best ones, k its optimiser slot k - 1), NULL when there is none. */
static const dp_st_tensor *part_tensor(const dp_train_state *st, const rows_src *rs, int table,
                                       int part)
{
    return table < 0 || table >= rs->n_tables ? NULL
           : part == 0                        ? rs->table[table]
           : part == DP_CKPT_PART_BEST        ? rs->best
           : part > 0 && part <= st->n_slots  ? rs->slot[part - 1]
                                              : NULL;
}

int dp_checkpoint_read_rows(const dp_train_state *st, int table, int part, int shard, int shards,
                            size_t first, size_t n, float *dst, dp_err *err)
{
    const rows_src *rs = st ? st->rows_src : NULL;
    if (!rs)
        return dp_errf(err, "%s: read whole, not by rows",
                       st && st->path ? st->path : "the checkpoint");
    const dp_st_tensor *t = part_tensor(st, rs, table, part);
    if (!t || shards < 1 || shard < 0 || shard >= shards)
        return dp_errf(err, "%s: no part %d of sparse table %d on shard %d of %d", rs->path,
                       part, table, shard, shards);
    size_t w = rs->width[table], S = (size_t)shards;
    size_t per = PIECE_BYTES / (w * sizeof(float)); /* rows a piece */
    size_t base = part ? rs->flat[table] : 0;
    if (n && (size_t)shard + (first + n - 1) * S >= (size_t)rs->rows[table])
        return dp_errf(err, "%s: rows past the %ld of sparse table %d", rs->path,
                       rs->rows[table], table);
    for (size_t i = 0; i < n;) {
        size_t id = (size_t)shard + (first + i) * S;
        if (per == 0) { /* a row above a piece: straight into its place */
            if (dp_safetensors_read(rs->f, t, (base + id * w) * sizeof(float), dst + i * w,
                                    w * sizeof(float), err) < 0)
                return dp_err_prefix(err, "%s", rs->path);
            i++;
            continue;
        }
        /* the piece from row id on: every S-th row of it is this shard's */
        size_t last = (size_t)shard + (first + n - 1) * S, span = last - id + 1;
        size_t m = span < per ? span : per;
        if (dp_safetensors_read(rs->f, t, (base + id * w) * sizeof(float), rs->buf,
                                m * w * sizeof(float), err) < 0)
            return dp_err_prefix(err, "%s", rs->path);
        for (size_t r = 0; r < m; r += S, i++)
            memcpy(dst + i * w, rs->buf + r * w, w * sizeof(float));
    }
    return 0;
}

/* A gap between two ids of dp_checkpoint_read_ids's of at most this many
 * bytes of rows is read with them, in one pread, rather than splitting the
 * read in two: a few KiB more cost less than a system call. */
#define GAP_BYTES ((size_t)4096)

int dp_checkpoint_read_ids(const dp_train_state *st, int table, int part, const uint32_t *ids,
                           size_t n, float *dst, dp_err *err)
{
    const rows_src *rs = st ? st->rows_src : NULL;
    if (!rs)
        return dp_errf(err, "%s: read whole, not by rows",
                       st && st->path ? st->path : "the checkpoint");
    const dp_st_tensor *t = part_tensor(st, rs, table, part);
    if (!t)
        return dp_errf(err, "%s: no part %d of sparse table %d", rs->path, part, table);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= (uint64_t)rs->rows[table] || (i > 0 && ids[i] <= ids[i - 1]))
            return dp_errf(err, "%s: row id %u (entry %zu) of sparse table %d: ids must be below "
                                "its %ld rows and strictly increasing",
                           rs->path, ids[i], i, table, rs->rows[table]);
    size_t w = rs->width[table], row = w * sizeof(float);
    size_t per = PIECE_BYTES / row, gap = GAP_BYTES / row; /* rows */
    size_t base = part ? rs->flat[table] : 0;
    for (size_t i = 0, j; i < n; i = j) {
        /* a run: ids close enough, spanning at most a piece */
        for (j = i + 1; j < n && ids[j] - ids[j - 1] - 1 <= gap && ids[j] - ids[i] < per; j++)
            ;
        size_t span = (size_t)(ids[j - 1] - ids[i]) + 1;
        uint64_t at = (base + (size_t)ids[i] * w) * sizeof(float);
        if (span == j - i) { /* adjacent rows, adjacent places: straight there */
            if (dp_safetensors_read(rs->f, t, at, dst + i * w, span * row, err) < 0)
                return dp_err_prefix(err, "%s", rs->path);
            continue;
        }
        if (dp_safetensors_read(rs->f, t, at, rs->buf, span * row, err) < 0)
            return dp_err_prefix(err, "%s", rs->path);
        for (size_t q = i; q < j; q++)
            memcpy(dst + q * w, rs->buf + (size_t)(ids[q] - ids[i]) * w, row);
    }
    return 0;
}

int dp_checkpoint_read_table(const dp_train_state *st, int table, int part, size_t off,
                             size_t n, float *dst, dp_err *err)
{
    const rows_src *rs = st ? st->rows_src : NULL;
    if (!rs || table < 0 || table >= rs->n_tables)
        return dp_errf(err, "%s: no sparse table %d to read by rows",
                       st && st->path ? st->path : "the checkpoint", table);
    const dp_st_tensor *t = part == 0                       ? rs->table[table]
                            : part == DP_CKPT_PART_BEST       ? rs->best
                            : part > 0 && part <= st->n_slots ? rs->slot[part - 1]
                                                              : NULL;
    size_t len = (size_t)rs->rows[table] * rs->width[table];
    if (!t || off > len || n > len - off)
        return dp_errf(err, "%s: no floats [%zu, +%zu) of part %d of sparse table %d",
                       rs->path, off, n, part, table);
    size_t base = part ? rs->flat[table] : 0;
    if (dp_safetensors_read(rs->f, t, (base + off) * sizeof(float), dst, n * sizeof(float),
                            err) < 0)
        return dp_err_prefix(err, "%s", rs->path);
    return 0;
}

int dp_checkpoint_open_rows(const char *path, const dp_model *m, dp_train_state *st,
                            dp_err *err)
{
    memset(st, 0, sizeof *st);
    dp_safetensors *f = NULL;
    rows_src *rs = calloc(1, sizeof *rs);
    float *scratch = NULL;
    if (!rs || !(rs->path = strdup(path)) || !(st->path = strdup(path))) {
        rows_src_free(rs);
        free(st->path);
        st->path = NULL;
        return dp_errf(err, "%s: out of memory", path);
    }
    st->rows_src = rs;
    /* the weights' places are mapped through read_weights; the dense ones
     * it reads are this model's few */
    int rc = dp_safetensors_open(path, &f, err);
    if (rc == 0 && (!(scratch = alloc_floats(m->n_params)) || !(rs->buf = malloc(PIECE_BYTES))))
        rc = dp_errf(err, "%s: out of memory", path);
    if (rc == 0)
        rc = read_weights(f, m, scratch, NULL, rs, path, err);
    if (rc < 0) {
        free(scratch);
        dp_safetensors_free(f);
        dp_train_state_free(st);
        return -1;
    }
    free(scratch);
    rs->f = f;
    return 0;
}

int dp_checkpoint_load_weights(const char *path, dp_model *m, int max_batch, dp_ckpt_info *info,
                               dp_err *err)
{
    dp_safetensors *f = NULL;
    memset(m, 0, sizeof *m);
    if (dp_safetensors_open(path, &f, err) < 0)
        return -1;
    const char *spec = dp_safetensors_meta(f, "model");
    if (!spec) {
        dp_safetensors_free(f);
        return dp_errf(err, "%s: metadata 'model' is missing: not a downpour checkpoint", path);
    }
    /* Files of this format carry a checksum; weights-only files of the first
     * format had none. */
    if (dp_safetensors_meta(f, "crc32c") && check_crc(f, path, err) < 0) {
        dp_safetensors_free(f);
        return -1;
    }
    if (dp_model_init(m, spec, max_batch, 1, err) < 0) {
        dp_err_prefix(err, "%s", path);
        goto fail;
    }
    const char *preset = dp_safetensors_meta(f, "model_name");
    if (preset && strlen(preset) < sizeof m->name)
        snprintf(m->name, sizeof m->name, "%s", preset);
    if (read_weights(f, m, m->params, m->buffers, NULL, path, err) < 0)
        goto fail;
    if (info) {
        const char *s = dp_safetensors_meta(f, "strategy"), *d = dp_safetensors_meta(f, "dataset");
        snprintf(info->strategy, sizeof info->strategy, "%s", s ? s : "unknown");
        snprintf(info->dataset, sizeof info->dataset, "%s", d ? d : "unknown");
        info->step = 0;
        if (dp_safetensors_meta(f, "step") &&
            meta_long(f, "step", 0, LONG_MAX, &info->step, path, err) < 0)
            goto fail;
    }
    dp_safetensors_free(f);
    return 0;
fail:
    dp_safetensors_free(f);
    dp_model_free(m);
    return -1;
}

/* ------------------------------------------------------------ a directory of them */

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"

void dp_checkpoint_path(char *buf, size_t n, const char *dir, long step)
{
    snprintf(buf, n, "%s/" CKPT_PREFIX "%010ld" CKPT_SUFFIX, dir, step);
}

/* The step in a checkpoint's file name, or -1 when it is not one. */
static long step_of(const char *name)
{
    size_t len = strlen(name), lp = strlen(CKPT_PREFIX), ls = strlen(CKPT_SUFFIX);
    if (len != lp + 10 + ls || strncmp(name, CKPT_PREFIX, lp) != 0 ||
        strcmp(name + len - ls, CKPT_SUFFIX) != 0)
        return -1;
    long step = 0;
    for (size_t i = lp; i < lp + 10; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

static int cmp_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Every checkpoint step in dir, newest first; -1 when dir can't be read. */
static int list_steps(const char *dir, long **out, dp_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return dp_errf(err, "cannot read the checkpoint directory %s: %s", dir, strerror(errno));
    long *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s = step_of(e->d_name);
        if (s < 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *grown = realloc(steps, (size_t)cap * sizeof *steps);
            if (!grown) {
                free(steps);
                closedir(d);
                return dp_errf(err, "out of memory");
            }
            steps = grown;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n > 1)
        qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
    *out = steps;
    return n;
}

int dp_checkpoint_find_newest(const char *dir, const dp_model *m, const dp_run_identity *id,
                              dp_train_state *st, char *path, size_t path_len, dp_err *err)
{
    long *steps = NULL;
    memset(st, 0, sizeof *st); /* what an error frees, as dp_checkpoint_read */
    int n = list_steps(dir, &steps, err);
    if (n < 0)
        return -1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        dp_checkpoint_path(path, path_len, dir, steps[i]);
        dp_safetensors *f = NULL;
        dp_err why;
        /* opened, not loaded: the checksum is verified in one streamed pass,
         * a piece at a time, and the state read from the same open file */
        if (dp_safetensors_open(path, &f, &why) < 0 || check_crc(f, path, &why) < 0) {
            /* A damaged file (a disk that filled, a copy cut short): an older
             * one will do.  It is set aside, not deleted (someone may want to
             * look at it), so it no longer counts among the kept ones. */
            char aside[4200];
            snprintf(aside, sizeof aside, "%s.damaged", path);
            if (rename(path, aside) == 0)
                dp_warn("%s; set aside as %s, going back to an older checkpoint", why.msg, aside);
            else
                dp_warn("%s; going back to an older checkpoint", why.msg);
            dp_safetensors_free(f);
            continue;
        }
        rc = read_state(&f, path, m, id, st, err) < 0 ? -1 : 1;
        dp_safetensors_free(f);
        if (rc < 0)
            dp_train_state_free(st);
        break;
    }
    free(steps);
    return rc;
}

void dp_checkpoint_prune(const char *dir, int keep)
{
    long *steps = NULL;
    dp_err err;
    int n = list_steps(dir, &steps, &err);
    for (int i = keep; i < n; i++) {
        char path[4096];
        dp_checkpoint_path(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            dp_warn("cannot delete old checkpoint %s: %s", path, strerror(errno));
    }
    free(steps);
}

/* A process with this pid lives on this host (EPERM: it does, but is not
 * ours to signal). */
static int pid_alive(long pid)
{
    if (pid <= 0 || pid > INT_MAX)
        return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* A best weights' file of a chief on rows (loop.c's write_best, unlinked
 * once open: one left means its writer died between), ".best-<pid>.safetensors":
 * 1 with *pid. */
static int best_file_pid(const char *name, long *pid)
{
    const char *p = name + strlen(".best-");
    if (strncmp(name, ".best-", strlen(".best-")) != 0 || *p < '0' || *p > '9')
        return 0;
    char *end;
    *pid = strtol(p, &end, 10);
    return strcmp(end, ".safetensors") == 0;
}

int dp_checkpoint_remove_temps(const char *dir, dp_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return dp_errf(err, "cannot read the checkpoint directory %s: %s", dir, strerror(errno));
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t base_len;
        long pid;
        char base[NAME_LEN], path[4096];
        if (best_file_pid(e->d_name, &pid)) { /* --keep-best on rows: its file, or */
            base_len = 0;
        } else {
            if (!dp_atomic_temp_parse(e->d_name, &base_len, &pid) || base_len >= sizeof base)
                continue;
            memcpy(base, e->d_name, base_len);
            base[base_len] = '\0';
            long owner;
            if (step_of(base) < 0 && !best_file_pid(base, &owner))
                continue; /* another writer's temporary: not ours to judge */
        }
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (pid != (long)getpid() && pid_alive(pid)) {
            dp_info("%s: left in place: process %ld is alive and may be writing it", path, pid);
            continue;
        }
        if (unlink(path) == 0) {
            dp_info("Removed %s, the temporary file of a checkpoint write that was interrupted",
                    path);
            removed++;
        } else if (errno != ENOENT) {
            dp_warn("cannot remove the stale checkpoint temporary %s: %s", path, strerror(errno));
        }
    }
    closedir(d);
    return removed;
}
