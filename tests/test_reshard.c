/* Resume anywhere (docs/checkpoints.md, "Resuming on another cluster"):
 * a parameter-server checkpoint resumes on another number of ps tasks, and
 * under --global-batch on another number of workers.
 * - with --sum-chunk 15, ps-sync at --global-batch 90 on 2 workers and 1 ps
 *   (Adam), killed after step 17 and resumed from step 14 on 3 workers and
 *   2 ps, ends bit for bit where the uninterrupted run does, and so do runs
 *   on 3, 6 and 1 workers;
 * - without it, ps-sync, 2 workers and 1 ps at --global-batch 90, killed after
 *   step 17 and resumed from step 14 on 3 workers and 2 ps, ends within
 *   TOL of the uninterrupted run (measured 3e-8: each worker's gradient
 *   sums its share of the step's records in another grouping, so the bits
 *   differ), and so does an uninterrupted 3 + 2 run; a run 1 % off in its
 *   learning rate does not, so TOL can fail;
 * - another ps count alone re-slices the same arithmetic: resumed on 3 ps
 *   instead of 1, a --batch run of ps-sync (Adam), and of model-avg, ends
 *   bitwise equal to the uninterrupted one;
 * - model-avg resumed on 3 workers from 2 (worker k's optimiser is the
 *   file's k mod 2: checked on the state read back) trains on;
 * - refused, naming the numbers: a global batch no multiple of the workers
 *   (exit 2), a --sum-chunk that does not divide a worker's share, or
 *   without --global-batch, or under allreduce, --batch with --global-batch, --global-batch under a strategy
 *   without data-parallel workers, and a --batch checkpoint on another
 *   number of workers (with the hint to --global-batch). */
#include <math.h>

#include "downpour/checkpoint.h"
#include "proc.h"

#define TOL 1e-5

/* small shards, so that 2 ps tasks hold one each */
#define BASE "--dataset mnist --model 784-32-10 --train-size 1800 --val-size 200 " \
             "--test-size 200 --log-every 0 --no-progress --threads 1 --ps-min-shard-bytes 4096"
#define GLOBAL BASE " --epochs 2 --global-batch 90"
#define EVERY " --checkpoint-every 7"
#define PS21 "launch --chief --workers 2 --ps 1 --"
#define PS32 "launch --chief --workers 3 --ps 2 --"

static const char *bin, *tmp;
static char err[16384];

/* --sum-chunk 15: every worker count that divides 90 / 15 sums the same
 * chunks in the same order, so the bits are the same. */
static void sum_chunk_resumes_bit_for_bit(void)
{
    const char *chunk = " --sum-chunk 15";
    int rc = run_cmd(err, sizeof err, "%s " PS21 " train --strategy ps-sync " GLOBAL "%s"
                     EVERY " --checkpoint-dir %s/cfull --save %s/cfull.safetensors", bin, chunk,
                     tmp, tmp);
    CHECKF(rc == 0, "--sum-chunk: the uninterrupted 2 + 1 run exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=17 %s " PS21 " train --strategy "
                 "ps-sync " GLOBAL "%s" EVERY " --checkpoint-dir %s/cpart", bin, chunk, tmp);
    CHECKF(rc != 0 && strstr(err, "killed by signal 9"), "--sum-chunk: the run meant to be "
           "killed at step 17: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s " PS32 " train --strategy ps-sync " GLOBAL "%s" EVERY
                 " --checkpoint-dir %s/cpart --save %s/cpart.safetensors --resume", bin, chunk,
                 tmp, tmp);
    CHECKF(rc == 0 && strstr(err, "(step 14)"), "--sum-chunk: the 3 + 2 resume: %d %s", rc, err);
    CHECKF(strstr(err, "ps:1 applied 26 update(s)") != NULL,
           "--sum-chunk: the second ps task holds a shard and applied the 26 steps: %s", err);
    double d = checkpoint_max_diff("cfull.safetensors", "cpart.safetensors");
    CHECKF(d == 0, "--sum-chunk: resumed on 3 workers and 2 ps, the run ends %g from the "
           "uninterrupted 2 + 1 run's weights", d);
    /* and uninterrupted on 3 workers, on 6, on 1 */
    static const char *const clusters[] = {PS32, "launch --chief --workers 6 --ps 3 --",
                                           "launch --chief --workers 1 --ps 1 --"};
    for (int i = 0; i < 3; i++) {
        rc = run_cmd(err, sizeof err, "%s %s train --strategy ps-sync " GLOBAL "%s --save "
                     "%s/c%d.safetensors", bin, clusters[i], chunk, tmp, i);
        CHECKF(rc == 0, "--sum-chunk under %s: %d %s", clusters[i], rc, err);
        char name[32];
        snprintf(name, sizeof name, "c%d.safetensors", i);
        d = checkpoint_max_diff("cfull.safetensors", name);
        CHECKF(d == 0, "--sum-chunk: %s ends %g from 2 + 1", clusters[i], d);
    }
}

