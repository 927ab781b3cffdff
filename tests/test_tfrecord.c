/* TFRecord framing (tfrecord.h): records written by the writer read back
 * byte for byte, raw and gzip, across the reader's 64 KiB buffer; every
 * byte of a small file flipped, one at a time, is refused naming the file
 * and the record, with the CRC that caught it; the file cut at every offset
 * is refused as truncated except exactly at a record boundary, which is a
 * clean end; a gzip file cut anywhere is refused; a wrong length and a
 * length above the limit are refused before any data is read.  The framing
 * itself is checked against bytes built here from the format's definition
 * (the masked CRC32C of "123456789" is a fixed number). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "downpour/crc32c.h"
#include "downpour/tfrecord.h"
#include "scratch.h"

static char dir[1024];

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

/* The test's records: lengths 0, 1, 13, a 100 KB one (past the 64 KiB read
 * buffer) and a few more, filled from a simple generator. */
#define NREC 7
static const size_t rec_len[NREC] = {0, 1, 13, 100000, 5, 70000, 300};

static uint8_t *make_record(int i)
{
    uint8_t *p = malloc(rec_len[i] + 1);
    REQUIRE(p);
    uint32_t x = 2463534242u + (uint32_t)i;
    for (size_t k = 0; k < rec_len[i]; k++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[k] = (uint8_t)x;
    }
    return p;
}

static void write_records(const char *path, dp_tfrecord_compression c)
{
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, c, &err) == 0);
    for (int i = 0; i < NREC; i++) {
        uint8_t *p = make_record(i);
        REQUIRE(dp_tfrecord_write(w, p, rec_len[i], &err) == 0);
        free(p);
    }
    CHECKF(dp_tfrecord_writer_close(w, &err) == 0, "%s", err.msg);
}

/* Reads path to the end; returns the records read, or -1 (err filled). */
static long read_all(const char *path, const dp_tfrecord_options *opt, int check_content,
                     dp_err *err)
{
    dp_tfrecord_reader *r;
    if (dp_tfrecord_open(&r, path, opt, err) < 0)
        return -1;
    long n = 0;
    const uint8_t *data;
    size_t len;
    int rc;
    while ((rc = dp_tfrecord_next(r, &data, &len, err)) == 1) {
        if (check_content && n < NREC) {
            uint8_t *want = make_record((int)n);
            CHECKF(len == rec_len[n] && memcmp(data, want, len) == 0, "record %ld differs", n);
            free(want);
        }
        n++;
    }
    CHECK((uint64_t)n == dp_tfrecord_count(r));
    if (rc < 0) {
        /* A failure sticks: the next call repeats it. */
        dp_err again;
        CHECK(dp_tfrecord_next(r, &data, &len, &again) == -1 && strcmp(again.msg, err->msg) == 0);
        n = -1;
    } else {
        CHECK(dp_tfrecord_next(r, &data, &len, err) == 0); /* and the end stays the end */
    }
    dp_tfrecord_close(r);
    return n;
}

/* The framing, built here from the format: "123456789" as one record. */
static void test_known_bytes(void)
{
    uint8_t want[12 + 9 + 4];
    memset(want, 0, 8);
    want[0] = 9;
    uint32_t lc = dp_crc32c(0, want, 8), dc = 0xE3069283u; /* crc32c.h's check value */
    lc = ((lc >> 15) | (lc << 17)) + 0xa282ead8u;
    dc = ((dc >> 15) | (dc << 17)) + 0xa282ead8u;
    for (int i = 0; i < 4; i++) {
        want[8 + i] = (uint8_t)(lc >> (8 * i));
        want[21 + i] = (uint8_t)(dc >> (8 * i));
    }
    memcpy(want + 12, "123456789", 9);
    CHECK(dp_tfrecord_masked_crc("123456789", 9) == dc);
    char path[1200];
    path_of(path, sizeof path, "known.tfrecord");
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_AUTO, &err) == 0);
    REQUIRE(dp_tfrecord_write(w, "123456789", 9, &err) == 0);
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
    size_t n;
    uint8_t *got = read_bytes(path, &n);
    CHECK(n == sizeof want && memcmp(got, want, n) == 0);
    free(got);
}

