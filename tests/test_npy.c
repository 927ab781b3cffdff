/* .npy / .npz reader: files written here byte by byte from the format specs
 * (.npy headers of versions 1-3; ZIP archives with stored and deflated
 * members, numpy's ZIP64 local headers and a ZIP64 end record) read back
 * exactly; every malformed file is refused naming it and what is wrong.
 * Where /usr/bin/python3 (or python3) has numpy, files numpy itself writes
 * (np.save, np.savez, np.savez_compressed, format versions 2.0 and 3.0,
 * big-endian, Fortran order) are read and compared too. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "bytes.h"
#include "check.h"
#include "scratch.h"
#include "downpour/npy.h"

static char scratch[1024];

static const char *path_of(const char *name)
{
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", scratch, name);
    return buf[k];
}

/* ---- building files ---- */

static void write_file(const char *name, const bytes *b) { write_bytes(path_of(name), b->p, b->n); }

/* ZIP members as numpy writes them: local header in ZIP64 form (sizes
 * 0xFFFFFFFF, the real ones in the extra field) when zip64_local. */
typedef struct zmember {
    const char *name;
    const uint8_t *data;
    size_t n;
    int deflate;
} zmember;

typedef struct zopts {
    int zip64_local;  /* numpy's force_zip64 local headers */
    int zip64_end;    /* central entries with 0xFFFFFFFF + ZIP64 extra, ZIP64 end record */
    uint16_t method_override; /* nonzero: write this method number in both headers */
    uint16_t flags;
    int bad_crc;      /* store a wrong CRC */
} zopts;

static bytes zip_make(const zmember *m, int nm, zopts o)
{
    bytes b = {0}, cd = {0};
    for (int i = 0; i < nm; i++) {
        uint8_t *comp = NULL;
        size_t clen = m[i].n;
        if (m[i].deflate) {
            z_stream zs;
            memset(&zs, 0, sizeof zs);
            REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
            size_t cap = deflateBound(&zs, (uLong)m[i].n) + 16;
            comp = malloc(cap);
            REQUIRE(comp != NULL);
            zs.next_in = (Bytef *)m[i].data;
            zs.avail_in = (uInt)m[i].n;
            zs.next_out = comp;
            zs.avail_out = (uInt)cap;
            REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
            clen = zs.total_out;
            deflateEnd(&zs);
        }
        uint32_t crc = (uint32_t)crc32(0, m[i].data, (uInt)m[i].n) ^ (o.bad_crc ? 1u : 0u);
        uint16_t method = o.method_override ? o.method_override : m[i].deflate ? 8 : 0;
        uint64_t off = b.n;
        size_t nl = strlen(m[i].name);
        put32(&b, 0x04034b50);
        put16(&b, o.zip64_local ? 45 : 20);
        put16(&b, o.flags);
        put16(&b, method);
        put16(&b, 0);
        put16(&b, 0x21);
        put32(&b, crc);
        put32(&b, o.zip64_local ? 0xFFFFFFFFu : (uint32_t)clen);
        put32(&b, o.zip64_local ? 0xFFFFFFFFu : (uint32_t)m[i].n);
        put16(&b, (uint32_t)nl);
        put16(&b, o.zip64_local ? 20 : 0);
        put(&b, m[i].name, nl);
        if (o.zip64_local) {
            put16(&b, 1);
            put16(&b, 16);
            put64(&b, m[i].n);
            put64(&b, clen);
        }
        put(&b, m[i].deflate ? comp : m[i].data, clen);
        free(comp);
        put32(&cd, 0x02014b50);
        put16(&cd, 45);
        put16(&cd, o.zip64_end ? 45 : 20);
        put16(&cd, o.flags);
        put16(&cd, method);
        put16(&cd, 0);
        put16(&cd, 0x21);
        put32(&cd, crc);
        put32(&cd, o.zip64_end ? 0xFFFFFFFFu : (uint32_t)clen);
        put32(&cd, o.zip64_end ? 0xFFFFFFFFu : (uint32_t)m[i].n);
        put16(&cd, (uint32_t)nl);
        put16(&cd, o.zip64_end ? 28 : 0);
        put16(&cd, 0);
        put16(&cd, 0);
        put16(&cd, 0);
        put32(&cd, 0);
        put32(&cd, o.zip64_end ? 0xFFFFFFFFu : (uint32_t)off);
        put(&cd, m[i].name, nl);
        if (o.zip64_end) {
            put16(&cd, 1);
            put16(&cd, 24);
            put64(&cd, m[i].n);
            put64(&cd, clen);
            put64(&cd, off);
        }
    }
    uint64_t cd_off = b.n;
    put(&b, cd.p, cd.n);
    if (o.zip64_end) {
        uint64_t e64 = b.n;
        put32(&b, 0x06064b50);
        put64(&b, 44);
        put16(&b, 45);
        put16(&b, 45);
        put32(&b, 0);
        put32(&b, 0);
        put64(&b, (uint64_t)nm);
        put64(&b, (uint64_t)nm);
        put64(&b, cd.n);
        put64(&b, cd_off);
        put32(&b, 0x07064b50);
        put32(&b, 0);
        put64(&b, e64);
        put32(&b, 1);
    }
    put32(&b, 0x06054b50);
    put16(&b, 0);
    put16(&b, 0);
    put16(&b, o.zip64_end ? 0xFFFF : (uint32_t)nm);
    put16(&b, o.zip64_end ? 0xFFFF : (uint32_t)nm);
    put32(&b, o.zip64_end ? 0xFFFFFFFFu : (uint32_t)cd.n);
    put32(&b, o.zip64_end ? 0xFFFFFFFFu : (uint32_t)cd_off);
    put16(&b, 0);
    free(cd.p);
    return b;
}

