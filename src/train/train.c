#include "downpour/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/metrics.h"

/* Evaluation runs in chunks this large even when the training batch is small:
 * fewer, larger GEMMs. */
#define EVAL_CHUNK 500

dp_train_config dp_train_defaults(void)
{
    dp_train_config c;
    memset(&c, 0, sizeof c);
    c.dataset = "mnist";
    c.model = "mlp-300-100";
    c.strategy = "single";
    c.batch = 128;
    c.epochs = 25;
    c.optim = dp_optim_defaults(DP_OPTIM_ADAM);
    c.seed = 1;
    c.n_train = 54000;
    c.n_val = 6000;
    c.log_every = 100;
    c.task_label = "Worker 0";
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

static void draw_progress(int epoch, int epochs, uint32_t done, uint32_t total, double loss)
{
    int width = 30, filled = total ? (int)((double)done / total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[width] = '\0';
    fprintf(stderr, "\rEpoch %d/%d [%s] %u/%u loss %.4f ", epoch, epochs, bar, done, total, loss);
    fflush(stderr);
}

int dp_train_run(const dp_train_config *cfg, dp_train_result *res, dp_err *err)
{
    dp_dataset ds;
    dp_model m;
    dp_optim opt;
    dp_batcher batcher;
    dp_metrics *metrics = NULL;
    float *x = NULL;
    uint8_t *y = NULL;
    int rc = -1;
    memset(&ds, 0, sizeof ds);
    memset(&m, 0, sizeof m);
    memset(&opt, 0, sizeof opt);
    memset(&batcher, 0, sizeof batcher);
    memset(res, 0, sizeof *res);

    if (strcmp(cfg->strategy, "single") != 0)
        return dp_errf(err, "strategy '%s' is not available in a single process (valid: single)",
                       cfg->strategy);
    if (cfg->batch < 1 || cfg->epochs < 1)
        return dp_errf(err, "batch and epochs must be at least 1");
    if (cfg->threads > 0)
        dp_blas_set_threads(cfg->threads);

    if (dp_metrics_open(&metrics, cfg->metrics_path, err) < 0)
        return -1;
    if (dp_dataset_open(&ds, cfg->dataset, err) < 0)
        goto out;
    dp_split train, val;
    if (dp_dataset_split(&ds, cfg->n_train, cfg->n_val, &train, &val, err) < 0)
        goto out;
    int max_batch = cfg->batch > EVAL_CHUNK ? cfg->batch : EVAL_CHUNK;
    if (dp_model_init(&m, cfg->model, max_batch, err) < 0)
        goto out;
    if ((uint32_t)dp_model_inputs(&m) != train.dim) {
        dp_errf(err, "model %s takes %d inputs but dataset %s has %ux%u = %u pixels", m.name,
                dp_model_inputs(&m), cfg->dataset, ds.rows, ds.cols, train.dim);
        goto out;
    }
    if ((uint32_t)dp_model_classes(&m) < ds.classes) {
        dp_errf(err, "model %s has %d outputs but dataset %s has %u classes", m.name,
                dp_model_classes(&m), cfg->dataset, ds.classes);
        goto out;
    }
    dp_model_init_params(&m, cfg->seed);
    if (dp_optim_init(&opt, &cfg->optim, m.n_params, err) < 0)
        goto out;
    if (dp_batcher_init(&batcher, &train, cfg->seed, 1, DP_SHARD_OFF, 0, 1, err) < 0)
        goto out;
    x = malloc((size_t)max_batch * train.dim * sizeof *x);
    y = malloc((size_t)max_batch);
    if (!x || !y) {
        dp_errf(err, "out of memory for a batch of %d records", max_batch);
        goto out;
    }

    dp_info("Training %s (%zu parameters) on %s: %u train, %u validation, %u test records; "
            "batch %d, %d epochs, %s lr %g, %d BLAS thread(s) (%s)",
            m.name, m.n_params, cfg->dataset, train.n, val.n, ds.test.n, cfg->batch,
            cfg->epochs, dp_optim_kind_name(cfg->optim.kind), (double)cfg->optim.lr,
            dp_blas_threads(), dp_blas_info());

    uint32_t steps_per_epoch = dp_batcher_batches(&batcher, cfg->batch);
    long step = 0;
    double t_start = dp_now();
    double window_loss = 0, window_time = 0;
    long window_correct = 0, window_samples = 0, window_steps = 0;
    double epoch_loss = 0;
    for (int epoch = 0; epoch < cfg->epochs; epoch++) {
        double t_epoch = dp_now();
        double loss_sum = 0;
        long seen = 0;
        dp_batcher_start_epoch(&batcher, epoch);
        int n;
        while ((n = dp_batcher_next(&batcher, x, y, cfg->batch)) > 0) {
            double t0 = dp_now();
            int correct = 0;
            float loss = dp_model_forward_backward(&m, x, y, n, &correct);
            dp_optim_apply(&opt, m.params, m.grads);
            double dt = dp_now() - t0;
            step++;
            if (!isfinite(loss)) {
                dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                        (double)loss, step);
                goto out;
            }
            loss_sum += (double)loss * n;
            seen += n;
            window_loss += loss;
            window_correct += correct;
            window_samples += n;
            window_steps++;
            window_time += dt;
            if (cfg->log_every > 0 && step % cfg->log_every == 0) {
                if (cfg->progress)
                    fputc('\n', stderr);
                dp_info("%s, At step %ld, Cost: %.4f Accuracy: %.4f AvgTime: %.2fms",
                        cfg->task_label, step, window_loss / window_steps,
                        (double)window_correct / window_samples, window_time / window_steps * 1e3);
                window_loss = window_time = 0;
                window_correct = window_samples = window_steps = 0;
            }
            if (cfg->progress && (step % 10 == 0 || seen == (long)train.n))
                draw_progress(epoch + 1, cfg->epochs, (uint32_t)(seen / cfg->batch), steps_per_epoch,
                              loss_sum / seen);
        }
        if (cfg->progress)
            fputc('\n', stderr);
        epoch_loss = seen ? loss_sum / seen : 0;
        double val_loss;
        double val_acc = dp_evaluate(&m, &val, x, y, &val_loss);
        double secs = dp_now() - t_epoch;
        dp_info("Epoch %d/%d: train_loss %.4f, val_loss %.4f, val_accuracy %.4f, %.2f s", epoch + 1,
                cfg->epochs, epoch_loss, val_loss, val_acc, secs);
        dp_metrics_event(metrics, "epoch", DP_F_INT, "epoch", (long)epoch + 1, DP_F_NUM,
                         "val_accuracy", val_acc, DP_F_NUM, "val_loss", val_loss, DP_F_NUM,
                         "train_loss", epoch_loss, DP_F_NUM, "seconds", secs, DP_F_INT, "step",
                         step, DP_F_END);
        res->val_accuracy = val_acc;
    }
    res->train_seconds = dp_now() - t_start;
    res->steps = step;
    res->train_loss = epoch_loss;
    res->samples_per_second = (double)train.n * cfg->epochs / res->train_seconds;
    res->test_accuracy = dp_evaluate(&m, &ds.test, x, y, NULL);
    dp_info("Test accuracy: %.4f, training time: %.2f s (%.0f samples/s)", res->test_accuracy,
            res->train_seconds, res->samples_per_second);
    dp_metrics_event(metrics, "done", DP_F_NUM, "test_accuracy", res->test_accuracy, DP_F_NUM,
                     "train_seconds", res->train_seconds, DP_F_NUM, "samples_per_second",
                     res->samples_per_second, DP_F_STR, "strategy", cfg->strategy, DP_F_STR,
                     "model", m.name, DP_F_STR, "dataset", cfg->dataset, DP_F_INT, "batch",
                     (long)cfg->batch, DP_F_INT, "epochs", (long)cfg->epochs, DP_F_STR,
                     "optimizer", dp_optim_kind_name(cfg->optim.kind), DP_F_INT, "workers", 1L,
                     DP_F_INT, "ps", 0L, DP_F_END);
    if (cfg->save_path) {
        dp_ckpt_info info = {.step = step, .epoch = cfg->epochs, .strategy = cfg->strategy};
        if (dp_checkpoint_save(cfg->save_path, &m, &opt, &info, err) < 0)
            goto out;
        dp_info("Saved %s", cfg->save_path);
    }
    rc = 0;
out:
    free(x);
    free(y);
    dp_batcher_free(&batcher);
    dp_optim_free(&opt);
    dp_model_free(&m);
    dp_dataset_close(&ds);
    dp_metrics_close(metrics);
    return rc;
}
