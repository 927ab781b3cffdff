/* Tests that build files byte by byte: a growing buffer, little-endian
 * integers, and .npy images as numpy writes them. */
#ifndef DOWNPOUR_TEST_BYTES_H
#define DOWNPOUR_TEST_BYTES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

static inline void put(bytes *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        REQUIRE(b->p != NULL);
    }
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
}
static inline void put16(bytes *b, uint32_t v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; put(b, x, 2); }
static inline void put32(bytes *b, uint32_t v) { put16(b, v & 0xFFFF); put16(b, v >> 16); }
static inline void put64(bytes *b, uint64_t v) { put32(b, (uint32_t)v); put32(b, (uint32_t)(v >> 32)); }

/* A .npy image of format `version` (1, 2 or 3): preamble, the dict padded
 * with spaces to a multiple of 64 and ended by '\n' (as numpy writes it),
 * then the data. */
static inline bytes npy_make(int version, const char *dict, const void *data, size_t n)
{
    bytes b = {0};
    size_t pre = version == 1 ? 10 : 12;
    size_t hl = strlen(dict) + 1;
    size_t total = (pre + hl + 63) / 64 * 64;
    put(&b, "\x93NUMPY", 6);
    uint8_t v[2] = {(uint8_t)version, 0};
    put(&b, v, 2);
    if (version == 1)
        put16(&b, (uint32_t)(total - pre));
    else
        put32(&b, (uint32_t)(total - pre));
    put(&b, dict, strlen(dict));
    for (size_t i = pre + hl; i < total; i++)
        put(&b, " ", 1);
    put(&b, "\n", 1);
    put(&b, data, n);
    return b;
}

/* A version 1.0 .npy image of a C-order array: descr "|u1", shape "(n, 28, 28)". */
static inline bytes npy_array(const char *descr, const char *shape, const void *data, size_t n)
{
    char dict[200];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
             shape);
    return npy_make(1, dict, data, n);
}

#endif
