/* The cluster secret every task's transport proves it holds (HMAC-SHA256
 * challenge, see docs/transport.md).  The launcher makes a fresh one per run
 * and hands it to its tasks in DOWNPOUR_SECRET; a multi-host cluster puts the
 * same secret in a file (mode 0600) on every host. */
#ifndef DOWNPOUR_SECRET_H
#define DOWNPOUR_SECRET_H

#include "downpour/status.h"

#include <stddef.h>

#define DP_SECRET_MIN 16  /* bytes */
#define DP_SECRET_MAX 256 /* bytes */
#define DP_SECRET_GEN 32  /* bytes made by dp_secret_generate */

typedef struct dp_secret {
    unsigned char bytes[DP_SECRET_MAX];
    size_t len;
} dp_secret;

/* From the file at path when path is not NULL, else from the environment
 * variable DOWNPOUR_SECRET.  Text that is all hex digits (even count) is
 * decoded; anything else is taken as raw bytes.  One trailing newline is
 * stripped.  Fewer than DP_SECRET_MIN bytes is refused; a file readable by
 * group or others draws a warning. */
int dp_secret_load(dp_secret *out, const char *path, dp_err *err);

/* DP_SECRET_GEN random bytes, and their hex form (hex may be NULL; needs
 * 2 * DP_SECRET_GEN + 1 bytes) to put in DOWNPOUR_SECRET for child tasks. */
int dp_secret_generate(dp_secret *out, char *hex, size_t hex_cap, dp_err *err);

/* Overwrites the secret with zeros. */
void dp_secret_wipe(dp_secret *s);

#endif
