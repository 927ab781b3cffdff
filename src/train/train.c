/* The one training loop (DESIGN decision 3).  A process is one of:
 *   single  trains alone with a local optimiser;
 *   worker  trains on its shard and hands gradients to the parameter servers;
 *   ps      serves a shard of the parameters (src/strategy/ps.c);
 *   chief   starts the run, evaluates after every epoch, reports and saves.
 * Epochs, batching, step lines, evaluation and the metrics contract are
 * written once here for all of them. */
#include "downpour/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "downpour/wire.h"
#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/log.h"
#include "downpour/metrics.h"
#include "downpour/node.h"
#include "downpour/resource.h"
#include "downpour/reducer.h"
#include "downpour/ring.h"

typedef struct dp_epoch_stats {
    double loss_sum;
    uint64_t records;
    uint64_t correct;
    double seconds;
    uint64_t steps;
} dp_epoch_stats;

/* Evaluation runs in chunks this large even when the training batch is small:
 * fewer, larger GEMMs. */
#define EVAL_CHUNK 500
#define WAIT_TIMEOUT 600.0 /* s the chief or a worker waits for a peer */

static const char *const strategy_names[DP_STRATEGY_COUNT] = {
    "single", "ps-async", "ps-sync", "ps-ssp", "ps-dssp", "model-avg", "allreduce"};

int dp_strategy_parse(const char *name, dp_strategy *out, dp_err *err)
{
    for (int i = 0; i < DP_STRATEGY_COUNT; i++)
        if (strcmp(name, strategy_names[i]) == 0) {
            *out = (dp_strategy)i;
            return 0;
        }
    return dp_errf(err, "unknown strategy '%s' (valid: single, ps-async, ps-sync, ps-ssp, "
                        "ps-dssp, model-avg, allreduce)", name);
}

const char *dp_strategy_name(dp_strategy s)
{
    return (unsigned)s < DP_STRATEGY_COUNT ? strategy_names[s] : "unknown";
}

static dp_ps_mode ps_mode_of(dp_strategy s)
{
    switch (s) {
    case DP_STRATEGY_PS_SYNC: return DP_PS_SYNC;
    case DP_STRATEGY_PS_SSP: return DP_PS_SSP;
    case DP_STRATEGY_PS_DSSP: return DP_PS_DSSP;
    case DP_STRATEGY_MODEL_AVG: return DP_PS_AVG;
    default: return DP_PS_ASYNC;
    }
}

int dp_lr_schedule_parse(const char *name, dp_lr_schedule *out, dp_err *err)
{
    if (strcmp(name, "constant") == 0)
        *out = DP_LR_CONSTANT;
    else if (strcmp(name, "cosine") == 0)
        *out = DP_LR_COSINE;
    else
        return dp_errf(err, "unknown learning-rate schedule '%s' (valid: constant, cosine)", name);
    return 0;
}

float dp_lr_scale(dp_lr_schedule s, long done, long total)
{
    if (s != DP_LR_COSINE || total <= 0)
        return 1.0f;
    double p = (double)done / (double)total;
    return (float)(0.5 * (1.0 + cos(M_PI * (p > 1 ? 1 : p))));
}

dp_train_config dp_train_defaults(void)
{
    dp_train_config c;
    memset(&c, 0, sizeof c);
    c.dataset = "mnist";
    c.model = "mlp-300-100";
    c.strategy = DP_STRATEGY_SINGLE;
    dp_ps_config_init(&c.ps);
    c.shard = DP_SHARD_DATA;
    c.bucket_bytes = 512u << 10;
    c.overlap = true;
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
    return c;
}

double dp_evaluate(dp_model *m, const dp_split *s, float *x, uint8_t *y, double *mean_loss)
{
    long correct = 0;
    double loss_sum = 0;
    uint32_t idx[EVAL_CHUNK];
    int chunk = m->max_batch < EVAL_CHUNK ? m->max_batch : EVAL_CHUNK;
    for (uint32_t lo = 0; lo < s->n; lo += (uint32_t)chunk) {
        int n = (int)(s->n - lo < (uint32_t)chunk ? s->n - lo : (uint32_t)chunk);
        for (int i = 0; i < n; i++)
            idx[i] = lo + (uint32_t)i;
        dp_split_gather(x, y, s, idx, n);
        int c = 0;
        loss_sum += (double)dp_model_forward(m, x, y, n, &c) * n;
        correct += c;
    }
    if (mean_loss)
        *mean_loss = s->n ? loss_sum / s->n : 0;
    return s->n ? (double)correct / s->n : 0;
}

/* ------------------------------------------------------------ one run's state */

