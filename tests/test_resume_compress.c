/* allreduce with a lossy --compress resumes bit for bit (docs/checkpoints.md,
 * "What resumes bit for bit"): every replica's error-feedback residual is in
 * the checkpoint (replica.{p}.residual) and each replica takes its own back.
 * A run of 2 replicas killed after step 33 (checkpoints every 7, the last at
 * 28) and resumed ends with the uninterrupted run's weights, byte for byte,
 * with topk and bf16.  The residuals matter: the same checkpoint with them
 * zeroed, or swapped between the replicas, resumes to other weights.  A
 * damaged residual fails the checkpoint's checksum (set aside, the older
 * one resumes, still exactly); a missing or misshapen one (checksum made
 * good) is refused naming the file and the tensor; a checkpoint of another
 * --compress, or of none, is refused naming both.
 * powersgd too: its residuals and its warm-start Q (allreduce.powersgd_q)
 * resume bit for bit; with the Q zeroed the weights differ, and a file
 * without it is refused naming it.
 * --compress auto on a fake slow link (DOWNPOUR_TEST_LINK_NS=80) takes
 * powersgd at open; the checkpoint holds its warm start (and the rank),
 * and the run resumed without the fake link takes the checkpoint's choice
 * (its metrics say so), not a new measurement: bit for bit the same as
 * the killed run resumed from its oldest checkpoint (the rank is measured,
 * and another run may take another); with its Q zeroed
 * (the rank in its last float with it) it is refused, naming the file.
 * The parameter-server family the same way (docs/checkpoints.md,
 * "Compression residuals"): ps-sync (chief, 2 workers, 1 ps) with topk
 * pushes and bf16 answers (--ps-reply bf16) killed and resumed ends with
 * the uninterrupted run's bytes, each worker's residual in the file; so
 * does it with top-k and 4-bit answers (--ps-reply topk:0.05, delta4: at
 * each checkpoint the workers take the parameters whole, as resumed ones
 * start); one worker's
 * residual shortened is refused naming the file and the tensor.
 * The ps family's --compress auto (ps_auto_resume_is_exact): each worker's
 * choice, measured on a fake slow link (DOWNPOUR_TEST_LINK_NS=1000), is in
 * the checkpoint (strategy_state ps_auto=...); resumed at step 28 without
 * the fake link every worker takes it (its compress event says so) and the
 * run ends with the bytes of the killed run resumed from its oldest
 * checkpoint; a choice auto does not take, none, or another count is
 * refused naming the file and the field; a slot without one (-) takes the
 * lowest slot's. */
#include "downpour/crc32c.h"
#include "proc.h"

#define SMALL "--dataset mnist --model 784-64-10 --train-size 3000 --val-size 500 " \
              "--test-size 1000 --epochs 3 --batch 100 --log-every 0 --no-progress --threads 1 " \
              "--checkpoint-every 7 --lr-schedule cosine"
#define LAUNCH "launch --workers 2 -- train --strategy allreduce"
#define CKPT "ckpt-0000000028.safetensors"

static const char *bin, *tmp;
static const char *launch = LAUNCH; /* or PS_LAUNCH */
#define PS_LAUNCH "launch --chief --workers 2 --ps 1 -- train --strategy ps-sync --ps-reply bf16"
/* coded answers: the servers' mirrors of each worker's copy, which a checkpoint makes whole */
#define PS_LAUNCH_TOPK "launch --chief --workers 2 --ps 1 -- train --strategy ps-sync --ps-reply topk:0.05"
#define PS_LAUNCH_D4 "launch --chief --workers 2 --ps 1 -- train --strategy ps-sync --ps-reply delta4"
#define PS_LAUNCH_AUTO "launch --chief --workers 2 --ps 1 -- train --strategy ps-sync"
static char err[16384];
static const char *first_env = ""; /* before the runs that resume_is_exact resumes */

/* The metadata keys in the order the writer adds them (checkpoint.c). */
static const char *const keys[] = {
    "format", "model", "model_name", "step", "epoch", "optimizer_t", "best_accuracy", "best_epoch",
    "strategy", "dataset", "optimizer", "lr", "lr_schedule", "workers", "ps", "batch", "seed",
    "train_size", "val_size", "steps_per_epoch", "epochs", "settings", "strategy_state"};
#define N_KEYS (sizeof keys / sizeof keys[0])

