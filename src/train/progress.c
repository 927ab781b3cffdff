/* The progress bar (see progress.h): a ladder of layouts, widest first; the
 * first that fits the terminal is drawn. */
#include "train/progress.h"

#include "downpour/log.h"

#include <math.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define LINE_MAX_COLS 512 /* wider terminals get a line this long */

enum {
    F_EPOCH = 1 << 0, /* "epoch 3/25" (else "3/25") */
    F_BAR = 1 << 1,   /* "[=====>    ]" */
    F_COUNT = 1 << 2, /* "219/422" */
    F_LOSS = 1 << 3,  /* "loss 0.0831" */
    F_ETA = 1 << 4,   /* "eta 0:07" */
};

static const int layouts[] = {
    F_EPOCH | F_BAR | F_COUNT | F_LOSS | F_ETA,
    F_EPOCH | F_BAR | F_LOSS | F_ETA,
    F_EPOCH | F_LOSS | F_ETA,
    F_EPOCH | F_ETA,
    F_EPOCH,
    0,
};

/* "0:07", "12:34", "1:02:03", ">99h"; "--:--" when unknown. */
static void format_eta(char *out, size_t cap, double s)
{
    if (!(s >= 0) || !isfinite(s)) {
        snprintf(out, cap, "--:--");
        return;
    }
    if (s >= 100 * 3600.0) {
        snprintf(out, cap, ">99h");
        return;
    }
    long t = lround(s);
    if (t >= 3600)
        snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

/* Appends " " (unless at the start) and s to line (of len chars). */
static size_t put(char *line, size_t len, const char *s)
{
    if (len > 0)
        line[len++] = ' ';
    size_t n = strlen(s);
    memcpy(line + len, s, n);
    return len + n;
}

size_t dp_progress_format(char *buf, size_t n, int width, int epoch, int epochs, long done,
                          long total, double loss, double elapsed_s)
{
    if (!buf || n == 0)
        return 0;
    buf[0] = '\0';
    if (width > LINE_MAX_COLS)
        width = LINE_MAX_COLS;
    if (width < 2)
        return 0;
    size_t cols = (size_t)width - 1; /* the last column would wrap */
    if (cols > n - 1)
        cols = n - 1;

    if (total < 0)
        total = 0;
    if (done < 0)
        done = 0;
    if (done > total)
        done = total;
    double frac = total > 0 ? (double)done / (double)total : 0;
    char ep[48], ep_short[40], pct[8], cnt[48], lo[40], eta_s[24], eta[32];
    snprintf(ep, sizeof ep, "epoch %d/%d", epoch, epochs);
    snprintf(ep_short, sizeof ep_short, "%d/%d", epoch, epochs);
    snprintf(pct, sizeof pct, "%3d%%", (int)(frac * 100));
    snprintf(cnt, sizeof cnt, "%ld/%ld", done, total);
    snprintf(lo, sizeof lo, isfinite(loss) && fabs(loss) < 1e6 ? "loss %.4f" : "loss %.3g", loss);
    format_eta(eta_s, sizeof eta_s,
               done > 0 ? elapsed_s * (double)(total - done) / (double)done : NAN);
    snprintf(eta, sizeof eta, "eta %s", eta_s);

    char line[4 * LINE_MAX_COLS];
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        int f = layouts[k];
        /* Width of everything but the bar: fields joined by single spaces. */
        const char *parts[] = {f & F_EPOCH ? ep : ep_short, pct, f & F_COUNT ? cnt : NULL,
                               f & F_LOSS ? lo : NULL, f & F_ETA ? eta : NULL};
        size_t fixed = 0;
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (parts[i])
                fixed += (fixed ? 1 : 0) + strlen(parts[i]);
        size_t inner = 0;
        if (f & F_BAR) {
            if (fixed + 3 + DP_PROGRESS_BAR_MIN > cols) /* " [" + "]" */
                continue;
            inner = cols - fixed - 3;
            if (inner > DP_PROGRESS_BAR_MAX)
                inner = DP_PROGRESS_BAR_MAX;
        } else if (fixed > cols && layouts[k] != 0) {
            continue;
        }
        size_t len = put(line, 0, parts[0]);
        if (f & F_BAR) {
            size_t fill = (size_t)(frac * (double)inner);
            line[len++] = ' ';
            line[len++] = '[';
            for (size_t i = 0; i < inner; i++)
                line[len++] = i < fill ? '=' : i == fill ? '>' : ' ';
            line[len++] = ']';
        }
        for (size_t i = 1; i < sizeof parts / sizeof parts[0]; i++)
            if (parts[i])
                len = put(line, len, parts[i]);
        if (len > cols) /* only the last layout: cut it */
            len = cols;
        memcpy(buf, line, len);
        buf[len] = '\0';
        return len;
    }
    return 0; /* not reached: the last layout always returns */
}

int dp_progress_width(FILE *f)
{
    struct winsize ws;
    if (f && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return DP_PROGRESS_WIDTH;
}

void dp_progress_draw(FILE *f, int epoch, int epochs, long done, long total, double loss,
                      double elapsed_s)
{
    char line[LINE_MAX_COLS + 1];
    dp_progress_format(line, sizeof line, dp_progress_width(f), epoch, epochs, done, total, loss,
                       elapsed_s);
    fprintf(f, "\r%s\033[K", line);
    fflush(f);
    if (f == stderr) /* the next log line erases it first */
        dp_log_set_progress(1);
}

void dp_progress_clear(FILE *f)
{
    fputs("\r\033[K", f);
    fflush(f);
    if (f == stderr)
        dp_log_set_progress(0);
}