typedef struct run {
    const dp_train_config *cfg;
    dp_metrics *metrics;
    dp_node node;          /* empty for a single process */
    int in_cluster;
    dp_dataset ds;
    dp_split train, val;
    dp_model m;
    dp_optim opt;          /* single: the optimiser */
    float *ema;            /* single, allreduce evaluator: moving average of params */
    float *best;           /* --keep-best: the evaluated weights of the best epoch */
    double best_acc;
    int best_epoch;
    dp_ps_layout layout;
    dp_ps_client *client;  /* worker, chief */
    int allreduce;         /* mirrored replicas, gradients summed by dp_ring */
    dp_ring ring;
    dp_reducer *reducer;   /* allreduce: buckets, overlapped with backprop */
    uint32_t *shard_sizes; /* allreduce: every participant's records per epoch */
    float *x;
    uint8_t *y;
    double (*history)[3];  /* per epoch: val_accuracy, train_loss, seconds */
    int workers;           /* data-parallel replicas */
    int worker_index;      /* this worker's index, 0 for single */
} run;

static int open_data(run *r, dp_err *err)
{
    const dp_train_config *cfg = r->cfg;
    if (dp_dataset_open(&r->ds, cfg->dataset, err) < 0 ||
        dp_dataset_split(&r->ds, cfg->n_train, cfg->n_val, &r->train, &r->val, err) < 0)
        return -1;
    if ((uint32_t)dp_model_inputs(&r->m) != r->train.dim)
        return dp_errf(err, "model %s takes %d inputs but dataset %s has %ux%u = %u pixels",
                       r->m.name, dp_model_inputs(&r->m), cfg->dataset, r->ds.rows, r->ds.cols,
                       r->train.dim);
    if ((uint32_t)dp_model_classes(&r->m) < r->ds.classes)
        return dp_errf(err, "model %s has %d outputs but dataset %s has %u classes", r->m.name,
                       dp_model_classes(&r->m), cfg->dataset, r->ds.classes);
    r->x = malloc((size_t)r->m.max_batch * r->train.dim * sizeof *r->x);
    r->y = malloc((size_t)r->m.max_batch);
    if (!r->x || !r->y)
        return dp_errf(err, "out of memory for a batch of %d records", r->m.max_batch);
    return 0;
}

static void draw_progress(int epoch, int epochs, long done, long total, double loss)
{
    int width = 30, filled = total ? (int)((double)done / total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[width] = '\0';
    fprintf(stderr, "\rEpoch %d/%d [%s] %ld/%ld loss %.4f ", epoch, epochs, bar, done, total, loss);
    fflush(stderr);
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000) * 1e6)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static void log_epoch(run *r, int epoch, double train_loss, double val_acc, double val_loss,
                      double secs, long step)
{
    dp_info("Epoch %d/%d: train_loss %.4f, val_loss %.4f, val_accuracy %.4f, %.2f s", epoch,
            r->cfg->epochs, train_loss, val_loss, val_acc, secs);
    if (r->history && epoch >= 1 && epoch <= r->cfg->epochs) {
        r->history[epoch - 1][0] = val_acc;
        r->history[epoch - 1][1] = train_loss;
        r->history[epoch - 1][2] = secs;
    }
    dp_metrics_event(r->metrics, "epoch", DP_F_INT, "epoch", (long)epoch, DP_F_NUM, "val_accuracy",
                     val_acc, DP_F_NUM, "val_loss", val_loss, DP_F_NUM, "train_loss", train_loss,
                     DP_F_NUM, "seconds", secs, DP_F_INT, "step", step, DP_F_END);
}

/* The per-epoch table people compare with the source experiment's. */
static void print_table(const run *r)
{
    if (!r->history)
        return;
    dp_info("%6s %13s %11s %9s", "epoch", "val_accuracy", "train_loss", "seconds");
    for (int e = 0; e < r->cfg->epochs; e++)
        dp_info("%6d %13.4f %11.4f %9.2f", e + 1, r->history[e][0], r->history[e][1],
                r->history[e][2]);
}

static void log_done(run *r, dp_train_result *res)
{
    const dp_train_config *cfg = r->cfg;
    print_table(r);
    dp_info("Test accuracy: %.4f, training time: %.2f s (%.0f samples/s)", res->test_accuracy,
            res->train_seconds, res->samples_per_second);
    dp_metrics_event(r->metrics, "done", DP_F_NUM, "test_accuracy", res->test_accuracy, DP_F_NUM,
                     "train_seconds", res->train_seconds, DP_F_NUM, "samples_per_second",
                     res->samples_per_second, DP_F_STR, "strategy", dp_strategy_name(cfg->strategy),
                     DP_F_STR, "model", r->m.name, DP_F_STR, "dataset", cfg->dataset, DP_F_INT,
                     "batch", (long)cfg->batch, DP_F_INT, "global_batch",
                     (long)cfg->batch * r->workers, DP_F_INT, "epochs", (long)cfg->epochs, DP_F_STR,
                     "optimizer", dp_optim_kind_name(cfg->optim.kind), DP_F_INT, "workers",
                     (long)r->workers, DP_F_INT, "ps",
                     (long)(r->in_cluster ? r->node.cluster.count[DP_ROLE_PS] : 0), DP_F_END);
}