/* ---- checking ---- */

static dp_npy *open_ok(const char *name, const char *member)
{
    dp_npy *a = NULL;
    dp_err err = {{0}};
    int rc = dp_npy_open(&a, path_of(name), member, &err);
    CHECKF(rc == 0, "%s [%s]: %s", name, member ? member : "-", err.msg);
    return rc == 0 ? a : NULL;
}

/* The open fails with a message naming the file and containing `needle`. */
static void open_fails(const char *name, const char *member, const char *needle)
{
    dp_npy *a = NULL;
    dp_err err = {{0}};
    int rc = dp_npy_open(&a, path_of(name), member, &err);
    CHECKF(rc != 0 && a == NULL, "%s should be refused (%s)", name, needle);
    CHECKF(strstr(err.msg, name) != NULL, "message should name %s: %s", name, err.msg);
    CHECKF(strstr(err.msg, needle) != NULL, "message should say '%s': %s", needle, err.msg);
    dp_npy_close(a);
}

static void f32_fails(dp_npy *a, uint64_t lo, uint64_t hi, const char *needle)
{
    float out[64];
    dp_err err = {{0}};
    CHECKF(dp_npy_read_f32(a, lo, hi, out, &err) != 0, "rows [%llu, %llu) should be refused",
           (unsigned long long)lo, (unsigned long long)hi);
    CHECKF(strstr(err.msg, needle) != NULL, "message should say '%s': %s", needle, err.msg);
}

static void labels_fail(dp_npy *a, uint32_t classes, const char *needle)
{
    uint32_t out[64];
    dp_err err = {{0}};
    CHECKF(dp_npy_read_labels(a, 0, dp_npy_get_info(a)->rows, classes, out, &err) != 0,
           "labels should be refused (%s)", needle);
    CHECKF(strstr(err.msg, needle) != NULL, "message should say '%s': %s", needle, err.msg);
}

/* ---- the tests ---- */

static void test_versions_and_rows(void)
{
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i * 0.5f - 2.0f;
    bytes b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", v,
                       sizeof v);
    write_file("v1.npy", &b);
    free(b.p);
    dp_npy *a = open_ok("v1.npy", NULL);
    REQUIRE(a != NULL);
    const dp_npy_info *in = dp_npy_get_info(a);
    CHECK(in->version == 1 && in->ndim == 2 && in->rows == 3 && in->row_elems == 4);
    CHECK(in->dtype == DP_NPY_F32 && in->itemsize == 4 && !in->deflated);
    CHECK(strcmp(dp_npy_dtype_name(in->dtype), "float32") == 0);
    float out[12];
    dp_err err;
    CHECK(dp_npy_read_f32(a, 0, 3, out, &err) == 0);
    CHECK(memcmp(out, v, sizeof v) == 0);
    CHECK(dp_npy_read_f32(a, 1, 2, out, &err) == 0);
    CHECK(memcmp(out, v + 4, 4 * sizeof(float)) == 0);
    CHECK(dp_npy_read_f32(a, 2, 2, out, &err) == 0); /* an empty range */
    f32_fails(a, 2, 4, "outside the array's 3 rows");
    dp_npy_close(a);

    /* Versions 2.0 and 3.0: u32 header length; double quotes; no trailing comma. */
    uint8_t px[12];
    for (int i = 0; i < 12; i++)
        px[i] = (uint8_t)(i * 20);
    for (int ver = 2; ver <= 3; ver++) {
        b = npy_make(ver, "{\"descr\": \"|u1\", \"shape\": (2, 2, 3), \"fortran_order\": False}",
                     px, sizeof px);
        char name[32];
        snprintf(name, sizeof name, "v%d.npy", ver);
        write_file(name, &b);
        free(b.p);
        a = open_ok(name, NULL);
        REQUIRE(a != NULL);
        in = dp_npy_get_info(a);
        CHECK(in->version == ver && in->rows == 2 && in->row_elems == 6 && in->ndim == 3);
        CHECK(dp_npy_read_f32(a, 1, 2, out, &err) == 0);
        for (int i = 0; i < 6; i++)
            CHECK(out[i] == (float)px[6 + i]);
        dp_npy_close(a);
    }
}

