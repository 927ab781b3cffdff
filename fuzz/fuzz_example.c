/* libFuzzer target for the tf.train.Example decoder and encoder
 * (src/data/example.c) and the PNG decoder (src/data/png.c).
 *
 * Byte 0, bit 0 clear: the rest is a serialized Example.  A refusal must
 * leave no features and say which message it was in ("Example...").  An
 * accepted Example must be consistent: names sorted and unique, each found
 * by dp_example_find, every value readable; encoded again it must take
 * exactly dp_example_encoded_size bytes and decode to the same features.
 * Every bytes value (the first 16) also goes to the PNG decoder.
 * Bit 0 set: the rest is one PNG.
 *
 * A PNG whose header reads is decoded into a buffer of exactly the size its
 * header gives (when 8-bit, not a palette, at most 4 Mi bytes), so an
 * overrun is an ASan finding; asked for one row more than it has, it must
 * be refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/example.h"
#include "downpour/png.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PIXELS ((size_t)4 << 20)

static dp_example *ex, *ex2;

static void try_png(const uint8_t *p, size_t n)
{
    dp_png_info info;
    dp_err err;
    if (dp_png_info_read(&info, p, n, &err) < 0) {
        if (strncmp(err.msg, "PNG: ", 5) != 0 && strncmp(err.msg, "not a PNG", 9) != 0)
            abort();
        return;
    }
    if (info.width == 0 || info.height == 0 || info.width > DP_PNG_MAX_SIDE ||
        info.height > DP_PNG_MAX_SIDE || info.channels < 1 || info.channels > 4)
        abort(); /* libpng accepted a header it should not have */
    size_t bytes = (size_t)info.width * info.height * (size_t)info.channels;
    if (info.bit_depth != 8 || info.palette || bytes > MAX_PIXELS) {
        uint8_t one;
        /* refused before a pixel is written, whatever the shape asked for */
        if (dp_png_decode(&one, p, n, 1, 1, 1, &err) == 0)
            abort();
        return;
    }
    uint8_t *px = malloc(bytes);
    if (!px)
        abort();
    if (dp_png_decode(px, p, n, info.height, info.width, info.channels, &err) == 0) {
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < bytes; i++)
            sink ^= px[i];
        (void)sink;
    }
    if (info.height < DP_PNG_MAX_SIDE &&
        dp_png_decode(px, p, n, info.height + 1, info.width, info.channels, &err) == 0)
        abort();
    free(px);
}

static int same_feature(const dp_feature *a, const dp_feature *b)
{
    if (strcmp(a->name, b->name) || a->kind != b->kind || a->count != b->count)
        return 0;
    for (size_t i = 0; i < a->count; i++) {
        switch (a->kind) {
        case DP_FEATURE_BYTES:
            if (a->bytes[i].len != b->bytes[i].len ||
                (a->bytes[i].len && memcmp(a->bytes[i].data, b->bytes[i].data, a->bytes[i].len)))
                return 0;
            break;
        case DP_FEATURE_FLOAT: /* bit for bit: NaNs too */
            if (memcmp(&a->floats[i], &b->floats[i], sizeof(float)))
                return 0;
            break;
        case DP_FEATURE_INT64:
            if (a->int64s[i] != b->int64s[i])
                return 0;
            break;
        default:
            return 0;
        }
    }
    return 1;
}

static void try_example(const uint8_t *data, size_t size)
{
    dp_err err;
    err.msg[0] = '\0';
    if (dp_example_decode(ex, data, size, &err) < 0) {
        if (dp_example_count(ex) != 0 || strncmp(err.msg, "Example", 7) != 0)
            abort();
        return;
    }
    size_t n = dp_example_count(ex), pngs = 0;
    dp_feature *fs = malloc((n ? n : 1) * sizeof *fs);
    if (!fs)
        abort();
    for (size_t i = 0; i < n; i++) {
        const dp_feature *f = dp_example_feature(ex, i);
        if (!f || (i && strcmp(fs[i - 1].name, f->name) >= 0) || dp_example_find(ex, f->name) != f)
            abort();
        if ((unsigned)f->kind >= DP_FEATURE_KIND_COUNT ||
            (f->kind == DP_FEATURE_NONE && f->count != 0) ||
            (f->count && !(f->bytes || f->floats || f->int64s)))
            abort();
        fs[i] = *f;
        volatile uint64_t sink = 0;
        for (size_t k = 0; k < f->count; k++) {
            if (f->kind == DP_FEATURE_BYTES) {
                for (size_t j = 0; j < f->bytes[k].len; j++)
                    sink += f->bytes[k].data[j];
                if (pngs++ < 16)
                    try_png(f->bytes[k].data, f->bytes[k].len);
            } else if (f->kind == DP_FEATURE_FLOAT) {
                sink += (uint64_t)(f->floats[k] == f->floats[k]);
            } else {
                sink += (uint64_t)f->int64s[k];
            }
        }
        (void)sink;
    }
    if (dp_example_feature(ex, n) != NULL)
        abort();
    size_t len = dp_example_encoded_size(fs, n);
    uint8_t *buf = malloc(len);
    if (!buf || dp_example_encode(buf, fs, n) != len)
        abort();
    if (dp_example_decode(ex2, buf, len, &err) < 0 || dp_example_count(ex2) != n)
        abort(); /* our own encoding must read back */
    for (size_t i = 0; i < n; i++)
        if (!same_feature(&fs[i], dp_example_feature(ex2, i)))
            abort();
    free(buf);
    free(fs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 20)
        return 0;
    if (!ex) {
        ex = dp_example_new();
        ex2 = dp_example_new();
        if (!ex || !ex2)
            abort();
    }
    if (data[0] & 1)
        try_png(data + 1, size - 1);
    else
        try_example(data + 1, size - 1);
    return 0;
}
