/* safetensors reader and writer (https://github.com/huggingface/safetensors).
 *
 * Layout: u64 little-endian N, N bytes of UTF-8 JSON, then the data area.
 * The writer pads the header with spaces so the data area starts at a
 * multiple of 8, as the reference library does.  The reader loads the file
 * into one buffer, validates the header completely (the same rules as the
 * reference: F32 only here, offsets inside the data, byte lengths equal to
 * the shapes', no overlaps, no gaps, no trailing bytes, no duplicate names)
 * and points every tensor into that buffer. */
#include "downpour/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this code writes floats as stored in memory"
#endif

#define ST_HEADER_MAX 100000000ull /* bound on N before any allocation */
#define ST_INT_MAX 9007199254740992.0 /* 2^53: JSON numbers above are not exact in cJSON */
#define ST_SHAPE_STR 160

struct dp_safetensors {
    unsigned char *buf;             /* the whole file; data area moved to an 8-aligned offset
                                       (opened, not loaded: the header only) */
    int fd;                         /* opened (dp_safetensors_open): the file, else -1 */
    uint64_t data_off;              /* opened: where the data area starts in the file */
    uint64_t *begin;                /* opened: each tensor's first byte in the data area */
    dp_st_tensor *tensors;          /* file order (by data offset) */
    const dp_st_tensor **by_name;   /* sorted by name, for find */
    int n;
    dp_st_meta *meta;
    int n_meta;
    char *strings;                  /* names, metadata keys and values */
};

/* ---- small helpers ---------------------------------------------------- */

static void shape_str(char *out, size_t cap, const int64_t *shape, int ndim)
{
    size_t len = 0;
    len += (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (len < cap)
        snprintf(out + len, cap - len, "]");
}

/* Element count of a shape; -1 on overflow of the byte size. */
static int shape_bytes(const int64_t *shape, int ndim, uint64_t *bytes)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return -1;
    }
    if (__builtin_mul_overflow(n, (uint64_t)sizeof(float), &n))
        return -1;
    *bytes = n;
    return 0;
}

/* Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF);
 * NUL bytes are refused too.  Returns the offset of the first bad byte or
 * len when the text is valid. */
static size_t utf8_check(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c == 0)
            return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (len - i <= k)
            return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += k + 1;
    }
    return len;
}

/* A JSON integer printed exactly (cJSON would print large doubles as 1e+15). */
static cJSON *json_u64(uint64_t v)
{
    char s[32];
    snprintf(s, sizeof s, "%" PRIu64, v);
    return cJSON_CreateRaw(s);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const dp_st_tensor *x = *(const dp_st_tensor *const *)a;
    const dp_st_tensor *y = *(const dp_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* ---- writer ------------------------------------------------------------ */

/* Checks the caller's tensors and metadata; fills bytes[i]. */
static int check_save_args(const char *path, const dp_st_tensor *tensors, int n_tensors,
                           const dp_st_meta *meta, int n_meta, uint64_t *bytes, int filled,
                           dp_err *err)
{
    if (n_tensors < 0 || n_meta < 0 || (n_tensors > 0 && !tensors) || (n_meta > 0 && !meta))
        return dp_errf(err, "%s: bad arguments (%d tensors, %d metadata entries)", path,
                       n_tensors, n_meta);
    for (int i = 0; i < n_tensors; i++) {
        const dp_st_tensor *t = &tensors[i];
        char shp[ST_SHAPE_STR];
        if (!t->name)
            return dp_errf(err, "%s: tensor %d has no name", path, i);
        if (strcmp(t->name, "__metadata__") == 0)
            return dp_errf(err, "%s: tensor %d: the name '__metadata__' is reserved", path, i);
        if (utf8_check((const unsigned char *)t->name, strlen(t->name)) != strlen(t->name))
            return dp_errf(err, "%s: tensor %d: name is not valid UTF-8", path, i);
        if (t->ndim < 0 || t->ndim > DP_ST_MAX_DIMS)
            return dp_errf(err, "%s: tensor '%s': %d dimensions (at most %d)", path, t->name,
                           t->ndim, DP_ST_MAX_DIMS);
        shape_str(shp, sizeof shp, t->shape, t->ndim);
        if (shape_bytes(t->shape, t->ndim, &bytes[i]) < 0 || bytes[i] > (uint64_t)SIZE_MAX)
            return dp_errf(err, "%s: tensor '%s': shape %s is negative or too large", path,
                           t->name, shp);
        if (bytes[i] > 0 && !t->data && !filled)
            return dp_errf(err, "%s: tensor '%s': shape %s but no data", path, t->name, shp);
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value)
            return dp_errf(err, "%s: metadata entry %d has a NULL key or value", path, i);
        size_t kl = strlen(meta[i].key), vl = strlen(meta[i].value);
        if (utf8_check((const unsigned char *)meta[i].key, kl) != kl ||
            utf8_check((const unsigned char *)meta[i].value, vl) != vl)
            return dp_errf(err, "%s: metadata '%s' is not valid UTF-8", path, meta[i].key);
    }

    /* Duplicates: sort a copy of the names. */
    int nmax = n_tensors > n_meta ? n_tensors : n_meta;
    if (nmax == 0)
        return 0;
    const char **names = malloc((size_t)nmax * sizeof *names);
    if (!names)
        return dp_errf(err, "%s: out of memory", path);
    int rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        int n = pass == 0 ? n_tensors : n_meta;
        for (int i = 0; i < n; i++)
            names[i] = pass == 0 ? tensors[i].name : meta[i].key;
        qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
        for (int i = 1; i < n; i++) {
            if (strcmp(names[i - 1], names[i]) == 0) {
                rc = dp_errf(err, "%s: duplicate %s '%s'", path,
                             pass == 0 ? "tensor name" : "metadata key", names[i]);
                break;
            }
        }
    }
    free(names);
    return rc;
}