/* Every supported dtype, both byte orders: the values -3..4 (0..7 unsigned). */
static void test_dtypes(void)
{
    static const struct {
        const char *descr;
        int size, sign, flt;
    } t[] = {
        {"|b1", 1, 0, 0}, {"|u1", 1, 0, 0}, {"|i1", 1, 1, 0}, {"<u2", 2, 0, 0},
        {">u2", 2, 0, 0}, {"<i2", 2, 1, 0}, {">i2", 2, 1, 0}, {"<u4", 4, 0, 0},
        {">u4", 4, 0, 0}, {"<i4", 4, 1, 0}, {">i4", 4, 1, 0}, {"<u8", 8, 0, 0},
        {">u8", 8, 0, 0}, {"<i8", 8, 1, 0}, {">i8", 8, 1, 0}, {"<f4", 4, 1, 1},
        {">f4", 4, 1, 1}, {"<f8", 8, 1, 1}, {">f8", 8, 1, 1},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        uint8_t data[8 * 8];
        double want[8];
        int be = t[k].descr[0] == '>';
        for (int i = 0; i < 8; i++) {
            double v = t[k].sign ? i - 3 : i;
            if (t[k].descr[1] == 'b')
                v = i % 2;
            want[i] = t[k].flt ? v + 0.25 : v;
            uint64_t bits;
            if (t[k].flt && t[k].size == 4) {
                float f = (float)want[i];
                uint32_t u;
                memcpy(&u, &f, 4);
                bits = u;
            } else if (t[k].flt) {
                memcpy(&bits, &want[i], 8);
            } else {
                bits = (uint64_t)(int64_t)v;
            }
            for (int j = 0; j < t[k].size; j++) {
                int shift = be ? (t[k].size - 1 - j) * 8 : j * 8;
                data[i * t[k].size + j] = (uint8_t)(bits >> shift);
            }
        }
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (8,), }",
                 t[k].descr);
        bytes b = npy_make(1, dict, data, 8 * (size_t)t[k].size);
        write_file("dt.npy", &b);
        free(b.p);
        dp_npy *a = open_ok("dt.npy", NULL);
        if (!a)
            continue;
        CHECK(dp_npy_get_info(a)->big_endian == (be && t[k].size > 1));
        float out[8];
        dp_err err = {{0}};
        CHECKF(dp_npy_read_f32(a, 0, 8, out, &err) == 0, "%s: %s", t[k].descr, err.msg);
        for (int i = 0; i < 8; i++)
            CHECKF(out[i] == (float)want[i], "%s [%d]: %g, want %g", t[k].descr, i, out[i],
                   want[i]);
        /* As labels: unsigned and bool pass; signed ones hold -3 at row 0. */
        uint32_t lab[8];
        if (!t[k].sign) {
            CHECKF(dp_npy_read_labels(a, 0, 8, 8, lab, &err) == 0, "%s: %s", t[k].descr,
                   err.msg);
            for (int i = 0; i < 8; i++)
                CHECK(lab[i] == (uint32_t)want[i]);
        } else {
            labels_fail(a, 8, t[k].flt ? "not an integer" : "label -3 at row 0 is negative");
        }
        dp_npy_close(a);
    }
}