static void global_batch_resumes_on_another_cluster(void)
{
    int rc = run_cmd(err, sizeof err, "%s " PS21 " train --strategy ps-sync " GLOBAL
                     EVERY " --checkpoint-dir %s/full --save %s/full.safetensors", bin, tmp, tmp);
    CHECKF(rc == 0, "the uninterrupted 2 + 1 run exited %d: %s", rc, err);
    CHECKF(strstr(err, "batch 45,") != NULL, "2 workers at --global-batch 90 take 45 each: %s",
           err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=17 %s " PS21 " train --strategy "
                 "ps-sync " GLOBAL EVERY " --checkpoint-dir %s/part", bin, tmp);
    CHECKF(rc != 0 && strstr(err, "killed by signal 9"), "the run meant to be killed at step 17: "
           "%d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s " PS32 " train --strategy ps-sync " GLOBAL
                 EVERY " --checkpoint-dir %s/part --save %s/part.safetensors --resume", bin, tmp, tmp);
    CHECKF(rc == 0, "the 3 + 2 resume exited %d: %s", rc, err);
    CHECKF(strstr(err, "ckpt-0000000014.safetensors (step 14)") && strstr(err, "batch 30,"),
           "the 3 + 2 run resumes from step 14 at 30 records a worker: %s", err);
    double d = checkpoint_max_diff("full.safetensors", "part.safetensors");
    printf("2 + 1 resumed on 3 + 2: largest difference %g\n", d);
    CHECKF(d <= TOL, "resumed on 3 workers and 2 ps, the run ends %g from the uninterrupted "
           "one's weights (at most %g)", d, TOL);
    /* the step's records do not depend on the workers */
    rc = run_cmd(err, sizeof err, "%s " PS32 " train --strategy ps-sync " GLOBAL
                 " --save %s/three.safetensors", bin, tmp);
    CHECKF(rc == 0, "the uninterrupted 3 + 2 run: %d %s", rc, err);
    d = checkpoint_max_diff("full.safetensors", "three.safetensors");
    printf("2 + 1 against 3 + 2: largest difference %g\n", d);
    CHECKF(d <= TOL, "3 workers at the same global batch end %g from 2 workers' weights", d);
    /* TOL can fail: a learning rate 1 % off ends beyond it */
    rc = run_cmd(err, sizeof err, "%s " PS21 " train --strategy ps-sync " GLOBAL
                 " --lr 0.00101 --save %s/lr.safetensors", bin, tmp);
    CHECKF(rc == 0, "the run at --lr 0.00101: %d %s", rc, err);
    d = checkpoint_max_diff("full.safetensors", "lr.safetensors");
    printf("--lr 1 %% off: largest difference %g\n", d);
    CHECKF(d > 100 * TOL, "a run at a learning rate 1 %% off ends only %g away: the tolerance "
           "%g would not tell it", d, TOL);

    /* model-avg: worker 2 takes worker 0's optimiser; the run trains on */
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=17 %s " PS21 " train --strategy "
                 "model-avg --period 2 " GLOBAL EVERY " --checkpoint-dir %s/avg", bin, tmp);
    CHECKF(rc != 0 && strstr(err, "killed by signal 9"), "model-avg killed at 17: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 3 --ps 1 -- train --strategy "
                 "model-avg --period 2 " GLOBAL EVERY " --checkpoint-dir %s/avg --resume "
                 "--metrics %s/avg.jsonl", bin, tmp, tmp);
    CHECKF(rc == 0 && strstr(err, "(step 14)"), "model-avg resumed on 3 workers: %d %s", rc,
           err);
    char path[1200];
    snprintf(path, sizeof path, "%s/avg.jsonl", tmp);
    CHECKF(done_accuracy(path) > 0.3, "model-avg resumed on 3 workers: test accuracy %g",
           done_accuracy(path));
}

