/* Image augmentation (downpour/augment.h): the crop and flip against a naive
 * pad-crop-flip of torchvision's definition, for byte and float records of
 * 1 and 3 channels; the draw a function of (seed, epoch, record) alone,
 * different across epochs and covering every shift; the batcher's batches
 * augmented alike whatever the shard (DATA sharding: two workers' rows are
 * one process's), the thread split and the resume position; the parsing. */
#include <string.h>

#include "check.h"
#include "downpour/augment.h"
#include "downpour/pool.h"

enum { H = 7, W = 9, RECORDS = 600 }; /* 600 x 63 values: enough to split over threads */

/* torchvision: pad by p with zeros, take the h x w window at (p + dy,
 * p + dx), then flip that window left-right. */
static void naive(float *out, const float *img, int c, int p, int dy, int dx, int flip)
{
    int ph = H + 2 * p, pw = W + 2 * p;
    static float padded[(H + 2 * 8) * (W + 2 * 8) * 3];
    memset(padded, 0, sizeof padded);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int k = 0; k < c; k++)
                padded[((y + p) * pw + x + p) * c + k] = img[(y * W + x) * c + k];
    (void)ph;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int sx = flip ? W - 1 - x : x;
            for (int k = 0; k < c; k++)
                out[(y * W + x) * c + k] = padded[((y + p + dy) * pw + sx + p + dx) * c + k];
        }
}

static void make_split(dp_split *s, uint8_t *bytes, float *vals, uint8_t *labels, int c)
{
    memset(s, 0, sizeof *s);
    s->n = RECORDS;
    s->dim = (uint32_t)(H * W * c);
    for (size_t i = 0; i < (size_t)RECORDS * s->dim; i++) {
        bytes[i] = (uint8_t)(i * 37 + i / 5);
        if (vals)
            vals[i] = (float)((i * 13) % 101) - 50.0f;
    }
    for (int i = 0; i < RECORDS; i++)
        labels[i] = (uint8_t)(i % 10);
    s->labels = labels;
    if (vals)
        s->values = vals;
    else
        s->images = bytes;
}

static void test_against_naive(void)
{
    static uint8_t bytes[RECORDS * H * W * 3], labels[RECORDS];
    static float vals[RECORDS * H * W * 3], got[H * W * 3], want[H * W * 3], src[H * W * 3];
    for (int c = 1; c <= 3; c += 2)
        for (int kind = 0; kind < 2; kind++) {
            dp_split s;
            make_split(&s, bytes, kind ? vals : NULL, labels, c);
            dp_augment a;
            dp_err err;
            REQUIRE(dp_augment_parse("crop:3,flip", &a, &err) == 0);
            a.seed = 17;
            REQUIRE(dp_augment_check(&a, H, W, (uint32_t)c, s.dim, &err) == 0);
            int seen = 0;
            for (uint32_t r = 0; r < RECORDS; r += 7)
                for (long e = 0; e < 3; e++) {
                    uint8_t y = 255;
                    dp_split_gather_augment(got, &y, &s, &r, 1, &a, e);
                    dp_split_gather(src, NULL, &s, &r, 1);
                    int dy, dx, flip;
                    dp_augment_draw(&a, e, r, &dy, &dx, &flip);
                    naive(want, src, c, 3, dy, dx, flip);
                    seen += memcmp(got, want, s.dim * sizeof(float)) == 0;
                    CHECKF(memcmp(got, want, s.dim * sizeof(float)) == 0,
                           "%s records, %d channel(s): record %u epoch %ld (dy %d dx %d flip %d) "
                           "differs from pad-crop-flip", kind ? "float" : "byte", c, r, e, dy, dx,
                           flip);
                    CHECK(y == labels[r]);
                }
            CHECK(seen > 0);
        }
}

/* The draw: deterministic, every shift and both flips appear, epochs and
 * seeds differ, and a draw of no change gives the plain gather's bits. */
