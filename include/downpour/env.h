/* Settings read from the environment, parsed with checks: every value is
 * refused, with a message naming its variable and what it accepts, unless it
 * parses whole.  Library code reads a setting through these instead of
 * getenv and atoi/strtol (docs/architecture.md, "The environment"); a text
 * already read goes through status.h's dp_parse_long and dp_parse_double. */
#ifndef DOWNPOUR_ENV_H
#define DOWNPOUR_ENV_H

#include "downpour/status.h"

/* NAME as 0 or 1 into *out; unset or empty: DEF.  -1 otherwise. */
int dp_env_flag(const char *name, int def, int *out, dp_err *err);
/* NAME as a decimal integer in [MIN, MAX] into *out (dp_parse_long, the
 * message naming NAME); unset or empty: DEF. */
int dp_env_long(const char *name, long min, long max, long def, long *out, dp_err *err);

/* Settings whose way in is an option, with a variable kept as a documented
 * fallback (docs/architecture.md, "The environment"): read here, once, on
 * the first query, and by nothing else, so the code that opens a transport
 * or a strategy tests a cached value.  Each is 0 or 1, on when unset. */
typedef enum dp_env_fallback {
    DP_ENV_SHM,  /* DOWNPOUR_SHM=0: as train --no-shm (dp_tcp_config_init's shm) */
    DP_ENV_NCCL, /* DOWNPOUR_NCCL=0: as train --no-nccl (allreduce on devices) */
    DP_ENV_FALLBACK_COUNT
} dp_env_fallback;

/* Its variable, e.g. "DOWNPOUR_SHM". */
const char *dp_env_fallback_name(dp_env_fallback f);
/* 0 when its variable is "0", else 1 (unset, empty, "1"; a malformed value
 * reads as unset, and dp_env_fallbacks_check refuses it). */
int dp_env_fallback_on(dp_env_fallback f);
/* 0 when every fallback set is 0 or 1, else -1 naming it (the program
 * checks before it runs a command, as it does the test hooks). */
int dp_env_fallbacks_check(dp_err *err);

#endif
