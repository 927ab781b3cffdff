/* The cost model (docs/cost_model.md): bytes on the wire by hand, the
 * invariants a prediction must keep, the recommendation on a slow link, the
 * calibration read from a metrics file, and bad input refused.  Sparse
 * traffic: the unique ids a batch of `downpour data synth ctr`'s Zipf ids
 * touches, predicted from the distribution, against those counted
 * (dp_model_sparse_rows) over 300 batches, within 3 %; the all-gather's and
 * the ps rows' bytes then follow by the formulas checked by hand here and on
 * the wire in test_allreduce_sparse and test_ps_sparse. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/cost_model.h"
#include "downpour/model.h"
#include "downpour/sparse.h"
#include "downpour/synth_ctr.h"
#include "scratch.h"
#include "downpour/ps_auto.h"

/* Predicted against measured sparse bytes on 8-emb1000x16-gap-2 fed the
 * synthetic set's 8 categorical columns (Zipf 1.1 over 1,000 ids each). */
static void check_sparse(void)
{
    dp_err err;
    dp_ctr_synth syn = dp_ctr_synth_defaults();
    REQUIRE(dp_ctr_synth_init(&syn, &err) == 0);
    int width = dp_ctr_synth_width(&syn);
    const int batch = 64, batches = 300;
    dp_model m;
    REQUIRE(dp_model_init(&m, "8-emb1000x16-gap-2", batch, 1, &err) == 0);
    dp_sparse_table t;
    REQUIRE(dp_model_sparse_tables(&m, &t, 1) == 1);
    static float x[64 * 8], row[64];
    static uint32_t ids[64 * 8];
    REQUIRE(width <= 64);
    double measured = 0;
    for (int b = 0; b < batches; b++) {
        for (int r = 0; r < batch; r++) {
            uint8_t y;
            double p;
            dp_ctr_synth_row(&syn, 0, (uint64_t)(b * batch + r), row, &y, &p);
            memcpy(x + r * 8, row, 8 * sizeof(float)); /* the 8 features' ids */
        }
        measured += (double)dp_model_sparse_rows(&m, &t, x, batch, ids);
    }
    measured /= batches;
    double predicted = dp_cost_zipf_unique(1000, syn.zipf, 8.0 * batch);
    fprintf(stderr, "unique rows a batch of %d: predicted %.1f, measured %.1f (of %d ids)\n",
            batch, predicted, measured, 8 * batch);
    CHECKF(fabs(predicted / measured - 1) < 0.03, "unique rows: predicted %.1f, measured %.1f",
           predicted, measured);
    dp_cost_sparse sp = {.tables = 1, .table_floats = 16000, .width = {16},
                         .rows = {predicted}, .bound = {8.0 * batch}};
    dp_cost_sparse meas = sp;
    meas.rows[0] = measured;
    /* the all-gather: n-1 blocks of 4 + u (4 + 64) bytes, one frame each */
    for (int n = 2; n <= 4; n++) {
        double pb = dp_cost_gather_bytes(&sp, n, 0), mb = dp_cost_gather_bytes(&meas, n, 0);
        CHECK_NEAR(mb, (n - 1) * (48 + 4 + measured * 68), 1e-6);
        CHECKF(fabs(pb / mb - 1) < 0.03, "gather bytes, %d replicas: predicted %.0f, "
               "measured %.0f", n, pb, mb);
        int g;
        double all = dp_cost_allreduce_sparse_bytes(m.n_params, &sp, n, 512u << 10, &g);
        /* the bound, 4 + 512 x 68 = 34,820 bytes a block, against 2/n x 64,000:
         * below it for 2 and 3 replicas, above for 4 (all-reduced whole) */
        CHECK(g == (n < 4));
        CHECK_NEAR(all, g ? dp_cost_ring_bytes(m.n_params - 16000, n, 512u << 10) + pb
                          : dp_cost_ring_bytes(m.n_params, n, 512u << 10), 1e-6);
        fprintf(stderr, "allreduce, %d replicas: %.0f bytes a step sent by rows, %.0f whole\n",
                n, all, dp_cost_ring_bytes(m.n_params, n, 512u << 10));
    }
    /* a bound no smaller than the table: all-reduced whole, as the strategy chooses */
    dp_cost_sparse big = sp;
    big.bound[0] = 1000;
    int g = 1;
    CHECK_NEAR(dp_cost_allreduce_sparse_bytes(m.n_params, &big, 2, 512u << 10, &g),
               dp_cost_ring_bytes(m.n_params, 2, 512u << 10), 0);
    CHECK(g == 0);
    /* ps rows by hand (docs/strategies.md, "Bytes per step"): 2 shards of
     * the 34 dense floats (17 each), u/2 rows each */
    double sent, recv;
    meas.rows[0] = 100;
    REQUIRE(dp_cost_sparse_ps_bytes(m.n_params, &meas, 2, &sent, &recv, &err) == 0);
    CHECK(m.n_params == 16034);
    CHECK_NEAR(sent, 2 * ((48 + 4 + 4 * 50.0) + (48 + 16 + 4 * 17.0 + 4 + 50 * 68.0)), 0);
    CHECK_NEAR(recv, 2 * ((48 + 4 * 50.0 * 16) + (48 + 4 * 17.0)), 0);
    /* the prediction uses them */
    dp_cost_calibration cal;
    dp_cost_calibration_init(&cal);
    cal.sample_s = 10e-6;
    cal.n_params = m.n_params;
    dp_cost_cluster cl = {.hosts = 3, .cores = 4, .bandwidth = 1e8, .latency = 1e-4,
                          .workers = 2, .ps = 2, .chief = 1};
    dp_cost_job job;
    dp_cost_job_init(&job);
    job.strategy = DP_COST_PS_ASYNC;
    job.sparse = &meas;
    dp_cost_prediction p;
    REQUIRE(dp_cost_predict(&cal, &cl, &job, &p, &err) == 0);
    CHECK_NEAR(p.bytes_per_step, sent, 0);
    job.strategy = DP_COST_ALLREDUCE;
    cl.ps = 0;
    REQUIRE(dp_cost_predict(&cal, &cl, &job, &p, &err) == 0);
    CHECK_NEAR(p.bytes_per_step, dp_cost_allreduce_sparse_bytes(m.n_params, &meas, 3, job.bucket_bytes, NULL), 0);
    dp_model_free(&m);
}