typedef enum { ZERO, SWAP, DROP, SHORTEN, ZERO_Q, DROP_Q, STATE } edit;
static const char *new_state; /* STATE: strategy_state's new value (NULL: none) */

/* Rewrites dir/CKPT with its residuals edited and the checksum made good
 * again, as the writer computes it: a file the reader trusts. */
static void rewrite(const char *dir, edit how)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s/" CKPT, tmp, dir);
    dp_safetensors *f = NULL;
    dp_err e;
    REQUIRE(dp_safetensors_load(path, &f, &e) == 0);
    int n = dp_safetensors_count(f), k = 0;
    dp_st_tensor *t = calloc((size_t)n, sizeof *t);
    const dp_st_tensor *r0 = dp_safetensors_find(f, "replica.0.residual");
    const dp_st_tensor *r1 = dp_safetensors_find(f, "replica.1.residual");
    REQUIRE(t && r0 && r1);
    size_t len = (size_t)r0->shape[0];
    float *zeros = calloc(len, sizeof *zeros);
    REQUIRE(zeros);
    for (int i = 0; i < n; i++) {
        dp_st_tensor x = *dp_safetensors_at(f, i);
        int is0 = strcmp(x.name, "replica.0.residual") == 0;
        int is1 = strcmp(x.name, "replica.1.residual") == 0;
        int isq = strcmp(x.name, "allreduce.powersgd_q") == 0;
        if ((is1 && how == DROP) || (isq && how == DROP_Q))
            continue;
        if (isq && how == ZERO_Q)
            x.data = zeros;
        if ((is0 || is1) && how == ZERO)
            x.data = zeros;
        if ((is0 || is1) && how == SWAP)
            x.data = is0 ? r1->data : r0->data;
        if (is1 && how == SHORTEN)
            x.shape[0] = (int64_t)len - 1;
        t[k++] = x;
    }
    dp_st_meta meta[N_KEYS + 1];
    uint32_t crc = 0;
    int m = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *v = dp_safetensors_meta(f, keys[i]);
        if (how == STATE && strcmp(keys[i], "strategy_state") == 0)
            v = new_state;
        if (!v)
            continue;
        meta[m++] = (dp_st_meta){keys[i], v};
        crc = dp_crc32c(crc, keys[i], strlen(keys[i]) + 1);
        crc = dp_crc32c(crc, v, strlen(v) + 1);
    }
    for (int i = 0; i < k; i++) {
        size_t floats = 1;
        for (int d = 0; d < t[i].ndim; d++)
            floats *= (size_t)t[i].shape[d];
        crc = dp_crc32c(crc, t[i].name, strlen(t[i].name) + 1);
        crc = dp_crc32c(crc, t[i].data, floats * sizeof(float));
    }
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", crc);
    meta[m++] = (dp_st_meta){"crc32c", hex};
    CHECKF(dp_safetensors_save(path, t, k, meta, m, &e) == 0, "%s", e.msg);
    free(zeros);
    free(t);
    dp_safetensors_free(f);
}

/* Flips one bit inside replica.1.residual's bytes of dir/CKPT, checksum
 * left as it was. */
static void damage(const char *dir)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s/" CKPT, tmp, dir);
    dp_safetensors *f = NULL;
    dp_err e;
    REQUIRE(dp_safetensors_load(path, &f, &e) == 0);
    const dp_st_tensor *r1 = dp_safetensors_find(f, "replica.1.residual");
    REQUIRE(r1);
    size_t len = 0;
    char *bytes = slurp(path, &len);
    REQUIRE(bytes);
    /* its middle 64 bytes, found in the file */
    const char *probe = (const char *)(r1->data + r1->shape[0] / 2);
    char *at = memmem(bytes, len, probe, 64);
    REQUIRE(at);
    at[0] ^= 0x10;
    FILE *out = fopen(path, "wb");
    REQUIRE(out && fwrite(bytes, 1, len, out) == len);
    fclose(out);
    free(bytes);
    dp_safetensors_free(f);
}

/* Both replicas' residuals are in the checkpoint, not zero, and not the
 * same: each replica's own. */
