/* The progress bar: one line that fits any width (fields dropped in order as
 * the terminal narrows), a bar proportional to the progress, an ETA from the
 * epoch's pace, and the draw's '\r' ... erase-to-end framing. */
#include "train/progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "downpour/log.h"

#include "check.h"

static char line[1024];

static size_t fmt(int width, long done, long total, double loss, double elapsed)
{
    return dp_progress_format(line, sizeof line, width, 3, 25, done, total, loss, elapsed);
}

static void test_full_line(void)
{
    size_t n = fmt(100, 211, 422, 0.08314, 10.0);
    CHECKF(strcmp(line, "epoch 3/25 [====================>                   ]  50% 211/422 "
                        "loss 0.0831 eta 0:10") == 0,
           "'%s'", line);
    CHECK(n == strlen(line));
    /* Wider terminals: the bar stops at DP_PROGRESS_BAR_MAX cells. */
    fmt(300, 211, 422, 0.08314, 10.0);
    const char *l = strchr(line, '['), *r = strchr(line, ']');
    CHECK(l && r && r - l - 1 == DP_PROGRESS_BAR_MAX);
}

/* Whatever the width, the line fits in width - 1 columns, on one line. */
static void test_never_wraps(void)
{
    for (int w = 0; w <= 260; w++) {
        size_t n = fmt(w, 1234567, 9999999, 123.456, 98765.0);
        CHECKF(n == strlen(line), "width %d", w);
        CHECKF(w == 0 ? n == 0 : n <= (size_t)w - 1, "width %d: %zu chars: '%s'", w, n, line);
        CHECKF(!strpbrk(line, "\r\n"), "width %d: '%s'", w, line);
        if (w >= 12)
            CHECKF(strstr(line, "3/25") != NULL, "width %d: '%s'", w, line);
    }
    /* A tiny buffer is never overrun. */
    char small[8];
    size_t n = dp_progress_format(small, sizeof small, 80, 3, 25, 1, 2, 0.5, 1.0);
    CHECK(n == 7 && strlen(small) == 7);
}

/* As the width shrinks the bar narrows (it may widen again where the counts
 * have just gone), then counts, bar, loss, eta go. */
static void test_drop_order(void)
{
    int seen_count = 0, seen_bar = 0, seen_loss = 0, seen_eta = 0;
    for (int w = 120; w >= 2; w--) {
        fmt(w, 100, 400, 0.25, 30.0);
        int count = strstr(line, "100/400") != NULL;
        const char *l = strchr(line, '['), *r = strchr(line, ']');
        int bar = l && r ? (int)(r - l - 1) : 0;
        int loss = strstr(line, "loss 0.2500") != NULL;
        int eta = strstr(line, "eta 1:30") != NULL;
        CHECKF(bar == 0 || bar >= DP_PROGRESS_BAR_MIN, "width %d: bar of %d", w, bar);
        /* Once a field is gone it stays gone, and the drop order holds. */
        CHECKF(!count || (bar && loss && eta), "width %d: '%s'", w, line);
        CHECKF(!bar || (loss && eta), "width %d: '%s'", w, line);
        CHECKF(!loss || eta, "width %d: '%s'", w, line);
        CHECKF(!(seen_count && count && w < seen_count - 1), "width %d", w);
        if (count)
            seen_count = w;
        if (bar)
            seen_bar = w;
        if (loss)
            seen_loss = w;
        if (eta)
            seen_eta = w;
    }
    /* Each field survives to some width, in the order they are dropped. */
    CHECKF(seen_count > seen_bar && seen_bar > seen_loss && seen_loss > seen_eta && seen_eta > 0,
           "count %d bar %d loss %d eta %d", seen_count, seen_bar, seen_loss, seen_eta);
    fmt(80, 100, 400, 0.25, 30.0); /* the common terminal shows everything */
    CHECKF(strstr(line, "epoch 3/25 [") && strstr(line, "100/400") && strstr(line, "loss 0.2500") &&
               strstr(line, "eta 1:30"),
           "'%s'", line);
    fmt(20, 100, 400, 0.25, 30.0);
    CHECKF(strcmp(line, "epoch 3/25  25%") == 0, "'%s'", line);
    fmt(9, 100, 400, 0.25, 30.0);
    CHECKF(strcmp(line, "3/25  25") == 0, "'%s'", line);
}

