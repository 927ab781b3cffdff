/* The presets under the cluster strategies, through the program
 * (docs/strategies.md, "The presets"):
 * - ps-sync with 2 workers at batch 4 on vit-mnist (no buffers) ends where
 *   one process at batch 8 ends over the same records, within float noise;
 *   one process at batch 4 does not (the check can fail);
 * - resnet-fashion, which has buffers, trains under ps-sync: with 1 worker
 *   it ends where one process at the same batch ends, parameters and running
 *   statistics, within float noise; with 2 workers the --save file holds
 *   worker 0's statistics (its count of batches: half the run's steps),
 *   and `downpour eval` of it gives the chief's test accuracy;
 * - batch norm under pipeline (each stage holds its bn layers' statistics;
 *   position 0 gathers them): resnet-fashion on 2 stages (cut between
 *   blocks) and mlp-bn cut by --split 3 (a bn layer on each stage) at 1
 *   micro-batch end where one process ends, parameters and running
 *   statistics, within float noise; mlp-bn at 2 micro-batches saves both
 *   stages' statistics (each bn layer counted 2 batches a step) and
 *   `downpour eval` of the file gives worker 0's test accuracy;
 * - lbfgs, which has no rule for buffers yet, refuses it before any task
 *   starts (exit 2), naming the reason and the strategies that take it;
 * - allreduce --sync-bn on vit-mnist, which has no bn, is refused likewise.
 * (allreduce --sync-bn on the presets against one process: test_sync_bn;
 * vit-mnist on 2 pipeline stages: test_pipeline.) */
#include "proc.h"

#define TINY "--dataset mnist --train-size 32 --val-size 8 --test-size 8 " \
             "--epochs 1 --optimizer sgd --lr 0.1 --threads 1 --no-progress --log-every 0"

static const char *bin, *tmp;
static char err[65536];

static void ps_sync_is_one_process(void)
{
    int rc = run_cmd(err, sizeof err, "%s train --model vit-mnist --batch 8 " TINY
                     " --save %s/single.st", bin, tmp);
    CHECKF(rc == 0, "vit-mnist, one process exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- train --strategy "
                 "ps-sync --model vit-mnist --batch 4 " TINY " --save %s/sync.st", bin, tmp);
    CHECKF(rc == 0, "vit-mnist, ps-sync exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --model vit-mnist --batch 4 " TINY
                 " --save %s/other.st", bin, tmp);
    CHECKF(rc == 0, "vit-mnist, one process at batch 4 exited %d: %s", rc, err);
    double d = checkpoint_max_diff("single.st", "sync.st");
    double other = checkpoint_max_diff("single.st", "other.st");
    fprintf(stderr, "vit-mnist: ps-sync 2 x 4 vs one process at 8: max |diff| %.3g; "
            "one process at 4 vs at 8: %.3g\n", d, other);
    CHECKF(d < 1e-5, "vit-mnist: ps-sync differs from one process at the summed batch by %g", d);
    CHECKF(other > 1e-3, "vit-mnist: batch 4 is as close to batch 8 (%g): the check cannot fail",
           other);
}

/* What follows the first `key` in text, to the end of its line, in out
 * (empty when there is none). */
static void line_after(const char *text, const char *key, char *out, size_t len)
{
    const char *p = strstr(text, key);
    out[0] = '\0';
    if (!p)
        return;
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    if (n >= len)
        n = len - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* resnet-fashion under ps-sync (docs/strategies.md, "Buffers"). */
static void ps_sync_trains_bn(void)
{
    int rc = run_cmd(err, sizeof err, "%s train --model resnet-fashion --batch 4 " TINY
                     " --save %s/rf-single.st", bin, tmp);
    CHECKF(rc == 0, "resnet-fashion, one process exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 1 --ps 1 -- train --strategy "
                 "ps-sync --model resnet-fashion --batch 4 " TINY " --save %s/rf-sync1.st",
                 bin, tmp);
    CHECKF(rc == 0, "resnet-fashion, ps-sync with 1 worker exited %d: %s", rc, err);
    double d = checkpoint_max_diff("rf-single.st", "rf-sync1.st");
    fprintf(stderr, "resnet-fashion: ps-sync 1 x 4 vs one process at 4: max |diff| %.3g "
            "(parameters and buffers)\n", d);
    CHECKF(d < 1e-6, "resnet-fashion: ps-sync with 1 worker differs from one process by %g", d);

    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- train --strategy "
                 "ps-sync --model resnet-fashion --batch 4 " TINY " --test-size 100 "
                 "--save %s/rf-sync2.st", bin, tmp);
    CHECKF(rc == 0, "resnet-fashion, ps-sync with 2 workers exited %d: %s", rc, err);
    char chief[64], eval[64];
    line_after(err, "[chief] Test accuracy: ", chief, sizeof chief);
    chief[strcspn(chief, ",")] = '\0';
    char path[1200];
    snprintf(path, sizeof path, "%s/rf-sync2.st", tmp);
    dp_safetensors *f = NULL;
    dp_err e;
    if (dp_safetensors_load(path, &f, &e) == 0) {
        /* 32 records at 2 x 4: worker 0 took 4 steps (one process: 8) */
        const dp_st_tensor *t = dp_safetensors_find(f, "layers.1.num_batches_tracked");
        CHECKF(t && t->ndim == 0 && t->data[0] == 4.0f,
               "ps-sync 2 x 4: num_batches_tracked %g, not worker 0's 4",
               t ? (double)t->data[0] : -1.0);
        dp_safetensors_free(f);
    } else {
        CHECKF(0, "%s", e.msg);
    }
    rc = run_cmd(err, sizeof err, "%s eval --checkpoint %s --test-size 100", bin, path);
    CHECKF(rc == 0, "eval of the ps-sync file exited %d: %s", rc, err);
    line_after(err, "test accuracy ", eval, sizeof eval);
    eval[strcspn(eval, ",")] = '\0';
    fprintf(stderr, "resnet-fashion: ps-sync 2 x 4: the chief's test accuracy %s, eval of its "
            "--save %s\n", chief, eval);
    CHECKF(chief[0] && strcmp(chief, eval) == 0,
           "eval of the ps-sync file gives test accuracy '%s', the chief reported '%s'", eval,
           chief);
}

