/* Random crop with padding and horizontal flip of training records
 * (include/downpour/augment.h; docs/training.md, "Augmentation"), done while
 * a batch is gathered: each output row is converted straight from its
 * source row, so nothing is allocated and no pixel is touched twice. */
#include "downpour/augment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

/* splitmix64's finaliser, as the batcher's */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int dp_augment_parse(const char *spec, dp_augment *out, dp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!spec || strcmp(spec, "none") == 0)
        return 0;
    char buf[128];
    if (strlen(spec) >= sizeof buf)
        return dp_errf(err, "--augment '%.40s...': too long (expected crop:P,flip)", spec);
    strcpy(buf, spec);
    for (char *t = buf, *next; t; t = next) {
        next = strchr(t, ',');
        if (next)
            *next++ = '\0';
        if (strcmp(t, "flip") == 0 && !out->flip) {
            out->flip = 1;
        } else if (strncmp(t, "crop:", 5) == 0 && !out->pad) {
            long p;
            char what[64];
            snprintf(what, sizeof what, "--augment %.40s: the padding", t);
            if (dp_parse_long(t + 5, 1, DP_AUGMENT_MAX_PAD, &p, what, err) < 0)
                return -1;
            out->pad = (int)p;
        } else {
            return dp_errf(err, "--augment '%s': '%s' is %s (expected crop:P with P pixels of "
                                "padding, flip, both as crop:4,flip, or none)",
                           spec, t, out->flip || out->pad ? "unknown or given twice" : "unknown");
        }
    }
    if (!out->flip && !out->pad)
        return dp_errf(err, "--augment '%s': no transform (expected crop:P, flip, or none)",
                       spec);
    return 0;
}

void dp_augment_format(const dp_augment *a, char *buf, size_t cap)
{
    if (!dp_augment_on(a))
        snprintf(buf, cap, "none");
    else if (a->pad)
        snprintf(buf, cap, "crop:%d%s", a->pad, a->flip ? ",flip" : "");
    else
        snprintf(buf, cap, "flip");
}

int dp_augment_on(const dp_augment *a) { return a && (a->pad > 0 || a->flip); }

int dp_augment_check(dp_augment *a, uint32_t rows, uint32_t cols, uint32_t channels,
                     uint32_t dim, dp_err *err)
{
    char spec[32];
    dp_augment_format(a, spec, sizeof spec);
    uint32_t c = channels ? channels : 1;
    if (rows < 2 || cols < 2 || (uint64_t)rows * cols * c != dim)
        return dp_errf(err, "--augment %s: the records are no images (%u x %u x %u for %u "
                            "values); crop and flip need rows and columns", spec, rows, cols, c,
                       dim);
    if (a->pad && ((uint32_t)a->pad >= rows || (uint32_t)a->pad >= cols))
        return dp_errf(err, "--augment %s: a padding of %d pixels is not below the images' "
                            "%u x %u", spec, a->pad, rows, cols);
    a->h = rows, a->w = cols, a->c = c;
    return 0;
}

void dp_augment_draw(const dp_augment *a, long epoch, uint32_t r, int *dy, int *dx, int *flip)
{
    uint64_t u = mix64(mix64(a->seed ^ 0x5bd1e9955bd1e995ULL) ^ mix64((uint64_t)epoch) ^
                       mix64((uint64_t)r + 0x9e3779b97f4a7c15ULL));
    uint64_t side = 2 * (uint64_t)a->pad + 1;
    *dy = a->pad ? (int)((u & 0xffffffffu) % side) - a->pad : 0;
    *dx = a->pad ? (int)(((u >> 32) & 0x7fffffffu) % side) - a->pad : 0;
    *flip = a->flip ? (int)(u >> 63) : 0;
}

/* One record: output row y is input row y + dy shifted by dx, zeros outside,
 * then reversed pixel by pixel when flipped (crop, then flip). */
void dp_augment_record(float *dst, const uint8_t *bytes, const float *values, uint32_t r,
                       const dp_augment *a, long epoch)
{
    int dy, dx, flip;
    dp_augment_draw(a, epoch, r, &dy, &dx, &flip);
    int h = (int)a->h, w = (int)a->w, c = (int)a->c;
    size_t row = (size_t)w * c;
    int x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? w - dx : w; /* output columns with a source */
    for (int y = 0; y < h; y++) {
        float *out = dst + (size_t)y * row;
        int sy = y + dy;
        if (sy < 0 || sy >= h || x1 <= x0) {
            memset(out, 0, row * sizeof *out);
            continue;
        }
        size_t from = (size_t)sy * row + (size_t)(x0 + dx) * c;
        size_t len = (size_t)(x1 - x0) * c;
        memset(out, 0, (size_t)x0 * c * sizeof *out);
        if (bytes)
            dp_bytes_to_unit(out + (size_t)x0 * c, bytes + from, (uint32_t)len);
        else
            memcpy(out + (size_t)x0 * c, values + from, len * sizeof *out);
        memset(out + (size_t)x1 * c, 0, (size_t)(w - x1) * c * sizeof *out);
        if (flip)
            for (int i = 0, j = w - 1; i < j; i++, j--)
                for (int k = 0; k < c; k++) {
                    float t = out[(size_t)i * c + k];
                    out[(size_t)i * c + k] = out[(size_t)j * c + k];
                    out[(size_t)j * c + k] = t;
                }
    }
}

