/* safetensors: round trip, the file layout, hand-crafted bad files, and the
 * atomic save (a failed save leaves the old file and no temporary behind). */
#include "downpour/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "scratch.h"

static char tmpdir[512];

static void make_tmpdir(void)
{
    const char *base = getenv("DOWNPOUR_TEST_TMP");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmpdir, sizeof tmpdir, "%s/test_safetensors.XXXXXX", base);
    REQUIRE(mkdtemp(tmpdir) != NULL);
}

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}



static void put_u64(unsigned char *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (unsigned char)(v >> (8 * k));
}

/* A file with the given header text (unpadded) and data_len bytes of data. */
static void write_st(const char *path, const char *json, size_t data_len)
{
    size_t jl = strlen(json);
    unsigned char *buf = calloc(1, 8 + jl + data_len + 1);
    REQUIRE(buf != NULL);
    put_u64(buf, jl);
    memcpy(buf + 8, json, jl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + jl + i] = (unsigned char)i;
    write_bytes(path, buf, 8 + jl + data_len);
    free(buf);
}

/* Loading must fail with a message naming the file (and, if given, word). */
static void expect_refused(const char *name, const char *path, const char *word)
{
    dp_safetensors *st = (dp_safetensors *)1;
    dp_err err = {{0}};
    int rc = dp_safetensors_load(path, &st, &err);
    CHECKF(rc == -1, "%s: loaded a bad file", name);
    CHECKF(st == NULL, "%s: handle not NULL on failure", name);
    CHECKF(strstr(err.msg, path) != NULL, "%s: message does not name the file: %s", name,
           err.msg);
    if (word)
        CHECKF(strstr(err.msg, word) != NULL, "%s: message lacks '%s': %s", name, word, err.msg);
    if (rc != -1)
        dp_safetensors_free(st);

    /* Opened (the data left in the file) the same way: the header's checks
     * are load's, against the file's size. */
    st = (dp_safetensors *)1;
    rc = dp_safetensors_open(path, &st, &err);
    CHECKF(rc == -1 && st == NULL, "%s: opened a bad file", name);
    CHECKF(strstr(err.msg, path) != NULL, "%s (open): message does not name the file: %s", name,
           err.msg);
    if (word)
        CHECKF(strstr(err.msg, word) != NULL, "%s (open): message lacks '%s': %s", name, word,
               err.msg);
    if (rc != -1)
        dp_safetensors_free(st);

    /* The same bytes from memory are refused the same way. */
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return;
    size_t n;
    unsigned char *bytes = read_bytes(path, &n);
    st = (dp_safetensors *)1;
    rc = dp_safetensors_load_mem(bytes, n, &st, &err);
    CHECKF(rc == -1 && st == NULL, "%s: loaded bad bytes from memory", name);
    CHECKF(strstr(err.msg, "safetensors buffer") != NULL, "%s: %s", name, err.msg);
    if (word)
        CHECKF(strstr(err.msg, word) != NULL, "%s (memory): message lacks '%s': %s", name, word,
               err.msg);
    if (rc != -1)
        dp_safetensors_free(st);
    free(bytes);
}

/* load_mem of a file's bytes gives what load gives; the handle owns a copy. */
/* open + read give load's tensors, piece by piece, from the file (the
 * checkpoint reader's way: docs/checkpoints.md, "Reading in pieces"); a
 * file that shrinks after it was opened is refused naming the tensor. */
