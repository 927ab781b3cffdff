/* Batch norm's buffers through the program (docs/strategies.md, "Buffers"):
 * a run whose every process is killed at step 33 (checkpoints every 7
 * steps) and resumed ends with weights AND running statistics bitwise equal
 * to the uninterrupted run's, for single (on the CPU and on the sim device)
 * and allreduce (2 replicas), with bn after a dense layer, after a conv and
 * inside residual blocks; the --save file holds the buffers
 * under PyTorch's names; the same for ps-sync with 2 workers (its file
 * holds worker 0's statistics, sent to the chief at each checkpoint); the
 * other parameter-server strategies and model-avg train a bn model and
 * save worker 0's statistics (its count of batches); lbfgs, without a rule
 * for buffers, refuses the model before training, naming the strategies
 * that take it; allreduce --sync-bn
 * over TCP (2 replicas at batch b) ends where one process at batch 2b ends,
 * weights and buffers, within float noise, and without the flag it does not. */
#include "proc.h"

#define SMALL "--dataset mnist --train-size 3000 --val-size 500 --test-size 1000 --epochs 3 --batch 100 " \
              "--log-every 0 --no-progress --threads 1"

static const char *bin, *tmp;
static char err[16384];

static void resume_is_exact(const char *name, const char *launch, const char *strategy,
                            const char *model, float steps)
{
    char full[256], part[256];
    snprintf(full, sizeof full, "%s-full.safetensors", name);
    snprintf(part, sizeof part, "%s-part.safetensors", name);
    int rc = run_cmd(err, sizeof err, "%s %s train --strategy %s --model '%s' " SMALL
                     " --checkpoint-every 7 --checkpoint-dir %s/%s-a --save %s/%s",
                     bin, launch, strategy, model, tmp, name, tmp, full);
    CHECKF(rc == 0, "%s: the uninterrupted run exited %d: %s", name, rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=33 %s %s train --strategy %s "
                 "--model '%s' " SMALL
                 " --checkpoint-every 7 --checkpoint-dir %s/%s-b --save %s/%s",
                 bin, launch, strategy, model, tmp, name, tmp, part);
    CHECKF(rc != 0, "%s: the run meant to be killed at step 33 exited 0", name);
    rc = run_cmd(err, sizeof err, "%s %s train --strategy %s --model '%s' " SMALL
                 " --checkpoint-every 7 --checkpoint-dir %s/%s-b --save %s/%s --resume",
                 bin, launch, strategy, model, tmp, name, tmp, part);
    CHECKF(rc == 0, "%s: the resumed run exited %d: %s", name, rc, err);
    CHECKF(strstr(err, "ckpt-0000000028.safetensors (step 28)") != NULL,
           "%s: the resumed run does not say it resumed from step 28: %s", name, err);
    CHECKF(same_file(full, part), "%s: the resumed run's weights or buffers differ from the "
           "uninterrupted run's", name);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, full);
    dp_safetensors *f = NULL;
    dp_err e;
    if (dp_safetensors_load(path, &f, &e) == 0) {
        const dp_st_tensor *t = dp_safetensors_find(f, "layers.1.num_batches_tracked");
        /* 3 epochs of 30 steps; with 2 replicas (workers) each takes half the
         * records: the writer's own count */
        CHECKF(t && t->ndim == 0 && t->data[0] == steps, "%s: num_batches_tracked %g, not %g",
               name, t ? (double)t->data[0] : -1.0, (double)steps);
        CHECKF(dp_safetensors_find(f, "layers.1.running_var") != NULL, "%s: no running_var",
               name);
        dp_safetensors_free(f);
    } else {
        CHECKF(0, "%s", e.msg);
    }
    printf("%s: resumed at step 28, weights and bn buffers bit-exact\n", name);
}

/* allreduce through downpour launch (TCP) with and without --sync-bn against
 * one process at the summed batch. */