static int save(run *r, long step, dp_err *err)
{
    if (!r->cfg->save_path)
        return 0;
    dp_ckpt_info info = {.step = step, .epoch = r->cfg->epochs,
                         .strategy = dp_strategy_name(r->cfg->strategy),
                         .dataset = r->cfg->dataset};
    if (dp_checkpoint_save(r->cfg->save_path, &r->m, r->in_cluster ? NULL : &r->opt, &info, err) < 0)
        return -1;
    dp_info("Saved %s", r->cfg->save_path);
    return 0;
}

static int alloc_ema(run *r, dp_err *err)
{
    r->ema = malloc(r->m.n_params * sizeof *r->ema);
    if (!r->ema)
        return dp_errf(err, "out of memory for the moving average");
    memcpy(r->ema, r->m.params, r->m.n_params * sizeof *r->ema);
    return 0;
}

static int alloc_best(run *r, dp_err *err)
{
    if (!r->cfg->keep_best)
        return 0;
    r->best = malloc(r->m.n_params * sizeof *r->best);
    if (!r->best)
        return dp_errf(err, "out of memory for the best epoch's weights");
    r->best_acc = -1;
    return 0;
}

/* The moving average follows every update (single, the all-reduce evaluator). */
static void update_ema(run *r)
{
    if (!r->ema)
        return;
    float d = r->cfg->ema, e = 1.0f - d;
    float *restrict a = r->ema;
    const float *restrict p = r->m.params;
    for (size_t i = 0; i < r->m.n_params; i++)
        a[i] = d * a[i] + e * p[i];
}

/* Evaluation and checkpoints use the average when there is one: swapping
 * the buffers costs nothing. */
static void swap_ema(run *r)
{
    if (r->ema) {
        float *t = r->m.params;
        r->m.params = r->ema;
        r->ema = t;
    }
}

/* --keep-best: after each validation, keep the weights just evaluated when
 * they beat every earlier epoch (Keras's restore_best_weights). */
static void note_best(run *r, int epoch, double val_acc)
{
    if (r->best && val_acc > r->best_acc) {
        memcpy(r->best, r->m.params, r->m.n_params * sizeof *r->best);
        r->best_acc = val_acc;
        r->best_epoch = epoch;
    }
}

/* At the end: report and save the best epoch's weights instead of the last. */
static void restore_best(run *r)
{
    if (!r->best || r->best_epoch == 0)
        return;
    r->m.params = r->best;
    dp_info("Restored the weights of epoch %d (val_accuracy %.4f), the best of %d", r->best_epoch,
            r->best_acc, r->cfg->epochs);
}

/* The end of a run whose evaluator holds the parameters itself (single, the
 * first all-reduce replica): test accuracy, the done event, the checkpoint. */
static int report_and_save(run *r, dp_train_result *res, long step, dp_err *err)
{
    res->samples_per_second = (double)r->train.n * r->cfg->epochs / res->train_seconds;
    float *live = r->m.params;
    r->m.params = r->ema ? r->ema : live;
    restore_best(r);
    res->test_accuracy = dp_evaluate(&r->m, &r->ds.test, r->x, r->y, NULL);
    log_done(r, res);
    int saved = save(r, step, err);
    r->m.params = live;
    return saved;
}

/* ------------------------------------------------------------ workers */

static int send_to(run *r, int rank, unsigned type, uint64_t step, const void *p, size_t len,
                   dp_err *err)
{
    return dp_transport_send(r->node.transport, rank, type, step, 0, p, len, err);
}

/* A worker waits for the chief's START, so every clock starts together. */
static int await_start(run *r, dp_err *err)
{
    int chief = dp_cluster_rank(&r->node.cluster, DP_ROLE_CHIEF, 0);
    if (chief < 0)
        return 0;
    dp_event ev;
    if (dp_transport_recv(r->node.transport, chief, "the start signal", WAIT_TIMEOUT, &ev, err) < 0)
        return -1;
    if (ev.header.type != DP_WIRE_START)
        return dp_errf(err, "expected START from the chief, got frame type %u", ev.header.type);
    return dp_transport_skip_payload(r->node.transport, chief, err);
}

/* Steps per epoch: the same for every worker, so synchronous modes line up;
 * together the workers cover the training split once. */
static long steps_per_epoch(const run *r)
{
    long share = ((long)r->train.n + r->workers - 1) / r->workers;
    return (share + r->cfg->batch - 1) / r->cfg->batch;
}

/* Records every participant contributes to step k of an epoch (the shards'
 * sizes are known to all, so nobody has to send them). */
static double records_in_step(const run *r, long k)
{
    double total = 0;
    for (int w = 0; w < r->workers; w++) {
        long left = (long)r->shard_sizes[w] - k * r->cfg->batch;
        total += left < 0 ? 0 : (left < r->cfg->batch ? left : r->cfg->batch);
    }
    return total;
}