static void test_open_read(void)
{
    char path[1024];
    tmp_path(path, sizeof path, "open.safetensors");
    float w[6] = {1, -2, 3.5f, 4, 5, 6.25f}, got[4];
    dp_st_tensor ts[2] = {{.name = "w", .data = w, .ndim = 2, .shape = {2, 2}},
                          {.name = "b", .data = w + 4, .ndim = 1, .shape = {2}}};
    dp_st_meta meta[1] = {{"step", "42"}};
    dp_err err = {{0}};
    REQUIRE(dp_safetensors_save(path, ts, 2, meta, 1, &err) == 0);
    dp_safetensors *st = NULL;
    CHECKF(dp_safetensors_open(path, &st, &err) == 0, "%s", err.msg);
    if (!st)
        return;
    const dp_st_tensor *t = dp_safetensors_find(st, "w"), *b = dp_safetensors_find(st, "b");
    CHECK(dp_safetensors_count(st) == 2 && t && b && t->data == NULL && t->shape[1] == 2);
    CHECK(dp_safetensors_meta(st, "step") && strcmp(dp_safetensors_meta(st, "step"), "42") == 0);
    CHECK(dp_safetensors_read(st, t, 0, got, 16, &err) == 0 && memcmp(got, w, 16) == 0);
    CHECK(dp_safetensors_read(st, t, 8, got, 8, &err) == 0 && got[0] == 3.5f && got[1] == 4);
    CHECK(dp_safetensors_read(st, b, 4, got, 4, &err) == 0 && got[0] == 6.25f);
    CHECK(dp_safetensors_read(st, b, 4, got, 8, &err) == -1); /* past its end */
    CHECKF(strstr(err.msg, "'b'"), "%s", err.msg);
    CHECK(truncate(path, 8 + 4) == 0);
    CHECK(dp_safetensors_read(st, b, 0, got, 8, &err) == -1);
    CHECKF(strstr(err.msg, "tensor 'b'") && strstr(err.msg, "ends early"), "%s", err.msg);
    dp_safetensors_free(st);
    unlink(path);
}

static void test_load_mem(void)
{
    char path[1024];
    tmp_path(path, sizeof path, "mem.safetensors");
    float w[6] = {1, -2, 3.5f, 4, 5, 6.25f};
    dp_st_tensor ts[2] = {{.name = "w", .data = w, .ndim = 2, .shape = {2, 2}},
                          {.name = "b", .data = w + 4, .ndim = 1, .shape = {2}}};
    dp_st_meta meta[1] = {{"step", "42"}};
    dp_err err = {{0}};
    REQUIRE(dp_safetensors_save(path, ts, 2, meta, 1, &err) == 0);
    size_t n;
    unsigned char *bytes = read_bytes(path, &n);
    /* One byte more on each side, so the copy starts unaligned. */
    unsigned char *shifted = malloc(n + 1);
    REQUIRE(shifted != NULL);
    memcpy(shifted + 1, bytes, n);
    dp_safetensors *st = NULL;
    CHECKF(dp_safetensors_load_mem(shifted + 1, n, &st, &err) == 0, "%s", err.msg);
    memset(shifted, 0xff, n + 1); /* the handle must not point into the caller's bytes */
    free(shifted);
    if (st) {
        CHECK(dp_safetensors_count(st) == 2);
        const dp_st_tensor *t = dp_safetensors_find(st, "w");
        CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->data[2] == 3.5f);
        CHECK(((uintptr_t)t->data & 3) == 0);
        t = dp_safetensors_find(st, "b");
        CHECK(t && t->data[1] == 6.25f);
        const char *v = dp_safetensors_meta(st, "step");
        CHECK(v && strcmp(v, "42") == 0);
        dp_safetensors_free(st);
    }
    st = (dp_safetensors *)1;
    CHECK(dp_safetensors_load_mem(NULL, 0, &st, &err) == -1 && st == NULL);
    CHECKF(strstr(err.msg, "too short"), "%s", err.msg);
    CHECK(dp_safetensors_load_mem(NULL, 16, &st, &err) == -1);
    CHECK(dp_safetensors_load_mem(bytes, n, NULL, &err) == -1);
    CHECK(dp_safetensors_load_mem(bytes, 7, &st, &err) == -1);
    CHECK(dp_safetensors_load_mem(bytes, n - 1, &st, &err) == -1); /* data cut short */
    free(bytes);
    unlink(path);
}

static void bad_json(const char *name, const char *json, size_t data_len, const char *word)
{
    char path[1024];
    tmp_path(path, sizeof path, name);
    write_st(path, json, data_len);
    expect_refused(name, path, word);
    unlink(path);
}

