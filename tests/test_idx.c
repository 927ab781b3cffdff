/* IDX reader: good raw and gzip files read back exactly; every malformed
 * file is refused with a message that names it. */
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "scratch.h"
#include "downpour/idx.h"

static char scratch[1024];

static const char *path_of(const char *name)
{
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", scratch, name);
    return buf[k];
}

static void write_raw(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL);
    REQUIRE(fwrite(p, 1, n, f) == n);
    REQUIRE(fclose(f) == 0);
}

static void write_gz(const char *path, const uint8_t *p, size_t n)
{
    gzFile g = gzopen(path, "wb");
    REQUIRE(g != NULL);
    REQUIRE(gzwrite(g, p, (unsigned)n) == (int)n);
    REQUIRE(gzclose(g) == Z_OK);
}

/* Builds an IDX image: magic 00 00 type ndim, big-endian dims, then data bytes. */
static size_t make_idx(uint8_t *buf, uint8_t type, int ndim, const uint32_t *dims,
                       size_t data_bytes)
{
    size_t n = 0;
    buf[n++] = 0;
    buf[n++] = 0;
    buf[n++] = type;
    buf[n++] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[n++] = (uint8_t)(dims[i] >> 24);
        buf[n++] = (uint8_t)(dims[i] >> 16);
        buf[n++] = (uint8_t)(dims[i] >> 8);
        buf[n++] = (uint8_t)dims[i];
    }
    for (size_t i = 0; i < data_bytes; i++)
        buf[n++] = (uint8_t)(i * 7 + 3);
    return n;
}

/* Reads path expecting failure; the message must name the file and contain `what`. */
static void expect_refused(const char *path, const char *what)
{
    dp_idx idx;
    dp_err err = {{0}};
    int rc = dp_idx_read(path, &idx, &err);
    fprintf(stderr, "refused as expected: %s\n", err.msg);
    CHECKF(rc == -1, "%s was accepted", path);
    CHECKF(strstr(err.msg, path) != NULL, "message does not name the file: %s", err.msg);
    CHECKF(strstr(err.msg, what) != NULL, "message lacks '%s': %s", what, err.msg);
    CHECK(idx.data == NULL && idx.len == 0);
    dp_idx_free(&idx);
}

