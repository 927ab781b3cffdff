/* tf.train.Example decoder and encoder (example.h).
 *
 * An explicit decoder rather than protobuf-c: the Example schema is five
 * fixed messages of one or three fields, so the whole wire format it needs
 * (varints, fixed32 floats, length-delimited fields, packed and unpacked
 * repeats) is a page of code we can bound and fuzz, where protobuf-c would
 * bring a generated file, a runtime library and a per-record tree of
 * mallocs for every Example.
 *
 * Decoding is one pass over the bytes.  Values go to three arrays (bytes
 * views, floats, int64s) that only grow; a feature is a start and a count in
 * its kind's array.  Every repeat of a feature's list lands contiguously
 * because a feature's bytes are decoded before the next feature's, which is
 * what lets a list given twice merge by extending its count.  At the end the
 * features are sorted by name (keeping the last of equal names, as protobuf
 * map parsing does) and the public dp_feature array points into the arrays. */
#include "downpour/example.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/varint.h"

/* Protobuf wire types. */
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_FIXED32 = 5 };

typedef struct feat {
    size_t name_off;  /* into names; (size_t)-1: no key seen yet */
    dp_feature_kind kind;
    size_t start, count; /* in the kind's array */
    size_t order;     /* entry order, so the last of equal names wins */
} feat;

struct dp_example {
    feat *feats;
    size_t nfeat, feat_cap;
    char *names;
    size_t names_len, names_cap;
    dp_bytes *bytes;
    size_t nbytes, bytes_cap;
    float *floats;
    size_t nfloats, floats_cap;
    int64_t *ints;
    size_t nints, ints_cap;
    dp_feature *pub; /* sorted, deduplicated */
    size_t npub, pub_cap;
};

/* Where the decoder is, for messages: the field path is built only on error. */
typedef enum level { AT_EXAMPLE, AT_FEATURES, AT_ENTRY, AT_FEATURE, AT_LIST } level;

typedef struct where {
    level lv;
    const dp_example *ex;
    const feat *f;        /* AT_ENTRY and below */
    dp_feature_kind kind; /* AT_LIST */
} where;

typedef struct cur {
    const uint8_t *p, *end;
} cur;

static const char *const kind_names[DP_FEATURE_KIND_COUNT] = {
    "none", "bytes_list", "float_list", "int64_list"};

const char *dp_feature_kind_name(dp_feature_kind kind)
{
    return (unsigned)kind < DP_FEATURE_KIND_COUNT ? kind_names[kind] : "unknown";
}

