/* Resource sampler: /proc/self/stat and /proc/self/statm, sampled by a
 * thread that sleeps on a condition variable so stop is immediate. */
#include "downpour/resource.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/log.h"

static int read_small(const char *path, char *buf, size_t size, dp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp_errf(err, "cannot open %s: %s", path, strerror(errno));
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t r = read(fd, buf + n, size - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return dp_errf(err, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return 0;
}

/* A "KEY:   N kB" line of a /proc file, in bytes; -1 when it is not there. */
static int64_t kb_field(const char *path, const char *key)
{
    char buf[4096], pat[32];
    unsigned long long kb;
    if (read_small(path, buf, sizeof buf, NULL) < 0)
        return -1;
    snprintf(pat, sizeof pat, "\n%s:", key);
    const char *q = strstr(buf, pat);
    return q && sscanf(q + strlen(pat), "%llu", &kb) == 1 ? (int64_t)kb * 1024 : -1;
}

int dp_resource_sample(dp_resource_usage *u, dp_err *err)
{
    char buf[1024];
    u->wall = dp_now();
    if (read_small("/proc/self/stat", buf, sizeof buf, err) < 0)
        return -1;
    /* The command name (field 2) is in parentheses and may hold spaces or
     * ')'; fields are counted from the last ')'.  utime and stime are fields
     * 14 and 15, so the 12th and 13th after it. */
    char *p = strrchr(buf, ')');
    if (!p)
        return dp_errf(err, "/proc/self/stat: unexpected format");
    p++;
    unsigned long long utime = 0, stime = 0;
    for (int field = 3; field <= 15; field++) {
        while (*p == ' ')
            p++;
        if (!*p)
            return dp_errf(err, "/proc/self/stat: only %d fields", field - 1);
        char *end = p;
        while (*end && *end != ' ')
            end++;
        if (field == 14)
            utime = strtoull(p, NULL, 10);
        else if (field == 15)
            stime = strtoull(p, NULL, 10);
        p = end;
    }
    long hz = sysconf(_SC_CLK_TCK);
    u->cpu_seconds = (double)(utime + stime) / (double)(hz > 0 ? hz : 100);

    if (read_small("/proc/self/statm", buf, sizeof buf, err) < 0)
        return -1;
    unsigned long long size_pages = 0, resident = 0;
    if (sscanf(buf, "%llu %llu", &size_pages, &resident) != 2)
        return dp_errf(err, "/proc/self/statm: unexpected format");
    long page = sysconf(_SC_PAGESIZE);
    u->rss_bytes = (int64_t)resident * (page > 0 ? page : 4096);
    /* The kernel's high-water mark: a task whose memory came and went
     * between two samples (a ps task's shard, freed at its end) still shows
     * what it held.  Optional: older kernels lack smaps_rollup, and then
     * only RSS is known. */
    u->hwm_bytes = kb_field("/proc/self/status", "VmHWM");
    u->pss_bytes = kb_field("/proc/self/smaps_rollup", "Pss");
    return 0;
}

double dp_resource_cpu_percent(const dp_resource_usage *before, const dp_resource_usage *after)
{
    double wall = after->wall - before->wall;
    if (wall <= 0)
        return 0;
    double cpu = after->cpu_seconds - before->cpu_seconds;
    return cpu > 0 ? 100.0 * cpu / wall : 0;
}

struct dp_resource_sampler {
    dp_metrics *m;
    char task[64];
    double interval;
    dp_net_bytes_fn net;
    void *net_ctx;
    pthread_t thread;
    pthread_mutex_t mu;   /* guards stop and serialises this sampler's writes */
    pthread_cond_t cv;
    int stop;
    int finished; /* the last sample is written; the thread is joined */
    int warned;
    dp_resource_usage prev;
    int64_t prev_hwm; /* the highest peak written */
};

static void write_sample(dp_resource_sampler *s)
{
    dp_resource_usage now;
    dp_err err;
    if (dp_resource_sample(&now, &err) < 0) {
        if (!s->warned)
            dp_warn("resource sampler: %s", err.msg);
        s->warned = 1;
        return;
    }
    uint64_t tx = 0, rx = 0;
    if (s->net)
        s->net(s->net_ctx, &tx, &rx);
    double cpu = dp_resource_cpu_percent(&s->prev, &now);
    s->prev = now;
    /* the peak: the kernel's, else the highest this sampler saw */
    if (now.hwm_bytes < now.rss_bytes)
        now.hwm_bytes = now.rss_bytes;
    if (now.hwm_bytes < s->prev_hwm)
        now.hwm_bytes = s->prev_hwm;
    s->prev_hwm = now.hwm_bytes;
    if (now.pss_bytes >= 0)
        dp_metrics_event(s->m, "resource", DP_F_STR, "task", s->task, DP_F_NUM, "cpu_percent",
                         cpu, DP_F_INT, "rss_bytes", (long)now.rss_bytes, DP_F_INT,
                         "rss_hwm_bytes", (long)now.hwm_bytes, DP_F_INT, "pss_bytes",
                         (long)now.pss_bytes, DP_F_INT, "net_tx_bytes", (long)tx, DP_F_INT,
                         "net_rx_bytes", (long)rx, DP_F_END);
    else
        dp_metrics_event(s->m, "resource", DP_F_STR, "task", s->task, DP_F_NUM, "cpu_percent",
                         cpu, DP_F_INT, "rss_bytes", (long)now.rss_bytes, DP_F_INT,
                         "rss_hwm_bytes", (long)now.hwm_bytes, DP_F_INT, "net_tx_bytes",
                         (long)tx, DP_F_INT, "net_rx_bytes", (long)rx, DP_F_END);
}

static void *sampler_main(void *arg)
{
    dp_resource_sampler *s = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        long ns = (long)((s->interval - (double)(long)s->interval) * 1e9);
        next.tv_sec += (time_t)s->interval;
        next.tv_nsec += ns;
        if (next.tv_nsec >= 1000000000L) {
            next.tv_sec++;
            next.tv_nsec -= 1000000000L;
        }
        int rc = 0;
        while (!s->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&s->cv, &s->mu, &next);
        if (s->stop)
            break;
        write_sample(s);
        /* If sampling fell behind (a suspended process), restart the clock. */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec + 2)
            next = now;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int dp_resource_sampler_start(dp_resource_sampler **out, dp_metrics *m, const char *task,
                              double interval, dp_net_bytes_fn net, void *net_ctx, dp_err *err)
{
    *out = NULL;
    dp_resource_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "resource sampler: out of memory");
    s->m = m;
    snprintf(s->task, sizeof s->task, "%s", task ? task : "");
    s->interval = interval > 0 ? interval : 1.0;
    if (s->interval < 0.01)
        s->interval = 0.01;
    s->net = net;
    s->net_ctx = net_ctx;
    if (dp_resource_sample(&s->prev, err) < 0) {
        free(s);
        return dp_err_prefix(err, "resource sampler");
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    int rc = pthread_create(&s->thread, NULL, sampler_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return dp_errf(err, "resource sampler: cannot start thread: %s", strerror(rc));
    }
    *out = s;
    return 0;
}

void dp_resource_sampler_finish(dp_resource_sampler *s)
{
    if (!s || s->finished)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    write_sample(s); /* the final sample, covering the time since the last one */
    s->finished = 1;
}

void dp_resource_sampler_stop(dp_resource_sampler *s)
{
    if (!s)
        return;
    dp_resource_sampler_finish(s);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