static dp_cost_calibration mlp_cal(void)
{
    dp_cost_calibration cal;
    dp_cost_calibration_init(&cal);
    cal.sample_s = 10e-6;
    cal.n_params = 266610; /* mlp-300-100 */
    return cal;
}

/* All-reduce algorithms and codecs (docs/cost_model.md, "All-reduce
 * algorithms and compression"): bytes on the links by hand, auto's rule and
 * its codec choice, PowerSGD's plan. */
/* --compress auto under the ps family (docs/cost_model.md): the workers'
 * rule (ps_auto.c) on the seconds a byte their timed pull would see, every
 * worker's f32 answers through the busiest link at once.  784-64-10 (50,890
 * floats, one shard), the top-k coder at 17.4 ns a float, counted twice:
 * 1.770972 ms.  Frames a step: none 48 + 16 + 4n = 203,624 up; topk:0.1
 * 48 + 16 + 8 + 8 x 5,089 = 40,784 up, 4-bit answers 48 + 12 + 25,445 =
 * 25,505 down; topk:0.05 48 + 16 + 8 + 8 x 2,545 = 20,432 up (25,505 the
 * longer way).  The rule takes the largest ratio within a third of none:
 * 0.1 from 65.4 ns a byte, 0.05 from 41.8 ns, none at 0.08 ns. */
