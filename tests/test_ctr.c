/* Click-through data and evaluation (docs/datasets.md, "Synthetic
 * click-through data"; docs/metrics.md):
 *   - dp_auc against the naive O(n^2) count of (positive, negative) pairs,
 *     ties counting one half, and its edge cases;
 *   - the synthetic generator: the same record for the same row, the Zipf
 *     law's head frequency, multi-valued places;
 *   - the best a model trained on some records can do (dp_ctr_synth_seen_p):
 *     with every id seen, the generating model's probability bit for bit;
 *     with none, E[sigmoid(bias + e)] over the ids' prior, against
 *     Simpson's rule on a fine grid; and its expected log loss never below
 *     the generating model's (Gibbs' inequality); the Bayes learner's
 *     estimate (dp_ctr_synth_bayes_p) with no information equal to the
 *     bound with no id seen, with near-infinite information to the
 *     generating model, and the Fisher information of a record added to
 *     its ids as p (1 - p) / used^2;
 *   - `downpour data synth ctr` writes CSV files (several, multi-valued) and
 *     a NumPy pair that read back through the dataset readers equal to the
 *     generator's records, its description with the generating model's log
 *     loss, and its usage refusals;
 *   - a small wide-deep model trains on a synthetic set to a test log loss
 *     near the generating model's, and the done event and the result carry
 *     the AUC and log loss, and so does the report made from it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/auc.h"
#include "downpour/records.h"
#include "downpour/rng.h"
#include "downpour/synth_ctr.h"
#include "downpour/train.h"
#include "run_bin.h"
#include "scratch.h"

static double naive_auc(const dp_auc_pair *p, size_t n)
{
    double num = 0, pairs = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (p[i].positive && !p[j].positive) {
                pairs++;
                num += p[i].score > p[j].score ? 1.0 : p[i].score == p[j].score ? 0.5 : 0.0;
            }
    return pairs ? num / pairs : NAN;
}

static void test_auc(void)
{
    dp_rng r;
    dp_rng_seed(&r, 3);
    enum { N = 700 };
    static dp_auc_pair p[N], q[N];
    for (int trial = 0; trial < 6; trial++) {
        int levels = trial < 3 ? 5 + trial * 3 : 1 << 20; /* many ties, then few */
        size_t n = 50 + (size_t)trial * 130;
        for (size_t i = 0; i < n; i++) {
            int pos = dp_rng_below(&r, 3) == 0;
            /* positives score a little higher on average */
            int level = (int)dp_rng_below(&r, (uint32_t)levels);
            p[i] = (dp_auc_pair){(float)level / levels + (pos ? 0.2f : 0.0f), (uint32_t)pos};
        }
        memcpy(q, p, n * sizeof *p);
        double want = naive_auc(p, n), got = dp_auc(q, n);
        CHECKF(fabs(got - want) < 1e-12, "trial %d: auc %.15f, naive %.15f", trial, got, want);
    }
    dp_auc_pair same[4] = {{0.1f, 1}, {0.5f, 1}, {0.2f, 1}, {0.9f, 1}};
    CHECK(isnan(dp_auc(same, 4)));
    dp_auc_pair tied[4] = {{0.3f, 1}, {0.3f, 0}, {0.3f, 0}, {0.3f, 1}};
    CHECK(dp_auc(tied, 4) == 0.5);
    dp_auc_pair perfect[4] = {{0.9f, 1}, {0.1f, 0}, {0.2f, 0}, {0.8f, 1}};
    CHECK(dp_auc(perfect, 4) == 1.0);
    dp_auc_pair nan_score[2] = {{NAN, 1}, {0.1f, 0}};
    CHECK(isnan(dp_auc(nan_score, 2)));
    printf("auc: equal to the naive pair count on 6 sets with and without ties\n");
}

