/* Metrics: one JSON object a line (JSON Lines) for programs to read.  Every
 * object has "event", "t" (seconds since the writer opened) and "wall" (Unix
 * seconds, to align processes).  The contract (docs/metrics.md):
 *   {"event":"epoch","epoch":1,"val_accuracy":..,"train_loss":..,"seconds":..}
 *   {"event":"done","test_accuracy":..,"train_seconds":..,"samples_per_second":..,
 *    "strategy":"single","model":"mlp-300-100","batch":128,"epochs":25}
 * Later events (resource, step) follow the same shape. */
#ifndef DOWNPOUR_METRICS_H
#define DOWNPOUR_METRICS_H

#include "downpour/status.h"

typedef struct dp_metrics dp_metrics;

/* Opens (truncates) path for writing; path NULL gives a writer that drops
 * everything, so callers need no checks. */
int dp_metrics_open(dp_metrics **out, const char *path, dp_err *err);

/* Write errors are sticky: the first failed write (ENOSPC on a full disk)
 * warns once on stderr, naming the file and the error; later events are
 * dropped.  dp_metrics_close_check syncs and closes the file and returns -1,
 * naming the file and the error, when any write, the sync or the close
 * failed, so the command can fail at its end; dp_metrics_close ignores it
 * (for paths that fail anyway).  Both free m; NULL is a no-op. */
int dp_metrics_close_check(dp_metrics *m, dp_err *err);
void dp_metrics_close(dp_metrics *m);

/* Names the task writing (a cluster task: "worker:3"): every later event
 * that has no "task" of its own gets it, so a task's file reads the same
 * alone as merged.  NULL or "" clears it. */
void dp_metrics_set_task(dp_metrics *m, const char *task);

/* Field kinds for dp_metrics_event's variadic list. */
typedef enum dp_field_kind {
    DP_F_END,    /* terminates the list */
    DP_F_INT,    /* const char *key, long value */
    DP_F_NUM,    /* const char *key, double value */
    DP_F_STR,    /* const char *key, const char *value */
    DP_F_COUNT
} dp_field_kind;

/* dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 1L, DP_F_NUM, "val_accuracy", 0.97,
 *                  DP_F_END);  one line, flushed. */
int dp_metrics_event(dp_metrics *m, const char *event, ...);

/* From now on every event is also written to tb as TensorBoard scalars
 * (tensorboard.h), whether or not the writer has a file; NULL detaches.  Safe
 * while other threads write events; detach before closing tb, and keep tb
 * open while events may still come. */
typedef struct dp_tensorboard dp_tensorboard;
void dp_metrics_attach_tensorboard(dp_metrics *m, dp_tensorboard *tb);

/* One task's metrics file for dp_metrics_merge. */
typedef struct dp_metrics_source {
    const char *path; /* the task's JSON Lines file */
    const char *task; /* its name, "worker:2", added as "task" where a line lacks one */
} dp_metrics_source;

/* Writes `path` from the n task files in src, in that order: each task's
 * JSON lines, "task" added where missing (lines that are not JSON objects,
 * such as a torn last line, are skipped with a warning), then
 *   {"event":"resource_total","t":..,"tasks":T,"samples":S,
 *    "cpu_percent_mean":..,   mean over tasks of each task's mean CPU %
 *    "cpu_percent_sum":..,    sum of those means (100 = one core busy)
 *    "rss_peak_bytes":..,     sum over tasks of each task's peak RSS
 *    "pss_peak_bytes":..,     the same over PSS, which counts a mapping
 *                             shared by tasks (the dataset cache) once;
 *                             only when every task's samples carry PSS
 *    "net_tx_bytes":..,"net_rx_bytes":..}  sum of each task's last counters
 * when any task wrote "resource" events.  `seconds` is the "t" of that line.
 * A missing task file is skipped with a warning.  path is replaced
 * atomically (file.h); the task files are left as they are. */
int dp_metrics_merge(const char *path, const dp_metrics_source *src, int n, double seconds,
                     dp_err *err);

#endif
