/* PNG decoding and encoding with libpng (png.h).
 *
 * libpng reports errors by longjmp.  The rule that makes that safe: the
 * functions that call setjmp (run, run_write) change no local variable after
 * it; all state they and the callbacks touch lives in a png_job (png_wjob)
 * in the caller's frame, so after a longjmp every value is well defined, and
 * the caller frees whatever the job holds (row pointers, libpng's structs) on
 * every path.  The error callback's pointer is the job's message buffer. */
#include "downpour/png.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ancillary chunks (text, ICC profiles) a PNG may make libpng hold. */
#define CHUNK_MALLOC_MAX ((png_alloc_size_t)1 << 20)
#define CHUNK_CACHE_MAX 64
#define PNG_MSG_MAX (DP_ERR_MAX - 64)

typedef struct png_job {
    const uint8_t *src;
    size_t len, pos;
    png_structp png;
    png_infop info;
    png_bytep *rows;
    /* decode: the caller's expectations and output; pixels NULL: header only */
    uint8_t *pixels;
    uint32_t height, width;
    int channels;
    dp_png_info got;
    char msg[PNG_MSG_MAX];
} png_job;

static void on_error(png_structp png, png_const_charp msg)
{
    char *out = png_get_error_ptr(png);
    snprintf(out, PNG_MSG_MAX, "%s", msg);
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg)
{
    (void)png, (void)msg; /* a damaged ancillary chunk is dropped; the pixels decide */
}

static void on_read(png_structp png, png_bytep out, size_t n)
{
    png_job *j = png_get_io_ptr(png);
    if (n > j->len - j->pos)
        png_error(png, "truncated PNG data");
    memcpy(out, j->src + j->pos, n);
    j->pos += n;
}

static const char *color_name(int channels, int palette)
{
    if (palette)
        return "palette";
    static const char *const names[5] = {"?", "gray", "gray+alpha", "RGB", "RGBA"};
    return channels >= 1 && channels <= 4 ? names[channels] : "?";
}

/* The libpng calls.  Returns 0, or -1 with j->msg set; no local variable
 * changes after setjmp. */
static int run(png_job *j)
{
    if (setjmp(png_jmpbuf(j->png)))
        return -1;
    png_set_read_fn(j->png, j, on_read);
    png_set_user_limits(j->png, DP_PNG_MAX_SIDE, DP_PNG_MAX_SIDE);
    png_set_chunk_malloc_max(j->png, CHUNK_MALLOC_MAX);
    png_set_chunk_cache_max(j->png, CHUNK_CACHE_MAX);
    png_read_info(j->png, j->info);
    j->got.width = png_get_image_width(j->png, j->info);
    j->got.height = png_get_image_height(j->png, j->info);
    j->got.bit_depth = png_get_bit_depth(j->png, j->info);
    j->got.channels = png_get_channels(j->png, j->info);
    j->got.palette = png_get_color_type(j->png, j->info) == PNG_COLOR_TYPE_PALETTE;
    if (!j->pixels)
        return 0;
    if (j->got.palette) {
        snprintf(j->msg, sizeof j->msg, "palette PNG is not supported (store it as %d-channel "
                 "8-bit %s)", j->channels, color_name(j->channels, 0));
        return -1;
    }
    if (j->got.bit_depth != 8) {
        snprintf(j->msg, sizeof j->msg, "PNG has bit depth %d; only 8-bit PNGs are read",
                 j->got.bit_depth);
        return -1;
    }
    if (j->got.height != j->height || j->got.width != j->width || j->got.channels != j->channels) {
        snprintf(j->msg, sizeof j->msg, "PNG is %ux%u %s (%d channel%s), expected %ux%u %s",
                 j->got.height, j->got.width, color_name(j->got.channels, 0), j->got.channels,
                 j->got.channels == 1 ? "" : "s", j->height, j->width,
                 color_name(j->channels, 0));
        return -1;
    }
    png_set_interlace_handling(j->png);
    png_read_update_info(j->png, j->info);
    size_t stride = (size_t)j->width * (size_t)j->channels;
    if (png_get_rowbytes(j->png, j->info) != stride) {
        snprintf(j->msg, sizeof j->msg, "PNG rows are %zu bytes, expected %zu",
                 (size_t)png_get_rowbytes(j->png, j->info), stride);
        return -1;
    }
    j->rows = malloc((size_t)j->height * sizeof *j->rows);
    if (!j->rows) {
        snprintf(j->msg, sizeof j->msg, "out of memory");
        return -1;
    }
    for (uint32_t y = 0; y < j->height; y++)
        j->rows[y] = j->pixels + (size_t)y * stride;
    png_read_image(j->png, j->rows);
    png_read_end(j->png, NULL); /* the rest of the stream, checked too */
    return 0;
}

