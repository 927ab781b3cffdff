/* safetensors files (the Hugging Face format PyTorch users load directly):
 *   8 bytes little-endian header length N, N bytes of JSON header, then data.
 * The header maps tensor names to {"dtype","shape","data_offsets":[begin,end]}
 * and may hold "__metadata__": {string: string}.  Only F32 tensors are written;
 * the reader checks every size and offset before trusting it: offsets inside
 * the data, byte length equal to the shape's, no overlaps, no gaps, header
 * length bounded (100 MB) and within the file. */
#ifndef DOWNPOUR_SAFETENSORS_H
#define DOWNPOUR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

#define DP_ST_MAX_DIMS 8

typedef struct dp_st_tensor {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[DP_ST_MAX_DIMS];
} dp_st_tensor;

typedef struct dp_st_meta {
    const char *key;
    const char *value;
} dp_st_meta;

/* Writes tensors and metadata to path atomically: a temporary file in the
 * same directory, fsync, rename, fsync of the directory.  A crash leaves
 * either the old file or the new one, never a torn one. */
int dp_safetensors_save(const char *path, const dp_st_tensor *tensors, int n_tensors,
                        const dp_st_meta *meta, int n_meta, dp_err *err);

/* The same, some tensors' data made as they are written (data NULL: never
 * whole in memory): fill gives tensor i's next n floats, in order; seen is
 * told every piece written, in file order (an empty tensor once, with 0
 * bytes: a checksum over names and data); after the data,
 * done may change metadata values in place, keeping their lengths, and the
 * header is written again (a checksum over the data, in the header). */
typedef struct dp_st_source {
    int (*fill)(void *ctx, int tensor, float *buf, size_t n, dp_err *err);
    void (*seen)(void *ctx, int tensor, const void *data, size_t bytes);
    int (*done)(void *ctx, dp_err *err);
    void *ctx;
} dp_st_source;
int dp_safetensors_save_source(const char *path, const dp_st_tensor *tensors, int n_tensors,
                               const dp_st_meta *meta, int n_meta, const dp_st_source *src,
                               dp_err *err);

/* A loaded file: tensors point into one buffer owned by the handle. */
typedef struct dp_safetensors dp_safetensors;

int dp_safetensors_load(const char *path, dp_safetensors **out, dp_err *err);
/* The same from len bytes in memory (the file's contents); the handle keeps
 * its own copy, so buf may be freed at once.  Messages name the source
 * "safetensors buffer". */
int dp_safetensors_load_mem(const void *buf, size_t len, dp_safetensors **out, dp_err *err);
/* Opens path without loading its data: the header is read and checked as
 * load checks it (against the file's size), the file kept open, and every
 * tensor's data is NULL: read it with dp_safetensors_read, a piece at a
 * time (a checkpoint's tables: docs/checkpoints.md, "Reading in pieces"). */
int dp_safetensors_open(const char *path, dp_safetensors **out, dp_err *err);
/* len bytes of tensor t's data (t of st), from byte off of it, into buf:
 * from the file when st was opened, from memory when loaded. */
int dp_safetensors_read(const dp_safetensors *st, const dp_st_tensor *t, uint64_t off,
                        void *buf, size_t len, dp_err *err);
void dp_safetensors_free(dp_safetensors *st); /* NULL is a no-op */
int dp_safetensors_count(const dp_safetensors *st);
/* The i-th tensor in file order (F32 data; other dtypes are refused at load). */
const dp_st_tensor *dp_safetensors_at(const dp_safetensors *st, int i);
/* NULL when absent. */
const dp_st_tensor *dp_safetensors_find(const dp_safetensors *st, const char *name);
/* NULL when absent. */
const char *dp_safetensors_meta(const dp_safetensors *st, const char *key);

#endif
