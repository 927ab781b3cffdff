/* IDX reader: raw or gzip, every header field checked before it is trusted.
 *
 * One streaming path serves both encodings: the header is read first, the
 * data buffer grows only as bytes actually arrive (so a small file claiming
 * a huge shape never causes a huge allocation), and one extra byte is asked
 * for at the end to catch trailing data.  Raw regular files are additionally
 * checked against their size before any allocation, for an exact message. */
#include "downpour/idx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Largest decoded IDX file we accept (MNIST's largest is 47 MB). */
#define IDX_MAX_BYTES ((uint64_t)1 << 31)
/* Read granularity and first allocation for streamed data. */
#define IDX_CHUNK ((size_t)1 << 24)

typedef struct idx_src {
    const char *path;
    int fd;     /* raw reads */
    gzFile gz;  /* gzip reads, NULL for raw */
} idx_src;

static const char *type_name(uint8_t t)
{
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
    }
}

/* zlib's message without the "<fd:N>: " prefix gzdopen streams carry. */
static const char *gz_msg(gzFile gz, int *zerr)
{
    const char *m = gzerror(gz, zerr);
    const char *colon = m[0] == '<' ? strstr(m, ">: ") : NULL;
    return colon ? colon + 3 : m;
}

/* Reads up to n bytes; returns the count (short only at end of input) or -1. */
static long long src_read(idx_src *s, void *buf, size_t n, dp_err *err)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < n) {
        size_t want = n - got;
        if (want > IDX_CHUNK)
            want = IDX_CHUNK;
        if (s->gz) {
            int r = gzread(s->gz, p + got, (unsigned)want);
            if (r < 0) {
                int zerr;
                const char *m = gz_msg(s->gz, &zerr);
                if (zerr == Z_ERRNO)
                    return dp_errf(err, "%s: read error: %s", s->path, strerror(errno));
                return dp_errf(err, "%s: corrupt gzip data (zlib: %s)", s->path, m);
            }
            if (r == 0) {
                int zerr;
                const char *m = gz_msg(s->gz, &zerr);
                /* A stream cut short ends with Z_BUF_ERROR ("unexpected end of file"). */
                if (zerr == Z_BUF_ERROR)
                    return dp_errf(err, "%s: truncated gzip stream (zlib: %s)", s->path, m);
                if (zerr != Z_OK)
                    return dp_errf(err, "%s: corrupt gzip data (zlib: %s)", s->path, m);
                break;
            }
            got += (size_t)r;
        } else {
            ssize_t r = read(s->fd, p + got, want);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                return dp_errf(err, "%s: read error: %s", s->path, strerror(errno));
            }
            if (r == 0)
                break;
            got += (size_t)r;
        }
    }
    return (long long)got;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads and checks the header; fills out->ndim, out->dims and *total. */
static int read_header(idx_src *s, dp_idx *out, uint64_t *total, dp_err *err)
{
    uint8_t h[4 + 4 * 4];
    long long r = src_read(s, h, 4, err);
    if (r < 0)
        return -1;
    if (r < 4)
        return dp_errf(err, "%s: truncated header (%lld bytes, an IDX header needs at least 8)",
                       s->path, r);
    if (h[0] != 0 || h[1] != 0)
        return dp_errf(err,
                       "%s: not an IDX file (magic %02x %02x %02x %02x, expected 00 00 08 <ndim>)",
                       s->path, h[0], h[1], h[2], h[3]);
    if (h[2] != 0x08)
        return dp_errf(err, "%s: IDX element type 0x%02X (%s) is not supported; only unsigned "
                       "bytes (0x08) are", s->path, h[2], type_name(h[2]));
    int ndim = h[3];
    if (ndim < 1 || ndim > 4)
        return dp_errf(err, "%s: IDX rank %d is out of range (1..4)", s->path, ndim);
    size_t want = 4 * (size_t)ndim;
    r = src_read(s, h + 4, want, err);
    if (r < 0)
        return -1;
    if ((size_t)r < want)
        return dp_errf(err, "%s: truncated header (%lld bytes, a rank-%d IDX header needs %zu)",
                       s->path, 4 + r, ndim, 4 + want);
    uint64_t n = 1;
    int too_big = 0;
    char shape[64];
    int sl = 0;
    out->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        uint32_t d = be32(h + 4 + 4 * i);
        out->dims[i] = d;
        sl += snprintf(shape + sl, sizeof shape - (size_t)sl, "%s%u", i ? " x " : "", d);
        if (d == 0)
            return dp_errf(err, "%s: dimension %d is 0", s->path, i);
        /* Once past the limit n stays clamped; below it, n < 2^32 so n * d fits. */
        if (!too_big) {
            n *= d;
            if (n > IDX_MAX_BYTES)
                too_big = 1;
        }
    }
    if (too_big)
        return dp_errf(err, "%s: header claims shape %s, more than the %llu-byte limit",
                       s->path, shape, (unsigned long long)IDX_MAX_BYTES);
    *total = n;
    return 0;
}

