/* --augment end to end, on MNIST (docs/training.md, "Augmentation"): the
 * draws are the record's, not the worker's, so under --shard data two
 * allreduce replicas and two ps-sync workers at batch b still equal one
 * process at batch 2b, within float noise; augmenting changes the run (the
 * check can fail), streamed from record files too; the refusals name the
 * flag. */
#include "proc.h"

static char err[65536];

/* Two epochs, so the second draws anew.  At --lr 0.1 this run amplifies
 * the last bit of the workers' two-way sum into 1.8e-3 in its second epoch
 * (measured: seed 1, crop and flip together; seeds 2 and 3 stay at 4e-8,
 * lr 0.02 at 3e-8): the training map's noise, not the draws, which
 * test_augment compares row for row.  So the check runs at 0.02. */
#define COMMON                                                                                  \
    "--train-size 3200 --val-size 1000 --test-size 1000 --epochs 2 --optimizer sgd --lr 0.02 " \
    "--threads 1 --no-progress --log-every 0"
#define AUG "--augment crop:3,flip"

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    int rc = run_cmd(err, sizeof err, "%s train --batch 128 " COMMON " " AUG " --save %s/aug.st",
                     test_bin(), test_tmp());
    CHECKF(rc == 0, "single --augment exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --batch 128 " COMMON " --save %s/plain.st", test_bin(),
                 test_tmp());
    CHECKF(rc == 0, "single exited %d: %s", rc, err);
    double d = checkpoint_max_diff("aug.st", "plain.st");
    fprintf(stderr, "augmented vs not: max |diff| %.3g\n", d);
    CHECKF(d > 1e-3, "--augment did not change the run (%g)", d);

    rc = run_cmd(err, sizeof err,
                 "%s launch --chief --workers 1 -- train --strategy allreduce --batch 64 " COMMON
                 " " AUG " --save %s/ar.st",
                 test_bin(), test_tmp());
    CHECKF(rc == 0, "allreduce --augment exited %d: %s", rc, err);
    d = checkpoint_max_diff("aug.st", "ar.st");
    fprintf(stderr, "allreduce (2 x 64) vs one process (128), augmented: max |diff| %.3g\n", d);
    CHECKF(d < 1e-5, "augmented allreduce differs from one process at the summed batch by %g", d);

    rc = run_cmd(err, sizeof err,
                 "%s launch --chief --workers 2 --ps 1 -- train --strategy ps-sync --batch 64 "
                 COMMON " " AUG " --save %s/sync.st",
                 test_bin(), test_tmp());
    CHECKF(rc == 0, "ps-sync --augment exited %d: %s", rc, err);
    d = checkpoint_max_diff("aug.st", "sync.st");
    fprintf(stderr, "ps-sync (2 x 64) vs one process (128), augmented: max |diff| %.3g\n", d);
    CHECKF(d < 1e-5, "augmented ps-sync differs from one process at the summed batch by %g", d);

    /* streamed from record files: the stream augments what it hands out */
    rc = run_cmd(err, sizeof err, "%s data convert --from mnist --to %s/rec --limit 4000 "
                 "--encoding raw --shards 2", test_bin(), test_tmp());
    CHECKF(rc == 0, "data convert exited %d: %s", rc, err);
    const char *streamed = "--train-size 3000 --val-size 500 --test-size 500 --epochs 2 "
                           "--batch 100 --optimizer sgd --lr 0.02 --threads 1 --no-progress "
                           "--log-every 0 --stream on --data-memory 4M";
    rc = run_cmd(err, sizeof err, "%s train --dataset %s/rec %s " AUG " --save %s/stream-aug.st",
                 test_bin(), test_tmp(), streamed, test_tmp());
    CHECKF(rc == 0 && strstr(err, "streaming"), "streamed --augment exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --dataset %s/rec %s --save %s/stream.st", test_bin(),
                 test_tmp(), streamed, test_tmp());
    CHECKF(rc == 0, "streamed exited %d: %s", rc, err);
    d = checkpoint_max_diff("stream-aug.st", "stream.st");
    fprintf(stderr, "streamed, augmented vs not: max |diff| %.3g\n", d);
    CHECKF(d > 1e-3, "--augment did not change the streamed run (%g)", d);

    rc = run_cmd(err, sizeof err, "%s train --augment crop:4,rotate", test_bin());
    CHECKF(rc == 2 && strstr(err, "--augment 'crop:4,rotate': 'rotate' is unknown"),
           "--augment crop:4,rotate: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --augment crop:99", test_bin());
    CHECKF(rc == 2 && strstr(err, "--augment crop:99"), "--augment crop:99: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train " COMMON " --augment crop:28", test_bin());
    CHECKF(rc == 1 && strstr(err, "--augment crop:28: a padding of 28 pixels is not below"),
           "--augment crop:28: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --device sim " AUG, test_bin());
    CHECKF(rc == 2 && strstr(err, "--augment: not with --device"), "--device sim: exit %d: %s", rc,
           err);
    return CHECK_DONE();
}
