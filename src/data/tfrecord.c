/* TFRecord reader and writer (tfrecord.h).
 *
 * Reader: one byte source (read(2) on a raw file, zlib's gzread on a gzip
 * one) fills a fixed 64 KiB buffer; records are taken from it into a record
 * buffer that grows to the largest record seen, never past the limit, and
 * only as the record's bytes actually arrive, so a length that passed its CRC
 * but lies about the file still allocates no more than the file holds.
 *
 * Writer: records are framed into a 64 KiB buffer that is written out raw, or
 * deflated with zlib's gzip wrapper (windowBits 16 + 15), into the temporary
 * file of an atomic replace (file.h). */
#include "downpour/tfrecord.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "downpour/crc32c.h"
#include "downpour/file.h"

#define HEAD 12 /* length + its CRC */
#define TAIL 4  /* the data's CRC */
#define IO_BUF ((size_t)64 << 10)
/* The record buffer grows by at most this much per step while data arrives. */
#define GROW_STEP ((size_t)1 << 20)

enum { ST_OK, ST_END, ST_FAILED };

struct dp_tfrecord_reader {
    char *path;
    int fd;
    gzFile gz;        /* NULL: raw */
    size_t max_record;
    uint8_t *io;      /* IO_BUF bytes; io[pos..have) not yet consumed */
    size_t pos, have;
    int eof;          /* the source returned 0 */
    uint8_t *rec;     /* the current record's data */
    size_t rec_cap;
    uint64_t index;   /* records returned */
    uint64_t offset;  /* stream bytes consumed */
    int state;
    dp_err failure;   /* repeated by every call after a failure */
};

