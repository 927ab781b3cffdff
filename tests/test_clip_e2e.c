/* --clip-norm end to end, on MNIST (docs/training.md, "Gradient clipping"):
 * - clipping that binds changes the run (the check can fail);
 * - allreduce clips the reduced gradient: two replicas at batch b equal one
 *   process at batch 2b, within float noise;
 * - ps-sync with one worker and the gradient over two ps shards clips the
 *   whole gradient (the worker clips it before it is split): it equals one
 *   process;
 * - pipeline stages and model-parallel slices sum their parts of the norm:
 *   2 stages, 2 replicas of 2 stages, 2 slices, 2 replicas of 2 slices and
 *   a ps-async replica of 2 slices equal one process (at the summed batch)
 *   within float noise;
 * - a strategy that cannot clip the whole gradient is refused, naming it. */
#include "proc.h"

static char err[65536];

#define COMMON                                                                                 \
    "--train-size 3200 --val-size 1000 --test-size 1000 --epochs 1 --optimizer sgd --lr 0.1 " \
    "--threads 1 --no-progress --log-every 0"
#define CLIP "--clip-norm 0.05"

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    int rc = run_cmd(err, sizeof err, "%s train --batch 128 " COMMON " " CLIP " --save %s/clip.st",
                     test_bin(), test_tmp());
    CHECKF(rc == 0, "single --clip-norm exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --batch 128 " COMMON " --save %s/plain.st", test_bin(),
                 test_tmp());
    CHECKF(rc == 0, "single exited %d: %s", rc, err);
    double bind = checkpoint_max_diff("clip.st", "plain.st");
    fprintf(stderr, "clipped vs not: max |diff| %.3g\n", bind);
    CHECKF(bind > 1e-3, "--clip-norm 0.05 did not change the run (%g): it must bind", bind);

    rc = run_cmd(err, sizeof err,
                 "%s launch --chief --workers 1 -- train --strategy allreduce --batch 64 " COMMON
                 " " CLIP " --save %s/ar.st",
                 test_bin(), test_tmp());
    CHECKF(rc == 0, "allreduce --clip-norm exited %d: %s", rc, err);
    double d = checkpoint_max_diff("clip.st", "ar.st");
    fprintf(stderr, "allreduce (2 x 64) vs one process (128), clipped: max |diff| %.3g\n", d);
    CHECKF(d < 1e-5, "clipped allreduce differs from one process at the summed batch by %g", d);

    rc = run_cmd(err, sizeof err,
                 "%s launch --verbose --chief --workers 1 --ps 2 -- train --strategy ps-sync --batch 128 "
                 "--ps-min-shard-bytes 4096 " COMMON " " CLIP " --save %s/sync.st",
                 test_bin(), test_tmp());
    CHECKF(rc == 0, "ps-sync --clip-norm exited %d: %s", rc, err);
    /* the shard layout is a --verbose line */
    CHECKF(strstr(err, "shard 1: parameters") != NULL, "the run did not use two shards: %s", err);
    d = checkpoint_max_diff("clip.st", "sync.st");
    fprintf(stderr, "ps-sync (1 worker, 2 shards) vs one process, clipped: max |diff| %.3g\n", d);
    CHECKF(d < 1e-5, "clipped ps-sync over two shards differs from one process by %g", d);

    /* the split gradients: (name, launch, strategy and its flags, batch) */
    const char *split[][4] = {
        {"pipeline 2 stages", "--workers 2", "pipeline", "128"},
        {"pipeline 2 x 2 stages", "--workers 4", "pipeline --stages 2", "64"},
        {"model-parallel 2 slices", "--workers 2", "model-parallel", "128"},
        {"model-parallel 2 x 2 slices", "--workers 4", "model-parallel --model-parallel 2", "64"},
        {"ps-async, a replica of 2 slices", "--chief --workers 2 --ps 2",
         "ps-async --model-parallel 2", "128"},
    };
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++) {
        rc = run_cmd(err, sizeof err,
                     "%s launch %s -- train --strategy %s --batch %s " COMMON " " CLIP
                     " --save %s/split%zu.st",
                     test_bin(), split[i][1], split[i][2], split[i][3], test_tmp(), i);
        CHECKF(rc == 0, "%s --clip-norm exited %d: %s", split[i][0], rc, err);
        char name[32];
        snprintf(name, sizeof name, "split%zu.st", i);
        d = checkpoint_max_diff("clip.st", name);
        fprintf(stderr, "%s vs one process (128), clipped: max |diff| %.3g\n", split[i][0], d);
        CHECKF(d < 1e-5, "clipped %s differs from one process by %g", split[i][0], d);
    }

    rc = run_cmd(err, sizeof err, "%s train --strategy lbfgs " CLIP, test_bin());
    CHECKF(rc == 2 && strstr(err, "--clip-norm: strategy lbfgs cannot clip"),
           "lbfgs --clip-norm: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --clip-norm -1", test_bin());
    CHECKF(rc == 2 && strstr(err, "--clip-norm -1"), "--clip-norm -1: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --device sim " CLIP, test_bin());
    CHECKF(rc == 2 && strstr(err, "--clip-norm: not with --device for strategy single"),
           "single --device sim: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy allreduce --device sim " CLIP, test_bin());
    CHECKF(rc == 2 && strstr(err, "--clip-norm: not with --device for strategy allreduce"),
           "allreduce --device sim: exit %d: %s", rc, err);
    /* ps-sync stages through the host: the gradient comes back, and is clipped there */
    rc = run_cmd(err, sizeof err,
                 "%s launch --verbose --chief --workers 1 --ps 2 -- train --strategy ps-sync --batch 128 "
                 "--ps-min-shard-bytes 4096 --device sim " COMMON " " CLIP " --save %s/simsync.st",
                 test_bin(), test_tmp());
    CHECKF(rc == 0, "ps-sync --device sim --clip-norm exited %d: %s", rc, err);
    d = checkpoint_max_diff("clip.st", "simsync.st");
    fprintf(stderr, "ps-sync on --device sim vs one process on the CPU, clipped: max |diff| %.3g\n",
            d);
    CHECKF(d < 1e-5, "clipped ps-sync on --device sim differs from one process by %g", d);
    return CHECK_DONE();
}
