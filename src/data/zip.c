/* ZIP reader for .npz archives (the format and its checks are in zip.h).
 * Every offset and size read from the archive is checked against the file's
 * size, with overflow checks, before anything is read or allocated from it. */
#include "zip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define END_LEN 22
#define END64_LEN 56
#define LOC64_LEN 20
#define CENTRAL_LEN 46
#define LOCAL_LEN 30
/* Deflate's best ratio is 1032:1 (a 258-byte match in under 2 bits), so a
 * member that declares more than that of its compressed size is a lie. */
#define DEFLATE_MAX_RATIO 1032
#define ZIP_BUF ((size_t)64 << 10)

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Exactly n bytes at off, or -1 naming what was being read. */
static int pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                      const char *what, dp_err *err)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dp_errf(err, "%s: read error in the %s: %s", path, what, strerror(errno));
        }
        if (r == 0)
            return dp_errf(err, "%s: file ends inside the %s (offset %llu); was it truncated "
                           "or changed while open?", path, what,
                           (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}

void dp_zip_free(dp_zip *z)
{
    if (!z)
        return;
    for (size_t i = 0; i < z->n; i++)
        free(z->e[i].name);
    free(z->e);
    memset(z, 0, sizeof *z);
}

/* Finds the end record in the file's last 64 KiB + 22 bytes: the last
 * signature whose comment length reaches exactly to the end of the file. */
static int find_end(int fd, uint64_t file_size, const char *path, uint64_t *pos, uint8_t *rec,
                    dp_err *err)
{
    if (file_size < END_LEN)
        return dp_errf(err, "%s: %llu bytes is too short for a ZIP archive (an .npz needs at "
                       "least %d)", path, (unsigned long long)file_size, END_LEN);
    size_t tail = file_size < END_LEN + 65535 ? (size_t)file_size : END_LEN + 65535;
    uint8_t *buf = malloc(tail);
    if (!buf)
        return dp_errf(err, "%s: out of memory", path);
    if (pread_full(fd, buf, tail, file_size - tail, path, "ZIP end record", err) != 0) {
        free(buf);
        return -1;
    }
    for (size_t i = tail - END_LEN + 1; i-- > 0;) {
        if (le32(buf + i) == SIG_END && i + END_LEN + le16(buf + i + 20) == tail) {
            memcpy(rec, buf + i, END_LEN);
            *pos = file_size - tail + i;
            free(buf);
            return 0;
        }
    }
    free(buf);
    return dp_errf(err, "%s: no ZIP end-of-central-directory record (not an .npz archive, or "
                   "one cut short; re-save it with numpy.savez)", path);
}

/* Takes size, csize, local_off (and the disk number) from a ZIP64 extra
 * field where the 32-bit fields hold 0xFFFFFFFF (0xFFFF for the disk). */
static int read_zip64_extra(dp_zip_entry *e, const uint8_t *x, size_t xlen, uint32_t *disk,
                            const char *path, size_t idx, dp_err *err)
{
    int need_size = e->size == 0xFFFFFFFFu, need_csize = e->csize == 0xFFFFFFFFu;
    int need_off = e->local_off == 0xFFFFFFFFu, need_disk = *disk == 0xFFFFu;
    if (!need_size && !need_csize && !need_off && !need_disk)
        return 0;
    size_t at = 0;
    while (at + 4 <= xlen) {
        uint16_t id = le16(x + at), len = le16(x + at + 2);
        if (len > xlen - at - 4)
            break;
        if (id == 0x0001) {
            const uint8_t *f = x + at + 4;
            size_t k = 0;
            /* The fields present are exactly the ones marked, in this order. */
            if (need_size) {
                if (k + 8 > len)
                    goto short_field;
                e->size = le64(f + k);
                k += 8;
            }
            if (need_csize) {
                if (k + 8 > len)
                    goto short_field;
                e->csize = le64(f + k);
                k += 8;
            }
            if (need_off) {
                if (k + 8 > len)
                    goto short_field;
                e->local_off = le64(f + k);
                k += 8;
            }
            if (need_disk) {
                if (k + 4 > len)
                    goto short_field;
                *disk = le32(f + k);
            }
            return 0;
        }
        at += 4 + (size_t)len;
    }
    return dp_errf(err, "%s: central directory entry %zu (%s) marks its sizes as ZIP64 but has "
                   "no ZIP64 extra field", path, idx, e->name);
short_field:
    return dp_errf(err, "%s: central directory entry %zu (%s): ZIP64 extra field too short "
                   "for the values it must hold", path, idx, e->name);
}

int dp_zip_read_dir(dp_zip *z, int fd, uint64_t file_size, const char *path, dp_err *err)
{
    memset(z, 0, sizeof *z);
    uint8_t end[END_LEN] = {0};
    uint64_t end_pos = 0;
    if (find_end(fd, file_size, path, &end_pos, end, err) != 0)
        return -1;
    uint32_t disk = le16(end + 4), disk_cd = le16(end + 6);
    uint64_t n_disk = le16(end + 8), n_total = le16(end + 10);
    uint64_t cd_size = le32(end + 12), cd_off = le32(end + 16);
    uint64_t cd_end = end_pos; /* where the central directory must end */
    uint8_t loc[LOC64_LEN];
    if (end_pos >= LOC64_LEN) {
        if (pread_full(fd, loc, LOC64_LEN, end_pos - LOC64_LEN, path, "ZIP64 locator", err) != 0)
            return -1;
    }
    if (end_pos >= LOC64_LEN && le32(loc) == SIG_LOC64) {
        uint64_t off64 = le64(loc + 8);
        if (le32(loc + 4) != 0 || le32(loc + 16) != 1)
            return dp_errf(err, "%s: a multi-disk (split) ZIP archive is not supported; join "
                           "the parts into one file", path);
        if (off64 > end_pos - LOC64_LEN || end_pos - LOC64_LEN - off64 < END64_LEN)
            return dp_errf(err, "%s: ZIP64 locator points at offset %llu, outside the archive "
                           "before it (%llu)", path, (unsigned long long)off64,
                           (unsigned long long)(end_pos - LOC64_LEN));
        uint8_t e64[END64_LEN];
        if (pread_full(fd, e64, END64_LEN, off64, path, "ZIP64 end record", err) != 0)
            return -1;
        if (le32(e64) != SIG_END64)
            return dp_errf(err, "%s: no ZIP64 end record at offset %llu where the locator "
                           "points", path, (unsigned long long)off64);
        disk = le32(e64 + 16);
        disk_cd = le32(e64 + 20);
        n_disk = le64(e64 + 24);
        n_total = le64(e64 + 32);
        cd_size = le64(e64 + 40);
        cd_off = le64(e64 + 48);
        cd_end = off64;
    }
    if (disk != 0 || disk_cd != 0 || n_disk != n_total)
        return dp_errf(err, "%s: a multi-disk (split) ZIP archive is not supported; join the "
                       "parts into one file", path);
    if (cd_off > cd_end || cd_size != cd_end - cd_off)
        return dp_errf(err, "%s: the central directory (offset %llu, %llu bytes) does not end "
                       "where the end record begins (offset %llu); bytes prepended to the "
                       "archive, or a damaged one", path, (unsigned long long)cd_off,
                       (unsigned long long)cd_size, (unsigned long long)cd_end);
    if (cd_size > DP_ZIP_MAX_DIR)
        return dp_errf(err, "%s: central directory of %llu bytes is over the %llu-byte limit",
                       path, (unsigned long long)cd_size, (unsigned long long)DP_ZIP_MAX_DIR);
    if (n_total > cd_size / CENTRAL_LEN)
        return dp_errf(err, "%s: the end record claims %llu members, more than its %llu-byte "
                       "central directory can hold", path, (unsigned long long)n_total,
                       (unsigned long long)cd_size);
    uint8_t *cd = malloc(cd_size ? (size_t)cd_size : 1);
    z->e = calloc(n_total ? (size_t)n_total : 1, sizeof *z->e);
    if (!cd || !z->e) {
        free(cd);
        free(z->e);
        z->e = NULL;
        return dp_errf(err, "%s: out of memory for the central directory", path);
    }
    z->cd_off = cd_off;
    if (pread_full(fd, cd, (size_t)cd_size, cd_off, path, "central directory", err) != 0)
        goto fail;
    size_t at = 0;
    for (size_t i = 0; i < (size_t)n_total; i++) {
        if (cd_size - at < CENTRAL_LEN || le32(cd + at) != SIG_CENTRAL) {
            dp_errf(err, "%s: central directory entry %zu of %llu is missing or damaged (at "
                    "offset %llu)", path, i, (unsigned long long)n_total,
                    (unsigned long long)(cd_off + at));
            goto fail;
        }
        const uint8_t *h = cd + at;
        size_t nlen = le16(h + 28), xlen = le16(h + 30), clen = le16(h + 32);
        if (cd_size - at - CENTRAL_LEN < nlen + xlen + clen) {
            dp_errf(err, "%s: central directory entry %zu runs past the directory's end", path,
                    i);
            goto fail;
        }
        dp_zip_entry *e = &z->e[i];
        const uint8_t *name = h + CENTRAL_LEN;
        if (memchr(name, 0, nlen)) {
            dp_errf(err, "%s: central directory entry %zu has a NUL byte in its name", path, i);
            goto fail;
        }
        e->name = malloc(nlen + 1);
        if (!e->name) {
            dp_errf(err, "%s: out of memory", path);
            goto fail;
        }
        z->n = i + 1; /* so dp_zip_free frees this name from here on */
        memcpy(e->name, name, nlen);
        e->name[nlen] = '\0';
        e->flags = le16(h + 8);
        e->method = le16(h + 10);
        e->crc = le32(h + 16);
        e->csize = le32(h + 20);
        e->size = le32(h + 24);
        e->local_off = le32(h + 42);
        uint32_t start_disk = le16(h + 34);
        if (read_zip64_extra(e, name + nlen, xlen, &start_disk, path, i, err) != 0)
            goto fail;
        if (start_disk != 0) {
            dp_errf(err, "%s: member %s starts on disk %u: a multi-disk (split) ZIP archive is "
                    "not supported", path, e->name, start_disk);
            goto fail;
        }
        if (e->local_off >= cd_off || cd_off - e->local_off < LOCAL_LEN) {
            dp_errf(err, "%s: member %s: local header offset %llu is not inside the archive's "
                    "data (which ends at %llu)", path, e->name,
                    (unsigned long long)e->local_off, (unsigned long long)cd_off);
            goto fail;
        }
        at += CENTRAL_LEN + nlen + xlen + clen;
    }
    free(cd);
    return 0;
fail:
    free(cd);
    dp_zip_free(z);
    return -1;
}

/* Appends s to a comma-separated list in buf, ending it with "..." once
 * the next item would not fit (room for ", ..." is always kept). */
static void list_add(char *buf, size_t cap, const char *s)
{
    size_t len = strlen(buf);
    if (len >= 3 && strcmp(buf + len - 3, "...") == 0)
        return;
    size_t need = (len ? 2 : 0) + strlen(s);
    if (len + need + 6 <= cap)
        snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", s);
    else
        snprintf(buf + len, cap - len, "%s...", len ? ", " : "");
}

const dp_zip_entry *dp_zip_find(const dp_zip *z, const char *name, const char *path, dp_err *err)
{
    /* Exact name first; then with numpy's ".npy" suffix. */
    for (int pass = 0; pass < 2; pass++) {
        const dp_zip_entry *hit = NULL;
        size_t nl = strlen(name);
        for (size_t i = 0; i < z->n; i++) {
            const char *en = z->e[i].name;
            int match = pass == 0 ? strcmp(en, name) == 0
                                  : strncmp(en, name, nl) == 0 && strcmp(en + nl, ".npy") == 0;
            if (!match)
                continue;
            if (hit) {
                dp_errf(err, "%s: the archive holds two members named %s; re-save it with "
                        "distinct names", path, en);
                return NULL;
            }
            hit = &z->e[i];
        }
        if (hit)
            return hit;
    }
    char list[256];
    dp_zip_describe(z, list, sizeof list);
    dp_errf(err, "%s: no array named %s in the archive (it holds %s)", path, name, list);
    return NULL;
}

void dp_zip_describe(const dp_zip *z, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (z->n == 0) {
        snprintf(buf, cap, "no members");
        return;
    }
    for (size_t i = 0; i < z->n; i++) {
        char key[64];
        size_t l = strlen(z->e[i].name);
        int strip = l > 4 && strcmp(z->e[i].name + l - 4, ".npy") == 0;
        snprintf(key, sizeof key, "%.*s", (int)(strip ? l - 4 : l), z->e[i].name);
        list_add(buf, cap, key);
    }
}

static const char *method_name(uint16_t m)
{
    switch (m) {
    case 1: return "shrink";
    case 6: return "implode";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "LZMA";
    case 93: return "zstd";
    case 95: return "xz";
    default: return "unknown";
    }
}

int dp_zip_member_open(dp_zip_member *m, int fd, const dp_zip *z, const dp_zip_entry *e,
                       const char *where, dp_err *err)
{
    memset(m, 0, sizeof *m);
    m->fd = fd;
    m->where = where;
    m->e = *e;
    if (e->flags & 0x41) /* bit 0: encrypted, bit 6: strong encryption */
        return dp_errf(err, "%s: the member is encrypted; save it without a password", where);
    if (e->method != DP_ZIP_STORED && e->method != DP_ZIP_DEFLATED)
        return dp_errf(err, "%s: compression method %u (%s) is not supported; only stored and "
                       "deflated members are (numpy.savez and numpy.savez_compressed write "
                       "those)", where, e->method, method_name(e->method));
    if (e->method == DP_ZIP_STORED && e->csize != e->size)
        return dp_errf(err, "%s: a stored member with %llu compressed and %llu uncompressed "
                       "bytes; they must be equal", where, (unsigned long long)e->csize,
                       (unsigned long long)e->size);
    if (e->method == DP_ZIP_DEFLATED && e->size / DEFLATE_MAX_RATIO > e->csize)
        return dp_errf(err, "%s: declares %llu bytes inflated from %llu compressed, more than "
                       "deflate can produce", where, (unsigned long long)e->size,
                       (unsigned long long)e->csize);
    uint8_t h[LOCAL_LEN];
    if (pread_full(fd, h, LOCAL_LEN, e->local_off, where, "local header", err) != 0)
        return -1;
    if (le32(h) != SIG_LOCAL)
        return dp_errf(err, "%s: no local header at offset %llu where the central directory "
                       "points", where, (unsigned long long)e->local_off);
    size_t nlen = le16(h + 26), xlen = le16(h + 28);
    if (le16(h + 8) != e->method)
        return dp_errf(err, "%s: the local header says compression method %u, the central "
                       "directory %u", where, le16(h + 8), e->method);
    uint64_t room = z->cd_off - e->local_off - LOCAL_LEN; /* checked >= 0 in read_dir */
    if (nlen + xlen > room || e->csize > room - nlen - xlen)
        return dp_errf(err, "%s: member data (%llu bytes at offset %llu) runs into the central "
                       "directory at %llu", where, (unsigned long long)e->csize,
                       (unsigned long long)(e->local_off + LOCAL_LEN + nlen + xlen),
                       (unsigned long long)z->cd_off);
    size_t cdlen = strlen(e->name);
    char lname[256];
    if (nlen != cdlen)
        return dp_errf(err, "%s: the local header's name is %zu bytes, the central "
                       "directory's %zu", where, nlen, cdlen);
    /* Compare the name in slices so a long one needs no allocation. */
    for (size_t k = 0; k < nlen; k += sizeof lname) {
        size_t w = nlen - k < sizeof lname ? nlen - k : sizeof lname;
        if (pread_full(fd, lname, w, e->local_off + LOCAL_LEN + k, where, "local header",
                       err) != 0)
            return -1;
        if (memcmp(lname, e->name + k, w) != 0)
            return dp_errf(err, "%s: the local header names a different member", where);
    }
    m->data_off = e->local_off + LOCAL_LEN + nlen + xlen;
    m->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    if (e->size == 0 && e->crc != m->crc)
        return dp_errf(err, "%s: CRC-32 mismatch (an empty member with CRC %08x)", where, e->crc);
    if (e->method == DP_ZIP_DEFLATED) {
        m->in = malloc(ZIP_BUF);
        m->skip = malloc(ZIP_BUF);
        if (!m->in || !m->skip) {
            dp_zip_member_close(m);
            return dp_errf(err, "%s: out of memory", where);
        }
        if (inflateInit2(&m->zs, -15) != Z_OK) { /* raw deflate, no zlib header */
            dp_zip_member_close(m);
            return dp_errf(err, "%s: cannot start inflating (out of memory)", where);
        }
        m->zs_live = 1;
    }
    return 0;
}

void dp_zip_member_close(dp_zip_member *m)
{
    if (!m)
        return;
    if (m->zs_live)
        inflateEnd(&m->zs);
    free(m->in);
    free(m->skip);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

/* Extends the running CRC by bytes at [off, off + n) where they continue it,
 * and checks it once the whole member has been seen in order. */
static int crc_feed(dp_zip_member *m, const uint8_t *p, size_t n, uint64_t off, dp_err *err)
{
    if (off > m->crc_pos || off + n <= m->crc_pos)
        return 0;
    size_t skip = (size_t)(m->crc_pos - off);
    m->crc = (uint32_t)crc32_z(m->crc, p + skip, n - skip);
    m->crc_pos = off + n;
    if (m->crc_pos == m->e.size && m->crc != m->e.crc)
        return dp_errf(err, "%s: CRC-32 mismatch (the data gives %08x, the archive says %08x); "
                       "the file is damaged", m->where, m->crc, m->e.crc);
    return 0;
}

/* Inflates the next n bytes into dst.  At the member's end, checks that the
 * deflate stream ends there too. */
static int inflate_next(dp_zip_member *m, uint8_t *dst, size_t n, dp_err *err)
{
    z_stream *zs = &m->zs;
    size_t done = 0;
    while (done < n) {
        if (zs->avail_in == 0 && m->in_pos < m->e.csize) {
            uint64_t left = m->e.csize - m->in_pos;
            size_t want = left < ZIP_BUF ? (size_t)left : ZIP_BUF;
            if (pread_full(m->fd, m->in, want, m->data_off + m->in_pos, m->where,
                           "compressed data", err) != 0)
                return -1;
            m->in_pos += want;
            zs->next_in = m->in;
            zs->avail_in = (uInt)want;
        }
        size_t chunk = n - done < ZIP_BUF ? n - done : ZIP_BUF;
        zs->next_out = dst + done;
        zs->avail_out = (uInt)chunk;
        int r = inflate(zs, Z_NO_FLUSH);
        size_t got = chunk - zs->avail_out;
        uint64_t at = m->out_pos;
        /* Counted before the CRC is checked: the stream has moved past
         * them, and a later read must know it (or it would be served the
         * bytes after them as its own). */
        m->out_pos += got;
        if (crc_feed(m, dst + done, got, at, err) != 0)
            return -1;
        done += got;
        if (r == Z_STREAM_END && done < n)
            return dp_errf(err, "%s: the deflate stream ends after %llu bytes; the archive says "
                           "%llu", m->where, (unsigned long long)m->out_pos,
                           (unsigned long long)m->e.size);
        if (r == Z_DATA_ERROR || r == Z_NEED_DICT)
            return dp_errf(err, "%s: corrupt deflate data near uncompressed byte %llu (zlib: "
                           "%s)", m->where, (unsigned long long)m->out_pos,
                           zs->msg ? zs->msg : "bad data");
        if (r == Z_MEM_ERROR)
            return dp_errf(err, "%s: out of memory while inflating", m->where);
        if (r == Z_BUF_ERROR && zs->avail_in == 0 && m->in_pos == m->e.csize)
            return dp_errf(err, "%s: the compressed data (%llu bytes) ends before the deflate "
                           "stream does; the file is truncated or damaged", m->where,
                           (unsigned long long)m->e.csize);
    }
    if (m->out_pos == m->e.size) {
        /* The stream must end here: one more byte out means the member is longer. */
        uint8_t extra;
        for (;;) {
            if (zs->avail_in == 0 && m->in_pos < m->e.csize) {
                uint64_t left = m->e.csize - m->in_pos;
                size_t want = left < ZIP_BUF ? (size_t)left : ZIP_BUF;
                if (pread_full(m->fd, m->in, want, m->data_off + m->in_pos, m->where,
                               "compressed data", err) != 0)
                    return -1;
                m->in_pos += want;
                zs->next_in = m->in;
                zs->avail_in = (uInt)want;
            }
            zs->next_out = &extra;
            zs->avail_out = 1;
            int r = inflate(zs, Z_NO_FLUSH);
            if (zs->avail_out == 0)
                return dp_errf(err, "%s: inflates to more than the %llu bytes the archive "
                               "says", m->where, (unsigned long long)m->e.size);
            if (r == Z_STREAM_END)
                break;
            if (r == Z_OK)
                continue; /* consumed input without output (block headers) */
            if (r == Z_BUF_ERROR && zs->avail_in == 0 && m->in_pos == m->e.csize)
                return dp_errf(err, "%s: the compressed data ends before the deflate stream "
                               "does; the file is truncated or damaged", m->where);
            return dp_errf(err, "%s: corrupt deflate data at the member's end (zlib: %s)",
                           m->where, zs->msg ? zs->msg : "bad data");
        }
    }
    return 0;
}

int dp_zip_member_pread(dp_zip_member *m, void *buf, size_t n, uint64_t off, dp_err *err)
{
    if (off > m->e.size || n > m->e.size - off)
        return dp_errf(err, "%s: read of %zu bytes at %llu past the member's %llu bytes",
                       m->where, n, (unsigned long long)off, (unsigned long long)m->e.size);
    if (m->e.method == DP_ZIP_STORED) {
        if (pread_full(m->fd, buf, n, m->data_off + off, m->where, "member data", err) != 0)
            return -1;
        return crc_feed(m, buf, n, off, err);
    }
    if (off < m->out_pos) { /* behind us: start the stream again */
        if (inflateReset(&m->zs) != Z_OK)
            return dp_errf(err, "%s: cannot restart inflating", m->where);
        m->zs.avail_in = 0;
        m->in_pos = m->out_pos = m->crc_pos = 0;
        m->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    }
    while (m->out_pos < off) {
        uint64_t gap = off - m->out_pos;
        if (inflate_next(m, m->skip, gap < ZIP_BUF ? (size_t)gap : ZIP_BUF, err) != 0)
            return -1;
    }
    return inflate_next(m, buf, n, err);
}
