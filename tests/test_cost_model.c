/* The cost model (docs/cost_model.md): bytes on the wire by hand, the
 * invariants a prediction must keep, the recommendation on a slow link, the
 * calibration read from a metrics file, and bad input refused. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/cost_model.h"
#include "scratch.h"

static dp_cost_calibration mlp_cal(void)
{
    dp_cost_calibration cal;
    dp_cost_calibration_init(&cal);
    cal.sample_s = 10e-6;
    cal.n_params = 266610; /* mlp-300-100 */
    return cal;
}

static dp_cost_cluster cluster(int hosts, double bw, int workers, int ps)
{
    dp_cost_cluster c = {.hosts = hosts, .cores = 4, .bandwidth = bw, .latency = 1e-4,
                         .workers = workers, .ps = ps, .chief = 1};
    return c;
}

int main(void)
{
    dp_err err;
    dp_cost_calibration cal = mlp_cal();
    dp_cost_job job;
    dp_cost_job_init(&job);

    /* ps bytes by hand: 266,610 floats = 1,066,440 bytes >= 2 x 256 KiB, so
     * 2 ps tasks hold 133,305 floats each; a push frame is a 48-byte header,
     * a 16-byte push head and the floats, under 1 MiB: no chunk CRCs. */
    double push, pull;
    REQUIRE(dp_cost_ps_bytes(266610, 2, &push, &pull, &err) == 0);
    CHECK_NEAR(push, 2 * (48 + 16 + 4 * 133305.0), 0);
    CHECK_NEAR(pull, 2 * (48 + 4 * 133305.0), 0);
    /* One ps: one 1,066,440-byte payload, two chunks, one extra CRC. */
    REQUIRE(dp_cost_ps_bytes(266610, 1, &push, &pull, &err) == 0);
    CHECK_NEAR(pull, 48 + 4 * 266610.0 + 4, 0);

    /* Ring: 2(n-1)/n of the gradient, plus headers. 4 MiB in 512 KiB
     * buckets, n = 4: 8 buckets x 6 hops x one 128 KiB segment. */
    size_t np = (4u << 20) / 4;
    double rb = dp_cost_ring_bytes(np, 4, 512u << 10);
    CHECK_NEAR(rb, 2.0 * 3 / 4 * (4u << 20) + 8 * 6 * 48, 0);
    CHECK(dp_cost_ring_bytes(np, 1, 512u << 10) == 0);

    /* More bandwidth is never slower, for every strategy. */
    for (int s = 0; s < DP_COST_STRATEGY_COUNT; s++) {
        job.strategy = (dp_cost_strategy)s;
        double prev = 1e300;
        for (double bw = 1e6; bw <= 1e11; bw *= 3) {
            dp_cost_cluster c = cluster(4, bw, 3, s == DP_COST_ALLREDUCE ? 0 : 1);
            dp_cost_prediction p;
            REQUIRE(dp_cost_predict(&cal, &c, &job, &p, &err) == 0);
            CHECKF(p.total_s <= prev * (1 + 1e-12), "%s at %g B/s: %g s after %g s",
                   dp_cost_strategy_name(job.strategy), bw, p.total_s, prev);
            prev = p.total_s;
        }
    }

    /* ps-async on 2 ps: each ps host carries (workers / ps) x params x 4
     * bytes each way a round, one task a host. */
    job.strategy = DP_COST_PS_ASYNC;
    dp_cost_cluster c9 = cluster(9, 125e6, 6, 2);
    dp_cost_prediction p;
    REQUIRE(dp_cost_predict(&cal, &c9, &job, &p, &err) == 0);
    CHECK_NEAR(p.busiest_link_bytes, 6 * (48 + 16 + 4 * 133305.0), 0);
    CHECK_NEAR(p.bytes_per_step, 2 * (48 + 16 + 4 * 133305.0), 0);
    CHECK(p.steps_per_epoch == 71); /* ceil(ceil(54000 / 6) / 128) */
    CHECK(p.total_s > job.epochs * p.epoch_s * 0.999);

    /* A slow link (10 MB/s) and slower compute: ps-sync and ps-async put
     * 8 workers' shard bytes through one ps host, the ring sends 2(n-1)/n of
     * the gradient per replica; all-reduce must win, and ps be link-bound.
     * At 1 MB/s nothing distributed pays: single wins. */
    dp_cost_prediction preds[DP_COST_STRATEGY_COUNT];
    dp_cost_strategy order[DP_COST_STRATEGY_COUNT];
    char text[2048];
    dp_cost_calibration slowcpu = cal;
    slowcpu.sample_s = 1e-3;
    dp_cost_cluster slow = cluster(10, 1e7, 8, 1);
    int n = dp_cost_recommend(&slowcpu, &slow, &job, preds, order, text, sizeof text, &err);
    REQUIRE(n == DP_COST_STRATEGY_COUNT);
    CHECKF(order[0] == DP_COST_ALLREDUCE, "first %s:\n%s", dp_cost_strategy_name(order[0]), text);
    CHECK(preds[DP_COST_PS_SYNC].busiest_link_bytes > preds[DP_COST_ALLREDUCE].busiest_link_bytes);
    CHECK(preds[DP_COST_PS_SYNC].bottleneck == DP_COST_BOUND_PS_LINK);
    CHECK(preds[DP_COST_PS_ASYNC].bottleneck == DP_COST_BOUND_PS_LINK);
    CHECK(strstr(text, "Suits this cluster: allreduce") != NULL);
    slow.bandwidth = 1e6;
    REQUIRE(dp_cost_recommend(&cal, &slow, &job, preds, order, text, sizeof text, &err) == n);
    CHECKF(order[0] == DP_COST_SINGLE, "first %s:\n%s", dp_cost_strategy_name(order[0]), text);
    CHECK(order[1] == DP_COST_ALLREDUCE);
    dp_cost_cluster fast = cluster(10, 1e10, 8, 1);
    REQUIRE(dp_cost_recommend(&slowcpu, &fast, &job, preds, order, text, sizeof text, &err) == 4);
    for (int i = 0; i < n; i++)
        CHECK(preds[order[i]].bottleneck == DP_COST_BOUND_COMPUTE);
    CHECK(order[3] == DP_COST_SINGLE); /* 9 replicas beat one on compute */

    /* Tasks sharing a host's cores: 3 all-reduce replicas on one host of 2
     * cores compute slower than on 3 hosts. */
    job.strategy = DP_COST_ALLREDUCE;
    dp_cost_cluster one = {1, 2, 1e9, 0, 2, 0, 1}, three = {3, 2, 1e9, 0, 2, 0, 1};
    dp_cost_prediction p1, p3;
    REQUIRE(dp_cost_predict(&cal, &one, &job, &p1, &err) == 0);
    REQUIRE(dp_cost_predict(&cal, &three, &job, &p3, &err) == 0);
    CHECK_NEAR(p1.compute_s, 128 * 10e-6 * 1.5, 1e-12); /* 2/3 of a core each */
    CHECK(p3.compute_s < p1.compute_s);

    /* Bad input is refused, naming the field. */
    dp_cost_cluster bad = cluster(0, 1e9, 2, 1);
    CHECK(dp_cost_predict(&cal, &bad, &job, &p, &err) < 0 && strstr(err.msg, "hosts"));
    bad = cluster(2, 0, 2, 1);
    CHECK(dp_cost_predict(&cal, &bad, &job, &p, &err) < 0 && strstr(err.msg, "bandwidth"));
    bad = cluster(2, 1e9, 2, 1);
    CHECK(dp_cost_predict(&cal, &bad, &job, &p, &err) < 0 && strstr(err.msg, "ps task"));
    job.strategy = DP_COST_PS_ASYNC;
    bad.ps = 0;
    CHECK(dp_cost_predict(&cal, &bad, &job, &p, &err) < 0 && strstr(err.msg, "ps task"));
    dp_cost_calibration nocal = cal;
    nocal.sample_s = 0;
    CHECK(dp_cost_predict(&nocal, &c9, &job, &p, &err) < 0 && strstr(err.msg, "sample_s"));

    /* Calibration from a metrics fixture: step medians 2.0, 3.0, 2.5 ms at
     * batch 100 give 2.5 ms; less the update of 266,610 parameters. */
    char dir[512], path[600];
    scratch_make(dir, sizeof dir, "cost");
    snprintf(path, sizeof path, "%s/cal.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"event\":\"resource\",\"t\":0,\"task\":\"worker:0\",\"cpu_percent\":0}\n"
          "{\"event\":\"steps\",\"t\":1,\"epoch\":1,\"steps\":10,\"step_ms_median\":2.0}\n"
          "{\"event\":\"steps\",\"t\":2,\"epoch\":2,\"steps\":10,\"step_ms_median\":3.0}\n"
          "{\"event\":\"steps\",\"t\":3,\"epoch\":3,\"steps\":10,\"step_ms_median\":2.5}\n"
          "{\"event\":\"done\",\"t\":4,\"test_accuracy\":0.9,\"train_seconds\":1.5,"
          "\"samples_per_second\":40000,\"strategy\":\"single\",\"model\":\"mlp-300-100\","
          "\"batch\":100,\"epochs\":3,\"workers\":1,\"ps\":0}\n",
          f);
    fclose(f);
    dp_cost_calibration got;
    dp_cost_calibration_init(&got);
    int batch = 0;
    REQUIRE(dp_cost_calibrate_from_metrics(path, &got, &batch, &err) == 0);
    CHECK(batch == 100 && got.n_params == 266610);
    CHECK_NEAR(got.sample_s, (2.5e-3 - got.apply_s_per_param * 266610) / 100, 1e-12);
    dp_cost_run run;
    REQUIRE(dp_cost_read_done(path, &run, &err) == 0);
    CHECK(strcmp(run.strategy, "single") == 0 && run.epochs == 3 && run.train_seconds == 1.5);

    /* Without steps events: the done event's samples_per_second. */
    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"event\":\"done\",\"t\":4,\"train_seconds\":1.5,\"samples_per_second\":40000,"
          "\"strategy\":\"single\",\"model\":\"mlp-128\",\"batch\":100,\"epochs\":1}\n",
          f);
    fclose(f);
    REQUIRE(dp_cost_calibrate_from_metrics(path, &got, &batch, &err) == 0);
    CHECK(got.n_params == 101770);
    CHECK_NEAR(got.sample_s, (100 / 40000.0 - got.apply_s_per_param * 101770) / 100, 1e-12);

    /* A cluster run, a broken line, no done event: refused. */
    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"event\":\"done\",\"train_seconds\":1,\"samples_per_second\":1,\"strategy\":"
          "\"ps-async\",\"model\":\"mlp-128\",\"batch\":100}\n", f);
    fclose(f);
    CHECK(dp_cost_calibrate_from_metrics(path, &got, &batch, &err) < 0 &&
          strstr(err.msg, "single-process"));
    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"event\":\"steps\",\"step_ms_median\":2}\nnot json\n", f);
    fclose(f);
    CHECK(dp_cost_calibrate_from_metrics(path, &got, &batch, &err) < 0 && strstr(err.msg, ":2:"));
    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"event\":\"steps\",\"step_ms_median\":2}\n", f);
    fclose(f);
    CHECK(dp_cost_calibrate_from_metrics(path, &got, &batch, &err) < 0 && strstr(err.msg, "done"));
    CHECK(dp_cost_calibrate_from_metrics("/nonexistent/x.jsonl", &got, &batch, &err) < 0 &&
          strstr(err.msg, "/nonexistent/x.jsonl"));
    scratch_remove(dir);
    return CHECK_DONE();
}