static void test_bar_and_eta(void)
{
    fmt(100, 0, 422, NAN, 0.0);
    CHECKF(strstr(line, "[>  ") && strstr(line, "  0% 0/422") && strstr(line, "loss nan") &&
               strstr(line, "eta --:--"),
           "'%s'", line);
    fmt(100, 422, 422, 0.01, 42.0);
    const char *l = strchr(line, '['), *r = strchr(line, ']');
    REQUIRE(l && r);
    CHECKF(strspn(l + 1, "=") == (size_t)(r - l - 1), "'%s'", line);
    CHECKF(strstr(line, "100% 422/422") && strstr(line, "eta 0:00"), "'%s'", line);
    fmt(100, 1, 4, 0.01, 1200.0); /* 3600 s left */
    CHECKF(strstr(line, "eta 1:00:00"), "'%s'", line);
    fmt(100, 1, 3, 0.01, 125.0); /* 250 s left */
    CHECKF(strstr(line, "eta 4:10"), "'%s'", line);
    fmt(100, 1, 1000000, 0.01, 10.0);
    CHECKF(strstr(line, "eta >99h"), "'%s'", line);
    fmt(100, 500, 0, 0.01, 10.0); /* no total: 0%, no crash */
    CHECKF(strstr(line, "  0%"), "'%s'", line);
    fmt(100, 7, 5, 1e9, 10.0); /* done past total is clamped; a huge loss stays short */
    CHECKF(strstr(line, "100% 5/5") && strstr(line, "loss 1e+09"), "'%s'", line);
}

/* The draw: "\r" + the line for the width + erase to the end of the line. */
static void test_draw(void)
{
    FILE *f = tmpfile(); /* not a terminal: the fallback width */
    REQUIRE(f != NULL);
    CHECK(dp_progress_width(f) == DP_PROGRESS_WIDTH);
    dp_progress_draw(f, 3, 25, 100, 400, 0.25, 30.0);
    dp_progress_draw(f, 3, 25, 101, 400, 0.25, 30.0);
    rewind(f);
    char got[512] = {0};
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    char want[600], one[256], two[256];
    dp_progress_format(one, sizeof one, DP_PROGRESS_WIDTH, 3, 25, 100, 400, 0.25, 30.0);
    dp_progress_format(two, sizeof two, DP_PROGRESS_WIDTH, 3, 25, 101, 400, 0.25, 30.0);
    snprintf(want, sizeof want, "\r%s\033[K\r%s\033[K", one, two);
    CHECKF(n == strlen(want) && memcmp(got, want, n) == 0, "got '%s'", got);
}

/* A log line while the bar is drawn on stderr erases the bar first, so no
 * stale bar is left above the line (issue 29); a line after the epoch's
 * clear writes no erase of its own. */
static void test_log_erases_bar(void)
{
    FILE *f = tmpfile();
    REQUIRE(f != NULL);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    REQUIRE(saved >= 0 && dup2(fileno(f), STDERR_FILENO) >= 0);
    dp_progress_draw(stderr, 3, 25, 100, 400, 0.25, 30.0);
    dp_info("step line");
    dp_progress_draw(stderr, 3, 25, 101, 400, 0.25, 30.0);
    dp_progress_clear(stderr);
    dp_info("epoch line");
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(f);
    char got[1024] = {0};
    CHECK(fread(got, 1, sizeof got - 1, f) > 0);
    fclose(f);
    char one[256], two[256], want[700];
    dp_progress_format(one, sizeof one, DP_PROGRESS_WIDTH, 3, 25, 100, 400, 0.25, 30.0);
    dp_progress_format(two, sizeof two, DP_PROGRESS_WIDTH, 3, 25, 101, 400, 0.25, 30.0);
    snprintf(want, sizeof want, "\r%s\033[K\r\033[Kstep line\n\r%s\033[K\r\033[Kepoch line\n",
             one, two);
    CHECKF(strcmp(got, want) == 0, "got '%s'", got);
}

int main(void)
{
    test_full_line();
    test_never_wraps();
    test_drop_order();
    test_bar_and_eta();
    test_draw();
    test_log_erases_bar();
    return CHECK_DONE();
}
