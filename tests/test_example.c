/* tf.train.Example (example.h) and PNG images (png.h).
 *
 * The decoder is checked against bytes written here by hand from the
 * protobuf encoding rules (developers.google.com/protocol-buffers/docs/
 * encoding) and the field numbers of TensorFlow's feature.proto and
 * example.proto (tensorflow/core/example/), which EXAMPLE_PROTO below
 * restates: every feature kind, packed and unpacked repeats, negative and
 * multi-byte varints.  Where protoc is installed (Debian's protobuf-compiler,
 * in the Makefile's packages) a parser we did not write confirms that those
 * bytes mean what we say, protoc's own encoding of a text Example decodes to
 * the same values, and our encoder's output decodes in protoc.  TensorFlow
 * itself is not installed here, so it is not run.  Then: protobuf's merge
 * rules, malformed messages refused naming the field, and a 28x28 grayscale
 * PNG (encoded with libpng here) inside an Example in a TFRecord file, as
 * TensorFlow Datasets stores MNIST, decoded back to the same pixels; PNGs of
 * the wrong size, channels or depth, cut or damaged, refused.  PNGs written
 * by dp_png_encode (every channel count, odd sizes, one buffer reused) read
 * back to the same pixels through dp_png_decode and through libpng's own
 * simplified reader, a second decoder that shares none of our code. */
#include <png.h>
#include <stdint.h>
#include <string.h>

#include "downpour/example.h"
#include "downpour/png.h"
#include "downpour/tfrecord.h"
#include "scratch.h"

static char dir[1024];

/* Example { features { feature { key: "a" value { int64_list { value: [1, -1, 300] } } }   (unpacked)
 *                      feature { key: "b" value { float_list { value: [1.0, -2.5] } } }    (unpacked)
 *                      feature { key: "c" value { float_list { value: [0.5, 2.0] } } }     (packed)
 *                      feature { key: "d" value { int64_list { value: [5, 150] } } }       (packed)
 *                      feature { key: "e" value { bytes_list { value: ["hi", ""] } } } } }
 * A key byte is field << 3 | wire type (0 varint, 2 length-delimited, 5 fixed32). */
static const uint8_t hand[] = {
    0x0a, 0x5c,                         /* Example.features, 92 bytes */
    /* entry "a": 23 bytes */
    0x0a, 0x17,                         /*   Features.feature (a map entry) */
    0x0a, 0x01, 'a',                    /*     key */
    0x12, 0x12,                         /*     value: Feature, 18 bytes */
    0x1a, 0x10,                         /*       int64_list (field 3), 16 bytes */
    0x08, 0x01,                         /*         value 1, unpacked (field 1, varint) */
    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, /* -1: ten bytes */
    0x08, 0xac, 0x02,                   /*         300 = 0b10_0101100 */
    /* entry "b": 17 bytes */
    0x0a, 0x11, 0x0a, 0x01, 'b', 0x12, 0x0c,
    0x12, 0x0a,                         /*       float_list (field 2), 10 bytes */
    0x0d, 0x00, 0x00, 0x80, 0x3f,       /*         1.0f, unpacked (field 1, fixed32) */
    0x0d, 0x00, 0x00, 0x20, 0xc0,       /*         -2.5f */
    /* entry "c": 17 bytes */
    0x0a, 0x11, 0x0a, 0x01, 'c', 0x12, 0x0c,
    0x12, 0x0a,
    0x0a, 0x08,                         /*         packed (field 1, length-delimited), 8 bytes */
    0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x00, 0x40, /* 0.5f, 2.0f */
    /* entry "d": 12 bytes */
    0x0a, 0x0c, 0x0a, 0x01, 'd', 0x12, 0x07,
    0x1a, 0x05,
    0x0a, 0x03, 0x05, 0x96, 0x01,       /*         packed: 5, 150 */
    /* entry "e": 13 bytes */
    0x0a, 0x0d, 0x0a, 0x01, 'e', 0x12, 0x08,
    0x0a, 0x06,                         /*       bytes_list (field 1), 6 bytes */
    0x0a, 0x02, 'h', 'i', 0x0a, 0x00,   /*         "hi", "" */
};

