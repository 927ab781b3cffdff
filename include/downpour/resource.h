/* Resource sampling: this process's CPU use, resident memory and network
 * bytes, written once a second (by default) as metrics events:
 *   {"event":"resource","t":..,"task":"worker:0","cpu_percent":..,"rss_bytes":..,
 *    "net_tx_bytes":..,"net_rx_bytes":..}
 * cpu_percent is (utime+stime) from /proc/self/stat over wall time between two
 * samples, as top shows it: 100 = one core busy, 200 = two.  rss_bytes is
 * /proc/self/statm's resident pages times the page size.  pss_bytes (written
 * when the kernel has /proc/self/smaps_rollup, Linux 4.14+) is the
 * proportional set size: a page shared by N processes (the dataset cache
 * mapped by every task of a host) counts 1/N in each, so a sum over tasks
 * counts it once.  The net counters
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
    int64_t pss_bytes;   /* proportional set size; -1 where smaps_rollup is missing */
    int64_t hwm_bytes;   /* the process's peak resident size so far (/proc/self/status
                            VmHWM); -1 where missing */
} dp_resource_usage;

/* Reads /proc/self/stat, /proc/self/statm and /proc/self/smaps_rollup. */
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

/* Writes the last sample now, while the work is still up, and stops the
 * thread: a caller calls it when training ends and before tearing down the
 * transport and model, so no sample of the teardown (memory freed, counters
 * closed) ends every line.  NULL is a no-op; calling it twice is harmless. */
void dp_resource_sampler_finish(dp_resource_sampler *s);

/* Stops and joins the thread and frees; writes a final sample only when
 * dp_resource_sampler_finish was not called (a run that failed early).
 * NULL is a no-op. */
void dp_resource_sampler_stop(dp_resource_sampler *s);

#endif
