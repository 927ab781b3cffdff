/* Spatial model parallelism through `downpour launch`, on MNIST
 * (docs/strategies.md, "model-parallel"):
 * - distbelief-image (local layers split by rows, lcn whole on each task)
 *   over 2 tasks ends where one process at the same batch ends, within float
 *   noise, and so does cnn-mnist (conv filters shared within the replica)
 *   over 3 tasks, and distbelief-image as model-parallel replicas of 2 tasks
 *   under ps-async;
 * - each task holds about half of distbelief-image's parameters (the local
 *   layers' weights are split by bands of rows);
 * - 2 tasks train distbelief-image on a few hundred records to an accuracy
 *   well above chance in one epoch;
 * - --model-parallel larger than a layer's output rows is a usage error
 *   (exit 2) naming the layer. */
#include "proc.h"

#define COMMON "--train-size 640 --val-size 300 --epochs 1 --threads 1 --no-progress " \
               "--log-every 0"

static char err[65536];

static void as_single(const char *name, const char *launch, const char *strategy,
                      const char *mp_args, const char *args)
{
    int rc = run_cmd(err, sizeof err, "%s train %s " COMMON " --save %s/%s-single.st", test_bin(),
                     args, test_tmp(), name);
    CHECKF(rc == 0, "%s: single exited %d: %s", name, rc, err);
    rc = run_cmd(err, sizeof err,
                 "%s launch %s -- train --strategy %s %s %s " COMMON
                 " --metrics %s/%s.jsonl --save %s/%s.st",
                 test_bin(), launch, strategy, mp_args, args, test_tmp(), name, test_tmp(), name);
    CHECKF(rc == 0, "%s: model-parallel exited %d: %s", name, rc, err);
    char single[256], mp[256];
    snprintf(single, sizeof single, "%s-single.st", name);
    snprintf(mp, sizeof mp, "%s.st", name);
    double d = checkpoint_max_diff(single, mp);
    fprintf(stderr, "%s: max |diff| against one process %.3g\n", name, d);
    CHECKF(d < 1e-5, "%s differs from one process at the same batch by %g", name, d);
}

/* Task `task` of K says it holds about 1/K of the model's parameters. */
static void check_memory(const char *name, const char *who, int task, int K)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", test_tmp(), name);
    cJSON *ev = last_event(path, "model_parallel", who);
    CHECKF(ev != NULL, "%s: no model_parallel event from %s", name, who);
    if (!ev)
        return;
    double params = json_num(ev, "params"), total = json_num(ev, "total_params");
    fprintf(stderr, "%s: %s (task %d of %d) holds %.0f of %.0f parameters\n", name, who, task, K,
            params, total);
    CHECK(total == 1127818 && json_num(ev, "mp_task") == task && json_num(ev, "tasks") == K);
    CHECK(params < total / K * 1.02 && params > total / K * 0.98);
    cJSON_Delete(ev);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    as_single("db2", "--workers 2", "model-parallel", "",
              "--model distbelief-image --batch 32 --optimizer sgd --lr 0.05");
    check_memory("db2", "worker:1", 1, 2);
    as_single("cnn3", "--workers 3", "model-parallel", "",
              "--model cnn-mnist --batch 32 --optimizer adam");
    as_single("ps2", "--chief --workers 2 --ps 2", "ps-async", "--model-parallel 2",
              "--model distbelief-image --batch 32 --optimizer adam");

    int rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy model-parallel "
                     "--model distbelief-image --batch 32 " COMMON, test_bin());
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    const char *t = strstr(err, "Test accuracy: ");
    double acc = t ? atof(t + 15) : 0;
    fprintf(stderr, "distbelief-image over 2 tasks, 640 records, 1 epoch: test accuracy %.4f\n",
            acc);
    CHECKF(acc >= 0.6, "test accuracy %.4f < 0.6 (chance is 0.1)", acc);

    rc = run_cmd(err, sizeof err, "%s train --strategy model-parallel --model distbelief-image "
                 "--model-parallel 5", test_bin());
    CHECKF(rc == 2 && strstr(err, "--model-parallel 5") && strstr(err, "layer 6") &&
               strstr(err, "maxpool") && strstr(err, "only 4 output rows"),
           "exit %d: %s", rc, err);
    return CHECK_DONE();
}