/* feature.proto and example.proto, reduced to their messages and field numbers. */
static const char EXAMPLE_PROTO[] =
    "syntax = \"proto3\";\n"
    "package tensorflow;\n"
    "message BytesList { repeated bytes value = 1; }\n"
    "message FloatList { repeated float value = 1 [packed = true]; }\n"
    "message Int64List { repeated int64 value = 1 [packed = true]; }\n"
    "message Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;\n"
    "                               Int64List int64_list = 3; } }\n"
    "message Features { map<string, Feature> feature = 1; }\n"
    "message Example { Features features = 1; }\n";

static void check_hand_features(const dp_example *ex, const char *what)
{
    CHECKF(dp_example_count(ex) == 5, "%s: %zu features", what, dp_example_count(ex));
    const dp_feature *a = dp_example_find(ex, "a"), *b = dp_example_find(ex, "b"),
                     *c = dp_example_find(ex, "c"), *d = dp_example_find(ex, "d"),
                     *e = dp_example_find(ex, "e");
    REQUIRE(a && b && c && d && e);
    CHECKF(a->kind == DP_FEATURE_INT64 && a->count == 3 && a->int64s[0] == 1 &&
           a->int64s[1] == -1 && a->int64s[2] == 300, "%s: a", what);
    CHECKF(b->kind == DP_FEATURE_FLOAT && b->count == 2 && b->floats[0] == 1.0f &&
           b->floats[1] == -2.5f, "%s: b", what);
    CHECKF(c->kind == DP_FEATURE_FLOAT && c->count == 2 && c->floats[0] == 0.5f &&
           c->floats[1] == 2.0f, "%s: c", what);
    CHECKF(d->kind == DP_FEATURE_INT64 && d->count == 2 && d->int64s[0] == 5 &&
           d->int64s[1] == 150, "%s: d", what);
    CHECKF(e->kind == DP_FEATURE_BYTES && e->count == 2 && e->bytes[0].len == 2 &&
           memcmp(e->bytes[0].data, "hi", 2) == 0 && e->bytes[1].len == 0, "%s: e", what);
    CHECK(dp_example_find(ex, "f") == NULL && dp_example_find(ex, "") == NULL);
    /* Sorted by name. */
    for (size_t i = 0; i + 1 < dp_example_count(ex); i++)
        CHECK(strcmp(dp_example_feature(ex, i)->name, dp_example_feature(ex, i + 1)->name) < 0);
}

static void test_hand_bytes(dp_example *ex)
{
    dp_err err;
    CHECKF(dp_example_decode(ex, hand, sizeof hand, &err) == 0, "%s", err.msg);
    check_hand_features(ex, "hand-built");

    /* Re-encoded (packed, as TensorFlow writes) and decoded again: the same. */
    size_t n = dp_example_count(ex);
    dp_feature fs[5];
    for (size_t i = 0; i < n; i++)
        fs[i] = *dp_example_feature(ex, i);
    size_t len = dp_example_encoded_size(fs, n);
    uint8_t *buf = malloc(len);
    REQUIRE(buf);
    CHECK(dp_example_encode(buf, fs, n) == len);
    /* Packing "a" saves a byte (three keys become one key and a length);
     * "b"'s two floats take 10 bytes either way. */
    CHECKF(len == sizeof hand - 1, "encoded %zu bytes, hand-built %zu", len, sizeof hand);
    dp_example *ex2 = dp_example_new();
    REQUIRE(ex2);
    CHECKF(dp_example_decode(ex2, buf, len, &err) == 0, "%s", err.msg);
    check_hand_features(ex2, "re-encoded");
    dp_example_free(ex2);
    free(buf);
}

