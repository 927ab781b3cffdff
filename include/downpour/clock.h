/* Monotonic time in seconds, for timings and timeouts. */
#ifndef DOWNPOUR_CLOCK_H
#define DOWNPOUR_CLOCK_H

double dp_now(void);
/* Unix time in seconds (the realtime clock): for aligning processes' events
 * on one axis, never for measuring intervals. */
double dp_wall_now(void);
/* Sleeps ms milliseconds in all (a signal does not cut it short); none when
 * ms <= 0.  For paced tests and stragglers, never on a step's own path. */
void dp_sleep_ms(double ms);

#endif