/* Another number of ps tasks: the shards' arithmetic is elementwise, so the
 * bits stay (2 workers: their two pushes add in either order alike). */
static void another_ps_count_is_exact(void)
{
    int rc = run_cmd(err, sizeof err, "%s " PS21 " train --strategy ps-sync " BASE " --epochs 1 "
                     "--batch 45 --checkpoint-dir %s/batch", bin, tmp);
    CHECKF(rc == 0, "the 1-epoch --batch run: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s " PS21 " train --strategy ps-sync " BASE " --epochs 2 "
                 "--batch 45 --save %s/two.safetensors", bin, tmp);
    CHECKF(rc == 0, "the 2-epoch --batch run: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 3 -- train --strategy "
                 "ps-sync " BASE " --epochs 2 --batch 45 --checkpoint-dir %s/batch --resume "
                 "--save %s/two-3ps.safetensors", bin, tmp, tmp);
    CHECKF(rc == 0 && strstr(err, "(step 20)"), "resumed on 3 ps: %d %s", rc, err);
    double d = checkpoint_max_diff("two.safetensors", "two-3ps.safetensors");
    CHECKF(d == 0, "resumed on 3 ps instead of 1, the run ends %g from the uninterrupted one", d);

    /* model-avg likewise (against a run that checkpoints at the same step:
     * a checkpoint closes its period) */
    const char *avg = "--strategy model-avg --period 3 " BASE " --batch 45";
    rc = run_cmd(err, sizeof err, "%s " PS21 " train %s --epochs 1 --checkpoint-dir %s/avg1",
                 bin, avg, tmp);
    CHECKF(rc == 0, "model-avg, 1 epoch: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s " PS21 " train %s --epochs 2 --checkpoint-every 20 "
                 "--checkpoint-dir %s/avg2 --save %s/avg.safetensors", bin, avg, tmp, tmp);
    CHECKF(rc == 0, "model-avg, 2 epochs: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 3 -- train %s --epochs 2 "
                 "--checkpoint-dir %s/avg1 --resume --save %s/avg-3ps.safetensors", bin, avg,
                 tmp, tmp);
    CHECKF(rc == 0 && strstr(err, "(step 20)"), "model-avg resumed on 3 ps: %d %s", rc, err);
    d = checkpoint_max_diff("avg.safetensors", "avg-3ps.safetensors");
    CHECKF(d == 0, "model-avg resumed on 3 ps instead of 1 ends %g from the uninterrupted run",
           d);

    /* and another worker count without a global batch is refused */
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 3 --ps 1 -- train --strategy "
                 "ps-sync " BASE " --epochs 2 --batch 45 --checkpoint-dir %s/batch --resume",
                 bin, tmp);
    CHECKF(rc != 0 && strstr(err, "was written by a run of 2 worker(s); this run has 3") &&
               strstr(err, "--global-batch"),
           "a --batch checkpoint on 3 workers: %d %s", rc, err);
    /* nor does a --global-batch run take a --batch run's checkpoint */
    rc = run_cmd(err, sizeof err, "%s " PS21 " train --strategy ps-sync " BASE " --epochs 2 "
                 "--global-batch 90 --checkpoint-dir %s/batch --resume", bin, tmp);
    CHECKF(rc != 0 && strstr(err, "it has no global_batch, this run's global_batch=90"),
           "a --batch checkpoint under --global-batch: %d %s", rc, err);
}