static void test_generator(void)
{
    dp_ctr_synth s = dp_ctr_synth_defaults();
    s.n_cat = 3;
    s.card[0] = 100, s.card[1] = 1, s.card[2] = 20;
    s.places[2] = 5;
    s.n_num = 2;
    dp_err err;
    REQUIRE(dp_ctr_synth_init(&s, &err) == 0);
    CHECK(dp_ctr_synth_width(&s) == 1 + 1 + 5 + 2);
    float a[9], b[9];
    uint8_t ya, yb;
    double pa, pb;
    long head = 0, n = 200000, used = 0;
    for (long row = 0; row < n; row++) {
        dp_ctr_synth_row(&s, 0, (uint64_t)row, a, &ya, &pa);
        head += a[0] == 0.0f;
        CHECK(a[0] >= 0 && a[0] < 100 && a[0] == floorf(a[0]) && a[1] == 0.0f);
        int k = 0;
        while (k < 5 && a[2 + k] >= 0)
            k++;
        used += k;
        for (int j = k; j < 5; j++) /* the empty places come last */
            CHECK(a[2 + j] == -1.0f);
        CHECK(k >= 1);
        CHECK(pa > 0 && pa < 1 && ya <= 1);
    }
    dp_ctr_synth_row(&s, 0, 12345, a, &ya, &pa);
    dp_ctr_synth_row(&s, 0, 12345, b, &yb, &pb);
    CHECK(memcmp(a, b, sizeof a) == 0 && ya == yb && pa == pb);
    dp_ctr_synth_row(&s, 1, 12345, b, &yb, &pb);
    CHECK(memcmp(a, b, sizeof a) != 0); /* the test split draws other records */
    /* Zipf 1.1 over 100 ids: P(rank 1) = 1 / sum_k k^-1.1 */
    double h = 0;
    for (int k = 1; k <= 100; k++)
        h += pow(k, -1.1);
    double want = 1 / h, got = (double)head / n;
    CHECKF(fabs(got - want) < 4 * sqrt(want * (1 - want) / n), "rank 1: %.4f, Zipf %.4f", got,
           want);
    CHECK_NEAR((double)used / n, 3.0, 0.02); /* 1 to 5 places used, uniformly */
    printf("generator: rank 1 drawn %.4f of the time (Zipf: %.4f); %.3f of 5 places used\n",
           got, want, (double)used / n);

    s.card[0] = 0;
    CHECK(dp_ctr_synth_init(&s, &err) < 0 && strstr(err.msg, "categorical feature 0"));
    s.card[0] = (1u << 24) + 1;
    CHECK(dp_ctr_synth_init(&s, &err) < 0 && strstr(err.msg, "2^24"));
}

/* Every record of a split's files equal to the generator's. */
/* E[sigmoid(z + sd t)], t ~ Normal(0, 1), by Simpson's rule over [-12, 12]. */
static double simpson_expected_sigmoid(double z, double sd)
{
    const int n = 24000;
    double h = 24.0 / n, sum = 0;
    for (int i = 0; i <= n; i++) {
        double t = -12.0 + i * h, f = exp(-0.5 * t * t) / (1.0 + exp(-(z + sd * t)));
        sum += f * (i == 0 || i == n ? 1 : i % 2 ? 4 : 2);
    }
    return sum * h / 3.0 / sqrt(2.0 * M_PI);
}