/* Builds the padded header: 8-byte length, JSON, spaces up to a multiple of 8. */
static unsigned char *build_header(const char *path, const dp_st_tensor *tensors,
                                   int n_tensors, const dp_st_meta *meta, int n_meta,
                                   const uint64_t *bytes, size_t *out_len, dp_err *err)
{
    unsigned char *out = NULL;
    char *json = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        goto oom;
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m)
            goto oom;
        for (int i = 0; i < n_meta; i++)
            if (!cJSON_AddStringToObject(m, meta[i].key, meta[i].value))
                goto oom;
    }
    uint64_t off = 0;
    for (int i = 0; i < n_tensors; i++) {
        cJSON *t = cJSON_AddObjectToObject(root, tensors[i].name);
        if (!t || !cJSON_AddStringToObject(t, "dtype", "F32"))
            goto oom;
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        if (!shape)
            goto oom;
        for (int d = 0; d < tensors[i].ndim; d++) {
            cJSON *v = json_u64((uint64_t)tensors[i].shape[d]);
            if (!v || !cJSON_AddItemToArray(shape, v)) {
                cJSON_Delete(v);
                goto oom;
            }
        }
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        if (!offs)
            goto oom;
        uint64_t pair[2] = {off, off + bytes[i]};
        for (int k = 0; k < 2; k++) {
            cJSON *v = json_u64(pair[k]);
            if (!v || !cJSON_AddItemToArray(offs, v)) {
                cJSON_Delete(v);
                goto oom;
            }
        }
        if (__builtin_add_overflow(off, bytes[i], &off)) {
            cJSON_Delete(root);
            dp_errf(err, "%s: total data size overflows", path);
            return NULL;
        }
    }
    json = cJSON_PrintUnformatted(root);
    if (!json)
        goto oom;
    size_t jl = strlen(json);
    size_t total = (8 + jl + 7) & ~(size_t)7;
    if (total - 8 > ST_HEADER_MAX) {
        dp_errf(err, "%s: header of %zu bytes exceeds the %llu-byte limit", path, total - 8,
                ST_HEADER_MAX);
        goto fail;
    }
    out = malloc(total);
    if (!out)
        goto oom;
    uint64_t n = total - 8;
    for (int k = 0; k < 8; k++)
        out[k] = (unsigned char)(n >> (8 * k));
    memcpy(out + 8, json, jl);
    memset(out + 8 + jl, ' ', total - 8 - jl);
    *out_len = total;
    cJSON_free(json);
    cJSON_Delete(root);
    return out;
oom:
    dp_errf(err, "%s: out of memory building the header", path);
fail:
    cJSON_free(json);
    cJSON_Delete(root);
    return NULL;
}

