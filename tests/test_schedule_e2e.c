/* The warm-up and the step schedule end to end, on MNIST (docs/training.md,
 * "Learning-rate schedule"): each epoch event's rate (its last step's) at
 * 10 steps an epoch, and the refusals of nonsense values, naming the flag. */
#include "proc.h"

static char err[65536];

#define COMMON                                                                                  \
    "--train-size 1280 --val-size 200 --test-size 200 --batch 128 --epochs 3 --optimizer sgd " \
    "--lr 0.1 --threads 1 --no-progress --log-every 0"

typedef struct rates {
    int n;
    double lr[8];
} rates;

static void keep_rate(const cJSON *j, void *ctx)
{
    rates *r = ctx;
    if (r->n < 8)
        r->lr[r->n++] = json_num(j, "lr");
}

/* The epochs' rates of a run with these flags. */
static void check_rates(const char *flags, const char *name, const double want[3])
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", test_tmp(), name);
    int rc = run_cmd(err, sizeof err, "%s train " COMMON " %s --metrics %s", test_bin(), flags,
                     path);
    CHECKF(rc == 0, "%s exited %d: %s", flags, rc, err);
    rates r = {0};
    for_each_event(path, "epoch", NULL, keep_rate, &r);
    CHECKF(r.n == 3, "%s: %d epoch events", flags, r.n);
    for (int e = 0; e < r.n && e < 3; e++)
        CHECKF(fabs(r.lr[e] - want[e]) <= 1e-7, "%s: epoch %d's rate %.9g, want %.9g", flags,
               e + 1, r.lr[e], want[e]);
}

static void usage(const char *flags, const char *want)
{
    int rc = run_cmd(err, sizeof err, "%s train " COMMON " %s", test_bin(), flags);
    CHECKF(rc == 2 && strstr(err, want), "%s: exit %d, want 2 and '%s': %s", flags, rc, want,
           err);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    /* warm-up over 2 epochs (20 steps): step 9 runs at 10/20 */
    check_rates("--warmup-epochs 2", "warm", (const double[3]){0.05, 0.1, 0.1});
    check_rates("--warmup-steps 25", "warm25", (const double[3]){0.04, 0.08, 0.1});
    /* halved every epoch: the last steps of epochs 1, 2, 3 are steps 9, 19, 29 */
    check_rates("--lr-schedule step --lr-step-every 1 --lr-gamma 0.5", "step",
                (const double[3]){0.1, 0.05, 0.025});
    check_rates("--lr-schedule step --lr-step-every 2 --warmup-steps 5", "stepwarm",
                (const double[3]){0.1, 0.1, 0.01});
    /* cosine after a warm-up of 10 steps: step 19 is 9/20 of the way down */
    check_rates("--lr-schedule cosine --warmup-steps 10", "cos",
                (const double[3]){0.1, 0.1 * 0.5 * (1 + cos(M_PI * 9 / 20)),
                                  0.1 * 0.5 * (1 + cos(M_PI * 19 / 20))});

    usage("--lr-schedule step", "--lr-schedule step needs --lr-step-every");
    usage("--lr-schedule step --lr-step-every 1 --lr-gamma 0", "--lr-gamma 0:");
    usage("--lr-schedule step --lr-step-every 1 --lr-gamma 1.5", "--lr-gamma 1.5:");
    usage("--lr-gamma 0.5", "--lr-step-every and --lr-gamma are for --lr-schedule step");
    usage("--lr-schedule step --lr-step-every 0", "--lr-step-every");
    usage("--warmup-steps 5 --warmup-epochs 1", "--warmup-steps and --warmup-epochs");
    usage("--warmup-epochs 4", "--warmup-epochs 4: the warm-up is longer than the run");
    usage("--warmup-steps -1", "--warmup-steps");
    usage("--lr-schedule linear", "--lr-schedule");
    int rc = run_cmd(err, sizeof err, "%s train " COMMON " --warmup-steps 31", test_bin());
    CHECKF(rc == 1 && strstr(err, "--warmup-steps 31: the warm-up is longer than the run's 30"),
           "--warmup-steps 31: exit %d: %s", rc, err);
    return CHECK_DONE();
}
