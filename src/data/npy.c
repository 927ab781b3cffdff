/* NumPy .npy / .npz reader (the contract is in include/downpour/npy.h).
 *
 * Order of checks on open: magic and version; the header length against the
 * source's size and a 64 KiB cap; the header dict (keys, dtype, order,
 * shape); the shape's byte count, multiplied with overflow checks, against
 * the bytes that follow the header.  Nothing is allocated from a size read
 * from the file: the only buffers are fixed (1 MiB of staging here, zip.c's
 * 64 KiB ones), so reading a 100 GB array costs the same memory as 100 B. */
#include "downpour/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zip.h"

/* numpy itself refuses headers over 10,000 bytes unless told otherwise. */
#define NPY_MAX_HEADER ((uint32_t)64 << 10)
#define NPY_CHUNK ((size_t)1 << 20)

struct dp_npy {
    char *where;          /* "path" or "path (member name)" */
    int fd;
    int is_member;
    dp_zip zip;
    dp_zip_member mem;
    uint64_t data_off;    /* where element 0 starts in the source */
    uint64_t row_bytes;
    dp_npy_info info;
    uint8_t *buf;         /* NPY_CHUNK bytes of staging */
};

static const struct {
    char kind;
    size_t size;
    dp_npy_dtype t;
    const char *name;
} dtypes[] = {
    {'b', 1, DP_NPY_BOOL, "bool"},     {'u', 1, DP_NPY_U8, "uint8"},
    {'i', 1, DP_NPY_I8, "int8"},       {'u', 2, DP_NPY_U16, "uint16"},
    {'i', 2, DP_NPY_I16, "int16"},     {'u', 4, DP_NPY_U32, "uint32"},
    {'i', 4, DP_NPY_I32, "int32"},     {'u', 8, DP_NPY_U64, "uint64"},
    {'i', 8, DP_NPY_I64, "int64"},     {'f', 4, DP_NPY_F32, "float32"},
    {'f', 8, DP_NPY_F64, "float64"},
};

const char *dp_npy_dtype_name(dp_npy_dtype t)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t)
            return dtypes[i].name;
    return "unknown";
}

/* ---- reading the source: a file, or a member through zip.c ---- */