int dp_safetensors_save(const char *path, const dp_st_tensor *tensors, int n_tensors,
                        const dp_st_meta *meta, int n_meta, dp_err *err)
{
    return dp_safetensors_save_source(path, tensors, n_tensors, meta, n_meta, NULL, err);
}

#define FILL_FLOATS ((size_t)1 << 18) /* a filled tensor goes to the file 1 MiB at a time */

/* Tensor i's bytes to fd: from its data, or filled piece by piece. */
static int write_tensor(int fd, const dp_st_tensor *t, int i, uint64_t bytes,
                        const dp_st_source *src, float *buf, dp_err *err)
{
    if (t->data) {
        if (src && src->seen)
            src->seen(src->ctx, i, t->data, (size_t)bytes);
        return dp_write_all(fd, t->data, (size_t)bytes, NULL) < 0 ? -1 : 0;
    }
    for (uint64_t done = 0; done < bytes;) {
        size_t n = (size_t)((bytes - done) / sizeof(float));
        if (n > FILL_FLOATS)
            n = FILL_FLOATS;
        if (src->fill(src->ctx, i, buf, n, err) < 0)
            return -2;
        if (src->seen)
            src->seen(src->ctx, i, buf, n * sizeof(float));
        if (dp_write_all(fd, buf, n * sizeof(float), NULL) < 0)
            return -1;
        done += n * sizeof(float);
    }
    return 0;
}

int dp_safetensors_save_source(const char *path, const dp_st_tensor *tensors, int n_tensors,
                               const dp_st_meta *meta, int n_meta, const dp_st_source *src,
                               dp_err *err)
{
    if (!path)
        return dp_errf(err, "safetensors save: no path");
    uint64_t *bytes = NULL;
    unsigned char *head = NULL;
    float *buf = NULL;
    dp_atomic_file af = {.fd = -1};
    size_t head_len = 0;

    bytes = malloc(((size_t)(n_tensors > 0 ? n_tensors : 0) + 1) * sizeof *bytes);
    if (!bytes)
        return dp_errf(err, "%s: out of memory", path);
    if (check_save_args(path, tensors, n_tensors, meta, n_meta, bytes, src && src->fill, err) < 0)
        goto fail;
    head = build_header(path, tensors, n_tensors, meta, n_meta, bytes, &head_len, err);
    if (!head)
        goto fail;
    if (src && src->fill && !(buf = malloc(FILL_FLOATS * sizeof(float)))) {
        dp_errf(err, "%s: out of memory", path);
        goto fail;
    }

    if (dp_atomic_open(&af, path, err) < 0)
        goto fail;
    if (dp_write_all(af.fd, head, head_len, NULL) < 0) {
        dp_errf(err, "%s: writing the header to %s: %s", path, af.tmp, strerror(errno));
        goto fail;
    }
    for (int i = 0; i < n_tensors; i++) {
        if (bytes[i] == 0) {
            if (src && src->seen)
                src->seen(src->ctx, i, NULL, 0);
            continue;
        }
        int rc = write_tensor(af.fd, &tensors[i], i, bytes[i], src, buf, err);
        if (rc == -1)
            dp_errf(err, "%s: writing tensor '%s' to %s: %s", path, tensors[i].name, af.tmp,
                    strerror(errno));
        if (rc < 0)
            goto fail;
    }
    if (src && src->done) { /* the metadata as it stands now, in a header of the same length */
        size_t again = 0;
        free(head);
        head = NULL;
        if (src->done(src->ctx, err) < 0 ||
            !(head = build_header(path, tensors, n_tensors, meta, n_meta, bytes, &again, err)))
            goto fail;
        if (again != head_len) {
            dp_errf(err, "%s: the final header is %zu bytes, the first %zu", path, again, head_len);
            goto fail;
        }
        if (pwrite(af.fd, head, head_len, 0) != (ssize_t)head_len) {
            dp_errf(err, "%s: rewriting the header of %s: %s", path, af.tmp, strerror(errno));
            goto fail;
        }
    }
    free(buf);
    free(head);
    free(bytes);
    return dp_atomic_commit(&af, err);

fail:
    dp_atomic_abort(&af);
    free(buf);
    free(head);
    free(bytes);
    return -1;
}

/* ---- reader ------------------------------------------------------------ */

