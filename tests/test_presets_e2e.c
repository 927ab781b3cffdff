/* The presets under the cluster strategies, through the program
 * (docs/strategies.md, "The presets"):
 * - ps-sync with 2 workers at batch 4 on vit-mnist (no buffers) ends where
 *   one process at batch 8 ends over the same records, within float noise;
 *   one process at batch 4 does not (the check can fail);
 * - resnet-fashion, which has buffers, is refused by the ps family and
 *   model-avg before any task starts (exit 2), naming the reason and the
 *   strategies that take it;
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
    static const char *const ps_family[] = {"ps-async", "ps-sync", "ps-ssp", "ps-dssp",
                                            "model-avg"};
    for (size_t i = 0; i < sizeof ps_family / sizeof ps_family[0]; i++) {
        char options[128];
        snprintf(options, sizeof options, "--strategy %s --model resnet-fashion --batch 4",
                 ps_family[i]);
        refused("--chief --workers 2 --ps 1", options,
                "model resnet-fashion has buffers (batch norm's running statistics)");
        CHECK(strstr(err, "these do: single, allreduce") != NULL);
    }
    refused("--workers 2", "--strategy allreduce --sync-bn --model vit-mnist --batch 4",
            "--sync-bn: model vit-mnist has no batch norm layer");
    return CHECK_DONE();
}
