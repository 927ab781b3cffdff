/* Reports: one self-contained HTML file (inline SVG charts, no script or
 * network needed to view it) built from metrics files (docs/metrics.md), plus
 * whatever tables, text and charts a caller such as `downpour experiment`
 * adds.  docs/reports.md describes what a report shows.
 *
 *   dp_report *r;
 *   dp_report_open(&r, "MNIST study", &err);
 *   dp_report_add_paragraph(r, "Recommendation: ...");
 *   dp_report_add_run(r, "ps-async-128.jsonl", "ps-async b128", &err);
 *   dp_report_write(r, "report.html", &err);
 *   dp_report_free(r);
 *
 * Items the caller adds (headings, paragraphs, tables, charts) appear in the
 * order added, before the runs' section: the runs overlaid (validation
 * accuracy and loss per epoch, throughput), a table of their final figures,
 * then each run's per-task charts (CPU, memory, network over time, step-time
 * distribution, stragglers and faults marked on the time axis).  Every text
 * given here is escaped; the caller never writes HTML. */
#ifndef DOWNPOUR_REPORT_H
#define DOWNPOUR_REPORT_H

#include <stdbool.h>

#include "downpour/status.h"

typedef struct dp_report dp_report;

int dp_report_open(dp_report **out, const char *title, dp_err *err);
void dp_report_free(dp_report *r); /* NULL is a no-op */

/* Reads one run's metrics file: a single process's, or a launched cluster's
 * merged file (lines tagged with "task").  label names the run in legends
 * and tables; NULL derives one from its "done" event ("ps-async b128
 * mnist").  A file that cannot be read, or holds no event of a run, is an
 * error naming it (and the line, for a line that is not a JSON object and is
 * not the torn last line of a killed task).  Returns 0 or -1. */
int dp_report_add_run(dp_report *r, const char *path, const char *label, dp_err *err);

/* Caller content, in order.  Return 0, or -1 when out of memory. */
int dp_report_add_heading(dp_report *r, const char *text);
int dp_report_add_paragraph(dp_report *r, const char *text);
/* A table of rows x cols cells, row-major; header has cols entries, caption
 * may be NULL.  Cells that parse as numbers are right-aligned. */
int dp_report_add_table(dp_report *r, const char *caption, int cols, const char *const *header,
                        int rows, const char *const *cells);

/* One line of a chart: n points (x[i], y[i]); non-finite y leaves a gap. */
typedef struct dp_chart_series {
    const char *name;
    const double *x, *y;
    int n;
} dp_chart_series;

typedef struct dp_chart {
    const char *title;
    const char *x_label; /* with its unit: "workers", "seconds" */
    const char *y_label; /* with its unit: "samples/s", "accuracy" */
    bool y_from_zero;    /* the y axis starts at 0 rather than at the data's minimum */
} dp_chart;

int dp_report_add_line_chart(dp_report *r, const dp_chart *c, const dp_chart_series *s, int n);

/* Writes the page to path with an atomic replace (file.h): the file arrives
 * whole or not at all.  Returns 0, or -1 naming path and the error. */
int dp_report_write(dp_report *r, const char *path, dp_err *err);

#endif