static void test_draws(void)
{
    dp_augment a;
    dp_err err;
    REQUIRE(dp_augment_parse("crop:4,flip", &a, &err) == 0);
    a.seed = 1;
    REQUIRE(dp_augment_check(&a, 28, 28, 1, 784, &err) == 0);
    int hist_y[9] = {0}, hist_x[9] = {0}, flips = 0, differ_epoch = 0, differ_seed = 0;
    dp_augment b = a;
    b.seed = 2;
    for (uint32_t r = 0; r < 9000; r++) {
        int dy, dx, f, dy2, dx2, f2;
        dp_augment_draw(&a, 5, r, &dy, &dx, &f);
        dp_augment_draw(&a, 5, r, &dy2, &dx2, &f2);
        CHECK(dy == dy2 && dx == dx2 && f == f2);
        REQUIRE(dy >= -4 && dy <= 4 && dx >= -4 && dx <= 4);
        hist_y[dy + 4]++, hist_x[dx + 4]++, flips += f;
        dp_augment_draw(&a, 6, r, &dy2, &dx2, &f2);
        differ_epoch += dy != dy2 || dx != dx2 || f != f2;
        dp_augment_draw(&b, 5, r, &dy2, &dx2, &f2);
        differ_seed += dy != dy2 || dx != dx2 || f != f2;
    }
    for (int i = 0; i < 9; i++)
        CHECKF(hist_y[i] > 800 && hist_x[i] > 800, "shift %d drawn %d / %d times of 9000", i - 4,
               hist_y[i], hist_x[i]);
    CHECKF(flips > 4200 && flips < 4800, "%d flips of 9000", flips);
    /* of 162 outcomes, two epochs draw the same for about 1 record in 162 */
    CHECKF(differ_epoch > 8800, "only %d of 9000 records drawn differently in the next epoch",
           differ_epoch);
    CHECKF(differ_seed > 8800, "only %d of 9000 records drawn differently with another seed",
           differ_seed);

    static uint8_t bytes[RECORDS * H * W], labels[RECORDS];
    static float plain[H * W], aug[H * W];
    dp_split s;
    make_split(&s, bytes, NULL, labels, 1);
    REQUIRE(dp_augment_check(&a, H, W, 1, s.dim, &err) == 0);
    int none = 0;
    for (uint32_t r = 0; r < RECORDS; r++) {
        int dy, dx, f;
        dp_augment_draw(&a, 0, r, &dy, &dx, &f);
        if (dy || dx || f)
            continue;
        none++;
        dp_split_gather(plain, NULL, &s, &r, 1);
        dp_split_gather_augment(aug, NULL, &s, &r, 1, &a, 0);
        CHECK(memcmp(plain, aug, sizeof plain) == 0);
    }
    CHECK(none > 0);
}

/* Batches through the batcher: DATA sharding over two workers gives the
 * rows of one process's batch of twice the size, record for record; the
 * same batches on 1 and 2 threads; a seek (resume) lands on the same
 * batches; an epoch later, other draws. */
static void test_batcher(void)
{
    enum { B = 20, DIM = H * W };
    static uint8_t bytes[RECORDS * DIM], labels[RECORDS];
    static float one[2 * B * DIM], w0[B * DIM], w1[B * DIM], again[2 * B * DIM];
    static uint8_t y1[2 * B], yw0[B], yw1[B];
    dp_split s;
    make_split(&s, bytes, NULL, labels, 1);
    dp_augment a;
    dp_err err;
    REQUIRE(dp_augment_parse("crop:2,flip", &a, &err) == 0);
    a.seed = 9;
    REQUIRE(dp_augment_check(&a, H, W, 1, DIM, &err) == 0);
    dp_batcher p, q0, q1;
    REQUIRE(dp_batcher_init(&p, &s, 9, 1, DP_SHARD_DATA, 0, 1, &err) == 0);
    REQUIRE(dp_batcher_init(&q0, &s, 9, 1, DP_SHARD_DATA, 0, 2, &err) == 0);
    REQUIRE(dp_batcher_init(&q1, &s, 9, 1, DP_SHARD_DATA, 1, 2, &err) == 0);
    REQUIRE(dp_batcher_augment(&p, &a, &err) == 0 && dp_batcher_augment(&q0, &a, &err) == 0 &&
            dp_batcher_augment(&q1, &a, &err) == 0);
    for (long e = 0; e < 2; e++) {
        dp_batcher_start_epoch(&p, e), dp_batcher_start_epoch(&q0, e),
            dp_batcher_start_epoch(&q1, e);
        for (int k = 0; k < 3; k++) {
            REQUIRE(dp_batcher_next(&p, one, y1, 2 * B) == 2 * B);
            REQUIRE(dp_batcher_next(&q0, w0, yw0, B) == B && dp_batcher_next(&q1, w1, yw1, B) == B);
            for (int i = 0; i < B; i++) {
                CHECK(memcmp(one + (size_t)(2 * i) * DIM, w0 + (size_t)i * DIM,
                             DIM * sizeof(float)) == 0 && y1[2 * i] == yw0[i]);
                CHECK(memcmp(one + (size_t)(2 * i + 1) * DIM, w1 + (size_t)i * DIM,
                             DIM * sizeof(float)) == 0 && y1[2 * i + 1] == yw1[i]);
            }
        }
    }
    /* epoch 1, batch 2 again after a seek (a resumed run's place) */
    dp_batcher_start_epoch(&p, 1);
    dp_batcher_seek(&p, 2 * (2 * B));
    REQUIRE(dp_batcher_next(&p, again, y1, 2 * B) == 2 * B);
    CHECK(memcmp(again, one, sizeof again) == 0);
    /* the same records in epoch 0 drew otherwise */
    dp_batcher_start_epoch(&p, 0);
    dp_batcher_seek(&p, 2 * (2 * B));
    REQUIRE(dp_batcher_next(&p, again, y1, 2 * B) == 2 * B);
    CHECK(memcmp(again, one, sizeof again) != 0);
    dp_batcher_free(&p), dp_batcher_free(&q0), dp_batcher_free(&q1);
}