static void test_labels(void)
{
    int64_t l[6] = {0, 9, 3, 10, 2, 1};
    bytes b = npy_make(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (6,), }", l,
                       sizeof l);
    write_file("lab.npy", &b);
    free(b.p);
    dp_npy *a = open_ok("lab.npy", NULL);
    REQUIRE(a != NULL);
    uint32_t out[6];
    dp_err err = {{0}};
    CHECK(dp_npy_read_labels(a, 0, 3, 10, out, &err) == 0);
    CHECK(out[0] == 0 && out[1] == 9 && out[2] == 3);
    labels_fail(a, 10, "label 10 at row 3 is not below the class count 10");
    CHECK(dp_npy_read_labels(a, 0, 6, 11, out, &err) == 0 && out[3] == 10);
    dp_npy_close(a);

    double f[3] = {1.0, 2.5, 0.0};
    b = npy_make(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 1), }", f, sizeof f);
    write_file("labf.npy", &b);
    free(b.p);
    a = open_ok("labf.npy", NULL);
    REQUIRE(a != NULL);
    CHECK(dp_npy_read_labels(a, 0, 1, 10, out, &err) == 0 && out[0] == 1);
    labels_fail(a, 10, "label 2.5 at row 1 is not an integer");
    dp_npy_close(a);

    uint8_t two[4] = {1, 2, 3, 4};
    b = npy_make(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", two, 4);
    write_file("lab2.npy", &b);
    free(b.p);
    a = open_ok("lab2.npy", NULL);
    REQUIRE(a != NULL);
    labels_fail(a, 10, "labels must have shape (n,) or (n, 1), this array has (2, 2)");
    dp_npy_close(a);
}

static void test_fortran(void)
{
    uint8_t d[6] = {1, 2, 3, 4, 5, 6};
    bytes b = npy_make(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (6,), }", d, 6);
    write_file("f1.npy", &b);
    free(b.p);
    dp_npy *a = open_ok("f1.npy", NULL);
    CHECK(a && dp_npy_get_info(a)->fortran_order == 1);
    dp_npy_close(a);
    b = npy_make(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (6, 1), }", d, 6);
    write_file("f61.npy", &b);
    free(b.p);
    a = open_ok("f61.npy", NULL);
    dp_npy_close(a);
    b = npy_make(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }", d, 6);
    write_file("f23.npy", &b);
    free(b.p);
    open_fails("f23.npy", NULL, "np.ascontiguousarray");
}

static void bad_npy(const char *name, int version, const char *dict, size_t data_len,
                    const char *needle)
{
    uint8_t *d = calloc(data_len ? data_len : 1, 1);
    REQUIRE(d != NULL);
    bytes b = npy_make(version, dict, d, data_len);
    write_file(name, &b);
    free(b.p);
    free(d);
    open_fails(name, NULL, needle);
}

static void test_malformed(void)
{
    const char *f44 = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }";
    bad_npy("trunc.npy", 1, f44, 63, "truncated: shape (4, 4) of <f4 needs 64 bytes");
    bad_npy("trail.npy", 1, f44, 65, "1 trailing bytes");
    bad_npy("overflow.npy", 1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 16,
            "more than 2^64");
    bad_npy("overflow2.npy", 1,
            "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 3074457345618258603), }", 16,
            "more than 2^64 bytes");
    bad_npy("hugedim.npy", 1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0,
            "over 2^64");
    bad_npy("complex.npy", 1, "{'descr': '<c16', 'fortran_order': False, 'shape': (1,), }", 16,
            "dtype '<c16' is not supported");
    bad_npy("half.npy", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", 2,
            "dtype '<f2' is not supported");
    bad_npy("str.npy", 1, "{'descr': '<U5', 'fortran_order': False, 'shape': (1,), }", 20,
            "dtype '<U5' is not supported");
    bad_npy("obj.npy", 1, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8,
            "object array");
    bad_npy("pipe.npy", 1, "{'descr': '|f4', 'fortran_order': False, 'shape': (1,), }", 4,
            "byte order");
    bad_npy("struct.npy", 1,
            "{'descr': [('x', '<f4'), ('y', '<i4')], 'fortran_order': False, 'shape': (1,), }",
            8, "structured dtype");
    bad_npy("nokey.npy", 1, "{'descr': '<f4', 'shape': (1,), }", 4, "lacks 'fortran_order'");
    bad_npy("extra.npy", 1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
            "unexpected or repeated key 'x'");
    bad_npy("twice.npy", 1,
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4,
            "repeated key 'descr'");
    bad_npy("scalar.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4,
            "0-d array");
    bad_npy("notuple.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", 12,
            "is not a tuple");
    bad_npy("neg.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 4,
            "negative dimension");
    bad_npy("fortranx.npy", 1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", 4,
            "True or False");
    bad_npy("notdict.npy", 1, "['descr', '<f4']", 4, "not a Python dict");
    bad_npy("after.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4,
            "text after the dict");
    bad_npy("ver4.npy", 4, f44, 64, "version 4.0 is not supported");

    /* A header that lies about its length: longer than the file; shorter than the dict. */
    uint8_t buf[256];
    bytes b = npy_make(1, f44, buf, 0);
    b.p[8] = 0xF0;
    b.p[9] = 0x00;
    write_file("hlen_long.npy", &b);
    open_fails("hlen_long.npy", NULL, "header claims 240 bytes but the file has only 118");
    b.p[8] = 20;
    write_file("hlen_short.npy", &b);
    open_fails("hlen_short.npy", NULL, "header");
    free(b.p);
    write_bytes(path_of("magic.npy"), "\x93NUMPZ\x01\x00\x00\x00xxxx", 14);
    open_fails("magic.npy", NULL, "not a .npy file");
    write_bytes(path_of("tiny.npy"), "\x93NU", 3);
    open_fails("tiny.npy", NULL, "too short");
    open_fails("absent.npy", NULL, "No such file");

    /* Values that do not fit a float are refused naming the row. */
    float fv[4] = {1, 2, NAN, 4};
    b = npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", fv,
                 sizeof fv);
    write_file("nan.npy", &b);
    free(b.p);
    dp_npy *a = open_ok("nan.npy", NULL);
    REQUIRE(a != NULL);
    float out[4];
    dp_err err;
    CHECK(dp_npy_read_f32(a, 0, 1, out, &err) == 0);
    f32_fails(a, 0, 2, "row 1 (element 0 of the row): <f4 value nan is not a finite number");
    dp_npy_close(a);
    double dv[2] = {1.0, 1e300};
    b = npy_make(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", dv, sizeof dv);
    write_file("big.npy", &b);
    free(b.p);
    a = open_ok("big.npy", NULL);
    REQUIRE(a != NULL);
    f32_fails(a, 0, 2, "row 1 (element 0 of the row): <f8 value 1e+300 is beyond float32");
    dp_npy_close(a);
}