/* Sets up libpng for j, runs it, and frees what it held. */
static int job(png_job *j, dp_err *err)
{
    if (j->len < 8 || png_sig_cmp(j->src, 0, 8) != 0)
        return dp_errf(err, "not a PNG (no PNG signature in the first 8 of %zu bytes)", j->len);
    j->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, j->msg, on_error, on_warning);
    if (!j->png)
        return dp_errf(err, "PNG: out of memory");
    j->info = png_create_info_struct(j->png);
    int rc = -1;
    if (!j->info)
        snprintf(j->msg, sizeof j->msg, "out of memory");
    else
        rc = run(j);
    free(j->rows);
    j->rows = NULL;
    png_destroy_read_struct(&j->png, j->info ? &j->info : NULL, NULL);
    if (rc < 0)
        return dp_errf(err, "PNG: %s", j->msg);
    return 0;
}

int dp_png_info_read(dp_png_info *info, const uint8_t *png, size_t len, dp_err *err)
{
    png_job j;
    memset(&j, 0, sizeof j);
    j.src = png;
    j.len = len;
    memset(info, 0, sizeof *info);
    if (job(&j, err) < 0)
        return -1;
    *info = j.got;
    return 0;
}

int dp_png_decode(uint8_t *pixels, const uint8_t *png, size_t len, uint32_t height,
                  uint32_t width, int channels, dp_err *err)
{
    if (height == 0 || width == 0 || height > DP_PNG_MAX_SIDE || width > DP_PNG_MAX_SIDE ||
        channels < 1 || channels > 4)
        return dp_errf(err, "PNG: cannot decode to %ux%u with %d channels (sides 1..%d, "
                       "channels 1..4)", height, width, channels, DP_PNG_MAX_SIDE);
    png_job j;
    memset(&j, 0, sizeof j);
    j.src = png;
    j.len = len;
    j.pixels = pixels;
    j.height = height;
    j.width = width;
    j.channels = channels;
    return job(&j, err);
}

/* Encoding: the job holds the caller's buffer and the row being written. */
typedef struct png_wjob {
    dp_png_buf *out;
    size_t max;        /* the most bytes this image's PNG may take (see dp_png_encode) */
    const uint8_t *pixels;
    uint32_t height, width, y;
    int channels;
    png_structp png;
    png_infop info;
    char msg[PNG_MSG_MAX];
} png_wjob;

static void on_write(png_structp png, png_bytep data, size_t n)
{
    png_wjob *j = png_get_io_ptr(png);
    dp_png_buf *b = j->out;
    if (n > j->max - b->len)
        png_error(png, "encoded PNG grew past its bound");
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n)
            cap = cap > j->max / 2 ? j->max : cap * 2;
        uint8_t *p = realloc(b->data, cap);
        if (!p)
            png_error(png, "out of memory");
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void on_flush(png_structp png)
{
    (void)png; /* memory: nothing to flush */
}

/* The libpng calls for encoding; as run, no local variable changes after setjmp. */
static int run_write(png_wjob *j)
{
    static const int color[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA,
                                 PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA};
    if (setjmp(png_jmpbuf(j->png)))
        return -1;
    png_set_write_fn(j->png, j, on_write, on_flush);
    png_set_IHDR(j->png, j->info, j->width, j->height, 8, color[j->channels],
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(j->png, j->info);
    for (j->y = 0; j->y < j->height; j->y++)
        png_write_row(j->png, j->pixels + (size_t)j->y * j->width * (size_t)j->channels);
    png_write_end(j->png, NULL);
    return 0;
}

int dp_png_encode(dp_png_buf *out, const uint8_t *pixels, uint32_t height, uint32_t width,
                  int channels, dp_err *err)
{
    out->len = 0;
    if (height == 0 || width == 0 || height > DP_PNG_MAX_SIDE || width > DP_PNG_MAX_SIDE ||
        channels < 1 || channels > 4)
        return dp_errf(err, "PNG: cannot encode %ux%u with %d channels (sides 1..%d, "
                       "channels 1..4)", height, width, channels, DP_PNG_MAX_SIDE);
    png_wjob j;
    memset(&j, 0, sizeof j);
    j.out = out;
    j.pixels = pixels;
    j.height = height;
    j.width = width;
    j.channels = channels;
    /* Deflate never grows data by more than 5 bytes per 16 KiB block; each
     * row adds a filter byte, and the chunks' framing is well below 64 KiB. */
    size_t raw = (size_t)height * (1 + (size_t)width * (size_t)channels);
    j.max = raw + raw / 1024 + 65536;
    j.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, j.msg, on_error, on_warning);
    if (!j.png)
        return dp_errf(err, "PNG: out of memory");
    j.info = png_create_info_struct(j.png);
    int rc = -1;
    if (!j.info)
        snprintf(j.msg, sizeof j.msg, "out of memory");
    else
        rc = run_write(&j);
    png_destroy_write_struct(&j.png, j.info ? &j.info : NULL);
    if (rc < 0) {
        out->len = 0;
        return dp_errf(err, "PNG: encoding %ux%u with %d channel(s): %s", height, width,
                       channels, j.msg);
    }
    return 0;
}

void dp_png_buf_free(dp_png_buf *b)
{
    if (!b)
        return;
    free(b->data);
    memset(b, 0, sizeof *b);
}