static void check_ps_auto(const dp_cost_calibration *small)
{
    dp_err err;
    dp_cost_prediction a;
    dp_cost_job pj;
    dp_cost_job_init(&pj);
    pj.strategy = DP_COST_PS_ASYNC;
    pj.compress.kind = DP_COMPRESS_AUTO;
    CHECK_NEAR(small->topk_s_per_float, 17.4e-9, 0);
    const double coder = 2 * 50890 * 17.4e-9;
    /* one worker alone on 100 Mbit/s: 80 ns a byte */
    dp_cost_cluster one = {.hosts = 3, .cores = 2, .bandwidth = 12.5e6, .workers = 1, .ps = 1,
                           .chief = 1};
    REQUIRE(dp_cost_predict(small, &one, &pj, &a, &err) == 0);
    CHECKF(a.bytes_per_step == 40784 && a.busiest_link_bytes == 40784, "%g %g",
           a.bytes_per_step, a.busiest_link_bytes);
    CHECK_NEAR(a.comm_s, (40784 + 25505) / 12.5e6 + coder, 1e-12);
    CHECKF(strstr(a.how, "auto: topk:0.1 pushes, 4-bit answers (a step's frames at 80.0 ns a "
                         "byte: none 16.29 ms, coded 5.03 ms)") != NULL, "%s", a.how);
    /* a request's and an answer's latency are part of the timed pull:
     * (16.28864 + 2 x 0.5) ms over 203,608 bytes */
    one.latency = 0.5e-3;
    REQUIRE(dp_cost_predict(small, &one, &pj, &a, &err) == 0);
    CHECKF(strstr(a.how, "at 84.9 ns a byte") != NULL, "%s", a.how);
    one.latency = 0;
    /* the workers' own rule on the same numbers takes the same */
    dp_ps_auto r;
    size_t n = 50890;
    CHECK(dp_ps_auto_rule(&r, &n, 1, 80e-9, 17.4e-9) == 0.1);
    CHECK_NEAR(r.t_none, 203624 * 80e-9, 1e-15);
    CHECK_NEAR(r.t[3], 40784 * 80e-9 + coder, 1e-15);
    /* two workers through the ps host's link at 40 MB/s: 2 x 203,608
     * bytes for one pull's 203,608, 50 ns a byte: topk:0.05 */
    dp_cost_cluster two = {.hosts = 4, .cores = 2, .bandwidth = 40e6, .workers = 2, .ps = 1,
                           .chief = 1};
    REQUIRE(dp_cost_predict(small, &two, &pj, &a, &err) == 0);
    CHECKF(a.bytes_per_step == 20432 && a.busiest_link_bytes == 2 * 25505.0, "%g %g",
           a.bytes_per_step, a.busiest_link_bytes);
    CHECKF(strstr(a.how, "auto: topk:0.05 pushes, 4-bit answers (a step's frames at 50.0 ns") !=
               NULL, "%s", a.how);
    pj.strategy = DP_COST_PS_SYNC;
    REQUIRE(dp_cost_predict(small, &two, &pj, &a, &err) == 0);
    CHECK(a.bytes_per_step == 20432);
    CHECK_NEAR(a.comm_s, 2 * 20432 / 40e6 + 2 * 25505 / 40e6 + coder, 1e-12);
    /* a fast link: the coder costs more than the bytes save */
    one.bandwidth = 12.5e9;
    REQUIRE(dp_cost_predict(small, &one, &pj, &a, &err) == 0);
    CHECKF(a.bytes_per_step == 203624 && strstr(a.how, "auto: none (a step's frames at 0.1 ns"),
           "%g %s", a.bytes_per_step, a.how);
    CHECK_NEAR(a.comm_s, (203624 + 203608) / 12.5e9, 1e-15);
    /* it chooses the answers itself */
    pj.ps_reply_bf16 = 1;
    CHECK(dp_cost_predict(small, &one, &pj, &a, &err) < 0 && strstr(err.msg, "--ps-reply"));
}

