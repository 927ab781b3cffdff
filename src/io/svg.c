/* Inline SVG charts for reports (svg.h): axes with ticks at 1, 2 or 5 times
 * a power of ten, axis titles with units, a legend beside the plot, lines,
 * box glyphs, and vertical markers for faults and stragglers.  Everything is
 * written into an sbuf; no text reaches the page unescaped. */
#include "io/svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the buffer ---- */

void sb_free(sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static bool sb_reserve(sbuf *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void sb_putn(sbuf *b, const char *s, size_t n)
{
    if (!sb_reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_puts(sbuf *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

void sb_printf(sbuf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        sb_putn(b, small, (size_t)n);
        return;
    }
    if (!sb_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sb_esc(sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': sb_puts(b, "&amp;"); break;
        case '<': sb_puts(b, "&lt;"); break;
        case '>': sb_puts(b, "&gt;"); break;
        case '"': sb_puts(b, "&quot;"); break;
        case '\'': sb_puts(b, "&#39;"); break;
        default:
            if (c < 0x20 && c != '\n' && c != '\t')
                c = '?';
            sb_putn(b, (const char *)&c, 1);
        }
    }
}

void sb_num(sbuf *b, double v)
{
    if (!isfinite(v)) {
        sb_puts(b, "null");
        return;
    }
    char s[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v)
            break;
    }
    sb_puts(b, s);
}

/* ---- layout ---- */

/* Okabe-Ito and Tol colours that read on white and apart from the red of
 * faults and the purple of stragglers. */
static const char *const palette[] = {"#0072B2", "#E69F00", "#009E73", "#56B4E9", "#D55E00",
                                      "#CC79A7", "#000000", "#999933", "#44AA99", "#332288"};
#define N_PALETTE (int)(sizeof palette / sizeof palette[0])

const char *svg_colour(int i)
{
    return palette[(i % N_PALETTE + N_PALETTE) % N_PALETTE];
}

static const char *const mark_colour[SVG_MARK_KIND_COUNT] = {"#d00000", "#7f3fbf"};
static const char *const mark_class[SVG_MARK_KIND_COUNT] = {"fault", "straggler"};
static const char *const mark_dash[SVG_MARK_KIND_COUNT] = {"", " stroke-dasharray=\"6 3\""};

#define W 880
#define PL 78.0   /* plot left */
#define PR 640.0  /* plot right */
#define PT 44.0   /* plot top */
#define PH 224.0  /* plot height */
#define LEGEND_X 660
#define LEGEND_ROW 18
#define LEGEND_MAX 20 /* entries shown; the rest are counted */

typedef struct axis {
    double lo, hi, step;
} axis;

/* Ticks at 1, 2 or 5 times a power of ten, about `target` of them, and the
 * range widened to whole ticks. */
static axis nice_axis(double lo, double hi, int target, bool integer)
{
    axis a;
    if (!isfinite(lo) || !isfinite(hi)) {
        lo = 0;
        hi = 1;
    }
    if (hi - lo < 1e-12 * fmax(1.0, fabs(hi))) {
        double pad = fabs(hi) > 0 ? fabs(hi) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    double raw = (hi - lo) / target;
    if (!isfinite(raw) || raw <= 0) { /* values near DBL_MAX: no sensible ticks */
        lo = 0;
        hi = 1;
        raw = 1.0 / target;
    }
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    a.step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    if (integer && a.step < 1)
        a.step = 1;
    a.lo = floor(lo / a.step + 1e-9) * a.step;
    a.hi = ceil(hi / a.step - 1e-9) * a.step;
    if (a.hi <= a.lo)
        a.hi = a.lo + a.step;
    return a;
}

/* A tick label: k and M for big numbers, as many decimals as the step needs. */
static void fmt_tick(char *s, size_t n, double v, const axis *a)
{
    double big = fmax(fabs(a->lo), fabs(a->hi)), div = 1, step = a->step;
    const char *suffix = "";
    if (big >= 1e6) {
        div = 1e6;
        suffix = "M";
    } else if (big >= 1e4) {
        div = 1e3;
        suffix = "k";
    }
    step /= div;
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (dec > 6)
        dec = 6;
    double x = v / div;
    if (fabs(x) < step * 1e-6)
        x = 0; /* no "-0" */
    snprintf(s, n, "%.*f%s", dec, x, suffix);
}

static double px(const axis *a, double x) { return PL + (x - a->lo) / (a->hi - a->lo) * (PR - PL); }
static double py(const axis *a, double y) { return PT + PH - (y - a->lo) / (a->hi - a->lo) * PH; }

static int legend_rows(int n) { return n > LEGEND_MAX ? LEGEND_MAX + 1 : n; }

static double chart_height(int n_legend)
{
    double h = PT + PH + 56;
    double need = PT + legend_rows(n_legend) * LEGEND_ROW + 40;
    return need > h ? need : h;
}

/* xa: the x axis drawn, written as data-x-lo / data-x-hi so a program can
 * check that charts share one (NULL for box charts). */
static void open_svg(sbuf *b, const svg_chart *c, double h, const char *kind, const axis *xa)
{
    sb_printf(b, "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
                 "height=\"%.0f\" viewBox=\"0 0 %d %.0f\" role=\"img\" class=\"%s\"",
              W, h, W, h, kind);
    if (c->id) {
        sb_puts(b, " data-chart=\"");
        sb_esc(b, c->id);
        sb_puts(b, "\"");
    }
    if (xa) {
        sb_puts(b, " data-x-lo=\"");
        sb_num(b, xa->lo);
        sb_puts(b, "\" data-x-hi=\"");
        sb_num(b, xa->hi);
        sb_puts(b, "\"");
    }
    sb_puts(b, "><title>");
    sb_esc(b, c->title ? c->title : "chart");
    sb_printf(b, "</title><text x=\"%.0f\" y=\"22\" class=\"ct\">", PL);
    sb_esc(b, c->title ? c->title : "");
    sb_puts(b, "</text>");
}

static void axis_titles(sbuf *b, const svg_chart *c)
{
    sb_printf(b, "<text x=\"%.0f\" y=\"%.0f\" class=\"at\" text-anchor=\"middle\">",
              (PL + PR) / 2, PT + PH + 44);
    sb_esc(b, c->x_label ? c->x_label : "");
    sb_printf(b, "</text><text transform=\"translate(18 %.0f) rotate(-90)\" class=\"at\" "
                 "text-anchor=\"middle\">",
              PT + PH / 2);
    sb_esc(b, c->y_label ? c->y_label : "");
    sb_puts(b, "</text>");
}

static void y_axis(sbuf *b, const axis *ya)
{
    char s[48];
    for (int i = 0;; i++) {
        double v = ya->lo + i * ya->step;
        if (v > ya->hi + ya->step * 1e-6 || i > 100)
            break;
        double y = py(ya, v);
        fmt_tick(s, sizeof s, v, ya);
        sb_printf(b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                     "<text x=\"%.0f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>",
                  PL, PR, y, y, PL - 6, y + 4, s);
    }
    sb_printf(b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" class=\"ax\"/>", PL, PL,
              PT, PT + PH);
    sb_printf(b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" class=\"ax\"/>", PL, PR,
              PT + PH, PT + PH);
}

static void legend_entry(sbuf *b, int row, const char *colour, const char *name, const char *dash)
{
    double y = PT + row * LEGEND_ROW;
    sb_printf(b, "<g class=\"legend\"><line x1=\"%d\" x2=\"%d\" y1=\"%.0f\" y2=\"%.0f\" "
                 "stroke=\"%s\" stroke-width=\"3\"%s/><text x=\"%d\" y=\"%.0f\" class=\"lg\"><title>",
              LEGEND_X, LEGEND_X + 22, y, y, colour, dash, LEGEND_X + 28, y + 4);
    sb_esc(b, name);
    sb_puts(b, "</title>");
    /* Long names are cut in the legend; the tooltip has them whole. */
    char cut[40];
    snprintf(cut, sizeof cut, "%s", name ? name : "");
    if (name && strlen(name) >= sizeof cut)
        memcpy(cut + sizeof cut - 4, "...", 4);
    sb_esc(b, cut);
    sb_puts(b, "</text></g>");
}

static void legend_more(sbuf *b, int n)
{
    if (n > LEGEND_MAX)
        sb_printf(b, "<text x=\"%d\" y=\"%.0f\" class=\"lg\">and %d more</text>", LEGEND_X,
                  PT + LEGEND_MAX * LEGEND_ROW + 4, n - LEGEND_MAX);
}

static void no_data(sbuf *b)
{
    sb_printf(b, "<text x=\"%.0f\" y=\"%.0f\" class=\"nodata\" text-anchor=\"middle\">no data"
                 "</text>",
              (PL + PR) / 2, PT + PH / 2);
}

/* ---- line charts ---- */

/* Whether no series has more than one finite point: a line chart of such
 * series is a lone dot per series, which a table shows better. */
static bool one_point_series(const svg_series *s, int n)
{
    for (int i = 0; i < n; i++) {
        int pts = 0;
        for (int k = 0; k < s[i].n; k++)
            pts += isfinite(s[i].x[k]) && isfinite(s[i].y[k]);
        if (pts > 1)
            return false;
    }
    return true;
}

/* The table that stands in for a chart of one point per series; it keeps
 * the chart's id and each value's exact data-x / data-y for programs. */
static void one_point_table(sbuf *b, const svg_chart *c, const svg_series *s, int n)
{
    sb_puts(b, "<table class=\"onepoint\"");
    if (c->id) {
        sb_puts(b, " data-chart=\"");
        sb_esc(b, c->id);
        sb_puts(b, "\"");
    }
    sb_puts(b, "><caption>");
    sb_esc(b, c->title ? c->title : "");
    sb_puts(b, " (one point each: a table, not a chart)</caption><tr><th></th><th>");
    sb_esc(b, c->x_label ? c->x_label : "x");
    sb_puts(b, "</th><th>");
    sb_esc(b, c->y_label ? c->y_label : "y");
    sb_puts(b, "</th></tr>\n");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < s[i].n; k++) {
            if (!isfinite(s[i].x[k]) || !isfinite(s[i].y[k]))
                continue;
            sb_puts(b, "<tr class=\"series\" data-series=\"");
            sb_esc(b, s[i].name);
            sb_puts(b, "\"><td>");
            sb_esc(b, s[i].name);
            sb_puts(b, "</td><td class=\"n\" data-x=\"");
            sb_num(b, s[i].x[k]);
            sb_printf(b, "\">%.6g</td><td class=\"n\" data-y=\"", s[i].x[k]);
            sb_num(b, s[i].y[k]);
            sb_printf(b, "\">%.6g</td></tr>\n", s[i].y[k]);
        }
    sb_puts(b, "</table>\n");
}

void svg_line_chart(sbuf *b, const svg_chart *c, const svg_series *s, int n, const svg_marker *m,
                    int n_markers)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < s[i].n; k++)
            if (isfinite(s[i].x[k]) && isfinite(s[i].y[k])) {
                x0 = fmin(x0, s[i].x[k]);
                x1 = fmax(x1, s[i].x[k]);
                y0 = fmin(y0, s[i].y[k]);
                y1 = fmax(y1, s[i].y[k]);
            }
    bool any = isfinite(x0);
    for (int i = 0; any && i < n_markers; i++)
        if (isfinite(m[i].x)) {
            x0 = fmin(x0, m[i].x);
            x1 = fmax(x1, m[i].x);
        }
    if (any && c->y_from_zero)
        y0 = fmin(0, y0);
    if (any && one_point_series(s, n)) {
        one_point_table(b, c, s, n);
        return;
    }
    /* Charts of one run's time share the caller's range, so a series that
     * starts late (the network rate has no first point) is not stretched. */
    if (any && c->x_fixed && isfinite(c->x_lo) && isfinite(c->x_hi) && c->x_hi > c->x_lo) {
        x0 = fmin(x0, c->x_lo);
        x1 = fmax(x1, c->x_hi);
    }
    int n_legend = n + (n_markers > 0 ? 2 : 0);
    double h = chart_height(n_legend);
    axis xa = nice_axis(any ? x0 : 0, any ? x1 : 1, 8, c->x_integer);
    open_svg(b, c, h, "line", &xa);
    axis_titles(b, c);
    axis ya = nice_axis(any ? y0 : 0, any ? y1 : 1, 5, false);
    if (any && c->y_from_zero && y0 >= 0)
        ya.lo = 0;
    y_axis(b, &ya);
    char t[48];
    for (int i = 0;; i++) {
        double v = xa.lo + i * xa.step;
        if (v > xa.hi + xa.step * 1e-6 || i > 100)
            break;
        fmt_tick(t, sizeof t, v, &xa);
        sb_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" class=\"ax\"/>"
                     "<text x=\"%.1f\" y=\"%.0f\" class=\"tick\" text-anchor=\"middle\">%s</text>",
                  px(&xa, v), px(&xa, v), PT + PH, PT + PH + 5, px(&xa, v), PT + PH + 19, t);
    }
    if (!any)
        no_data(b);
    for (int i = 0; any && i < n_markers; i++) {
        if (!isfinite(m[i].x))
            continue;
        double x = px(&xa, m[i].x);
        /* A wide transparent line under the visible one makes the tooltip easy to hit. */
        sb_printf(b, "<g class=\"marker %s\" data-x=\"", mark_class[m[i].kind]);
        sb_num(b, m[i].x);
        sb_printf(b, "\"><title>");
        sb_esc(b, m[i].text);
        sb_printf(b, "</title><line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" "
                     "stroke=\"transparent\" stroke-width=\"8\"/><line x1=\"%.1f\" x2=\"%.1f\" "
                     "y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"1.5\"%s/></g>",
                  x, x, PT, PT + PH, x, x, PT, PT + PH, mark_colour[m[i].kind],
                  mark_dash[m[i].kind]);
    }
    for (int i = 0; any && i < n; i++) {
        const char *col = svg_colour(i);
        sb_puts(b, "<g class=\"series\" data-series=\"");
        sb_esc(b, s[i].name);
        sb_printf(b, "\"><path fill=\"none\" stroke=\"%s\" stroke-width=\"2\" d=\"", col);
        bool pen = false;
        /* Long series are drawn through every step-th point (a page stays small). */
        int step = s[i].n > SVG_MAX_LINE_POINTS ? (s[i].n + SVG_MAX_LINE_POINTS - 1) / SVG_MAX_LINE_POINTS : 1;
        for (int k = 0; k < s[i].n; k += step) {
            if (!isfinite(s[i].x[k]) || !isfinite(s[i].y[k])) {
                pen = false;
                continue;
            }
            sb_printf(b, "%c%.1f %.1f", pen ? 'L' : 'M', px(&xa, s[i].x[k]), py(&ya, s[i].y[k]));
            pen = true;
        }
        sb_puts(b, "\"/>");
        for (int k = 0; s[i].n <= SVG_MAX_MARKED_POINTS && k < s[i].n; k++) {
            if (!isfinite(s[i].x[k]) || !isfinite(s[i].y[k]))
                continue;
            sb_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" data-x=\"",
                      px(&xa, s[i].x[k]), py(&ya, s[i].y[k]), col);
            sb_num(b, s[i].x[k]);
            sb_puts(b, "\" data-y=\"");
            sb_num(b, s[i].y[k]);
            sb_puts(b, "\"><title>");
            sb_esc(b, s[i].name);
            sb_printf(b, ": %s %.6g, %s %.6g</title></circle>", c->x_label ? c->x_label : "x",
                      s[i].x[k], c->y_label ? c->y_label : "y", s[i].y[k]);
        }
        sb_puts(b, "</g>");
    }
    for (int i = 0; i < n && i < LEGEND_MAX; i++)
        legend_entry(b, i, svg_colour(i), s[i].name, "");
    legend_more(b, n);
    if (n_markers > 0) {
        int row = legend_rows(n);
        legend_entry(b, row, mark_colour[SVG_MARK_FAULT], "fault", "");
        legend_entry(b, row + 1, mark_colour[SVG_MARK_STRAGGLER], "straggler",
                     mark_dash[SVG_MARK_STRAGGLER]);
    }
    sb_puts(b, "</svg></figure>\n");
}