/* Number of "*.tmp.*" files left in tmpdir. */
static int count_temps(void)
{
    DIR *d = opendir(tmpdir);
    REQUIRE(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp."))
            n++;
    closedir(d);
    return n;
}

static void test_round_trip(void)
{
    char path[1024];
    tmp_path(path, sizeof path, "rt.safetensors");

    float w[3 * 4], b[4], s = 3.5f;
    for (int i = 0; i < 12; i++)
        w[i] = (float)i * 0.1f - 0.5f;
    b[0] = -0.0f;
    b[1] = 1e-42f; /* denormal */
    b[2] = INFINITY;
    b[3] = NAN;
    dp_st_tensor ts[4] = {
        {.name = "layers.0.weight", .data = w, .ndim = 2, .shape = {3, 4}},
        {.name = "layers.0.bias", .data = b, .ndim = 1, .shape = {4}},
        {.name = "scalar", .data = &s, .ndim = 0},
        {.name = "empty", .data = NULL, .ndim = 1, .shape = {0}},
    };
    dp_st_meta meta[3] = {
        {"step", "42"}, {"strategy", "single"}, {"note", "quote \" backslash \\ \xc3\xa9\n"}};
    dp_err err = {{0}};
    CHECKF(dp_safetensors_save(path, ts, 4, meta, 3, &err) == 0, "%s", err.msg);
    CHECK(count_temps() == 0);

    /* Layout: u64 N, N bytes of JSON padded to a multiple of 8, then data. */
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    REQUIRE(n >= 8);
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++)
        hl |= (uint64_t)raw[k] << (8 * k);
    CHECK((8 + hl) % 8 == 0);
    CHECK(8 + hl + sizeof w + sizeof b + sizeof s == n);
    cJSON *h = cJSON_ParseWithLength((const char *)raw + 8, (size_t)hl);
    CHECK(h != NULL);
    if (h) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
        CHECK(cJSON_IsObject(m));
        cJSON *st = cJSON_GetObjectItemCaseSensitive(m, "strategy");
        CHECK(cJSON_IsString(st) && strcmp(st->valuestring, "single") == 0);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "layers.0.bias");
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        CHECK(cJSON_IsString(dt) && strcmp(dt->valuestring, "F32") == 0);
        cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        CHECK(cJSON_GetArraySize(off) == 2);
        CHECK(cJSON_GetArrayItem(off, 0)->valuedouble == 48);
        CHECK(cJSON_GetArrayItem(off, 1)->valuedouble == 64);
        cJSON *sc = cJSON_GetObjectItemCaseSensitive(h, "scalar");
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(sc, "shape")) == 0);
        cJSON_Delete(h);
    }
    CHECK(memcmp(raw + 8 + hl, w, sizeof w) == 0);
    free(raw);

    dp_safetensors *st = NULL;
    CHECKF(dp_safetensors_load(path, &st, &err) == 0, "%s", err.msg);
    REQUIRE(st != NULL);
    CHECK(dp_safetensors_count(st) == 4);
    for (int i = 0; i < 4 && i < dp_safetensors_count(st); i++) {
        const dp_st_tensor *t = dp_safetensors_at(st, i);
        REQUIRE(t != NULL);
        CHECK(strcmp(t->name, ts[i].name) == 0);
        CHECK(t->ndim == ts[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            CHECK(t->shape[d] == ts[i].shape[d]);
        CHECK(((uintptr_t)t->data % sizeof(float)) == 0);
        CHECK(dp_safetensors_find(st, ts[i].name) == t);
    }
    const dp_st_tensor *t = dp_safetensors_find(st, "layers.0.weight");
    CHECK(t && memcmp(t->data, w, sizeof w) == 0);
    t = dp_safetensors_find(st, "layers.0.bias");
    CHECK(t && memcmp(t->data, b, sizeof b) == 0);
    t = dp_safetensors_find(st, "scalar");
    CHECK(t && t->ndim == 0 && t->data[0] == 3.5f);
    t = dp_safetensors_find(st, "empty");
    CHECK(t && t->ndim == 1 && t->shape[0] == 0);
    CHECK(dp_safetensors_find(st, "missing") == NULL);
    CHECK(dp_safetensors_at(st, 4) == NULL && dp_safetensors_at(st, -1) == NULL);
    CHECK(dp_safetensors_meta(st, "step") && strcmp(dp_safetensors_meta(st, "step"), "42") == 0);
    CHECK(dp_safetensors_meta(st, "note") &&
          strcmp(dp_safetensors_meta(st, "note"), meta[2].value) == 0);
    CHECK(dp_safetensors_meta(st, "missing") == NULL);
    dp_safetensors_free(st);
    dp_safetensors_free(NULL);

    /* No tensors, no metadata. */
    CHECKF(dp_safetensors_save(path, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    CHECKF(dp_safetensors_load(path, &st, &err) == 0, "%s", err.msg);
    CHECK(dp_safetensors_count(st) == 0);
    CHECK(dp_safetensors_meta(st, "step") == NULL);
    dp_safetensors_free(st);
    unlink(path);
}

/* A valid file from another writer whose data area is not 8-aligned. */
static void test_unaligned_header(void)
{
    char path[1024];
    tmp_path(path, sizeof path, "unaligned.safetensors");
    const char *json = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}";
    size_t jl = strlen(json);
    REQUIRE((8 + jl) % 4 != 0);
    float vals[4] = {1.5f, -2.25f, 3e-3f, 7.0f};
    unsigned char buf[256];
    put_u64(buf, jl);
    memcpy(buf + 8, json, jl);
    memcpy(buf + 8 + jl, vals, sizeof vals);
    write_bytes(path, buf, 8 + jl + sizeof vals);

    dp_safetensors *st = NULL;
    dp_err err = {{0}};
    CHECKF(dp_safetensors_load(path, &st, &err) == 0, "%s", err.msg);
    if (st) {
        const dp_st_tensor *a = dp_safetensors_find(st, "a"), *b = dp_safetensors_find(st, "b");
        CHECK(a && b && (uintptr_t)a->data % sizeof(float) == 0);
        CHECK(a && memcmp(a->data, vals, 12) == 0 && a->data[1] == -2.25f);
        CHECK(b && b->data[0] == 7.0f);
        dp_safetensors_free(st);
    }
    unlink(path);
}

static void test_bad_files(void)
{
    char path[1024];
    unsigned char buf[64];

    tmp_path(path, sizeof path, "short.safetensors");
    write_bytes(path, "\x05\0\0\0\0", 5);
    expect_refused("too short", path, "short");
    unlink(path);

    tmp_path(path, sizeof path, "empty.safetensors");
    write_bytes(path, "", 0);
    expect_refused("empty file", path, NULL);
    unlink(path);

    tmp_path(path, sizeof path, "longhdr.safetensors");
    put_u64(buf, 100);
    memcpy(buf + 8, "{}        ", 10);
    write_bytes(path, buf, 18);
    expect_refused("header longer than the file", path, "header length");
    unlink(path);

    tmp_path(path, sizeof path, "hugehdr.safetensors");
    put_u64(buf, (uint64_t)1 << 63);
    memcpy(buf + 8, "{}      ", 8);
    write_bytes(path, buf, 16);
    expect_refused("header length 2^63", path, "header length");
    put_u64(buf, UINT64_MAX);
    write_bytes(path, buf, 16);
    expect_refused("header length 2^64-1", path, "header length");
    unlink(path);

    tmp_path(path, sizeof path, "nonexistent.safetensors");
    expect_refused("missing file", path, NULL);
    expect_refused("a directory", tmpdir, NULL);

    bad_json("notjson", "{\"a\": not json", 0, "JSON");
    bad_json("array", "[1, 2]", 0, "object");
    bad_json("trailing", "{} {}", 0, "after the JSON");
    bad_json("badutf8", "{\"__metadata__\":{\"k\":\"\xff\"}}", 0, "UTF-8");
    bad_json("f16", "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "F16");
    bad_json("nodtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'a'");
    bad_json("notobj", "{\"a\":[1,2]}", 0, "'a'");
    bad_json("pastend", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
             "data_offsets");
    bad_json("truncated",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
             16, "'b'");
    bad_json("reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
             "data_offsets");
    bad_json("mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
             "do not match shape [3]");
    bad_json("overlap",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12, "overlaps");
    bad_json("samerange",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             8, "overlaps");
    bad_json("gap",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             12, "gap");
    bad_json("leadinggap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
             "gap");
    bad_json("trailingdata", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             8, "cover");
    bad_json("negshape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
             "shape[0]");
    bad_json("fracshape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
             4, "shape[0]");
    bad_json("strshape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}",
             8, "shape[0]");
    bad_json("hugeshape",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
             "\"data_offsets\":[0,0]}}",
             0, "overflows");
    bad_json("manydims",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
             "dimensions");
    bad_json("oneoffset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
             "data_offsets");
    bad_json("hugeoffset",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1e300,1e300]}}", 4,
             "data_offsets");
    bad_json("dupkey",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             8, "duplicate");
    bad_json("metanonstring", "{\"__metadata__\":{\"step\":1}}", 0, "'step'");
    bad_json("metanotobject", "{\"__metadata__\":[\"a\"]}", 0, "__metadata__");
    bad_json("metadup", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate");
    bad_json("metatwice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate");
}

static void test_bad_save_args(void)
{
    char path[1024];
    tmp_path(path, sizeof path, "args.safetensors");
    float x[2] = {1, 2};
    dp_err err = {{0}};
    dp_st_tensor dup[2] = {{.name = "x", .data = x, .ndim = 1, .shape = {1}},
                           {.name = "x", .data = x + 1, .ndim = 1, .shape = {1}}};
    CHECK(dp_safetensors_save(path, dup, 2, NULL, 0, &err) == -1);
    CHECK(strstr(err.msg, "duplicate") != NULL);
    dp_st_tensor neg = {.name = "n", .data = x, .ndim = 1, .shape = {-2}};
    CHECK(dp_safetensors_save(path, &neg, 1, NULL, 0, &err) == -1);
    CHECK(strstr(err.msg, "'n'") != NULL);
    dp_st_tensor nodata = {.name = "n", .data = NULL, .ndim = 1, .shape = {2}};
    CHECK(dp_safetensors_save(path, &nodata, 1, NULL, 0, &err) == -1);
    dp_st_tensor reserved = {.name = "__metadata__", .data = x, .ndim = 1, .shape = {1}};
    CHECK(dp_safetensors_save(path, &reserved, 1, NULL, 0, &err) == -1);
    dp_st_meta md[2] = {{"k", "1"}, {"k", "2"}};
    CHECK(dp_safetensors_save(path, NULL, 0, md, 2, &err) == -1);
    CHECK(access(path, F_OK) != 0);
    CHECK(count_temps() == 0);
}

/* The file at path holds exactly one tensor "x" equal to want[0..n). */
static int holds(const char *path, const float *want, int64_t n)
{
    dp_safetensors *st = NULL;
    dp_err err = {{0}};
    if (dp_safetensors_load(path, &st, &err) < 0)
        return 0;
    const dp_st_tensor *t = dp_safetensors_find(st, "x");
    int ok = dp_safetensors_count(st) == 1 && t && t->ndim == 1 && t->shape[0] == n &&
             memcmp(t->data, want, (size_t)n * sizeof *want) == 0;
    dp_safetensors_free(st);
    return ok;
}

static void test_atomic(void)
{
    char path[1024], nodir[1024];
    dp_err err = {{0}};
    float old[4] = {1, 2, 3, 4};
    dp_st_tensor t_old = {.name = "x", .data = old, .ndim = 1, .shape = {4}};
    tmp_path(path, sizeof path, "atomic.safetensors");
    CHECKF(dp_safetensors_save(path, &t_old, 1, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(holds(path, old, 4));

    /* Saving over an existing file replaces it. */
    float mid[3] = {5, 6, 7};
    dp_st_tensor t_mid = {.name = "x", .data = mid, .ndim = 1, .shape = {3}};
    CHECKF(dp_safetensors_save(path, &t_mid, 1, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(holds(path, mid, 3));
    CHECKF(dp_safetensors_save(path, &t_old, 1, NULL, 0, &err) == 0, "%s", err.msg);

    /* A directory that does not exist: fails cleanly. */
    tmp_path(nodir, sizeof nodir, "no/such/dir/x.safetensors");
    CHECK(dp_safetensors_save(nodir, &t_old, 1, NULL, 0, &err) == -1);
    CHECK(strstr(err.msg, nodir) != NULL);

    /* The target is a directory: the rename fails, the temporary is removed. */
    char dirpath[1024];
    tmp_path(dirpath, sizeof dirpath, "isadir");
    REQUIRE(mkdir(dirpath, 0755) == 0);
    char inner[1100];
    snprintf(inner, sizeof inner, "%s/keep", dirpath);
    write_bytes(inner, "k", 1);
    CHECK(dp_safetensors_save(dirpath, &t_old, 1, NULL, 0, &err) == -1);
    CHECK(strstr(err.msg, dirpath) != NULL);
    CHECK(count_temps() == 0);
    CHECK(access(inner, F_OK) == 0);
    unlink(inner);
    rmdir(dirpath);

    /* A FIFO (or a device such as /dev/full) is refused, not renamed over. */
    char fifo[1024];
    tmp_path(fifo, sizeof fifo, "fifo");
    REQUIRE(mkfifo(fifo, 0644) == 0);
    CHECK(dp_safetensors_save(fifo, &t_old, 1, NULL, 0, &err) == -1);
    CHECKF(strstr(err.msg, fifo) && strstr(err.msg, "is a FIFO"), "%s", err.msg);
    struct stat fst;
    CHECK(lstat(fifo, &fst) == 0 && S_ISFIFO(fst.st_mode));
    CHECK(count_temps() == 0);
    unlink(fifo);

    /* A write that fails half way (file size limit, which binds root too):
     * the old file is intact and no temporary is left. */
    enum { BIG = 1 << 18 };
    float *big = malloc(BIG * sizeof *big);
    REQUIRE(big != NULL);
    for (int i = 0; i < BIG; i++)
        big[i] = (float)i;
    dp_st_tensor t_big = {.name = "x", .data = big, .ndim = 1, .shape = {BIG}};
    struct rlimit saved, lim;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    lim = saved;
    lim.rlim_cur = 64 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        int rc = dp_safetensors_save(path, &t_big, 1, NULL, 0, &err);
        REQUIRE(setrlimit(RLIMIT_FSIZE, &saved) == 0);
        CHECK(rc == -1);
        CHECKF(strstr(err.msg, path) != NULL && strstr(err.msg, strerror(EFBIG)) != NULL, "%s",
               err.msg);
        CHECK(holds(path, old, 4));
        CHECK(count_temps() == 0);
    } else {
        fprintf(stderr, "note: cannot lower RLIMIT_FSIZE (%s); skipping the failed-write check\n",
                strerror(errno));
    }
    signal(SIGXFSZ, prev);
    /* Without the limit the big save works. */
    CHECKF(dp_safetensors_save(path, &t_big, 1, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(holds(path, big, BIG));
    free(big);
    unlink(path);
}

/* dp_safetensors_save_source: a tensor made as it is written (300,000
 * floats, more than one piece of the writer's), every piece seen in file
 * order, a metadata value changed after the data; the file reads back as
 * the same tensors written from memory, with the new value. */
typedef struct source_ctx {
    size_t next;   /* the next float the big tensor gives */
    size_t seen[3];
    int order_ok, last;
    char value[9];
    int fail_at;   /* fill fails at this call (0: never) */
    int calls;
} source_ctx;

static int fill_big(void *ctx, int i, float *buf, size_t n, dp_err *err)
{
    source_ctx *c = ctx;
    if (++c->calls == c->fail_at)
        return dp_errf(err, "the source failed");
    c->order_ok &= i == 1;
    for (size_t k = 0; k < n; k++)
        buf[k] = (float)(c->next + k) * 0.5f;
    c->next += n;
    return 0;
}

static void seen_piece(void *ctx, int i, const void *data, size_t bytes)
{
    source_ctx *c = ctx;
    c->order_ok &= i >= c->last && data != NULL;
    c->last = i;
    c->seen[i] += bytes;
}

static int source_done(void *ctx, dp_err *err)
{
    (void)err;
    source_ctx *c = ctx;
    snprintf(c->value, sizeof c->value, "%08zx", c->seen[0] + c->seen[1] + c->seen[2]);
    return 0;
}

static void test_save_source(void)
{
    char path[1024];
    tmp_path(path, sizeof path, "source.safetensors");
    enum { BIG = 300000 };
    float a[3] = {1, 2, 3}, z[2] = {-1, -2};
    dp_st_tensor ts[3] = {{.name = "a", .data = a, .ndim = 1, .shape = {3}},
                          {.name = "big", .data = NULL, .ndim = 2, .shape = {BIG / 4, 4}},
                          {.name = "z", .data = z, .ndim = 1, .shape = {2}}};
    source_ctx c = {.order_ok = 1};
    snprintf(c.value, sizeof c.value, "00000000");
    dp_st_meta meta[1] = {{"sum", c.value}};
    dp_st_source src = {fill_big, seen_piece, source_done, &c};
    dp_err err = {{0}};
    CHECKF(dp_safetensors_save_source(path, ts, 3, meta, 1, &src, &err) == 0, "%s", err.msg);
    CHECK(c.order_ok && c.next == BIG && c.calls > 1);
    CHECK(c.seen[0] == 12 && c.seen[1] == (size_t)BIG * 4 && c.seen[2] == 8);
    dp_safetensors *st = NULL;
    CHECKF(dp_safetensors_load(path, &st, &err) == 0, "%s", err.msg);
    if (st) {
        const dp_st_tensor *t = dp_safetensors_find(st, "big");
        int ok = t && t->ndim == 2 && t->shape[0] == BIG / 4;
        for (size_t k = 0; ok && k < BIG; k++)
            ok = t->data[k] == (float)k * 0.5f;
        CHECK(ok);
        t = dp_safetensors_find(st, "z");
        CHECK(t && t->data[1] == -2);
        const char *v = dp_safetensors_meta(st, "sum");
        CHECKF(v && strcmp(v, c.value) == 0 && strcmp(v, "00000000") != 0,
               "the value after the data: %s", v ? v : "(none)");
        dp_safetensors_free(st);
    }
    /* a value that changes length after the data: refused, no file */
    unlink(path);
    source_ctx d = {.order_ok = 1};
    snprintf(d.value, sizeof d.value, "0");
    meta[0].value = d.value;
    src.ctx = &d;
    CHECK(dp_safetensors_save_source(path, ts, 3, meta, 1, &src, &err) < 0);
    CHECKF(strstr(err.msg, "final header"), "%s", err.msg);
    CHECK(access(path, F_OK) != 0);
    /* a source that fails: its error, no file */
    source_ctx f = {.order_ok = 1, .fail_at = 2};
    snprintf(f.value, sizeof f.value, "00000000");
    meta[0].value = f.value;
    src.ctx = &f;
    CHECK(dp_safetensors_save_source(path, ts, 3, meta, 1, &src, &err) < 0);
    CHECKF(strstr(err.msg, "the source failed"), "%s", err.msg);
    CHECK(access(path, F_OK) != 0);
}

int main(void)
{
    make_tmpdir();
    test_save_source();
    test_round_trip();
    test_unaligned_header();
    test_bad_files();
    test_bad_save_args();
    test_atomic();
    test_load_mem();
    test_open_read();
    CHECK(count_temps() == 0);
    rmdir(tmpdir);
    return CHECK_DONE();
}