static void check_algorithms(const dp_cost_calibration *cal)
{
    dp_err err;
    dp_cost_job job;
    dp_cost_job_init(&job);
    job.strategy = DP_COST_ALLREDUCE;
    const double P = 266610, G = 4 * P, seg = 256 << 10;
    double r4 = dp_cost_ring_bytes(266610, 4, 512u << 10), r2 = dp_cost_ring_bytes(266610, 2, 512u << 10);
    /* 2 hosts x 2 replicas in rank order, shared memory inside a host */
    dp_cost_cluster c = {.hosts = 2, .cores = 2, .bandwidth = 12.5e6, .latency = 0, .workers = 4,
                         .tasks_per_host = 2, .local_bandwidth = 2e9};
    dp_cost_prediction ring, hier, a;
    job.algo = DP_ALGO_RING; /* crosses between the hosts once per host */
    REQUIRE(dp_cost_predict(cal, &c, &job, &ring, &err) == 0);
    CHECK_NEAR(ring.busiest_link_bytes, r4, 1e-6);
    CHECK_NEAR(ring.bytes_per_step, r4, 1e-6);
    job.algo = DP_ALGO_HIER; /* leaders: the ring of 2; leader 0 also sends its host the sum */
    REQUIRE(dp_cost_predict(cal, &c, &job, &hier, &err) == 0);
    CHECK_NEAR(hier.busiest_link_bytes, r2, 1e-6);
    CHECK_NEAR(hier.bytes_per_step, r2 + G + ceil(G / seg) * 48, 1e-6);
    CHECK(hier.step_s < ring.step_s);
    job.algo = DP_ALGO_AUTO; /* the strategy's rule: several replicas a host, 2 hosts */
    REQUIRE(dp_cost_predict(cal, &c, &job, &a, &err) == 0);
    CHECKF(strncmp(a.how, "hier", 4) == 0 && a.step_s == hier.step_s, "%s", a.how);
    c.tasks_per_host = 0; /* round-robin: every ring hop between the hosts */
    REQUIRE(dp_cost_predict(cal, &c, &job, &a, &err) == 0);
    CHECKF(strncmp(a.how, "hier", 4) == 0, "%s", a.how);
    job.algo = DP_ALGO_RING;
    REQUIRE(dp_cost_predict(cal, &c, &job, &a, &err) == 0);
    CHECK_NEAR(a.busiest_link_bytes, 2 * r4, 1e-6);
    /* one replica a host: auto stays flat, the ring; direct sends the same bytes */
    dp_cost_cluster four = {.hosts = 4, .cores = 2, .bandwidth = 12.5e6, .latency = 1e-3,
                            .workers = 4};
    job.algo = DP_ALGO_AUTO;
    REQUIRE(dp_cost_predict(cal, &four, &job, &a, &err) == 0);
    CHECKF(strncmp(a.how, "ring", 4) == 0, "%s", a.how);
    CHECK_NEAR(a.busiest_link_bytes, r4, 1e-6);
    job.algo = DP_ALGO_DIRECT; /* 2 hops a bucket instead of 6 */
    dp_cost_prediction d;
    REQUIRE(dp_cost_predict(cal, &four, &job, &d, &err) == 0);
    CHECK_NEAR(d.busiest_link_bytes, r4, 1e-6);
    CHECK_NEAR(a.comm_s - d.comm_s, 3 * (6 - 2) * 1e-3, 1e-9);
    /* bf16: half the bytes; top-k: (n-1) blocks of 8k-byte pairs a bucket */
    job.algo = DP_ALGO_RING;
    job.compress.kind = DP_COMPRESS_BF16;
    REQUIRE(dp_cost_predict(cal, &four, &job, &a, &err) == 0);
    CHECK_NEAR(a.busiest_link_bytes, r4 / 2, 1e-6);
    CHECK_NEAR(a.comm_s, r4 / 2 / 12.5e6 + 3 * 2 * 1e-3 + 2 * cal->codec_s_per_float * P, 1e-9);
    job.compress.kind = DP_COMPRESS_TOPK;
    job.compress.ratio = 0.01;
    REQUIRE(dp_cost_predict(cal, &four, &job, &a, &err) == 0);
    double k = ceil(0.01 * ceil(P / 3)); /* 3 buckets of 88,870 floats */
    CHECK_NEAR(a.bytes_per_step, 3 * 3 * (8 * k + 48), 1e-6);
    /* auto: bf16 on a slow link, none where the codec costs more than it saves */
    job.compress.kind = DP_COMPRESS_AUTO;
    REQUIRE(dp_cost_predict(cal, &four, &job, &a, &err) == 0);
    CHECKF(strstr(a.how, "bf16 (auto") != NULL, "%s", a.how);
    four.bandwidth = 1e12;
    four.latency = 0; /* else bf16's 2 hops a bucket beat the ring's 6 */
    REQUIRE(dp_cost_predict(cal, &four, &job, &a, &err) == 0);
    CHECKF(strstr(a.how, "uncompressed (auto") != NULL, "%s", a.how);
    /* PowerSGD at rank 4 on 784-300-100-10: 4 (784 + 300) + 4 (300 + 100) +
     * 4 (100 + 10) factor floats and 410 biases (docs/strategies.md), two
     * sums of the ring; four products of rows x cols x 4 a matrix. */
    size_t floats;
    double madds;
    REQUIRE(dp_cost_powersgd("mlp-300-100", 4, &floats, &madds, &err) == 0);
    CHECK(floats == 6376 + 410);
    CHECK_NEAR(madds, 4.0 * 4 * (300 * 784 + 100 * 300 + 10 * 100), 0);
    CHECK(dp_cost_powersgd("mlp-300-100", 999, &floats, &madds, &err) < 0 &&
          strstr(err.msg, "216"));
    job.compress.kind = DP_COMPRESS_POWERSGD;
    job.compress.rank = 4;
    job.psgd_floats = floats;
    job.psgd_madds = madds;
    four.bandwidth = 12.5e6;
    four.latency = 1e-3;
    REQUIRE(dp_cost_predict(cal, &four, &job, &a, &err) == 0);
    /* two sums of half the floats each, a quarter of each a hop, 6 hops */
    CHECK_NEAR(a.bytes_per_step, 2 * 6 * (4.0 * floats / 2 / 4 + 48), 0);
    /* the ps family's coded pushes and bf16 replies (docs/strategies.md, "ps
     * family: compression"): 784-64-10 (50,890 floats) on one ps */
    dp_cost_calibration small = *cal;
    small.n_params = 50890;
    dp_cost_cluster ps1 = {.hosts = 3, .cores = 2, .bandwidth = 12.5e6, .workers = 1, .ps = 1,
                           .chief = 1};
    dp_cost_job pj;
    dp_cost_job_init(&pj);
    pj.strategy = DP_COST_PS_ASYNC;
    const struct { dp_compress_kind kind; int reply16; double up, down; } ps_cases[] = {
        {DP_COMPRESS_TOPK, 2, 4144, 4128},        /* --ps-reply topk:0.01: 48 + 8 + 8 x 509 */
        {DP_COMPRESS_TOPK, 3, 4144, 25505},       /* --ps-reply delta4: 48 + 12 + 25445 */
        {DP_COMPRESS_NONE, 0, 48 + 16 + 4 * 50890.0, 48 + 4 * 50890.0},
        {DP_COMPRESS_BF16, 1, 101852, 101828},    /* 48 + 16 + 8 + 2n; 48 + 2n */
        {DP_COMPRESS_FP16, 0, 101852, 203608},
        {DP_COMPRESS_TOPK, 1, 4144, 101828},      /* 8 x ceil(0.01 n) = 8 x 509 */
    };
    for (int i = 0; i < 6; i++) {
        pj.compress.kind = ps_cases[i].kind;
        pj.compress.ratio = 0.01;
        pj.ps_reply_bf16 = ps_cases[i].reply16 == 1;
        pj.ps_reply_topk = ps_cases[i].reply16 == 2 ? 0.01 : 0;
        pj.ps_reply_delta4 = ps_cases[i].reply16 == 3;
        REQUIRE(dp_cost_predict(&small, &ps1, &pj, &a, &err) == 0);
        CHECKF(a.bytes_per_step == ps_cases[i].up, "case %d: %g", i, a.bytes_per_step);
        CHECKF(a.busiest_link_bytes == fmax(ps_cases[i].up, ps_cases[i].down), "case %d: %g", i,
               a.busiest_link_bytes);
    }
    pj.compress.kind = DP_COMPRESS_POWERSGD;
    CHECK(dp_cost_predict(&small, &ps1, &pj, &a, &err) < 0 && strstr(err.msg, "allreduce's"));
    check_ps_auto(&small);

    /* bad input, named */
    job.psgd_floats = 0;
    CHECK(dp_cost_predict(cal, &four, &job, &a, &err) < 0 && strstr(err.msg, "psgd_floats"));
    c.tasks_per_host = 1;
    CHECK(dp_cost_predict(cal, &c, &job, &a, &err) < 0 && strstr(err.msg, "tasks_per_host"));
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
    dp_cost_cluster one = {1, 2, 1e9, 0, 2, 0, 1, 0, 0}, three = {3, 2, 1e9, 0, 2, 0, 1, 0, 0};
    dp_cost_prediction p1, p3;
    REQUIRE(dp_cost_predict(&cal, &one, &job, &p1, &err) == 0);
    REQUIRE(dp_cost_predict(&cal, &three, &job, &p3, &err) == 0);
    CHECK_NEAR(p1.compute_s, 128 * 10e-6 * 1.5, 1e-12); /* 2/3 of a core each */
    CHECK(p3.compute_s < p1.compute_s);

    check_algorithms(&cal);

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
    check_sparse();
    return CHECK_DONE();
}