/* num_batches_tracked of bn layer `layer` in tmp/name (-1: none). */
static double batches_tracked(const char *name, int layer)
{
    char path[1200], tensor[64];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    snprintf(tensor, sizeof tensor, "layers.%d.num_batches_tracked", layer);
    dp_safetensors *f = NULL;
    dp_err e;
    if (dp_safetensors_load(path, &f, &e) < 0) {
        CHECKF(0, "%s", e.msg);
        return -1;
    }
    const dp_st_tensor *t = dp_safetensors_find(f, tensor);
    double v = t && t->ndim == 0 ? t->data[0] : -1;
    dp_safetensors_free(f);
    return v;
}

/* Batch norm under pipeline (docs/strategies.md, "Buffers"); after
 * ps_sync_trains_bn, whose rf-single.st is one process at batch 4. */
static void pipeline_trains_bn(void)
{
    int rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline "
                     "--micro-batches 1 --model resnet-fashion --batch 4 " TINY
                     " --save %s/rf-pipe.st", bin, tmp);
    CHECKF(rc == 0, "resnet-fashion, pipeline of 2 exited %d: %s", rc, err);
    double d = checkpoint_max_diff("rf-single.st", "rf-pipe.st");
    fprintf(stderr, "resnet-fashion: 2 pipeline stages at 1 micro-batch vs one process: max "
            "|diff| %.3g (parameters and buffers)\n", d);
    CHECKF(d < 1e-6, "resnet-fashion: a pipeline of 2 differs from one process by %g", d);

    rc = run_cmd(err, sizeof err, "%s train --model mlp-bn --batch 8 " TINY
                 " --save %s/mb-single.st", bin, tmp);
    CHECKF(rc == 0, "mlp-bn, one process exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline --split 3 "
                 "--micro-batches 1 --model mlp-bn --batch 8 " TINY " --save %s/mb-pipe1.st",
                 bin, tmp);
    CHECKF(rc == 0, "mlp-bn, pipeline at 1 micro-batch exited %d: %s", rc, err);
    d = checkpoint_max_diff("mb-single.st", "mb-pipe1.st");
    fprintf(stderr, "mlp-bn: 2 pipeline stages at 1 micro-batch vs one process: max |diff| "
            "%.3g\n", d);
    CHECKF(d < 1e-6, "mlp-bn: a pipeline of 2 differs from one process by %g", d);

    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline --split 3 "
                 "--micro-batches 2 --model mlp-bn --batch 8 " TINY " --test-size 100 "
                 "--save %s/mb-pipe2.st", bin, tmp);
    CHECKF(rc == 0, "mlp-bn, pipeline at 2 micro-batches exited %d: %s", rc, err);
    char worker[64], eval[64];
    line_after(err, "[worker 0] Test accuracy: ", worker, sizeof worker);
    worker[strcspn(worker, ",")] = '\0';
    /* 32 records, 4 steps of 2 micro-batches: 8 batches on either stage */
    double b0 = batches_tracked("mb-pipe2.st", 1), b1 = batches_tracked("mb-pipe2.st", 3);
    CHECKF(b0 == 8 && b1 == 8, "pipeline M 2: num_batches_tracked %g (stage 0), %g (stage 1), "
           "not 8", b0, b1);
    char path[1200];
    snprintf(path, sizeof path, "%s/mb-pipe2.st", tmp);
    rc = run_cmd(err, sizeof err, "%s eval --checkpoint %s --test-size 100", bin, path);
    CHECKF(rc == 0, "eval of the pipeline file exited %d: %s", rc, err);
    line_after(err, "test accuracy ", eval, sizeof eval);
    eval[strcspn(eval, ",")] = '\0';
    fprintf(stderr, "mlp-bn: pipeline 2 stages x 2 micro-batches: worker 0's test accuracy %s, "
            "eval of its --save %s\n", worker, eval);
    CHECKF(worker[0] && strcmp(worker, eval) == 0,
           "eval of the pipeline file gives test accuracy '%s', worker 0 reported '%s'", eval,
           worker);
}

/* `downpour launch ARGS -- train OPTIONS` is refused by the launcher before
 * any task starts (exit 2, no task's line), with `reason` in its message. */
static void refused(const char *args, const char *options, const char *reason)
{
    int rc = run_cmd(err, sizeof err, "%s launch %s -- train %s " TINY, bin, args, options);
    CHECKF(rc == 2 && strstr(err, reason) && !strstr(err, "[worker 0]"),
           "launch %s -- train %s: exit %d, not refused with \"%s\": %s", args, options, rc,
           reason, err);
}

int main(void)
{
    require_mnist();
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    ps_sync_is_one_process();
    ps_sync_trains_bn();
    pipeline_trains_bn();
    refused("--chief --workers 2 --ps 1", "--strategy lbfgs --model resnet-fashion --batch 4",
            "model resnet-fashion has buffers (batch norm's running statistics)");
    CHECK(strstr(err, "these do: single, ps-async, ps-sync, ps-ssp, ps-dssp, model-avg, "
                      "allreduce, pipeline") != NULL);
    refused("--workers 2", "--strategy allreduce --sync-bn --model vit-mnist --batch 4",
            "--sync-bn: model vit-mnist has no batch norm layer");
    return CHECK_DONE();
}
