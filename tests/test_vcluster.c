/* A three-host virtual cluster (scripts/vcluster.sh): a chief, two workers
 * and one ps, ps-async on mlp-300-100 (1 MiB of parameters, so every push
 * and every pull is 1 MiB), each task in its namespace host at its own
 * address, every host's link capped at 100 Mbit/s (12.5 MB/s) each way.
 *
 * The ps is alone on host 1 (the script's placement), so all its traffic
 * crosses its capped link; the workers, each pushing and pulling, fill it.
 *   1. capped: the run ends 0 with a sane accuracy; the merged metrics hold
 *      every task and a resource_total; the ps's receive rate over its
 *      resource samples is at most 1.1x the cap (tbf counts the
 *      TCP/IP headers too, so the transport's bytes stay under it), its send
 *      rate at most 1.1x, and its bytes over the training time at most 1.1x;
 *   2. the cap bound: tbf on the ps's link counts packets it held back
 *      (a rate comparison with an uncapped run, as before, depends on the
 *      CPU the workers get, not on the cap).
 * Skipped (77) when not root, without ip or tc, without MNIST, or when
 * namespaces cannot be made here.  The script removes its namespaces on
 * every way out. */
#include <unistd.h>

#include "proc.h"

#define CAP_MBIT 100
#define CAP_BYTES_S (CAP_MBIT * 1e6 / 8)
#define MIN_ACCURACY 0.70

static char g_script[1024];

static void skip(const char *why)
{
    fprintf(stderr, "skipping: %s\n", why);
    exit(77);
}

/* The ps's resource samples: the first one past 1 MB received (training
 * has begun) and the last one. */
typedef struct window {
    int n;
    double t0, rx0, tx0, t1, rx1, tx1;
} window;

static void take_sample(const cJSON *j, void *ctx)
{
    window *w = ctx;
    double t = json_num(j, "t"), rx = json_num(j, "net_rx_bytes"), tx = json_num(j, "net_tx_bytes");
    if (rx < 1e6)
        return;
    if (w->n++ == 0) {
        w->t0 = t;
        w->rx0 = rx;
        w->tx0 = tx;
    }
    w->t1 = t;
    w->rx1 = rx;
    w->tx1 = tx;
}

typedef struct run_result {
    double accuracy, train_seconds, ps_rx_total;
    window w;
} run_result;

/* Runs the cluster with links capped at mbit (0: uncapped) and reads its
 * merged metrics. */
static int run_cluster(int mbit, run_result *res)
{
    char metrics[1200], dir[1200], err[8192];
    snprintf(metrics, sizeof metrics, "%s/run%d.jsonl", test_tmp(), mbit);
    snprintf(dir, sizeof dir, "%s/files%d", test_tmp(), mbit);
    int rc = run_cmd(err, sizeof err,
                     "'%s' --bin '%s' --dir '%s' --hosts 3 --link-mbit %d --tc-stats '%s/tc%d' "
                     "--chief --workers 2 "
                     "--ps 1 --timeout 120 -- train --strategy ps-async --model mlp-300-100 "
                     "--train-size 6000 --val-size 1000 --epochs 1 --batch 128 --seed 1 "
                     "--log-every 0 --no-progress --startup-timeout 30 --metrics '%s'",
                     g_script, test_bin(), dir, mbit, test_tmp(), mbit, metrics);
    CHECKF(rc == 0, "vcluster.sh --link-mbit %d exited %d:\n%s", mbit, rc, err);
    if (rc != 0)
        return -1;
    /* Real addresses: the spec names the namespace hosts, and the ps is
     * alone on host 1. */
    char spec_path[1300];
    snprintf(spec_path, sizeof spec_path, "%s/cluster.json", dir);
    size_t len;
    char *spec = slurp(spec_path, &len);
    CHECKF(spec && strstr(spec, "\"10.77.") && !strstr(spec, "127.0.0.1"),
           "the spec does not name the hosts' addresses: %s", spec ? spec : "(none)");
    free(spec);
    CHECKF(strstr(err, "ps:0 on host 1 (10.77.") != NULL, "ps:0 is not on host 1:\n%s", err);
    const char *on_1 = strstr(err, "on host 1 ");
    CHECKF(on_1 && !strstr(on_1 + 1, "on host 1 "), "ps:0 shares host 1:\n%s", err);

    for (int i = 0; i < 4; i++) {
        static const char *tasks[] = {"chief:0", "worker:0", "worker:1", "ps:0"};
        CHECKF(for_each_event(metrics, "resource", tasks[i], NULL, NULL) > 0,
               "no resource events of %s in the merged metrics", tasks[i]);
    }
    cJSON *total = last_event(metrics, "resource_total", NULL);
    CHECKF(total && json_num(total, "tasks") == 4, "no resource_total over 4 tasks");
    cJSON_Delete(total);
    cJSON *done = last_event(metrics, "done", NULL);
    CHECKF(done != NULL, "no done event");
    res->accuracy = done ? json_num(done, "test_accuracy") : -1;
    res->train_seconds = done ? json_num(done, "train_seconds") : -1;
    cJSON_Delete(done);
    cJSON *last = last_event(metrics, "resource", "ps:0");
    res->ps_rx_total = last ? json_num(last, "net_rx_bytes") : -1;
    cJSON_Delete(last);
    memset(&res->w, 0, sizeof res->w);
    for_each_event(metrics, "resource", "ps:0", take_sample, &res->w);
    return 0;
}