static void test_round_trip(void)
{
    dp_err err;
    char raw[1200], gz[1200], gz2[1200];
    path_of(raw, sizeof raw, "rt.tfrecord");
    path_of(gz, sizeof gz, "rt.tfrecord.gz");
    path_of(gz2, sizeof gz2, "rt-gzip.tfrecord");
    write_records(raw, DP_TFRECORD_AUTO);
    write_records(gz, DP_TFRECORD_AUTO);     /* gzip by the name */
    write_records(gz2, DP_TFRECORD_GZIP);    /* gzip by the option */
    size_t n;
    uint8_t *b = read_bytes(gz, &n);
    CHECK(n > 2 && b[0] == 0x1f && b[1] == 0x8b);
    free(b);
    b = read_bytes(gz2, &n);
    CHECK(n > 2 && b[0] == 0x1f && b[1] == 0x8b);
    free(b);
    /* The gzip file is plain gzip of the raw framing, as TensorFlow's is. */
    size_t rn;
    uint8_t *rb = read_bytes(raw, &rn);
    gzFile g = gzopen(gz, "rb");
    REQUIRE(g);
    uint8_t *inflated = malloc(rn + 1);
    REQUIRE(inflated);
    CHECK(gzread(g, inflated, (unsigned)rn + 1) == (int)rn && memcmp(inflated, rb, rn) == 0);
    gzclose(g);
    free(inflated);
    free(rb);

    const char *paths[3] = {raw, gz, gz2};
    for (int i = 0; i < 3; i++) {
        CHECKF(read_all(paths[i], NULL, 1, &err) == NREC, "%s: %s", paths[i], err.msg);
        dp_tfrecord_reader *r;
        REQUIRE(dp_tfrecord_open(&r, paths[i], NULL, &err) == 0);
        CHECK(dp_tfrecord_is_gzip(r) == (i > 0));
        dp_tfrecord_close(r);
    }
    dp_tfrecord_options gzip = {DP_TFRECORD_GZIP, 0}, rawopt = {DP_TFRECORD_RAW, 0};
    CHECKF(read_all(gz2, &gzip, 1, &err) == NREC, "%s", err.msg);
    /* A raw file read as gzip is refused, not passed through as zlib would. */
    CHECK(read_all(raw, &gzip, 0, &err) == -1 && strstr(err.msg, raw) &&
          strstr(err.msg, "not a gzip file"));
    /* gzip read as raw: the first "length" fails its CRC. */
    CHECK(read_all(gz, &rawopt, 0, &err) == -1 && strstr(err.msg, gz) &&
          strstr(err.msg, "record 0 (byte 0): length CRC mismatch"));
    /* An empty file has no records; so has an empty gzip stream. */
    char empty[1200];
    path_of(empty, sizeof empty, "empty.tfrecord.gz");
    dp_tfrecord_writer *w;
    REQUIRE(dp_tfrecord_writer_open(&w, empty, DP_TFRECORD_AUTO, &err) == 0);
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
    CHECKF(read_all(empty, NULL, 0, &err) == 0, "%s", err.msg);
    write_bytes(empty, "", 0);
    CHECKF(read_all(empty, NULL, 0, &err) == 0, "%s", err.msg);
}

/* Byte offsets of each record's start in the raw file, and the end. */
static void record_starts(size_t *at)
{
    at[0] = 0;
    for (int i = 0; i < NREC; i++)
        at[i + 1] = at[i] + 12 + rec_len[i] + 4;
}

static void test_flips(void)
{
    char raw[1200], bad[1200];
    path_of(raw, sizeof raw, "flip.tfrecord");
    path_of(bad, sizeof bad, "mnist-train.tfrecord-00003-of-00008");
    write_records(raw, DP_TFRECORD_RAW);
    size_t n;
    uint8_t *b = read_bytes(raw, &n);
    size_t at[NREC + 1];
    record_starts(at);
    REQUIRE(n == at[NREC]);
    dp_err err;
    /* One byte in each field of record 2. */
    const struct { size_t off; const char *what; } cases[] = {
        {0, "length CRC mismatch"},          /* the length */
        {7, "length CRC mismatch"},
        {9, "length CRC mismatch"},          /* the length's CRC */
        {12, "data CRC mismatch"},           /* the data */
        {12 + 12, "data CRC mismatch"},
        {12 + 13 + 1, "data CRC mismatch"},  /* the data's CRC */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        b[at[2] + cases[c].off] ^= 0x20;
        write_bytes(bad, b, n);
        b[at[2] + cases[c].off] ^= 0x20;
        char want[64];
        snprintf(want, sizeof want, "record 2 (byte %zu): %s", at[2], cases[c].what);
        CHECKF(read_all(bad, NULL, 1, &err) == -1 && strstr(err.msg, bad) && strstr(err.msg, want),
               "flip at +%zu: %s", cases[c].off, err.msg);
    }
    /* The message in full, once. */
    b[at[2] + 12] ^= 1;
    write_bytes(bad, b, n);
    b[at[2] + 12] ^= 1;
    CHECK(read_all(bad, NULL, 0, &err) == -1);
    fprintf(stderr, "a flipped data byte: %s\n", err.msg);
    /* Every byte of the small records (0..2, and 4's head) flipped: all refused. */
    size_t refused = 0, tried = 0;
    for (size_t off = 0; off < at[3] + 12; off++) {
        for (int bit = 0; bit < 8; bit += 7) {
            b[off] ^= (uint8_t)(1u << bit);
            write_bytes(bad, b, n);
            b[off] ^= (uint8_t)(1u << bit);
            tried++;
            int k = 0;
            while (k < NREC && at[k + 1] <= off)
                k++;
            char want[32];
            snprintf(want, sizeof want, "record %d ", k);
            if (read_all(bad, NULL, 0, &err) == -1 && strstr(err.msg, want) &&
                strstr(err.msg, "CRC mismatch"))
                refused++;
            else
                fprintf(stderr, "flip of bit %d at %zu: %s\n", bit, off, err.msg);
        }
    }
    CHECKF(refused == tried, "%zu of %zu flips refused", refused, tried);
    free(b);
}