/* Sums an epoch's training stats over every replica (allreduce). */
static int allreduce_stats(run *r, double *loss_sum, long *seen, long step, dp_err *err)
{
    float v[2] = {(float)*loss_sum, (float)*seen};
    if (dp_ring_allreduce(&r->ring, v, 2, (uint64_t)step, -1, err) < 0)
        return -1;
    *loss_sum = v[0];
    *seen = (long)v[1];
    return 0;
}

static int train_worker(run *r, dp_train_result *res, dp_err *err)
{
    const dp_train_config *cfg = r->cfg;
    dp_batcher batcher;
    int rc = -1;
    dp_shard_policy policy = r->workers > 1 ? cfg->shard : DP_SHARD_OFF;
    /* Shard "off": every worker walks all records in its own order. */
    uint64_t seed = policy == DP_SHARD_OFF && r->workers > 1 ? cfg->seed + 1000003ULL * r->worker_index
                                                            : cfg->seed;
    int index = policy == DP_SHARD_OFF ? 0 : r->worker_index;
    int count = policy == DP_SHARD_OFF ? 1 : r->workers;
    if (dp_batcher_init(&batcher, &r->train, seed, 1, policy, index, count, err) < 0)
        return -1;

    /* Step lines name the task as the source's logs do: "Worker 2, At step ...". */
    char label[32];
    if (r->in_cluster && r->node.self->role == DP_ROLE_CHIEF)
        snprintf(label, sizeof label, "Chief");
    else
        snprintf(label, sizeof label, "Worker %d", r->in_cluster ? r->node.self->index : 0);
    int chief = r->in_cluster ? dp_cluster_rank(&r->node.cluster, DP_ROLE_CHIEF, 0) : -1;
    /* The evaluator: the process itself when alone, position 0 of the
     * all-reduce ring (the chief, as in MultiWorkerMirroredStrategy). */
    int evaluator = !r->in_cluster || (r->allreduce && r->worker_index == 0);
    if (r->in_cluster && !r->allreduce && await_start(r, err) < 0)
        goto out;

    long spe = steps_per_epoch(r), step = 0;
    double t_start = dp_now();
    double window_loss = 0, window_time = 0, epoch_loss = 0;
    long window_correct = 0, window_samples = 0, window_steps = 0;
    for (int epoch = 0; epoch < cfg->epochs; epoch++) {
        double t_epoch = dp_now(), loss_sum = 0;
        long seen = 0, correct_sum = 0;
        dp_batcher_start_epoch(&batcher, epoch);
        for (long k = 0; k < spe; k++) {
            double t0 = dp_now();
            int n = dp_batcher_next(&batcher, r->x, r->y, cfg->batch), correct = 0;
            float loss = 0;
            /* Each replica's mean gradient weighs its share of the step's
             * records, so the sum is the mean over the summed batch. */
            if (r->allreduce)
                dp_reducer_begin(r->reducer, (uint64_t)step + 1,
                                 (float)(n / records_in_step(r, k)));
            if (n > 0) {
                loss = dp_model_forward_backward(&r->m, r->x, r->y, n, &correct);
                if (!isfinite(loss)) {
                    dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                            (double)loss, step + 1);
                    goto out;
                }
            }
            if (r->worker_index == cfg->straggler && r->in_cluster)
                sleep_ms(cfg->straggler_ms);
            float scale = dp_lr_scale(cfg->lr_schedule, (long)epoch * spe + k, (long)cfg->epochs * spe);
            if (r->client) {
                if (dp_ps_client_step(r->client, r->m.params, r->m.grads, n, scale, err) < 0)
                    goto out;
            } else if (r->allreduce) {
                if (n == 0)
                    memset(r->m.grads, 0, r->m.n_params * sizeof *r->m.grads);
                if (dp_reducer_finish(r->reducer, err) < 0)
                    goto out;
                r->opt.cfg.lr = cfg->optim.lr * scale;
                dp_optim_apply(&r->opt, r->m.params, r->m.grads);
                update_ema(r);
            } else if (n > 0) {
                r->opt.cfg.lr = cfg->optim.lr * scale;
                dp_optim_apply(&r->opt, r->m.params, r->m.grads);
                update_ema(r);
            }
            step++;
            if (cfg->trace_clocks)
                dp_metrics_event(r->metrics, "clock", DP_F_INT, "worker", (long)r->worker_index,
                                 DP_F_INT, "clock", step, DP_F_NUM, "mono", dp_now(), DP_F_INT,
                                 "max_gap", r->client ? dp_ps_client_max_gap(r->client) : 0L,
                                 DP_F_END);
            if (n == 0)
                continue;
            double dt = dp_now() - t0;
            loss_sum += (double)loss * n;
            seen += n;
            correct_sum += correct;
            window_loss += loss;
            window_correct += correct;
            window_samples += n;
            window_steps++;
            window_time += dt;
            if (cfg->log_every > 0 && step % cfg->log_every == 0) {
                if (cfg->progress)
                    fputc('\n', stderr);
                dp_info("%s, At step %ld, Cost: %.4f Accuracy: %.4f AvgTime: %.2fms", label, step,
                        window_loss / window_steps, (double)window_correct / window_samples,
                        window_time / window_steps * 1e3);
                window_loss = window_time = 0;
                window_correct = window_samples = window_steps = 0;
            }
            if (cfg->progress && (step % 10 == 0 || k == spe - 1))
                draw_progress(epoch + 1, cfg->epochs, k + 1, spe, loss_sum / seen);
        }
        if (cfg->progress)
            fputc('\n', stderr);
        if (r->allreduce && allreduce_stats(r, &loss_sum, &seen, step, err) < 0)
            goto out;
        epoch_loss = seen ? loss_sum / seen : 0;
        double secs = dp_now() - t_epoch;
        if (r->allreduce && !evaluator) {
            /* the chief reports */
        } else if (!r->in_cluster || r->allreduce) {
            swap_ema(r);
            double val_loss, val_acc = dp_evaluate(&r->m, &r->val, r->x, r->y, &val_loss);
            note_best(r, epoch + 1, val_acc);
            swap_ema(r);
            log_epoch(r, epoch + 1, epoch_loss, val_acc, val_loss, dp_now() - t_epoch, step);
            res->val_accuracy = val_acc;
        } else if (chief >= 0) {
            dp_epoch_stats st = {loss_sum, (uint64_t)seen, (uint64_t)correct_sum, secs,
                                 (uint64_t)step};
            if (send_to(r, chief, DP_WIRE_EPOCH, (uint64_t)epoch + 1, &st, sizeof st, err) < 0)
                goto out;
        } else {
            dp_info("%s: epoch %d/%d done, train_loss %.4f, %.2f s", label, epoch + 1, cfg->epochs,
                    epoch_loss, secs);
        }
    }
    if (r->client && dp_ps_client_flush(r->client, r->m.params, err) < 0)
        goto out;
    res->train_seconds = dp_now() - t_start;
    res->steps = step;
    res->train_loss = epoch_loss;
    if (r->allreduce) {
        /* Mirrored replicas must end identical: each says what it holds. */
        uint32_t crc = dp_crc32c(0, r->m.params, r->m.n_params * sizeof *r->m.params);
        long early, total;
        dp_reducer_counts(r->reducer, &early, &total);
        dp_metrics_event(r->metrics, "replica", DP_F_INT, "params_crc32c", (long)crc, DP_F_INT,
                         "steps", step, DP_F_INT, "buckets", total, DP_F_INT,
                         "buckets_overlapped", early, DP_F_END);
        if (evaluator)
            dp_info("%s: %ld of %ld gradient buckets started reducing while backprop ran",
                    label, early, total);
        if (evaluator && report_and_save(r, res, step, err) < 0)
            goto out;
    } else if (r->in_cluster) {
        if (r->client)
            dp_info("%s: done after %ld steps in %.2f s; largest clock gap allowed: %ld", label,
                    step, res->train_seconds, dp_ps_client_max_gap(r->client));
        for (int s = 0; s < r->layout.n_shards; s++)
            if (send_to(r, r->layout.rank[s], DP_WIRE_DONE, (uint64_t)step, NULL, 0, err) < 0)
                goto out;
        if (chief >= 0 && send_to(r, chief, DP_WIRE_DONE, (uint64_t)step, NULL, 0, err) < 0)
            goto out;
    } else if (report_and_save(r, res, step, err) < 0) {
        goto out;
    }
    rc = 0;
