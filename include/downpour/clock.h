/* Monotonic time in seconds, for timings and timeouts. */
#ifndef DOWNPOUR_CLOCK_H
#define DOWNPOUR_CLOCK_H

double dp_now(void);

#endif
