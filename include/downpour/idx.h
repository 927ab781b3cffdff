/* IDX files (the MNIST family's format), raw or gzip-compressed.
 * Every field is checked before it is trusted: magic (0x00 0x00 0x08 ndim,
 * unsigned bytes only), rank 1..4, each dimension, and the decoded length
 * against the header.  Errors name the file. */
#ifndef DOWNPOUR_IDX_H
#define DOWNPOUR_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

typedef struct dp_idx {
    int ndim;
    uint32_t dims[4];
    uint8_t *data;   /* dims[0]*...*dims[ndim-1] bytes, malloc'd */
    size_t len;
} dp_idx;

/* Reads path; a file starting with the gzip magic (1f 8b), whatever its name, is
 * inflated with zlib.  Refuses files larger than the header implies, too. */
int dp_idx_read(const char *path, dp_idx *out, dp_err *err);
void dp_idx_free(dp_idx *idx);

#endif