/* protoc, a protobuf implementation we did not write, as a second opinion. */
static char *run_protoc(const char *args, const char *in_path, const char *out_path)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && protoc --proto_path=. %s example.proto < '%s' > '%s'",
             dir, args, in_path, out_path);
    int rc = system(cmd);
    CHECKF(rc == 0, "%s: exit status %d", cmd, rc);
    if (rc != 0)
        return NULL;
    size_t n;
    unsigned char *b = read_bytes(out_path, &n);
    char *s = realloc(b, n + 1);
    REQUIRE(s);
    s[n] = '\0';
    return s;
}

static void test_protoc(dp_example *ex)
{
    if (system("command -v protoc >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipping the protoc checks: protoc not found (apt-get install "
                        "protobuf-compiler)\n");
        return;
    }
    char proto[1200], in[1200], out[1200];
    snprintf(proto, sizeof proto, "%s/example.proto", dir);
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    write_bytes(proto, EXAMPLE_PROTO, strlen(EXAMPLE_PROTO));

    /* 1. protoc reads the hand-built bytes as the Example described above. */
    write_bytes(in, hand, sizeof hand);
    char *text = run_protoc("--decode=tensorflow.Example", in, out);
    if (text) {
        const char *want[] = {"key: \"a\"", "value: 1\n", "value: -1\n", "value: 300\n",
                              "key: \"b\"", "value: -2.5\n", "key: \"c\"", "value: 0.5\n",
                              "value: 2\n", "key: \"d\"", "value: 150\n", "key: \"e\"",
                              "value: \"hi\"", "value: \"\""};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            CHECKF(strstr(text, want[i]), "protoc's reading of the hand-built bytes lacks %s:\n%s",
                   want[i], text);
        free(text);
    }

    /* 2. protoc's encoding of a text Example decodes to the same values. */
    const char *txt =
        "features { feature { key: \"a\" value { int64_list { value: [1, -1, 300] } } }\n"
        "           feature { key: \"b\" value { float_list { value: [1.0, -2.5] } } }\n"
        "           feature { key: \"c\" value { float_list { value: [0.5, 2.0] } } }\n"
        "           feature { key: \"d\" value { int64_list { value: [5, 150] } } }\n"
        "           feature { key: \"e\" value { bytes_list { value: [\"hi\", \"\"] } } } }\n";
    write_bytes(in, txt, strlen(txt));
    char *bin = run_protoc("--encode=tensorflow.Example", in, out);
    if (bin) {
        size_t n;
        uint8_t *b = read_bytes(out, &n);
        dp_err err;
        CHECKF(dp_example_decode(ex, b, n, &err) == 0, "%s", err.msg);
        check_hand_features(ex, "protoc-encoded");
        free(b);
        free(bin);
    }

    /* 3. Our encoder's bytes, every kind, read by protoc. */
    static const int64_t ints[] = {INT64_MIN, -7, 0, 1, INT64_MAX};
    static const float floats[] = {3.25f, -0.0f, 1e-30f};
    static const dp_bytes bytes[] = {{(const uint8_t *)"x\001y", 3}, {(const uint8_t *)"", 0}};
    const dp_feature fs[] = {
        {"label", DP_FEATURE_INT64, 5, NULL, NULL, ints},
        {"image/encoded", DP_FEATURE_BYTES, 2, bytes, NULL, NULL},
        {"weights", DP_FEATURE_FLOAT, 3, NULL, floats, NULL},
        {"empty_floats", DP_FEATURE_FLOAT, 0, NULL, NULL, NULL},
        {"nothing", DP_FEATURE_NONE, 0, NULL, NULL, NULL},
    };
    size_t len = dp_example_encoded_size(fs, 5);
    uint8_t *enc = malloc(len);
    REQUIRE(enc);
    REQUIRE(dp_example_encode(enc, fs, 5) == len);
    write_bytes(in, enc, len);
    free(enc);
    text = run_protoc("--decode=tensorflow.Example", in, out);
    if (text) {
        const char *want[] = {"value: -9223372036854775808\n", "value: 9223372036854775807\n",
                              "value: -7\n", "value: 3.25\n", "value: -0\n", "value: 1e-30\n",
                              "value: \"x\\001y\"", "key: \"empty_floats\"\n    value {\n"
                              "      float_list {\n      }", "key: \"nothing\"\n    value {\n    }"};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            CHECKF(strstr(text, want[i]), "protoc's reading of our encoding lacks %s:\n%s",
                   want[i], text);
        free(text);
    }
}

