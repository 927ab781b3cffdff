/* libFuzzer target for the NumPy reader (src/data/npy.c) and the ZIP reader
 * under it (src/data/zip.c).  Byte 0 says what the rest is:
 *   bits 0-1: 0 a .npy file; 1 an .npz archive, member "a" opened;
 *             2 and 3 a .npy that the harness wraps as member "a.npy" of a
 *             valid archive, stored (2) or deflated (3), numpy's ZIP64 local
 *             header and the right CRC (what a fuzzer cannot guess);
 *   bits 2-3: the read pattern: all rows at once, row by row from the last,
 *             three rows at a time, or the second half then the first;
 *   bit 4:    read labels instead of floats;
 * byte 1 + 1 is the class count for labels; the rest is the file.
 * Any bytes must give an array whose info is consistent and whose reads
 * either succeed with finite floats / labels below the class count, or are
 * refused naming the file; never a crash, an out-of-bounds access, a leak,
 * or an allocation sized from the header.  The file is a memfd read back
 * through its /proc path. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "downpour/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

/* Rows are read into at most this many floats. */
#define OUT_MAX ((size_t)1 << 20)
static float out_f[OUT_MAX];
static uint32_t out_l[OUT_MAX];

static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, v); put16(p + 2, v >> 16); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

/* One member "a.npy" as numpy writes it; returns the archive's length. */
static size_t wrap_zip(uint8_t *z, const uint8_t *npy, size_t n, int deflated)
{
    static const char name[] = "a.npy";
    const size_t nl = sizeof name - 1;
    uint8_t *d = z + 30 + nl + 20;
    size_t clen = n;
    if (deflated) {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            abort();
        zs.next_in = (Bytef *)npy;
        zs.avail_in = (uInt)n;
        zs.next_out = d;
        zs.avail_out = (uInt)(deflateBound(&zs, (uLong)n) + 16);
        if (deflate(&zs, Z_FINISH) != Z_STREAM_END)
            abort();
        clen = zs.total_out;
        deflateEnd(&zs);
    } else if (n) {
        memcpy(d, npy, n);
    }
    uint32_t crc = (uint32_t)crc32(0, npy, (uInt)n);
    uint8_t *h = z;
    put32(h, 0x04034b50);
    put16(h + 4, 45);
    put16(h + 6, 0);
    put16(h + 8, deflated ? 8 : 0);
    put32(h + 10, 0);
    put32(h + 14, crc);
    put32(h + 18, 0xFFFFFFFFu);
    put32(h + 22, 0xFFFFFFFFu);
    put16(h + 26, (uint32_t)nl);
    put16(h + 28, 20);
    memcpy(h + 30, name, nl);
    put16(h + 30 + nl, 1);
    put16(h + 32 + nl, 16);
    put64(h + 34 + nl, n);
    put64(h + 42 + nl, clen);
    uint8_t *c = d + clen;
    put32(c, 0x02014b50);
    put16(c + 4, 45);
    put16(c + 6, 45);
    put16(c + 8, 0);
    put16(c + 10, deflated ? 8 : 0);
    put32(c + 12, 0);
    put32(c + 16, crc);
    put32(c + 20, (uint32_t)clen);
    put32(c + 24, (uint32_t)n);
    put16(c + 28, (uint32_t)nl);
    memset(c + 30, 0, 12);
    put32(c + 42, 0);
    memcpy(c + 46, name, nl);
    uint8_t *e = c + 46 + nl;
    put32(e, 0x06054b50);
    memset(e + 4, 0, 4);
    put16(e + 8, 1);
    put16(e + 10, 1);
    put32(e + 12, (uint32_t)(46 + nl));
    put32(e + 16, (uint32_t)(c - z));
    put16(e + 20, 0);
    return (size_t)(e + 22 - z);
}

static void must_name_file(const dp_err *err)
{
    if (strstr(err->msg, path) == NULL)
        abort(); /* every refusal names the file */
}

/* Reads [lo, hi) and checks what came back. */
static void read_check(dp_npy *a, uint64_t lo, uint64_t hi, int labels, uint32_t classes)
{
    const dp_npy_info *in = dp_npy_get_info(a);
    dp_err err = {{0}};
    size_t n = (size_t)((hi - lo) * in->row_elems);
    if (labels) {
        if (dp_npy_read_labels(a, lo, hi, classes, out_l, &err) != 0) {
            must_name_file(&err);
            return;
        }
        for (size_t i = 0; i < n; i++)
            if (out_l[i] >= classes)
                abort();
    } else {
        if (dp_npy_read_f32(a, lo, hi, out_f, &err) != 0) {
            must_name_file(&err);
            return;
        }
        for (size_t i = 0; i < n; i++)
            if (!isfinite(out_f[i]))
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 1 << 20)
        return 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_npy", MFD_CLOEXEC);
        if (memfd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    uint8_t mode = data[0];
    const uint8_t *body = data + 2;
    size_t n = size - 2;
    uint8_t *zip = NULL;
    int kind = mode & 3;
    if (kind >= 2) {
        zip = malloc(n + n / 1000 + 256);
        if (!zip)
            abort();
        n = wrap_zip(zip, body, n, kind == 3);
        body = zip;
    }
    if (ftruncate(memfd, 0) != 0 || (n && pwrite(memfd, body, n, 0) != (ssize_t)n))
        abort();
    free(zip);

    if (kind == 1) { /* the listing, too */
        char **names;
        size_t nn;
        dp_err err = {{0}};
        if (dp_npz_list(path, &names, &nn, &err) == 0)
            dp_npz_list_free(names, nn);
        else
            must_name_file(&err);
    }
    dp_npy *a = NULL;
    dp_err err = {{0}};
    if (dp_npy_open(&a, path, kind == 0 ? NULL : "a", &err) != 0) {
        if (a != NULL)
            abort();
        must_name_file(&err);
        return 0;
    }
    const dp_npy_info *in = dp_npy_get_info(a);
    if (in->ndim < 1 || in->ndim > DP_NPY_MAX_NDIM || in->rows != in->shape[0] ||
        in->dtype >= DP_NPY_DTYPE_COUNT)
        abort();
    if (in->itemsize != 1 && in->itemsize != 2 && in->itemsize != 4 && in->itemsize != 8)
        abort();
    uint64_t row = 1;
    for (int i = 1; i < in->ndim; i++)
        row *= in->shape[i];
    if (row != in->row_elems)
        abort();
    /* How many rows fit the output buffer (all of them, for real data). */
    uint64_t rows = in->rows;
    if (in->row_elems > 0 && rows > OUT_MAX / in->row_elems)
        rows = OUT_MAX / in->row_elems;
    if (in->row_elems == 0 && rows > 4096)
        rows = 4096;
    int labels = (mode >> 4) & 1;
    uint32_t classes = (uint32_t)data[1] + 1;
    switch ((mode >> 2) & 3) {
    case 0:
        read_check(a, 0, rows, labels, classes);
        break;
    case 1:
        for (uint64_t r = rows; r-- > 0 && rows - r <= 64;)
            read_check(a, r, r + 1, labels, classes);
        break;
    case 2:
        for (uint64_t r = 0; r < rows; r += 3)
            read_check(a, r, r + 3 < rows ? r + 3 : rows, labels, classes);
        break;
    default:
        read_check(a, rows / 2, rows, labels, classes);
        read_check(a, 0, rows / 2, labels, classes);
        break;
    }
    /* A range past the end is refused. */
    if (dp_npy_read_f32(a, in->rows, in->rows + 1, out_f, &err) == 0)
        abort();
    dp_npy_close(a);
    return 0;
}