/* x (n, 28, 28) u1 and y (n,) i8 as keras's mnist.npz names them. */
static void mnist_like(int n, uint8_t **xdata, size_t *xn, uint8_t **ydata, size_t *yn)
{
    uint8_t *x = malloc((size_t)n * 784);
    int64_t *y = malloc((size_t)n * 8);
    REQUIRE(x && y);
    for (size_t i = 0; i < (size_t)n * 784; i++)
        x[i] = (uint8_t)((i * 7 + i / 784) % 251);
    for (int i = 0; i < n; i++)
        y[i] = (i * 3) % 10;
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, 28, 28), }",
             n);
    bytes bx = npy_make(1, dict, x, (size_t)n * 784);
    snprintf(dict, sizeof dict, "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }", n);
    bytes by = npy_make(1, dict, y, (size_t)n * 8);
    free(x);
    free(y);
    *xdata = bx.p;
    *xn = bx.n;
    *ydata = by.p;
    *yn = by.n;
}

static void check_mnist_like(const char *name, int n, int deflated)
{
    dp_npy *x = open_ok(name, "x_train");
    dp_npy *y = open_ok(name, "y_train.npy");
    if (!x || !y) {
        dp_npy_close(x);
        dp_npy_close(y);
        return;
    }
    const dp_npy_info *in = dp_npy_get_info(x);
    CHECK(in->rows == (uint64_t)n && in->row_elems == 784 && in->deflated == deflated);
    float *img = malloc((size_t)n * 784 * sizeof(float));
    uint32_t *lab = malloc((size_t)n * sizeof(uint32_t));
    REQUIRE(img && lab);
    dp_err err = {{0}};
    /* The last rows first, then from the start: a deflated member restarts. */
    CHECKF(dp_npy_read_f32(x, (uint64_t)n - 3, (uint64_t)n, img, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < 3 * 784; i++) {
        size_t k = ((size_t)n - 3) * 784 + i;
        if (img[i] != (float)((k * 7 + k / 784) % 251)) {
            CHECKF(0, "%s x_train element %zu", name, k);
            break;
        }
    }
    CHECKF(dp_npy_read_f32(x, 0, (uint64_t)n, img, &err) == 0, "%s", err.msg);
    for (size_t k = 0; k < (size_t)n * 784; k++) {
        if (img[k] != (float)((k * 7 + k / 784) % 251)) {
            CHECKF(0, "%s x_train element %zu", name, k);
            break;
        }
    }
    CHECKF(dp_npy_read_labels(y, 0, (uint64_t)n, 10, lab, &err) == 0, "%s", err.msg);
    for (int i = 0; i < n; i++)
        CHECK(lab[i] == (uint32_t)((i * 3) % 10));
    uint32_t l1;
    CHECK(dp_npy_read_labels(y, 5, 6, 10, &l1, &err) == 0 && l1 == 5);
    free(img);
    free(lab);
    dp_npy_close(x);
    dp_npy_close(y);
}

static void test_npz(void)
{
    uint8_t *xd, *yd;
    size_t xn, yn;
    int n = 100; /* 78 KB of images: past the 64 KiB inflate buffers */
    mnist_like(n, &xd, &xn, &yd, &yn);
    zmember m[4] = {
        {"x_train.npy", xd, xn, 1},
        {"y_train.npy", yd, yn, 0},
        {"x_test.npy", xd, xn, 0},
        {"y_test.npy", yd, yn, 1},
    };
    zopts o = {0};
    o.zip64_local = 1; /* as numpy writes every member */
    bytes b = zip_make(m, 4, o);
    write_file("mnist.npz", &b);
    check_mnist_like("mnist.npz", n, 1);

    /* Names, and the mistakes a user makes with them. */
    char **names;
    size_t nn;
    dp_err err = {{0}};
    CHECK(dp_npz_list(path_of("mnist.npz"), &names, &nn, &err) == 0);
    CHECK(nn == 4 && strcmp(names[0], "x_train") == 0 && strcmp(names[3], "y_test") == 0);
    dp_npz_list_free(names, nn);
    open_fails("mnist.npz", "x_val", "no array named x_val in the archive (it holds x_train, "
               "y_train, x_test, y_test)");
    open_fails("mnist.npz", NULL, "is an .npz archive, not a .npy file: name one of its arrays "
               "(x_train, y_train, x_test, y_test)");
    open_fails("v1.npy", "x_train", "it is a .npy file: open it without a member name");

    /* Truncations: anywhere, the archive is refused naming it. */
    static const size_t cut_back[] = {1, 22, 30, 200};
    for (size_t i = 0; i < sizeof cut_back / sizeof cut_back[0]; i++) {
        write_bytes(path_of("cut.npz"), b.p, b.n - cut_back[i]);
        open_fails("cut.npz", "x_train", "cut.npz");
    }
    write_bytes(path_of("cut.npz"), b.p, 5000);
    open_fails("cut.npz", "x_train", "no ZIP end-of-central-directory record");

    /* A flipped byte in deflated data: a zlib error, or the CRC-32 at the end. */
    bytes d = {0};
    put(&d, b.p, b.n);
    d.p[200] ^= 0x55;
    write_file("flip.npz", &d);
    dp_npy *a = NULL;
    if (dp_npy_open(&a, path_of("flip.npz"), "x_train", &err) == 0) {
        float *img = malloc((size_t)n * 784 * sizeof(float));
        REQUIRE(img != NULL);
        CHECK(dp_npy_read_f32(a, 0, (uint64_t)n, img, &err) != 0);
        CHECKF(strstr(err.msg, "flip.npz (member x_train.npy)") &&
                   (strstr(err.msg, "CRC-32 mismatch") || strstr(err.msg, "deflate")),
               "%s", err.msg);
        free(img);
        dp_npy_close(a);
    } else {
        CHECKF(strstr(err.msg, "flip.npz"), "%s", err.msg);
    }
    free(d.p);
    free(b.p);

    /* Plain local headers; the ZIP64 end record and central ZIP64 extras. */
    m[0].deflate = 0;
    zopts o2 = {0};
    b = zip_make(m, 4, o2);
    write_file("plain.npz", &b);
    free(b.p);
    check_mnist_like("plain.npz", n, 0);
    zopts o3 = {0};
    o3.zip64_local = 1;
    o3.zip64_end = 1;
    m[0].deflate = 1;
    b = zip_make(m, 4, o3);
    write_file("zip64.npz", &b);
    free(b.p);
    check_mnist_like("zip64.npz", n, 1);

    /* A stored member whose CRC is wrong: caught once read through in order. */
    zopts o4 = {0};
    o4.bad_crc = 1;
    m[0].deflate = 0;
    b = zip_make(m, 1, o4);
    write_file("crc.npz", &b);
    free(b.p);
    a = open_ok("crc.npz", "x_train");
    if (a) {
        float *img = malloc((size_t)n * 784 * sizeof(float));
        REQUIRE(img != NULL);
        CHECK(dp_npy_read_f32(a, 0, (uint64_t)n, img, &err) != 0);
        CHECKF(strstr(err.msg, "crc.npz (member x_train.npy): CRC-32 mismatch"), "%s", err.msg);
        free(img);
        dp_npy_close(a);
    }
    /* The same, deflated: after the mismatch at the end, the last row read
     * alone reaches the end and is refused for the CRC again (the stream
     * had moved past the bytes of the failed read, which the reader did not
     * count: it said the stream ended early, and a stream longer than the
     * archive says served later bytes as earlier rows; found by
     * fuzz_records), and a read from the start gets the rows as written. */
    m[0].deflate = 1;
    b = zip_make(m, 1, o4);
    write_file("crc_deflated.npz", &b);
    free(b.p);
    a = open_ok("crc_deflated.npz", "x_train");
    if (a) {
        float *img = malloc((size_t)n * 784 * sizeof(float));
        REQUIRE(img != NULL);
        CHECK(dp_npy_read_f32(a, 0, (uint64_t)n, img, &err) != 0);
        CHECKF(strstr(err.msg, "CRC-32 mismatch"), "%s", err.msg);
        CHECK(dp_npy_read_f32(a, (uint64_t)n - 1, (uint64_t)n, img, &err) != 0);
        CHECKF(strstr(err.msg, "CRC-32 mismatch"), "%s", err.msg);
        CHECKF(dp_npy_read_f32(a, 0, 2, img, &err) == 0, "%s", err.msg);
        for (size_t k = 0; k < 2 * 784; k++)
            if (img[k] != (float)((k * 7 + k / 784) % 251)) {
                CHECKF(0, "crc_deflated.npz x_train element %zu is %g after the mismatch", k,
                       img[k]);
                break;
            }
        free(img);
        dp_npy_close(a);
    }
    zopts o5 = {0};
    o5.method_override = 12;
    b = zip_make(m, 1, o5);
    write_file("bzip2.npz", &b);
    free(b.p);
    open_fails("bzip2.npz", "x_train", "compression method 12 (bzip2) is not supported");
    zopts o6 = {0};
    o6.flags = 1;
    b = zip_make(m, 1, o6);
    write_file("crypt.npz", &b);
    free(b.p);
    open_fails("crypt.npz", "x_train", "encrypted");

    /* Two members of one name; an empty archive. */
    zmember twice[2] = {{"x.npy", yd, yn, 0}, {"x.npy", yd, yn, 0}};
    b = zip_make(twice, 2, o2);
    write_file("twice.npz", &b);
    free(b.p);
    open_fails("twice.npz", "x", "two members named x.npy");
    b = zip_make(NULL, 0, o2);
    write_file("empty.npz", &b);
    free(b.p);
    open_fails("empty.npz", "x", "(it holds no members)");
    free(xd);
    free(yd);
}

/* A deflated member larger than the 1 MiB staging buffer, read in odd pieces. */
static void test_large_deflated(void)
{
    size_t rows = 3000, cols = 129; /* 1.5 MB of f4 */
    float *v = malloc(rows * cols * sizeof(float));
    REQUIRE(v != NULL);
    for (size_t i = 0; i < rows * cols; i++)
        v[i] = (float)(i % 1000) * 0.125f;
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu), }",
             rows, cols);
    bytes x = npy_make(1, dict, v, rows * cols * sizeof(float));
    zmember m = {"big.npy", x.p, x.n, 1};
    zopts o = {0};
    o.zip64_local = 1;
    bytes b = zip_make(&m, 1, o);
    write_file("big.npz", &b);
    free(b.p);
    free(x.p);
    dp_npy *a = open_ok("big.npz", "big");
    REQUIRE(a != NULL);
    float *out = malloc(rows * cols * sizeof(float));
    REQUIRE(out != NULL);
    dp_err err = {{0}};
    static const size_t cuts[][2] = {{2900, 3000}, {0, 1}, {1, 2999}, {2999, 3000}, {10, 20},
                                     {0, 3000}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        size_t lo = cuts[c][0], hi = cuts[c][1];
        CHECKF(dp_npy_read_f32(a, lo, hi, out, &err) == 0, "%s", err.msg);
        CHECKF(memcmp(out, v + lo * cols, (hi - lo) * cols * sizeof(float)) == 0,
               "rows [%zu, %zu)", lo, hi);
    }
    dp_npy_close(a);
    free(out);
    free(v);
}