static void sync_bn_over_tcp(void)
{
#define TINY "--dataset mnist --model 784-dense32-bn-relu-10 --train-size 1000 --val-size 0 " \
             "--test-size 100 --epochs 1 --optimizer sgd --lr 0.1 --log-every 0 --no-progress " \
             "--threads 1"
    int rc = run_cmd(err, sizeof err, "%s train --batch 100 " TINY " --save %s/sb1.st", bin, tmp);
    CHECKF(rc == 0, "one process exited %d: %s", rc, err);
    const char *flag[2] = {"", "--sync-bn"};
    double d[2];
    for (int k = 0; k < 2; k++) {
        rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy allreduce "
                     "--batch 50 %s " TINY " --save %s/sb2-%d.st", bin, flag[k], tmp, k);
        CHECKF(rc == 0, "allreduce %s exited %d: %s", flag[k], rc, err);
        char name[32];
        snprintf(name, sizeof name, "sb2-%d.st", k);
        d[k] = checkpoint_max_diff("sb1.st", name);
        fprintf(stderr, "allreduce 2 x 50 %s vs one process at 100: max |diff| %.3g\n", flag[k],
                d[k]);
    }
    CHECKF(d[1] < 1e-5, "allreduce --sync-bn differs from one process by %g", d[1]);
    CHECKF(d[0] > 1e-3, "allreduce without --sync-bn is as close (%g): the check cannot fail",
           d[0]);
#undef TINY
}

/* The other parameter-server strategies and model-avg with 2 workers: the
 * run trains and its --save file holds worker 0's statistics (2 epochs of
 * 64 records at 2 x 8: 8 batches), not the chief's initial ones. */
static void ps_family_saves_worker0(void)
{
    static const char *const strategies[] = {"ps-async", "ps-ssp", "ps-dssp", "model-avg"};
    for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++) {
        int rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- train "
                         "--strategy %s --model 784-dense8-bn-10 --dataset mnist --train-size 64 "
                         "--val-size 16 --test-size 16 --epochs 2 --batch 8 --period 2 "
                         "--log-every 0 --no-progress --threads 1 --save %s/fam-%zu.st",
                         bin, strategies[i], tmp, i);
        CHECKF(rc == 0, "%s with bn exited %d: %s", strategies[i], rc, err);
        char path[1200];
        snprintf(path, sizeof path, "%s/fam-%zu.st", tmp, i);
        dp_safetensors *f = NULL;
        dp_err e;
        if (dp_safetensors_load(path, &f, &e) < 0) {
            CHECKF(0, "%s: %s", strategies[i], e.msg);
            continue;
        }
        const dp_st_tensor *t = dp_safetensors_find(f, "layers.1.num_batches_tracked");
        const dp_st_tensor *mean = dp_safetensors_find(f, "layers.1.running_mean");
        CHECKF(t && t->ndim == 0 && t->data[0] == 8.0f,
               "%s: num_batches_tracked %g, not worker 0's 8", strategies[i],
               t ? (double)t->data[0] : -1.0);
        CHECKF(mean && mean->data[0] != 0.0f, "%s: running_mean is the initial 0",
               strategies[i]);
        dp_safetensors_free(f);
    }
    printf("ps-async, ps-ssp, ps-dssp, model-avg: the --save file holds worker 0's bn "
           "statistics\n");
}

int main(void)
{
    require_mnist();
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    resume_is_exact("single-dense", "", "single", "784-dense64-bn-relu-10", 90);
    resume_is_exact("single-conv", "", "single",
                    "1x28x28-conv5x5x8s2-bn-relu-maxpool2-dense32-bn-relu-10", 90);
    resume_is_exact("sim", "", "single --device sim",
                    "1x28x28-conv5x5x8s2-bn-relu-maxpool2-dense32-bn-relu-10", 90);
    resume_is_exact("allreduce", "launch --workers 2 --", "allreduce", "784-dense64-bn-relu-10",
                    45);
    resume_is_exact("ps-sync", "launch --chief --workers 2 --ps 1 --", "ps-sync",
                    "784-dense64-bn-relu-10", 45);
    if (!SANITIZED) /* residual blocks with bn inside, identity and projection */
        resume_is_exact("residual", "", "single",
                        "1x28x28-conv5x5x8s2-bn-relu-maxpool2"
                        "-res(conv3x3x8p1-bn-relu-conv3x3x8p1-bn)-relu"
                        "-res(conv3x3x16s2p1-bn|conv1x1x16s2-bn)-relu-gap-10", 90);
    sync_bn_over_tcp();
    ps_family_saves_worker0();
    int rc = run_cmd(err, sizeof err, "%s launch --chief --workers 1 --ps 1 -- train --strategy "
                     "lbfgs --model 784-dense8-bn-10 " SMALL, bin);
    /* refused by the launcher, before any task starts (exit 2, no task line) */
    CHECKF(rc == 2 && strstr(err, "downpour launch: model 784-dense8-bn-10 has buffers") &&
               strstr(err, "single, ps-async, ps-sync, ps-ssp, ps-dssp, model-avg, allreduce, "
                           "pipeline") &&
               !strstr(err, "[worker 0]"),
           "lbfgs with bn: exit %d: %s", rc, err);
    return CHECK_DONE();
}