/* Checks the 8-byte header length n of a file or buffer of `size` bytes:
 * bounded, and within the size, before anything is allocated for it. */
static int check_header_length(const char *what, const unsigned char len8[8], size_t size,
                               uint64_t *hdr_len, dp_err *err)
{
    uint64_t n = 0;
    for (int k = 0; k < 8; k++)
        n |= (uint64_t)len8[k] << (8 * k);
    if (n > ST_HEADER_MAX)
        return dp_errf(err, "%s: header length %" PRIu64 " exceeds the %llu-byte limit", what, n,
                       ST_HEADER_MAX);
    if (n > size - 8)
        return dp_errf(err, "%s: header length %" PRIu64 " runs past the end of the file (%zu "
                            "bytes)",
                       what, n, size);
    *hdr_len = n;
    return 0;
}

static int check_size(const char *what, uint64_t size, dp_err *err)
{
    if (size < 8)
        return dp_errf(err, "%s: %llu bytes is too short for a safetensors file (at least 8)",
                       what, (unsigned long long)size);
    if (size > (uint64_t)SIZE_MAX)
        return dp_errf(err, "%s: file too large", what);
    return 0;
}

/* Reads the whole file into a fresh buffer after checking the header length;
 * with keep_fd, only the length and the header, and *keep_fd gets the open
 * file (the data stays there: dp_safetensors_open). */
static int read_file(const char *path, unsigned char **out, size_t *out_len, uint64_t *hdr_len,
                     int *keep_fd, dp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dp_errf(err, "cannot open %s: %s", path, strerror(errno));
    unsigned char *buf = NULL;
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        dp_errf(err, "%s: fstat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        dp_errf(err, "%s: not a regular file", path);
        goto fail;
    }
    if (check_size(path, (uint64_t)sb.st_size, err) < 0)
        goto fail;
    size_t size = (size_t)sb.st_size;
    unsigned char len8[8];
    ssize_t r;
    do {
        r = pread(fd, len8, 8, 0);
    } while (r < 0 && errno == EINTR);
    if (r != 8) {
        dp_errf(err, "%s: cannot read the header length: %s", path,
                r < 0 ? strerror(errno) : "short read");
        goto fail;
    }
    if (check_header_length(path, len8, size, hdr_len, err) < 0)
        goto fail;
    size_t want = keep_fd ? 8 + (size_t)*hdr_len : size;
    buf = malloc(want);
    if (!buf) {
        dp_errf(err, "%s: out of memory for %zu bytes", path, want);
        goto fail;
    }
    size_t got = 0;
    while (got < want) {
        size_t chunk = want - got > (1u << 30) ? (1u << 30) : want - got;
        r = read(fd, buf + got, chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            dp_errf(err, "%s: read: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0) {
            dp_errf(err, "%s: file shrank while reading (%zu of %zu bytes)", path, got, want);
            goto fail;
        }
        got += (size_t)r;
    }
    if (keep_fd)
        *keep_fd = fd;
    else
        close(fd);
    *out = buf;
    *out_len = size;
    return 0;
fail:
    free(buf);
    close(fd);
    return -1;
}

/* A non-negative integral JSON number no larger than 2^53. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_INT_MAX) || d != (double)(uint64_t)d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

/* One parsed tensor entry before it is placed in the handle. */
typedef struct st_entry {
    const char *name; /* points into the cJSON tree */
    int ndim;
    int64_t shape[DP_ST_MAX_DIMS];
    uint64_t begin, end;
    int index; /* header order, the tie-breaker for zero-size tensors */
} st_entry;

static int cmp_entry_offset(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int parse_entry(const char *path, const cJSON *item, uint64_t data_len, st_entry *e,
                       dp_err *err)
{
    const char *name = item->string;
    e->name = name;
    if (!cJSON_IsObject(item))
        return dp_errf(err, "%s: tensor '%s': entry is not an object", path, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype))
        return dp_errf(err, "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
    if (strcmp(dtype->valuestring, "F32") != 0)
        return dp_errf(err, "%s: tensor '%s': dtype %s is not supported (only F32)", path, name,
                       dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return dp_errf(err, "%s: tensor '%s': missing or non-array \"shape\"", path, name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > DP_ST_MAX_DIMS)
        return dp_errf(err, "%s: tensor '%s': %d dimensions (at most %d)", path, name, nd,
                       DP_ST_MAX_DIMS);
    e->ndim = nd;
    int d = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++) {
        uint64_t u;
        if (json_uint(v, &u) < 0)
            return dp_errf(err, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                           path, name, d);
        e->shape[d] = (int64_t)u;
    }
    char shp[ST_SHAPE_STR];
    shape_str(shp, sizeof shp, e->shape, nd);
    uint64_t bytes;
    if (shape_bytes(e->shape, nd, &bytes) < 0)
        return dp_errf(err, "%s: tensor '%s': shape %s overflows", path, name, shp);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_uint(offs->child, &e->begin) < 0 || json_uint(offs->child->next, &e->end) < 0)
        return dp_errf(err, "%s: tensor '%s': \"data_offsets\" must be two non-negative integers",
                       path, name);
    if (e->begin > e->end || e->end > data_len)
        return dp_errf(err,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] are outside the data area of %" PRIu64 " bytes",
                       path, name, e->begin, e->end, data_len);
    if (e->end - e->begin != bytes)
        return dp_errf(err,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] do not match shape %s of F32 (%" PRIu64 " bytes)",
                       path, name, e->begin, e->end, shp, bytes);
    return 0;
}

