/* Gradient compression for the all-reduce (docs/strategies.md, "allreduce:
 * compression"): 16-bit floats (bf16, IEEE fp16), top-k sparsification and
 * PowerSGD's low-rank factors (powersgd.h), each with error feedback (the part of a gradient a replica did not send
 * is kept and added to its next gradient).  Sums are always accumulated in
 * fp32.  On the wire every 16-bit value and every (index, value) pair goes
 * through explicit little-endian bytes. */
#ifndef DOWNPOUR_COMPRESS_H
#define DOWNPOUR_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

typedef enum dp_compress_kind {
    DP_COMPRESS_NONE,
    DP_COMPRESS_BF16,
    DP_COMPRESS_FP16,
    DP_COMPRESS_TOPK,
    DP_COMPRESS_AUTO, /* bf16 when the measured link makes it pay, else none */
    DP_COMPRESS_POWERSGD, /* rank-r factors of each weight matrix (powersgd.h) */
    DP_COMPRESS_KIND_COUNT
} dp_compress_kind;

typedef struct dp_compress {
    dp_compress_kind kind;
    double ratio; /* topk: the fraction of each bucket sent, (0, 1] */
    int rank;     /* powersgd: the factors' rank, [1, DP_POWERSGD_MAX_RANK] */
} dp_compress;

#define DP_POWERSGD_MAX_RANK 1024

/* "none", "bf16", "fp16", "topk:RATIO" (0 < RATIO <= 1), "auto",
 * "powersgd:RANK" (a whole number in [1, DP_POWERSGD_MAX_RANK]); err names
 * what is wrong with the value (the caller prefixes the flag). */
int dp_compress_parse(const char *s, dp_compress *out, dp_err *err);
const char *dp_compress_kind_name(dp_compress_kind k);

/* Round to nearest even; NaN stays NaN, overflow goes to infinity (fp16
 * above 65504), fp16 keeps subnormals.  A value the format holds comes back
 * exactly. */
uint16_t dp_f32_to_bf16(float x);
float dp_bf16_to_f32(uint16_t h);
uint16_t dp_f32_to_fp16(float x);
float dp_fp16_to_f32(uint16_t h);

/* kind BF16 or FP16: x[0..n) as 2n little-endian bytes, and back (store, or
 * add into acc). */
void dp_compress_encode16(dp_compress_kind kind, const float *x, size_t n, uint8_t *out);
void dp_compress_decode16(dp_compress_kind kind, const uint8_t *in, size_t n, float *out);
void dp_compress_decode16_add(dp_compress_kind kind, const uint8_t *in, size_t n, float *acc);

/* Elements a top-k bucket of n sends: ceil(ratio n), at least 1. */
size_t dp_topk_count(double ratio, size_t n);
/* The k entries of x[0..n) largest in magnitude (ties: the lower index),
 * written as k pairs of 8 little-endian bytes (u32 index, f32 value) in index
 * order.  scratch: n floats. */
void dp_topk_encode(const float *x, size_t n, size_t k, float *scratch, uint8_t *out);
/* acc[index] += value for k pairs; -1 (err naming the index) when an index
 * is not below n. */
int dp_topk_decode_add(const uint8_t *in, size_t k, float *acc, size_t n, dp_err *err);

/* A coded block: the parameter servers' compressed push of a shard's
 * gradient (docs/strategies.md, "ps family: compression"; wire.h
 * PUSH_CODED).  [u32 codec (dp_compress_kind)][u32 count] then count
 * 16-bit values (bf16, fp16: count is the shard's n) or count top-k pairs
 * (topk: count is dp_topk_count(ratio, n)), all little-endian.
 * dp_coded_bytes: its bytes for a shard of n (0: kind codes no block). */
#define DP_CODED_HEAD_SIZE 8
size_t dp_coded_bytes(const dp_compress *c, size_t n);
/* Error feedback, then the block: v = g + resid (n floats each), coded
 * into out (dp_coded_bytes), and resid = v - what the block decodes to, so
 * nothing is lost, only late.  tmp, tmp2: n floats each. */
void dp_coded_encode(const dp_compress *c, const float *g, float *resid, size_t n, float *tmp,
                     float *tmp2, uint8_t *out);
/* A received block of len bytes decoded into out (n floats, overwritten):
 * -1 with err naming what is wrong when its codec is not c's, its count or
 * length not what a shard of n takes, or a top-k index not below n. */
int dp_coded_decode(const dp_compress *c, const uint8_t *in, size_t len, float *out, size_t n,
                    dp_err *err);

/* A coded answer of the parameter servers (wire.h PARAMS_CODED; docs/
 * strategies.md, "ps family: compression"): [u32 codec = topk][u32 count]
 * then count (u32 index, f32 value) pairs, indices strictly increasing and
 * below n, 1 <= count <= n: sets x[index] = value.  -1 with err naming what
 * is wrong, and x untouched, when the block is not that. */
int dp_coded_set(const uint8_t *in, size_t len, float *x, size_t n, dp_err *err);

/* A 4-bit answer (--ps-reply delta4, and --compress auto's answers; wire.h
 * PARAMS_CODED): the difference x - copy of every element, as
 * [u32 codec = DP_CODED_DELTA4][u32 count = n][f32 scale] then n signed
 * 4-bit values in [-7, 7] (two a byte, element 2j in the low nibble, a
 * last odd one's high nibble 0), each value q standing for q x scale; the
 * scale is 0 or the smallest power of two with max|x - copy| <= 7 scale,
 * so q x scale is exact and copy + q x scale one rounding on every host.
 * dp_delta4_encode codes it into out (dp_delta4_bytes(n)) and applies it to
 * copy, as the receiver's dp_delta4_apply applies it to its x: both end
 * with the same bits, and what the 4 bits left out stays in the next
 * difference.  Encode: -1 when a difference is not finite (then nothing is
 * changed: the caller sends x whole).  Apply: -1 with err naming what is
 * wrong, and x untouched, when the block is not one for n. */
#define DP_CODED_DELTA4 16u
#define DP_DELTA4_HEAD_SIZE 12
size_t dp_delta4_bytes(size_t n);
int dp_delta4_encode(const float *x, float *copy, size_t n, uint8_t *out);
int dp_delta4_apply(const uint8_t *in, size_t len, float *x, size_t n, dp_err *err);

#endif