static void refusals(void)
{
    int rc = run_cmd(err, sizeof err, "%s launch --chief --workers 4 --ps 1 -- train --strategy "
                     "ps-sync " GLOBAL, bin);
    CHECKF(rc == 2 && strstr(err, "--global-batch 90 is not a multiple of the 4 workers") &&
               strstr(err, "--global-batch 88 or 92"),
           "--global-batch 90 on 4 workers: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train " BASE " --batch 30 --global-batch 90", bin);
    CHECKF(rc == 2 && strstr(err, "--batch 30 and --global-batch 90: give one"),
           "--batch with --global-batch: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline " BASE
                 " --global-batch 90", bin);
    CHECKF(rc == 2 && strstr(err, "strategy pipeline's workers are not data-parallel"),
           "--global-batch under pipeline: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 5 --ps 1 -- train --strategy "
                 "ps-sync " GLOBAL " --sum-chunk 15", bin);
    CHECKF(rc == 2 && strstr(err, "--sum-chunk 15 does not divide a worker's 18 records"),
           "--sum-chunk 15 on 5 workers: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- train --strategy "
                 "ps-sync " BASE " --sum-chunk 15", bin);
    CHECKF(rc == 2 && strstr(err, "give --global-batch N"), "--sum-chunk alone: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy allreduce " GLOBAL
                 " --sum-chunk 15", bin);
    CHECKF(rc == 2 && strstr(err, "--sum-chunk 15: for --strategy ps-sync"),
           "--sum-chunk under allreduce: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train " BASE " --global-batch 1801", bin);
    CHECKF(rc == 2 && strstr(err, "--global-batch 1801: a step cannot take more records"),
           "--global-batch above the split: %d %s", rc, err);
}

/* model-avg's optimisers re-dealt, on the state itself: worker k of 3
 * takes the file's k mod 2. */
static void worker_optimizers_redealt(void)
{
    dp_model m;
    dp_err e;
    REQUIRE(dp_model_init(&m, "4-3-2", 8, 1, &e) == 0);
    dp_model_init_params(&m, 1);
    size_t n = m.n_params;
    dp_train_state st, back;
    REQUIRE(dp_train_state_alloc(&st, n, 2, 0, 2, 2, &e) == 0);
    memcpy(st.params, m.params, n * sizeof(float));
    for (size_t i = 0; i < 2 * n; i++)
        st.slots[i] = (float)i;
    for (size_t i = 0; i < 2 * 2 * n; i++)
        st.worker_slots[i] = (float)(i + 1000);
    st.worker_t[0] = 5;
    st.worker_t[1] = 6;
    st.step = 4;
    dp_run_identity id = {.strategy = "model-avg", .dataset = "x", .optimizer = "adam",
                          .lr_schedule = "constant", .lr = 0.1f, .workers = 2, .ps = 1,
                          .batch = 3, .seed = 1, .train_size = 12, .epochs = 2,
                          .steps_per_epoch = 2, .reshards = DP_RESHARD_PS, .global_batch = 6,
                          .same_records = 1, .settings = "global_batch=6"};
    char path[1200];
    snprintf(path, sizeof path, "%s/redeal.safetensors", tmp);
    REQUIRE(dp_checkpoint_write(path, &m, &st, &id, &e) == 0);
    id.workers = 3;
    id.ps = 2;
    id.batch = 2;
    CHECKF(dp_checkpoint_read(path, &m, &id, &back, &e) == 0, "%s", e.msg);
    CHECK(back.n_workers == 3);
    for (int k = 0; k < 3 && back.worker_slots; k++) {
        CHECKF(memcmp(back.worker_slots + (size_t)k * 2 * n,
                      st.worker_slots + (size_t)(k % 2) * 2 * n, 2 * n * sizeof(float)) == 0,
               "worker %d's optimiser is not the file's worker %d's", k, k % 2);
        CHECK(back.worker_t[k] == st.worker_t[k % 2]);
    }
    CHECK(memcmp(back.slots, st.slots, 2 * n * sizeof(float)) == 0);
    dp_train_state_free(&back);
    /* without the global batch, the workers may not change; nor anything
     * under a strategy that does not re-shard */
    id.global_batch = 0;
    id.batch = 3;
    CHECK(dp_checkpoint_read(path, &m, &id, &back, &e) < 0 &&
          strstr(e.msg, "written by a run of 2 worker(s); this run has 3"));
    id.global_batch = 6;
    id.same_records = 0;
    CHECK(dp_checkpoint_read(path, &m, &id, &back, &e) < 0 && strstr(e.msg, "--shard"));
    id.same_records = 1;
    id.reshards = DP_RESHARD_NONE;
    id.workers = 2;
    CHECK(dp_checkpoint_read(path, &m, &id, &back, &e) < 0 &&
          strstr(e.msg, "2 worker(s) and 1 ps task(s); this run has 2 and 2"));
    dp_train_state_free(&st);
    dp_model_free(&m);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    worker_optimizers_redealt();
    refusals();
    require_mnist();
    sum_chunk_resumes_bit_for_bit();
    global_batch_resumes_on_another_cluster();
    another_ps_count_is_exact();
    return CHECK_DONE();
}