static void check_good(const char *path, int ndim, const uint32_t *dims, size_t bytes)
{
    dp_idx idx;
    dp_err err = {{0}};
    int rc = dp_idx_read(path, &idx, &err);
    CHECKF(rc == 0, "%s: %s", path, err.msg);
    if (rc != 0)
        return;
    CHECK(idx.ndim == ndim);
    for (int i = 0; i < ndim; i++)
        CHECK(idx.dims[i] == dims[i]);
    CHECK(idx.len == bytes);
    int same = 1;
    for (size_t i = 0; i < bytes; i++)
        same &= idx.data[i] == (uint8_t)(i * 7 + 3);
    CHECK(same);
    dp_idx_free(&idx);
    CHECK(idx.data == NULL);
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_idx");
    static uint8_t buf[1 << 16];
    uint32_t d3[3] = {3, 4, 5}, d1[1] = {7};
    size_t n;

    /* Good files: raw, gzip, gzip without the .gz name, 1-D. */
    n = make_idx(buf, 0x08, 3, d3, 60);
    write_raw(path_of("good-idx3"), buf, n);
    check_good(path_of("good-idx3"), 3, d3, 60);
    write_gz(path_of("good-idx3.gz"), buf, n);
    check_good(path_of("good-idx3.gz"), 3, d3, 60);
    write_gz(path_of("gz-without-suffix"), buf, n);
    check_good(path_of("gz-without-suffix"), 3, d3, 60);
    n = make_idx(buf, 0x08, 1, d1, 7);
    write_raw(path_of("good-idx1"), buf, n);
    check_good(path_of("good-idx1"), 1, d1, 7);
    uint32_t d4[4] = {2, 3, 2, 2};
    n = make_idx(buf, 0x08, 4, d4, 24);
    write_raw(path_of("good-idx4"), buf, n);
    check_good(path_of("good-idx4"), 4, d4, 24);

    /* Truncated data, raw and gzip (a clean gzip stream holding too few bytes). */
    n = make_idx(buf, 0x08, 3, d3, 60);
    write_raw(path_of("short-data"), buf, n - 5);
    expect_refused(path_of("short-data"), "truncated (expected 60 bytes of data");
    expect_refused(path_of("short-data"), "found 55");
    write_gz(path_of("short-data.gz"), buf, n - 5);
    expect_refused(path_of("short-data.gz"), "found 55");

    /* Trailing bytes: the file is longer than its dimensions say. */
    write_raw(path_of("long-data"), buf, n);
    {
        FILE *f = fopen(path_of("long-data"), "ab");
        REQUIRE(f && fputc(0, f) == 0 && fclose(f) == 0);
    }
    expect_refused(path_of("long-data"), "trailing bytes");
    buf[n] = 0;
    write_gz(path_of("long-data.gz"), buf, n + 1);
    expect_refused(path_of("long-data.gz"), "trailing bytes");

    /* Truncated header: within the magic, and within the dimensions. */
    write_raw(path_of("short-magic"), buf, 3);
    expect_refused(path_of("short-magic"), "truncated header");
    write_raw(path_of("short-dims"), buf, 10);
    expect_refused(path_of("short-dims"), "truncated header");
    write_raw(path_of("empty"), buf, 0);
    expect_refused(path_of("empty"), "truncated header");

    /* Wrong magic, wrong type, bad rank, zero dimension. */
    n = make_idx(buf, 0x08, 3, d3, 60);
    buf[0] = 0x50;
    buf[1] = 0x4b;
    write_raw(path_of("not-idx"), buf, n);
    expect_refused(path_of("not-idx"), "not an IDX file");
    n = make_idx(buf, 0x0D, 3, d3, 60);
    write_raw(path_of("floats"), buf, n);
    expect_refused(path_of("floats"), "0x0D (float)");
    n = make_idx(buf, 0x08, 0, d3, 0);
    write_raw(path_of("rank0"), buf, n);
    expect_refused(path_of("rank0"), "rank 0");
    uint32_t d5[5] = {1, 1, 1, 1, 2};
    n = make_idx(buf, 0x08, 5, d5, 2);
    write_raw(path_of("rank5"), buf, n);
    expect_refused(path_of("rank5"), "rank 5");
    uint32_t dz[3] = {3, 0, 5};
    n = make_idx(buf, 0x08, 3, dz, 0);
    write_raw(path_of("zero-dim"), buf, n);
    expect_refused(path_of("zero-dim"), "dimension 1 is 0");

    /* Huge claims: refused before any allocation (ASan would report a giant malloc). */
    uint32_t huge[2] = {4000000000u, 4000000000u};
    n = make_idx(buf, 0x08, 2, huge, 16);
    write_raw(path_of("huge"), buf, n);
    expect_refused(path_of("huge"), "limit");
    write_gz(path_of("huge.gz"), buf, n);
    expect_refused(path_of("huge.gz"), "limit");
    /* Under the limit but far beyond the file: raw is refused by size, gzip by
     * running out of data while the buffer grows only as bytes arrive. */
    uint32_t big[3] = {1000000, 28, 28};
    n = make_idx(buf, 0x08, 3, big, 16);
    write_raw(path_of("big"), buf, n);
    expect_refused(path_of("big"), "truncated");
    write_gz(path_of("big.gz"), buf, n);
    expect_refused(path_of("big.gz"), "truncated");

    /* Corrupt gzip: a valid 10-byte gzip header, then garbage. */
    {
        uint8_t g[64] = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};
        for (int i = 10; i < 64; i++)
            g[i] = (uint8_t)(0xff - i * 13);
        write_raw(path_of("garbage.gz"), g, sizeof g);
        expect_refused(path_of("garbage.gz"), "gzip");
    }
    /* A gzip stream cut in half. */
    {
        static uint8_t big_idx[4096 + 16];
        uint32_t dd[3] = {16, 16, 16};
        n = make_idx(big_idx, 0x08, 3, dd, 4096);
        write_gz(path_of("cut.gz"), big_idx, n);
        struct stat st;
        REQUIRE(stat(path_of("cut.gz"), &st) == 0);
        REQUIRE(truncate(path_of("cut.gz"), st.st_size / 2) == 0);
        expect_refused(path_of("cut.gz"), "truncated gzip stream");
        /* Cut inside the 8-byte trailer: all data present, CRC/length missing. */
        write_gz(path_of("cut-trailer.gz"), big_idx, n);
        REQUIRE(stat(path_of("cut-trailer.gz"), &st) == 0);
        REQUIRE(truncate(path_of("cut-trailer.gz"), st.st_size - 4) == 0);
        expect_refused(path_of("cut-trailer.gz"), "gzip");
        /* A flipped data byte: the gzip CRC catches it. */
        write_gz(path_of("flipped.gz"), big_idx, n);
        REQUIRE(stat(path_of("flipped.gz"), &st) == 0);
        FILE *f = fopen(path_of("flipped.gz"), "r+b");
        REQUIRE(f != NULL);
        REQUIRE(fseek(f, st.st_size - 6, SEEK_SET) == 0);
        int c = fgetc(f);
        REQUIRE(fseek(f, st.st_size - 6, SEEK_SET) == 0);
        fputc(c ^ 0x55, f);
        REQUIRE(fclose(f) == 0);
        expect_refused(path_of("flipped.gz"), "gzip");
    }

    /* A missing file names the file and the system's reason; so does a directory. */
    expect_refused(path_of("no-such-file"), strerror(ENOENT));
    expect_refused(scratch, "directory");

    dp_idx_free(NULL);
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