/* Decodes n bytes; returns 0 or -1 with err. */
static int dec(dp_example *ex, const uint8_t *b, size_t n, dp_err *err)
{
    int rc = dp_example_decode(ex, b, n, err);
    if (rc < 0)
        CHECK(dp_example_count(ex) == 0);
    return rc;
}

static void test_merge_rules(dp_example *ex)
{
    dp_err err;
    /* Unknown fields at every level are skipped: Example field 7 (varint),
     * Features field 2 (fixed32), entry field 3 (fixed64), Feature field 9
     * (length), Int64List field 2 (varint). */
    const uint8_t unknown[] = {
        0x38, 0x2a,
        0x0a, 0x1e,
        0x15, 1, 2, 3, 4,
        0x0a, 0x17,
        0x19, 1, 2, 3, 4, 5, 6, 7, 8,
        0x0a, 0x01, 'k',
        0x12, 0x09, 0x4a, 0x01, 0x00, 0x1a, 0x04, 0x10, 0x05, 0x08, 0x09,
    };
    CHECKF(dec(ex, unknown, sizeof unknown, &err) == 0, "%s", err.msg);
    const dp_feature *k = dp_example_find(ex, "k");
    CHECK(dp_example_count(ex) == 1 && k && k->kind == DP_FEATURE_INT64 && k->count == 1 &&
          k->int64s[0] == 9);
    /* A list given twice merges; another oneof member replaces; the last of
     * two entries with one key wins; an entry without a key is "". */
    const uint8_t merge[] = {
        0x0a, 0x22,
        0x0a, 0x0b, 0x0a, 0x01, 'm', 0x12, 0x06,
        0x1a, 0x02, 0x08, 0x01, 0x1a, 0x00,             /* int64 [1], then int64 {} */
        0x0a, 0x0b, 0x0a, 0x01, 'm', 0x12, 0x06,        /* "m" again: replaces */
        0x0a, 0x00, 0x1a, 0x02, 0x08, 0x04,             /* bytes {}, then int64 [4] */
        0x0a, 0x06, 0x12, 0x04, 0x1a, 0x02, 0x08, 0x03, /* no key: "" */
    };
    CHECKF(dec(ex, merge, sizeof merge, &err) == 0, "%s", err.msg);
    const dp_feature *m = dp_example_find(ex, "m"), *none = dp_example_find(ex, "");
    CHECK(dp_example_count(ex) == 2 && m && m->kind == DP_FEATURE_INT64 && m->count == 1 &&
          m->int64s[0] == 4);
    CHECK(none && none->kind == DP_FEATURE_INT64 && none->count == 1 && none->int64s[0] == 3);
    /* An empty list keeps its kind. */
    const uint8_t empty[] = {0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, 'z', 0x12, 0x02, 0x1a, 0x00};
    CHECKF(dec(ex, empty, sizeof empty, &err) == 0, "%s", err.msg);
    CHECK(dp_example_find(ex, "z") && dp_example_find(ex, "z")->count == 0 &&
          dp_example_find(ex, "z")->kind == DP_FEATURE_INT64);
    /* A Feature given twice in one entry merges: its two lists concatenate. */
    const uint8_t two_values[] = {0x0a, 0x11, 0x0a, 0x0f, 0x0a, 0x01, 'v',
                                  0x12, 0x04, 0x1a, 0x02, 0x08, 0x07,
                                  0x12, 0x04, 0x1a, 0x02, 0x08, 0x08};
    CHECKF(dec(ex, two_values, sizeof two_values, &err) == 0, "%s", err.msg);
    const dp_feature *v = dp_example_find(ex, "v");
    CHECK(v && v->count == 2 && v->int64s[0] == 7 && v->int64s[1] == 8);
    /* The empty message is an Example without features. */
    CHECK(dec(ex, (const uint8_t *)"", 0, &err) == 0 && dp_example_count(ex) == 0);
}

