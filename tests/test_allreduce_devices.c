/* allreduce with every replica on a device that has collectives (docs/gpu.md,
 * "Strategies"): the gradients are summed there (NCCL on GPUs; here sim's
 * collectives, the same table on the host), and the parameters and
 * optimiser state stay on the devices.  Under `downpour launch`, 3 workers
 * on --device sim:
 * - the sums run on the devices (replica 0 says so), the replicas end
 *   bitwise identical; five steps leave the weights within 1e-5 of the same
 *   steps summed on the host (DOWNPOUR_NCCL=0: host staging, the ring over
 *   the transport), which a wrong weighing of the replicas' shares would
 *   move by far more; train --no-nccl, the option that variable falls back
 *   for, stages on the host too, to the same bits (plain build);
 * - worker:2 SIGKILLed once it logged step 20: the survivors' sum fails,
 *   the ring re-forms over two with a new communicator, the run exits 0,
 *   both survivors end identical, accuracy within 1 % of the fault-free run;
 * - frozen (SIGSTOP) instead: alive, so only the survivors' watch between
 *   slices of their wait on the sum can drop it (sim's sums are queued, as
 *   NCCL's are); the same outcome;
 * - restarted (--max-restarts 1), it rejoins at the next epoch: a
 *   communicator over three again, three identical replicas. */
#include <math.h>

#include "launch.h"

/* 3 workers on sim; train_extra's flags come after RUN's and win. */
static int run(const char *name, const char *extra, const char *train_extra, const char *fault)
{
    char args[2048];
    snprintf(args, sizeof args,
             "--workers 3 %s -- train --strategy allreduce --device sim " RUN
             " %s --heartbeat-timeout 1 --metrics %s/%s.jsonl --save %s/%s.safetensors",
             extra, train_extra, tmp, name, tmp, name);
    pid_t l = start(name, args);
    if (fault) {
        pid_t w = await_task(l, name, "Worker 2, At step 20,", "worker:2");
        CHECKF(w > 0, "%s: worker:2 never logged step 20", name);
        if (w > 0 && strcmp(fault, "kill") == 0) {
            kill(w, SIGKILL);
        } else if (w > 0) {
            /* frozen: alive, so only the survivors' watch between slices
             * of their wait on the sum can tell (heartbeat timeout 1 s) */
            kill(w, SIGSTOP);
            CHECKF(wait_log(name, "[worker 0] warning: fault: lost worker:2", 60),
                   "%s: replica 0 never dropped the frozen worker:2", name);
            kill(w, SIGCONT);
        }
    }
    return finish(l, 300);
}

static void identical(const char *name, long expect)
{
    long n;
    int same = replicas_equal(name, &n);
    CHECKF(n == expect && same, "%s: %ld replica checksums (expected %ld), %s", name, n, expect,
           same ? "all equal" : "NOT all equal");
}

static void few_steps(void)
{
    /* Five steps summed on the devices and on the host: the same weights
     * but for the order of addition (rank order on the devices, the ring's
     * on the host), which 180 steps amplify to 4e-3 but five leave near
     * 1e-7; a wrong weighing of the shares moves them by 1e-2 and more. */
    const char *few = "--train-size 1500 --epochs 1";
    int rc = run("few", "", few, NULL);
    CHECKF(rc == 0 && log_has("few", "summed on the devices (NCCL) over 3 replica(s)"),
           "few: exit %d, or not summed on the devices", rc);
    setenv("DOWNPOUR_NCCL", "0", 1); /* the launcher's tasks inherit it */
    rc = run("few-host", "", few, NULL);
    unsetenv("DOWNPOUR_NCCL");
    CHECKF(rc == 0, "few-host: exit %d", rc);
    CHECKF(!log_has("few-host", "summed on the devices"),
           "few-host: DOWNPOUR_NCCL=0 summed on the devices");
    double apart = checkpoint_max_diff("few.safetensors", "few-host.safetensors");
    fprintf(stderr, "five steps on the devices against host staging: weights %.3g apart\n",
            apart);
    CHECKF(apart < 1e-5, "devices against host staging: weights %.3g apart", apart);
    rc = run("few-flag", "", "--train-size 1500 --epochs 1 --no-nccl", NULL);
    CHECKF(rc == 0 && !log_has("few-flag", "summed on the devices"),
           "few-flag: exit %d, or --no-nccl summed on the devices", rc);
    apart = checkpoint_max_diff("few-host.safetensors", "few-flag.safetensors");
    CHECKF(apart == 0, "--no-nccl against DOWNPOUR_NCCL=0: weights %.3g apart", apart);
}

int main(void)
{
    launch_test_init();

    int rc = run("devices", "", "", NULL);
    double acc = test_accuracy("devices");
    fprintf(stderr, "devices: exit %d, accuracy %.4f\n", rc, acc);
    CHECKF(rc == 0 && acc > 0.8, "devices: exit %d, accuracy %.4f", rc, acc);
    CHECKF(log_has("devices", "summed on the devices (NCCL) over 3 replica(s)"),
           "devices: replica 0 did not say the sums run on the devices");
    identical("devices", 3);

    /* (the arithmetic of the sums: the plain build; ASan runs the fault
     * paths, which free and rebuild the communicator) */
    if (!SANITIZED)
        few_steps();

    rc = run("kill", "", "", "kill");
    double killed = test_accuracy("kill");
    fprintf(stderr, "kill: exit %d, accuracy %.4f (fault-free %.4f)\n", rc, killed, acc);
    CHECKF(rc == 0, "kill: a killed replica ended the run (exit %d)", rc);
    CHECKF(fabs(killed - acc) <= 0.01, "kill: accuracy %.4f, fault-free %.4f", killed, acc);
    CHECKF(log_has("kill", "fault: lost worker:2"), "kill: no fault line for worker:2");
    CHECKF(count_events("kill", "fault") >= 2,
           "kill: expected fault events from the launcher and the survivors");
    CHECKF(log_has("kill", "over 2 replica(s), a new communicator"),
           "kill: no new communicator over the survivors");
    identical("kill", 2);

    rc = run("stop", "", "", "stop");
    double stopped = test_accuracy("stop");
    fprintf(stderr, "stop: exit %d, accuracy %.4f (fault-free %.4f)\n", rc, stopped, acc);
    CHECKF(rc == 0, "stop: a frozen replica ended the run (exit %d)", rc);
    CHECKF(fabs(stopped - acc) <= 0.01, "stop: accuracy %.4f, fault-free %.4f", stopped, acc);
    CHECKF(log_has("stop", "over 2 replica(s), a new communicator"),
           "stop: no new communicator over the survivors");
    identical("stop", 2);

    rc = run("restart", "--max-restarts 1", "", "kill");
    CHECKF(rc == 0, "restart: exit %d", rc);
    CHECKF(log_has("restart", "fault: worker:2 rejoined the all-reduce ring at step"),
           "restart: the restarted replica did not rejoin");
    CHECKF(log_has("restart", "over 3 replica(s), a new communicator"),
           "restart: no communicator over the three again");
    identical("restart", 3);
    return check_failures ? 1 : 0;
}