/* ---- box charts ---- */

void svg_box_chart(sbuf *b, const svg_chart *c, const double *cat_x, int n_cats,
                   const svg_box_series *s, int n)
{
    double y1 = -INFINITY;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_cats; k++) {
            if (isfinite(s[i].max[k]))
                y1 = fmax(y1, s[i].max[k]);
            if (isfinite(s[i].p90[k]))
                y1 = fmax(y1, s[i].p90[k]);
        }
    bool any = isfinite(y1) && n_cats > 0;
    double h = chart_height(n + 1);
    open_svg(b, c, h, "box", NULL);
    axis_titles(b, c);
    axis ya = nice_axis(0, any ? y1 : 1, 5, false);
    ya.lo = 0;
    y_axis(b, &ya);
    if (!any)
        no_data(b);
    /* At most SVG_MAX_BOX_CATS categories: every every-th one beyond. */
    int every_cat = n_cats > SVG_MAX_BOX_CATS ? (n_cats + SVG_MAX_BOX_CATS - 1) / SVG_MAX_BOX_CATS : 1;
    if (every_cat > 1) {
        sb_printf(b, "<text x=\"%.0f\" y=\"%.0f\" class=\"lg\">(every %d%s epoch shown)</text>",
                  PR - 150, PT - 8, every_cat, every_cat == 2 ? "nd" : every_cat == 3 ? "rd" : "th");
        n_cats = (n_cats + every_cat - 1) / every_cat;
    }
    /* Categories are bands of equal width; the series sit side by side. */
    double band = (PR - PL) / (n_cats > 0 ? n_cats : 1);
    double slot = band * 0.8 / (n > 0 ? n : 1);
    double bw = fmin(slot * 0.7, 28);
    /* Too many epochs for a label each: about 12 labels. */
    int every = n_cats > 12 ? (n_cats + 11) / 12 : 1;
    for (int k = 0; any && k < n_cats; k++) {
        double cx = PL + band * (k + 0.5);
        int kk = k * every_cat;
        if (k % every == 0)
            sb_printf(b, "<text x=\"%.1f\" y=\"%.0f\" class=\"tick\" text-anchor=\"middle\">%.6g"
                         "</text>",
                      cx, PT + PH + 19, cat_x[kk]);
        for (int i = 0; i < n; i++) {
            double md = s[i].median[kk], p9 = s[i].p90[kk], mx = s[i].max[kk];
            if (!isfinite(md))
                continue;
            double x = PL + band * k + band * 0.1 + slot * (i + 0.5);
            const char *col = svg_colour(i);
            double top = isfinite(p9) ? p9 : md;
            sb_puts(b, "<g class=\"boxg\" data-series=\"");
            sb_esc(b, s[i].name);
            sb_puts(b, "\" data-x=\"");
            sb_num(b, cat_x[kk]);
            sb_puts(b, "\" data-median=\"");
            sb_num(b, md);
            sb_puts(b, "\" data-p90=\"");
            sb_num(b, p9);
            sb_puts(b, "\" data-max=\"");
            sb_num(b, mx);
            sb_puts(b, "\"><title>");
            sb_esc(b, s[i].name);
            sb_printf(b, ", %s %.6g: median %.4g, p90 %.4g, max %.4g</title>",
                      c->x_label ? c->x_label : "x", cat_x[kk], md, p9, mx);
            if (isfinite(mx))
                sb_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                             "stroke-width=\"1.5\"/><line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" "
                             "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"/>",
                          x, x, py(&ya, top), py(&ya, mx), col, x - bw / 4, x + bw / 4,
                          py(&ya, mx), py(&ya, mx), col);
            sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                         "fill-opacity=\"0.45\" stroke=\"%s\"/><line x1=\"%.1f\" x2=\"%.1f\" "
                         "y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/></g>",
                      x - bw / 2, py(&ya, top), bw, fmax(py(&ya, md) - py(&ya, top), 0.5), col,
                      col, x - bw / 2, x + bw / 2, py(&ya, md), py(&ya, md), col);
        }
    }
    for (int i = 0; i < n && i < LEGEND_MAX; i++)
        legend_entry(b, i, svg_colour(i), s[i].name, "");
    legend_more(b, n);
    sb_printf(b, "<text x=\"%.0f\" y=\"%.0f\" class=\"lg\">thick tick: median; box: to p90; "
                 "whisker: to max</text>",
              PL, PT - 8);
    sb_puts(b, "</svg></figure>\n");
}
