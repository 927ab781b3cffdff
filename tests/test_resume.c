/* Checkpoints are the training state: a run whose every process is killed
 * (SIGKILL, at a step that is no checkpoint boundary) and resumed with
 * --resume ends with weights bitwise equal to the uninterrupted run's, for
 * single, ps-sync (chief, 2 workers, 1 ps), model-avg and allreduce (2
 * replicas), with sgd and adam; ps-async resumes and reaches the fault-free
 * accuracy; the training options (weight decay, clipping, warm-up,
 * augmentation) resume bit for bit too.  And exact equalities between
 * strategies: ps-async with one worker is single, bitwise (sgd); model-avg
 * with --period 1 is ps-sync within float noise (sgd). */
#include "proc.h"

#define SMALL "--dataset mnist --model 784-64-10 --train-size 3000 --val-size 500 --test-size 1000 --epochs 3 " \
              "--batch 100 --log-every 0 --no-progress --threads 1"

static const char *bin, *tmp;
static char err[16384];

/* The training options of docs/training.md, all at once: weight decay,
 * clipping that binds, a warm-up, and augmentation drawn per record and
 * epoch. */
#define OPTIONS "--weight-decay 0.05 --clip-norm 0.5 --warmup-steps 20 --augment crop:2,flip"

/* Trains uninterrupted, then kills every process after step 33 (the
 * checkpoints fall every 7 steps, last at 28), resumes, and compares;
 * with_options adds OPTIONS. */
static void resume_is_exact_with(const char *name, const char *launch, const char *strategy,
                                 const char *optimizer, int with_options)
{
    char full[256], part[256];
    snprintf(full, sizeof full, "%s-%s-full.safetensors", name, optimizer);
    snprintf(part, sizeof part, "%s-%s-part.safetensors", name, optimizer);
    const char *args = with_options ? "--checkpoint-every 7 --lr-schedule cosine " OPTIONS
                                    : "--checkpoint-every 7 --lr-schedule cosine";
    int rc = run_cmd(err, sizeof err, "%s %s train --strategy %s --optimizer %s " SMALL
                     " %s --checkpoint-dir %s/%s-%s-a --save %s/%s",
                     bin, launch, strategy, optimizer, args, tmp, name, optimizer, tmp, full);
    CHECKF(rc == 0, "%s %s: the uninterrupted run exited %d: %s", name, optimizer, rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=33 %s %s train --strategy %s "
                 "--optimizer %s " SMALL " %s --checkpoint-dir %s/%s-%s-b --save %s/%s",
                 bin, launch, strategy, optimizer, args, tmp, name, optimizer, tmp, part);
    CHECKF(rc != 0, "%s %s: the run meant to be killed at step 33 exited 0", name, optimizer);
    char probe[1400];
    snprintf(probe, sizeof probe, "%s/%s-%s-b/ckpt-0000000028.safetensors", tmp, name, optimizer);
    FILE *f = fopen(probe, "rb");
    CHECKF(f != NULL, "%s %s: no checkpoint at step 28 before the kill", name, optimizer);
    if (f)
        fclose(f);
    rc = run_cmd(err, sizeof err, "%s %s train --strategy %s --optimizer %s " SMALL
                 " %s --checkpoint-dir %s/%s-%s-b --save %s/%s --resume",
                 bin, launch, strategy, optimizer, args, tmp, name, optimizer, tmp, part);
    CHECKF(rc == 0, "%s %s: the resumed run exited %d: %s", name, optimizer, rc, err);
    CHECKF(strstr(err, "ckpt-0000000028.safetensors (step 28)") != NULL,
           "%s %s: the resumed run does not say it resumed from step 28: %s", name, optimizer, err);
    CHECKF(same_file(full, part), "%s %s: the resumed run's weights differ from the "
           "uninterrupted run's (largest difference %g)", name, optimizer,
           checkpoint_max_diff(full, part));
}

static void resume_is_exact(const char *name, const char *launch, const char *strategy,
                            const char *optimizer)
{
    resume_is_exact_with(name, launch, strategy, optimizer, 0);
}