/* Streams exactly `total` bytes of data into a buffer that grows as data arrives. */
static int read_data(idx_src *s, dp_idx *out, uint64_t total, long hdr_len, dp_err *err)
{
    size_t cap = total < IDX_CHUNK ? (size_t)total : IDX_CHUNK;
    size_t len = 0;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return dp_errf(err, "%s: out of memory for %zu bytes", s->path, cap);
    for (;;) {
        long long r = src_read(s, buf + len, cap - len, err);
        if (r < 0)
            goto fail;
        len += (size_t)r;
        if (len < cap) {
            dp_errf(err, "%s: truncated (expected %llu bytes of data after the %ld-byte header, "
                    "found %zu)", s->path, (unsigned long long)total, hdr_len, len);
            goto fail;
        }
        if (len == total)
            break;
        size_t ncap = cap * 2 < total ? cap * 2 : (size_t)total;
        uint8_t *nb = realloc(buf, ncap);
        if (!nb) {
            dp_errf(err, "%s: out of memory for %zu bytes", s->path, ncap);
            goto fail;
        }
        buf = nb;
        cap = ncap;
    }
    uint8_t extra;
    long long r = src_read(s, &extra, 1, err);
    if (r < 0)
        goto fail;
    if (r > 0) {
        dp_errf(err, "%s: trailing bytes after the %llu bytes of data the header describes",
                s->path, (unsigned long long)total);
        goto fail;
    }
    out->data = buf;
    out->len = len;
    return 0;
fail:
    free(buf);
    return -1;
}

int dp_idx_read(const char *path, dp_idx *out, dp_err *err)
{
    memset(out, 0, sizeof *out);
    idx_src s = {.path = path, .fd = -1, .gz = NULL};
    int rc = -1;
    s.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s.fd < 0)
        return dp_errf(err, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(s.fd, &st) != 0) {
        dp_errf(err, "cannot stat %s: %s", path, strerror(errno));
        goto done;
    }
    if (S_ISDIR(st.st_mode)) {
        dp_errf(err, "%s: is a directory, not an IDX file", path);
        goto done;
    }
    uint8_t magic[2];
    long long r = src_read(&s, magic, 2, err);
    if (r < 0)
        goto done;
    if (lseek(s.fd, 0, SEEK_SET) != 0) {
        dp_errf(err, "%s: cannot seek: %s", path, strerror(errno));
        goto done;
    }
    int gz = r == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (gz) {
        int fd2 = dup(s.fd);
        if (fd2 < 0) {
            dp_errf(err, "%s: dup: %s", path, strerror(errno));
            goto done;
        }
        s.gz = gzdopen(fd2, "rb");
        if (!s.gz) {
            close(fd2);
            dp_errf(err, "%s: cannot start gzip decoding (out of memory)", path);
            goto done;
        }
        gzbuffer(s.gz, 1u << 17);
    }
    uint64_t total = 0;
    if (read_header(&s, out, &total, err) != 0)
        goto done;
    long hdr_len = 4 + 4L * out->ndim;
    if (!gz && S_ISREG(st.st_mode)) {
        uint64_t have = st.st_size > hdr_len ? (uint64_t)st.st_size - (uint64_t)hdr_len : 0;
        if (have < total) {
            dp_errf(err, "%s: truncated (expected %llu bytes of data after the %ld-byte header, "
                    "found %llu)", path, (unsigned long long)total, hdr_len,
                    (unsigned long long)have);
            goto done;
        }
        if (have > total) {
            dp_errf(err, "%s: trailing bytes (%llu bytes of data, the header describes %llu)",
                    path, (unsigned long long)have, (unsigned long long)total);
            goto done;
        }
    }
    if (read_data(&s, out, total, hdr_len, err) != 0)
        goto done;
    rc = 0;
done:
    if (s.gz) {
        int zr = gzclose_r(s.gz);
        if (rc == 0 && zr != Z_OK) {
            rc = dp_errf(err, "%s: gzip stream did not end cleanly (zlib error %d)", path, zr);
        }
    }
    close(s.fd);
    if (rc != 0) {
        dp_idx_free(out);
    }
    return rc;
}

void dp_idx_free(dp_idx *idx)
{
    if (!idx)
        return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