static void test_truncation(void)
{
    char raw[1200], cut[1200], gz[1200];
    path_of(raw, sizeof raw, "cut.tfrecord");
    path_of(cut, sizeof cut, "cut-part.tfrecord");
    path_of(gz, sizeof gz, "cut.tfrecord.gz");
    write_records(raw, DP_TFRECORD_RAW);
    size_t n;
    uint8_t *b = read_bytes(raw, &n);
    size_t at[NREC + 1];
    record_starts(at);
    dp_err err;
    /* Every cut within and around the first four records, and a few in the big ones. */
    size_t cuts[400], ncut = 0;
    for (size_t off = 0; off <= at[3] + 20; off++)
        cuts[ncut++] = off;
    const size_t far[] = {at[4] - 1, at[4] - 4, at[4] - 5, at[4] + 11, at[5] + 12 + 65536,
                          at[NREC] - 1, at[NREC]};
    for (size_t i = 0; i < sizeof far / sizeof far[0]; i++)
        cuts[ncut++] = far[i];
    for (size_t c = 0; c < ncut; c++) {
        size_t off = cuts[c];
        write_bytes(cut, b, off);
        int k = 0;
        while (k < NREC && at[k + 1] <= off)
            k++;
        long got = read_all(cut, NULL, 1, &err);
        if (off == at[k]) {
            CHECKF(got == k, "cut at boundary %zu: %ld records (%s)", off, got,
                   got < 0 ? err.msg : "");
        } else {
            char want[64];
            snprintf(want, sizeof want, "record %d (byte %zu): truncated", k, at[k]);
            CHECKF(got == -1 && strstr(err.msg, cut) && strstr(err.msg, want), "cut at %zu: %s",
                   off, got < 0 ? err.msg : "accepted");
        }
    }
    write_bytes(cut, b, at[1] + 5);
    read_all(cut, NULL, 0, &err);
    fprintf(stderr, "a cut record: %s\n", err.msg);

    /* gzip: any cut loses the stream's end, and is refused. */
    write_records(gz, DP_TFRECORD_GZIP);
    uint8_t *g = read_bytes(gz, &n);
    size_t gcuts[] = {2, 10, 11, 30, n / 3, n / 2, n - 9, n - 8, n - 1};
    for (size_t c = 0; c < sizeof gcuts / sizeof gcuts[0]; c++) {
        write_bytes(cut, g, gcuts[c]);
        long got = read_all(cut, NULL, 0, &err);
        CHECKF(got == -1 && strstr(err.msg, cut) && strstr(err.msg, "record "),
               "gzip cut at %zu of %zu: %s", gcuts[c], n, got < 0 ? err.msg : "accepted");
    }
    write_bytes(cut, g, n / 2);
    read_all(cut, NULL, 0, &err);
    fprintf(stderr, "a cut gzip file: %s\n", err.msg);
    /* Two gzip members (TensorFlow appending to a file) read as one stream. */
    uint8_t *two = malloc(2 * n);
    REQUIRE(two);
    memcpy(two, g, n);
    memcpy(two + n, g, n);
    write_bytes(cut, two, 2 * n);
    CHECKF(read_all(cut, NULL, 0, &err) == 2 * NREC, "%s", err.msg);
    free(two);
    free(g);
    free(b);
}