static int parse_meta(const char *path, const cJSON *m, dp_err *err)
{
    if (cJSON_IsNull(m))
        return 0;
    if (!cJSON_IsObject(m))
        return dp_errf(err, "%s: \"__metadata__\" is not an object", path);
    int n = 0;
    for (const cJSON *v = m->child; v; v = v->next, n++)
        if (!cJSON_IsString(v))
            return dp_errf(err, "%s: metadata '%s' is not a string", path, v->string);
    if (n < 2)
        return 0;
    const char **keys = malloc((size_t)n * sizeof *keys);
    if (!keys)
        return dp_errf(err, "%s: out of memory for %d metadata entries", path, n);
    n = 0;
    for (const cJSON *v = m->child; v; v = v->next)
        keys[n++] = v->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_str_ptr);
    int rc = 0;
    for (int i = 1; i < n && rc == 0; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            rc = dp_errf(err, "%s: duplicate metadata key '%s'", path, keys[i]);
    free(keys);
    return rc;
}

/* Validates the parsed header and fills the handle's tensors, metadata and index. */
static int build_index(const char *path, dp_safetensors *st, const cJSON *root, uint64_t data_len,
                       size_t data_base, dp_err *err)
{
    int rc = -1;
    st_entry *ents = NULL;
    const cJSON *meta = NULL;
    int n = 0;
    size_t str_bytes = 0;

    for (const cJSON *c = root->child; c; c = c->next) {
        if (!c->string)
            return dp_errf(err, "%s: header entry without a name", path);
        str_bytes += strlen(c->string) + 1;
        if (strcmp(c->string, "__metadata__") == 0) {
            if (meta)
                return dp_errf(err, "%s: duplicate \"__metadata__\"", path);
            meta = c;
        } else {
            n++;
        }
    }
    if (meta) {
        if (parse_meta(path, meta, err) < 0)
            return -1;
        for (const cJSON *v = meta->child; v; v = v->next) {
            st->n_meta++;
            str_bytes += strlen(v->string) + strlen(v->valuestring) + 2;
        }
    }

    ents = malloc(((size_t)n + 1) * sizeof *ents);
    if (st->fd >= 0 && !(st->begin = malloc(((size_t)n + 1) * sizeof *st->begin))) {
        free(ents);
        return dp_errf(err, "%s: out of memory for %d tensors", path, n);
    }
    st->tensors = malloc(((size_t)n + 1) * sizeof *st->tensors);
    st->by_name = malloc(((size_t)n + 1) * sizeof *st->by_name);
    st->meta = malloc(((size_t)st->n_meta + 1) * sizeof *st->meta);
    st->strings = malloc(str_bytes + 1);
    if (!ents || !st->tensors || !st->by_name || !st->meta || !st->strings) {
        dp_errf(err, "%s: out of memory for %d tensors", path, n);
        goto out;
    }

    int i = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == meta)
            continue;
        if (parse_entry(path, c, data_len, &ents[i], err) < 0)
            goto out;
        ents[i].index = i;
        i++;
    }

    /* Sorted by offset the tensors must tile the data area exactly. */
    qsort(ents, (size_t)n, sizeof *ents, cmp_entry_offset);
    uint64_t expect = 0;
    for (i = 0; i < n; i++) {
        if (ents[i].begin < expect) {
            dp_errf(err, "%s: tensor '%s' (bytes [%" PRIu64 ", %" PRIu64
                         "]) overlaps tensor '%s' (ending at %" PRIu64 ")",
                    path, ents[i].name, ents[i].begin, ents[i].end, ents[i - 1].name, expect);
            goto out;
        }
        if (ents[i].begin > expect) {
            dp_errf(err, "%s: gap in the data area: bytes [%" PRIu64 ", %" PRIu64
                         ") before tensor '%s' belong to no tensor",
                    path, expect, ents[i].begin, ents[i].name);
            goto out;
        }
        expect = ents[i].end;
    }
    if (expect != data_len) {
        dp_errf(err, "%s: data area has %" PRIu64 " bytes but the tensors cover %" PRIu64, path,
                data_len, expect);
        goto out;
    }

    char *s = st->strings;
    for (i = 0; i < n; i++) {
        dp_st_tensor *t = &st->tensors[i];
        size_t l = strlen(ents[i].name) + 1;
        memcpy(s, ents[i].name, l);
        t->name = s;
        s += l;
        if (st->fd >= 0) /* opened: the data stays in the file */
            st->begin[i] = ents[i].begin;
        t->data = st->fd >= 0 ? NULL
                              : (const float *)(void *)(st->buf + data_base + ents[i].begin);
        t->ndim = ents[i].ndim;
        memset(t->shape, 0, sizeof t->shape);
        memcpy(t->shape, ents[i].shape, (size_t)t->ndim * sizeof t->shape[0]);
        st->by_name[i] = t;
    }
    st->n = n;
    qsort(st->by_name, (size_t)n, sizeof *st->by_name, cmp_tensor_name);
    for (i = 1; i < n; i++) {
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0) {
            dp_errf(err, "%s: duplicate tensor name '%s'", path, st->by_name[i]->name);
            goto out;
        }
    }
    i = 0;
    if (meta) {
        for (const cJSON *v = meta->child; v; v = v->next, i++) {
            size_t kl = strlen(v->string) + 1, vl = strlen(v->valuestring) + 1;
            memcpy(s, v->string, kl);
            st->meta[i].key = s;
            s += kl;
            memcpy(s, v->valuestring, vl);
            st->meta[i].value = s;
            s += vl;
        }
    }
    rc = 0;
