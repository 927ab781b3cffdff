/* ps-sync's pushes by host under `downpour launch` (docs/strategies.md,
 * "ps-sync: one push per host"): a chief, 2 workers and 1 ps on this one
 * host, over TCP with shared memory.
 * - --ps-push host ends with the weights of --ps-push worker, byte for
 *   byte (two workers' shares summed in either order are one float sum),
 *   says so in the log and in a ps_push metrics event per worker (worker 0
 *   leads), and a run killed at step 33 and resumed from its step-28
 *   checkpoint ends with those bytes too;
 * - the leader (worker 0) SIGKILLed mid-run: the run goes on and exits 0,
 *   the member pushing on its own (docs/faults.md, "One push per host");
 * - --ps-push host under ps-async, with --compress, and a bad mode are
 *   refused before any task starts (exit 2), naming why. */
#include "launch.h"

#define SMALL "--dataset mnist --model 784-64-10 --train-size 3000 --val-size 500 " \
              "--test-size 1000 --epochs 3 --batch 100 --log-every 0 --no-progress --threads 1"
#define CLUSTER "--chief --workers 2 --ps 1"

static char out[16384];

static int train(const char *env, const char *name, const char *push, const char *more)
{
    return run_cmd(out, sizeof out, "%s %s launch " CLUSTER " -- train --strategy ps-sync "
                   "--ps-push %s " SMALL " --save %s/%s.st --metrics %s/%s.jsonl "
                   "--checkpoint-dir %s/%s.ck --checkpoint-every 7 %s",
                   env, bin, push, tmp, name, tmp, name, tmp, name, more);
}

static void tally_push(const cJSON *j, void *ctx)
{
    int *v = ctx;
    const cJSON *p = cJSON_GetObjectItem(j, "push"), *l = cJSON_GetObjectItem(j, "leads");
    v[0] += cJSON_IsString(p) && strcmp(p->valuestring, "host") == 0;
    v[1] += cJSON_IsNumber(l) && l->valueint == 1;
}

static void same_as_per_worker(void)
{
    int rc = train("", "worker", "worker", "");
    CHECKF(rc == 0, "--ps-push worker exited %d: %s", rc, out);
    rc = train("", "host", "host", "");
    CHECKF(rc == 0, "--ps-push host exited %d: %s", rc, out);
    CHECKF(strstr(out, "Worker 0: ps pushes by host (2 worker(s) on its host, it leads)") &&
               strstr(out, "Worker 1: ps pushes by host (2 worker(s) on its host)"),
           "--ps-push host: the log does not say both workers push by host: %s", out);
    char a[1300], b[1300] = "host.st"; /* same_file's names are tmp's */
    snprintf(a, sizeof a, "worker.st");
    CHECKF(same_file(a, b), "--ps-push host: the weights differ from --ps-push worker's "
           "(largest difference %g)", checkpoint_max_diff(a, b));
    int v[2] = {0, 0};
    snprintf(a, sizeof a, "%s/host.jsonl", tmp);
    for_each_event(a, "ps_push", NULL, tally_push, v);
    CHECKF(v[0] == 2 && v[1] == 1, "--ps-push host: %d ps_push events say host, %d say it "
           "leads; expected 2 and 1", v[0], v[1]);

    /* killed at step 33 (every task), resumed from the checkpoint at 28 */
    rc = train("DOWNPOUR_FAULT_KILL_AT_STEP=33", "resumed", "host", "");
    CHECKF(rc != 0, "--ps-push host: the run meant to be killed at step 33 exited 0");
    rc = train("", "resumed", "host", "--resume");
    CHECKF(rc == 0 && strstr(out, "ckpt-0000000028.safetensors (step 28)"),
           "--ps-push host: the resumed run exited %d or did not resume from step 28: %s", rc,
           out);
    snprintf(a, sizeof a, "resumed.st");
    CHECKF(same_file(a, b), "--ps-push host: the resumed weights differ from the uninterrupted "
           "run's (largest difference %g)", checkpoint_max_diff(a, b));
}

/* A run of 60 steps a worker, each paced to 8 ms (launch_test_init). */
#define PACED "--dataset mnist --model 784-128-10 --train-size 12000 --val-size 1000 " \
              "--epochs 1 --batch 100 --threads 1 --no-progress --log-every 10"

/* worker:`victim` SIGKILLed once worker 1 logged step 20 of its 60. */
static void survives(const char *victim, const char *line)
{
    char name[64], args[2048];
    snprintf(name, sizeof name, "kill-%s", victim);
    snprintf(args, sizeof args, CLUSTER " -- train --strategy ps-sync --ps-push host " PACED
             " --heartbeat-timeout 1 --metrics %s/%s.jsonl", tmp, name);
    pid_t l = start(name, args);
    pid_t w = await_task(l, name, "Worker 1, At step 20,", victim);
    if (w > 0)
        kill(w, SIGKILL);
    int rc = finish(l, 300);
    CHECKF(rc == 0, "%s killed: the run exited %d", victim, rc);
    CHECKF(log_has(name, line), "%s killed: the log does not say \"%s\"", victim, line);
    CHECKF(count_events(name, "fault") >= 1, "%s killed: no fault event", victim);
    double acc = test_accuracy(name);
    CHECKF(acc > 0.8, "%s killed: test accuracy %.4f", victim, acc);
    if (rc != 0 || !log_has(name, line))
        show_log(name, 30);
}

static void refused(const char *args, const char *why)
{
    int rc = run_cmd(out, sizeof out, "%s launch " CLUSTER " -- train %s " SMALL, bin, args);
    CHECKF(rc == 2 && strstr(out, why), "%s: exit %d, expected 2 naming \"%s\": %s", args, rc,
           why, out);
}

int main(void)
{
    launch_test_init();
    unsetenv("DOWNPOUR_TEST_STEP_MS"); /* the equalities need no pace */
    same_as_per_worker();
    refused("--strategy ps-async --ps-push host", "only ps-sync sums every worker's gradient");
    refused("--strategy ps-sync --ps-push host --compress bf16", "not with --compress");
    refused("--strategy ps-sync --ps-push hosts", "'hosts' is not worker, host or auto");
    setenv("DOWNPOUR_TEST_STEP_MS", "8", 1);
    /* the leader: its member falls back (a lost member, the leader's side,
     * is test_ps_host's, bit for bit) */
    survives("worker:0", "this worker pushes on its own from step");
    return CHECK_DONE();
}
