/* The progress bar on a terminal: one line, redrawn in place with '\r', that
 * never wraps however narrow the terminal:
 *
 *   epoch 3/25 [==========>         ]  52% 219/422 loss 0.0831 eta 0:07
 *
 * As the width shrinks the bar narrows (to 10 cells), then the fields go in
 * this order: the step counts, the bar, the loss, the ETA, the word "epoch";
 * what is left is cut at the width.  The text takes at most width - 1
 * columns, since many terminals wrap on writing the last one.
 *
 * The ETA is this epoch's remaining time at this epoch's pace so far:
 * elapsed_s * (total - done) / done ("eta --:--" before the first step). */
#ifndef DOWNPOUR_TRAIN_PROGRESS_H
#define DOWNPOUR_TRAIN_PROGRESS_H

#include <stddef.h>
#include <stdio.h>

#define DP_PROGRESS_WIDTH 80  /* when the terminal's width cannot be read */
#define DP_PROGRESS_BAR_MAX 40
#define DP_PROGRESS_BAR_MIN 10

/* Renders the line (no '\r', no newline) for a terminal `width` columns wide
 * into buf (n bytes).  Returns its length (< width, and < n). done counts
 * steps (or records) of this epoch out of total; elapsed_s is the seconds
 * since the epoch began; loss the running mean loss (NaN shows as "nan"). */
size_t dp_progress_format(char *buf, size_t n, int width, int epoch, int epochs, long done,
                          long total, double loss, double elapsed_s);

/* Draws the line on f, a terminal: '\r', the line for the width of f's
 * terminal (TIOCGWINSZ, else DP_PROGRESS_WIDTH), then an erase to the end
 * of the line so a longer earlier line leaves nothing behind; flushes.  On
 * stderr, the next log line (dp_log) erases the bar before it is written, so
 * no stale bar stays above it; dp_progress_clear erases it at the epoch's end. */
void dp_progress_draw(FILE *f, int epoch, int epochs, long done, long total, double loss,
                      double elapsed_s);
void dp_progress_clear(FILE *f);

/* Width of the terminal behind f, or DP_PROGRESS_WIDTH. */
int dp_progress_width(FILE *f);

#endif
