/* libFuzzer target for the dataset cache header (src/data/dataset.c): the
 * fuzz bytes become the cache file of a small real dataset (four valid IDX
 * files in a scratch directory), and dp_dataset_open must either trust it
 * (only when it is consistent with its sources and itself, every label below
 * its class count) or rebuild it from the sources; either way the open
 * succeeds and every record is readable.  Never a crash, a read outside the
 * mapping, or a leak.
 *
 * The target does not restate the cache format (dataset.c owns it, and it
 * changes): at start it lets dp_dataset_open build the real cache and keeps
 * it as the reference, and it finds the header's own CRC by looking for the
 * u32 that equals the CRC32C (or zlib CRC-32) of the bytes before it.
 *
 * The first input byte holds flags; the rest is the cache file:
 *   bit 0  the rest is XORed onto the reference (so an input of just 0x01 is
 *          the valid cache, and a flipped bit is a damaged field), else it is
 *          the whole file as is
 *   bit 1  recompute the header CRC afterwards, which a fuzzer cannot guess,
 *          so the checks after it are reached
 *   bit 2  DOWNPOUR_CACHE_VERIFY=1 (read by older cache formats)
 *   bit 3  with bit 0: cut the file to the input's length */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz_scratch.h"
#include "downpour/crc32c.h"
#include "downpour/dataset.h"
#include "downpour/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[256], cache[512];
static const char *const src_names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

/* The dataset: 3 training and 2 test images of 2x2, labels 0..2 (3 classes). */
static const uint8_t train_images[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2,
                                       0, 1, 2, 3, 10, 11, 12, 13, 250, 251, 252, 253};
static const uint8_t train_labels[] = {0, 0, 8, 1, 0, 0, 0, 3, 0, 2, 1};
static const uint8_t test_images[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2,
                                      7, 7, 7, 7, 9, 9, 9, 9};
static const uint8_t test_labels[] = {0, 0, 8, 1, 0, 0, 0, 2, 1, 2};

static uint8_t *ref;     /* the cache dp_dataset_open built from the sources */
static size_t ref_len;
static long hdr_crc_at = -1; /* where the header's own CRC is, -1: not found */
static int hdr_crc_zlib;     /* 1: zlib CRC-32, 0: CRC32C */

static void put_file(const char *name, const void *p, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
        abort();
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t hdr_crc(const uint8_t *p, size_t n, int zl)
{
    return zl ? (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n) : dp_crc32c(0, p, n);
}

/* Removes the scratch directory at exit (it holds only what this target and
 * dp_dataset_open wrote there). */
static void cleanup(void)
{
    char path[700];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, src_names[i]);
        unlink(path);
    }
    unlink(cache);
    snprintf(path, sizeof path, "%s.lock", cache);
    unlink(path);
    rmdir(dir);
}

static void setup(void)
{
    fz_scratch_dir(dir, sizeof dir, "fuzz_dataset_cache");
    atexit(cleanup);
    put_file(src_names[0], train_images, sizeof train_images);
    put_file(src_names[1], train_labels, sizeof train_labels);
    put_file(src_names[2], test_images, sizeof test_images);
    put_file(src_names[3], test_labels, sizeof test_labels);
    /* The cache lives in the (writable) directory itself: <dir>/<basename>.dpcache. */
    unsetenv("DOWNPOUR_CACHE");
    unsetenv("DOWNPOUR_CACHE_VERIFY");
    const char *slash = strrchr(dir, '/');
    snprintf(cache, sizeof cache, "%s/%s.dpcache", dir, slash + 1);
    dp_log_set_level(DP_LOG_ERROR);
    dp_dataset ds;
    dp_err err;
    if (dp_dataset_open(&ds, dir, &err) != 0) {
        fprintf(stderr, "fuzz_dataset_cache: building the reference cache: %s\n", err.msg);
        abort();
    }
    dp_dataset_close(&ds);
    FILE *f = fopen(cache, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0)
        abort();
    long len = ftell(f);
    rewind(f);
    ref_len = len > 0 ? (size_t)len : 0;
    ref = malloc(ref_len + 1);
    if (!ref || fread(ref, 1, ref_len, f) != ref_len)
        abort();
    fclose(f);
    for (size_t off = 8; hdr_crc_at < 0 && off + 4 <= ref_len && off + 4 <= 4096; off += 4)
        for (int zl = 0; zl < 2 && hdr_crc_at < 0; zl++)
            if (get32(ref + off) == hdr_crc(ref, off, zl)) {
                hdr_crc_at = (long)off;
                hdr_crc_zlib = zl;
            }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 16))
        return 0;
    if (!dir[0])
        setup();
    uint8_t flags = data[0];
    data++;
    size--;
    size_t n = size;
    if ((flags & 1) && !((flags & 8) && size < ref_len))
        n = size > ref_len ? size : ref_len;
    uint8_t *file = malloc(n ? n : 1);
    if (!file)
        return 0;
    if (flags & 1) {
        for (size_t i = 0; i < n; i++)
            file[i] = (uint8_t)((i < ref_len ? ref[i] : 0) ^ (i < size ? data[i] : 0));
    } else if (n) {
        memcpy(file, data, n);
    }
    if ((flags & 2) && hdr_crc_at >= 0 && n >= (size_t)hdr_crc_at + 4) {
        uint32_t crc = hdr_crc(file, (size_t)hdr_crc_at, hdr_crc_zlib);
        for (int i = 0; i < 4; i++)
            file[hdr_crc_at + i] = (uint8_t)(crc >> (8 * i));
    }
    FILE *f = fopen(cache, "wb");
    if (!f || (n && fwrite(file, 1, n, f) != n) || fclose(f) != 0)
        abort();
    free(file);
    if (flags & 4)
        setenv("DOWNPOUR_CACHE_VERIFY", "1", 1);
    else
        unsetenv("DOWNPOUR_CACHE_VERIFY");

    dp_dataset ds;
    dp_err err;
    if (dp_dataset_open(&ds, dir, &err) != 0) {
        fprintf(stderr, "dp_dataset_open: %s\n", err.msg);
        abort(); /* the sources are valid: a bad cache is rebuilt, never fatal */
    }
    const dp_split *sp[2] = {&ds.train_all, &ds.test};
    if (ds.classes < 2 || ds.classes > 256 || ds.rows == 0 || ds.cols == 0)
        abort();
    volatile uint32_t sink = 0;
    for (int k = 0; k < 2; k++) {
        if (sp[k]->n == 0 || sp[k]->dim != ds.rows * ds.cols)
            abort();
        for (uint32_t i = 0; i < sp[k]->n; i++) {
            if (sp[k]->labels[i] >= ds.classes)
                abort(); /* a trusted cache has every label below its classes */
            for (uint32_t j = 0; j < sp[k]->dim; j++)
                sink += sp[k]->images[(size_t)i * sp[k]->dim + j];
        }
    }
    (void)sink;
    dp_split tr, va;
    (void)dp_dataset_split(&ds, 1, ds.train_all.n - 1, &tr, &va, &err);
    dp_dataset_close(&ds);
    return 0;
}
