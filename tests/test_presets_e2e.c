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
 *   statistics, bit for bit; mlp-bn at 2 micro-batches saves both
 *   stages' statistics (each bn layer counted 2 batches a step) and
 *   `downpour eval` of the file gives worker 0's test accuracy;
 * - lbfgs, which has no rule for buffers yet, refuses it before any task
 *   starts (exit 2), naming the reason and the strategies that take it;
 * - allreduce --sync-bn on vit-mnist, which has no bn, is refused likewise,
 *   and --sync-bn with --device, and pipeline on a device;
 * - model parallelism (the model-parallel strategy, or ps-async
 *   --model-parallel K) on vit-mnist (pos, mha, ln) and resnet-fashion (bn,
 *   res) is refused likewise, naming the layer and its kind's reason; so is
 *   --model-parallel under a strategy that does not take it; and `train`
 *   alone refuses it too (exit 2), before it looks for its cluster.
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

/* The files tmp/a and tmp/b hold the same tensors, parameters and buffers,
 * within `tol` (0: bit for bit). */
static void same_within(const char *a, const char *b, double tol, const char *what)
{
    double d = checkpoint_max_diff(a, b);
    fprintf(stderr, "%s: max |diff| %.3g (parameters and buffers)\n", what, d);
    CHECKF(d <= tol, "%s: %s and %s differ by %g", what, a, b, d);
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

/* The accuracy the run whose output is in err reported after `key`
 * equals what `downpour eval` of its file tmp/name gives on the same test
 * records (--test-size 100). */
static void eval_gives_reported(const char *key, const char *name, const char *what)
{
    char reported[64], eval[64], path[1200];
    line_after(err, key, reported, sizeof reported);
    reported[strcspn(reported, ",")] = '\0';
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    int rc = run_cmd(err, sizeof err, "%s eval --checkpoint %s --test-size 100", bin, path);
    CHECKF(rc == 0, "%s: eval of %s exited %d: %s", what, name, rc, err);
    line_after(err, "test accuracy ", eval, sizeof eval);
    eval[strcspn(eval, ",")] = '\0';
    fprintf(stderr, "%s: reported test accuracy %s, eval of its --save %s\n", what, reported,
            eval);
    CHECKF(reported[0] && strcmp(reported, eval) == 0,
           "%s: eval of %s gives test accuracy '%s', the run reported '%s'", what, name, eval,
           reported);
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
    same_within("rf-single.st", "rf-sync1.st", 1e-6,
                "resnet-fashion: ps-sync 1 x 4 vs one process at 4");

    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- train --strategy "
                 "ps-sync --model resnet-fashion --batch 4 " TINY " --test-size 100 "
                 "--save %s/rf-sync2.st", bin, tmp);
    CHECKF(rc == 0, "resnet-fashion, ps-sync with 2 workers exited %d: %s", rc, err);
    eval_gives_reported("[chief] Test accuracy: ", "rf-sync2.st",
                        "resnet-fashion: ps-sync 2 x 4");
    /* 32 records at 2 x 4: worker 0 took 4 steps (one process: 8) */
    double b = batches_tracked("rf-sync2.st", 1);
    CHECKF(b == 4, "ps-sync 2 x 4: num_batches_tracked %g, not worker 0's 4", b);
}

/* Batch norm under pipeline (docs/strategies.md, "Buffers"); after
 * ps_sync_trains_bn, whose rf-single.st is one process at batch 4. */
static void pipeline_trains_bn(void)
{
    int rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline "
                     "--micro-batches 1 --model resnet-fashion --batch 4 " TINY
                     " --save %s/rf-pipe.st", bin, tmp);
    CHECKF(rc == 0, "resnet-fashion, pipeline of 2 exited %d: %s", rc, err);
    same_within("rf-single.st", "rf-pipe.st", 0,
                "resnet-fashion: 2 pipeline stages at 1 micro-batch vs one process");

    rc = run_cmd(err, sizeof err, "%s train --model mlp-bn --batch 8 " TINY
                 " --save %s/mb-single.st", bin, tmp);
    CHECKF(rc == 0, "mlp-bn, one process exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline --split 3 "
                 "--micro-batches 1 --model mlp-bn --batch 8 " TINY " --save %s/mb-pipe1.st",
                 bin, tmp);
    CHECKF(rc == 0, "mlp-bn, pipeline at 1 micro-batch exited %d: %s", rc, err);
    same_within("mb-single.st", "mb-pipe1.st", 0,
                "mlp-bn: 2 pipeline stages at 1 micro-batch vs one process");

    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline --split 3 "
                 "--micro-batches 2 --model mlp-bn --batch 8 " TINY " --test-size 100 "
                 "--save %s/mb-pipe2.st", bin, tmp);
    CHECKF(rc == 0, "mlp-bn, pipeline at 2 micro-batches exited %d: %s", rc, err);
    eval_gives_reported("[worker 0] Test accuracy: ", "mb-pipe2.st",
                        "mlp-bn: pipeline 2 stages x 2 micro-batches");
    /* 32 records, 4 steps of 2 micro-batches: 8 batches on either stage */
    double b0 = batches_tracked("mb-pipe2.st", 1), b1 = batches_tracked("mb-pipe2.st", 3);
    CHECKF(b0 == 8 && b1 == 8, "pipeline M 2: num_batches_tracked %g (stage 0), %g (stage 1), "
           "not 8", b0, b1);
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
    refused("--workers 2", "--strategy allreduce --sync-bn --device sim --model resnet-fashion "
            "--batch 4", "--sync-bn: not with --device yet");
    refused("--workers 2", "--strategy pipeline --device sim --model vit-mnist --batch 4",
            "--device sim: strategy pipeline trains on the CPU only");
    refused("--workers 2", "--strategy model-parallel --model vit-mnist --batch 4",
            "--model-parallel 2: layer 1 of vit-mnist is pos, which model parallelism does not "
            "split: its (T, D) parameter would be needed whole on every task");
    refused("--chief --workers 1", "--strategy model-parallel --model=resnet-fashion --batch 4",
            "--model-parallel 2: layer 1 of resnet-fashion is bn, which model parallelism does "
            "not split: its statistics span every row of the batch");
    refused("--workers 2 --ps 2",
            "--strategy ps-async --model-parallel 2 --model resnet-fashion --batch 4",
            "layer 1 of resnet-fashion is bn, which model parallelism does not split");
    refused("--workers 2 --ps 2", "--strategy ps-async --model-parallel=2 --model vit-mnist "
            "--batch 4", "layer 1 of vit-mnist is pos, which model parallelism does not split");
    refused("--workers 2", "--strategy allreduce --model-parallel 2 --model vit-mnist --batch 4",
            "--model-parallel is for --strategy model-parallel, or ps-async");
    /* train alone: K is not known yet, the layer's rule is */
    int rc = run_cmd(err, sizeof err, "%s train --strategy model-parallel --model vit-mnist "
                     "--batch 4 " TINY, bin);
    CHECKF(rc == 2 && strstr(err, "--strategy model-parallel: layer 1 of vit-mnist is pos, "
                                  "which model parallelism does not split"),
           "train --strategy model-parallel --model vit-mnist: exit %d: %s", rc, err);
    return CHECK_DONE();
}