/* A batch of every record, on one thread and on two: the same bits. */
static void test_threads(void)
{
    static uint8_t bytes[RECORDS * H * W], labels[RECORDS];
    static float t1[RECORDS * H * W], t2[RECORDS * H * W];
    static uint32_t idx[RECORDS];
    dp_split s;
    make_split(&s, bytes, NULL, labels, 1);
    for (uint32_t i = 0; i < RECORDS; i++)
        idx[i] = (i * 7) % RECORDS;
    dp_augment a;
    dp_err err;
    REQUIRE(dp_augment_parse("crop:2,flip", &a, &err) == 0);
    REQUIRE(dp_augment_check(&a, H, W, 1, s.dim, &err) == 0);
    REQUIRE(dp_pool_set_threads(1, &err) == 0);
    dp_split_gather_augment(t1, NULL, &s, idx, RECORDS, &a, 3);
    REQUIRE(dp_pool_set_threads(2, &err) == 0);
    dp_split_gather_augment(t2, NULL, &s, idx, RECORDS, &a, 3);
    CHECK(memcmp(t1, t2, sizeof t1) == 0);
}

static void test_parse(void)
{
    dp_augment a;
    dp_err err = {{0}};
    char buf[32];
    CHECK(dp_augment_parse("crop:4,flip", &a, &err) == 0 && a.pad == 4 && a.flip);
    dp_augment_format(&a, buf, sizeof buf);
    CHECK(strcmp(buf, "crop:4,flip") == 0);
    CHECK(dp_augment_parse("flip,crop:2", &a, &err) == 0 && a.pad == 2 && a.flip);
    CHECK(dp_augment_parse("flip", &a, &err) == 0 && a.pad == 0 && a.flip);
    CHECK(dp_augment_parse("none", &a, &err) == 0 && !dp_augment_on(&a));
    CHECK(dp_augment_parse(NULL, &a, &err) == 0 && !dp_augment_on(&a));
    const char *bad[] = {"crop", "crop:0", "crop:-1", "crop:65", "crop:x", "flip,flip", "rotate",
                         "", "crop:2,,flip", "crop:2,crop:3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        CHECKF(dp_augment_parse(bad[i], &a, &err) == -1 && strstr(err.msg, "--augment"),
               "'%s' parsed, or its message lacks the flag: %s", bad[i], err.msg);
    }
    REQUIRE(dp_augment_parse("crop:4", &a, &err) == 0);
    CHECK(dp_augment_check(&a, 1, 784, 1, 784, &err) == -1 && strstr(err.msg, "no images"));
    CHECK(dp_augment_check(&a, 4, 28, 1, 112, &err) == -1 && strstr(err.msg, "not below"));
    CHECK(dp_augment_check(&a, 28, 28, 1, 784, &err) == 0 && a.h == 28 && a.c == 1);
}

int main(void)
{
    test_parse();
    test_against_naive();
    test_draws();
    test_batcher();
    test_threads();
    return CHECK_DONE();
}