static void holds_residuals(const char *dir)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s/" CKPT, tmp, dir);
    dp_safetensors *f = NULL;
    dp_err e;
    REQUIRE(dp_safetensors_load(path, &f, &e) == 0);
    const dp_st_tensor *r0 = dp_safetensors_find(f, "replica.0.residual");
    const dp_st_tensor *r1 = dp_safetensors_find(f, "replica.1.residual");
    CHECKF(r0 && r1 && !dp_safetensors_find(f, "replica.2.residual") && r0->ndim == 1 &&
               r1->ndim == 1 && r0->shape[0] == 784 * 64 + 64 + 64 * 10 + 10 &&
               r1->shape[0] == r0->shape[0],
           "%s: not two residuals of every parameter", path);
    if (r0 && r1) {
        size_t nz0 = 0, nz1 = 0, n = (size_t)r0->shape[0];
        for (size_t i = 0; i < n; i++) {
            nz0 += r0->data[i] != 0;
            nz1 += r1->data[i] != 0;
        }
        CHECKF(nz0 > n / 10 && nz1 > n / 10, "%s: residuals of %zu and %zu nonzero of %zu",
               path, nz0, nz1, n);
        CHECKF(memcmp(r0->data, r1->data, n * sizeof(float)) != 0,
               "%s: both replicas' residuals are the same", path);
    }
    dp_safetensors_free(f);
}

/* Resumes dir (saving to save, its metrics to save.jsonl) with --compress
 * kind; returns the exit. */
static int resume(const char *kind, const char *dir, const char *save)
{
    return run_cmd(err, sizeof err, "%s %s " SMALL " --compress %s --checkpoint-dir %s/%s "
                   "--save %s/%s --metrics %s/%s.jsonl --resume", bin, launch, kind, tmp, dir,
                   tmp, save, tmp, save);
}

/* Trains killed after step 33 (checkpoints at 14, 21 and 28 kept) into
 * name-b and copies that directory to name-0 .. name-{copies-1}. */
static void killed_run(const char *name, const char *kind, int copies)
{
    int rc = run_cmd(err, sizeof err, "%sDOWNPOUR_FAULT_KILL_AT_STEP=33 %s %s " SMALL
                     " --compress %s --checkpoint-dir %s/%s-b --save %s/%s-part.safetensors",
                     first_env, bin, launch, kind, tmp, name, tmp, name);
    CHECKF(rc != 0 && strstr(err, "killed by signal 9"),
           "%s: the run meant to be killed at step 33: %d %s", name, rc, err);
    char dir[256];
    snprintf(dir, sizeof dir, "%s-b", name);
    holds_residuals(dir);
    for (int i = 0; i < copies; i++) {
        rc = run_cmd(err, sizeof err, "cp -r %s/%s-b %s/%s-%d", tmp, name, tmp, name, i);
        REQUIRE(rc == 0);
    }
}

/* Resumes name-b from step 28 into name-part and compares it with full. */
static void resumed_matches(const char *name, const char *kind, const char *full)
{
    char part[256], dir[256];
    snprintf(part, sizeof part, "%s-part.safetensors", name);
    snprintf(dir, sizeof dir, "%s-b", name);
    int rc = resume(kind, dir, part);
    CHECKF(rc == 0 && strstr(err, CKPT " (step 28)"), "%s: the resumed run: %d %s", name, rc,
           err);
    CHECKF(same_file(full, part), "%s: the resumed run's weights differ from the uninterrupted "
           "run's (largest difference %g)", name, checkpoint_max_diff(full, part));
}

/* Trains uninterrupted and killed after step 33, copies the directory of
 * the killed run for each later case, resumes it and compares. */
static void resume_is_exact(const char *name, const char *kind, int copies)
{
    char full[256];
    snprintf(full, sizeof full, "%s-full.safetensors", name);
    int rc = run_cmd(err, sizeof err, "%s%s %s " SMALL " --compress %s --checkpoint-dir "
                     "%s/%s-a --save %s/%s", first_env, bin, launch, kind, tmp, name, tmp, full);
    CHECKF(rc == 0, "%s: the uninterrupted run exited %d: %s", name, rc, err);
    killed_run(name, kind, copies);
    resumed_matches(name, kind, full);
}

/* --compress auto's choice is a measurement: two runs on a loaded machine
 * may take different ranks, so the run it is compared with is the killed
 * one itself, resumed from its oldest checkpoint (step 14) with the
 * checkpoints after it removed: it goes on uninterrupted through 21 and 28
 * with the choice the checkpoint holds, as the one resumed at 28 must. */