out:
    free(ents);
    return rc;
}

/* Validates st->buf (size bytes, header length n already checked) and
 * indexes it.  `path` names the source in messages.  On failure st is freed. */
static int parse_loaded(const char *path, dp_safetensors *st, size_t size, uint64_t n,
                        dp_safetensors **out, dp_err *err)
{
    cJSON *root = NULL;
    const unsigned char *hdr = st->buf + 8;
    size_t bad = utf8_check(hdr, (size_t)n);
    if (bad != n) {
        dp_errf(err, "%s: header is not valid UTF-8 (at byte %zu of the header)", path, bad);
        goto fail;
    }
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts((const char *)hdr, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - (const char *)hdr) : 0;
        dp_errf(err, "%s: header is not valid JSON (error near byte %zu of the %" PRIu64
                     "-byte header)", path, at, n);
        goto fail;
    }
    if (!end)
        end = (const char *)hdr + n;
    for (const char *p = end; p < (const char *)hdr + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            dp_errf(err, "%s: header has bytes after the JSON object (at byte %zu of the header)",
                    path, (size_t)(p - (const char *)hdr));
            goto fail;
        }
    }
    if (!cJSON_IsObject(root)) {
        dp_errf(err, "%s: header is not a JSON object", path);
        goto fail;
    }

    /* The data area must be aligned for float: move it to an 8-aligned offset
     * inside the (already parsed) header region when the file's is not. */
    size_t data_off = 8 + (size_t)n;
    size_t data_len = size - data_off;
    size_t base = data_off & ~(size_t)7;

    if (build_index(path, st, root, data_len, base, err) < 0)
        goto fail;
    cJSON_Delete(root);
    st->data_off = data_off;
    if (st->fd < 0 && base != data_off)
        memmove(st->buf + base, st->buf + data_off, data_len);
    *out = st;
    return 0;