uint32_t dp_tfrecord_masked_crc(const void *buf, size_t len)
{
    uint32_t c = dp_crc32c(0, buf, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* zlib's message without the "<fd:N>: " prefix gzdopen streams carry. */
static const char *gz_msg(gzFile gz, int *zerr)
{
    const char *m = gzerror(gz, zerr);
    const char *colon = m[0] == '<' ? strstr(m, ">: ") : NULL;
    return colon ? colon + 3 : m;
}

/* Refills r->io (keeping nothing: called only when it is used up).  Returns
 * the bytes now available (0 at end of input) or -1.  Messages here and in
 * take and take_data leave out the file and record; next puts them in front. */
static long fill(dp_tfrecord_reader *r, dp_err *err)
{
    r->pos = r->have = 0;
    if (r->eof)
        return 0;
    for (;;) {
        long n;
        if (r->gz) {
            int g = gzread(r->gz, r->io, (unsigned)IO_BUF);
            if (g <= 0) {
                int zerr;
                const char *m = gz_msg(r->gz, &zerr);
                if (g < 0 && zerr == Z_ERRNO)
                    return dp_errf(err, "read error: %s", strerror(errno));
                /* A stream cut short ends with Z_BUF_ERROR ("unexpected end of file"). */
                if (zerr == Z_BUF_ERROR)
                    return dp_errf(err, "truncated gzip stream (zlib: %s)", m);
                if (g < 0 || zerr != Z_OK)
                    return dp_errf(err, "corrupt gzip data (zlib: %s)", m);
            }
            n = g;
        } else {
            ssize_t s = read(r->fd, r->io, IO_BUF);
            if (s < 0) {
                if (errno == EINTR)
                    continue;
                return dp_errf(err, "read error: %s", strerror(errno));
            }
            n = (long)s;
        }
        if (n == 0)
            r->eof = 1;
        r->have = (size_t)n;
        return n;
    }
}

/* Copies up to n stream bytes to dst; returns the count (short only at the
 * end of input) or -1. */
static long long take(dp_tfrecord_reader *r, uint8_t *dst, size_t n, dp_err *err)
{
    size_t got = 0;
    while (got < n) {
        if (r->pos == r->have) {
            long f = fill(r, err);
            if (f < 0)
                return -1;
            if (f == 0)
                break;
        }
        size_t k = r->have - r->pos;
        if (k > n - got)
            k = n - got;
        memcpy(dst + got, r->io + r->pos, k);
        r->pos += k;
        got += k;
    }
    r->offset += got;
    return (long long)got;
}

/* Reads the len bytes of a record's data into r->rec, growing it only as
 * bytes arrive.  Returns the count read (short at end of input) or -1. */
static long long take_data(dp_tfrecord_reader *r, size_t len, dp_err *err)
{
    size_t got = 0;
    while (got < len) {
        if (r->rec_cap == got) {
            /* Double, by at most GROW_STEP, never past len. */
            size_t want = r->rec_cap ? 2 * r->rec_cap : 4096;
            if (want - got > GROW_STEP)
                want = got + GROW_STEP;
            if (want > len)
                want = len;
            uint8_t *nb = realloc(r->rec, want);
            if (!nb)
                return dp_errf(err, "out of memory for a %zu-byte record", len);
            r->rec = nb;
            r->rec_cap = want;
        }
        size_t step = r->rec_cap - got;
        if (step > len - got)
            step = len - got;
        long long k = take(r, r->rec + got, step, err);
        if (k < 0)
            return -1;
        got += (size_t)k;
        if ((size_t)k < step)
            break;
    }
    return (long long)got;
}

static int open_source(dp_tfrecord_reader *r, dp_tfrecord_compression c, dp_err *err)
{
    if (c == DP_TFRECORD_AUTO) {
        uint8_t h[HEAD];
        ssize_t n;
        size_t got = 0;
        while (got < HEAD && (n = pread(r->fd, h + got, HEAD - got, (off_t)got)) != 0) {
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                /* Not seekable (a pipe): peeking would consume the bytes, so
                 * AUTO reads it as raw; pass GZIP for a gzip pipe. */
                if (errno == ESPIPE)
                    break;
                return dp_errf(err, "%s: read error: %s", r->path, strerror(errno));
            }
            got += (size_t)n;
        }
        c = DP_TFRECORD_RAW;
        if (got >= 2 && h[0] == 0x1f && h[1] == 0x8b &&
            !(got == HEAD && (uint32_t)get_le(h + 8, 4) == dp_tfrecord_masked_crc(h, 8)))
            c = DP_TFRECORD_GZIP;
    } else if (c == DP_TFRECORD_GZIP) {
        /* zlib would pass a file without the magic through as it is. */
        uint8_t m[2];
        ssize_t n;
        while ((n = pread(r->fd, m, 2, 0)) < 0 && errno == EINTR)
            ;
        if (n == 2 && (m[0] != 0x1f || m[1] != 0x8b))
            return dp_errf(err, "%s: not a gzip file (starts %02x %02x, gzip starts 1f 8b)",
                           r->path, m[0], m[1]);
    }
    if (c == DP_TFRECORD_GZIP) {
        r->gz = gzdopen(r->fd, "rb");
        if (!r->gz)
            return dp_errf(err, "%s: cannot start reading gzip: out of memory", r->path);
        r->fd = -1; /* gzclose closes it */
        gzbuffer(r->gz, (unsigned)IO_BUF);
    }
    return 0;
}

int dp_tfrecord_open(dp_tfrecord_reader **out, const char *path,
                     const dp_tfrecord_options *opt, dp_err *err)
{
    *out = NULL;
    dp_tfrecord_options o = {DP_TFRECORD_AUTO, 0};
    if (opt)
        o = *opt;
    if ((unsigned)o.compression >= DP_TFRECORD_COMPRESSION_COUNT)
        return dp_errf(err, "%s: unknown compression %d", path, (int)o.compression);
    dp_tfrecord_reader *r = calloc(1, sizeof *r);
    if (!r)
        return dp_errf(err, "%s: out of memory", path);
    r->fd = -1;
    r->max_record = o.max_record ? o.max_record : DP_TFRECORD_MAX_RECORD;
    r->path = strdup(path);
    r->io = malloc(IO_BUF);
    if (!r->path || !r->io) {
        dp_errf(err, "%s: out of memory", path);
        goto fail;
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        dp_errf(err, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (open_source(r, o.compression, err) < 0)
        goto fail;
    *out = r;
    return 0;
fail:
    dp_tfrecord_close(r);
    return -1;
}

/* Records the failure so that later calls repeat it. */
static int fail_with(dp_tfrecord_reader *r, dp_err *err, const dp_err *e)
{
    r->state = ST_FAILED;
    r->failure = *e;
    if (err)
        *err = *e;
    return -1;
}

int dp_tfrecord_next(dp_tfrecord_reader *r, const uint8_t **data, size_t *len, dp_err *err)
{
    *data = NULL;
    *len = 0;
    if (r->state == ST_END)
        return 0;
    if (r->state == ST_FAILED) {
        if (err)
            *err = r->failure;
        return -1;
    }
    dp_err e;
    unsigned long long idx = (unsigned long long)r->index;
    unsigned long long at = (unsigned long long)r->offset;
#define REFUSE(...)                                                           \
    do {                                                                      \
        dp_errf(&e, __VA_ARGS__);                                             \
        dp_err_prefix(&e, "%s: record %llu (byte %llu)", r->path, idx, at);   \
        return fail_with(r, err, &e);                                         \
    } while (0)
#define PASS_ON()                                                             \
    do {                                                                      \
        dp_err_prefix(&e, "%s: record %llu (byte %llu)", r->path, idx, at);   \
        return fail_with(r, err, &e);                                         \
    } while (0)
    uint8_t h[HEAD];
    long long n = take(r, h, HEAD, &e);
    if (n < 0)
        PASS_ON();
    if (n == 0) {
        r->state = ST_END;
        return 0;
    }
    if (n < HEAD)
        REFUSE("truncated: the file ends %lld bytes into the record's %d-byte head", n, HEAD);
    uint32_t stored = (uint32_t)get_le(h + 8, 4), computed = dp_tfrecord_masked_crc(h, 8);
    if (stored != computed)
        REFUSE("length CRC mismatch (stored 0x%08x, computed 0x%08x): the length field is "
               "damaged", stored, computed);
    uint64_t l = get_le(h, 8);
    if (l > r->max_record)
        REFUSE("length %llu is above the limit of %zu bytes per record",
               (unsigned long long)l, r->max_record);
    n = take_data(r, (size_t)l, &e);
    if (n < 0)
        PASS_ON();
    if ((uint64_t)n < l)
        REFUSE("truncated: length %llu but the file ends after %lld bytes of data",
               (unsigned long long)l, n);
    uint8_t t[TAIL];
    n = take(r, t, TAIL, &e);
    if (n < 0)
        PASS_ON();
    if (n < TAIL)
        REFUSE("truncated: the file ends %lld bytes into the data's %d-byte CRC", n, TAIL);
    stored = (uint32_t)get_le(t, 4);
    computed = dp_tfrecord_masked_crc(r->rec, (size_t)l);
    if (stored != computed)
        REFUSE("data CRC mismatch (stored 0x%08x, computed 0x%08x)", stored, computed);
#undef REFUSE
#undef PASS_ON
    r->index++;
    *data = l ? r->rec : (const uint8_t *)"";
    *len = (size_t)l;
    return 1;
}

uint64_t dp_tfrecord_count(const dp_tfrecord_reader *r)
{
    return r->index;
}

int dp_tfrecord_is_gzip(const dp_tfrecord_reader *r)
{
    return r->gz != NULL;
}

size_t dp_tfrecord_reader_bytes(const dp_tfrecord_reader *r)
{
    size_t n = sizeof *r + strlen(r->path) + 1 + IO_BUF + r->rec_cap;
    return r->gz ? n + DP_TFRECORD_GZIP_BYTES : n;
}

size_t dp_tfrecord_record_capacity(const dp_tfrecord_reader *r)
{
    return r->rec_cap;
}

void dp_tfrecord_set_max_record(dp_tfrecord_reader *r, size_t max_record)
{
    r->max_record = max_record ? max_record : DP_TFRECORD_MAX_RECORD;
}

void dp_tfrecord_close(dp_tfrecord_reader *r)
{
    if (!r)
        return;
    if (r->gz)
        gzclose(r->gz);
    if (r->fd >= 0)
        close(r->fd);
    free(r->rec);
    free(r->io);
    free(r->path);
    free(r);
}

/* ---- writer ---- */

struct dp_tfrecord_writer {
    dp_atomic_file af;
    int gzip;
    z_stream z;     /* when gzip */
    uint8_t *buf;   /* framed bytes not yet written (or deflated) */
    size_t used;
    uint8_t *zout;  /* deflate's output, IO_BUF bytes */
    int failed;     /* sticky */
    dp_err failure;
};

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Writes (raw) or deflates (gzip) n bytes; flush: Z_NO_FLUSH or Z_FINISH. */
static int emit(dp_tfrecord_writer *w, const uint8_t *p, size_t n, int flush, dp_err *err)
{
    if (!w->gzip) {
        if (n && dp_write_all(w->af.fd, p, n, err) < 0)
            return dp_err_prefix(err, "%s", w->af.path);
        return 0;
    }
    w->z.next_in = (Bytef *)p;
    w->z.avail_in = (uInt)n; /* n <= IO_BUF */
    for (;;) {
        w->z.next_out = w->zout;
        w->z.avail_out = (uInt)IO_BUF;
        int rc = deflate(&w->z, flush);
        if (rc == Z_STREAM_ERROR)
            return dp_errf(err, "%s: zlib deflate failed", w->af.path);
        size_t out = IO_BUF - w->z.avail_out;
        if (out && dp_write_all(w->af.fd, w->zout, out, err) < 0)
            return dp_err_prefix(err, "%s", w->af.path);
        if (flush == Z_FINISH ? rc == Z_STREAM_END : w->z.avail_in == 0 && w->z.avail_out != 0)
            return 0;
    }
}

static int flush_buf(dp_tfrecord_writer *w, dp_err *err)
{
    int rc = emit(w, w->buf, w->used, Z_NO_FLUSH, err);
    w->used = 0;
    return rc;
}

/* Appends n bytes to the buffer, emitting it whenever it fills. */
static int put(dp_tfrecord_writer *w, const uint8_t *p, size_t n, dp_err *err)
{
    while (n) {
        size_t k = IO_BUF - w->used;
        if (k > n)
            k = n;
        memcpy(w->buf + w->used, p, k);
        w->used += k;
        p += k;
        n -= k;
        if (w->used == IO_BUF && flush_buf(w, err) < 0)
            return -1;
    }
    return 0;
}

int dp_tfrecord_writer_open(dp_tfrecord_writer **out, const char *path,
                            dp_tfrecord_compression compression, dp_err *err)
{
    *out = NULL;
    if ((unsigned)compression >= DP_TFRECORD_COMPRESSION_COUNT)
        return dp_errf(err, "%s: unknown compression %d", path, (int)compression);
    dp_tfrecord_writer *w = calloc(1, sizeof *w);
    if (!w)
        return dp_errf(err, "%s: out of memory", path);
    w->af.fd = -1;
    w->gzip = compression == DP_TFRECORD_GZIP ||
              (compression == DP_TFRECORD_AUTO && ends_with(path, ".gz"));
    w->buf = malloc(IO_BUF);
    if (!w->buf) {
        free(w);
        return dp_errf(err, "%s: out of memory", path);
    }
    if (w->gzip) {
        w->zout = malloc(IO_BUF);
        /* windowBits 16 + 15: a gzip wrapper, as TensorFlow's GZIP option writes. */
        if (!w->zout || deflateInit2(&w->z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + 15, 8,
                                     Z_DEFAULT_STRATEGY) != Z_OK) {
            free(w->zout);
            free(w->buf);
            free(w);
            return dp_errf(err, "%s: cannot start gzip compression: out of memory", path);
        }
    }
    if (dp_atomic_open(&w->af, path, err) < 0) {
        if (w->gzip)
            deflateEnd(&w->z);
        free(w->zout);
        free(w->buf);
        free(w);
        return -1;
    }
    *out = w;
    return 0;
}

int dp_tfrecord_write(dp_tfrecord_writer *w, const void *data, size_t len, dp_err *err)
{
    if (w->failed) {
        if (err)
            *err = w->failure;
        return -1;
    }
    uint8_t h[HEAD], t[TAIL];
    put_le(h, (uint64_t)len, 8);
    put_le(h + 8, dp_tfrecord_masked_crc(h, 8), 4);
    put_le(t, dp_tfrecord_masked_crc(data, len), 4);
    dp_err local;
    if (!err)
        err = &local;
    if (put(w, h, HEAD, err) < 0 || put(w, data, len, err) < 0 || put(w, t, TAIL, err) < 0) {
        w->failed = 1;
        w->failure = *err;
        return -1;
    }
    return 0;
}

static void writer_free(dp_tfrecord_writer *w)
{
    if (w->gzip)
        deflateEnd(&w->z);
    free(w->zout);
    free(w->buf);
    free(w);
}

int dp_tfrecord_writer_close(dp_tfrecord_writer *w, dp_err *err)
{
    if (!w)
        return 0;
    int rc = 0;
    if (w->failed) {
        if (err)
            *err = w->failure;
        rc = -1;
    } else if (emit(w, w->buf, w->used, w->gzip ? Z_FINISH : Z_NO_FLUSH, err) < 0) {
        rc = -1;
    }
    if (rc == 0)
        rc = dp_atomic_commit(&w->af, err);
    else
        dp_atomic_abort(&w->af);
    writer_free(w);
    return rc;
}

void dp_tfrecord_writer_abort(dp_tfrecord_writer *w)
{
    if (!w)
        return;
    dp_atomic_abort(&w->af);
    writer_free(w);
}