static void auto_resume_is_exact(void)
{
    killed_run("auto", "auto", 3);
    first_env = "";
    int rc = run_cmd(err, sizeof err, "rm %s/auto-2/ckpt-0000000021.safetensors %s/auto-2/" CKPT,
                     tmp, tmp);
    REQUIRE(rc == 0);
    rc = resume("auto", "auto-2", "auto-full.safetensors");
    CHECKF(rc == 0 && strstr(err, "ckpt-0000000014.safetensors (step 14)"),
           "auto: the run resumed from step 14: %d %s", rc, err);
    resumed_matches("auto", "auto", "auto-full.safetensors");
}

/* The ps family's --compress auto (docs/checkpoints.md, "Compression
 * residuals"): each worker's choice, measured on the fake slow link, is in
 * the checkpoint (strategy_state ps_auto=...), and the run resumed without
 * the fake link takes it: every worker says so in its metrics, and the
 * weights are the killed run's resumed from its oldest checkpoint, bit for
 * bit (as auto_resume_is_exact: no second measurement compared).  A choice
 * auto does not take, none, or the wrong count of them is refused naming
 * the file and the field. */
static void ps_auto_resume_is_exact(void)
{
    launch = PS_LAUNCH_AUTO;
    first_env = "DOWNPOUR_TEST_LINK_NS=1000 ";
    killed_run("ps-auto", "auto", 5);
    first_env = "";
    char path[1400];
    snprintf(path, sizeof path, "%s/ps-auto-b/" CKPT, tmp);
    dp_safetensors *f = NULL;
    dp_err e;
    REQUIRE(dp_safetensors_load(path, &f, &e) == 0);
    const char *state = dp_safetensors_meta(f, "strategy_state");
    char took[2][64] = {"(none)", "(none)"};
    CHECKF(state && sscanf(state, "ps_auto=%63[^,],%63s", took[0], took[1]) == 2,
           "%s: strategy_state %s", path, state ? state : "(missing)");
    dp_safetensors_free(f);
    int rc = run_cmd(err, sizeof err, "rm %s/ps-auto-2/ckpt-0000000021.safetensors "
                     "%s/ps-auto-2/" CKPT, tmp, tmp);
    REQUIRE(rc == 0);
    rc = resume("auto", "ps-auto-2", "ps-auto-full.safetensors");
    CHECKF(rc == 0 && strstr(err, "ckpt-0000000014.safetensors (step 14)"),
           "ps auto: the run resumed from step 14: %d %s", rc, err);
    resumed_matches("ps-auto", "auto", "ps-auto-full.safetensors");
    /* each worker took the checkpoint's choice, its own slot's */
    snprintf(path, sizeof path, "%s/ps-auto-part.safetensors.jsonl", tmp);
    for (int w = 0; w < 2; w++) {
        char task[32], want[256];
        snprintf(task, sizeof task, "worker:%d", w);
        if (strcmp(took[w], "none") == 0)
            snprintf(want, sizeof want, "auto: none (the checkpoint's choice)");
        else
            snprintf(want, sizeof want, "auto: %s pushes, 4-bit answers (the checkpoint's choice)",
                     took[w]);
        cJSON *ev = last_event(path, "compress", task);
        const char *said = ev ? json_str(ev, "compress") : "(no compress event)";
        CHECKF(strcmp(said, want) == 0, "ps auto, %s resumed: %s; the checkpoint's %s", task,
               said, took[w]);
        cJSON_Delete(ev);
    }
    /* refused, naming the file and the field */
    new_state = "ps_auto=topk:0.1,topk:0.3";
    rewrite("ps-auto-0", STATE);
    rc = resume("auto", "ps-auto-0", "ps-auto-bad.safetensors");
    CHECKF(rc != 0 && strstr(err, "ps-auto-0/" CKPT ": metadata 'strategy_state', 'ps_auto': "
                                  "worker 1's choice 'topk:0.3' is not one --compress auto takes"),
           "ps auto, a choice it does not take: %d %s", rc, err);
    new_state = NULL;
    rewrite("ps-auto-1", STATE);
    rc = resume("auto", "ps-auto-1", "ps-auto-none.safetensors");
    CHECKF(rc != 0 && strstr(err, "ps-auto-1/" CKPT ": --compress auto, but metadata "
                                  "'strategy_state' holds no 'ps_auto'"),
           "ps auto, no choice: %d %s", rc, err);
    new_state = "ps_auto=none";
    rewrite("ps-auto-3", STATE);
    rc = resume("auto", "ps-auto-3", "ps-auto-one.safetensors");
    CHECKF(rc != 0 && strstr(err, "ps-auto-3/" CKPT ": metadata 'strategy_state', 'ps_auto' "
                                  "holds 1 worker choice(s); this run has 2"),
           "ps auto, one choice for two workers: %d %s", rc, err);
    /* a slot none chose in (a spare never filled) takes the lowest slot's;
     * its log says so at open, so the run is cut short after a step */
    new_state = "ps_auto=topk:0.05,-";
    rewrite("ps-auto-4", STATE);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=29 %s " PS_LAUNCH_AUTO " " SMALL
                 " --compress auto --checkpoint-dir %s/ps-auto-4 --resume", bin, tmp);
    CHECKF(strstr(err, "Worker 1: compress auto: topk:0.05 pushes, 4-bit answers (the "
                       "checkpoint's choice of worker 0)") &&
               strstr(err, "Worker 0: compress auto: topk:0.05 pushes, 4-bit answers (the "
                           "checkpoint's choice)"),
           "ps auto, a slot without a choice: %d %s", rc, err);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    resume_is_exact("bf16", "bf16", 0);
    resume_is_exact("topk", "topk:0.05", 5);

    /* Without the residuals restored the bits differ: zeroed, or each
     * replica given the other's. */
    rewrite("topk-0", ZERO);
    int rc = resume("topk:0.05", "topk-0", "zero.safetensors");
    CHECKF(rc == 0 && strstr(err, "(step 28)"), "residuals zeroed: %d %s", rc, err);
    CHECKF(checkpoint_max_diff("topk-full.safetensors", "zero.safetensors") > 0,
           "resumed with the residuals zeroed, the weights are still the uninterrupted run's: "
           "the test cannot tell whether they are restored");
    rewrite("topk-1", SWAP);
    rc = resume("topk:0.05", "topk-1", "swap.safetensors");
    CHECKF(rc == 0 && strstr(err, "(step 28)"), "residuals swapped: %d %s", rc, err);
    CHECKF(checkpoint_max_diff("topk-full.safetensors", "swap.safetensors") > 0,
           "resumed with the replicas' residuals swapped, the weights are still the "
           "uninterrupted run's: the test cannot tell whether each takes its own");

    /* A flipped bit in a residual: the checksum catches it, the file is set
     * aside, and the one before (step 21, with its residuals) resumes. */
    damage("topk-2");
    rc = resume("topk:0.05", "topk-2", "damaged.safetensors");
    CHECKF(rc == 0 && strstr(err, "topk-2/" CKPT ": checksum mismatch") &&
               strstr(err, "set aside as") && strstr(err, "(step 21)"),
           "a damaged residual: %d %s", rc, err);
    CHECKF(same_file("topk-full.safetensors", "damaged.safetensors"),
           "resumed from the older checkpoint, the weights differ from the uninterrupted run's");

    /* A residual missing, or of another size, in a file whose checksum is
     * good: refused, naming the file and the tensor. */
    rewrite("topk-3", DROP);
    rc = resume("topk:0.05", "topk-3", "drop.safetensors");
    CHECKF(rc != 0 && strstr(err, "topk-3/" CKPT ": --compress topk:0.05, but it holds the "
                                  "compression residuals of 1 replica(s) and this run has 2: "
                                  "tensor 'replica.1.residual' is missing"),
           "a missing residual: %d %s", rc, err);
    rewrite("topk-4", SHORTEN);
    rc = resume("topk:0.05", "topk-4", "short.safetensors");
    CHECKF(rc != 0 && strstr(err, "topk-4/" CKPT ": tensor 'replica.1.residual' has shape "
                                  "(50889), the model needs (50890)"),
           "a residual of another size: %d %s", rc, err);

    /* Another codec, or none, is another run; so is a checkpoint without
     * compression resumed with it. */
    rc = resume("topk:0.1", "topk-b", "other.safetensors");
    CHECKF(rc != 0 && strstr(err, "its compress=topk:0.05, this run's compress=topk:0.1"),
           "another ratio: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s " LAUNCH " " SMALL " --checkpoint-dir %s/topk-b --resume",
                 bin, tmp);
    CHECKF(rc != 0 && strstr(err, "its compress=topk:0.05, this run has no compress"),
           "no --compress: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s " LAUNCH " " SMALL " --epochs 1 --checkpoint-dir %s/plain",
                 bin, tmp);
    CHECKF(rc == 0, "a run without --compress: %d %s", rc, err);
    rc = resume("bf16", "plain", "plain.safetensors");
    CHECKF(rc != 0 && strstr(err, "plain/ckpt-0000000015.safetensors belongs to another run: it "
                                  "has no compress, this run's compress=bf16"),
           "--compress on a checkpoint without: %d %s", rc, err);

    /* powersgd: the residuals and the warm start Q (allreduce.powersgd_q)
     * are in the checkpoint; without the Q (zeroed) the run ends elsewhere,
     * and a file lacking it is refused naming it. */
    resume_is_exact("psgd", "powersgd:2", 2);
    rewrite("psgd-0", ZERO_Q);
    rc = resume("powersgd:2", "psgd-0", "psgd-zero.safetensors");
    CHECKF(rc == 0 && strstr(err, "(step 28)"), "powersgd, Q zeroed: %d %s", rc, err);
    CHECKF(checkpoint_max_diff("psgd-full.safetensors", "psgd-zero.safetensors") > 0,
           "resumed with powersgd's Q zeroed, the weights are still the uninterrupted run's: "
           "the test cannot tell whether it is restored");
    rewrite("psgd-1", DROP_Q);
    rc = resume("powersgd:2", "psgd-1", "psgd-drop.safetensors");
    CHECKF(rc != 0 && strstr(err, "psgd-1/" CKPT ": --compress powersgd:2, but tensor "
                                  "'allreduce.powersgd_q' (its warm start) is missing"),
           "powersgd, Q missing: %d %s", rc, err);

    /* --compress auto: powersgd taken on the fake slow link, kept by the
     * checkpoint (its Q there) and by the run resumed on the real one */
    first_env = "DOWNPOUR_TEST_LINK_NS=80 ";
    auto_resume_is_exact();
    char path[1400];
    snprintf(path, sizeof path, "%s/auto-0/" CKPT, tmp); /* the killed run's */
    dp_safetensors *f = NULL;
    dp_err e;
    CHECKF(dp_safetensors_load(path, &f, &e) == 0 &&
               dp_safetensors_find(f, "allreduce.powersgd_q") != NULL,
           "%s: auto took powersgd, but its warm start is not in the checkpoint", path);
    dp_safetensors_free(f);
    snprintf(path, sizeof path, "%s/auto-part.safetensors.jsonl", tmp);
    cJSON *rep = last_event(path, "replica", NULL);
    const char *took = rep ? json_str(rep, "compress") : "(no replica event)";
    CHECKF(strncmp(took, "auto: powersgd:", 15) == 0 &&
               strstr(took, " (the checkpoint's choice)"),
           "the resumed auto run's compress: %s", took);
    cJSON_Delete(rep);
    rewrite("auto-1", ZERO_Q); /* the rank with it */
    rc = resume("auto", "auto-1", "auto-zero.safetensors");
    CHECKF(rc != 0 && strstr(err, "auto-1/" CKPT ": tensor 'allreduce.powersgd_q' does not end "
                                  "with the rank --compress auto took (its last float is 0"),
           "auto, Q zeroed: %d %s", rc, err);

    /* ps-sync: each worker's residual, gathered by the chief */
    launch = PS_LAUNCH;
    resume_is_exact("ps-topk", "topk:0.05", 1);
    launch = PS_LAUNCH_TOPK;
    resume_is_exact("ps-reply-topk", "topk:0.05", 0);
    launch = PS_LAUNCH_D4;
    resume_is_exact("ps-reply-delta4", "topk:0.05", 0);
    launch = PS_LAUNCH;
    rewrite("ps-topk-0", SHORTEN);
    rc = resume("topk:0.05", "ps-topk-0", "ps-short.safetensors");
    CHECKF(rc != 0 && strstr(err, "ps-topk-0/" CKPT ": tensor 'replica.1.residual' has shape "
                                  "(50889), the model needs (50890)"),
           "ps: a residual of another size: %d %s", rc, err);
    ps_auto_resume_is_exact();
    return CHECK_DONE();
}