/* The field path of w, with `field` (a field name, or NULL) appended. */
static int refuse(const where *w, const char *field, dp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int refuse(const where *w, const char *field, dp_err *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    char path[160], msg[DP_ERR_MAX];
    int n = snprintf(path, sizeof path, "Example");
    if (w->lv >= AT_FEATURES)
        n += snprintf(path + n, sizeof path - (size_t)n, ".features");
    if (w->lv >= AT_ENTRY) {
        const feat *f = w->f;
        if (f->name_off != (size_t)-1)
            n += snprintf(path + n, sizeof path - (size_t)n, ".feature[\"%.48s%s\"]",
                          w->ex->names + f->name_off,
                          strlen(w->ex->names + f->name_off) > 48 ? "..." : "");
        else
            n += snprintf(path + n, sizeof path - (size_t)n, ".feature[entry %zu, no key yet]",
                          f->order);
    }
    if (w->lv >= AT_LIST)
        n += snprintf(path + n, sizeof path - (size_t)n, ".%s", kind_names[w->kind]);
    if (field)
        snprintf(path + n, sizeof path - (size_t)n, ".%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dp_errf(err, "%s: %s", path, msg);
}

/* ---- wire reading ---- */

/* 0, or -1 with *why set. */
static int get_varint(cur *c, uint64_t *v, const char **why)
{
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (c->p == c->end) {
            *why = "varint runs past the end of the message";
            return -1;
        }
        uint8_t b = *c->p++;
        if (i == 9 && b > 1) {
            *why = "varint overflows 64 bits";
            return -1;
        }
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    *why = "varint longer than 10 bytes";
    return -1;
}

/* Reads a field's key.  Returns 1 with *field and *wt, 0 at the end of the
 * message, -1 on error. */
static int get_key(cur *c, uint32_t *field, int *wt, const where *w, dp_err *err)
{
    if (c->p == c->end)
        return 0;
    uint64_t k;
    const char *why;
    if (get_varint(c, &k, &why) < 0)
        return refuse(w, NULL, err, "field key: %s", why);
    if (k >> 32 || (k >> 3) == 0)
        return refuse(w, NULL, err, "field number %llu is out of range (1..2^29-1)",
                      (unsigned long long)(k >> 3));
    *field = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    return 1;
}

/* A length-delimited field's bytes as sub. */
static int get_len(cur *c, cur *sub, const where *w, const char *field, dp_err *err)
{
    uint64_t n;
    const char *why;
    if (get_varint(c, &n, &why) < 0)
        return refuse(w, field, err, "length: %s", why);
    size_t left = (size_t)(c->end - c->p);
    if (n > left)
        return refuse(w, field, err, "length %llu runs past the end of the message (%zu bytes "
                      "left)", (unsigned long long)n, left);
    sub->p = c->p;
    sub->end = c->p + n;
    c->p += n;
    return 0;
}

/* Skips an unknown field's value. */
static int skip(cur *c, uint32_t field, int wt, const where *w, dp_err *err)
{
    char name[32];
    snprintf(name, sizeof name, "<field %u>", field);
    uint64_t v;
    const char *why;
    cur sub;
    switch (wt) {
    case WT_VARINT:
        if (get_varint(c, &v, &why) < 0)
            return refuse(w, name, err, "%s", why);
        return 0;
    case WT_FIXED64:
    case WT_FIXED32: {
        size_t n = wt == WT_FIXED64 ? 8 : 4;
        if ((size_t)(c->end - c->p) < n)
            return refuse(w, name, err, "%zu-byte value runs past the end of the message", n);
        c->p += n;
        return 0;
    }
    case WT_LEN:
        return get_len(c, &sub, w, name, err);
    case WT_SGROUP:
    case WT_EGROUP:
        return refuse(w, name, err, "group wire type %d is not supported", wt);
    default:
        return refuse(w, name, err, "invalid wire type %d", wt);
    }
}

static int wrong_type(const where *w, const char *field, int wt, int want, dp_err *err)
{
    return refuse(w, field, err, "wire type %d, expected %d", wt, want);
}

/* ---- growing arrays ---- */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    if (n > (size_t)-1 / elem)
        return -1;
    void *q = realloc(*p, n * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

#define GROW(ex, arr, len, cap, add) grow((void **)&(ex)->arr, &(ex)->cap, (ex)->len + (add), sizeof *(ex)->arr)

static int oom(const where *w, dp_err *err)
{
    return refuse(w, NULL, err, "out of memory");
}

/* ---- the messages, innermost first ---- */

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_float(float *dst, const uint8_t *p)
{
    uint32_t u = le32(p);
    memcpy(dst, &u, 4);
}

/* BytesList, FloatList or Int64List into f's values. */
static int decode_list(dp_example *ex, feat *f, cur c, dp_err *err)
{
    where w = {AT_LIST, ex, f, f->kind};
    uint32_t field;
    int wt, r;
    while ((r = get_key(&c, &field, &wt, &w, err)) == 1) {
        if (field != 1) {
            if (skip(&c, field, wt, &w, err) < 0)
                return -1;
            continue;
        }
        cur v;
        const char *why;
        switch (f->kind) {
        case DP_FEATURE_BYTES:
            if (wt != WT_LEN)
                return wrong_type(&w, "value", wt, WT_LEN, err);
            if (get_len(&c, &v, &w, "value", err) < 0)
                return -1;
            if (GROW(ex, bytes, nbytes, bytes_cap, 1) < 0)
                return oom(&w, err);
            ex->bytes[ex->nbytes++] = (dp_bytes){v.p, (size_t)(v.end - v.p)};
            break;
        case DP_FEATURE_FLOAT:
            if (wt == WT_FIXED32) { /* unpacked */
                if (c.end - c.p < 4)
                    return refuse(&w, "value", err, "float runs past the end of the message");
                if (GROW(ex, floats, nfloats, floats_cap, 1) < 0)
                    return oom(&w, err);
                put_float(&ex->floats[ex->nfloats++], c.p);
                c.p += 4;
            } else if (wt == WT_LEN) { /* packed */
                if (get_len(&c, &v, &w, "value", err) < 0)
                    return -1;
                size_t n = (size_t)(v.end - v.p);
                if (n % 4)
                    return refuse(&w, "value", err, "packed floats: length %zu is not a "
                                  "multiple of 4", n);
                if (GROW(ex, floats, nfloats, floats_cap, n / 4) < 0)
                    return oom(&w, err);
                for (size_t i = 0; i < n / 4; i++)
                    put_float(&ex->floats[ex->nfloats++], v.p + 4 * i);
            } else {
                return wrong_type(&w, "value", wt, WT_LEN, err);
            }
            break;
        case DP_FEATURE_INT64: {
            uint64_t x;
            if (wt == WT_VARINT) { /* unpacked */
                if (get_varint(&c, &x, &why) < 0)
                    return refuse(&w, "value", err, "%s", why);
                if (GROW(ex, ints, nints, ints_cap, 1) < 0)
                    return oom(&w, err);
                ex->ints[ex->nints++] = (int64_t)x;
            } else if (wt == WT_LEN) { /* packed: as many varints as fill the length */
                if (get_len(&c, &v, &w, "value", err) < 0)
                    return -1;
                while (v.p < v.end) {
                    if (get_varint(&v, &x, &why) < 0)
                        return refuse(&w, "value", err, "packed int64s: %s", why);
                    if (GROW(ex, ints, nints, ints_cap, 1) < 0)
                        return oom(&w, err);
                    ex->ints[ex->nints++] = (int64_t)x;
                }
            } else {
                return wrong_type(&w, "value", wt, WT_LEN, err);
            }
            break;
        }
        default:
            return refuse(&w, NULL, err, "internal: list of kind %d", (int)f->kind);
        }
    }
    if (r < 0)
        return -1;
    switch (f->kind) {
    case DP_FEATURE_BYTES: f->count = ex->nbytes - f->start; break;
    case DP_FEATURE_FLOAT: f->count = ex->nfloats - f->start; break;
    default: f->count = ex->nints - f->start; break;
    }
    return 0;
}

/* The end of kind's array: where a new list of that kind starts. */
static size_t kind_end(const dp_example *ex, dp_feature_kind k)
{
    return k == DP_FEATURE_BYTES ? ex->nbytes : k == DP_FEATURE_FLOAT ? ex->nfloats : ex->nints;
}

/* Feature: a oneof of the three lists. */
static int decode_feature(dp_example *ex, feat *f, cur c, dp_err *err)
{
    where w = {AT_FEATURE, ex, f, f->kind};
    static const char *const fields[4] = {NULL, "bytes_list", "float_list", "int64_list"};
    uint32_t field;
    int wt, r;
    while ((r = get_key(&c, &field, &wt, &w, err)) == 1) {
        if (field < 1 || field > 3) {
            if (skip(&c, field, wt, &w, err) < 0)
                return -1;
            continue;
        }
        if (wt != WT_LEN)
            return wrong_type(&w, fields[field], wt, WT_LEN, err);
        cur sub;
        if (get_len(&c, &sub, &w, fields[field], err) < 0)
            return -1;
        dp_feature_kind k = (dp_feature_kind)field; /* the field numbers are the kinds */
        if (f->kind != k) { /* another oneof member replaces the list */
            f->kind = k;
            f->start = kind_end(ex, k);
            f->count = 0;
        }
        if (decode_list(ex, f, sub, err) < 0)
            return -1;
    }
    return r;
}

/* A map entry: key = 1 (the name), value = 2 (a Feature). */
static int decode_entry(dp_example *ex, cur c, dp_err *err)
{
    if (GROW(ex, feats, nfeat, feat_cap, 1) < 0)
        return dp_errf(err, "Example.features.feature: out of memory");
    feat *f = &ex->feats[ex->nfeat];
    *f = (feat){(size_t)-1, DP_FEATURE_NONE, 0, 0, ex->nfeat};
    ex->nfeat++;
    where w = {AT_ENTRY, ex, f, DP_FEATURE_NONE};
    uint32_t field;
    int wt, r;
    while ((r = get_key(&c, &field, &wt, &w, err)) == 1) {
        cur sub;
        if (field == 1) {
            if (wt != WT_LEN)
                return wrong_type(&w, "key", wt, WT_LEN, err);
            if (get_len(&c, &sub, &w, "key", err) < 0)
                return -1;
            size_t n = (size_t)(sub.end - sub.p);
            if (memchr(sub.p, 0, n))
                return refuse(&w, "key", err, "feature name holds a NUL byte");
            if (GROW(ex, names, names_len, names_cap, n + 1) < 0)
                return oom(&w, err);
            memcpy(ex->names + ex->names_len, sub.p, n);
            ex->names[ex->names_len + n] = '\0';
            f->name_off = ex->names_len;
            ex->names_len += n + 1;
        } else if (field == 2) {
            if (wt != WT_LEN)
                return wrong_type(&w, "value", wt, WT_LEN, err);
            if (get_len(&c, &sub, &w, "value", err) < 0 || decode_feature(ex, f, sub, err) < 0)
                return -1;
        } else if (skip(&c, field, wt, &w, err) < 0) {
            return -1;
        }
    }
    if (r < 0)
        return -1;
    if (f->name_off == (size_t)-1) { /* a map entry without a key has the key "" */
        if (GROW(ex, names, names_len, names_cap, 1) < 0)
            return oom(&w, err);
        ex->names[ex->names_len] = '\0';
        f->name_off = ex->names_len++;
    }
    return 0;
}

static int decode_features(dp_example *ex, cur c, dp_err *err)
{
    where w = {AT_FEATURES, ex, NULL, DP_FEATURE_NONE};
    uint32_t field;
    int wt, r;
    while ((r = get_key(&c, &field, &wt, &w, err)) == 1) {
        if (field != 1) {
            if (skip(&c, field, wt, &w, err) < 0)
                return -1;
            continue;
        }
        if (wt != WT_LEN)
            return wrong_type(&w, "feature", wt, WT_LEN, err);
        cur sub;
        if (get_len(&c, &sub, &w, "feature", err) < 0 || decode_entry(ex, sub, err) < 0)
            return -1;
    }
    return r;
}

static int by_name_then_order(const void *a, const void *b)
{
    const dp_feature *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    /* order is kept in count's place until the sort is done */
    return x->count < y->count ? -1 : x->count > y->count;
}

/* Builds the sorted public array, the last of equal names winning. */
static int publish(dp_example *ex, dp_err *err)
{
    if (grow((void **)&ex->pub, &ex->pub_cap, ex->nfeat, sizeof *ex->pub) < 0)
        return dp_errf(err, "Example.features: out of memory");
    if (ex->nfeat == 0) { /* qsort's base must not be NULL */
        ex->npub = 0;
        return 0;
    }
    for (size_t i = 0; i < ex->nfeat; i++)
        ex->pub[i] = (dp_feature){ex->names + ex->feats[i].name_off, DP_FEATURE_NONE, i,
                                  NULL, NULL, NULL};
    qsort(ex->pub, ex->nfeat, sizeof *ex->pub, by_name_then_order);
    size_t n = 0;
    for (size_t i = 0; i < ex->nfeat; i++) {
        if (i + 1 < ex->nfeat && strcmp(ex->pub[i].name, ex->pub[i + 1].name) == 0)
            continue; /* a later entry has this name */
        const feat *f = &ex->feats[ex->pub[i].count];
        dp_feature *d = &ex->pub[n++];
        d->name = ex->pub[i].name;
        d->kind = f->kind;
        d->count = f->count;
        /* an empty list may come before any array was allocated: no offset
         * from NULL (undefined even when it is 0) */
        d->bytes = f->kind == DP_FEATURE_BYTES && ex->bytes ? ex->bytes + f->start : NULL;
        d->floats = f->kind == DP_FEATURE_FLOAT && ex->floats ? ex->floats + f->start : NULL;
        d->int64s = f->kind == DP_FEATURE_INT64 && ex->ints ? ex->ints + f->start : NULL;
    }
    ex->npub = n;
    return 0;
}

static void clear(dp_example *ex)
{
    ex->nfeat = ex->names_len = ex->nbytes = ex->nfloats = ex->nints = ex->npub = 0;
}

int dp_example_decode(dp_example *ex, const uint8_t *buf, size_t len, dp_err *err)
{
    clear(ex);
    cur c = {buf, buf + len};
    where w = {AT_EXAMPLE, ex, NULL, DP_FEATURE_NONE};
    uint32_t field;
    int wt, r;
    while ((r = get_key(&c, &field, &wt, &w, err)) == 1) {
        if (field != 1) {
            if (skip(&c, field, wt, &w, err) < 0)
                goto fail;
            continue;
        }
        if (wt != WT_LEN) {
            wrong_type(&w, "features", wt, WT_LEN, err);
            goto fail;
        }
        cur sub;
        if (get_len(&c, &sub, &w, "features", err) < 0 || decode_features(ex, sub, err) < 0)
            goto fail;
    }
    if (r < 0 || publish(ex, err) < 0)
        goto fail;
    return 0;
fail:
    clear(ex);
    return -1;
}

dp_example *dp_example_new(void)
{
    return calloc(1, sizeof(dp_example));
}

size_t dp_example_bytes(const dp_example *ex)
{
    return sizeof *ex + ex->feat_cap * sizeof *ex->feats + ex->names_cap +
           ex->bytes_cap * sizeof *ex->bytes + ex->floats_cap * sizeof *ex->floats +
           ex->ints_cap * sizeof *ex->ints + ex->pub_cap * sizeof *ex->pub;
}

void dp_example_free(dp_example *ex)
{
    if (!ex)
        return;
    free(ex->feats);
    free(ex->names);
    free(ex->bytes);
    free(ex->floats);
    free(ex->ints);
    free(ex->pub);
    free(ex);
}

size_t dp_example_count(const dp_example *ex)
{
    return ex->npub;
}

const dp_feature *dp_example_feature(const dp_example *ex, size_t i)
{
    return i < ex->npub ? &ex->pub[i] : NULL;
}

const dp_feature *dp_example_find(const dp_example *ex, const char *name)
{
    size_t lo = 0, hi = ex->npub;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, ex->pub[mid].name);
        if (c == 0)
            return &ex->pub[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- encoder ---- */

/* A length-delimited field of n bytes: key, length, bytes. */
static size_t field_size(size_t n)
{
    return 1 + dp_varint_size(n) + n;
}

static size_t packed_ints_size(const dp_feature *f)
{
    size_t n = 0;
    for (size_t i = 0; i < f->count; i++)
        n += dp_varint_size((uint64_t)f->int64s[i]);
    return n;
}

/* The list message's size (BytesList, FloatList, Int64List). */
static size_t list_size(const dp_feature *f)
{
    size_t n = 0;
    switch (f->kind) {
    case DP_FEATURE_BYTES:
        for (size_t i = 0; i < f->count; i++)
            n += field_size(f->bytes[i].len);
        return n;
    case DP_FEATURE_FLOAT:
        return f->count ? field_size(4 * f->count) : 0;
    case DP_FEATURE_INT64:
        return f->count ? field_size(packed_ints_size(f)) : 0;
    default:
        return 0;
    }
}

static size_t feature_size(const dp_feature *f)
{
    return f->kind == DP_FEATURE_NONE || (unsigned)f->kind >= DP_FEATURE_KIND_COUNT
               ? 0 : field_size(list_size(f));
}

static size_t entry_size(const dp_feature *f)
{
    return field_size(strlen(f->name)) + field_size(feature_size(f));
}

static size_t features_size(const dp_feature *features, size_t n)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += field_size(entry_size(&features[i]));
    return s;
}

size_t dp_example_encoded_size(const dp_feature *features, size_t n)
{
    return field_size(features_size(features, n));
}

/* Key (field, wire type 2) and length. */
static size_t put_head(uint8_t *p, unsigned field, size_t len)
{
    p[0] = (uint8_t)(field << 3 | WT_LEN);
    return 1 + dp_put_varint(p + 1, len);
}

static size_t put_list(uint8_t *p, const dp_feature *f)
{
    size_t n = 0;
    switch (f->kind) {
    case DP_FEATURE_BYTES:
        for (size_t i = 0; i < f->count; i++) {
            n += put_head(p + n, 1, f->bytes[i].len);
            if (f->bytes[i].len)
                memcpy(p + n, f->bytes[i].data, f->bytes[i].len);
            n += f->bytes[i].len;
        }
        break;
    case DP_FEATURE_FLOAT:
        if (!f->count)
            break;
        n += put_head(p + n, 1, 4 * f->count);
        for (size_t i = 0; i < f->count; i++) {
            uint32_t u;
            memcpy(&u, &f->floats[i], 4);
            for (int b = 0; b < 4; b++)
                p[n++] = (uint8_t)(u >> (8 * b));
        }
        break;
    case DP_FEATURE_INT64:
        if (!f->count)
            break;
        n += put_head(p + n, 1, packed_ints_size(f));
        for (size_t i = 0; i < f->count; i++)
            n += dp_put_varint(p + n, (uint64_t)f->int64s[i]);
        break;
    default:
        break;
    }
    return n;
}

size_t dp_example_encode(uint8_t *out, const dp_feature *features, size_t n)
{
    size_t o = put_head(out, 1, features_size(features, n)); /* Example.features */
    for (size_t i = 0; i < n; i++) {
        const dp_feature *f = &features[i];
        size_t name_len = strlen(f->name);
        o += put_head(out + o, 1, entry_size(f)); /* Features.feature (a map entry) */
        o += put_head(out + o, 1, name_len);      /* key */
        memcpy(out + o, f->name, name_len);
        o += name_len;
        size_t fs = feature_size(f);
        o += put_head(out + o, 2, fs);            /* value */
        if (fs) {
            o += put_head(out + o, (unsigned)f->kind, list_size(f)); /* the oneof member */
            o += put_list(out + o, f);
        }
    }
    return o;
}