static void test_seen_bound(void)
{
    dp_ctr_synth s = dp_ctr_synth_defaults();
    s.n_cat = 2, s.n_num = 3, s.seed = 5;
    s.card[0] = 50, s.card[1] = 30, s.places[1] = 3;
    dp_err err;
    REQUIRE(dp_ctr_synth_init(&s, &err) == 0);
    uint8_t all0[7], all1[4], none0[7] = {0}, none1[4] = {0}, half0[7], half1[4];
    memset(all0, 0xff, sizeof all0), memset(all1, 0xff, sizeof all1);
    memset(half0, 0x55, sizeof half0), memset(half1, 0x55, sizeof half1);
    const uint8_t *all[2] = {all0, all1}, *none[2] = {none0, none1}, *half[2] = {half0, half1};
    float x[8];
    int exact = 0, near = 0, gibbs = 0;
    double worst = 0;
    for (uint64_t r = 0; r < 300; r++) {
        uint8_t y;
        double p;
        s.n_num = 3;
        dp_ctr_synth_row(&s, 1, r, x, &y, &p);
        exact += dp_ctr_synth_seen_p(&s, x, all) == p;
        double q = dp_ctr_synth_seen_p(&s, x, half);
        double ent = -(p * log(p) + (1 - p) * log1p(-p));
        gibbs += -(p * log(q) + (1 - p) * log1p(-q)) >= ent;
        s.n_num = 0; /* none seen: z is the bias and the ids alone */
        dp_ctr_synth_row(&s, 1, r, x, &y, &p);
        int used = (x[1] >= 0) + (x[2] >= 0) + (x[3] >= 0);
        double sd = s.id_scale * sqrt(1.0 + 1.0 / used);
        double d = fabs(dp_ctr_synth_seen_p(&s, x, none) - simpson_expected_sigmoid(s.bias, sd));
        worst = d > worst ? d : worst;
        near += d < 1e-12;
    }
    CHECKF(exact == 300, "every id seen: %d of 300 records give the generating model's bits",
           exact);
    CHECKF(near == 300, "no id seen: %d of 300 records within 1e-12 of Simpson's (worst %g)",
           near, worst);
    CHECKF(gibbs == 300, "half the ids seen: %d of 300 records expect a log loss no lower than "
           "the generating model's", gibbs);
    /* The Bayes estimate: no information is no id seen; all but infinite
     * information, the generating model; a record's information on its ids */
    float i0a[50] = {0}, i0b[30] = {0}, iba[50], ibb[30];
    for (int i = 0; i < 50; i++)
        iba[i] = 1e30f;
    for (int i = 0; i < 30; i++)
        ibb[i] = 1e30f;
    const float *info0[2] = {i0a, i0b}, *infob[2] = {iba, ibb};
    int zero_info = 0, big_info = 0;
    for (uint64_t r = 0; r < 200; r++) {
        uint8_t y;
        double p;
        dp_ctr_synth_row(&s, 1, r, x, &y, &p);
        zero_info += fabs(dp_ctr_synth_bayes_p(&s, r, x, info0) -
                          dp_ctr_synth_seen_p(&s, x, none)) < 1e-14;
        big_info += fabs(dp_ctr_synth_bayes_p(&s, r, x, infob) - p) < 1e-9;
    }
    CHECKF(zero_info == 200 && big_info == 200, "the Bayes estimate: %d of 200 with no "
           "information as no id seen, %d with all but infinite as the generating model",
           zero_info, big_info);
    float a0[50] = {0}, a1[30] = {0};
    float *acc[2] = {a0, a1};
    x[0] = 7, x[1] = 4, x[2] = 4, x[3] = -1; /* id 4 twice of feature 1: used 2 */
    dp_ctr_synth_add_info(&s, x, 0.2, acc);
    CHECKF(a0[7] == 0.16f && a1[4] == 2 * (float)(0.16 / 4) && a0[6] == 0 && a1[3] == 0,
           "a record's information: %g on id 7 of feature 0, %g on id 4 of feature 1", a0[7],
           a1[4]);
    /* a wide prior: the finer step */
    s.id_scale = 9;
    for (uint64_t r = 0; r < 20; r++) {
        uint8_t y;
        double p;
        dp_ctr_synth_row(&s, 1, r, x, &y, &p);
        int used = (x[1] >= 0) + (x[2] >= 0) + (x[3] >= 0);
        double sd = s.id_scale * sqrt(1.0 + 1.0 / used);
        double d = fabs(dp_ctr_synth_seen_p(&s, x, none) - simpson_expected_sigmoid(s.bias, sd));
        CHECKF(d < 1e-10, "id_scale 9, record %d, none seen: %g from Simpson's", (int)r, d);
    }
}

