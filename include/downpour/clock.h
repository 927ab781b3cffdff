/* Monotonic time in seconds, for timings and timeouts. */
#ifndef DOWNPOUR_CLOCK_H
#define DOWNPOUR_CLOCK_H

double dp_now(void);
/* Unix time in seconds (the realtime clock): for aligning processes' events
 * on one axis, never for measuring intervals. */
double dp_wall_now(void);

#endif