static void test_malformed(dp_example *ex)
{
    dp_err err;
    const struct {
        uint8_t b[24];
        size_t n;
        const char *want;
    } bad[] = {
        {{0x0a, 0x05, 0x0a}, 3, "Example.features: length 5 runs past the end of the message (1 "
                                "bytes left)"},
        {{0x0a, 0x02, 0x0a, 0x05}, 4, "Example.features.feature: length 5 runs past"},
        {{0x08, 0x01}, 2, "Example.features: wire type 0, expected 2"},
        {{0x0a, 0x06, 0x0a, 0x04, 0x0a, 0x02, 'i', 0}, 8, "feature[entry 0, no key yet].key: "
                                                          "feature name holds a NUL byte"},
        {{0x0a, 0x09, 0x0a, 0x07, 0x0a, 0x01, 'f', 0x12, 0x02, 0x10, 0x00}, 11,
         "feature[\"f\"].float_list: wire type 0, expected 2"},
        {{0x0a, 0x0d, 0x0a, 0x0b, 0x0a, 0x01, 'f', 0x12, 0x06, 0x12, 0x04, 0x0a, 0x02, 0, 0}, 15,
         "feature[\"f\"].float_list.value: packed floats: length 2 is not a multiple of 4"},
        {{0x0a, 0x0b, 0x0a, 0x09, 0x0a, 0x01, 'f', 0x12, 0x04, 0x12, 0x02, 0x0d, 0x00}, 13,
         "feature[\"f\"].float_list.value: float runs past the end"},
        {{0x0a, 0x0b, 0x0a, 0x09, 0x0a, 0x01, 'i', 0x12, 0x04, 0x1a, 0x02, 0x0d, 0x00}, 13,
         "feature[\"i\"].int64_list.value: wire type 5, expected 2"},
        {{0x0a, 0x0b, 0x0a, 0x09, 0x0a, 0x01, 'i', 0x12, 0x04, 0x1a, 0x02, 0x08, 0x80}, 13,
         "feature[\"i\"].int64_list.value: varint runs past the end of the message"},
        {{0x0a, 0x0c, 0x0a, 0x0a, 0x0a, 0x01, 'i', 0x12, 0x05, 0x1a, 0x03, 0x0a, 0x01, 0x80}, 14,
         "feature[\"i\"].int64_list.value: packed int64s: varint runs past"},
        {{0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, 'b', 0x12, 0x01, 0x2b}, 10,
         "feature[\"b\"].<field 5>: group wire type 3 is not supported"},
        {{0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, 'b', 0x12, 0x01, 0x2e}, 10,
         "feature[\"b\"].<field 5>: invalid wire type 6"},
        {{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, 11,
         "varint overflows 64 bits"},
        {{0x00, 0x00}, 2, "Example: field number 0 is out of range"},
        {{0x15, 0x01, 0x02}, 3, "Example.<field 2>: 4-byte value runs past"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        CHECKF(dec(ex, bad[i].b, bad[i].n, &err) == -1 && strstr(err.msg, bad[i].want),
               "case %zu: want \"%s\", got \"%s\"", i, bad[i].want, err.msg);
    }
    /* A decode that fails leaves no features behind, even after a good one. */
    REQUIRE(dec(ex, hand, sizeof hand, &err) == 0);
    CHECK(dec(ex, hand, sizeof hand - 1, &err) == -1 && dp_example_count(ex) == 0 &&
          dp_example_find(ex, "a") == NULL);
    fprintf(stderr, "a cut Example: %s\n", err.msg);
    /* Every prefix of the hand-built bytes is refused, every longer one too
     * where it cuts a field (none is silently read as fewer values). */
    size_t refused = 0;
    for (size_t n = 1; n < sizeof hand; n++)
        refused += dec(ex, hand, n, &err) == -1;
    CHECKF(refused == sizeof hand - 1, "%zu of %zu cuts refused", refused, sizeof hand - 1);
}

/* ---- PNG ---- */

/* A PNG of h x w pixels, channels 1..4, depth 8 or 16, written with libpng. */
static uint8_t *png_encode(size_t *len, const uint8_t *pixels, uint32_t h, uint32_t w,
                           int channels, int depth)
{
    static const png_uint_32 formats[5] = {0, PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB,
                                           PNG_FORMAT_RGBA};
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = w;
    img.height = h;
    img.format = formats[channels] | (depth == 16 ? PNG_FORMAT_FLAG_LINEAR : 0);
    uint16_t *wide = NULL;
    const void *src = pixels;
    if (depth == 16) {
        wide = malloc((size_t)h * w * channels * 2);
        REQUIRE(wide);
        for (size_t i = 0; i < (size_t)h * w * channels; i++)
            wide[i] = (uint16_t)(pixels[i] * 257);
        src = wide;
    }
    png_alloc_size_t n = 0;
    REQUIRE(png_image_write_to_memory(&img, NULL, &n, 0, src, 0, NULL));
    uint8_t *out = malloc(n);
    REQUIRE(out);
    REQUIRE(png_image_write_to_memory(&img, out, &n, 0, src, 0, NULL));
    free(wide);
    *len = n;
    return out;
}

static void test_png(dp_example *ex)
{
    /* A 28x28 digit-like image, as TensorFlow Datasets stores MNIST: a PNG
     * in "image", the label an int64 in "label", the Example in a TFRecord. */
    uint8_t px[28 * 28], out[28 * 28 * 4];
    for (int i = 0; i < 28 * 28; i++)
        px[i] = (uint8_t)((i * 37 + (i / 28) * 11) & 0xff);
    size_t plen;
    uint8_t *png = png_encode(&plen, px, 28, 28, 1, 8);
    int64_t label = 7;
    dp_bytes image = {png, plen};
    const dp_feature fs[2] = {{DP_EXAMPLE_IMAGE, DP_FEATURE_BYTES, 1, &image, NULL, NULL},
                              {DP_EXAMPLE_LABEL, DP_FEATURE_INT64, 1, NULL, NULL, &label}};
    size_t elen = dp_example_encoded_size(fs, 2);
    uint8_t *enc = malloc(elen);
    REQUIRE(enc);
    dp_example_encode(enc, fs, 2);
    char path[1200];
    snprintf(path, sizeof path, "%s/mnist-train.tfrecord-00000-of-00001", dir);
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_AUTO, &err) == 0);
    REQUIRE(dp_tfrecord_write(w, enc, elen, &err) == 0);
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
    free(enc);
    dp_tfrecord_reader *r;
    REQUIRE(dp_tfrecord_open(&r, path, NULL, &err) == 0);
    const uint8_t *rec;
    size_t rlen;
    REQUIRE(dp_tfrecord_next(r, &rec, &rlen, &err) == 1);
    CHECKF(dp_example_decode(ex, rec, rlen, &err) == 0, "%s", err.msg);
    const dp_feature *im = dp_example_find(ex, DP_EXAMPLE_IMAGE),
                     *lb = dp_example_find(ex, DP_EXAMPLE_LABEL);
    REQUIRE(im && lb && im->kind == DP_FEATURE_BYTES && im->count == 1);
    CHECK(lb->kind == DP_FEATURE_INT64 && lb->count == 1 && lb->int64s[0] == 7);
    dp_png_info info;
    CHECKF(dp_png_info_read(&info, im->bytes[0].data, im->bytes[0].len, &err) == 0, "%s", err.msg);
    CHECK(info.width == 28 && info.height == 28 && info.channels == 1 && info.bit_depth == 8 &&
          !info.palette);
    memset(out, 0, sizeof out);
    CHECKF(dp_png_decode(out, im->bytes[0].data, im->bytes[0].len, 28, 28, 1, &err) == 0, "%s",
           err.msg);
    CHECK(memcmp(out, px, sizeof px) == 0);
    dp_tfrecord_close(r);

    /* The wrong size or channel count is refused naming both. */
    CHECK(dp_png_decode(out, png, plen, 32, 32, 1, &err) == -1 &&
          strstr(err.msg, "PNG is 28x28 gray (1 channel), expected 32x32 gray"));
    CHECK(dp_png_decode(out, png, plen, 28, 28, 3, &err) == -1 &&
          strstr(err.msg, "expected 28x28 RGB"));
    /* A cut or damaged PNG is refused; so is what is no PNG at all. */
    size_t refused = 0, tried = 0;
    for (size_t n = 0; n < plen; n += 1 + n / 8, tried++)
        refused += dp_png_decode(out, png, n, 28, 28, 1, &err) == -1;
    CHECKF(refused == tried, "%zu of %zu cuts refused", refused, tried);
    dp_png_decode(out, png, plen - 20, 28, 28, 1, &err);
    fprintf(stderr, "a cut PNG: %s\n", err.msg);
    uint8_t *bad = malloc(plen);
    REQUIRE(bad);
    memcpy(bad, png, plen);
    bad[plen - 20] ^= 0x10; /* inside IDAT (IEND is the last 12 bytes): zlib or the CRC catches it */
    CHECK(dp_png_decode(out, bad, plen, 28, 28, 1, &err) == -1 && strstr(err.msg, "PNG: IDAT: "));
    fprintf(stderr, "a damaged PNG: %s\n", err.msg);
    free(bad);
    CHECK(dp_png_decode(out, (const uint8_t *)"GIF89a..", 8, 28, 28, 1, &err) == -1 &&
          strstr(err.msg, "not a PNG"));
    CHECK(dp_png_decode(out, png, plen, 0, 28, 1, &err) == -1);
    free(png);

    /* RGB and gray+alpha decode with their channels; 16 bits are refused. */
    uint8_t rgb[5 * 3 * 3];
    for (size_t i = 0; i < sizeof rgb; i++)
        rgb[i] = (uint8_t)(i * 5);
    png = png_encode(&plen, rgb, 5, 3, 3, 8);
    CHECKF(dp_png_decode(out, png, plen, 5, 3, 3, &err) == 0 && memcmp(out, rgb, sizeof rgb) == 0,
           "%s", err.msg);
    CHECK(dp_png_decode(out, png, plen, 5, 3, 1, &err) == -1 &&
          strstr(err.msg, "PNG is 5x3 RGB (3 channels), expected 5x3 gray"));
    free(png);
    png = png_encode(&plen, rgb, 5, 3, 2, 8);
    CHECKF(dp_png_decode(out, png, plen, 5, 3, 2, &err) == 0 &&
           memcmp(out, rgb, 5 * 3 * 2) == 0, "%s", err.msg);
    free(png);
    png = png_encode(&plen, px, 28, 28, 1, 16);
    CHECK(dp_png_info_read(&info, png, plen, &err) == 0 && info.bit_depth == 16);
    CHECK(dp_png_decode(out, png, plen, 28, 28, 1, &err) == -1 &&
          strstr(err.msg, "PNG has bit depth 16; only 8-bit PNGs are read"));
    free(png);
}

