/* The one training loop (docs/architecture.md, "The loop and its
 * strategies").  Every task of every strategy runs it: it opens the task's
 * part of the strategy, then serves (a SERVER), coordinates (a COORDINATOR)
 * or walks batches (a TRAINER).  Epochs, the batch order, the learning-rate
 * schedule, step lines, evaluation, --ema, --keep-best, checkpoints and the
 * resume position are written here once; the strategy is asked only through
 * its table of operations. */
#include "downpour/train.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "downpour/auc.h"
#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/clock.h"
#include "downpour/file.h"
#include "downpour/layer_kind.h"
#include "downpour/log.h"
#include "downpour/metrics.h"
#include "downpour/node.h"
#include "downpour/records.h"
#include "downpour/resource.h"
#include "downpour/sparse.h"
#include "downpour/strategy.h"
#include "downpour/tensorboard.h"
#include "downpour/testhooks.h"
#include "downpour/trace.h"
#include "train/drain.h"
#include "train/progress.h"

/* Evaluation runs in chunks this large even when the training batch is
 * small: fewer, larger GEMMs. */
#define EVAL_CHUNK 500

static const char *const lr_schedule_names[DP_LR_COUNT] = {
    [DP_LR_CONSTANT] = "constant", [DP_LR_COSINE] = "cosine", [DP_LR_STEP] = "step"};

int dp_lr_schedule_parse(const char *name, dp_lr_schedule *out, dp_err *err)
{
    for (int s = 0; s < DP_LR_COUNT; s++)
        if (strcmp(name, lr_schedule_names[s]) == 0) {
            *out = (dp_lr_schedule)s;
            return 0;
        }
    return dp_errf(err, "unknown learning-rate schedule '%s' (valid: constant, cosine, step)",
                   name);
}

const char *dp_lr_schedule_name(dp_lr_schedule s)
{
    return (unsigned)s < DP_LR_COUNT ? lr_schedule_names[s] : "unknown";
}

float dp_lr_scale(const dp_lr_plan *p, long done, long total)
{
    double f = 1.0;
    if (done < p->warmup) /* the first step already moves: (0+1)/warmup, not 0 */
        f = (double)(done + 1) / (double)p->warmup;
    if (p->schedule == DP_LR_COSINE && total > p->warmup && done >= p->warmup) {
        double x = (double)(done - p->warmup) / (double)(total - p->warmup);
        f *= 0.5 * (1.0 + cos(M_PI * (x > 1 ? 1 : x)));
    } else if (p->schedule == DP_LR_STEP && p->step_every > 0) {
        f *= pow((double)p->gamma, (double)(done / p->step_every));
    }
    return (float)f;
}

int dp_global_batch_share(int global, int workers, int *batch, dp_err *err)
{
    if (workers < 1)
        workers = 1;
    if (global < 1)
        return dp_errf(err, "--global-batch %d: a step takes at least 1 record", global);
    if (global % workers != 0) {
        int lo = global / workers * workers, hi = lo + workers;
        return dp_errf(err, "--global-batch %d is not a multiple of the %d workers (%d / %d "
                            "leaves %d records over): each worker takes an equal share of a "
                            "step. Hint: --global-batch %d or %d, or a number of workers that "
                            "divides %d",
                       global, workers, global, workers, global % workers, lo > 0 ? lo : hi,
                       lo > 0 ? hi : hi + workers, global);
    }
    *batch = global / workers;
    return 0;
}

int dp_sum_chunk_check(int chunk, int batch, int global, int workers, dp_err *err)
{
    if (chunk <= 0)
        return 0;
    if (batch % chunk != 0)
        return dp_errf(err, "--sum-chunk %d does not divide a worker's %d records (--global-batch "
                            "%d over %d workers): each worker pushes whole chunks. Hint: a "
                            "--sum-chunk that divides --global-batch / workers for every number "
                            "of workers the run may have", chunk, batch, global, workers);
    if (batch / chunk > DP_PS_MAX_CHUNKS)
        return dp_errf(err, "--sum-chunk %d cuts a worker's %d records into %d chunks, at most "
                            "%d a push. Hint: --sum-chunk %d or more", chunk, batch,
                       batch / chunk, DP_PS_MAX_CHUNKS,
                       (batch + DP_PS_MAX_CHUNKS - 1) / DP_PS_MAX_CHUNKS);
    return 0;
}

dp_train_config dp_train_defaults(void)
{
    dp_train_config c;
    memset(&c, 0, sizeof c);
    c.dataset = "mnist";
    dp_dataset_options_default(&c.data);
    c.model = "mlp-300-100";
    c.strategy = "single";
    c.shard = DP_SHARD_DATA;
    c.collective_timeout = 300;
    c.straggler = -1;
    c.batch = 128;
    c.epochs = 25;
    c.optim = dp_optim_defaults(DP_OPTIM_ADAM);
    c.seed = 1;
    c.n_train = 54000;
    c.n_val = 6000;
    c.log_every = 100;
    c.keep_checkpoints = 3;
    c.lr_gamma = 0.1f; /* torch's StepLR */
    return c;
}

double dp_evaluate(dp_model *m, const float *params, const dp_split *s, float *x, uint8_t *y,
                   double *mean_loss, long *bad_inputs)
{
    return dp_evaluate_auc(m, params, s, x, y, mean_loss, bad_inputs, NULL);
}

/* Before each chunk's forward: the batch the model reads (the compact
 * tables' slots: docs/strategies.md, "Tables larger than a worker"); NULL
 * with err on failure. */
typedef const float *(*eval_prep_fn)(void *ctx, const float *x, int n, dp_err *err);

static double evaluate(dp_model *m, const float *params, const dp_split *s, float *x,
                       uint8_t *y, double *mean_loss, long *bad_inputs, double *auc,
                       eval_prep_fn prep, void *ctx, dp_err *err);

double dp_evaluate_auc(dp_model *m, const float *params, const dp_split *s, float *x,
                       uint8_t *y, double *mean_loss, long *bad_inputs, double *auc)
{
    return evaluate(m, params, s, x, y, mean_loss, bad_inputs, auc, NULL, NULL, NULL);
}

/* NAN only when prep failed (err says why). */
static double evaluate(dp_model *m, const float *params, const dp_split *s, float *x,
                       uint8_t *y, double *mean_loss, long *bad_inputs, double *auc,
                       eval_prep_fn prep, void *ctx, dp_err *err)
{
    /* a binary model's probabilities and labels, for the AUC (not a step:
     * evaluation may allocate) */
    dp_auc_pair *pairs = NULL;
    if (auc) {
        *auc = NAN;
        if (dp_model_binary(m) && s->n > 0)
            pairs = malloc((size_t)s->n * sizeof *pairs);
    }
    long correct = 0, bad = 0;
    double loss_sum = 0;
    uint32_t idx[EVAL_CHUNK];
    int chunk = m->max_batch < EVAL_CHUNK ? m->max_batch : EVAL_CHUNK;
    for (uint32_t lo = 0; lo < s->n; lo += (uint32_t)chunk) {
        int n = (int)(s->n - lo < (uint32_t)chunk ? s->n - lo : (uint32_t)chunk);
        for (int i = 0; i < n; i++)
            idx[i] = lo + (uint32_t)i;
        dp_split_gather(x, y, s, idx, n);
        const float *in = prep ? prep(ctx, x, n, err) : x;
        if (!in) {
            free(pairs);
            return NAN;
        }
        int c = 0;
        loss_sum += (double)dp_model_forward(m, params, in, y, n, &c) * n;
        correct += c;
        bad += dp_model_bad_inputs(m, n);
        if (pairs) {
            const float *p = dp_model_act(m, 0, m->n_layers);
            for (int i = 0; i < n; i++)
                pairs[lo + (uint32_t)i] = (dp_auc_pair){p[i], y[i] != 0};
        }
    }
    if (pairs) {
        *auc = dp_auc(pairs, s->n);
        free(pairs);
    }
    if (mean_loss)
        *mean_loss = s->n ? loss_sum / s->n : 0;
    if (bad_inputs)
        *bad_inputs = bad;
    return s->n ? (double)correct / s->n : 0;
}

void dp_warn_bad_inputs(const dp_model *m, long count, const char *what)
{
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer_ops *o = dp_layer_ops_of(&m->layers[l]);
        if (o->bad_inputs) {
            dp_warn("layer %d of %s (%s) had to change %ld of its inputs over %s: %s "
                    "(docs/models.md, \"emb\"); check the data's ids against the model",
                    l, m->name, o->name, count, what, o->bad_inputs_what);
            return;
        }
    }
}

/* ------------------------------------------------------------ one task's run */

