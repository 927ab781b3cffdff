/* A cursor over a fuzz input, shared by the targets that decode their input
 * into a sequence of operations: every read past the end gives zeros, so any
 * input decodes to something and the decoding itself never fails. */
#ifndef DOWNPOUR_FUZZ_INPUT_H
#define DOWNPOUR_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz_in {
    const uint8_t *p;
    size_t n, at;
} fz_in;

static inline size_t fz_left(const fz_in *in) { return in->n - in->at; }

static inline uint8_t fz_u8(fz_in *in) { return in->at < in->n ? in->p[in->at++] : 0; }

static inline uint16_t fz_u16(fz_in *in)
{
    uint16_t lo = fz_u8(in);
    return (uint16_t)(lo | (uint16_t)fz_u8(in) << 8);
}

static inline uint32_t fz_u32(fz_in *in)
{
    uint32_t lo = fz_u16(in);
    return lo | (uint32_t)fz_u16(in) << 16;
}

/* Copies up to n bytes (fewer at the end of the input), zero-filling the rest
 * of dst; returns how many came from the input. */
static inline size_t fz_bytes(fz_in *in, void *dst, size_t n)
{
    size_t k = fz_left(in) < n ? fz_left(in) : n;
    memcpy(dst, in->p + in->at, k);
    memset((uint8_t *)dst + k, 0, n - k);
    in->at += k;
    return k;
}

#endif
