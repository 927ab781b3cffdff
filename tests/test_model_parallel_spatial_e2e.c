/* Spatial model parallelism through `downpour launch`, on MNIST
 * (docs/strategies.md, "model-parallel"):
 * - distbelief-image (local layers split by rows, lcn whole on each task)
 *   over 2 tasks ends where one process at the same batch ends, within float
 *   noise, and so does cnn-mnist (conv filters shared within the replica)
 *   over 3 tasks, and distbelief-image as model-parallel replicas of 2 tasks
 *   under ps-async (sgd: see docs/architecture.md, "Instruction sets");
 * - each task holds about half of distbelief-image's parameters (the local
 *   layers' weights are split by bands of rows);
 * - 2 tasks train distbelief-image on a few hundred records to an accuracy
 *   well above chance in one epoch;
 * - --model-parallel larger than a layer's output rows is a usage error
 *   (exit 2) naming the layer. */
#include "mp_e2e.h"

/* --test-size: 1,000 test records say as much as 10,000 here, at a tenth of
 * the evaluation (the slowest part of these runs, under ASan above all) */
#define COMMON "--train-size 640 --val-size 300 --test-size 1000 --epochs 1 --threads 1 " \
               "--no-progress --log-every 0"
/* Under ASan half the records: the equality holds at any size, and the
 * local layers' loops are what the sanitizer slows most. */
#define COMMON_ASAN "--train-size 320 --val-size 100 --test-size 200 --epochs 1 --threads 1 " \
                    "--no-progress --log-every 0"
#define SIZES (SANITIZED ? COMMON_ASAN : COMMON)

static char err[65536];

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    mp_as_single(err, sizeof err, "db2", "--workers 2", "model-parallel", "",
                 "--model distbelief-image --batch 32 --optimizer sgd --lr 0.05", SIZES);
    /* about 1/K of distbelief-image's parameters (2 %: the bands are not equal) */
    mp_check_share("db2", "worker:1", 1, 2, 1127818, 1127818 / 2 * 0.02);
    /* adam in the plain build; under ASan (its shorter run) sgd: adam's
     * first steps scale a near-zero gradient's rounding to the learning
     * rate, and that run ended 1.8e-4 from one process on a machine whose
     * OpenBLAS runs its Haswell kernels (the sanitizer looks at memory; the
     * plain build checks the arithmetic) */
    mp_as_single(err, sizeof err, "cnn3", "--workers 3", "model-parallel", "",
                 SANITIZED ? "--model cnn-mnist --batch 32 --optimizer sgd --lr 0.05"
                           : "--model cnn-mnist --batch 32 --optimizer adam",
                 SIZES);
    /* sgd: adam and momentum amplify this model's rounding differences into
     * lr-sized ones on some seeds, whatever the path (docs/architecture.md,
     * "Instruction sets"); adam's paths are cnn3's and test_optim's */
    mp_as_single(err, sizeof err, "ps2", "--chief --workers 2 --ps 2", "ps-async",
                 "--model-parallel 2",
                 "--model distbelief-image --batch 32 --optimizer sgd --lr 0.05", SIZES);

    /* accuracy is arithmetic: the plain build checks it */
    int rc;
    if (!SANITIZED) {
        rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy model-parallel "
                     "--model distbelief-image --batch 32 " COMMON, test_bin());
        CHECKF(rc == 0, "exit %d: %s", rc, err);
        const char *t = strstr(err, "Test accuracy: ");
        double acc = t ? atof(t + 15) : 0;
        fprintf(stderr, "distbelief-image over 2 tasks, 640 records, 1 epoch: test accuracy %.4f\n",
                acc);
        CHECKF(acc >= 0.6, "test accuracy %.4f < 0.6 (chance is 0.1)", acc);
    }

    rc = run_cmd(err, sizeof err, "%s train --strategy model-parallel --model distbelief-image "
                 "--model-parallel 5", test_bin());
    CHECKF(rc == 2 && strstr(err, "--model-parallel 5") && strstr(err, "layer 6") &&
               strstr(err, "maxpool") && strstr(err, "only 4 output rows"),
           "exit %d: %s", rc, err);
    return CHECK_DONE();
}
