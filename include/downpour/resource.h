/* Resource sampling: this process's CPU use, resident memory and network
 * bytes, written once a second (by default) as metrics events:
 *   {"event":"resource","t":..,"task":"worker:0","cpu_percent":..,"rss_bytes":..,
 *    "net_tx_bytes":..,"net_rx_bytes":..}
 * cpu_percent is (utime+stime) from /proc/self/stat over wall time between two
 * samples, as top shows it: 100 = one core busy, 200 = two.  rss_bytes is
 * /proc/self/statm's resident pages times the page size.  The net counters
 * are cumulative bytes since the transport opened, from a caller's callback. */
#ifndef DOWNPOUR_RESOURCE_H
#define DOWNPOUR_RESOURCE_H

#include <stdint.h>

#include "downpour/metrics.h"
#include "downpour/status.h"

typedef struct dp_resource_usage {
    double wall;         /* dp_now() when taken, seconds */
    double cpu_seconds;  /* user + system CPU time of the process so far */
    int64_t rss_bytes;   /* resident set size */
} dp_resource_usage;

/* Reads /proc/self/stat and /proc/self/statm. */
int dp_resource_sample(dp_resource_usage *u, dp_err *err);

/* CPU percent between two samples (0 when no wall time has passed). */
double dp_resource_cpu_percent(const dp_resource_usage *before, const dp_resource_usage *after);

/* Fills the bytes sent and received so far (the transport's counters). */
typedef void (*dp_net_bytes_fn)(void *ctx, uint64_t *tx_bytes, uint64_t *rx_bytes);

typedef struct dp_resource_sampler dp_resource_sampler;

/* Starts a thread that writes one "resource" event to m every interval
 * seconds (<= 0: 1 s).  task names the task ("worker:0"); net may be NULL
 * (counters written as 0).  m must outlive the sampler; the sampler's own
 * writes are serialised, and dp_metrics_event writes each line with one
 * write, so lines from other threads do not interleave with them. */
int dp_resource_sampler_start(dp_resource_sampler **out, dp_metrics *m, const char *task,
                              double interval, dp_net_bytes_fn net, void *net_ctx, dp_err *err);

/* Writes one final sample, stops and joins the thread, frees.  NULL is a no-op. */
void dp_resource_sampler_stop(dp_resource_sampler *s);

#endif