typedef struct loop {
    const dp_train_config *cfg;
    const dp_strategy_ops *ops;
    dp_strategy *s;
    dp_task_info info;
    dp_run_env env;
    dp_metrics *metrics;
    dp_tensorboard *tb; /* --tensorboard: mirrors the metrics events */
    dp_node node;
    int in_cluster;
    int compact_eval;      /* the evaluator's model holds its tables compact: each
                              evaluation chunk pulls its rows (ops->eval_rows) */
    int trainers;          /* --global-batch: the trainers it is shared among */
    int warned_bad_inputs; /* the warning of bad inputs (emb's ids) given: once a run */
    uint32_t bag_rows[DP_MAX_LAYERS]; /* the embedding bags' rows: named columns' id limits */
    int bag_places[DP_MAX_LAYERS];
    int no_val;            /* no validation figures (--val-size 0, an external model
                              without evaluate): "-" in the table */
    dp_dataset ds;
    dp_split train, val;
    dp_model m;
    float *x;
    uint8_t *y;
    dp_run_identity id;
    dp_train_state ck;     /* the evaluator's state: what a checkpoint holds,
                              with the live --ema, --keep-best and history */
    dp_train_state resume; /* the checkpoint this run goes on from */
    char resume_path[4096]; /* and its file */
    dp_checkpoint_source ckpts; /* env.checkpoints: how a strategy reads the run's newest */
    /* --keep-best on rows (compact_eval): ck.best holds the best weights'
     * dense part, and their tables' rows lie in a file kept open: the best
     * epoch's weights written when it was best (best_own), or the
     * checkpoint resumed from ('best'); part 0 or DP_CKPT_PART_BEST of it */
    dp_train_state best_own;
    const dp_train_state *best_src;
    int best_part;
    int save_best;         /* write_file: the tables' rows (part 0) from best_src */
    size_t rows_at[DP_SPARSE_MAX]; /* write_file: where each table's read from best_src is */
    uint32_t *best_ids;    /* an evaluation chunk's rows of each table, and the */
    float *best_x;         /* chunk with its ids as slots, on the best weights */
    long spe, total_steps;
    dp_lr_plan lr; /* the schedule in steps, once spe is known */
    dp_train_result *res;
} loop;

/* The model a checkpoint file of this run is read through: its own (one
 * with compact tables reads the dense parts, and the rows by rows:
 * dp_checkpoint_read_rows). */
static const dp_model *file_model(const loop *L)
{
    return &L->m;
}

/* env.checkpoints: the strategy's way to this run's newest checkpoint (the
 * ps family restores a restarted ps task from it), read here, so no
 * strategy calls into src/train. */
static int newest_checkpoint(void *ctx, dp_train_state *st, char *path, size_t cap, dp_err *err)
{
    const loop *L = ctx;
    return dp_checkpoint_find_newest(L->cfg->checkpoint_dir, file_model(L), &L->id, st, path,
                                     cap, err);
}

static void release_checkpoint(void *ctx, dp_train_state *st)
{
    (void)ctx;
    dp_train_state_free(st);
}

static int open_data(loop *L, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    /* A streamed dataset's labels are checked as they are read: against the
     * model's outputs, the most classes it can learn. */
    dp_dataset_options o = cfg->data;
    int outputs = dp_model_classes(&L->m);
    if (o.data.classes == 0 && outputs >= 2 && outputs <= 256)
        o.data.classes = (uint32_t)outputs;
    /* named categorical columns: their ids checked against the bags' tables */
    if (o.data.categorical && !L->m.external) {
        int bags = dp_model_bags(&L->m, L->bag_rows, L->bag_places, DP_MAX_LAYERS);
        if (dp_data_check_bags(&o.data, L->bag_rows, L->bag_places, bags, L->bag_rows, err) < 0)
            return -1;
        o.data.id_limits = L->bag_rows;
        o.data.n_id_limits = (size_t)bags;
    }
    if (dp_dataset_open_with(&L->ds, cfg->dataset, &o, err) < 0)
        return -1;
    if (!L->ds.is_files && cfg->data.stream == 1)
        return dp_errf(err, "--stream on: dataset %s is IDX files, always read through the "
                            "decoded cache; streaming is for TFRecord, NumPy and CSV files "
                            "(docs/datasets.md)", cfg->dataset);
    if (dp_dataset_split(&L->ds, cfg->n_train, cfg->n_val, &L->train, &L->val, err) < 0)
        return -1;
    if (dp_model_check_input(&L->m, L->ds.rows, L->ds.cols, L->ds.channels, cfg->dataset, err) < 0)
        return -1;
    if ((uint32_t)dp_model_classes(&L->m) < L->ds.classes)
        return dp_errf(err, "model %s has %d outputs but dataset %s has %u classes", L->m.name,
                       dp_model_classes(&L->m), cfg->dataset, L->ds.classes);
    L->x = malloc((size_t)L->m.max_batch * L->train.dim * sizeof *L->x);
    L->y = malloc((size_t)L->m.max_batch);
    if (!L->x || !L->y)
        return dp_errf(err, "out of memory for a batch of %d records", L->m.max_batch);
    return 0;
}

static int checkpoint_due(const loop *L, long step)
{
    if (!L->cfg->checkpoint_dir)
        return 0;
    long every = L->cfg->checkpoint_every;
    return step == L->total_steps || (every > 0 && step % every == 0);
}

/* The weights the evaluator reports: the moving average where the loop
 * keeps it, else what the strategy hands out. */
static const float *eval_params(loop *L, dp_err *err)
{
    if (L->ck.ema && L->info.live_params)
        return L->ck.ema;
    return L->ops->params(L->s, L->cfg->ema > 0 ? DP_WEIGHTS_AVERAGE : DP_WEIGHTS_LIVE, err);
}

/* An external model's figures come from its caller's evaluate (external.h),
 * on its own records; without one there are none (val_size 0's line). */
static int external_eval(loop *L, const float *params, int test, double *acc, double *loss,
                         dp_err *err)
{
    const dp_external_model *e = L->m.external;
    *acc = 0;
    if (loss)
        *loss = 0;
    if (!e->evaluate)
        return 0;
    double l = 0;
    *acc = e->evaluate(e->ctx, params, test, &l);
    if (!(*acc >= 0))
        return dp_errf(err, "%s: its evaluation failed", L->m.name);
    if (loss)
        *loss = l;
    return 1;
}

static const float *best_prep(void *ctx, const float *x, int n, dp_err *err);

static const float *eval_prep(void *ctx, const float *x, int n, dp_err *err)
{
    loop *L = ctx;
    return L->ops->eval_rows(L->s, x, n, err);
}

/* The evaluator's figures over a split, through the strategy's rows when
 * its tables are compact; NAN with err when they could not be pulled. */
static double eval_split(loop *L, const float *params, const dp_split *s, double *loss,
                         long *bad, double *auc, dp_err *err)
{
    /* --keep-best on rows: the best weights' rows from their file */
    int best = L->compact_eval && L->ck.best && params == L->ck.best;
    return evaluate(&L->m, params, s, L->x, L->y, loss, bad, auc,
                    best ? best_prep : L->compact_eval ? eval_prep : NULL, L, err);
}

static int write_file(loop *L, const char *path, const dp_train_state *st, dp_err *err);

/* --keep-best on rows: a new best epoch's weights into a file of their own
 * (the tables streamed from the shards, as --save writes them), kept open
 * for their rows and unlinked at once (so nothing is left behind), in the
 * checkpoint directory, else --save's, else $TMPDIR (docs/checkpoints.md,
 * "Reading in pieces"). */
