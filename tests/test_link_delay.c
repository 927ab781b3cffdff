/* --link-delay-ms (docs/cluster.md, "A virtual cluster on one machine") and
 * `downpour metrics merge`, the two pieces scripts/vcluster.sh adds to the
 * program:
 *   1. a ping between two local tasks with a 50 ms delay takes at least
 *      2 x 50 ms a round trip (each side's reply waits its delay: a lower
 *      bound, which a loaded machine only raises); without it, under 50 ms;
 *   2. bad values are refused with the flag named and status 2;
 *   3. merge writes each task's lines with "task" added, in the order given,
 *      then a resource_total; a bad TASK=FILE argument is refused. */
#include "proc.h"

#define DELAY_MS 50

/* The median round trip (us) of the ping run's metrics, or -1. */
static double ping_median(const char *metrics)
{
    cJSON *p = last_event(metrics, "ping", NULL);
    double us = p ? json_num(p, "rtt_median_us") : -1;
    cJSON_Delete(p);
    return us;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    const char *bin = test_bin(), *tmp = test_tmp();
    char err[4096];

    /* 1. Round trips with and without the delay. */
    int rc = run_cmd(err, sizeof err,
                     "'%s' launch --workers 2 -- ping --count 4 --link-delay-ms %d --metrics "
                     "'%s/slow.jsonl'", bin, DELAY_MS, tmp);
    CHECKF(rc == 0, "ping with --link-delay-ms exited %d: %s", rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/slow.jsonl", tmp);
    double slow = ping_median(path);
    rc = run_cmd(err, sizeof err, "'%s' launch --workers 2 -- ping --count 4 --metrics '%s/fast.jsonl'",
                 bin, tmp);
    CHECKF(rc == 0, "ping exited %d: %s", rc, err);
    snprintf(path, sizeof path, "%s/fast.jsonl", tmp);
    double fast = ping_median(path);
    fprintf(stderr, "median round trip: %.1f ms with a %d ms link delay, %.3f ms without\n",
            slow / 1e3, DELAY_MS, fast / 1e3);
    CHECKF(slow >= 2 * DELAY_MS * 1e3, "round trip %.1f ms < 2 x %d ms", slow / 1e3, DELAY_MS);
    CHECKF(fast >= 0 && fast < DELAY_MS * 1e3, "round trip without delay %.1f ms", fast / 1e3);

    /* 2. Bad values. */
    rc = run_cmd(err, sizeof err, "'%s' train --link-delay-ms 20000", bin);
    CHECKF(rc == 2 && strstr(err, "--link-delay-ms"), "--link-delay-ms 20000: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "'%s' train --link-delay-ms -1", bin);
    CHECKF(rc == 2 && strstr(err, "--link-delay-ms"), "--link-delay-ms -1: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "'%s' train --link-delay-ms 5 --transport mpi", bin);
    CHECKF(rc == 2 && strstr(err, "--link-delay-ms"), "--link-delay-ms with mpi: %d %s", rc, err);

    /* 3. metrics merge. */
    char a[1200], b[1200], out[1200];
    snprintf(a, sizeof a, "%s/m.worker-0", tmp);
    snprintf(b, sizeof b, "%s/m.ps-0", tmp);
    snprintf(out, sizeof out, "%s/m.jsonl", tmp);
    write_file(a, "{\"event\":\"resource\",\"t\":1.0,\"cpu_percent\":50,\"rss_bytes\":100,"
                  "\"net_tx_bytes\":10,\"net_rx_bytes\":20}\n"
                  "{\"event\":\"done\",\"t\":2.5,\"test_accuracy\":0.9}\n");
    write_file(b, "{\"event\":\"resource\",\"t\":1.5,\"task\":\"ps:0\",\"cpu_percent\":30,"
                  "\"rss_bytes\":200,\"net_tx_bytes\":20,\"net_rx_bytes\":10}\n");
    rc = run_cmd(err, sizeof err, "'%s' metrics merge --out '%s' worker:0='%s' ps:0='%s'", bin, out,
                 a, b);
    CHECKF(rc == 0, "metrics merge exited %d: %s", rc, err);
    CHECK(for_each_event(out, "done", "worker:0", NULL, NULL) == 1);
    CHECK(for_each_event(out, "resource", "worker:0", NULL, NULL) == 1);
    CHECK(for_each_event(out, "resource", "ps:0", NULL, NULL) == 1);
    cJSON *total = last_event(out, "resource_total", NULL);
    CHECK(total != NULL);
    if (total) {
        CHECK(json_num(total, "tasks") == 2);
        CHECK(json_num(total, "net_tx_bytes") == 30);
        CHECK_NEAR(json_num(total, "t"), 2.5, 1e-9); /* the largest "t" without --seconds */
    }
    cJSON_Delete(total);
    rc = run_cmd(err, sizeof err, "'%s' metrics merge --out '%s' wrker:0='%s'", bin, out, a);
    CHECKF(rc == 2 && strstr(err, "wrker"), "bad task: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "'%s' metrics merge --out '%s' '%s'", bin, out, a);
    CHECKF(rc == 2 && strstr(err, "TASK=FILE"), "no task: %d %s", rc, err);
    rc = run_cmd(err, sizeof err, "'%s' metrics merge worker:0='%s'", bin, a);
    CHECKF(rc == 2 && strstr(err, "--out"), "no --out: %d %s", rc, err);
    return CHECK_DONE();
}