/* Pixels of libpng's simplified reader (not dp_png_decode): 1 when they equal want. */
static int libpng_reads_back(const dp_png_buf *b, const uint8_t *want, uint32_t h, uint32_t w,
                             int channels)
{
    static const png_uint_32 formats[5] = {0, PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB,
                                           PNG_FORMAT_RGBA};
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, b->data, b->len))
        return 0;
    if (img.width != w || img.height != h) {
        png_image_free(&img);
        return 0;
    }
    img.format = formats[channels];
    size_t n = (size_t)h * w * (size_t)channels;
    uint8_t *px = malloc(n);
    REQUIRE(px);
    int ok = png_image_finish_read(&img, NULL, px, 0, NULL) && memcmp(px, want, n) == 0;
    free(px);
    return ok;
}

static void test_png_encode(void)
{
    static const uint32_t sizes[][2] = {{1, 1}, {28, 28}, {5, 3}, {17, 300}, {300, 2}};
    dp_png_buf b = {0};
    dp_err err;
    uint32_t seed = 12345;
    for (int c = 1; c <= 4; c++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            uint32_t h = sizes[k][0], w = sizes[k][1];
            size_t n = (size_t)h * w * (size_t)c;
            uint8_t *px = malloc(n), *out = malloc(n);
            REQUIRE(px && out);
            for (size_t i = 0; i < n; i++) { /* noise with runs, so filters and deflate both work */
                seed = seed * 1103515245u + 12345u;
                px[i] = (i % 7 < 3) ? (uint8_t)(seed >> 24) : (uint8_t)(i / 7);
            }
            CHECKF(dp_png_encode(&b, px, h, w, c, &err) == 0, "%ux%u c%d: %s", h, w, c, err.msg);
            dp_png_info info;
            CHECKF(dp_png_info_read(&info, b.data, b.len, &err) == 0 && info.height == h &&
                   info.width == w && info.channels == c && info.bit_depth == 8 && !info.palette,
                   "%ux%u c%d: header %ux%u c%d depth %d", h, w, c, info.height, info.width,
                   info.channels, info.bit_depth);
            memset(out, 0, n);
            CHECKF(dp_png_decode(out, b.data, b.len, h, w, c, &err) == 0 && memcmp(out, px, n) == 0,
                   "%ux%u c%d: %s", h, w, c, err.msg);
            CHECKF(libpng_reads_back(&b, px, h, w, c), "%ux%u c%d: libpng's reader disagrees", h,
                   w, c);
            free(px);
            free(out);
        }

    /* The buffer is reused: a second image of one size takes no new memory,
     * and the encoding is deterministic. */
    uint8_t digit[28 * 28];
    for (int i = 0; i < 28 * 28; i++)
        digit[i] = (uint8_t)((i % 28 > 8 && i % 28 < 20 && i / 28 > 4 && i / 28 < 24) ? 255 : 0);
    REQUIRE(dp_png_encode(&b, digit, 28, 28, 1, &err) == 0);
    uint8_t first[4096];
    size_t first_len = b.len, cap = b.cap;
    REQUIRE(first_len <= sizeof first);
    memcpy(first, b.data, first_len);
    const uint8_t *data = b.data;
    REQUIRE(dp_png_encode(&b, digit, 28, 28, 1, &err) == 0);
    CHECK(b.data == data && b.cap == cap);
    CHECK(b.len == first_len && memcmp(b.data, first, first_len) == 0);
    /* deflate is on: a block digit is far smaller than its 784 pixels */
    CHECKF(b.len < 200, "a 28x28 block digit took %zu bytes", b.len);

    /* Sizes and channel counts outside the format's range are refused. */
    CHECK(dp_png_encode(&b, digit, 0, 28, 1, &err) == -1 && b.len == 0 &&
          strstr(err.msg, "cannot encode 0x28 with 1 channels"));
    CHECK(dp_png_encode(&b, digit, 28, DP_PNG_MAX_SIDE + 1, 1, &err) == -1);
    CHECK(dp_png_encode(&b, digit, 28, 28, 0, &err) == -1);
    CHECK(dp_png_encode(&b, digit, 28, 28, 5, &err) == -1 && strstr(err.msg, "channels 1..4"));
    dp_png_buf_free(&b);
    CHECK(b.data == NULL && b.cap == 0 && b.len == 0);
    dp_png_buf_free(NULL);
}

int main(void)
{
    scratch_make(dir, sizeof dir, "test_example");
    dp_example *ex = dp_example_new();
    REQUIRE(ex);
    test_hand_bytes(ex);
    test_protoc(ex);
    test_merge_rules(ex);
    test_malformed(ex);
    test_png(ex);
    test_png_encode();
    dp_example_free(ex);
    dp_example_free(NULL);
    if (!check_failures)
        scratch_remove(dir);
    return CHECK_DONE();
}
