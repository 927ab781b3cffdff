/* downpour report (docs/reports.md):
 *  - bad input (a missing file, garbage, an empty file, a line over 1 MiB)
 *    fails with exit 1 and a message naming the file; usage errors exit 2;
 *  - a hand-written metrics file with the newer fields (wall, steps, lr,
 *    faults, a torn last line) and a plain single-process one: the SVG holds
 *    their numbers, the straggler and the fault are marked and listed;
 *  - the library API escapes every caller text (no <script> gets through);
 *  - a real 2-epoch cluster run (launch, ps-async) reported and opened in
 *    headless Chromium: no script or console errors, a screenshot that is
 *    not blank, and the numbers in its SVG equal to the metrics file's.
 * Without Chromium or MNIST the last part is skipped (exit 77) once the
 * others have passed. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "downpour/report.h"
#include "proc.h"

static const char *bin, *tmp;
static char errbuf[8192];

static void write_file(const char *name, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static char *read_tmp(const char *name)
{
    char path[1200];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    return slurp(path, &len);
}

/* ---- reading the page back ---- */

/* The first of a and b in the text, either may be NULL. */
static const char *first_of(const char *a, const char *b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

/* The chart with data-chart="id": its text from the attribute to </svg>,
 * or to </table> where a chart of one point a series is a table. */
static const char *chart(const char *html, const char *id, const char **end)
{
    char key[128];
    snprintf(key, sizeof key, "data-chart=\"%s\"", id);
    const char *s = html ? strstr(html, key) : NULL;
    *end = s ? first_of(strstr(s, "</svg>"), strstr(s, "</table>")) : NULL;
    return *end ? s : NULL;
}

/* Values of attr ("data-y") of the points of one series of chart id, in order. */
static int series_values(const char *html, const char *id, const char *series, const char *attr,
                         double *out, int max)
{
    const char *end, *s = chart(html, id, &end);
    char key[256], akey[64];
    snprintf(key, sizeof key, "data-series=\"%s\">", series);
    snprintf(akey, sizeof akey, " %s=\"", attr);
    const char *g = s ? strstr(s, key) : NULL;
    if (!g || g > end)
        return -1;
    const char *gend = first_of(strstr(g, "</g>"), strstr(g, "</tr>"));
    int n = 0;
    for (const char *p = strstr(g, akey); p && p < gend && n < max; p = strstr(p + 1, akey))
        out[n++] = strtod(p + strlen(akey), NULL);
    return n;
}

/* A number attribute after `anchor` (searched from `from`), NAN when absent. */
static double attr_after(const char *from, const char *anchor, const char *attr)
{
    const char *p = from ? strstr(from, anchor) : NULL;
    char akey[64];
    snprintf(akey, sizeof akey, "%s=\"", attr);
    const char *q = p ? strstr(p, akey) : NULL;
    return q ? strtod(q + strlen(akey), NULL) : NAN;
}

/* The final table's cell data-v for a run and a field. */
static double final_value(const char *html, const char *run, const char *key)
{
    char row[256], k[128];
    snprintf(row, sizeof row, "<tr data-run=\"%s\">", run);
    snprintf(k, sizeof k, "data-k=\"%s\"", key);
    const char *r = html ? strstr(html, row) : NULL;
    const char *end = r ? strstr(r, "</tr>") : NULL;
    const char *c = r ? strstr(r, k) : NULL;
    if (!c || c > end)
        return NAN;
    const char *cell_end = strstr(c, "</td>"), *v = strstr(c, "data-v=\"");
    return v && v < cell_end ? strtod(v + 8, NULL) : NAN;
}

static int count(const char *html, const char *s)
{
    int n = 0;
    for (const char *p = html ? strstr(html, s) : NULL; p; p = strstr(p + 1, s))
        n++;
    return n;
}

/* How many times s occurs between `from` and the next `to` after it. */
static int count_in(const char *html, const char *from, const char *to, const char *s)
{
    const char *a = html ? strstr(html, from) : NULL, *b = a ? strstr(a, to) : NULL;
    int n = 0;
    for (const char *p = a ? strstr(a, s) : NULL; p && p < b; p = strstr(p + 1, s))
        n++;
    return n;
}

/* ---- bad input ---- */

static void test_bad_input(void)
{
    char big[256];
    int rc;
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/missing.jsonl -o %s/x.html", bin, tmp, tmp);
    CHECKF(rc == 1 && strstr(errbuf, "missing.jsonl") && strstr(errbuf, "No such file"),
           "missing file: rc %d, %s", rc, errbuf);
    write_file("garbage.jsonl", "this is not JSON at all\n\x01\x02\x03\n");
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/garbage.jsonl -o %s/x.html", bin, tmp, tmp);
    CHECKF(rc == 1 && strstr(errbuf, "garbage.jsonl: line 1 is not a JSON object"),
           "garbage: rc %d, %s", rc, errbuf);
    write_file("empty.jsonl", "");
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/empty.jsonl -o %s/x.html", bin, tmp, tmp);
    CHECKF(rc == 1 && strstr(errbuf, "empty.jsonl holds no event of a run"), "empty: rc %d, %s",
           rc, errbuf);
    write_file("other.jsonl", "{\"event\":\"ping\",\"t\":0.1}\n[1,2]\n");
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/other.jsonl -o %s/x.html", bin, tmp, tmp);
    CHECKF(rc == 1 && strstr(errbuf, "other.jsonl: line 2 is not a JSON object"),
           "array line: rc %d, %s", rc, errbuf);
    snprintf(big, sizeof big, "head -c 1100000 /dev/zero | tr '\\0' a > %s/long.jsonl; echo >> %s/long.jsonl",
             tmp, tmp);
    REQUIRE(system(big) == 0);
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/long.jsonl -o %s/x.html", bin, tmp, tmp);
    CHECKF(rc == 1 && strstr(errbuf, "long.jsonl: line 1 is longer than"), "long line: rc %d, %s",
           rc, errbuf);
    CHECKF(access("x.html", F_OK) != 0, "a failed report wrote its output");
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/empty.jsonl", bin, tmp);
    CHECKF(rc == 2 && strstr(errbuf, "-o OUT.html is required"), "no -o: rc %d, %s", rc, errbuf);
    rc = run_cmd(errbuf, sizeof errbuf, "%s report -o %s/x.html", bin, tmp);
    CHECKF(rc == 2 && strstr(errbuf, "no metrics file"), "no file: rc %d, %s", rc, errbuf);
    rc = run_cmd(errbuf, sizeof errbuf, "%s report --bogus", bin);
    CHECKF(rc == 2 && strstr(errbuf, "unknown option '--bogus'"), "bad flag: rc %d, %s", rc, errbuf);
    rc = run_cmd(errbuf, sizeof errbuf, "%s report --help", bin);
    CHECKF(rc == 0, "--help: rc %d", rc);
}

/* ---- the fields the report reads, by hand ---- */

/* A cluster run with wall times: worker:2 straggles in epoch 2 (30 ms
 * against a median of 11), worker:1 is lost at wall ...02.0, and the last
 * line is torn. */
static const char FIXTURE_A[] =
    "{\"event\":\"resource\",\"t\":0.5,\"wall\":1700000000.0,\"task\":\"worker:0\",\"cpu_percent\":90,\"rss_bytes\":10485760,\"net_tx_bytes\":0,\"net_rx_bytes\":0}\n"
    "{\"event\":\"resource\",\"t\":1.5,\"wall\":1700000001.0,\"task\":\"worker:0\",\"cpu_percent\":95.5,\"rss_bytes\":20971520,\"net_tx_bytes\":1000000,\"net_rx_bytes\":1000000}\n"
    "{\"event\":\"steps\",\"t\":1.6,\"wall\":1700000001.1,\"task\":\"worker:0\",\"epoch\":1,\"steps\":10,\"step_ms_median\":10,\"step_ms_p90\":12,\"step_ms_max\":20,\"step_ms_mean\":10.5,\"samples_per_second\":100}\n"
    "{\"event\":\"resource\",\"t\":2.5,\"wall\":1700000002.0,\"task\":\"worker:0\",\"cpu_percent\":93,\"rss_bytes\":20971520,\"net_tx_bytes\":3000000,\"net_rx_bytes\":2000000}\n"
    "{\"event\":\"steps\",\"t\":3.1,\"wall\":1700000002.6,\"task\":\"worker:0\",\"epoch\":2,\"steps\":10,\"step_ms_median\":10,\"step_ms_p90\":13,\"step_ms_max\":25,\"step_ms_mean\":10.8,\"samples_per_second\":101}\n"
    "{\"event\":\"resource\",\"t\":0.2,\"wall\":1700000000.4,\"task\":\"worker:1\",\"cpu_percent\":80,\"rss_bytes\":10485760,\"net_tx_bytes\":0,\"net_rx_bytes\":0}\n"
    "{\"event\":\"steps\",\"t\":1.0,\"wall\":1700000001.2,\"task\":\"worker:1\",\"epoch\":1,\"steps\":10,\"step_ms_median\":11,\"step_ms_p90\":12,\"step_ms_max\":18,\"samples_per_second\":95}\n"
    "{\"event\":\"steps\",\"t\":2.5,\"wall\":1700000002.7,\"task\":\"worker:1\",\"epoch\":2,\"steps\":10,\"step_ms_median\":11,\"step_ms_p90\":14,\"step_ms_max\":19,\"samples_per_second\":94}\n"
    "{\"event\":\"steps\",\"t\":1.3,\"wall\":1700000001.3,\"task\":\"worker:2\",\"epoch\":1,\"steps\":10,\"step_ms_median\":12,\"step_ms_p90\":15,\"step_ms_max\":22,\"samples_per_second\":90}\n"
    "{\"event\":\"steps\",\"t\":2.8,\"wall\":1700000002.8,\"task\":\"worker:2\",\"epoch\":2,\"steps\":10,\"step_ms_median\":30,\"step_ms_p90\":41,\"step_ms_max\":60,\"samples_per_second\":40}\n"
    "{\"event\":\"epoch\",\"t\":1.0,\"wall\":1700000001.5,\"epoch\":1,\"val_accuracy\":0.9,\"val_loss\":0.3,\"train_loss\":0.4,\"seconds\":1.0,\"step\":30,\"lr\":0.001,\"task\":\"chief:0\"}\n"
    "{\"event\":\"fault\",\"t\":1.5,\"wall\":1700000002.0,\"task\":\"worker:1\",\"what\":\"lost\"}\n"
    "{\"event\":\"epoch\",\"t\":2.5,\"wall\":1700000003.0,\"epoch\":2,\"val_accuracy\":0.95,\"val_loss\":0.2,\"train_loss\":0.25,\"seconds\":1.5,\"step\":60,\"lr\":0.0005,\"task\":\"chief:0\"}\n"
    "{\"event\":\"done\",\"t\":2.7,\"wall\":1700000003.2,\"test_accuracy\":0.9512,\"train_seconds\":2.5,\"samples_per_second\":1234.5,\"strategy\":\"ps-async\",\"model\":\"784-32-10\",\"dataset\":\"mnist\",\"batch\":64,\"epochs\":2,\"optimizer\":\"adam\",\"lr\":0.001,\"lr_schedule\":\"step\",\"seed\":7,\"workers\":3,\"ps\":1,\"task\":\"chief:0\"}\n"
    "{\"event\":\"resource_total\",\"t\":3.0,\"tasks\":3,\"samples\":4,\"cpu_percent_mean\":61.5,\"cpu_percent_sum\":184.5,\"rss_peak_bytes\":41943040,\"net_tx_bytes\":3000000,\"net_rx_bytes\":2000000}\n"
    "{\"event\":\"resource\",\"t\":3";

/* One process, no wall, no steps, no task: the oldest form of the file. */
static const char FIXTURE_B[] =
    "{\"event\":\"epoch\",\"t\":1.0,\"epoch\":1,\"val_accuracy\":0.8,\"val_loss\":0.6,\"train_loss\":0.7,\"seconds\":1.0,\"step\":10}\n"
    "{\"event\":\"epoch\",\"t\":2.0,\"epoch\":2,\"val_accuracy\":0.85,\"val_loss\":0.5,\"train_loss\":0.55,\"seconds\":1.0,\"step\":20}\n"
    "{\"event\":\"done\",\"t\":2.1,\"test_accuracy\":0.8467,\"train_seconds\":2.0,\"samples_per_second\":640,\"strategy\":\"single\",\"model\":\"784-32-10\",\"dataset\":\"mnist\",\"batch\":128,\"epochs\":2,\"workers\":1,\"ps\":0}\n";

static void test_fixture(void)
{
    write_file("a.jsonl", FIXTURE_A);
    write_file("b.jsonl", FIXTURE_B);
    int rc = run_cmd(errbuf, sizeof errbuf,
                     "%s report %s/a.jsonl %s/b.jsonl -o %s/ab.html --label 'Run <A>' --title 'T&T'",
                     bin, tmp, tmp, tmp);
    CHECKF(rc == 0, "report of the fixtures: rc %d, %s", rc, errbuf);
    CHECKF(strstr(errbuf, "line 16 is cut short"), "the torn last line draws no warning: %s", errbuf);
    char *h = read_tmp("ab.html");
    REQUIRE(h);
    CHECK(strstr(h, "<title>T&amp;T</title>") != NULL);
    CHECK(strstr(h, "<script") == NULL);
    double v[16];
    /* The overlaid epochs: the label given, and the one derived from done. */
    CHECK(series_values(h, "val_accuracy", "Run &lt;A&gt;", "data-y", v, 16) == 2 && v[0] == 0.9 &&
          v[1] == 0.95);
    CHECK(series_values(h, "val_accuracy", "single b128 mnist", "data-y", v, 16) == 2 &&
          v[0] == 0.8 && v[1] == 0.85);
    CHECK(series_values(h, "val_loss", "single b128 mnist", "data-x", v, 16) == 2 && v[0] == 1 &&
          v[1] == 2);
    CHECK(series_values(h, "lr", "Run &lt;A&gt;", "data-y", v, 16) == 2 && v[0] == 0.001 &&
          v[1] == 0.0005);
    /* Cluster throughput: the sum of the tasks' samples/s. */
    CHECK(series_values(h, "throughput", "Run &lt;A&gt;", "data-y", v, 16) == 2 && v[0] == 285 &&
          v[1] == 235);
    /* Final figures, exact. */
    CHECK(final_value(h, "Run &lt;A&gt;", "test_accuracy") == 0.9512);
    CHECK(final_value(h, "Run &lt;A&gt;", "samples_per_second") == 1234.5);
    CHECK(final_value(h, "Run &lt;A&gt;", "cpu_percent_mean") == 61.5);
    CHECK(final_value(h, "Run &lt;A&gt;", "rss_peak_bytes") == 41943040);
    CHECK(final_value(h, "single b128 mnist", "test_accuracy") == 0.8467);
    CHECK(isnan(final_value(h, "single b128 mnist", "cpu_percent_mean")));
    /* Time axis: seconds since the run's earliest wall (worker:0's first sample). */
    CHECK(series_values(h, "cpu", "worker:0", "data-x", v, 16) == 3 && v[0] == 0 && v[1] == 1 &&
          v[2] == 2);
    CHECK(series_values(h, "cpu", "worker:0", "data-y", v, 16) == 3 && v[1] == 95.5);
    CHECK(series_values(h, "rss", "worker:0", "data-y", v, 16) == 3 && v[1] == 20);
    /* Network: the rate of tx + rx between samples, MB/s; none for the first. */
    CHECK(series_values(h, "net", "worker:0", "data-y", v, 16) == 2 && v[0] == 2 && v[1] == 3);
    /* The fault at 2 s and the straggler (worker:2, epoch 2, at 2.8 s) on the time axes. */
    const char *end, *cpu = chart(h, "cpu", &end);
    CHECK(attr_after(cpu, "class=\"marker fault\"", "data-x") == 2);
    CHECK(fabs(attr_after(cpu, "class=\"marker straggler\"", "data-x") - 2.8) < 1e-6);
    CHECK(count(h, "class=\"marker straggler\"") == 3); /* cpu, rss, net */
    CHECK(strstr(h, "<table class=\"stragglers\"><tr><th>task</th><th>epoch</th>") != NULL);
    CHECK(attr_after(strstr(h, "class=\"stragglers\""), "data-k=\"step_ms_median\"", "data-v") == 30);
    CHECK(attr_after(strstr(h, "class=\"stragglers\""), "data-k=\"tasks_median\"", "data-v") == 11);
    CHECK(count_in(h, "class=\"stragglers\"", "</table>", "<tr>") == 2); /* the header and worker:2 */
    CHECK(strstr(h, "<td data-k=\"what\">lost</td>") != NULL);
    /* Step-time boxes: median, p90 and max of each task and epoch. */
    const char *box = chart(h, "step_ms", &end);
    CHECK(attr_after(box, "data-series=\"worker:2\" data-x=\"2\"", "data-median") == 30);
    CHECK(attr_after(box, "data-series=\"worker:2\" data-x=\"2\"", "data-p90") == 41);
    CHECK(attr_after(box, "data-series=\"worker:2\" data-x=\"2\"", "data-max") == 60);
    CHECK(count(box, "class=\"boxg\"") == 6);
    CHECK(series_values(h, "task_throughput", "worker:2", "data-y", v, 16) == 2 && v[1] == 40);
    /* One time axis for CPU, memory and network, although the network rate
     * has no point at the first sample (its axis once began later). */
    const char *cpu_c = chart(h, "cpu", &end), *rss_c = chart(h, "rss", &end),
               *net_c = chart(h, "net", &end);
    double lo = attr_after(cpu_c, "data-chart", "data-x-lo"), hi = attr_after(cpu_c, "data-chart", "data-x-hi");
    CHECKF(isfinite(lo) && isfinite(hi) && lo <= 0 && hi >= 2.8, "cpu axis %g..%g", lo, hi);
    CHECKF(attr_after(rss_c, "data-chart", "data-x-lo") == lo &&
               attr_after(rss_c, "data-chart", "data-x-hi") == hi,
           "rss axis %g..%g, cpu %g..%g", attr_after(rss_c, "data-chart", "data-x-lo"),
           attr_after(rss_c, "data-chart", "data-x-hi"), lo, hi);
    CHECKF(attr_after(net_c, "data-chart", "data-x-lo") == lo &&
               attr_after(net_c, "data-chart", "data-x-hi") == hi,
           "net axis %g..%g, cpu %g..%g", attr_after(net_c, "data-chart", "data-x-lo"),
           attr_after(net_c, "data-chart", "data-x-hi"), lo, hi);
    /* Training against validation loss, and the hyperparameter columns. */
    CHECK(series_values(h, "loss", "Run &lt;A&gt; train", "data-y", v, 16) == 2 && v[0] == 0.4 &&
          v[1] == 0.25);
    CHECK(series_values(h, "loss", "Run &lt;A&gt; validation", "data-y", v, 16) == 2 &&
          v[0] == 0.3 && v[1] == 0.2);
    CHECK(final_value(h, "Run &lt;A&gt;", "lr") == 0.001 && final_value(h, "Run &lt;A&gt;", "seed") == 7);
    CHECK(strstr(h, "<td data-k=\"optimizer\">adam</td>") && strstr(h, "<td data-k=\"lr_schedule\">step</td>"));
    /* The single process: no resource charts, a note instead. */
    CHECK(count(h, "data-chart=\"cpu\"") == 1);
    CHECK(strstr(h, "No resource samples") != NULL);
    free(h);
}

/* One epoch, two tasks with PSS: one-point figures are a table, and peak
 * memory is the sum of PSS peaks (a shared mapping counted once). */
static const char FIXTURE_C[] =
    "{\"event\":\"resource\",\"t\":0.5,\"wall\":1700000000.0,\"task\":\"worker:0\",\"cpu_percent\":90,\"rss_bytes\":300000000,\"pss_bytes\":200000000,\"net_tx_bytes\":0,\"net_rx_bytes\":0}\n"
    "{\"event\":\"resource\",\"t\":1.5,\"wall\":1700000001.0,\"task\":\"worker:0\",\"cpu_percent\":90,\"rss_bytes\":310000000,\"pss_bytes\":210000000,\"net_tx_bytes\":5,\"net_rx_bytes\":5}\n"
    "{\"event\":\"resource\",\"t\":0.5,\"wall\":1700000000.1,\"task\":\"worker:1\",\"cpu_percent\":90,\"rss_bytes\":300000000,\"pss_bytes\":100000000,\"net_tx_bytes\":0,\"net_rx_bytes\":0}\n"
    "{\"event\":\"epoch\",\"t\":1.0,\"wall\":1700000001.0,\"epoch\":1,\"val_accuracy\":0.9,\"val_loss\":0.3,\"train_loss\":0.4,\"seconds\":1.0,\"step\":30,\"lr\":0.001,\"task\":\"worker:0\"}\n";

static void test_one_point(void)
{
    write_file("c.jsonl", FIXTURE_C);
    int rc = run_cmd(errbuf, sizeof errbuf, "%s report %s/c.jsonl -o %s/c.html --label C", bin, tmp, tmp);
    CHECKF(rc == 0, "report of one epoch: rc %d, %s", rc, errbuf);
    char *h = read_tmp("c.html");
    REQUIRE(h);
    CHECK(strstr(h, "<table class=\"onepoint\" data-chart=\"val_accuracy\">") != NULL);
    CHECK(
          !strstr(h, "data-chart=\"val_accuracy\" data-x-lo"));
    CHECK(strstr(h, "data-series=\"C\"><td>C</td><td class=\"n\" data-x=\"1\">") != NULL);
    CHECK(final_value(h, "C", "pss_peak_bytes") == 310000000);
    free(h);
}

/* ---- the library API ---- */

static void test_api(void)
{
    dp_report *r;
    dp_err err;
    REQUIRE(dp_report_open(&r, "<script>alert(1)</script>", &err) == 0);
    CHECK(dp_report_add_heading(r, "Scaling & <b>speed</b>") == 0);
    CHECK(dp_report_add_paragraph(r, "Recommendation: \"ps-async\" <img src=x onerror=alert(1)>") == 0);
    const char *hdr[] = {"workers", "samples/s"};
    const char *cells[] = {"1", "1000", "2", "1900 <i>"};
    CHECK(dp_report_add_table(r, "throughput", 2, hdr, 2, cells) == 0);
    double x[] = {1, 2, 4}, y[] = {1000, 1900, NAN};
    dp_chart_series s = {"ps-async", x, y, 3};
    dp_chart c = {"Scaling", "workers", "samples/s", true};
    CHECK(dp_report_add_line_chart(r, &c, &s, 1) == 0);
    x[0] = 99; /* the report keeps its own copy */
    char path[1200];
    snprintf(path, sizeof path, "%s/api.html", tmp);
    CHECK(dp_report_add_run(r, "/nonexistent/dir/run.jsonl", NULL, &err) == -1 &&
          strstr(err.msg, "/nonexistent/dir/run.jsonl") != NULL);
    CHECK(dp_report_write(r, path, &err) == 0);
    dp_report_free(r);
    dp_report_free(NULL);
    char *h = read_tmp("api.html");
    REQUIRE(h);
    CHECK(strstr(h, "<script") == NULL && strstr(h, "<img") == NULL && strstr(h, "<i>") == NULL);
    CHECK(strstr(h, "&lt;script&gt;alert(1)&lt;/script&gt;") != NULL);
    CHECK(strstr(h, "<h2>Scaling &amp; &lt;b&gt;speed&lt;/b&gt;</h2>") != NULL);
    CHECK(strstr(h, "<td class=\"n\">1000</td>") != NULL && strstr(h, "<td>1900 &lt;i&gt;</td>") != NULL);
    CHECK(strstr(h, "<h2>Runs</h2>") == NULL);
    /* Two finite points; the NaN is a gap. */
    CHECK(count(h, "<circle") == 2 && strstr(h, "data-x=\"1\" data-y=\"1000\"") != NULL);
    CHECK(dp_report_write(NULL, path, &err) == -1);
    free(h);
}

/* ---- a PNG's pixels (8-bit RGB or RGBA, non-interlaced, as Chromium writes) ---- */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int paeth(int a, int b, int c)
{
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Decodes the PNG at path; returns the number of distinct colours (up to
 * 4096 counted) and the share of pixels that are not white, or -1. */
static int png_colours(const char *path, uint32_t *w_out, uint32_t *h_out, double *ink)
{
    size_t len;
    unsigned char *f = (unsigned char *)slurp(path, &len);
    if (!f || len < 33 || memcmp(f, "\x89PNG\r\n\x1a\n", 8) != 0) {
        free(f);
        return -1;
    }
    uint32_t w = be32(f + 16), h = be32(f + 20);
    int depth = f[24], type = f[25], interlace = f[28];
    int bpp = type == 6 ? 4 : type == 2 ? 3 : 0;
    if (depth != 8 || !bpp || interlace || w == 0 || h == 0 || w > 10000 || h > 10000) {
        free(f);
        return -1;
    }
    unsigned char *idat = malloc(len), *raw = NULL;
    size_t n_idat = 0;
    for (size_t p = 8; p + 12 <= len;) {
        uint32_t n = be32(f + p);
        if (p + 12 + n > len)
            break;
        if (memcmp(f + p + 4, "IDAT", 4) == 0) {
            memcpy(idat + n_idat, f + p + 8, n);
            n_idat += n;
        }
        p += 12 + n;
    }
    size_t stride = (size_t)w * bpp, raw_len = (stride + 1) * h;
    raw = malloc(raw_len);
    uLongf got = raw_len;
    int colours = -1;
    if (raw && uncompress(raw, &got, idat, n_idat) == Z_OK && got == raw_len) {
        static uint32_t seen[4096];
        int n_seen = 0;
        size_t inked = 0;
        for (uint32_t y = 0; y < h; y++) {
            unsigned char *row = raw + y * (stride + 1) + 1, *up = y ? row - stride - 1 : NULL;
            int ft = row[-1];
            for (size_t i = 0; i < stride; i++) {
                int a = i >= (size_t)bpp ? row[i - bpp] : 0, b = up ? up[i] : 0;
                int c = up && i >= (size_t)bpp ? up[i - bpp] : 0;
                int pred = ft == 1 ? a : ft == 2 ? b : ft == 3 ? (a + b) / 2 : ft == 4 ? paeth(a, b, c) : 0;
                row[i] = (unsigned char)(row[i] + pred);
            }
            for (uint32_t x = 0; x < w; x++) {
                const unsigned char *px = row + (size_t)x * bpp;
                uint32_t rgb = (uint32_t)px[0] << 16 | (uint32_t)px[1] << 8 | px[2];
                inked += rgb != 0xffffff;
                int known = 0;
                for (int k = 0; k < n_seen && !known; k++)
                    known = seen[k] == rgb;
                if (!known && n_seen < 4096)
                    seen[n_seen++] = rgb;
            }
        }
        colours = n_seen;
        *ink = (double)inked / ((double)w * h);
        *w_out = w;
        *h_out = h;
    }
    free(f);
    free(idat);
    free(raw);
    return colours;
}

/* ---- the real run in Chromium ---- */

static int have_chromium(void)
{
    return system("command -v chromium >/dev/null 2>&1") == 0;
}

static void test_cluster_in_chromium(void)
{
    char metrics[1200], html[1200];
    snprintf(metrics, sizeof metrics, "%s/run.jsonl", tmp);
    snprintf(html, sizeof html, "%s/run.html", tmp);
    int rc = run_cmd(errbuf, sizeof errbuf,
                     "%s launch --chief --workers 2 --ps 1 -- train --strategy ps-async --dataset "
                     "mnist --model 784-32-10 --epochs 2 --train-size 4000 --val-size 1000 "
                     "--log-every 0 --threads 1 --no-progress --metrics %s",
                     bin, metrics);
    REQUIRE(rc == 0);
    rc = run_cmd(errbuf, sizeof errbuf, "%s report %s -o %s --label cluster", bin, metrics, html);
    CHECKF(rc == 0, "report: rc %d, %s", rc, errbuf);
    char *h = read_tmp("run.html");
    REQUIRE(h);

    /* The numbers in the SVG are the metrics file's. */
    cJSON *done = last_event(metrics, "done", NULL);
    REQUIRE(done);
    CHECK(final_value(h, "cluster", "test_accuracy") == json_num(done, "test_accuracy"));
    CHECK(final_value(h, "cluster", "train_seconds") == json_num(done, "train_seconds"));
    CHECK(final_value(h, "cluster", "samples_per_second") == json_num(done, "samples_per_second"));
    CHECK(final_value(h, "cluster", "workers") == 2 && final_value(h, "cluster", "ps") == 1);
    cJSON_Delete(done);
    cJSON *total = last_event(metrics, "resource_total", NULL);
    if (total)
        CHECK(final_value(h, "cluster", "net_tx_bytes") == json_num(total, "net_tx_bytes"));
    cJSON_Delete(total);
    double acc[8], loss[8], want_acc[8], want_loss[8];
    int n_acc = series_values(h, "val_accuracy", "cluster", "data-y", acc, 8);
    int n_loss = series_values(h, "val_loss", "cluster", "data-y", loss, 8);
    CHECKF(n_acc == 2 && n_loss == 2, "%d and %d epoch points", n_acc, n_loss);
    for (int e = 1; e <= 2; e++) {
        cJSON *ep = NULL;
        size_t len;
        char *text = slurp(metrics, &len);
        REQUIRE(text);
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            cJSON *j = cJSON_Parse(line);
            if (j && strcmp(json_str(j, "event"), "epoch") == 0 && json_num(j, "epoch") == e) {
                cJSON_Delete(ep);
                ep = j;
            } else {
                cJSON_Delete(j);
            }
        }
        free(text);
        REQUIRE(ep);
        want_acc[e - 1] = json_num(ep, "val_accuracy");
        want_loss[e - 1] = json_num(ep, "val_loss");
        cJSON_Delete(ep);
    }
    for (int e = 0; e < 2 && n_acc == 2 && n_loss == 2; e++) {
        CHECKF(acc[e] == want_acc[e], "epoch %d: val_accuracy %.17g in the SVG, %.17g in the file",
               e + 1, acc[e], want_acc[e]);
        CHECKF(loss[e] == want_loss[e], "epoch %d: val_loss %.17g in the SVG, %.17g in the file",
               e + 1, loss[e], want_loss[e]);
    }
    /* Each task's CPU samples, in order. */
    const char *tasks[] = {"chief:0", "worker:0", "worker:1", "ps:0"};
    for (int t = 0; t < 4; t++) {
        cJSON *last = last_event(metrics, "resource", tasks[t]);
        double cpu[200];
        int n = series_values(h, "cpu", tasks[t], "data-y", cpu, 200);
        CHECKF(last && n >= 1, "%s: %d CPU points", tasks[t], n);
        if (last && n >= 1)
            CHECK(cpu[n - 1] == json_num(last, "cpu_percent"));
        cJSON_Delete(last);
    }
    free(h);

    if (!have_chromium()) {
        fprintf(stderr, "skipping the browser check: chromium not found (apt-get install chromium)\n");
        return;
    }
    /* Its own profile and HOME in the scratch directory, logging on stderr. */
    rc = run_cmd(errbuf, sizeof errbuf,
                 "cd %s && HOME=%s timeout 120 chromium --headless=new --no-sandbox --disable-gpu "
                 "--no-first-run --user-data-dir=%s/chrome --enable-logging=stderr --v=0 "
                 "--window-size=1200,3000 --screenshot=%s/shot.png file://%s",
                 tmp, tmp, tmp, tmp, html);
    CHECKF(rc == 0, "chromium --screenshot: rc %d", rc);
    CHECKF(!strstr(errbuf, "Uncaught") && !strstr(errbuf, ":CONSOLE"),
           "script or console errors:\n%s", errbuf);
    char shot[1200];
    snprintf(shot, sizeof shot, "%s/shot.png", tmp);
    uint32_t w = 0, hh = 0;
    double ink = 0;
    int colours = png_colours(shot, &w, &hh, &ink);
    CHECKF(colours >= 16 && ink > 0.01 && w == 1200 && hh == 3000,
           "screenshot: %ux%u, %d colours, %.4f of it not white", w, hh, colours, ink);
    /* The DOM Chromium built: the charts are there as SVG. */
    rc = run_cmd(errbuf, sizeof errbuf,
                 "HOME=%s timeout 120 chromium --headless=new --no-sandbox --disable-gpu "
                 "--no-first-run --user-data-dir=%s/chrome --dump-dom file://%s > %s/dom.html",
                 tmp, tmp, html, tmp);
    char *dom = read_tmp("dom.html");
    CHECKF(rc == 0 && dom && count(dom, "<svg") >= 5 && strstr(dom, "data-chart=\"val_accuracy\""),
           "chromium --dump-dom: rc %d, %d svg elements", rc, count(dom, "<svg"));
    free(dom);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    REQUIRE(chdir(tmp) == 0);
    test_bad_input();
    test_fixture();
    test_one_point();
    test_api();
    char probe[1200];
    bool mnist = have_mnist(probe, sizeof probe);
    if (mnist)
        test_cluster_in_chromium();
    if (check_failures)
        return CHECK_DONE();
    if (!mnist || !have_chromium()) {
        fprintf(stderr, "skipping: %s not found (the checks without it passed)\n",
                mnist ? "chromium" : "MNIST");
        return 77;
    }
    return CHECK_DONE();
}