int main(void)
{
    if (geteuid() != 0)
        skip("network namespaces need root");
    REQUIRE(test_bin() && test_tmp());
    if (system("command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1") != 0)
        skip("'ip' or 'tc' (iproute2) is not installed");
    require_mnist();
    test_script(g_script, sizeof g_script, "DOWNPOUR_VCLUSTER_SH", "vcluster.sh");
    if (access(g_script, X_OK) != 0)
        skip("scripts/vcluster.sh not found (set DOWNPOUR_VCLUSTER_SH)");
    char probe[256];
    snprintf(probe, sizeof probe, "ip netns add vp%ld >/dev/null 2>&1 && ip netns del vp%ld",
             (long)getpid(), (long)getpid());
    if (system(probe) != 0)
        skip("cannot create a network namespace here");
    setenv("OPENBLAS_NUM_THREADS", "1", 1);

    /* 1. Capped at 100 Mbit/s. */
    run_result cap;
    if (run_cluster(CAP_MBIT, &cap) < 0)
        return CHECK_DONE();
    CHECKF(cap.accuracy >= MIN_ACCURACY, "capped: test accuracy %.4f < %.2f", cap.accuracy,
           MIN_ACCURACY);
    double span = cap.w.t1 - cap.w.t0;
    double rx_rate = span > 0 ? (cap.w.rx1 - cap.w.rx0) / span : 0;
    double tx_rate = span > 0 ? (cap.w.tx1 - cap.w.tx0) / span : 0;
    double mean_rate = cap.train_seconds > 0 ? cap.ps_rx_total / cap.train_seconds : 0;
    fprintf(stderr,
            "capped at %d Mbit/s (%.2f MB/s): ps:0 received %.2f MB/s and sent %.2f MB/s over "
            "%.1f s of samples; %.1f MB over %.2f s of training (%.2f MB/s); accuracy %.4f\n",
            CAP_MBIT, CAP_BYTES_S / 1e6, rx_rate / 1e6, tx_rate / 1e6, span,
            cap.ps_rx_total / 1e6, cap.train_seconds, mean_rate / 1e6, cap.accuracy);
    CHECKF(cap.w.n >= 3 && span >= 1.5, "too few resource samples of ps:0 while training "
           "(%d over %.1f s)", cap.w.n, span);
    /* How close to the cap the workers come depends on the CPU they get (a
     * loaded machine: 4.8 MB/s); that the cap bound is tbf's own count of
     * packets it held back on the ps's link, whatever the load. */
    CHECKF(rx_rate <= 1.1 * CAP_BYTES_S, "ps:0 received %.2f MB/s, above the cap %.2f MB/s",
           rx_rate / 1e6, CAP_BYTES_S / 1e6);
    char tc_path[1200], tc[2048] = "";
    snprintf(tc_path, sizeof tc_path, "%s/tc%d", test_tmp(), CAP_MBIT);
    FILE *f = fopen(tc_path, "r");
    size_t got = f ? fread(tc, 1, sizeof tc - 1, f) : 0;
    tc[got] = '\0';
    if (f)
        fclose(f);
    const char *in1 = strstr(tc, "host 1 in sent ");
    long long sent = 0, over = 0;
    CHECKF(in1 && sscanf(in1, "host 1 in sent %lld overlimits %lld", &sent, &over) == 2,
           "no tc counters for the ps's link in %s: %s", tc_path, tc);
    fprintf(stderr, "tc on the ps's link, toward it: %lld bytes sent, %lld overlimits\n", sent,
            over);
    CHECKF(sent >= cap.ps_rx_total && over > 0,
           "the cap did not bind on the ps's link: %lld bytes, %lld overlimits (the ps received "
           "%.0f bytes)", sent, over, cap.ps_rx_total);
    CHECKF(tx_rate <= 1.1 * CAP_BYTES_S, "ps:0 sent %.2f MB/s, above the cap %.2f MB/s",
           tx_rate / 1e6, CAP_BYTES_S / 1e6);
    CHECKF(mean_rate <= 1.1 * CAP_BYTES_S, "ps:0 received %.2f MB/s over the training, above "
           "the cap %.2f MB/s", mean_rate / 1e6, CAP_BYTES_S / 1e6);

    return CHECK_DONE();
}
