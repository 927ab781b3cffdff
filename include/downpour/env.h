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

#endif
