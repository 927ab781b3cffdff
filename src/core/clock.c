#include "downpour/clock.h"

#include <errno.h>
#include <math.h>
#include <time.h>

double dp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double dp_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dp_sleep_ms(double ms)
{
    if (!(ms > 0))
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}