out:
    dp_batcher_free(&batcher);
    return rc;
}

/* ------------------------------------------------------------ the chief */

typedef struct epoch_tally {
    int reports;
    double loss_sum, records;
    long steps; /* every worker's steps by the end of this epoch */
} epoch_tally;

static int chief_evaluate(run *r, int epoch, const epoch_tally *t, double secs, long step,
                          dp_train_result *res, dp_err *err)
{
    if (dp_ps_client_pull(r->client, r->m.params, r->cfg->ema > 0, err) < 0)
        return -1;
    double val_loss, val_acc = dp_evaluate(&r->m, &r->val, r->x, r->y, &val_loss);
    note_best(r, epoch, val_acc);
    log_epoch(r, epoch, t->records > 0 ? t->loss_sum / t->records : 0, val_acc, val_loss, secs, step);
    res->val_accuracy = val_acc;
    res->train_loss = t->records > 0 ? t->loss_sum / t->records : 0;
    return 0;
}

static int run_chief(run *r, dp_train_result *res, dp_err *err)
{
    const dp_train_config *cfg = r->cfg;
    dp_transport *t = r->node.transport;
    const dp_cluster *c = &r->node.cluster;
    epoch_tally *tally = calloc((size_t)cfg->epochs + 1, sizeof *tally);
    int *live = calloc((size_t)c->n_tasks, sizeof *live);
    int rc = -1;
    if (!tally || !live) {
        dp_errf(err, "out of memory");
        goto out;
    }
    dp_info("Chief: %s on %d worker(s) and %d ps task(s), batch %d per worker (global %d); "
            "%d shard(s):", dp_strategy_name(cfg->strategy), r->workers, c->count[DP_ROLE_PS],
            cfg->batch, cfg->batch * r->workers, r->layout.n_shards);
    for (int s = 0; s < r->layout.n_shards; s++)
        dp_info("  shard %d: parameters [%zu, %zu) (%.1f KiB) on %s", s, r->layout.range[s].lo,
                r->layout.range[s].hi,
                (r->layout.range[s].hi - r->layout.range[s].lo) * 4 / 1024.0,
                dp_transport_peer_name(t, r->layout.rank[s]));
    /* live_workers: not lost; done: said DONE.  Epoch e is evaluated once
     * live_workers reports for it are in. */
    int live_workers = r->workers, done = 0, lost = 0, next_eval = 1;
    for (int w = 0; w < r->workers; w++) {
        int rank = dp_cluster_rank(c, DP_ROLE_WORKER, w);
        live[rank] = 1;
        if (send_to(r, rank, DP_WIRE_START, 0, NULL, 0, err) < 0)
            goto out;
    }
    double t_start = dp_now(), t_last = t_start;
    long steps = 0;
    while (done < live_workers || next_eval <= cfg->epochs) {
        /* Evaluate every epoch that every live worker has finished, in order. */
        if (next_eval <= cfg->epochs && tally[next_eval].reports >= live_workers) {
            double now = dp_now();
            if (chief_evaluate(r, next_eval, &tally[next_eval], now - t_last,
                               tally[next_eval].steps, res, err) < 0)
                goto out;
            t_last = now;
            next_eval++;
            continue;
        }
        if (done >= live_workers) {
            dp_warn("%d worker(s) lost: epochs %d to %d were not evaluated", lost, next_eval,
                    cfg->epochs);
            break;
        }
        dp_event ev;
        if (dp_transport_poll(t, DP_PEER_ANY, WAIT_TIMEOUT, &ev, err) < 0)
            goto out;
        if (ev.kind == DP_EVENT_TIMEOUT) {
            dp_errf(err, "no word from any worker for %.0f s (epoch %d of %d unfinished)",
                    WAIT_TIMEOUT, next_eval, cfg->epochs);
            goto out;
        }
        const char *who = dp_transport_peer_name(t, ev.peer);
        if (ev.kind == DP_EVENT_PEER_LOST) {
            if (!live[ev.peer])
                continue;
            if (c->tasks[ev.peer].role == DP_ROLE_PS) {
                dp_errf(err, "lost %s (%s): its shard of the parameters is gone", who, ev.reason);
                goto out;
            }
            if (cfg->strategy == DP_STRATEGY_PS_SYNC || cfg->strategy == DP_STRATEGY_MODEL_AVG) {
                dp_errf(err, "lost %s (%s): a synchronous run cannot go on without it", who,
                        ev.reason);
                goto out;
            }
            dp_warn("lost %s (%s); the run goes on with %d worker(s)", who, ev.reason,
                    live_workers - 1);
            live[ev.peer] = 0;
            live_workers--;
            lost++;
            continue;
        }
        uint64_t e = ev.header.step;
        switch (ev.header.type) {
        case DP_WIRE_EPOCH: {
            dp_epoch_stats st;
            if (ev.header.length != sizeof st || e < 1 || e > (uint64_t)cfg->epochs) {
                dp_errf(err, "%s sent a malformed epoch report", who);
                goto out;
            }
            if (dp_transport_recv_payload(t, ev.peer, &st, sizeof st, err) < 0)
                goto out;
            tally[e].reports++;
            tally[e].loss_sum += st.loss_sum;
            tally[e].records += (double)st.records;
            tally[e].steps += (long)st.steps;
            break;
        }
        case DP_WIRE_DONE:
            /* A worker reports every epoch before it says DONE (one ordered
             * connection), so it still counts for the epochs not evaluated yet. */
            if (dp_transport_skip_payload(t, ev.peer, err) < 0)
                goto out;
            steps += (long)e;
            if (live[ev.peer]) {
                live[ev.peer] = 0;
                done++;
            }
            break;
        default:
            dp_warn("ignoring frame type %u from %s", ev.header.type, who);
            if (dp_transport_skip_payload(t, ev.peer, err) < 0)
                goto out;
        }
    }
    res->train_seconds = dp_now() - t_start;
    res->steps = steps;
    if (dp_ps_client_pull(r->client, r->m.params, r->cfg->ema > 0, err) < 0)
        goto out;
    res->samples_per_second = (double)r->train.n * cfg->epochs / res->train_seconds;
    float *pulled = r->m.params;
    restore_best(r);
    res->test_accuracy = dp_evaluate(&r->m, &r->ds.test, r->x, r->y, NULL);
    log_done(r, res);
    int saved = save(r, steps, err);
    r->m.params = pulled;
    if (saved < 0)
        goto out;
    rc = 0;
out:
    /* The servers stop with the chief, whatever happened. */
    for (int s = 0; s < c->count[DP_ROLE_PS]; s++) {
        dp_err ignore;
        send_to(r, dp_cluster_rank(c, DP_ROLE_PS, s), DP_WIRE_SHUTDOWN, 0, NULL, 0, &ignore);
    }
    free(tally);
    free(live);
    return rc;
}

