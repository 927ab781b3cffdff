/* Private to src/io: a growable text buffer and the inline SVG charts of
 * reports (docs/reports.md).  Charts carry their numbers for programs as
 * well as people: every point drawn as a marker has data-x and data-y with
 * the exact value (%.17g) and a <title> tooltip; every vertical marker has
 * data-x; every box of a box chart data-median, data-p90, data-max. */
#ifndef DOWNPOUR_IO_SVG_H
#define DOWNPOUR_IO_SVG_H

#include <stdbool.h>
#include <stddef.h>

/* Text that grows as it is written.  Out of memory is sticky (oom set,
 * later writes dropped), so callers check once at the end. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

void sb_free(sbuf *b);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s with & < > " ' escaped and control characters replaced, for text and
 * attribute values alike. */
void sb_esc(sbuf *b, const char *s);
/* A double exactly as JSON held it (%.17g, trimmed when shorter reads
 * back the same), or "null" when not finite. */
void sb_num(sbuf *b, double v);

/* The fixed palette: series i gets svg_colour(i). */
const char *svg_colour(int i);

typedef struct svg_chart {
    const char *title;
    const char *x_label; /* with its unit */
    const char *y_label; /* with its unit */
    bool y_from_zero;
    bool x_integer;      /* ticks at whole numbers only (epochs) */
    const char *id;      /* data-chart attribute for programs, may be NULL */
    bool x_fixed;        /* the x axis spans [x_lo, x_hi] (charts of one run share it) */
    double x_lo, x_hi;
} svg_chart;

typedef struct svg_series {
    const char *name;
    const double *x, *y; /* non-finite y: a gap */
    int n;
} svg_series;

typedef enum svg_marker_kind { SVG_MARK_FAULT, SVG_MARK_STRAGGLER, SVG_MARK_KIND_COUNT } svg_marker_kind;

typedef struct svg_marker {
    double x;
    svg_marker_kind kind;
    const char *text; /* its tooltip */
} svg_marker;

/* Series longer than this are drawn as a line without point markers. */
#define SVG_MAX_MARKED_POINTS 120
/* Longer series are drawn through every k-th point, at most this many. */
#define SVG_MAX_LINE_POINTS 2000
/* A box chart shows at most this many categories (every k-th beyond). */
#define SVG_MAX_BOX_CATS 100

/* A line chart of n series with vertical markers (may be NULL, 0).  Draws
 * "no data" in place of the plot when no series has a finite point. */
void svg_line_chart(sbuf *b, const svg_chart *c, const svg_series *s, int n, const svg_marker *m,
                    int n_markers);

/* One box per category and series: a bar from median to p90, a whisker
 * to max, a tick at the median.  Each array has n_cats values, NaN where a
 * series has no box in that category. */
typedef struct svg_box_series {
    const char *name;
    const double *median, *p90, *max; /* n_cats each */
} svg_box_series;

void svg_box_chart(sbuf *b, const svg_chart *c, const double *cat_x, int n_cats,
                   const svg_box_series *s, int n);

#endif