static double test_accuracy(const char *metrics)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, metrics);
    return done_accuracy(path);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    const char *ps = "launch --chief --workers 2 --ps 1 --";
    const char *optimizers[] = {"sgd", "adam"};
    for (int i = 0; i < 2; i++) {
        resume_is_exact("single", "", "single", optimizers[i]);
        resume_is_exact("ps-sync", ps, "ps-sync", optimizers[i]);
        resume_is_exact("allreduce", "launch --workers 2 --", "allreduce", optimizers[i]);
    }
    resume_is_exact("model-avg", ps, "model-avg --period 4", "adam");
    /* the training options: adamw's decay, clipping, the warm-up and the
     * augmentation's draws resume bit for bit */
    resume_is_exact_with("single-options", "", "single", "adamw", 1);
    resume_is_exact_with("ps-sync-options", ps, "ps-sync", "adamw", 1);
    resume_is_exact_with("allreduce-options", "launch --workers 2 --", "allreduce", "momentum", 1);
    /* and a checkpoint of a run with other options is refused, naming them */
    int rc0 = run_cmd(err, sizeof err, "%s train --optimizer adamw " SMALL " --checkpoint-every 7 "
                      "--lr-schedule cosine --weight-decay 0.05 --clip-norm 0.5 --warmup-steps 20 "
                      "--augment crop:3,flip --checkpoint-dir %s/single-options-adamw-b --resume",
                      bin, tmp);
    CHECKF(rc0 != 0 && strstr(err, "its augment=crop:2,flip, this run's augment=crop:3,flip"),
           "resuming with another --augment: %d %s", rc0, err);

    /* --resume with nothing to resume from starts fresh, and says so. */
    int rc = run_cmd(err, sizeof err, "%s train " SMALL " --epochs 1 --checkpoint-dir %s/empty "
                     "--resume", bin, tmp);
    CHECKF(rc == 0 && strstr(err, "starting fresh"), "resume from an empty directory: %d %s", rc,
           err);
    /* A checkpoint of another run is refused, naming what differs. */
    rc = run_cmd(err, sizeof err, "%s train " SMALL " --batch 50 --lr-schedule cosine --checkpoint-dir "
                 "%s/single-adam-b --resume", bin, tmp);
    CHECKF(rc != 0 && strstr(err, "belongs to another run: its batch is 100"),
           "resuming another run's checkpoint: %d %s", rc, err);

    /* ps-async resumes; arrival order makes it inexact, but it gets as far
     * (two fault-free runs differ by up to about 1 %: the bound is that). */
    const char *big = "--dataset mnist --model 784-64-10 --train-size 20000 --val-size 1000 "
                      "--epochs 2 --batch 100 --log-every 0 --no-progress --threads 1 "
                      "--checkpoint-every 40";
    rc = run_cmd(err, sizeof err, "%s %s train --strategy ps-async %s --checkpoint-dir %s/async-a "
                 "--metrics %s/async-a.jsonl", bin, ps, big, tmp, tmp);
    CHECKF(rc == 0, "ps-async: %s", err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=130 %s %s train --strategy ps-async "
                 "%s --checkpoint-dir %s/async-b", bin, ps, big, tmp);
    /* killed at the step, not failed some other way (that would leave no
     * checkpoint to resume from, and the resume check below would mislead) */
    CHECKF(rc != 0 && strstr(err, "killed by signal 9"),
           "ps-async: the run meant to be killed at step 130: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s %s train --strategy ps-async %s --checkpoint-dir %s/async-b "
                 "--metrics %s/async-b.jsonl --resume", bin, ps, big, tmp, tmp);
    CHECKF(rc == 0 && strstr(err, "(step 120)"), "ps-async resume: %d %s", rc, err);
    double a = test_accuracy("async-a.jsonl"), b = test_accuracy("async-b.jsonl");
    CHECKF(a > 0.9 && fabs(a - b) <= 0.01, "ps-async: fault-free test accuracy %.4f, resumed "
           "%.4f", a, b);

    /* ps-async with one worker is single, bitwise: the same gradients, the
     * same updates, only on the other side of a socket. */
    rc = run_cmd(err, sizeof err, "%s train --optimizer sgd " SMALL " --save %s/one.safetensors",
                 bin, tmp);
    CHECKF(rc == 0, "single: %s", err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 1 --ps 1 -- train --strategy "
                 "ps-async --optimizer sgd " SMALL " --save %s/one-ps.safetensors", bin, tmp);
    CHECKF(rc == 0, "ps-async, one worker: %s", err);
    CHECKF(checkpoint_max_diff("one.safetensors", "one-ps.safetensors") == 0,
           "ps-async with one worker differs from single by %g",
           checkpoint_max_diff("one.safetensors", "one-ps.safetensors"));

    /* Averaging after every sgd step is synchronous aggregation. */
    rc = run_cmd(err, sizeof err, "%s %s train --strategy ps-sync --optimizer sgd " SMALL
                 " --save %s/sync.safetensors", bin, ps, tmp);
    CHECKF(rc == 0, "ps-sync: %s", err);
    rc = run_cmd(err, sizeof err, "%s %s train --strategy model-avg --period 1 --optimizer sgd "
                 SMALL " --save %s/avg.safetensors", bin, ps, tmp);
    CHECKF(rc == 0, "model-avg: %s", err);
    double d = checkpoint_max_diff("sync.safetensors", "avg.safetensors");
    /* (the mean of p - lr g_i against p - lr mean(g_i): rounding apart, the
     * same; a missed or doubled worker would differ by 1e-2 and more) */
    CHECKF(d < 1e-4, "model-avg --period 1 differs from ps-sync by %g", d);
    return CHECK_DONE();
}