/* ------------------------------------------------------------ entry */

static void reducer_ready(void *ctx, size_t lo) { dp_reducer_ready(ctx, lo); }

/* All-reduce: the chief (if any) and the workers are the replicas, in rank
 * order; the first of them evaluates, reports and saves. */
static int run_allreduce(run *r, dp_train_result *res, dp_err *err)
{
    const dp_cluster *c = &r->node.cluster;
    if (c->count[DP_ROLE_PS] > 0)
        return dp_errf(err, "allreduce keeps every parameter on every worker and needs no ps "
                            "task (the spec has %d). Hint: launch without --ps",
                       c->count[DP_ROLE_PS]);
    if (r->node.self->role != DP_ROLE_CHIEF && r->node.self->role != DP_ROLE_WORKER)
        return dp_errf(err, "allreduce runs on chief and worker tasks only");
    int n = c->count[DP_ROLE_CHIEF] + c->count[DP_ROLE_WORKER];
    int *ranks = malloc((size_t)n * sizeof *ranks);
    r->shard_sizes = malloc((size_t)n * sizeof *r->shard_sizes);
    if (!ranks || !r->shard_sizes) {
        free(ranks);
        return dp_errf(err, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < c->n_tasks; i++)
        if (c->tasks[i].role == DP_ROLE_CHIEF || c->tasks[i].role == DP_ROLE_WORKER) {
            if (i == c->self)
                r->worker_index = k;
            ranks[k++] = i;
        }
    r->workers = n;
    int rc = dp_ring_init(&r->ring, r->node.transport, ranks, n, r->cfg->collective_timeout,
                          0, err);
    free(ranks);
    if (rc < 0 ||
        dp_reducer_open(&r->reducer, &r->ring, r->m.grads, r->m.n_params, r->cfg->bucket_bytes,
                        r->cfg->overlap, err) < 0 ||
        open_data(r, err) < 0 ||
        dp_optim_init(&r->opt, &r->cfg->optim, r->m.n_params, err) < 0)
        return -1;
    dp_shard_policy policy = n > 1 ? r->cfg->shard : DP_SHARD_OFF;
    for (int w = 0; w < n; w++)
        r->shard_sizes[w] = dp_shard_size(policy, r->train.n, policy == DP_SHARD_OFF ? 0 : w,
                                          policy == DP_SHARD_OFF ? 1 : n);
    r->allreduce = 1;
    /* Backprop tells the reducer as each layer's gradients are final. */
    r->m.grad_ready = reducer_ready;
    r->m.grad_ready_ctx = r->reducer;
    if (r->worker_index == 0 && ((r->cfg->ema > 0 && alloc_ema(r, err) < 0) ||
                                 alloc_best(r, err) < 0))
        return -1;
    if (r->worker_index == 0)
        dp_info("%s: allreduce over %d replicas (%s), batch %d per replica (global %d), "
                "buckets of %zu KiB%s", r->node.self->name, n, r->ring.use_fast_path ? "the transport's collective"
                                                               : "ring over the transport",
                r->cfg->batch, r->cfg->batch * n, r->cfg->bucket_bytes >> 10,
                r->cfg->overlap ? ", overlapped with backprop" : "");
    return train_worker(r, res, err);
}

static int run_cluster_role(run *r, dp_train_result *res, dp_err *err)
{
    const dp_train_config *cfg = r->cfg;
    const dp_cluster *c = &r->node.cluster;
    dp_role role = r->node.self->role;
    if (cfg->strategy == DP_STRATEGY_SINGLE)
        return dp_errf(err, "--strategy single trains one process alone, but this is task %s of a "
                            "cluster. Hint: --strategy ps-async (or ps-sync, ps-ssp, ps-dssp, "
                            "model-avg, allreduce)", r->node.self->name);
    if (cfg->strategy == DP_STRATEGY_ALLREDUCE)
        return run_allreduce(r, res, err);
    if (c->count[DP_ROLE_CHIEF] == 0)
        return dp_errf(err, "strategy %s needs a chief to start, evaluate and end the run. Hint: "
                            "downpour launch --chief ..., or a \"chief\" entry in the cluster spec",
                       dp_strategy_name(cfg->strategy));
    r->workers = c->count[DP_ROLE_WORKER];
    if (r->workers < 1)
        return dp_errf(err, "the cluster has no worker");
    dp_ps_config pc = cfg->ps;
    pc.mode = ps_mode_of(cfg->strategy);
    pc.ema = cfg->ema;
    if (dp_ps_layout_make(&r->layout, c, r->m.n_params, &pc, err) < 0)
        return -1;
    if (role == DP_ROLE_PS) {
        dp_ps_start start = {.params = r->m.params};
        return dp_ps_serve(r->node.transport, c, &r->layout, &pc, &cfg->optim, &start,
                           r->m.n_params, err);
    }
    if (open_data(r, err) < 0 ||
        dp_ps_client_open(&r->client, r->node.transport, &r->layout, &pc, &cfg->optim,
                          r->m.n_params, err) < 0)
        return -1;
    if (role == DP_ROLE_CHIEF)
        return alloc_best(r, err) < 0 ? -1 : run_chief(r, res, err);
    r->worker_index = r->node.self->index;
    return train_worker(r, res, err);
}

int dp_train_run(const dp_train_config *cfg, dp_train_result *res, dp_err *err)
{
    run r;
    dp_resource_sampler *sampler = NULL;
    int rc = -1;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    r.cfg = cfg;
    r.workers = 1;
    if (cfg->batch < 1 || cfg->epochs < 1)
        return dp_errf(err, "batch and epochs must be at least 1");
    if (cfg->threads > 0)
        dp_blas_set_threads(cfg->threads);
    dp_node_config nc;
    dp_node_config_init(&nc);
    if (cfg->transport)
        nc.transport = cfg->transport;
    nc.mpi_ps = cfg->mpi_ps;
    int node_rc;
    if (strcmp(nc.transport, "mpi") == 0) {
        /* Every MPI rank gets the same --metrics path: the chief keeps it,
         * the others write beside it with their task's name, as under launch. */
        node_rc = dp_node_open(&r.node, &nc, err);
        char path[1100];
        const char *mpath = cfg->metrics_path;
        if (node_rc == 0 && mpath && r.node.self->role != DP_ROLE_CHIEF) {
            snprintf(path, sizeof path, "%s.%s-%d", mpath, dp_role_name(r.node.self->role),
                     r.node.self->index);
            mpath = path;
        }
        if (node_rc < 0 || dp_metrics_open(&r.metrics, mpath, err) < 0 ||
            (mpath && dp_node_sample(&r.node, r.metrics, 1.0, err) < 0))
            goto out;
    } else {
        if (dp_metrics_open(&r.metrics, cfg->metrics_path, err) < 0)
            return -1;
        nc.metrics = cfg->metrics_path ? r.metrics : NULL;
        node_rc = dp_node_open(&r.node, &nc, err);
        if (node_rc < 0)
            goto out;
    }
    r.history = calloc((size_t)cfg->epochs, sizeof *r.history); /* the table is optional */
    r.in_cluster = node_rc == 0;
    if (!r.in_cluster && cfg->strategy != DP_STRATEGY_SINGLE) {
        dp_errf(err, "strategy %s runs on a cluster. Hint: downpour launch --chief --workers 2 "
                     "--ps 1 -- train --strategy %s ...", dp_strategy_name(cfg->strategy),
                dp_strategy_name(cfg->strategy));
        goto out;
    }
    if (!r.in_cluster && cfg->metrics_path &&
        dp_resource_sampler_start(&sampler, r.metrics, "worker:0", 1.0, NULL, NULL, err) < 0)
        goto out;

    /* Every task builds the same initial parameters from the seed, so no
     * task has to ship them to another. */
    int max_batch = cfg->batch > EVAL_CHUNK ? cfg->batch : EVAL_CHUNK;
    if (dp_model_init(&r.m, cfg->model, max_batch, err) < 0)
        goto out;
    dp_model_init_params(&r.m, cfg->seed);
    dp_info("%s%s%s: %s (%zu parameters) on %s, batch %d, %d epoch(s), %s lr %g, %d thread(s) (%s)",
            r.in_cluster ? r.node.self->name : "Training", r.in_cluster ? " " : "",
            r.in_cluster ? dp_strategy_name(cfg->strategy) : "", r.m.name, r.m.n_params,
            cfg->dataset, cfg->batch, cfg->epochs, dp_optim_kind_name(cfg->optim.kind),
            (double)cfg->optim.lr, dp_blas_threads(), dp_blas_info());
    if (r.in_cluster) {
        rc = run_cluster_role(&r, res, err);
        if (rc < 0)
            dp_err_prefix(err, "%s", r.node.self->name);
    } else {
        if (dp_optim_init(&r.opt, &cfg->optim, r.m.n_params, err) < 0 || open_data(&r, err) < 0 ||
            (cfg->ema > 0 && alloc_ema(&r, err) < 0) || alloc_best(&r, err) < 0)
            goto out;
        rc = train_worker(&r, res, err);
    }
out:
    dp_ps_client_free(r.client);
    dp_reducer_close(r.reducer);
    dp_ring_free(&r.ring);
    free(r.shard_sizes);
    free(r.history);
    free(r.ema);
    free(r.best);
    free(r.x);
    free(r.y);
    dp_optim_free(&r.opt);
    dp_model_free(&r.m);
    dp_dataset_close(&r.ds);
    dp_resource_sampler_stop(sampler);
    dp_node_close(&r.node);
    dp_metrics_close(r.metrics);
    return rc;
}