static int src_pread(dp_npy *a, void *buf, size_t n, uint64_t off, dp_err *err)
{
    if (a->is_member)
        return dp_zip_member_pread(&a->mem, buf, n, off, err);
    uint8_t *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(a->fd, p + got, n - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return dp_errf(err, "%s: read error: %s", a->where, strerror(errno));
        }
        if (r == 0)
            return dp_errf(err, "%s: file ends at byte %llu, before the data the header "
                           "describes; was it truncated while open?", a->where,
                           (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}

/* ---- the header: a Python dict literal ---- */

typedef struct hdr_cursor {
    const char *s;
    size_t n, at;
} hdr_cursor;

static void skip_ws(hdr_cursor *c)
{
    while (c->at < c->n && (c->s[c->at] == ' ' || c->s[c->at] == '\t' ||
                            c->s[c->at] == '\n' || c->s[c->at] == '\r'))
        c->at++;
}

static int peek(hdr_cursor *c) { return c->at < c->n ? (unsigned char)c->s[c->at] : -1; }

/* A quoted string (no escapes: numpy never writes any) into out[cap]. */
static int parse_str(hdr_cursor *c, char *out, size_t cap, const char *where, const char *what,
                     dp_err *err)
{
    int q = peek(c);
    if (q != '\'' && q != '"')
        return dp_errf(err, "%s: header: expected a quoted %s at byte %zu", where, what, c->at);
    size_t start = ++c->at;
    while (c->at < c->n && c->s[c->at] != q && c->s[c->at] != '\\')
        c->at++;
    if (c->at >= c->n || c->s[c->at] != q)
        return dp_errf(err, "%s: header: unterminated or escaped %s string", where, what);
    size_t len = c->at - start;
    c->at++;
    if (len >= cap)
        return dp_errf(err, "%s: header: %s '%.*s...' is too long", where, what, 20,
                       c->s + start);
    memcpy(out, c->s + start, len);
    out[len] = '\0';
    return 0;
}

static int parse_word(hdr_cursor *c, const char *w)
{
    size_t l = strlen(w);
    if (c->n - c->at < l || memcmp(c->s + c->at, w, l) != 0)
        return 0;
    c->at += l;
    return 1;
}

/* "(a, b, c)", "(a,)" or "()": non-negative integers (Python 2's "3L" too). */
static int parse_shape(hdr_cursor *c, dp_npy_info *info, const char *where, dp_err *err)
{
    if (peek(c) != '(')
        return dp_errf(err, "%s: header: 'shape' must be a tuple such as (60000, 28, 28)",
                       where);
    c->at++;
    int ndim = 0, trailing_comma = 0;
    for (;;) {
        skip_ws(c);
        if (peek(c) == ')') {
            c->at++;
            break;
        }
        if (peek(c) == '-')
            return dp_errf(err, "%s: header: negative dimension in 'shape'", where);
        if (peek(c) < '0' || peek(c) > '9')
            return dp_errf(err, "%s: header: 'shape' holds something other than integers at "
                           "byte %zu", where, c->at);
        uint64_t v = 0;
        while (peek(c) >= '0' && peek(c) <= '9') {
            unsigned d = (unsigned)(peek(c) - '0');
            if (v > (UINT64_MAX - d) / 10)
                return dp_errf(err, "%s: header: a dimension in 'shape' is over 2^64", where);
            v = v * 10 + d;
            c->at++;
        }
        if (peek(c) == 'L')
            c->at++;
        if (ndim == DP_NPY_MAX_NDIM)
            return dp_errf(err, "%s: header: 'shape' has more than %d axes", where,
                           DP_NPY_MAX_NDIM);
        info->shape[ndim++] = v;
        skip_ws(c);
        trailing_comma = 0;
        if (peek(c) == ',') {
            c->at++;
            trailing_comma = 1;
        } else if (peek(c) != ')') {
            return dp_errf(err, "%s: header: expected ',' or ')' in 'shape' at byte %zu", where,
                           c->at);
        }
    }
    if (ndim == 1 && !trailing_comma)
        return dp_errf(err, "%s: header: 'shape' (%llu) is not a tuple (numpy writes (%llu,))",
                       where, (unsigned long long)info->shape[0],
                       (unsigned long long)info->shape[0]);
    info->ndim = ndim;
    return 0;
}

static int parse_descr(const char *d, dp_npy_info *info, const char *where, dp_err *err)
{
    char order = d[0];
    const char *hint = "supported: bool, (u)int8/16/32/64, float32, float64; convert with "
                       "a.astype('<f4') or a.astype('<i8')";
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return dp_errf(err, "%s: dtype '%s' is not supported (%s)", where, d, hint);
    char kind = d[1];
    if (kind == 'O')
        return dp_errf(err, "%s: dtype '%s' is an object array (pickled Python objects), which "
                       "is never loaded; save a numeric array (a.astype('<f4'))", where, d);
    char *end;
    errno = 0;
    unsigned long size = kind ? strtoul(d + 2, &end, 10) : 0;
    if (!kind || d[2] < '0' || d[2] > '9' || *end || errno)
        return dp_errf(err, "%s: dtype '%s' is not supported (%s)", where, d, hint);
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (dtypes[i].kind != kind || dtypes[i].size != size)
            continue;
        if (order == '|' && size > 1)
            return dp_errf(err, "%s: dtype '%s': a %lu-byte type needs a byte order '<' or "
                           "'>', not '|'", where, d, size);
        uint16_t probe = 1;
        int host_big = *(uint8_t *)&probe == 0;
        info->dtype = dtypes[i].t;
        info->itemsize = size;
        info->big_endian = size > 1 && (order == '>' || (order == '=' && host_big));
        return 0;
    }
    return dp_errf(err, "%s: dtype '%s' is not supported (%s)", where, d, hint);
}

static int parse_header(const char *h, size_t n, dp_npy_info *info, const char *where,
                        dp_err *err)
{
    hdr_cursor c = {h, n, 0};
    int have_descr = 0, have_order = 0, have_shape = 0;
    skip_ws(&c);
    if (peek(&c) != '{')
        return dp_errf(err, "%s: header is not a Python dict (it starts '%.20s')", where, h);
    c.at++;
    for (;;) {
        skip_ws(&c);
        if (peek(&c) == '}') {
            c.at++;
            break;
        }
        char key[32];
        if (parse_str(&c, key, sizeof key, where, "key", err) != 0)
            return -1;
        skip_ws(&c);
        if (peek(&c) != ':')
            return dp_errf(err, "%s: header: expected ':' after '%s'", where, key);
        c.at++;
        skip_ws(&c);
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (peek(&c) == '[')
                return dp_errf(err, "%s: a structured dtype (a list of named fields) is not "
                               "supported; save each field as its own array", where);
            if (parse_str(&c, info->descr, sizeof info->descr, where, "'descr'", err) != 0)
                return -1;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (parse_word(&c, "True"))
                info->fortran_order = 1;
            else if (parse_word(&c, "False"))
                info->fortran_order = 0;
            else
                return dp_errf(err, "%s: header: 'fortran_order' must be True or False", where);
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (parse_shape(&c, info, where, err) != 0)
                return -1;
            have_shape = 1;
        } else {
            return dp_errf(err, "%s: header: unexpected or repeated key '%s' (a .npy header has "
                           "exactly 'descr', 'fortran_order' and 'shape')", where, key);
        }
        skip_ws(&c);
        if (peek(&c) == ',')
            c.at++;
        else if (peek(&c) != '}')
            return dp_errf(err, "%s: header: expected ',' or '}' at byte %zu", where, c.at);
    }
    skip_ws(&c);
    if (c.at != n)
        return dp_errf(err, "%s: header: text after the dict at byte %zu", where, c.at);
    if (!have_descr || !have_order || !have_shape)
        return dp_errf(err, "%s: header lacks '%s'", where,
                       !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return parse_descr(info->descr, info, where, err);
}

/* Formats a shape as "(60000, 28, 28)". */
static void shape_str(const dp_npy_info *info, char *out, size_t cap)
{
    size_t l = (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < info->ndim && l < cap; i++)
        l += (size_t)snprintf(out + l, cap - l, "%s%llu", i ? ", " : "",
                              (unsigned long long)info->shape[i]);
    if (l < cap)
        snprintf(out + l, cap - l, "%s)", info->ndim == 1 ? "," : "");
}

/* Reads the preamble and header at offset 0 of a source of src_size bytes,
 * and checks the data length. */
static int read_header(dp_npy *a, uint64_t src_size, dp_err *err)
{
    uint8_t pre[12];
    if (src_size < 10)
        return dp_errf(err, "%s: %llu bytes is too short for a .npy file (its preamble is 10 "
                       "bytes or more)", a->where, (unsigned long long)src_size);
    if (src_pread(a, pre, 10, 0, err) != 0)
        return -1;
    if (memcmp(pre, "\x93NUMPY", 6) != 0)
        return dp_errf(err, "%s: not a .npy file (no \\x93NUMPY magic; save it with numpy.save)",
                       a->where);
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return dp_errf(err, "%s: .npy format version %d.%d is not supported (1.0, 2.0 and 3.0 "
                       "are)", a->where, major, minor);
    uint64_t pre_len = major == 1 ? 10 : 12;
    uint32_t hlen;
    if (major == 1) {
        hlen = (uint32_t)(pre[8] | pre[9] << 8);
    } else {
        if (src_size < 12)
            return dp_errf(err, "%s: too short for a version %d.0 preamble", a->where, major);
        if (src_pread(a, pre + 10, 2, 10, err) != 0)
            return -1;
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
    }
    if (hlen > src_size - pre_len)
        return dp_errf(err, "%s: header claims %u bytes but the file has only %llu after the "
                       "preamble", a->where, hlen, (unsigned long long)(src_size - pre_len));
    if (hlen > NPY_MAX_HEADER)
        return dp_errf(err, "%s: header of %u bytes is over the %u-byte limit", a->where, hlen,
                       NPY_MAX_HEADER);
    char *h = malloc(hlen + 1);
    if (!h)
        return dp_errf(err, "%s: out of memory", a->where);
    int rc = src_pread(a, h, hlen, pre_len, err);
    if (rc == 0) {
        h[hlen] = '\0';
        if (memchr(h, 0, hlen))
            rc = dp_errf(err, "%s: header holds a NUL byte (its length field may be wrong)",
                         a->where);
        else
            rc = parse_header(h, hlen, &a->info, a->where, err);
    }
    free(h);
    if (rc != 0)
        return -1;
    dp_npy_info *in = &a->info;
    in->version = major;
    char shp[160];
    shape_str(in, shp, sizeof shp);
    if (in->ndim == 0)
        return dp_errf(err, "%s: a 0-d array (a single scalar) has no rows; save an array of "
                       "shape (n, ...)", a->where);
    int long_axes = 0;
    for (int i = 0; i < in->ndim; i++)
        long_axes += in->shape[i] > 1;
    if (in->fortran_order && long_axes > 1)
        return dp_errf(err, "%s: shape %s is stored in Fortran (column-major) order, so a row "
                       "is not contiguous; save np.ascontiguousarray(a) instead", a->where, shp);
    uint64_t row = 1, elems, nbytes;
    for (int i = 1; i < in->ndim; i++)
        if (__builtin_mul_overflow(row, in->shape[i], &row))
            return dp_errf(err, "%s: shape %s: a row holds more than 2^64 elements", a->where,
                           shp);
    if (__builtin_mul_overflow(in->shape[0], row, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)in->itemsize, &nbytes) ||
        __builtin_mul_overflow(row, (uint64_t)in->itemsize, &a->row_bytes))
        return dp_errf(err, "%s: shape %s of %s holds more than 2^64 bytes", a->where, shp,
                       in->descr);
    a->data_off = pre_len + hlen;
    uint64_t have = src_size - a->data_off;
    if (have < nbytes)
        return dp_errf(err, "%s: truncated: shape %s of %s needs %llu bytes of data after the "
                       "%llu-byte header, the file has %llu", a->where, shp, in->descr,
                       (unsigned long long)nbytes, (unsigned long long)a->data_off,
                       (unsigned long long)have);
    if (have > nbytes)
        return dp_errf(err, "%s: %llu trailing bytes after the %llu bytes of data that shape %s "
                       "of %s needs (a header that lies about the shape?)", a->where,
                       (unsigned long long)(have - nbytes), (unsigned long long)nbytes, shp,
                       in->descr);
    in->rows = in->shape[0];
    in->row_elems = row;
    return 0;
}

