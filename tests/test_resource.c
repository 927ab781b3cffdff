/* Resource sampling: a busy loop shows up as CPU, touched memory as RSS, and
 * the sampler thread writes "resource" events that parse as JSON. */
#include <cjson/cJSON.h>
#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "downpour/clock.h"
#include "downpour/metrics.h"
#include "downpour/resource.h"

static void test_cpu(void)
{
    dp_resource_usage a, b;
    dp_err err;
    /* Burn 0.5 s of CPU however busy the machine is, and compare the sampler
     * with the kernel's own count of this process's CPU time over the same wall time. */
    struct timespec c0, c1;
    REQUIRE(dp_resource_sample(&a, &err) == 0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double w0 = dp_now();
    volatile double x = 0;
    double used = 0;
    while (used < 0.5 && dp_now() - w0 < 20) {
        for (int i = 0; i < 10000; i++)
            x += i * 1e-9;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        used = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    }
    REQUIRE(dp_resource_sample(&b, &err) == 0);
    double expected = 100 * used / (dp_now() - w0);
    double cpu = dp_resource_cpu_percent(&a, &b);
    CHECKF(cpu > 5 && fabs(cpu - expected) < 10 + 0.1 * expected,
           "busy loop: cpu_percent %.1f, the kernel says %.1f", cpu, expected);
    CHECK(b.cpu_seconds >= a.cpu_seconds);
    CHECK(dp_resource_cpu_percent(&a, &a) == 0);

    /* sleeping costs (almost) no CPU */
    REQUIRE(dp_resource_sample(&a, &err) == 0);
    usleep(300000);
    REQUIRE(dp_resource_sample(&b, &err) == 0);
    cpu = dp_resource_cpu_percent(&a, &b);
    CHECKF(cpu < 20, "sleeping: cpu_percent %.1f", cpu);
}

static void test_rss(void)
{
    dp_resource_usage a, b;
    dp_err err;
    REQUIRE(dp_resource_sample(&a, &err) == 0);
    CHECK(a.rss_bytes > 0);
    size_t n = 100u << 20;
    char *p = malloc(n);
    REQUIRE(p != NULL);
    memset(p, 1, n);
    REQUIRE(dp_resource_sample(&b, &err) == 0);
    CHECKF(b.rss_bytes - a.rss_bytes > 90LL << 20, "rss %lld -> %lld", (long long)a.rss_bytes,
           (long long)b.rss_bytes);
    volatile char sink = p[n / 2];
    (void)sink;
    free(p);
    /* the peak stays where the memory was, after it went back (glibc hands
     * a block this large back to the kernel at free; ASan keeps it) */
    dp_resource_usage c;
    REQUIRE(dp_resource_sample(&c, &err) == 0);
    if (c.hwm_bytes >= 0) /* every Linux has VmHWM; -1 would be a kernel without it;
                           * its count and statm's may differ by the pages a thread has
                           * not yet folded in (the kernel's per-thread RSS caches) */
        CHECKF(c.hwm_bytes > b.rss_bytes - (1LL << 20) &&
                   c.hwm_bytes > c.rss_bytes - (1LL << 20),
               "after free: rss %lld, peak %lld (held %lld)", (long long)c.rss_bytes,
               (long long)c.hwm_bytes, (long long)b.rss_bytes);
}

static void net_counters(void *ctx, uint64_t *tx, uint64_t *rx)
{
    int *calls = ctx;
    (*calls)++;
    *tx = 1000u * (uint64_t)*calls;
    *rx = 7;
}

/* Reads path's lines; checks each is a resource event of `task`; returns the
 * number of lines and the last net_tx_bytes. */
static int check_events(const char *path, const char *task, double *last_tx, double *last_rx)
{
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        CHECKF(strchr(line, '\n') != NULL, "unterminated line %s", line);
        cJSON *o = cJSON_Parse(line);
        CHECKF(cJSON_IsObject(o), "not JSON: %s", line);
        if (!o)
            continue;
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
        const cJSON *tk = cJSON_GetObjectItemCaseSensitive(o, "task");
        const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(o, "cpu_percent");
        const cJSON *rss = cJSON_GetObjectItemCaseSensitive(o, "rss_bytes");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(o, "net_tx_bytes");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(o, "net_rx_bytes");
        CHECK(cJSON_IsString(ev) && strcmp(ev->valuestring, "resource") == 0);
        CHECK(cJSON_IsString(tk) && strcmp(tk->valuestring, task) == 0);
        CHECK(cJSON_IsNumber(cpu) && cpu->valuedouble >= 0);
        CHECK(cJSON_IsNumber(rss) && rss->valuedouble > 1e5);
        const cJSON *hwm = cJSON_GetObjectItemCaseSensitive(o, "rss_hwm_bytes");
        CHECK(cJSON_IsNumber(hwm) && cJSON_IsNumber(rss) &&
              hwm->valuedouble >= rss->valuedouble);
        CHECK(cJSON_IsNumber(tx) && cJSON_IsNumber(rx));
        CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "t")));
        if (cJSON_IsNumber(tx))
            *last_tx = tx->valuedouble;
        if (cJSON_IsNumber(rx))
            *last_rx = rx->valuedouble;
        cJSON_Delete(o);
    }
    fclose(f);
    return n;
}

static void test_sampler(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/resource_%d.jsonl", dir, (int)getpid());
    dp_metrics *m;
    dp_err err;
    REQUIRE(dp_metrics_open(&m, path, &err) == 0);
    int calls = 0;
    dp_resource_sampler *s;
    REQUIRE(dp_resource_sampler_start(&s, m, "worker:0", 0.1, net_counters, &calls, &err) == 0);
    usleep(450000);
    double t0 = dp_now();
    dp_resource_sampler_stop(s);
    CHECK(dp_now() - t0 < 30); /* no hang (a bound load cannot reach) */
    dp_metrics_close(m);
    double tx = -1, rx = -1;
    int n = check_events(path, "worker:0", &tx, &rx);
    CHECKF(n >= 3 && n <= 7, "%d events in 0.45 s at 0.1 s", n);
    CHECKF(n == calls, "%d events, %d counter reads", n, calls);
    CHECK(tx == 1000.0 * calls && rx == 7);

    /* A long interval: stop is immediate and writes the one final sample;
     * without a counter callback the net bytes are 0. */
    REQUIRE(dp_metrics_open(&m, path, &err) == 0);
    REQUIRE(dp_resource_sampler_start(&s, m, "ps:1", 60, NULL, NULL, &err) == 0);
    t0 = dp_now();
    dp_resource_sampler_stop(s);
    CHECK(dp_now() - t0 < 30); /* not the 60 s interval */
    dp_metrics_close(m);
    n = check_events(path, "ps:1", &tx, &rx);
    CHECK(n == 1 && tx == 0 && rx == 0);
    dp_resource_sampler_stop(NULL);
    unlink(path);
}

int main(void)
{
    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    test_cpu();
    test_rss();
    test_sampler(dir && *dir ? dir : "/tmp");
    return CHECK_DONE();
}