fail:
    cJSON_Delete(root);
    dp_safetensors_free(st);
    return -1;
}

/* load (whole: keep_open 0) or open (the header only, the file kept open). */
static int load_or_open(const char *path, dp_safetensors **out, int keep_open, dp_err *err)
{
    const char *what = keep_open ? "open" : "load";
    if (!out)
        return dp_errf(err, "safetensors %s: no output handle", what);
    *out = NULL;
    if (!path)
        return dp_errf(err, "safetensors %s: no path", what);
    dp_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return dp_errf(err, "%s: out of memory", path);
    st->fd = -1;
    size_t size = 0;
    uint64_t n = 0;
    int fd = -1;
    if (read_file(path, &st->buf, &size, &n, keep_open ? &fd : NULL, err) < 0) {
        dp_safetensors_free(st);
        return -1;
    }
    st->fd = fd; /* opened: the checks of the header are load's, with the file's size */
    return parse_loaded(path, st, size, n, out, err);
}

int dp_safetensors_load(const char *path, dp_safetensors **out, dp_err *err)
{
    return load_or_open(path, out, 0, err);
}

int dp_safetensors_open(const char *path, dp_safetensors **out, dp_err *err)
{
    return load_or_open(path, out, 1, err);
}

int dp_safetensors_read(const dp_safetensors *st, const dp_st_tensor *t, uint64_t off,
                        void *buf, size_t len, dp_err *err)
{
    if (!st || !t || t < st->tensors || t >= st->tensors + st->n)
        return dp_errf(err, "safetensors read: not a tensor of this file");
    uint64_t bytes = 4;
    for (int d = 0; d < t->ndim; d++)
        bytes *= (uint64_t)t->shape[d];
    if (off > bytes || len > bytes - off)
        return dp_errf(err, "tensor '%s': bytes [%" PRIu64 ", +%zu) lie outside its %" PRIu64,
                       t->name, off, len, bytes);
    if (t->data) {
        memcpy(buf, (const unsigned char *)t->data + off, len);
        return 0;
    }
    uint64_t at = st->data_off + st->begin[t - st->tensors] + off;
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t r = pread(st->fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return dp_errf(err, "tensor '%s': reading the file: %s", t->name,
                           r < 0 ? strerror(errno) : "it ends early (shrank since it was opened)");
        p += r;
        at += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

int dp_safetensors_load_mem(const void *buf, size_t len, dp_safetensors **out, dp_err *err)
{
    static const char what[] = "safetensors buffer";
    if (!out)
        return dp_errf(err, "safetensors load: no output handle");
    *out = NULL;
    if (!buf && len > 0)
        return dp_errf(err, "%s: NULL with %zu bytes", what, len);
    uint64_t n = 0;
    if (check_size(what, len, err) < 0 || check_header_length(what, buf, len, &n, err) < 0)
        return -1;
    dp_safetensors *st = calloc(1, sizeof *st);
    if (st)
        st->fd = -1;
    if (!st || !(st->buf = malloc(len))) {
        free(st);
        return dp_errf(err, "%s: out of memory for %zu bytes", what, len);
    }
    memcpy(st->buf, buf, len); /* the handle owns its bytes, aligned for float */
    return parse_loaded(what, st, len, n, out, err);
}

void dp_safetensors_free(dp_safetensors *st)
{
    if (!st)
        return;
    if (st->fd >= 0)
        close(st->fd);
    free(st->buf);
    free(st->begin);
    free(st->tensors);
    free(st->by_name);
    free(st->meta);
    free(st->strings);
    free(st);
}

int dp_safetensors_count(const dp_safetensors *st)
{
    return st ? st->n : 0;
}

const dp_st_tensor *dp_safetensors_at(const dp_safetensors *st, int i)
{
    if (!st || i < 0 || i >= st->n)
        return NULL;
    return &st->tensors[i];
}

const dp_st_tensor *dp_safetensors_find(const dp_safetensors *st, const char *name)
{
    if (!st || !name)
        return NULL;
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->by_name[mid]->name);
        if (c == 0)
            return st->by_name[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *dp_safetensors_meta(const dp_safetensors *st, const char *key)
{
    if (!st || !key)
        return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0)
            return st->meta[i].value;
    return NULL;
}