/* ---- open / close ---- */

static int is_zip_magic(const uint8_t *m)
{
    return m[0] == 'P' && m[1] == 'K' && ((m[2] == 3 && m[3] == 4) || (m[2] == 5 && m[3] == 6));
}

/* Opens path read-only; fills the size and the first 6 bytes (zeros if fewer). */
static int open_file(const char *path, int *fd_out, uint64_t *size, uint8_t *magic, dp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp_errf(err, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dp_errf(err, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dp_errf(err, "%s: %s, not a .npy or .npz file", path,
                       S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
    }
    memset(magic, 0, 6);
    ssize_t r;
    do {
        r = pread(fd, magic, 6, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        close(fd);
        return dp_errf(err, "%s: read error: %s", path, strerror(e));
    }
    *fd_out = fd;
    *size = (uint64_t)st.st_size;
    return 0;
}

void dp_npy_close(dp_npy *a)
{
    if (!a)
        return;
    if (a->is_member)
        dp_zip_member_close(&a->mem);
    dp_zip_free(&a->zip);
    if (a->fd >= 0)
        close(a->fd);
    free(a->buf);
    free(a->where);
    free(a);
}

static char *dup_printf(const char *fmt, const char *x, const char *y)
{
    int n = snprintf(NULL, 0, fmt, x, y);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        snprintf(s, (size_t)n + 1, fmt, x, y);
    return s;
}

int dp_npy_open(dp_npy **out, const char *path, const char *member, dp_err *err)
{
    *out = NULL;
    dp_npy *a = calloc(1, sizeof *a);
    if (!a)
        return dp_errf(err, "%s: out of memory", path);
    a->fd = -1;
    uint64_t size;
    uint8_t magic[6];
    if (open_file(path, &a->fd, &size, magic, err) != 0)
        goto fail;
    int zip = is_zip_magic(magic);
    if (!member) {
        a->where = strdup(path);
        if (!a->where) {
            dp_errf(err, "%s: out of memory", path);
            goto fail;
        }
        if (zip) {
            if (dp_zip_read_dir(&a->zip, a->fd, size, path, err) != 0)
                goto fail;
            char list[256];
            dp_zip_describe(&a->zip, list, sizeof list);
            dp_errf(err, "%s: is an .npz archive, not a .npy file: name one of its arrays "
                    "(%s)", path, list);
            goto fail;
        }
        if (read_header(a, size, err) != 0)
            goto fail;
    } else {
        a->where = dup_printf("%s (member %s)", path, member);
        if (!a->where) {
            dp_errf(err, "%s: out of memory", path);
            goto fail;
        }
        if (!zip) {
            dp_errf(err, "%s: not an .npz (ZIP) archive, so it has no array %s%s", path, member,
                    memcmp(magic, "\x93NUMPY", 6) == 0 ? " (it is a .npy file: open it without "
                                                        "a member name)" : "");
            goto fail;
        }
        if (dp_zip_read_dir(&a->zip, a->fd, size, path, err) != 0)
            goto fail;
        const dp_zip_entry *e = dp_zip_find(&a->zip, member, path, err);
        if (!e)
            goto fail;
        free(a->where);
        a->where = dup_printf("%s (member %s)", path, e->name);
        if (!a->where) {
            dp_errf(err, "%s: out of memory", path);
            goto fail;
        }
        if (dp_zip_member_open(&a->mem, a->fd, &a->zip, e, a->where, err) != 0)
            goto fail;
        a->is_member = 1;
        a->info.deflated = e->method == DP_ZIP_DEFLATED;
        if (read_header(a, e->size, err) != 0)
            goto fail;
    }
    a->buf = malloc(NPY_CHUNK);
    if (!a->buf) {
        dp_errf(err, "%s: out of memory", a->where);
        goto fail;
    }
    *out = a;
    return 0;
fail:
    dp_npy_close(a);
    return -1;
}

const dp_npy_info *dp_npy_get_info(const dp_npy *a) { return &a->info; }

/* ---- conversion ---- */

static uint16_t ld16(const uint8_t *p, int be)
{
    return be ? (uint16_t)(p[0] << 8 | p[1]) : (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t ld32(const uint8_t *p, int be)
{
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                    (uint32_t)p[3] << 24;
}
static uint64_t ld64(const uint8_t *p, int be)
{
    return be ? (uint64_t)ld32(p, 1) << 32 | ld32(p + 4, 1)
              : (uint64_t)ld32(p, 0) | (uint64_t)ld32(p + 4, 0) << 32;
}

/* One element as the widest value of its kind: exactly one of the three. */
typedef struct elem {
    int kind; /* 0: signed in s, 1: unsigned in u, 2: floating in d */
    int64_t s;
    uint64_t u;
    double d;
} elem;

static elem load(const uint8_t *p, dp_npy_dtype t, int be)
{
    elem e = {0, 0, 0, 0.0};
    switch (t) {
    case DP_NPY_BOOL: e.kind = 1; e.u = p[0] != 0; break;
    case DP_NPY_U8: e.kind = 1; e.u = p[0]; break;
    case DP_NPY_I8: e.s = (int8_t)p[0]; break;
    case DP_NPY_U16: e.kind = 1; e.u = ld16(p, be); break;
    case DP_NPY_I16: e.s = (int16_t)ld16(p, be); break;
    case DP_NPY_U32: e.kind = 1; e.u = ld32(p, be); break;
    case DP_NPY_I32: e.s = (int32_t)ld32(p, be); break;
    case DP_NPY_U64: e.kind = 1; e.u = ld64(p, be); break;
    case DP_NPY_I64: e.s = (int64_t)ld64(p, be); break;
    case DP_NPY_F32: {
        uint32_t b = ld32(p, be);
        float f;
        memcpy(&f, &b, 4);
        e.kind = 2;
        e.d = f;
        break;
    }
    case DP_NPY_F64: {
        uint64_t b = ld64(p, be);
        memcpy(&e.d, &b, 8);
        e.kind = 2;
        break;
    }
    default: break;
    }
    return e;
}

/* Converts n elements at p to floats; returns the index of the first that
 * does not fit a finite float, or n. */
static size_t to_f32(float *o, const uint8_t *p, size_t n, dp_npy_dtype t, int be, size_t isz)
{
    if (t == DP_NPY_U8) { /* the images' path */
        for (size_t i = 0; i < n; i++)
            o[i] = p[i];
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        elem e = load(p + i * isz, t, be);
        if (e.kind == 0) {
            o[i] = (float)e.s;
        } else if (e.kind == 1) {
            o[i] = (float)e.u;
        } else {
            if (!(fabs(e.d) <= FLT_MAX)) /* NaN, infinity, or beyond float */
                return i;
            o[i] = (float)e.d;
        }
    }
    return n;
}

typedef enum read_kind { READ_F32, READ_U8, READ_LABELS, READ_I64 } read_kind;

static int check_range(dp_npy *a, uint64_t lo, uint64_t hi, dp_err *err)
{
    if (lo > hi || hi > a->info.rows)
        return dp_errf(err, "%s: rows [%llu, %llu) are outside the array's %llu rows", a->where,
                       (unsigned long long)lo, (unsigned long long)hi,
                       (unsigned long long)a->info.rows);
    return 0;
}

/* Streams rows [lo, hi) through the staging buffer, converting each chunk. */
static int read_rows(dp_npy *a, uint64_t lo, uint64_t hi, read_kind kind, uint32_t classes,
                     void *out, dp_err *err)
{
    const dp_npy_info *in = &a->info;
    size_t isz = in->itemsize;
    uint64_t first = lo * in->row_elems; /* < rows * row_elems, which fits */
    uint64_t total = (hi - lo) * in->row_elems;
    size_t per = NPY_CHUNK / isz;
    for (uint64_t done = 0; done < total;) {
        size_t n = total - done < per ? (size_t)(total - done) : per;
        uint64_t at = first + done;
        if (src_pread(a, a->buf, n * isz, a->data_off + at * isz, err) != 0)
            return -1;
        if (kind == READ_U8) {
            memcpy((uint8_t *)out + done, a->buf, n);
        } else if (kind == READ_I64) {
            int64_t *o = (int64_t *)out + done;
            for (size_t i = 0; i < n; i++) {
                elem e = load(a->buf + i * isz, in->dtype, in->big_endian);
                if (e.kind == 1 && e.u > (uint64_t)INT64_MAX)
                    return dp_errf(err, "%s: row %llu: %llu is above int64's range", a->where,
                                   (unsigned long long)((at + i) / in->row_elems),
                                   (unsigned long long)e.u);
                o[i] = e.kind == 0 ? e.s : (int64_t)e.u;
            }
        } else if (kind == READ_F32) {
            float *o = (float *)out + done;
            size_t bad = to_f32(o, a->buf, n, in->dtype, in->big_endian, isz);
            if (bad < n) {
                elem e = load(a->buf + bad * isz, in->dtype, in->big_endian);
                uint64_t k = at + bad;
                return dp_errf(err, "%s: row %llu (element %llu of the row): %s value %g is %s",
                               a->where, (unsigned long long)(k / in->row_elems),
                               (unsigned long long)(k % in->row_elems), in->descr, e.d,
                               isnan(e.d) || isinf(e.d) ? "not a finite number; clean the data"
                                                        : "beyond float32's range");
            }
        } else {
            uint32_t *o = (uint32_t *)out + done;
            for (size_t i = 0; i < n; i++) {
                elem e = load(a->buf + i * isz, in->dtype, in->big_endian);
                unsigned long long row = (unsigned long long)(at + i);
                if (e.kind == 2) {
                    if (!isfinite(e.d) || e.d != floor(e.d))
                        return dp_errf(err, "%s: label %g at row %llu is not an integer class "
                                       "index", a->where, e.d, row);
                    if (e.d < 0)
                        return dp_errf(err, "%s: label %g at row %llu is negative", a->where,
                                       e.d, row);
                    if (e.d >= classes)
                        return dp_errf(err, "%s: label %g at row %llu is not below the class "
                                       "count %u", a->where, e.d, row, classes);
                    o[i] = (uint32_t)e.d;
                } else if (e.kind == 0 && e.s < 0) {
                    return dp_errf(err, "%s: label %lld at row %llu is negative", a->where,
                                   (long long)e.s, row);
                } else {
                    uint64_t v = e.kind == 0 ? (uint64_t)e.s : e.u;
                    if (v >= classes)
                        return dp_errf(err, "%s: label %llu at row %llu is not below the class "
                                       "count %u", a->where, (unsigned long long)v, row,
                                       classes);
                    o[i] = (uint32_t)v;
                }
            }
        }
        done += n;
    }
    return 0;
}

int dp_npy_read_f32(dp_npy *a, uint64_t lo, uint64_t hi, float *out, dp_err *err)
{
    if (check_range(a, lo, hi, err) != 0)
        return -1;
    return read_rows(a, lo, hi, READ_F32, 0, out, err);
}

int dp_npy_read_i64(dp_npy *a, uint64_t lo, uint64_t hi, int64_t *out, dp_err *err)
{
    dp_npy_dtype t = a->info.dtype;
    if (t == DP_NPY_F32 || t == DP_NPY_F64)
        return dp_errf(err, "%s: dtype %s is not an integer type (ids are integers: store them "
                       "as int64, or any integer dtype)", a->where, a->info.descr);
    if (check_range(a, lo, hi, err) != 0)
        return -1;
    return read_rows(a, lo, hi, READ_I64, 0, out, err);
}

int dp_npy_read_u8(dp_npy *a, uint64_t lo, uint64_t hi, uint8_t *out, dp_err *err)
{
    if (a->info.dtype != DP_NPY_U8)
        return dp_errf(err, "%s: dtype %s is not uint8; read it as floats", a->where,
                       a->info.descr);
    if (check_range(a, lo, hi, err) != 0)
        return -1;
    return read_rows(a, lo, hi, READ_U8, 0, out, err);
}

int dp_npy_read_labels(dp_npy *a, uint64_t lo, uint64_t hi, uint32_t classes, uint32_t *out,
                       dp_err *err)
{
    const dp_npy_info *in = &a->info;
    if (in->row_elems != 1 || in->ndim > 2) {
        char shp[160];
        shape_str(in, shp, sizeof shp);
        return dp_errf(err, "%s: labels must have shape (n,) or (n, 1), this array has %s",
                       a->where, shp);
    }
    if (check_range(a, lo, hi, err) != 0)
        return -1;
    return read_rows(a, lo, hi, READ_LABELS, classes, out, err);
}

/* ---- .npz listing ---- */

void dp_npz_list_free(char **names, size_t n)
{
    if (!names)
        return;
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

int dp_npz_list(const char *path, char ***names, size_t *n, dp_err *err)
{
    *names = NULL;
    *n = 0;
    int fd;
    uint64_t size;
    uint8_t magic[6];
    if (open_file(path, &fd, &size, magic, err) != 0)
        return -1;
    dp_zip z;
    int rc = -1;
    if (!is_zip_magic(magic)) {
        close(fd);
        return dp_errf(err, "%s: not an .npz (ZIP) archive", path);
    }
    if (dp_zip_read_dir(&z, fd, size, path, err) != 0) {
        close(fd);
        return -1;
    }
    char **v = calloc(z.n ? z.n : 1, sizeof *v);
    if (!v) {
        dp_errf(err, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < z.n; i++) {
        size_t l = strlen(z.e[i].name);
        if (l > 4 && strcmp(z.e[i].name + l - 4, ".npy") == 0)
            l -= 4;
        v[i] = malloc(l + 1);
        if (!v[i]) {
            dp_npz_list_free(v, i);
            dp_errf(err, "%s: out of memory", path);
            goto done;
        }
        memcpy(v[i], z.e[i].name, l);
        v[i][l] = '\0';
    }
    *names = v;
    *n = z.n;
    rc = 0;
done:
    dp_zip_free(&z);
    close(fd);
    return rc;
}