/* ---- numpy's own files ---- */

static const char *find_numpy_python(void)
{
    static const char *cands[] = {"/usr/bin/python3", "python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0)
            return cands[i];
    }
    return NULL;
}

static void test_numpy(void)
{
    const char *py = find_numpy_python();
    if (!py) {
        fprintf(stderr, "test_npy: skipping the numpy-written files: no python3 with numpy "
                        "(apt-get install python3-numpy)\n");
        return;
    }
    static const char script[] =
             "import numpy as np, sys\n"
             "d = sys.argv[1]\n"
             "n = 50\n"
             "x = (np.arange(n * 784) * 7 + np.arange(n * 784) // 784) % 251\n"
             "x = x.astype(np.uint8).reshape(n, 28, 28)\n"
             "y = ((np.arange(n) * 3) % 10).astype(np.uint8)\n"
             "np.savez(d + '/np_stored.npz', x_train=x, y_train=y, x_test=x[:5], y_test=y[:5])\n"
             "np.savez_compressed(d + '/np_deflated.npz', x_train=x, y_train=y, x_test=x[:5], "
             "y_test=y[:5])\n"
             "f = (np.arange(24, dtype=np.float64) - 5.5).reshape(4, 6)\n"
             "np.save(d + '/np_f8be.npy', f.astype('>f8'))\n"
             "np.save(d + '/np_i2.npy', f.astype('<i2'))\n"
             "np.save(d + '/np_col.npy', np.asfortranarray(y.reshape(n, 1).astype(np.int64)))\n"
             "np.save(d + '/np_fort.npy', np.asfortranarray(f))\n"
             "for v in ((2, 0), (3, 0)):\n"
             "    with open(d + '/np_v%d.npy' % v[0], 'wb') as fh:\n"
             "        np.lib.format.write_array(fh, f.astype('<f4'), version=v)\n";
    write_bytes(path_of("gen.py"), script, strlen(script));
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "%s %s %s", py, path_of("gen.py"), scratch);
    REQUIRE(system(cmd) == 0);
    static const char *npz[] = {"np_stored.npz", "np_deflated.npz"};
    for (int k = 0; k < 2; k++) {
        dp_npy *x = open_ok(npz[k], "x_train"), *y = open_ok(npz[k], "y_train");
        if (!x || !y) {
            dp_npy_close(x);
            dp_npy_close(y);
            continue;
        }
        CHECK(dp_npy_get_info(x)->deflated == k && dp_npy_get_info(x)->rows == 50);
        CHECK(dp_npy_get_info(x)->ndim == 3 && dp_npy_get_info(x)->shape[2] == 28);
        float img[50 * 784];
        uint32_t lab[50];
        dp_err err = {{0}};
        CHECKF(dp_npy_read_f32(x, 0, 50, img, &err) == 0, "%s", err.msg);
        for (size_t i = 0; i < 50 * 784; i++) {
            if (img[i] != (float)((i * 7 + i / 784) % 251)) {
                CHECKF(0, "%s element %zu", npz[k], i);
                break;
            }
        }
        CHECKF(dp_npy_read_labels(y, 0, 50, 10, lab, &err) == 0, "%s", err.msg);
        for (int i = 0; i < 50; i++)
            CHECK(lab[i] == (uint32_t)((i * 3) % 10));
        dp_npy_close(x);
        dp_npy_close(y);
        char **names;
        size_t nn;
        CHECK(dp_npz_list(path_of(npz[k]), &names, &nn, &err) == 0 && nn == 4);
        dp_npz_list_free(names, nn);
    }
    static const char *f24[] = {"np_f8be.npy", "np_i2.npy", "np_v2.npy", "np_v3.npy"};
    for (int k = 0; k < 4; k++) {
        dp_npy *a = open_ok(f24[k], NULL);
        if (!a)
            continue;
        float out[24];
        dp_err err = {{0}};
        CHECKF(dp_npy_read_f32(a, 0, 4, out, &err) == 0, "%s", err.msg);
        for (int i = 0; i < 24; i++) {
            double want = i - 5.5;
            if (k == 1)
                want = (double)(int16_t)(i - 5.5); /* astype truncates toward zero */
            CHECKF(out[i] == (float)want, "%s [%d]: %g want %g", f24[k], i, out[i], want);
        }
        CHECK(dp_npy_get_info(a)->version == (k >= 2 ? k : 1));
        dp_npy_close(a);
    }
    dp_npy *a = open_ok("np_col.npy", NULL);
    if (a) {
        uint32_t lab[50];
        dp_err err = {{0}};
        CHECKF(dp_npy_read_labels(a, 0, 50, 10, lab, &err) == 0, "%s", err.msg);
        CHECK(lab[7] == 1);
        dp_npy_close(a);
    }
    open_fails("np_fort.npy", NULL, "Fortran (column-major) order");
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_npy");
    test_versions_and_rows();
    test_dtypes();
    test_labels();
    test_fortran();
    test_malformed();
    test_npz();
    test_large_deflated();
    test_numpy();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