static void read_split_files(const char *spec, const dp_ctr_synth *s, long rows[2],
                             size_t files[2], const char *categorical, const char *numeric)
{
    dp_data_options o;
    dp_data_options_default(&o);
    o.categorical = categorical;
    o.numeric = numeric;
    dp_data_files f;
    dp_err err;
    int rc = dp_data_files_find(&f, spec, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    REQUIRE(rc == 0);
    rc = dp_data_files_count(&f, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    REQUIRE(rc == 0);
    int w = dp_ctr_synth_width(s);
    CHECK(f.shape.dim == (uint32_t)w && f.shape.kind == DP_VALUES_F32);
    float x[64], want[64];
    for (int k = 0; k < 2; k++) {
        dp_data_split_files *sp = k ? &f.test : &f.train;
        CHECKF(sp->n == files[k] && sp->records == (uint64_t)rows[k], "split %d: %zu files, %llu",
               k, sp->n, (unsigned long long)sp->records);
        long row = 0, wrong = 0;
        for (size_t i = 0; i < sp->n; i++) {
            dp_record_reader *rd;
            REQUIRE(dp_record_open(&rd, &sp->files[i], f.format, &f.shape, &o, &err) == 0);
            uint8_t y, wy;
            double p;
            while ((rc = dp_record_next(rd, x, &y, &err)) == 1) {
                dp_ctr_synth_row(s, k, (uint64_t)row++, want, &wy, &p);
                wrong += memcmp(x, want, (size_t)w * sizeof *x) != 0 || y != wy;
            }
            CHECKF(rc == 0, "%s", err.msg);
            dp_record_close(rd);
        }
        CHECKF(row == rows[k] && wrong == 0, "split %d: %ld records, %ld unequal", k, row, wrong);
    }
    dp_data_files_free(&f);
}

static void test_cli(void)
{
    g_bin = getenv("DOWNPOUR_BIN");
    if (!g_bin) {
        fprintf(stderr, "skipping the command's checks: DOWNPOUR_BIN is not set\n");
        return;
    }
    char csv[1100], npy[1100], path[1200];
    snprintf(csv, sizeof csv, "%s/csv", g_dir);
    snprintf(npy, sizeof npy, "%s/npy", g_dir);
    const char *a[] = {"data", "synth", "ctr", "--to", csv, "--rows", "1000", "--test-rows",
                       "300", "--files", "3", "--test-files", "2", "--categorical", "4",
                       "--ids", "50,7,1000,30", "--multi", "1", "--places", "3", "--numeric",
                       "2", "--seed", "9", NULL};
    int rc = run_bin(a);
    CHECKF(rc == 0, "synth: %d: %s", rc, g_err);
    CHECK(strstr(g_out, "train: 1000 records in 3 file(s)") &&
          strstr(g_out, "the generating model's log loss"));
    CHECK(strstr(g_out, "--model 8-bag50x16-bag7x16-bag1000x16-bag30x16m3mean-res("));
    dp_ctr_synth s = dp_ctr_synth_defaults();
    s.n_cat = 4, s.n_num = 2, s.seed = 9;
    s.card[0] = 50, s.card[1] = 7, s.card[2] = 1000, s.card[3] = 30;
    s.places[3] = 3;
    dp_err err;
    REQUIRE(dp_ctr_synth_init(&s, &err) == 0);
    long rows[2] = {1000, 300};
    size_t files[2] = {3, 2};
    read_split_files(csv, &s, rows, files, NULL, NULL);
    snprintf(path, sizeof path, "%s/ctr-train-00000-of-00003.csv", csv);
    char head[256];
    FILE *f = fopen(path, "r");
    REQUIRE(f && fgets(head, sizeof head, f));
    fclose(f);
    CHECKF(strcmp(head, "label,c0,c1,c2,c3_0,c3_1,c3_2,n0,n1\n") == 0, "header %s", head);
    snprintf(path, sizeof path, "%s/ctr-synth.json", csv);
    f = fopen(path, "r");
    REQUIRE(f);
    char json[4096];
    size_t len = fread(json, 1, sizeof json - 1, f);
    json[len] = 0;
    fclose(f);
    CHECK(strstr(json, "\"generating_log_loss\": 0.") && strstr(json, "\"places\": [1, 1, 1, 3]"));
    CHECK(strstr(json, "\"seen_ids_log_loss\": 0.") &&
          strstr(json, "\"seen_ids_expected_log_loss\": 0.") &&
          strstr(json, "\"bayes_estimate_log_loss\": 0."));

    /* again without --force: refused; with it: the same bytes */
    rc = run_bin(a);
    CHECKF(rc == 1 && strstr(g_err, "exists: give --force"), "%d: %s", rc, g_err);

    const char *b[] = {"data", "synth", "ctr", "--to", npy, "--rows", "700", "--test-rows", "200",
                       "--format", "npy", "--ids", "100", "--seed", "4", NULL};
    rc = run_bin(b);
    CHECKF(rc == 0, "synth npy: %d: %s", rc, g_err);
    dp_ctr_synth t = dp_ctr_synth_defaults();
    t.card[0] = 100;
    for (int i = 0; i < t.n_cat; i++)
        t.card[i] = 100;
    t.seed = 4;
    REQUIRE(dp_ctr_synth_init(&t, &err) == 0);
    long rows2[2] = {700, 200};
    size_t files2[2] = {1, 1};
    read_split_files(npy, &t, rows2, files2, NULL, NULL);

    /* TFRecord: int64 ids and float numerics, read through named columns */
    char tf[1100];
    snprintf(tf, sizeof tf, "%s/tf", g_dir);
    const char *c[] = {"data", "synth", "ctr", "--to", tf, "--rows", "500", "--test-rows", "100",
                       "--files", "2", "--format", "tfrecord", "--categorical", "4", "--ids",
                       "50,7,1000,30", "--multi", "1", "--places", "3", "--numeric", "2",
                       "--seed", "9", NULL};
    rc = run_bin(c);
    CHECKF(rc == 0, "synth tfrecord: %d: %s", rc, g_err);
    CHECK(strstr(g_out, "read it with: --categorical c0,c1,c2,c3:3 --numeric n0,n1"));
    long rows3[2] = {500, 100};
    size_t files3[2] = {2, 1};
    read_split_files(tf, &s, rows3, files3, "c0,c1,c2,c3:3", "n0,n1");

    const char *bad[][12] = {
        {"data", "synth", "ctr", "--to", npy, "--format", "npy", "--files", "2", NULL},
        {"data", "synth", "ctr", "--to", npy, "--ids", "5,6", NULL},
        {"data", "synth", "ctr", "--to", npy, "--ids", "16777217", NULL},
        {"data", "synth", "ctr", "--to", npy, "--multi", "9", NULL},
        {"data", "synth", "ctr", "--to", npy, "--format", "tsv", NULL},
        {"data", "synth", "ctr", "--to", npy, "--format", "tfrecord", "--files", "0", NULL},
        {"data", "synth", "ctr", NULL},
        {"data", "synth", "images", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run_bin(bad[i]);
        CHECKF(rc == 2 && strstr(g_err, "downpour"), "refusal %zu: %d: %s", i, rc,
               g_err);
    }
    printf("downpour data synth ctr: CSV (3 + 2 files, a multi-valued feature), NumPy and "
           "TFRecord (named columns) read back equal to the generator; refusals exit 2\n");
}

/* A small wide-deep model on a small synthetic set: a test log loss near
 * the generating model's. */
static void test_train(void)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/train", g_dir);
    REQUIRE(mkdir(dir, 0755) == 0);
    dp_ctr_synth s = dp_ctr_synth_defaults();
    s.n_cat = 4, s.n_num = 2, s.seed = 11;
    for (int f = 0; f < 4; f++)
        s.card[f] = 20;
    dp_err err;
    REQUIRE(dp_ctr_synth_init(&s, &err) == 0);
    long rows[2] = {SANITIZED ? 6000 : 40000, 10000};
    double gen = 0;
    for (int k = 0; k < 2; k++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/ctr-%s.csv", dir, k ? "test" : "train");
        FILE *f = fopen(path, "w");
        REQUIRE(f);
        fprintf(f, "label,c0,c1,c2,c3,n0,n1\n");
        for (long r = 0; r < rows[k]; r++) {
            float x[6];
            uint8_t y;
            double p;
            dp_ctr_synth_row(&s, k, (uint64_t)r, x, &y, &p);
            fprintf(f, "%u,%d,%d,%d,%d,%.9g,%.9g\n", y, (int)x[0], (int)x[1], (int)x[2],
                    (int)x[3], x[4], x[5]);
            if (k)
                gen -= y ? log(p) : log1p(-p);
        }
        fclose(f);
    }
    gen /= rows[1];
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", g_dir);
    dp_train_config cfg = dp_train_defaults();
    cfg.dataset = dir;
    cfg.model = "6-bag20x4-bag20x4-bag20x4-bag20x4-res(dense16-relu-dense1|dense1)-bce";
    cfg.epochs = SANITIZED ? 1 : 5;
    cfg.batch = 64;
    cfg.optim.lr = 0.003f;
    cfg.n_train = (uint32_t)rows[0] - 2000;
    cfg.n_val = 2000;
    cfg.threads = 1;
    cfg.log_every = 0;
    cfg.quiet = true;
    cfg.metrics_path = metrics;
    dp_train_result res;
    int rc = dp_train_run(&cfg, &res, &err);
    CHECKF(rc == 0, "%s", err.msg);
    REQUIRE(rc == 0);
    printf("train: %s: test log loss %.4f (the generating model's %.4f), AUC %.4f\n", cfg.model,
           res.test_loss, gen, res.test_auc);
    if (!SANITIZED)
        CHECKF(res.test_loss < gen * 1.03, "test log loss %.4f, generating model %.4f",
               res.test_loss, gen);
    CHECK(res.test_auc > 0.6 && res.test_auc < 1);
    FILE *f = fopen(metrics, "r");
    REQUIRE(f);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = 0;
    fclose(f);
    CHECK(strstr(text, "\"val_auc\":") && strstr(text, "\"val_log_loss\":") &&
          strstr(text, "\"test_auc\":") && strstr(text, "\"test_log_loss\":"));

    /* named columns through the loop: ids checked against the bags' tables
     * (20 ids in the files, tables of 10 rows), or hashed into them */
    dp_train_config nc = cfg;
    nc.metrics_path = NULL;
    nc.epochs = 1;
    nc.model = "6-bag10x4-bag10x4-bag10x4-bag10x4-dense1-bce";
    nc.data.data.categorical = "c0,c1,c2,c3";
    nc.data.data.numeric = "n0,n1";
    dp_train_result nr;
    rc = dp_train_run(&nc, &nr, &err);
    CHECKF(rc < 0 && strstr(err.msg, "ctr-train.csv: record ") && strstr(err.msg, ", column ") &&
           strstr(err.msg, "is not below 10, the rows of its embedding table"), "%s",
           rc < 0 ? err.msg : "trained");
    printf("named columns, tables too small: %s\n", err.msg);
    nc.data.data.hash_buckets = 10;
    rc = dp_train_run(&nc, &nr, &err);
    CHECKF(rc == 0 && nr.test_auc > 0.5, "hashed: %s", rc < 0 ? err.msg : "a poor AUC");
    nc.data.data.hash_buckets = 11;
    rc = dp_train_run(&nc, &nr, &err);
    CHECKF(rc < 0 && strstr(err.msg, "--hash-buckets 11 is more than the 10 rows of bag 1"),
           "%s", rc < 0 ? err.msg : "trained");
    if (!g_bin)
        return;
    /* the report: an AUC chart and the final table's two columns */
    char html[1200];
    snprintf(html, sizeof html, "%s/r.html", g_dir);
    const char *a[] = {"report", metrics, "-o", html, NULL};
    rc = run_bin(a);
    CHECKF(rc == 0, "report: %d: %s", rc, g_err);
    f = fopen(html, "r");
    REQUIRE(f);
    static char page[1 << 20];
    len = fread(page, 1, sizeof page - 1, f);
    page[len] = 0;
    fclose(f);
    CHECK(strstr(page, "Validation AUC per epoch") && strstr(page, "data-k=\"test_auc\"") &&
          strstr(page, "data-k=\"test_log_loss\""));
}

int main(void)
{
    scratch_make(g_dir, sizeof g_dir, "test_ctr");
    test_auc();
    test_generator();
    test_seen_bound();
    test_cli();
    test_train();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(g_dir);
    return rc;
}
