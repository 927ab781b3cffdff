/* Protocol-buffer varints (base 128, least significant group first), for
 * the two protobuf formats downpour writes by hand: TensorBoard's event
 * records (src/io/tensorboard.c) and tf.train.Example (src/data/example.c). */
#ifndef DOWNPOUR_VARINT_H
#define DOWNPOUR_VARINT_H

#include <stddef.h>
#include <stdint.h>

/* Bytes v takes as a varint (1 to 10). */
static inline size_t dp_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v at p (room for dp_varint_size(v) bytes); returns the bytes written. */
static inline size_t dp_put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

#endif