/* A record head claiming len bytes, its CRC correct. */
static void put_head(uint8_t *h, uint64_t len)
{
    for (int i = 0; i < 8; i++)
        h[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = dp_tfrecord_masked_crc(h, 8);
    for (int i = 0; i < 4; i++)
        h[8 + i] = (uint8_t)(c >> (8 * i));
}

static void test_lengths(void)
{
    char raw[1200], bad[1200];
    path_of(raw, sizeof raw, "len.tfrecord");
    path_of(bad, sizeof bad, "len-bad.tfrecord");
    write_records(raw, DP_TFRECORD_RAW);
    size_t n;
    uint8_t *b = read_bytes(raw, &n);
    size_t at[NREC + 1];
    record_starts(at);
    dp_err err;
    /* A wrong length with a matching CRC (a writer's bug, not a flipped bit):
     * one byte too long or too short, the data's CRC no longer matches. */
    for (int d = -1; d <= 1; d += 2) {
        put_head(b + at[2], rec_len[2] + (uint64_t)(int64_t)d);
        write_bytes(bad, b, n);
        CHECKF(read_all(bad, NULL, 0, &err) == -1 && strstr(err.msg, "record 2 ") &&
               strstr(err.msg, "data CRC mismatch"), "length %+d: %s", d, err.msg);
    }
    put_head(b + at[2], rec_len[2]);
    /* A length above the limit is refused from the head alone: the file
     * holds 20 bytes, the head asks for 2^62 (or 2 GiB, or just past 64 MiB). */
    const uint64_t huge[] = {(uint64_t)1 << 62, (uint64_t)1 << 31, DP_TFRECORD_MAX_RECORD + 1,
                             UINT64_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        uint8_t h[20] = {0};
        put_head(h, huge[i]);
        write_bytes(bad, h, sizeof h);
        char want[96];
        snprintf(want, sizeof want, "record 0 (byte 0): length %llu is above the limit",
                 (unsigned long long)huge[i]);
        CHECKF(read_all(bad, NULL, 0, &err) == -1 && strstr(err.msg, bad) && strstr(err.msg, want),
               "%s", err.msg);
    }
    /* The limit is the caller's: 13 bytes pass a limit of 13, not one of 12. */
    dp_tfrecord_options lim = {DP_TFRECORD_AUTO, 13};
    write_bytes(bad, b, at[4]); /* records 0..3; 3 is 100000 bytes */
    CHECK(read_all(bad, &lim, 1, &err) == -1 && strstr(err.msg, "record 3 ") &&
          strstr(err.msg, "length 100000 is above the limit of 13 bytes"));
    write_bytes(bad, b, at[3]);
    CHECKF(read_all(bad, &lim, 1, &err) == 3, "%s", err.msg);
    lim.max_record = 12;
    CHECK(read_all(bad, &lim, 1, &err) == -1 && strstr(err.msg, "record 2 "));
    /* A length under the limit but past the file's end: truncated, after
     * reading only what is there. */
    uint8_t h[40] = {0};
    put_head(h, (uint64_t)60 << 20);
    write_bytes(bad, h, sizeof h);
    CHECK(read_all(bad, NULL, 0, &err) == -1 &&
          strstr(err.msg, "truncated: length 62914560 but the file ends after 28 bytes"));
    free(b);
}

static void test_paths(void)
{
    dp_err err;
    dp_tfrecord_reader *r = (dp_tfrecord_reader *)&err;
    char missing[1200];
    path_of(missing, sizeof missing, "missing.tfrecord");
    CHECK(dp_tfrecord_open(&r, missing, NULL, &err) == -1 && r == NULL &&
          strstr(err.msg, missing) && strstr(err.msg, "No such file"));
    dp_tfrecord_writer *w = (dp_tfrecord_writer *)&err;
    char nodir[1200];
    path_of(nodir, sizeof nodir, "no/such/dir/x.tfrecord");
    CHECK(dp_tfrecord_writer_open(&w, nodir, DP_TFRECORD_AUTO, &err) == -1 && w == NULL);
    /* An aborted writer leaves no file; a closed one replaces the old file. */
    char p[1200];
    path_of(p, sizeof p, "aborted.tfrecord");
    REQUIRE(dp_tfrecord_writer_open(&w, p, DP_TFRECORD_AUTO, &err) == 0);
    REQUIRE(dp_tfrecord_write(w, "x", 1, &err) == 0);
    dp_tfrecord_writer_abort(w);
    CHECK(access(p, F_OK) != 0);
    dp_tfrecord_close(NULL);
    dp_tfrecord_writer_abort(NULL);
    CHECK(dp_tfrecord_writer_close(NULL, &err) == 0);
}

int main(void)
{
    scratch_make(dir, sizeof dir, "test_tfrecord");
    test_known_bytes();
    test_round_trip();
    test_flips();
    test_truncation();
    test_lengths();
    test_paths();
    if (!check_failures)
        scratch_remove(dir);
    return CHECK_DONE();
}