static int write_best(loop *L, const float *params, long step, dp_err *err)
{
    const char *dir = L->cfg->checkpoint_dir, *save = L->cfg->save_path, *slash = NULL;
    char base[4096], path[4200];
    if (!dir && save && (slash = strrchr(save, '/')))
        snprintf(base, sizeof base, "%.*s", (int)(slash - save + 1 > 1 ? slash - save : 1), save);
    else
        snprintf(base, sizeof base, "%s",
                 dir ? dir : save ? "." : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(path, sizeof path, "%s/.best-%ld.safetensors", base, (long)getpid());
    dp_train_state w = {.n_params = L->m.n_params, .params = (float *)params, .step = step,
                        .best_accuracy = -1};
    dp_train_state opened;
    int save_best = L->save_best;
    L->save_best = 0; /* the rows from the shards: the weights evaluated */
    int rc = write_file(L, path, &w, err);
    L->save_best = save_best;
    if (rc == 0)
        rc = dp_checkpoint_open_rows(path, &L->m, &opened, err);
    unlink(path);
    if (rc < 0)
        return dp_err_prefix(err, "--keep-best: the best weights");
    dp_train_state_free(&L->best_own);
    L->best_own = opened;
    L->best_src = &L->best_own;
    L->best_part = 0;
    return 0;
}

/* --keep-best on rows: an evaluation chunk's rows of the best weights, read
 * from their file into the slots of ck.best, and the chunk with its ids as
 * slots (as the strategy's eval_rows does from the shards). */
static const float *best_prep(void *ctx, const float *x, int n, dp_err *err)
{
    loop *L = ctx;
    dp_sparse_table t[DP_SPARSE_MAX];
    int nt = dp_model_sparse_tables(&L->m, t, DP_SPARSE_MAX);
    long most = 0; /* the most ids a chunk names of one table */
    for (int k = 0; k < nt; k++) {
        long ids = (long)L->m.max_batch * t[k].per_record;
        most = ids > most ? ids : most;
    }
    size_t in = (size_t)dp_model_inputs(&L->m);
    if (n > L->m.max_batch) {
        dp_errf(err, "an evaluation chunk of %d records; the model holds %d", n, L->m.max_batch);
        return NULL;
    }
    if ((!L->best_ids && !(L->best_ids = malloc((size_t)(most ? most : 1) * sizeof(uint32_t)))) ||
        (!L->best_x && !(L->best_x = malloc((size_t)L->m.max_batch * in * sizeof(float))))) {
        dp_errf(err, "out of memory");
        return NULL;
    }
    memcpy(L->best_x, x, (size_t)n * in * sizeof(float));
    for (int k = 0; k < nt; k++) {
        long c = n > 0 ? dp_model_sparse_rows(&L->m, &t[k], x, n, L->best_ids) : 0;
        if (c > t[k].slots) {
            dp_errf(err, "an evaluation chunk touches %ld rows of sparse table %d, which holds "
                         "%ld slots", c, k, t[k].slots);
            return NULL;
        }
        /* the chunk's ids are sorted: runs of near ones, one read each */
        if (dp_checkpoint_read_ids(L->best_src, k, L->best_part, L->best_ids, (size_t)c,
                                   L->ck.best + t[k].local_off, err) < 0)
            return NULL;
        dp_model_sparse_slots(&L->m, &t[k], L->best_x, n, L->best_ids, c);
    }
    return L->best_x;
}

/* The evaluator after epoch `epoch`: validation, the epoch line and event,
 * --keep-best, the history table.  A trainer on standby (info.standby)
 * does the same silently: no line, no event, only the state it would need
 * should it take the evaluator's part over. */
static int evaluate_epoch(loop *L, int epoch, const dp_epoch_stats *st, double secs, long step,
                          dp_err *err)
{
    double t_eval = dp_now();
    const float *params = eval_params(L, err);
    if (!params)
        return -1;
    long bad = 0;
    double val_loss, val_acc, val_auc = NAN;
    int validated = 1;
    if (L->m.external) {
        if ((validated = external_eval(L, params, 0, &val_acc, &val_loss, err)) < 0)
            return -1;
    } else {
        val_acc = eval_split(L, params, &L->val, &val_loss, &bad, &val_auc, err);
        if (isnan(val_acc))
            return -1;
        validated = L->val.n > 0;
    }
    L->no_val = !validated;
    int quiet = !L->info.evaluator;
    dp_trace_span("evaluation", "eval", t_eval, dp_now(), epoch);
    if (bad > 0 && !L->warned_bad_inputs && !quiet) { /* once a run: the same data every epoch */
        dp_warn_bad_inputs(&L->m, bad, "the validation set");
        L->warned_bad_inputs = 1;
    }
    double train_loss = st->records > 0 ? st->loss_sum / st->records : 0;
    if (L->ck.best && val_acc > L->ck.best_accuracy) {
        /* on rows the tables are in the shards: their rows go to a file */
        if (L->compact_eval && !quiet && write_best(L, params, step, err) < 0)
            return -1;
        memcpy(L->ck.best, params, L->m.n_params * sizeof(float));
        L->ck.best_accuracy = val_acc;
        L->ck.best_epoch = epoch;
    }
    if (epoch >= 1 && epoch <= L->ck.max_history) {
        float *h = L->ck.history + (size_t)(epoch - 1) * 3;
        h[0] = (float)val_acc;
        h[1] = (float)train_loss;
        h[2] = (float)secs;
        if (epoch > L->ck.n_history)
            L->ck.n_history = epoch;
    }
    if (quiet)
        return 0;
    L->res->val_accuracy = val_acc;
    L->res->train_loss = train_loss;
    /* the rate of the epoch's last step */
    double lr = L->cfg->optim.lr * dp_lr_scale(&L->lr, step > 0 ? step - 1 : 0, L->total_steps);
    /* no validation: null in the file (a non-finite number), not a false 0 */
    if (!L->m.external && dp_model_binary(&L->m)) /* bce: its AUC and log loss too */
        dp_metrics_event(L->metrics, "epoch", DP_F_INT, "epoch", (long)epoch, DP_F_NUM,
                         "val_accuracy", validated ? val_acc : NAN, DP_F_NUM, "val_loss",
                         validated ? val_loss : NAN, DP_F_NUM, "val_auc", val_auc, DP_F_NUM,
                         "val_log_loss", validated ? val_loss : NAN, DP_F_NUM, "train_loss",
                         train_loss, DP_F_NUM, "seconds", secs, DP_F_INT, "step", step,
                         DP_F_NUM, "lr", lr, DP_F_END);
    else
        dp_metrics_event(L->metrics, "epoch", DP_F_INT, "epoch", (long)epoch, DP_F_NUM,
                         "val_accuracy", validated ? val_acc : NAN, DP_F_NUM, "val_loss",
                         validated ? val_loss : NAN, DP_F_NUM, "train_loss", train_loss,
                         DP_F_NUM, "seconds", secs, DP_F_INT, "step", step, DP_F_NUM, "lr", lr,
                         DP_F_END);
    /* after the event: whoever reads the line (a test, a user's script) can
     * count on the event being in the file, even if the process dies next */
    if (!validated) /* --val-size 0: no figure rather than a false 0 */
        dp_info("Epoch %d/%d: train_loss %.4f, no validation (%s), %.2f s", epoch,
                L->cfg->epochs, train_loss,
                L->m.external ? "the external model has no evaluate" : "--val-size 0", secs);
    else if (!L->m.external && dp_model_binary(&L->m))
        dp_info("Epoch %d/%d: train_loss %.4f, val_log_loss %.4f, val_auc %.4f, val_accuracy "
                "%.4f, %.2f s",
                epoch, L->cfg->epochs, train_loss, val_loss, val_auc, val_acc, secs);
    else
        dp_info("Epoch %d/%d: train_loss %.4f, val_loss %.4f, val_accuracy %.4f, %.2f s", epoch,
                L->cfg->epochs, train_loss, val_loss, val_acc, secs);
    return 0;
}

/* A checkpoint that cannot be written (a full disk) costs that checkpoint,
 * not the run: the write left the older ones as they were and no temporary
 * behind, so training goes on, the next one is tried at its step, and the
 * run ends with DP_EXIT_CHECKPOINTS_MISSED (docs/checkpoints.md, "A
 * checkpoint that cannot be written"). */
/* --save of a chief on rows, and its checkpoints: part `part` of table k's
 * next n floats (dp_ckpt_rows_fn). */
static int save_rows(void *ctx, int part, int k, float *buf, size_t n, dp_err *err)
{
    loop *L = ctx;
    if (part == DP_CKPT_PART_BEST || (part == 0 && L->save_best)) {
        /* the best weights' rows, read on from the file that holds them */
        dp_sparse_table t[DP_SPARSE_MAX];
        int nt = dp_model_sparse_tables(&L->m, t, DP_SPARSE_MAX);
        if (!L->best_src || k < 0 || k >= nt)
            return dp_errf(err, "no best weights' rows of sparse table %d", k);
        if (dp_checkpoint_read_table(L->best_src, k, L->best_part, L->rows_at[k], n, buf,
                                     err) < 0)
            return -1;
        L->rows_at[k] += n;
        if (L->rows_at[k] >= (size_t)t[k].rows * (size_t)t[k].width)
            L->rows_at[k] = 0; /* the next part reads the table from its first row */
        return 0;
    }
    return L->ops->table_rows(L->s, part, k, buf, n, err);
}

/* st to path: a chief on rows streams its tables from the servers into the
 * file (docs/strategies.md, "The chief on rows"). */
static int write_file(loop *L, const char *path, const dp_train_state *st, dp_err *err)
{
    if (!L->compact_eval)
        return dp_checkpoint_write(path, &L->m, st, &L->id, err);
    memset(L->rows_at, 0, sizeof L->rows_at);
    dp_err end;
    int rc = dp_checkpoint_write_rows(path, &L->m, st, &L->id, save_rows, L, err);
    if (L->ops->table_rows(L->s, 0, -1, NULL, 0, &end) < 0 && rc == 0) {
        *err = end;
        rc = -1;
    }
    return rc;
}

static void write_checkpoint(loop *L, long step)
{
    char path[4096];
    dp_err why;
    L->ck.step = step;
    dp_checkpoint_path(path, sizeof path, L->cfg->checkpoint_dir, step);
    if (write_file(L, path, &L->ck, &why) < 0) {
        L->res->checkpoints_missed++;
        dp_warn("fault: checkpoint of step %ld not written: %s; the run goes on, and the "
                "older checkpoints are kept", step, why.msg);
        dp_metrics_event(L->metrics, "fault", DP_F_STR, "task",
                         L->in_cluster ? L->node.self->name : "worker:0", DP_F_STR, "what",
                         "checkpoint not written", DP_F_STR, "action", "continue", DP_F_INT,
                         "step", step, DP_F_STR, "path", path, DP_F_STR, "error", why.msg,
                         DP_F_END);
        return;
    }
    dp_checkpoint_prune(L->cfg->checkpoint_dir, L->cfg->keep_checkpoints);
    dp_info("Checkpoint %s (step %ld, epoch %ld)", path, step, step / L->spe);
    dp_metrics_event(L->metrics, "checkpoint", DP_F_INT, "step", step, DP_F_STR, "path", path,
                     DP_F_END);
}

/* A trainer at a checkpoint step: every holder of state hands it in; the
 * one the strategy names writes. */
static int trainer_checkpoint(loop *L, long step, dp_err *err)
{
    double t0 = dp_now();
    int rc = L->ops->save(L->s, step, &L->ck, err);
    if (rc > 0)
        write_checkpoint(L, step);
    dp_trace_span("checkpoint", "checkpoint", t0, dp_now(), -1);
    return rc < 0 ? rc : 0;
}

/* The per-epoch table people compare with the source experiment's. */
static void print_table(const loop *L)
{
    if (L->ck.n_history == 0)
        return;
    dp_info("%6s %13s %11s %9s", "epoch", "val_accuracy", "train_loss", "seconds");
    for (int e = 0; e < L->ck.n_history; e++) {
        const float *h = L->ck.history + (size_t)e * 3;
        if (L->no_val)
            dp_info("%6d %13s %11.4f %9.2f", e + 1, "-", (double)h[1], (double)h[2]);
        else
            dp_info("%6d %13.4f %11.4f %9.2f", e + 1, (double)h[0], (double)h[1], (double)h[2]);
    }
}

/* The evaluator at the end: test accuracy, the table, the done event, --save. */
static int report_and_save(loop *L, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    dp_train_result *res = L->res;
    const float *params = eval_params(L, err);
    if (!params)
        return -1;
    if (L->ck.best && L->ck.best_epoch > 0) {
        params = L->ck.best;
        dp_info("Restored the weights of epoch %d (val_accuracy %.4f), the best of %d",
                L->ck.best_epoch, L->ck.best_accuracy, cfg->epochs);
    }
    long trained = L->total_steps - L->resume.step;
    /* an external model's records are its caller's: the nominal batches */
    double records = L->m.external ? (double)cfg->batch * L->spe * L->info.replicas
                                   : (double)L->train.n;
    res->samples_per_second =
        res->train_seconds > 0
            ? records * cfg->epochs * ((double)trained / (double)L->total_steps) /
                  res->train_seconds
            : 0;
    dp_split test = L->ds.test;
    if (cfg->n_test > 0 && cfg->n_test < test.n)
        test.n = cfg->n_test; /* --test-size: the first N */
    long bad = 0;
    double t_test = dp_now();
    res->test_loss = res->test_auc = NAN;
    if (L->m.external) {
        if (external_eval(L, params, 1, &res->test_accuracy, NULL, err) < 0)
            return -1;
    } else {
        res->test_accuracy = eval_split(L, params, &test, &res->test_loss, &bad,
                                        &res->test_auc, err);
        if (isnan(res->test_accuracy))
            return -1;
    }
    int binary = !L->m.external && dp_model_binary(&L->m);
    dp_trace_span("test evaluation", "eval", t_test, dp_now(), -1);
    if (bad > 0 && !L->warned_bad_inputs)
        dp_warn_bad_inputs(&L->m, bad, "the test set");
    print_table(L);
    if (binary)
        dp_info("Test log loss: %.4f, AUC: %.4f, accuracy: %.4f", res->test_loss,
                res->test_auc, res->test_accuracy);
    dp_info("Test accuracy: %.4f, training time: %.2f s (%.0f samples/s)", res->test_accuracy,
            res->train_seconds, res->samples_per_second);
    dp_metrics_event(L->metrics, "done", DP_F_NUM, "test_accuracy", res->test_accuracy, DP_F_NUM,
                     "train_seconds", res->train_seconds, DP_F_NUM, "samples_per_second",
                     res->samples_per_second, DP_F_STR, "strategy", cfg->strategy, DP_F_STR,
                     "model", L->m.name, DP_F_STR, "dataset", cfg->dataset, DP_F_INT, "batch",
                     (long)cfg->batch, DP_F_INT, "global_batch",
                     (long)cfg->batch * L->info.replicas, DP_F_INT, "epochs", (long)cfg->epochs,
                     DP_F_STR, "optimizer", dp_optim_kind_name(cfg->optim.kind), DP_F_NUM, "lr",
                     (double)cfg->optim.lr, DP_F_STR, "lr_schedule",
                     dp_lr_schedule_name(cfg->lr_schedule), DP_F_INT, "seed", (long)cfg->seed,
                     DP_F_INT, "workers", (long)L->info.replicas, DP_F_INT, "ps", (long)L->id.ps,
                     DP_F_INT, "resumed_from", L->resume.step, DP_F_INT, "test_records",
                     (long)test.n, DP_F_INT, "checkpoints_missed", (long)res->checkpoints_missed,
                     /* a binary model's two more; else the list ends here */
                     binary ? DP_F_NUM : DP_F_END, "test_auc", res->test_auc, DP_F_NUM,
                     "test_log_loss", res->test_loss, DP_F_END);
    if (!cfg->save_path)
        return 0;
    if (L->m.external) { /* the caller's own format (external.h) */
        const dp_external_model *e = L->m.external;
        if (e->save(e->ctx, params, L->m.buffers, cfg->save_path) < 0)
            return dp_errf(err, "--save %s: the external model's save failed",
                           cfg->save_path);
        dp_info("Saved %s", cfg->save_path);
        return 0;
    }
    dp_train_state weights = {.n_params = L->m.n_params, .params = (float *)params,
                              .step = L->total_steps, .best_accuracy = -1};
    L->save_best = L->compact_eval && params == L->ck.best; /* the rows from the best file */
    int rc = write_file(L, cfg->save_path, &weights, err);
    L->save_best = 0;
    if (rc < 0)
        return -1;
    dp_info("Saved %s", cfg->save_path);
    return 0;
}

/* What the evaluator keeps across a restart: --keep-best and the history. */
static void take_evaluator_state(loop *L, const dp_train_state *r)
{
    if (L->ck.best && r->best) {
        memcpy(L->ck.best, r->best, L->m.n_params * sizeof(float));
        L->ck.best_accuracy = r->best_accuracy;
        L->ck.best_epoch = r->best_epoch;
        if (L->compact_eval) { /* the dense part; the rows stay in the file, read by rows */
            L->best_src = r;
            L->best_part = DP_CKPT_PART_BEST;
        }
    }
    if (r->n_history > 0) {
        L->ck.n_history = r->n_history < L->ck.max_history ? r->n_history : L->ck.max_history;
        memcpy(L->ck.history, r->history, (size_t)L->ck.n_history * 3 * sizeof(float));
    }
}

/* A coordinator restarted into a running job takes the evaluator's part of
 * the newest checkpoint (the history, --keep-best) and tells the strategy
 * its step (docs/faults.md, "A lost chief"). */
static int reattach(loop *L, dp_err *err)
{
    L->ck.step = 0;
    if (!L->cfg->checkpoint_dir)
        return 0;
    char path[4096];
    dp_train_state r;
    memset(&r, 0, sizeof r);
    int found = dp_checkpoint_find_newest(L->cfg->checkpoint_dir, file_model(L), &L->id, &r,
                                          path, sizeof path, err);
    if (found < 0)
        return -1;
    if (found > 0) {
        take_evaluator_state(L, &r);
        L->ck.step = r.step;
        /* the strategy's scalars, for what it keeps across a chief's
         * restart (the ps family's --compress auto choices) */
        free(L->ck.scalars);
        L->ck.scalars = r.scalars;
        r.scalars = NULL;
        dp_info("Chief: the evaluation history so far from %s (step %ld)", path, r.step);
        if (L->best_src == &r) { /* on rows: the best rows' file stays open, kept here */
            dp_train_state_free(&L->best_own);
            L->best_own = r;
            L->best_src = &L->best_own;
            memset(&r, 0, sizeof r);
        }
    }
    dp_train_state_free(&r);
    return 0;
}

/* A COORDINATOR: does what the strategy says, until the trainers are done. */
static int coordinate(loop *L, dp_err *err)
{
    double t_start = dp_now(), t_last = t_start;
    for (;;) {
        dp_coord_event ev;
        if (L->ops->next(L->s, &ev, &L->ck, err) < 0)
            return -1;
        if (ev.kind == DP_COORD_DONE) {
            L->res->steps = ev.step;
            break;
        }
        if (ev.kind == DP_COORD_ATTACH) {
            if (reattach(L, err) < 0)
                return -1;
            continue;
        }
        if (ev.kind == DP_COORD_EPOCH) {
            double now = dp_now();
            if (evaluate_epoch(L, ev.epoch, &ev.stats, now - t_last, ev.step, err) < 0)
                return -1;
            t_last = now;
        } else {
            write_checkpoint(L, ev.step);
        }
    }
    L->res->train_seconds = dp_now() - t_start;
    return report_and_save(L, err);
}

/* Before an epoch: the shard the strategy deals this trainer now.  When the
 * live trainers changed, the records are split among those there are and
 * each step takes a bigger (or smaller) bite, so an epoch keeps its number
 * of steps (and the step count its meaning) and still covers the split once
 * (docs/faults.md). */
static int redeal(loop *L, dp_batcher *b, int epoch, int *index, int *count, int *batch,
                  dp_err *err)
{
    int i = *index, c = *count;
    if (L->ops->deal(L->s, epoch, &i, &c, err) < 0)
        return -1;
    if (i == *index && c == *count)
        return 0;
    if (c < 1 || i < 0 || i >= c)
        return dp_errf(err, "the strategy dealt shard %d of %d", i, c);
    const dp_augment *aug = b->augment; /* the draws stay the record's */
    dp_batcher_free(b);
    if (dp_batcher_init(b, &L->train, L->cfg->seed, 1, L->cfg->shard, i, c, err) < 0 ||
        dp_batcher_augment(b, aug, err) < 0)
        return -1;
    *batch = dp_redeal_batch(L->cfg->batch, L->info.shard_count, c, L->cfg->n_train, L->spe,
                             L->m.max_batch);
    if (*batch == L->m.max_batch && c < L->info.shard_count &&
        (long)*batch * L->spe < ((long)L->cfg->n_train + c - 1) / c)
        dp_warn("%s: shard %d of %d takes more than the %d records a step the model holds, so "
                "some records wait for the next epoch", L->info.label, i, c, L->m.max_batch);
    dp_info("%s: from epoch %d, shard %d of %d, %d records a step (%s)", L->info.label,
            epoch + 1, i, c, *batch,
            c < *count ? "a worker was lost or drained" : "a worker joined or is back");
    *index = i;
    *count = c;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Bytes this task's transport has moved, 0 alone. */
static void comm_bytes(const loop *L, uint64_t *tx, uint64_t *rx)
{
    dp_transport_stats st = {0};
    if (L->in_cluster && L->node.transport)
        dp_transport_stats_get(L->node.transport, DP_PEER_ANY, &st);
    *tx = st.bytes_sent;
    *rx = st.bytes_recv;
}

/* The "steps" event after a trainer's epoch: its step-time distribution
 * and traffic, so a report can show stragglers and communication cost
 * (docs/metrics.md).  ms holds the epoch's n step times; sorted here. */
static void steps_event(loop *L, int epoch, long step, double *ms, double *cms, long n,
                        long records, double seconds, uint64_t tx, uint64_t rx)
{
    if (n == 0)
        return;
    /* Compute time per step (trace.h): under ps-sync and all-reduce every
     * task's step time is the slowest one's, so a straggler shows only here. */
    qsort(cms, (size_t)n, sizeof *cms, cmp_double);
    double csum = 0;
    for (long i = 0; i < n; i++)
        csum += cms[i];
    double cmedian = n % 2 ? cms[n / 2] : (cms[n / 2 - 1] + cms[n / 2]) / 2;
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += ms[i];
    double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    long p90 = (long)ceil(0.9 * (double)n) - 1;
    dp_metrics_event(L->metrics, "steps", DP_F_INT, "epoch", (long)epoch, DP_F_INT, "step", step,
                     DP_F_INT, "steps", n, DP_F_INT, "records", records, DP_F_NUM,
                     "step_ms_median", median, DP_F_NUM, "step_ms_p90", ms[p90 < 0 ? 0 : p90],
                     DP_F_NUM, "step_ms_max", ms[n - 1], DP_F_NUM, "step_ms_mean", sum / (double)n,
                     DP_F_NUM, "samples_per_second", seconds > 0 ? (double)records / seconds : 0,
                     DP_F_NUM, "train_seconds", seconds, DP_F_INT, "comm_tx_bytes", (long)tx,
                     DP_F_INT, "comm_rx_bytes", (long)rx, DP_F_NUM, "compute_ms_median",
                     cmedian, DP_F_NUM, "compute_ms_mean", csum / (double)n, DP_F_END);
}

/* The next batch, where the trainer's replica computes (into L->x and
 * L->y without one). */
static int next_batch(loop *L, dp_batcher *b, int batch, dp_err *err)
{
    if (L->info.no_batches)
        return 0;
    if (L->m.external && !L->info.replica)
        return dp_errf(err, "strategy %s has no replica for an external model", L->cfg->strategy);
    return dp_replica_next_batch(L->info.replica, b, L->x, L->y, batch, err);
}

/* Steps whose loss and correct count are tallied in the replica (deferred):
 * what was tallied since the last call joins the epoch's and the window's
 * figures.  This waits for the device, so it runs only where the figures
 * are read: a step line, the progress bar, the epoch's end. */
static int collect(loop *L, long step, dp_epoch_stats *st, double *window_loss,
                   long *window_correct, dp_err *err)
{
    double loss = 0;
    long correct = 0;
    if (dp_replica_collect(L->info.replica, &loss, &correct, err) < 0)
        return -1;
    if (!isfinite(loss))
        return dp_errf(err, "the loss became %g by step %ld: lower the learning rate (--lr)", loss,
                       step);
    st->loss_sum += loss;
    st->correct += (double)correct;
    *window_loss += loss;
    *window_correct += correct;
    return 0;
}

/* --augment on the trainer's batcher, with the dataset's image shape;
 * keyed on the run's seed, so every trainer gives a record the same draw
 * whatever its shard (docs/training.md, "Augmentation").  *aug must live
 * as long as the batcher. */
static int setup_augment(loop *L, dp_batcher *b, dp_augment *aug, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    *aug = cfg->augment;
    aug->seed = cfg->seed;
    if (!dp_augment_on(aug))
        return 0;
    const char *no = dp_replica_no_augment(L->info.replica);
    const char *why = no                   ? no
                      : L->info.no_batches ? "this strategy's trainers read their own records"
                                           : NULL;
    if (why)
        return dp_errf(err, "--augment: not with strategy %s%s: %s (docs/training.md)",
                       cfg->strategy, no ? " on a device" : "", why);
    if (dp_augment_check(aug, L->ds.rows, L->ds.cols, L->ds.channels, L->train.dim, err) < 0)
        return -1;
    return dp_batcher_augment(b, aug, err);
}

/* An external model (external.h) under what can train it: a data-parallel
 * strategy whose trainers hold a replica, on the CPU, without what needs
 * downpour's own layers or data. */
static int check_external(loop *L, int role_ps, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    static const char *const ok[] = {"single", "allreduce", "ps-async", "ps-sync",
                                     "ps-ssp", "ps-dssp", "model-avg"};
    int known = 0;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        known |= strcmp(cfg->strategy, ok[i]) == 0;
    const char *no = NULL, *why = NULL;
    if (!known) {
        no = "--strategy";
        why = "it trains under single, allreduce, ps-async, ps-sync, ps-ssp, ps-dssp and "
              "model-avg";
    } else if (cfg->save_path && !L->m.external->save) {
        no = "--save";
        why = "it has no save callback (external.h) to write its own format";
    } else if (dp_augment_on(&cfg->augment)) {
        /* --model-parallel and --sync-bn: the strategies' own checks refuse
         * a model without layers to split or batch norm to share */
        no = "--augment";
        why = "its layers and its data are its caller's";
    }
    if (no)
        return dp_errf(err, "%s%s%s: not for an external model (%s): %s (docs/python.md, "
                            "\"PyTorch\")",
                       no, known ? "" : " ", known ? "" : cfg->strategy, L->m.name, why);
    if (!role_ps && L->m.external->steps_per_epoch < 1)
        return dp_errf(err, "%s: steps_per_epoch %ld: a trainer needs at least 1 (the "
                            "DataLoader's len)", L->m.name, L->m.external->steps_per_epoch);
    return 0;
}

/* A TRAINER: walks its shard's batches from the resume position on. */
static int train(loop *L, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    const dp_task_info *info = &L->info;
    dp_batcher batcher;
    int rc = -1;
    /* an external model's caller deals its own records (its DataLoader) */
    int external = L->m.external != NULL;
    dp_shard_policy policy = info->shard_count > 1 && !external ? cfg->shard : DP_SHARD_OFF;
    /* Shard "off": every worker walks all records in its own order. */
    uint64_t seed = policy == DP_SHARD_OFF && info->shard_count > 1
                        ? cfg->seed + 1000003ULL * (uint64_t)info->shard_index
                        : cfg->seed;
    int index = policy == DP_SHARD_OFF ? 0 : info->shard_index;
    int count = policy == DP_SHARD_OFF ? 1 : info->shard_count;
    memset(&batcher, 0, sizeof batcher);
    if (!external && dp_batcher_init(&batcher, &L->train, seed, 1, policy, index, count, err) < 0)
        return -1;
    /* --sum-chunk: each worker a contiguous block of the step's records
     * (one worker's order is the epoch's already) */
    if (!external && cfg->sum_chunk > 0 && policy == DP_SHARD_DATA &&
        dp_batcher_blocks(&batcher, (uint32_t)cfg->batch, err) < 0) {
        dp_batcher_free(&batcher);
        return -1;
    }
    dp_augment aug;
    if (setup_augment(L, &batcher, &aug, err) < 0) {
        dp_batcher_free(&batcher);
        return -1;
    }

    /* Test hooks, read once (testhooks.h; docs/faults.md, "Test hooks"):
     * SIGKILL this task right after step N, as a crash or the OOM killer
     * would (the resume tests), and pace a cluster's tasks with a sleep a
     * step, so a run lasts long enough to strike in without taking CPU
     * from the tests beside it. */
    long kill_at = dp_hook_kill_at_step();
    double pace_ms = dp_hook_step_ms();
    /* SIGTERM drains a worker whose strategy can let it go (docs/faults.md,
     * "Draining"): it finishes the step it is in, then leaves in order.
     * Never the evaluator, whose are the run's results, unless another
     * takes them over (standby: allreduce's leader, chief or worker). */
    dp_role role = L->in_cluster ? L->node.self->role : DP_ROLE_WORKER;
    int drains = L->in_cluster && L->ops->leave &&
                 (info->standby ? role == DP_ROLE_WORKER || role == DP_ROLE_CHIEF
                                : !info->evaluator && role == DP_ROLE_WORKER);
    if (drains)
        dp_drain_arm();
    long step = info->start_step >= 0 ? info->start_step : L->resume.step;
    int first_epoch = (int)(step / L->spe);
    long first_k = step % L->spe;
    double t_start = dp_now(), window_loss = 0, window_time = 0;
    long window_correct = 0, window_samples = 0, window_steps = 0;
    dp_step_out out = {0};
    int deferred = 0; /* a step's loss was tallied in the replica (collect) */
    int batch = cfg->batch;
    /* the epoch's step times, for the "steps" event */
    double *step_ms = malloc((size_t)L->spe * 2 * sizeof *step_ms);
    double *compute_ms = step_ms ? step_ms + L->spe : NULL;
    if (!step_ms) {
        dp_errf(err, "out of memory (step times of %ld steps)", L->spe);
        goto out;
    }
    for (int epoch = first_epoch; epoch < cfg->epochs; epoch++) {
        double t_epoch = dp_now();
        dp_epoch_stats st = {0};
        long timed = 0;
        uint64_t tx0, rx0;
        comm_bytes(L, &tx0, &rx0);
        if (L->ops->deal && policy != DP_SHARD_OFF &&
            redeal(L, &batcher, epoch, &index, &count, &batch, err) < 0)
            goto out;
        long k = epoch == first_epoch ? first_k : 0;
        if (!external) {
            dp_batcher_start_epoch(&batcher, epoch);
            dp_batcher_seek(&batcher, (uint32_t)(k * batch));
        }
        /* an external model's loader is walked to the resume position: its
         * batches of the steps already taken, fetched and left */
        for (long skip = 0; external && skip < k; skip++)
            if (next_batch(L, &batcher, batch, err) < 0)
                goto out;
        for (; k < L->spe; k++) {
            double t0 = dp_now(), c0 = dp_trace_thread_compute();
            int n = next_batch(L, &batcher, batch, err);
            double t_batch = dp_now();
            dp_trace_span("batch", "data", t0, t_batch, -1);
            float lr = cfg->optim.lr * dp_lr_scale(&L->lr, step, L->total_steps);
            out.deferred = 0;
            if (n < 0 || L->ops->step(L->s, L->x, L->y, n, lr, step + 1, &out, err) < 0)
                goto out;
            dp_trace_span("step", "step", t_batch, dp_now(), (int)(step + 1));
            step++;
            if (step == kill_at)
                raise(SIGKILL);
            if (drains && dp_drain_asked()) {
                if (L->ops->leave(L->s, step, err) < 0) {
                    /* said now: once this task closes its links, its peers
                     * stop and a launcher may end it before its exit's
                     * message */
                    dp_warn("%s: %s", info->label, err->msg);
                    goto out;
                }
                dp_info("%s: SIGTERM: drained after step %ld; it leaves the run", info->label,
                        step);
                L->res->train_seconds = dp_now() - t_start;
                L->res->steps = step;
                rc = 0;
                goto out;
            }
            if (L->ck.ema && info->live_params) {
                float d = cfg->ema, e = 1.0f - d;
                float *restrict a = L->ck.ema;
                const float *restrict p = L->m.params;
                for (size_t i = 0; i < L->m.n_params; i++)
                    a[i] = d * a[i] + e * p[i];
            }
            if (L->in_cluster && info->shard_index == cfg->straggler) {
                /* --straggler stands for slow arithmetic: counted as compute */
                double s0 = dp_now();
                dp_sleep_ms(cfg->straggler_ms);
                dp_trace_compute("compute (--straggler)", s0, dp_now());
            }
            if (L->in_cluster && pace_ms > 0)
                dp_sleep_ms(pace_ms);
            if (cfg->trace_clocks)
                dp_metrics_event(L->metrics, "clock", DP_F_INT, "worker", (long)info->shard_index,
                                 DP_F_INT, "clock", step, DP_F_NUM, "mono", dp_now(), DP_F_INT,
                                 "max_gap", out.clock_gap, DP_F_END);
            if (checkpoint_due(L, step) && k + 1 < L->spe && trainer_checkpoint(L, step, err) < 0)
                goto out;
            if (n == 0)
                continue;
            double dt = dp_now() - t0;
            compute_ms[timed] = (dp_trace_thread_compute() - c0) * 1e3;
            step_ms[timed++] = dt * 1e3;
            deferred |= out.deferred;
            if (!out.deferred) {
                st.loss_sum += (double)out.loss * n;
                st.correct += out.correct;
                window_loss += (double)out.loss * n;
                window_correct += out.correct;
            }
            st.records += n;
            window_samples += n;
            window_steps++;
            window_time += dt;
            int due = cfg->log_every > 0 && step % cfg->log_every == 0;
            int line = due && !cfg->quiet;
            /* only every N steps: an event allocates, so never per step */
            int record = due && (cfg->metrics_path || cfg->tensorboard_dir);
            int bar = cfg->progress && (step % 10 == 0 || k == L->spe - 1);
            if (deferred && (line || record || bar) &&
                collect(L, step, &st, &window_loss, &window_correct, err) < 0)
                goto out;
            if (due) {
                double wl = window_loss / window_samples;
                double wa = (double)window_correct / window_samples;
                if (line) /* dp_info erases the progress bar first */
                    dp_info("%s, At step %ld, Cost: %.4f Accuracy: %.4f AvgTime: %.2fms",
                            info->label, step, wl, wa, window_time / window_steps * 1e3);
                if (record)
                    dp_metrics_event(L->metrics, "train", DP_F_INT, "epoch", (long)epoch + 1,
                                     DP_F_INT, "step", step, DP_F_NUM, "train_loss", wl,
                                     DP_F_NUM, "train_accuracy", wa, DP_F_INT, "steps",
                                     window_steps, DP_F_INT, "records", window_samples,
                                     DP_F_NUM, "lr", (double)lr, DP_F_END);
                window_loss = window_time = 0;
                window_correct = window_samples = window_steps = 0;
            }
            if (bar)
                dp_progress_draw(stderr, epoch + 1, cfg->epochs, k + 1, L->spe,
                                 st.loss_sum / st.records, dp_now() - t_epoch);
        }
        if (cfg->progress) /* erased, not left above the epoch's line */
            dp_progress_clear(stderr);
        if (deferred && collect(L, step, &st, &window_loss, &window_correct, err) < 0)
            goto out;
        st.seconds = dp_now() - t_epoch;
        st.steps = step;
        uint64_t tx1, rx1;
        comm_bytes(L, &tx1, &rx1);
        steps_event(L, epoch + 1, step, step_ms, compute_ms, timed, (long)st.records, st.seconds,
                    tx1 - tx0, rx1 - rx0);
        if (L->ops->epoch_end(L->s, epoch + 1, &st, err) < 0)
            goto out;
        L->res->train_loss = st.records > 0 ? st.loss_sum / st.records : 0;
        if ((info->evaluator || info->standby) &&
            evaluate_epoch(L, epoch + 1, &st, dp_now() - t_epoch, step, err) < 0)
            goto out;
        if (checkpoint_due(L, step) && trainer_checkpoint(L, step, err) < 0)
            goto out;
    }
    if (L->ops->finish(L->s, step, err) < 0)
        goto out;
    L->res->train_seconds = dp_now() - t_start;
    L->res->steps = step;
    if (info->evaluator && report_and_save(L, err) < 0)
        goto out;
    rc = 0;
out:
    if (drains)
        dp_drain_disarm();
    free(step_ms);
    dp_batcher_free(&batcher);
    return rc;
}

/* --resume: the newest checkpoint that reads back, every task the same one. */
static int load_resume(loop *L, dp_err *err)
{
    char path[4096];
    int found = dp_checkpoint_find_newest(L->cfg->checkpoint_dir, &L->m, &L->id, &L->resume,
                                          path, sizeof path, err);
    if (found < 0)
        return -1;
    if (found == 0) {
        dp_info("--resume: no checkpoint in %s; starting fresh", L->cfg->checkpoint_dir);
        return 0;
    }
    const dp_train_state *r = &L->resume;
    if ((L->cfg->ema > 0) != (r->ema != NULL))
        return dp_errf(err, "%s: %s, but this run has --ema %g", path,
                       r->ema ? "it holds a moving average" : "tensor 'ema' is missing",
                       (double)L->cfg->ema);
    if (r->step > (long)L->cfg->epochs * 1000000000L)
        return dp_errf(err, "%s: step %ld is past the end of the run", path, r->step);
    memcpy(L->m.params, r->params, L->m.n_params * sizeof(float));
    if (r->buffers) /* the writer's buffers, every task (docs/strategies.md, "Buffers") */
        memcpy(L->m.buffers, r->buffers, L->m.n_buffers * sizeof(float));
    dp_info("Resuming from %s (step %ld)", path, r->step);
    snprintf(L->resume_path, sizeof L->resume_path, "%s", path);
    L->env.resume = r;
    return 0;
}

/* The evaluator's and writer's state: room for everything a checkpoint
 * holds, filled from the resumed checkpoint. */
static int alloc_state(loop *L, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    int parts = (cfg->ema > 0 ? DP_STATE_EMA : 0) | (cfg->keep_best ? DP_STATE_BEST : 0);
    if (dp_train_state_alloc(&L->ck, L->m.n_params, dp_optim_slots(cfg->optim.kind), parts,
                             cfg->epochs, L->info.worker_optimizers, err) < 0 ||
        dp_train_state_alloc_residuals(&L->ck, L->info.residuals, err) < 0)
        return -1;
    const dp_train_state *r = L->env.resume;
    if (L->ck.ema)
        memcpy(L->ck.ema, r ? r->ema : L->m.params, L->m.n_params * sizeof(float));
    if (r)
        take_evaluator_state(L, r);
    return 0;
}

static int open_node(loop *L, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    dp_node_config nc;
    dp_node_config_init(&nc);
    if (cfg->transport)
        nc.transport = cfg->transport;
    nc.mpi_ps = cfg->mpi_ps;
    nc.secret_file = cfg->secret_file;
    nc.encrypt = cfg->encrypt;
    nc.link_delay_ms = cfg->link_delay_ms;
    nc.no_shm = cfg->no_shm;
    if (cfg->startup_timeout > 0)
        nc.connect_timeout = cfg->startup_timeout;
    if (cfg->heartbeat_timeout > 0)
        nc.heartbeat_timeout = cfg->heartbeat_timeout;
    int rc;
    if (strcmp(nc.transport, "mpi") == 0) {
        /* Every MPI rank gets the same --metrics path: the chief keeps it,
         * the others write beside it with their task's name, as under launch. */
        rc = dp_node_open(&L->node, &nc, err);
        char path[1100];
        const char *mpath = cfg->metrics_path;
        if (rc == 0 && mpath && L->node.self->role != DP_ROLE_CHIEF) {
            snprintf(path, sizeof path, "%s.%s-%d", mpath, dp_role_name(L->node.self->role),
                     L->node.self->index);
            mpath = path;
        }
        if (rc < 0 || dp_metrics_open(&L->metrics, mpath, err) < 0 ||
            ((mpath || cfg->tensorboard_dir) && dp_node_sample(&L->node, L->metrics, 1.0, err) < 0))
            return -1;
        if (rc == 0)
            dp_metrics_set_task(L->metrics, L->node.self->name);
        return rc;
    }
    if (dp_metrics_open(&L->metrics, cfg->metrics_path, err) < 0)
        return -1;
    nc.metrics = cfg->metrics_path || cfg->tensorboard_dir ? L->metrics : NULL;
    unsigned talks[DP_ROLE_COUNT];
    memcpy(talks, L->ops->talks_to, sizeof talks);
    if (L->ops->links)
        L->ops->links(cfg, talks);
    int all = 1;
    for (int r = 0; r < DP_ROLE_COUNT; r++)
        all &= talks[r] == 0;
    nc.talks_to = all ? NULL : talks;
    nc.spare_workers = cfg->spare_workers;
    rc = dp_node_open(&L->node, &nc, err);
    if (rc == 0)
        dp_metrics_set_task(L->metrics, L->node.self->name);
    return rc;
}

/* Refuses a run whose outputs cannot be written, before it trains. */
static int check_outputs(const dp_train_config *cfg, dp_err *err)
{
    if (cfg->save_path && dp_path_check_writable(cfg->save_path, "--save", err) < 0)
        return -1;
    if (cfg->checkpoint_dir && dp_dir_prepare(cfg->checkpoint_dir, "--checkpoint-dir", err) < 0)
        return -1;
    if (cfg->tensorboard_dir && dp_dir_prepare(cfg->tensorboard_dir, "--tensorboard", err) < 0)
        return -1;
    if (cfg->resume && !cfg->checkpoint_dir)
        return dp_errf(err, "--resume needs --checkpoint-dir (where the checkpoints are)");
    if (cfg->keep_checkpoints < 1)
        return dp_errf(err, "--keep-checkpoints %d: keep at least 1", cfg->keep_checkpoints);
    return 0;
}

/* --tensorboard: a cluster task writes in DIR/<type>-<index>, the name its
 * metrics file gets under launch, so TensorBoard shows one run per task
 * (docs/tensorboard.md); a single process writes in DIR. */
static int open_tensorboard(loop *L, dp_err *err)
{
    char run[48];
    if (L->in_cluster)
        snprintf(run, sizeof run, "%s-%d", dp_role_name(L->node.self->role), L->node.self->index);
    if (dp_tensorboard_open(&L->tb, L->cfg->tensorboard_dir, L->in_cluster ? run : NULL, err) < 0)
        return -1;
    dp_metrics_attach_tensorboard(L->metrics, L->tb);
    return 0;
}

static int run_task(loop *L, dp_err *err)
{
    const dp_train_config *cfg = L->cfg;
    int role_ps = L->in_cluster && L->node.self->role == DP_ROLE_PS;
    /* Every task builds the same initial parameters from the seed, so no
     * task has to ship them to another. */
    /* Room for twice the batch in a cluster: a trainer that takes over the
     * share of lost ones takes bigger bites (redeal); with spare slots, for
     * the share of every slot not started yet too. */
    int mult = L->in_cluster ? 2 : 1;
    if (L->in_cluster && cfg->spare_workers > 0) {
        const dp_cluster *c = &L->node.cluster;
        int slots = c->count[DP_ROLE_CHIEF] + c->count[DP_ROLE_WORKER];
        int live = slots - cfg->spare_workers;
        if (live > 0 && (slots + live - 1) / live > mult)
            mult = (slots + live - 1) / live;
    }
    int max_batch = L->ops->model_rows ? L->ops->model_rows(cfg) : cfg->batch * mult;
    if (max_batch < EVAL_CHUNK)
        max_batch = EVAL_CHUNK;
    /* A worker of a strategy that moves sparse tables by rows holds only
     * the rows of the batch in flight, and a ps task no table in its model
     * (its shard draws its own rows: docs/strategies.md, "Tables larger
     * than a worker"); resumed, each reads the checkpoint's dense parts and
     * a ps task its shard's rows, a piece at a time (docs/checkpoints.md,
     * "Reading in pieces"). */
    /* The chief too: it evaluates chunk by chunk on the rows each pulls,
     * and its files (--save, checkpoints) take the tables streamed from
     * the servers; with --keep-best the best epoch's rows go to a file of
     * their own (write_best), read back by rows. */
    int chief_compact = L->in_cluster && L->node.self->role == DP_ROLE_CHIEF &&
                        L->ops->eval_rows && L->ops->table_rows;
    int compact = L->in_cluster &&
                  (L->node.self->role == DP_ROLE_WORKER || role_ps || chief_compact) &&
                  !cfg->external && L->ops->compact_tables &&
                  L->ops->compact_tables(cfg);
    if ((cfg->external ? dp_model_init_external(&L->m, cfg->external, NULL, max_batch, err)
         : compact     ? (L->compact_eval =
                              dp_model_init_compact(&L->m, cfg->model, max_batch, 1, err))
                       : dp_model_init(&L->m, cfg->model, max_batch, 1, err)) < 0 ||
        dp_strategy_check_buffers(&L->m, cfg->strategy, err) < 0)
        return -1;
    L->compact_eval = L->compact_eval > 0 && chief_compact;
    if (L->m.external) {
        /* its weights are its caller's: the same on every task when each
         * builds the module from the same seed (docs/python.md) */
        if (check_external(L, role_ps, err) < 0)
            return -1;
    } else {
        dp_model_init_params(&L->m, cfg->seed);
        if (L->in_cluster) /* the same weights everywhere, but each task its own dropout masks */
            dp_model_seed_dropout(&L->m, cfg->seed + 0x9e3779b97f4a7c15ULL * (uint64_t)L->node.self->rank);
    }
    /* The servers need no data; everyone else checks it against the model,
     * before the banner: a run that cannot start announces none.  An
     * external model's caller reads its own. */
    if (!role_ps && !L->m.external && open_data(L, err) < 0)
        return -1;
    dp_info("%s%s%s: %s (%zu parameters) on %s, batch %d, %d epoch(s), %s lr %g, %d thread(s) (%s)",
            L->in_cluster ? L->node.self->name : "Training", L->in_cluster ? " " : "",
            L->in_cluster ? cfg->strategy : "", L->m.name, L->m.n_params,
            L->m.external ? "its caller's data" : cfg->dataset,
            cfg->batch, cfg->epochs, dp_optim_kind_name(cfg->optim.kind), (double)cfg->optim.lr,
            dp_blas_threads(), dp_blas_info());
    L->id = (dp_run_identity){
        .strategy = cfg->strategy, .dataset = cfg->dataset,
        .optimizer = dp_optim_kind_name(cfg->optim.kind),
        .lr_schedule = dp_lr_schedule_name(cfg->lr_schedule), .lr = cfg->optim.lr,
        .workers = L->in_cluster ? L->node.cluster.count[DP_ROLE_WORKER] : 0,
        .ps = L->in_cluster ? L->node.cluster.count[DP_ROLE_PS] : 0, .batch = cfg->batch,
        .seed = cfg->seed, .train_size = cfg->n_train, .val_size = cfg->n_val,
        .epochs = cfg->epochs, .reshards = L->ops->reshards,
        .global_batch = cfg->global_batch, .same_records = cfg->shard == DP_SHARD_DATA};
    char settings[512];
    snprintf(settings, sizeof settings,
             "momentum=%.9g beta1=%.9g beta2=%.9g eps=%.9g shard=%s ema=%.9g",
             (double)cfg->optim.momentum, (double)cfg->optim.beta1, (double)cfg->optim.beta2,
             (double)cfg->optim.eps, dp_shard_name(cfg->shard), (double)cfg->ema);
    dp_strategy_identity(cfg, 0, settings, sizeof settings); /* the strategy's own */
    /* settings added since: written only when not the default, so a
     * checkpoint of a run without them still resumes */
    size_t used = strlen(settings);
    if (cfg->optim.weight_decay != 0)
        used += (size_t)snprintf(settings + used, sizeof settings - used, " weight_decay=%.9g",
                                 (double)cfg->optim.weight_decay);
    if (cfg->clip_norm > 0)
        used += (size_t)snprintf(settings + used, sizeof settings - used, " clip_norm=%.9g",
                                 (double)cfg->clip_norm);
    dp_strategy_identity(cfg, 1, settings, sizeof settings); /* allreduce's sync_bn */
    used = strlen(settings);
    if (cfg->warmup_steps > 0 || cfg->warmup_epochs > 0)
        used += (size_t)snprintf(settings + used, sizeof settings - used, " warmup=%ld%s",
                                 cfg->warmup_steps > 0 ? cfg->warmup_steps
                                                       : (long)cfg->warmup_epochs,
                                 cfg->warmup_steps > 0 ? "steps" : "epochs");
    if (dp_augment_on(&cfg->augment)) {
        char spec[32];
        dp_augment_format(&cfg->augment, spec, sizeof spec);
        used += (size_t)snprintf(settings + used, sizeof settings - used, " augment=%s", spec);
    }
    if (cfg->lr_schedule == DP_LR_STEP)
        used += (size_t)snprintf(settings + used, sizeof settings - used,
                                 " lr_step_every=%d lr_gamma=%.9g", cfg->lr_step_every,
                                 (double)cfg->lr_gamma);
    if (cfg->global_batch > 0) /* the batch's identity then; each worker's share may change */
        used += (size_t)snprintf(settings + used, sizeof settings - used, " global_batch=%d",
                                 cfg->global_batch);
    if (cfg->sum_chunk > 0) /* deals blocks, not every w-th record: another order */
        used += (size_t)snprintf(settings + used, sizeof settings - used, " sum_chunk=%d",
                                 cfg->sum_chunk);
    L->id.settings = settings;
    if (cfg->resume && load_resume(L, err) < 0)
        return -1;
    L->ckpts = (dp_checkpoint_source){newest_checkpoint, release_checkpoint,
                                       dp_checkpoint_read_rows, L};
    L->env = (dp_run_env){.cfg = cfg, .node = L->in_cluster ? &L->node : NULL, .model = &L->m,
                          .metrics = L->metrics, .n_train = cfg->n_train,
                          .resume = L->env.resume,
                          .resume_path = L->env.resume ? L->resume_path : NULL, .id = &L->id,
                          .train = role_ps ? NULL : &L->train,
                          .checkpoints = cfg->checkpoint_dir ? &L->ckpts : NULL,
                          .drain_asked = dp_drain_asked};
    L->info.start_step = -1;
    if (L->ops->open(&L->s, &L->env, &L->info, err) < 0)
        return -1;
    /* --global-batch was shared among the workers: they must be the
     * data-parallel replicas (not, say, ps-async's model-parallel tasks) */
    if (cfg->global_batch > 0 && L->info.part == DP_PART_TRAINER &&
        (L->info.replicas > 0 ? L->info.replicas : 1) != L->trainers)
        return dp_errf(err, "--global-batch %d: the %d workers train as %d replica(s) under "
                            "this strategy's settings, so a share of %d records a worker is "
                            "not a step of %d. Hint: --batch", cfg->global_batch, L->trainers,
                       L->info.replicas, cfg->batch, cfg->global_batch);
    /* every replica's residual, of which open took its own: memory no
     * longer needed (n_params floats a replica) */
    free(L->resume.residuals);
    L->resume.residuals = NULL;
    L->resume.n_residuals = 0;
    /* The writer (only it, so no task removes a temporary being written)
     * clears what a write killed mid-way left (docs/checkpoints.md). */
    dp_err terr;
    if (L->info.evaluator && cfg->checkpoint_dir &&
        dp_checkpoint_remove_temps(cfg->checkpoint_dir, &terr) < 0)
        dp_warn("%s", terr.msg);
    /* Steps per epoch: the same for every trainer, so synchronous
     * strategies line up; together the trainers cover the split once.  Whole
     * files (--shard file over record files) need not split evenly: the
     * largest shard sets the steps, and the others' last steps are short or
     * empty.  A ps task holds no data, and needs no step count. */
    long replicas = L->info.replicas > 0 ? L->info.replicas : 1;
    long share = ((long)cfg->n_train + replicas - 1) / replicas;
    if (!role_ps && replicas > 1 && cfg->shard == DP_SHARD_FILE && L->train.n_files > 0) {
        if (dp_shard_check(cfg->shard, &L->train, (int)replicas, err) < 0)
            return -1;
        share = dp_shard_max(cfg->shard, &L->train, (int)replicas);
    }
    L->spe = L->m.external ? L->m.external->steps_per_epoch : (share + cfg->batch - 1) / cfg->batch;
    if (role_ps && L->spe < 1)
        L->spe = 1; /* a server counts no steps */
    L->total_steps = L->spe * cfg->epochs;
    L->lr = (dp_lr_plan){.schedule = cfg->lr_schedule,
                         .warmup = cfg->warmup_steps > 0 ? cfg->warmup_steps
                                                         : (long)cfg->warmup_epochs * L->spe,
                         .step_every = (long)cfg->lr_step_every * L->spe,
                         .gamma = cfg->lr_gamma};
    if (!role_ps && L->lr.warmup > L->total_steps)
        return dp_errf(err, "--warmup-steps %ld: the warm-up is longer than the run's %ld steps "
                            "(%ld per epoch)", L->lr.warmup, L->total_steps, L->spe);
    L->env.steps_per_epoch = L->spe;
    L->id.steps_per_epoch = L->spe;
    if (L->resume.step > L->total_steps)
        return dp_errf(err, "the checkpoint is at step %ld, past this run's %ld steps",
                       L->resume.step, L->total_steps);
    if (L->info.sliced && L->info.part == DP_PART_TRAINER && !L->info.evaluator) {
        /* the strategy took its slices at open: the full model's weights and
         * gradients would only be memory this task was meant to save */
        free(L->m.params);
        free(L->m.grads);
        L->m.params = L->m.grads = NULL;
        return train(L, err);
    }
    switch (L->info.part) {
    case DP_PART_SERVER:
        /* a server computes no gradient: the model's would be memory held
         * for nothing (a whole sparse table's, docs/strategies.md); an
         * external model's are its caller's (external.h) */
        if (!L->m.external) {
            free(L->m.grads);
            L->m.grads = NULL;
        }
        return L->ops->serve(L->s, err);
    case DP_PART_COORDINATOR:
        return alloc_state(L, err) < 0 ? -1 : coordinate(L, err);
    case DP_PART_TRAINER:
        return alloc_state(L, err) < 0 ? -1 : train(L, err);
    default:
        return dp_errf(err, "strategy %s opened an unknown part", cfg->strategy);
    }
}

int dp_train_run(const dp_train_config *cfg, dp_train_result *res, dp_err *err)
{
    loop L;
    dp_resource_sampler *sampler = NULL;
    int rc = -1, traced = 0;
    memset(&L, 0, sizeof L);
    memset(res, 0, sizeof *res);
    L.cfg = cfg;
    L.res = res;
    dp_train_config shared; /* cfg with --global-batch's share as its batch */
    if ((cfg->global_batch <= 0 && cfg->batch < 1) || cfg->epochs < 1)
        return dp_errf(err, "batch and epochs must be at least 1");
    if (!(L.ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", err)) ||
        check_outputs(cfg, err) < 0 || dp_strategy_check(cfg, err) < 0)
        return -1;
    if (cfg->threads > 0)
        dp_blas_set_threads(cfg->threads);
    int node_rc = open_node(&L, err);
    if (node_rc < 0)
        goto out;
    L.in_cluster = node_rc == 0;
    {
        const int *n = L.node.cluster.count;
        if ((L.in_cluster ? dp_strategy_check_cluster(L.ops, n[DP_ROLE_CHIEF], n[DP_ROLE_WORKER],
                                                      n[DP_ROLE_PS], err)
                          : dp_strategy_check_cluster(L.ops, -1, 0, 0, err)) < 0) {
            if (L.in_cluster)
                dp_err_prefix(err, "%s", L.node.self->name);
            goto out;
        }
    }
    if (cfg->global_batch > 0) {
        /* each worker's share, now that the cluster is known */
        shared = *cfg;
        const int *n = L.node.cluster.count;
        L.trainers = L.in_cluster ? dp_strategy_trainers(L.ops, n[DP_ROLE_CHIEF],
                                                         n[DP_ROLE_WORKER])
                                  : 1;
        if (dp_global_batch_share(cfg->global_batch, L.trainers, &shared.batch, err) < 0 ||
            dp_sum_chunk_check(cfg->sum_chunk, shared.batch, cfg->global_batch, L.trainers,
                               err) < 0) {
            if (L.in_cluster)
                dp_err_prefix(err, "%s", L.node.self->name);
            goto out;
        }
        L.cfg = cfg = &shared;
    }
    if (cfg->trace_path) {
        /* Under mpirun every rank has the same FILE: the chief keeps it and
         * the others write beside it, as launch names them (docs/trace.md). */
        char tpath[1100];
        const char *tp = cfg->trace_path;
        if (L.in_cluster && cfg->transport && strcmp(cfg->transport, "mpi") == 0 &&
            L.node.self->role != DP_ROLE_CHIEF) {
            snprintf(tpath, sizeof tpath, "%s.%s-%d", tp, dp_role_name(L.node.self->role),
                     L.node.self->index);
            tp = tpath;
        }
        if (dp_trace_open(tp, L.in_cluster ? L.node.cluster.self : 0,
                          L.in_cluster ? L.node.self->name : "process", err) < 0)
            goto out;
    }
    traced = cfg->trace_path != NULL;
    if (cfg->tensorboard_dir && open_tensorboard(&L, err) < 0)
        goto out;
    if (!L.in_cluster && (cfg->metrics_path || cfg->tensorboard_dir) &&
        dp_resource_sampler_start(&sampler, L.metrics, "worker:0", 1.0, NULL, NULL, err) < 0)
        goto out;
    rc = run_task(&L, err);
    /* The last resource samples before the teardown below frees the model
     * and closes the transport (docs/metrics.md, "resource"). */
    dp_resource_sampler_finish(sampler);
    dp_resource_sampler_finish(L.node.sampler);
    if (rc < 0 && L.in_cluster)
        dp_err_prefix(err, "%s", L.node.self->name);
out:
    if (L.ops && L.s)
        L.ops->close(L.s);
    /* after close: the strategy's threads (the all-reduce's) have stopped */
    dp_err terr;
    if (traced && dp_trace_close(&terr) < 0 && rc == 0) {
        *err = terr;
        rc = -1;
    }
    dp_train_state_free(&L.ck);
    dp_train_state_free(&L.resume);
    dp_train_state_free(&L.best_own);
    free(L.best_ids);
    free(L.best_x);
    free(L.x);
    free(L.y);
    dp_model_free(&L.m);
    dp_dataset_close(&L.ds);
    dp_resource_sampler_stop(sampler);
    L.node.failed = rc < 0;
    dp_node_close(&L.node);
    dp_err merr; /* a failed metrics write fails the run at its end (metrics.h) */
    if (dp_metrics_close_check(L.metrics, &merr) < 0 && rc == 0) {
        *err = merr;
        rc = -1;
    }
    /* after the metrics writer, the last that could mirror an event into it */
    if (dp_tensorboard_close_check(L.tb, &merr) < 0 && rc == 0) {
        *err = merr;
        rc = -1;
    }
    return rc;
}
