/* Training-state checkpoints through the library (checkpoint.h): every part
 * reads back bitwise; a file cut at any byte, or with any byte flipped, is
 * refused naming the file; a wrong shape, dtype, missing tensor or key, or a
 * number that does not parse is refused naming it; another model's or
 * another run's checkpoint is refused naming what differs; find_newest skips
 * a damaged newest file with a warning; prune keeps the newest K; and
 * load_weights (downpour eval) reads a training checkpoint and a --save file. */
#include "downpour/checkpoint.h"

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "downpour/crc32c.h"
#include "downpour/safetensors.h"
#include "scratch.h"

#define SPEC "20-8-3"
#define EPOCHS 5

/* Longer than any fixed buffer a writer might format metadata into. */
#define LONG_DATASET                                                                      \
    "/data/a/directory/whose/name/is/much/longer/than/forty/eight/characters/"             \
    "fashion-mnist-v2"

static char scratch[1024];

static const char *sp(const char *name)
{
    static char bufs[4][1200];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", scratch, name);
    return b;
}

/* The run every test writes for, unless it changes a field. */
static dp_run_identity base_id(void)
{
    return (dp_run_identity){.strategy = "model-avg", .dataset = LONG_DATASET,
                             .optimizer = "adam", .lr_schedule = "cosine", .lr = 0.001f,
                             .workers = 2, .ps = 1, .batch = 32, .seed = 42,
                             .train_size = 1000, .val_size = 100, .steps_per_epoch = 16,
                             .epochs = EPOCHS};
}

/* Random bit patterns (NaN payloads and denormals included), then a few
 * special values, so "bitwise equal" means what it says. */
static void fill(float *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        memcpy(&p[i], &x, sizeof x);
    }
    static const float special[] = {-0.0f, 1e-42f, INFINITY, -INFINITY, NAN, 1.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i < n; i++)
        p[i * 7 % n] = special[i];
}

static int same_bits(const void *a, const void *b, size_t n)
{
    return a && b && memcmp(a, b, n) == 0;
}

static void model_init(dp_model *m, const char *spec)
{
    dp_err err = {{0}};
    REQUIRE(dp_model_init(m, spec, 4, 1, &err) == 0);
}

/* A state with every part: adam's two slots, EMA, best, three epochs of
 * history, and (workers > 0) the model-avg workers' own optimisers. */
static void make_state(dp_train_state *st, const dp_model *m, int n_slots, int workers,
                       long step, uint32_t seed)
{
    dp_err err = {{0}};
    REQUIRE(dp_train_state_alloc(st, m->n_params, n_slots, DP_STATE_EMA | DP_STATE_BEST, EPOCHS,
                                 workers, &err) == 0);
    size_t n = m->n_params;
    st->step = step;
    fill(st->params, n, seed);
    if (n_slots > 0)
        fill(st->slots, (size_t)n_slots * n, seed + 1);
    st->optim_t = step + 7;
    fill(st->ema, n, seed + 2);
    fill(st->best, n, seed + 3);
    st->best_accuracy = 0.98765432101234567;
    st->best_epoch = 2;
    st->n_history = 3;
    for (int i = 0; i < 3 * 3; i++)
        st->history[i] = 0.125f * (float)i + 1e-7f * (float)seed;
    if (workers > 0) {
        fill(st->worker_slots, (size_t)workers * n_slots * n, seed + 4);
        for (int w = 0; w < workers; w++)
            st->worker_t[w] = 1000L * (w + 1) + step;
    }
}

static void check_same_state(const char *what, const dp_train_state *a, const dp_train_state *b)
{
    size_t n = a->n_params, bytes = n * sizeof(float);
    CHECKF(b->n_params == n, "%s: n_params %zu, wrote %zu", what, b->n_params, n);
    if (b->n_params != n)
        return;
    CHECKF(b->step == a->step, "%s: step %ld, wrote %ld", what, b->step, a->step);
    CHECKF(b->n_slots == a->n_slots, "%s: n_slots %d, wrote %d", what, b->n_slots, a->n_slots);
    CHECKF(same_bits(a->params, b->params, bytes), "%s: params differ", what);
    if (a->n_slots > 0)
        CHECKF(same_bits(a->slots, b->slots, (size_t)a->n_slots * bytes),
               "%s: optimizer slots differ", what);
    CHECKF(b->optim_t == a->optim_t, "%s: optim_t %ld, wrote %ld", what, b->optim_t, a->optim_t);
    CHECKF((a->ema == NULL) == (b->ema == NULL), "%s: ema present %d, wrote %d", what,
           b->ema != NULL, a->ema != NULL);
    if (a->ema)
        CHECKF(same_bits(a->ema, b->ema, bytes), "%s: ema differs", what);
    if (a->best && a->best_epoch > 0) {
        CHECKF(same_bits(a->best, b->best, bytes), "%s: best differs", what);
        CHECKF(b->best_epoch == a->best_epoch, "%s: best_epoch %d, wrote %d", what,
               b->best_epoch, a->best_epoch);
        CHECKF(same_bits(&a->best_accuracy, &b->best_accuracy, sizeof(double)),
               "%s: best_accuracy %.17g, wrote %.17g", what, b->best_accuracy,
               a->best_accuracy);
    } else {
        CHECKF(b->best == NULL && b->best_epoch == 0, "%s: a best that was not written", what);
    }
    CHECKF(b->n_history == a->n_history, "%s: n_history %d, wrote %d", what, b->n_history,
           a->n_history);
    if (a->n_history > 0 && b->n_history == a->n_history)
        CHECKF(same_bits(a->history, b->history, (size_t)a->n_history * 3 * sizeof(float)),
               "%s: history differs", what);
    CHECKF(b->n_workers == a->n_workers, "%s: n_workers %d, wrote %d", what, b->n_workers,
           a->n_workers);
    if (a->n_workers > 0 && b->n_workers == a->n_workers) {
        if (a->n_slots > 0)
            CHECKF(same_bits(a->worker_slots, b->worker_slots,
                             (size_t)a->n_workers * a->n_slots * bytes),
                   "%s: the workers' optimizer slots differ", what);
        CHECKF(same_bits(a->worker_t, b->worker_t, (size_t)a->n_workers * sizeof(long)),
               "%s: the workers' optimizer_t differ", what);
    }
    CHECKF(b->n_residuals == a->n_residuals, "%s: n_residuals %d, wrote %d", what,
           b->n_residuals, a->n_residuals);
    if (a->n_residuals > 0 && b->n_residuals == a->n_residuals)
        CHECKF(same_bits(a->residuals, b->residuals, (size_t)a->n_residuals * bytes),
               "%s: the replicas' residuals differ", what);
}

static void write_ok(const char *path, const dp_model *m, const dp_train_state *st,
                     const dp_run_identity *id)
{
    dp_err err = {{0}};
    int rc = dp_checkpoint_write(path, m, st, id, &err);
    CHECKF(rc == 0, "writing %s: %s", path, err.msg);
    REQUIRE(rc == 0);
}

/* dp_checkpoint_read must fail, leave a freed state, and name the file and
 * every given word. */
static void expect_refused(const char *what, const char *path, const dp_model *m,
                           const dp_run_identity *id, const char *word1, const char *word2)
{
    dp_train_state st;
    dp_err err = {{0}};
    int rc = dp_checkpoint_read(path, m, id, &st, &err);
    CHECKF(rc == -1, "%s: read a file it should refuse", what);
    if (rc == 0) {
        dp_train_state_free(&st);
        return;
    }
    CHECKF(st.params == NULL && st.slots == NULL, "%s: state not freed on failure", what);
    CHECKF(strstr(err.msg, path) != NULL, "%s: message does not name the file: %s", what,
           err.msg);
    if (word1)
        CHECKF(strstr(err.msg, word1) != NULL, "%s: message lacks '%s': %s", what, word1, err.msg);
    if (word2)
        CHECKF(strstr(err.msg, word2) != NULL, "%s: message lacks '%s': %s", what, word2, err.msg);
}



static size_t header_len(const unsigned char *b)
{
    uint64_t n = 0;
    for (int k = 0; k < 8; k++)
        n |= (uint64_t)b[k] << (8 * k);
    return (size_t)n;
}

/* ------------------------------------------------------------ round trips */

static void test_round_trip(void)
{
    dp_model m;
    model_init(&m, SPEC);
    dp_run_identity id = base_id();
    dp_train_state a, b;
    dp_err err = {{0}};

    /* model-avg with adam: every part there is */
    make_state(&a, &m, 2, 2, 48, 1);
    write_ok(sp("full.safetensors"), &m, &a, &id);
    int rc = dp_checkpoint_read(sp("full.safetensors"), &m, &id, &b, &err);
    CHECKF(rc == 0, "reading back: %s", err.msg);
    if (rc == 0) {
        check_same_state("model-avg, adam", &a, &b);
        dp_train_state_free(&b);
    }
    /* the file holds the weights as PyTorch's Linear does, and the metadata */
    dp_safetensors *f = NULL;
    REQUIRE(dp_safetensors_load(sp("full.safetensors"), &f, &err) == 0);
    const dp_st_tensor *w0 = dp_safetensors_find(f, "layers.0.weight");
    const dp_st_tensor *b1 = dp_safetensors_find(f, "layers.1.bias");
    CHECK(w0 && w0->ndim == 2 && w0->shape[0] == 8 && w0->shape[1] == 20);
    CHECK(b1 && b1->ndim == 1 && b1->shape[0] == 3);
    if (w0)
        CHECK(same_bits(w0->data, a.params + m.layers[0].w_off, 160 * sizeof(float)));
    const char *v = dp_safetensors_meta(f, "dataset");
    CHECKF(v && strcmp(v, LONG_DATASET) == 0, "metadata 'dataset' is '%s'", v ? v : "(none)");
    v = dp_safetensors_meta(f, "format");
    CHECK(v && strcmp(v, DP_CKPT_FORMAT) == 0);
    v = dp_safetensors_meta(f, "epoch");
    CHECK(v && strcmp(v, "3") == 0); /* step 48 of 16 per epoch */
    CHECK(!dp_safetensors_find(f, "replica.0.residual")); /* none without compression */
    dp_safetensors_free(f);
    dp_train_state_free(&a);

    /* allreduce with --compress: each replica's residual, in its place */
    make_state(&a, &m, 2, 0, 48, 9);
    REQUIRE(dp_train_state_alloc_residuals(&a, 3, &err) == 0);
    fill(a.residuals, 3 * m.n_params, 10);
    write_ok(sp("resid.safetensors"), &m, &a, &id);
    rc = dp_checkpoint_read(sp("resid.safetensors"), &m, &id, &b, &err);
    CHECKF(rc == 0, "residuals: %s", err.msg);
    if (rc == 0) {
        check_same_state("allreduce, residuals", &a, &b);
        dp_train_state_free(&b);
    }
    dp_train_state_free(&a);

    /* model-avg with sgd: no slots at all, but each worker's optimizer_t */
    dp_run_identity sgd = id;
    sgd.optimizer = "sgd";
    make_state(&a, &m, 0, 2, 5, 2);
    write_ok(sp("avg-sgd.safetensors"), &m, &a, &sgd);
    rc = dp_checkpoint_read(sp("avg-sgd.safetensors"), &m, &sgd, &b, &err);
    CHECKF(rc == 0, "model-avg, sgd: %s", err.msg);
    if (rc == 0) {
        check_same_state("model-avg, sgd", &a, &b);
        dp_train_state_free(&b);
    }
    dp_train_state_free(&a);

    /* single with momentum and nothing optional: the optional parts stay NULL */
    dp_run_identity single = id;
    single.strategy = "single";
    single.optimizer = "momentum";
    single.workers = single.ps = 0;
    single.lr_schedule = "constant";
    REQUIRE(dp_train_state_alloc(&a, m.n_params, 1, 0, EPOCHS, 0, &err) == 0);
    fill(a.params, m.n_params, 3);
    fill(a.slots, m.n_params, 4);
    a.step = 0;
    write_ok(sp("plain.safetensors"), &m, &a, &single);
    rc = dp_checkpoint_read(sp("plain.safetensors"), &m, &single, &b, &err);
    CHECKF(rc == 0, "single, momentum: %s", err.msg);
    if (rc == 0) {
        check_same_state("single, momentum", &a, &b);
        CHECK(b.ema == NULL && b.best == NULL && b.n_history == 0 && b.n_workers == 0);
        CHECK(b.best_accuracy == -1);
        dp_train_state_free(&b);
    }
    /* a constant schedule's run may go on for more epochs */
    single.epochs = EPOCHS + 3;
    rc = dp_checkpoint_read(sp("plain.safetensors"), &m, &single, &b, &err);
    CHECKF(rc == 0, "a constant schedule with more epochs: %s", err.msg);
    if (rc == 0)
        dp_train_state_free(&b);
    dp_train_state_free(&a);

    /* a state that is not the model's is not written */
    REQUIRE(dp_train_state_alloc(&a, m.n_params - 1, 0, 0, 0, 0, &err) == 0);
    CHECK(dp_checkpoint_write(sp("wrong.safetensors"), &m, &a, &id, &err) == -1);
    CHECKF(strstr(err.msg, "wrong.safetensors") != NULL, "%s", err.msg);
    CHECK(access(sp("wrong.safetensors"), F_OK) != 0);
    dp_train_state_free(&a);
    dp_train_state_free(&a); /* twice is safe */
    dp_model_free(&m);
}

/* ------------------------------------------------------------ damaged files */

static void test_truncated(void)
{
    dp_model m;
    model_init(&m, SPEC);
    dp_run_identity id = base_id();
    dp_train_state a;
    make_state(&a, &m, 2, 2, 16, 5);
    write_ok(sp("whole.safetensors"), &m, &a, &id);
    dp_train_state_free(&a);
    size_t n;
    unsigned char *bytes = read_bytes(sp("whole.safetensors"), &n);
    REQUIRE(n > 400);
    const char *cut = sp("cut.safetensors");
    int refused = 0, tried = 0;
    /* every length below 256 (the length field, the header's start), a
     * stride through the rest, and the last 16 */
    for (size_t len = 0; len < n; len += len < 256 || len + 16 >= n ? 1 : 37) {
        write_bytes(cut, bytes, len);
        dp_train_state st;
        dp_err err = {{0}};
        int rc = dp_checkpoint_read(cut, &m, &id, &st, &err);
        tried++;
        if (rc == 0) {
            CHECKF(0, "a file cut to %zu of %zu bytes was read", len, n);
            dp_train_state_free(&st);
            continue;
        }
        CHECKF(strstr(err.msg, cut) != NULL, "cut to %zu bytes: message does not name the file: %s",
               len, err.msg);
        refused++;
    }
    CHECKF(refused == tried && tried > 300, "%d of %d cuts refused", refused, tried);
    /* the whole file still reads */
    write_bytes(cut, bytes, n);
    dp_train_state st;
    dp_err err = {{0}};
    CHECKF(dp_checkpoint_read(cut, &m, &id, &st, &err) == 0, "%s", err.msg);
    dp_train_state_free(&st);
    free(bytes);
    dp_model_free(&m);
}

static void test_flipped(void)
{
    dp_model m;
    model_init(&m, SPEC);
    dp_run_identity id = base_id();
    dp_train_state a;
    make_state(&a, &m, 2, 2, 16, 6);
    write_ok(sp("good.safetensors"), &m, &a, &id);
    dp_train_state_free(&a);
    size_t n;
    unsigned char *bytes = read_bytes(sp("good.safetensors"), &n);
    size_t data_at = 8 + header_len(bytes);
    REQUIRE(data_at < n);
    const char *bad = sp("flipped.safetensors");
    static const unsigned char masks[] = {0x01, 0x80, 0xff};
    int tried = 0;
    /* Every byte of the length field and the header with three masks; every
     * byte of the data (every tensor's) with one: a bit anywhere is caught. */
    for (size_t at = 0; at < n; at++) {
        for (size_t k = 0; k < (at < data_at ? sizeof masks : 1); k++) {
            bytes[at] ^= masks[k];
            write_bytes(bad, bytes, n);
            bytes[at] ^= masks[k];
            dp_train_state st;
            dp_err err = {{0}};
            int rc = dp_checkpoint_read(bad, &m, &id, &st, &err);
            tried++;
            if (rc == 0) {
                CHECKF(0, "byte %zu (of %zu, data at %zu) ^ 0x%02x was not noticed", at, n,
                       data_at, masks[k]);
                dp_train_state_free(&st);
                continue;
            }
            CHECKF(strstr(err.msg, bad) != NULL, "byte %zu: message does not name the file: %s",
                   at, err.msg);
            if (at >= data_at)
                CHECKF(strstr(err.msg, "checksum mismatch") != NULL,
                       "data byte %zu: not a checksum mismatch: %s", at, err.msg);
        }
    }
    CHECK(tried > (int)n);
    free(bytes);
    dp_model_free(&m);
}

/* ------------------------------------------------------------ files made by hand */

/* The metadata keys in the order dp_checkpoint_write adds them (and
 * check_crc reads them). */
static const char *const meta_keys[] = {
    "format", "model", "model_name", "step", "epoch", "optimizer_t", "best_accuracy", "best_epoch",
    "strategy", "dataset", "optimizer", "lr", "lr_schedule", "workers", "ps", "batch", "seed",
    "train_size", "val_size", "steps_per_epoch", "epochs", "settings"};
#define N_KEYS (int)(sizeof meta_keys / sizeof meta_keys[0])
#define MAX_WORKER_KEYS 8

/* A checkpoint taken apart: its tensors in file order and its metadata, to
 * change and save again.  Data and values point into the loaded file (or
 * the caller's memory). */
typedef struct draft {
    dp_safetensors *f;
    dp_st_tensor t[64];
    int nt;
    dp_st_meta meta[N_KEYS + MAX_WORKER_KEYS + 1];
    char worker_keys[MAX_WORKER_KEYS][48];
    int nm;
} draft;

static void draft_open(draft *d, const char *path)
{
    dp_err err = {{0}};
    memset(d, 0, sizeof *d);
    REQUIRE(dp_safetensors_load(path, &d->f, &err) == 0);
    d->nt = dp_safetensors_count(d->f);
    REQUIRE(d->nt <= 64);
    for (int i = 0; i < d->nt; i++)
        d->t[i] = *dp_safetensors_at(d->f, i);
    for (int i = 0; i < N_KEYS; i++) {
        const char *v = dp_safetensors_meta(d->f, meta_keys[i]);
        if (v)
            d->meta[d->nm++] = (dp_st_meta){meta_keys[i], v};
    }
    for (int w = 0; w < MAX_WORKER_KEYS; w++) {
        snprintf(d->worker_keys[w], sizeof d->worker_keys[w], "worker.%d.optimizer_t", w);
        const char *v = dp_safetensors_meta(d->f, d->worker_keys[w]);
        if (!v)
            break;
        d->meta[d->nm++] = (dp_st_meta){d->worker_keys[w], v};
    }
}

static void draft_close(draft *d) { dp_safetensors_free(d->f); }

static dp_st_tensor *draft_tensor(draft *d, const char *name)
{
    for (int i = 0; i < d->nt; i++)
        if (strcmp(d->t[i].name, name) == 0)
            return &d->t[i];
    REQUIRE(!"no such tensor in the draft");
    return NULL;
}

static void draft_drop_tensor(draft *d, const char *name)
{
    dp_st_tensor *t = draft_tensor(d, name);
    memmove(t, t + 1, (size_t)(d->t + d->nt - (t + 1)) * sizeof *t);
    d->nt--;
}

static dp_st_meta *draft_meta(draft *d, const char *key)
{
    for (int i = 0; i < d->nm; i++)
        if (strcmp(d->meta[i].key, key) == 0)
            return &d->meta[i];
    REQUIRE(!"no such metadata key in the draft");
    return NULL;
}

static void draft_drop_meta(draft *d, const char *key)
{
    dp_st_meta *e = draft_meta(d, key);
    memmove(e, e + 1, (size_t)(d->meta + d->nm - (e + 1)) * sizeof *e);
    d->nm--;
}

static uint32_t crc_text(uint32_t crc, const char *key, const char *value)
{
    crc = dp_crc32c(crc, key, strlen(key) + 1);
    return dp_crc32c(crc, value, strlen(value) + 1);
}

/* Saves the draft with a crc32c computed as checkpoint.c's check_crc does
 * (the known keys present, the workers' keys up to the first missing one,
 * every tensor's name and data in file order), so the change is what gets
 * noticed, not the checksum. */
static void draft_save(draft *d, const char *path)
{
    uint32_t crc = 0;
    for (int k = 0; k < N_KEYS; k++)
        for (int i = 0; i < d->nm; i++)
            if (strcmp(d->meta[i].key, meta_keys[k]) == 0)
                crc = crc_text(crc, d->meta[i].key, d->meta[i].value);
    for (int w = 0; w < MAX_WORKER_KEYS; w++) {
        char key[48];
        snprintf(key, sizeof key, "worker.%d.optimizer_t", w);
        int found = 0;
        for (int i = 0; i < d->nm && !found; i++)
            if (strcmp(d->meta[i].key, key) == 0) {
                crc = crc_text(crc, key, d->meta[i].value);
                found = 1;
            }
        if (!found)
            break;
    }
    for (int i = 0; i < d->nt; i++) {
        size_t n = 1;
        for (int k = 0; k < d->t[i].ndim; k++)
            n *= (size_t)d->t[i].shape[k];
        crc = dp_crc32c(crc, d->t[i].name, strlen(d->t[i].name) + 1);
        crc = dp_crc32c(crc, d->t[i].data, n * sizeof(float));
    }
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", crc);
    dp_st_meta meta[N_KEYS + MAX_WORKER_KEYS + 1];
    memcpy(meta, d->meta, (size_t)d->nm * sizeof *meta);
    meta[d->nm] = (dp_st_meta){"crc32c", hex};
    dp_err err = {{0}};
    int rc = dp_safetensors_save(path, d->t, d->nt, meta, d->nm + 1, &err);
    CHECKF(rc == 0, "saving the draft %s: %s", path, err.msg);
    REQUIRE(rc == 0);
}

/* The file's header with every `from` after `"name":{"dtype":"` replaced by
 * `to` (the same length, so the header length stays right). */
static void retype(const char *src, const char *dst, const char *name, const char *to)
{
    size_t n;
    unsigned char *b = read_bytes(src, &n);
    char needle[128];
    snprintf(needle, sizeof needle, "\"%s\":{\"dtype\":\"F32\"", name);
    size_t hl = header_len(b);
    char *hdr = malloc(hl + 1);
    REQUIRE(hdr != NULL);
    memcpy(hdr, b + 8, hl);
    hdr[hl] = '\0';
    char *at = strstr(hdr, needle);
    REQUIRE(at != NULL && strlen(to) == 3);
    memcpy(b + 8 + (size_t)(at - hdr) + strlen(needle) - 4, to, 3);
    write_bytes(dst, b, n);
    free(hdr);
    free(b);
}

static void test_by_hand(void)
{
    dp_model m;
    model_init(&m, SPEC);
    dp_run_identity id = base_id();
    dp_train_state a;
    make_state(&a, &m, 2, 2, 32, 7);
    const char *good = sp("base.safetensors");
    write_ok(good, &m, &a, &id);
    dp_train_state_free(&a);
    const char *bad = sp("hand.safetensors");
    draft d;

    /* the draft machinery itself: an unchanged draft reads back */
    draft_open(&d, good);
    draft_save(&d, bad);
    draft_close(&d);
    dp_train_state st;
    dp_err err = {{0}};
    int rc = dp_checkpoint_read(bad, &m, &id, &st, &err);
    CHECKF(rc == 0, "an unchanged draft: %s", err.msg);
    if (rc == 0)
        dp_train_state_free(&st);

    /* a changed value without a new checksum is a checksum mismatch */
    draft_open(&d, good);
    draft_meta(&d, "step")->value = "33";
    dp_err e2;
    dp_st_meta meta[N_KEYS + MAX_WORKER_KEYS + 1];
    memcpy(meta, d.meta, (size_t)d.nm * sizeof *meta);
    meta[d.nm] = (dp_st_meta){"crc32c", dp_safetensors_meta(d.f, "crc32c")};
    REQUIRE(dp_safetensors_save(bad, d.t, d.nt, meta, d.nm + 1, &e2) == 0);
    draft_close(&d);
    expect_refused("step changed, old checksum", bad, &m, &id, "checksum mismatch", NULL);

    /* wrong shapes */
    float big[1024];
    fill(big, 1024, 9);
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[3];
        const char *says;
    } shapes[] = {
        {"layers.0.weight", 2, {20, 8}, "has shape (20, 8), the model needs (8, 20)"},
        {"layers.0.weight", 2, {8, 21}, "has shape (8, 21), the model needs (8, 20)"},
        {"layers.0.weight", 1, {160}, "has shape (160), the model needs (8, 20)"},
        {"layers.1.bias", 1, {4}, "has shape (4), the model needs (3)"},
        {"layers.1.bias", 2, {1, 3}, "has shape (1, 3), the model needs (3)"},
        {"layers.1.bias", 3, {1, 1, 3}, "has shape (1, 1, 3), the model needs (3)"},
        {"optimizer.slot1", 1, {194}, "needs (195)"},
        {"worker.1.optimizer.slot0", 1, {196}, "needs (195)"},
        {"ema", 1, {100}, "needs (195)"},
        {"best", 2, {195, 1}, "needs (195)"},
    };
    REQUIRE(m.n_params == 195);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        draft_open(&d, good);
        dp_st_tensor *t = draft_tensor(&d, shapes[i].name);
        t->data = big;
        t->ndim = shapes[i].ndim;
        memset(t->shape, 0, sizeof t->shape);
        memcpy(t->shape, shapes[i].shape, sizeof shapes[i].shape);
        draft_save(&d, bad);
        draft_close(&d);
        char what[128];
        snprintf(what, sizeof what, "%s of another shape (%s)", shapes[i].name, shapes[i].says);
        expect_refused(what, bad, &m, &id, shapes[i].name, shapes[i].says);
    }
    /* a history of more epochs than the run has */
    draft_open(&d, good);
    dp_st_tensor *h = draft_tensor(&d, "loop.history");
    h->data = big;
    h->shape[0] = EPOCHS + 1;
    draft_save(&d, bad);
    draft_close(&d);
    expect_refused("a history too long", bad, &m, &id, "loop.history", NULL);

    /* wrong dtypes: refused by the safetensors reader, naming the tensor */
    static const char *const retyped[] = {"layers.0.weight", "layers.1.bias", "optimizer.slot0",
                                          "ema"};
    for (size_t i = 0; i < sizeof retyped / sizeof retyped[0]; i++) {
        retype(good, bad, retyped[i], "F64");
        expect_refused("an F64 tensor", bad, &m, &id, retyped[i], "F64");
        retype(good, bad, retyped[i], "I32");
        expect_refused("an I32 tensor", bad, &m, &id, retyped[i], "I32");
    }

    /* missing tensors */
    static const char *const tensors[] = {"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                          "layers.1.bias", "optimizer.slot0", "optimizer.slot1",
                                          "worker.0.optimizer.slot1", "worker.1.optimizer.slot0",
                                          "best"};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
        draft_open(&d, good);
        draft_drop_tensor(&d, tensors[i]);
        draft_save(&d, bad);
        draft_close(&d);
        char what[128];
        snprintf(what, sizeof what, "tensor %s missing", tensors[i]);
        /* best missing while best_epoch says there is one: named too */
        expect_refused(what, bad, &m, &id, tensors[i],
                       strcmp(tensors[i], "best") == 0 ? "best_epoch" : "missing");
    }

    /* missing metadata keys (epoch and steps_per_epoch are informative only) */
    for (int k = 0; k < N_KEYS; k++) {
        if (strcmp(meta_keys[k], "epoch") == 0 || strcmp(meta_keys[k], "steps_per_epoch") == 0 ||
            strcmp(meta_keys[k], "model_name") == 0)
            continue;
        draft_open(&d, good);
        draft_drop_meta(&d, meta_keys[k]);
        draft_save(&d, bad);
        draft_close(&d);
        char what[128];
        snprintf(what, sizeof what, "metadata %s missing", meta_keys[k]);
        expect_refused(what, bad, &m, &id, meta_keys[k], NULL);
    }
    draft_open(&d, good);
    draft_drop_meta(&d, "worker.1.optimizer_t");
    draft_save(&d, bad);
    draft_close(&d);
    expect_refused("metadata worker.1.optimizer_t missing", bad, &m, &id, "worker.1.optimizer_t",
                   "missing");
    /* no checksum at all */
    draft_open(&d, good);
    memcpy(meta, d.meta, (size_t)d.nm * sizeof *meta);
    REQUIRE(dp_safetensors_save(bad, d.t, d.nt, meta, d.nm, &e2) == 0);
    draft_close(&d);
    expect_refused("no crc32c", bad, &m, &id, "'crc32c' is missing", NULL);
    /* a safetensors file that is no checkpoint */
    float w[2] = {1, 2};
    dp_st_tensor one = {.name = "w", .data = w, .ndim = 1, .shape = {2}};
    REQUIRE(dp_safetensors_save(bad, &one, 1, NULL, 0, &e2) == 0);
    expect_refused("a plain safetensors file", bad, &m, &id, "not a downpour training checkpoint",
                   NULL);

    /* numbers that do not parse, or are out of range */
    static const struct {
        const char *key, *value, *says;
    } numbers[] = {
        {"step", "abc", "not an integer"},
        {"step", "12x", "not an integer"},
        {"step", "", "empty"},
        {"step", "-1", "out of range"},
        {"step", "99999999999999999999999", "out of range"},
        {"optimizer_t", "1.5", "not an integer"},
        {"best_epoch", "6", "out of range"},
        {"best_epoch", "two", "not an integer"},
        {"best_accuracy", "nan", "not a number"},
        {"best_accuracy", "1.5", "out of range"},
        {"workers", "two", "not an integer"},
        {"epochs", "0", "out of range"},
        {"worker.0.optimizer_t", "0x10", "not an integer"},
    };
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        draft_open(&d, good);
        draft_meta(&d, numbers[i].key)->value = numbers[i].value;
        draft_save(&d, bad);
        draft_close(&d);
        char what[128], key[64];
        snprintf(what, sizeof what, "%s = '%s'", numbers[i].key, numbers[i].value);
        snprintf(key, sizeof key, "'%s'", numbers[i].key);
        expect_refused(what, bad, &m, &id, key, numbers[i].says);
    }
    /* another format version */
    draft_open(&d, good);
    draft_meta(&d, "format")->value = "downpour-checkpoint-1";
    draft_save(&d, bad);
    draft_close(&d);
    expect_refused("format 1", bad, &m, &id, "downpour-checkpoint-1", DP_CKPT_FORMAT);
    dp_model_free(&m);
}

/* ------------------------------------------------------------ another run */

static void test_identity(void)
{
    dp_model m, other;
    model_init(&m, SPEC);
    model_init(&other, "20-9-3");
    dp_run_identity id = base_id();
    dp_train_state a;
    make_state(&a, &m, 2, 2, 32, 8);
    const char *path = sp("mine.safetensors");
    write_ok(path, &m, &a, &id);
    dp_train_state_free(&a);

    expect_refused("another model", path, &other, &id, "belongs to another run",
                   "its model is 20-8-3, this run's is 20-9-3");

    dp_run_identity x = id;
    x.strategy = "ps-sync";
    expect_refused("another strategy", path, &m, &x, "belongs to another run",
                   "its strategy is model-avg, this run's is ps-sync");
    x = id;
    x.seed = 43;
    expect_refused("another seed", path, &m, &x, "belongs to another run", "its seed is 42");
    x = id;
    x.batch = 64;
    expect_refused("another batch", path, &m, &x, "belongs to another run", "its batch is 32");
    x = id;
    x.optimizer = "momentum";
    expect_refused("another optimizer", path, &m, &x, "belongs to another run",
                   "its optimizer is adam");
    x = id;
    x.dataset = "mnist";
    expect_refused("another dataset", path, &m, &x, "belongs to another run", "its dataset is");
    x = id;
    x.lr = 0.002f;
    expect_refused("another lr", path, &m, &x, "belongs to another run", "its lr is");
    x = id;
    x.lr_schedule = "constant";
    expect_refused("another schedule", path, &m, &x, "belongs to another run",
                   "its lr_schedule is cosine");
    x = id;
    x.train_size = 2000;
    expect_refused("another split", path, &m, &x, "belongs to another run",
                   "its train_size is 1000");
    x = id;
    x.val_size = 10;
    expect_refused("another validation split", path, &m, &x, "belongs to another run",
                   "its val_size is 100");
    x = id;
    x.workers = 3;
    expect_refused("more workers", path, &m, &x, "2 worker(s) and 1 ps task(s)", "has 3 and 1");
    x = id;
    x.ps = 2;
    expect_refused("more ps tasks", path, &m, &x, "2 worker(s) and 1 ps task(s)", "has 2 and 2");
    x = id;
    x.epochs = EPOCHS + 1; /* a cosine schedule's length is part of the run */
    expect_refused("more epochs, cosine", path, &m, &x, "epochs", "cosine");
    /* the settings, matched by key: a setting written only when on (allreduce's
     * compress=, the warm-up) that one run has and the other not is named */
    dp_train_state_free(&a);
    make_state(&a, &m, 2, 2, 32, 8);
    dp_run_identity s = id;
    s.settings = "momentum=0 sync_bn=1 compress=topk:0.05 warmup=5steps";
    const char *spath = sp("settings.safetensors");
    write_ok(spath, &m, &a, &s);
    dp_train_state_free(&a);
    x = s;
    x.settings = "momentum=0 sync_bn=1 warmup=5steps";
    expect_refused("a setting this run lacks", spath, &m, &x, "belongs to another run",
                   "its compress=topk:0.05, this run has no compress");
    x.settings = "momentum=0 sync_bn=1 compress=topk:0.1 warmup=5steps";
    expect_refused("a setting changed", spath, &m, &x, "belongs to another run",
                   "its compress=topk:0.05, this run's compress=topk:0.1");
    x.settings = "momentum=0 sync_bn=1 compress=topk:0.05 clip_norm=1 warmup=5steps";
    expect_refused("a setting the checkpoint lacks", spath, &m, &x, "belongs to another run",
                   "it has no clip_norm, this run's clip_norm=1");
    /* steps per epoch follows from the rest: not part of the identity */
    x = id;
    x.steps_per_epoch = 17;
    dp_err err = {{0}};
    int rc = dp_checkpoint_read(path, &m, &x, &a, &err);
    CHECKF(rc == 0, "steps_per_epoch differs: %s", err.msg);
    if (rc == 0)
        dp_train_state_free(&a);
    dp_model_free(&m);
    dp_model_free(&other);
}

/* ------------------------------------------------------------ a directory */

/* find_newest with stderr kept in a file; the log comes back in log. */
static int find_logged(const char *dir, const dp_model *m, const dp_run_identity *id,
                       dp_train_state *st, char *path, size_t path_len, dp_err *err, char *log,
                       size_t log_len)
{
    const char *file = sp("stderr.log");
    fflush(stderr);
    int saved = dup(2);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    int rc = dp_checkpoint_find_newest(dir, m, id, st, path, path_len, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(file, "r");
    REQUIRE(f != NULL);
    size_t n = fread(log, 1, log_len - 1, f);
    log[n] = '\0';
    fclose(f);
    if (n)
        fprintf(stderr, "find_newest said:\n%s", log);
    return rc;
}

static void write_step(const char *dir, const dp_model *m, const dp_run_identity *id, long step)
{
    char path[1200];
    dp_checkpoint_path(path, sizeof path, dir, step);
    dp_train_state st;
    make_state(&st, m, 2, 2, step, (uint32_t)step);
    write_ok(path, m, &st, id);
    dp_train_state_free(&st);
}

static void test_find_newest(void)
{
    dp_model m;
    model_init(&m, SPEC);
    dp_run_identity id = base_id();
    char dir[1200], path[1200], log[4096];
    dp_train_state st;
    dp_err err = {{0}};
    snprintf(dir, sizeof dir, "%s", sp("ckpts"));
    REQUIRE(mkdir(dir, 0755) == 0);

    dp_checkpoint_path(path, sizeof path, "some/dir", 42);
    CHECKF(strcmp(path, "some/dir/ckpt-0000000042.safetensors") == 0, "%s", path);

    /* an empty directory: none */
    int rc = find_logged(dir, &m, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == 0, "an empty directory: %d %s", rc, err.msg);
    /* a directory that is not there: an error naming it */
    rc = dp_checkpoint_find_newest(sp("no-such-dir"), &m, &id, &st, path, sizeof path, &err);
    CHECKF(rc == -1 && strstr(err.msg, "no-such-dir"), "a missing directory: %d %s", rc, err.msg);

    /* the highest step wins, whatever order the names come in; other names
     * are not checkpoints */
    write_step(dir, &m, &id, 20);
    write_step(dir, &m, &id, 100);
    write_step(dir, &m, &id, 9);
    char junk[1300];
    snprintf(junk, sizeof junk, "%s/ckpt-999.safetensors", dir);
    write_bytes(junk, "junk", 4);
    snprintf(junk, sizeof junk, "%s/ckpt-00000009999.safetensors", dir);
    write_bytes(junk, "junk", 4);
    snprintf(junk, sizeof junk, "%s/notes.txt", dir);
    write_bytes(junk, "notes", 5);
    rc = find_logged(dir, &m, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == 1, "three checkpoints: %d %s", rc, err.msg);
    if (rc == 1) {
        CHECKF(st.step == 100 && strstr(path, "ckpt-0000000100.safetensors"), "found step %ld at %s",
               st.step, path);
        dp_train_state ref;
        make_state(&ref, &m, 2, 2, 100, 100);
        check_same_state("the newest", &ref, &st);
        dp_train_state_free(&ref);
        dp_train_state_free(&st);
    }
    CHECKF(strstr(log, "set aside") == NULL, "a warning with nothing damaged: %s", log);

    /* a truncated newest one is set aside (renamed *.damaged, so it no longer
     * counts among the kept ones) with a warning naming it; the older is read */
    char newest[1200];
    dp_checkpoint_path(newest, sizeof newest, dir, 150);
    write_step(dir, &m, &id, 150);
    REQUIRE(truncate(newest, 1000) == 0);
    rc = find_logged(dir, &m, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == 1, "a truncated newest one: %d %s", rc, err.msg);
    if (rc == 1) {
        CHECKF(st.step == 100 && strstr(path, "ckpt-0000000100"), "found step %ld at %s", st.step,
               path);
        dp_train_state_free(&st);
    }
    CHECKF(strstr(log, "warning") && strstr(log, "set aside") && strstr(log, newest),
           "no warning naming %s: %s", newest, log);
    char aside[1300];
    snprintf(aside, sizeof aside, "%s.damaged", newest);
    CHECKF(access(aside, F_OK) == 0 && access(newest, F_OK) != 0, "%s was not set aside", newest);
    /* and one with a flipped data byte: set aside too */
    write_step(dir, &m, &id, 200);
    dp_checkpoint_path(newest, sizeof newest, dir, 200);
    size_t n;
    unsigned char *b = read_bytes(newest, &n);
    b[n - 5] ^= 0x10;
    write_bytes(newest, b, n);
    free(b);
    rc = find_logged(dir, &m, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == 1 && st.step == 100, "two damaged newest: %d step %ld %s", rc, st.step, err.msg);
    if (rc == 1)
        dp_train_state_free(&st);
    CHECKF(strstr(log, "checksum mismatch") && strstr(log, "ckpt-0000000200"),
           "the warning names it: %s", log);

    /* every one damaged: none to resume from */
    char lone[1200];
    snprintf(lone, sizeof lone, "%s", sp("all-damaged"));
    REQUIRE(mkdir(lone, 0755) == 0);
    write_step(lone, &m, &id, 7);
    dp_checkpoint_path(path, sizeof path, lone, 7);
    REQUIRE(truncate(path, 8) == 0);
    rc = find_logged(lone, &m, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == 0 && strstr(log, "set aside"), "only a damaged one: %d %s", rc, log);

    /* a newest one of another run is an error, not skipped (and a state
     * the caller never initialised is left zeroed, not freed) */
    dp_run_identity x = id;
    x.seed = 7;
    write_step(dir, &m, &x, 300);
    memset(&st, 0xa5, sizeof st);
    rc = find_logged(dir, &m, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == -1 && strstr(err.msg, "belongs to another run") &&
               strstr(err.msg, "ckpt-0000000300"),
           "another run's newest: %d %s", rc, err.msg);
    CHECK(st.params == NULL);
    /* and another model's */
    dp_model other;
    model_init(&other, "20-9-3");
    dp_checkpoint_path(path, sizeof path, dir, 300);
    REQUIRE(unlink(path) == 0);
    rc = find_logged(dir, &other, &id, &st, path, sizeof path, &err, log, sizeof log);
    CHECKF(rc == -1 && strstr(err.msg, "its model is 20-8-3"), "another model: %d %s", rc,
           err.msg);
    dp_model_free(&other);
    dp_model_free(&m);
}

static int exists(const char *dir, long step)
{
    char path[1200];
    dp_checkpoint_path(path, sizeof path, dir, step);
    return access(path, F_OK) == 0;
}

static void test_prune(void)
{
    dp_model m;
    model_init(&m, SPEC);
    dp_run_identity id = base_id();
    char dir[1200], junk[1300];
    snprintf(dir, sizeof dir, "%s", sp("prune"));
    REQUIRE(mkdir(dir, 0755) == 0);
    static const long steps[] = {30, 5, 1000, 10, 200, 20};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        write_step(dir, &m, &id, steps[i]);
    snprintf(junk, sizeof junk, "%s/notes.txt", dir);
    write_bytes(junk, "x", 1);
    snprintf(junk, sizeof junk, "%s/ckpt-1.safetensors", dir);
    write_bytes(junk, "x", 1);

    dp_checkpoint_prune(dir, 3);
    CHECK(exists(dir, 1000) && exists(dir, 200) && exists(dir, 30));
    CHECK(!exists(dir, 20) && !exists(dir, 10) && !exists(dir, 5));
    CHECK(access(junk, F_OK) == 0);
    snprintf(junk, sizeof junk, "%s/notes.txt", dir);
    CHECKF(access(junk, F_OK) == 0, "prune deleted a file that is no checkpoint");
    dp_checkpoint_prune(dir, 3); /* nothing more to do */
    CHECK(exists(dir, 1000) && exists(dir, 200) && exists(dir, 30));
    dp_checkpoint_prune(dir, 1);
    CHECK(exists(dir, 1000) && !exists(dir, 200) && !exists(dir, 30));
    dp_checkpoint_prune(dir, 5); /* fewer than keep: all stay */
    CHECK(exists(dir, 1000));
    dp_checkpoint_prune(sp("no-such-dir"), 1); /* no crash */
    dp_model_free(&m);
}

/* ------------------------------------------------------------ downpour eval */

static void test_load_weights(void)
{
    dp_model m, got;
    model_init(&m, "mlp-128");
    dp_run_identity id = base_id();
    id.strategy = "single";
    id.optimizer = "adam";
    id.workers = id.ps = 0;
    dp_err err = {{0}};

    /* a training checkpoint */
    dp_train_state st;
    REQUIRE(dp_train_state_alloc(&st, m.n_params, 2, DP_STATE_EMA, EPOCHS, 0, &err) == 0);
    fill(st.params, m.n_params, 11);
    fill(st.slots, 2 * m.n_params, 12);
    fill(st.ema, m.n_params, 13);
    st.step = 77;
    write_ok(sp("train.safetensors"), &m, &st, &id);
    dp_ckpt_info info;
    int rc = dp_checkpoint_load_weights(sp("train.safetensors"), &got, 16, &info, &err);
    CHECKF(rc == 0, "load_weights of a training checkpoint: %s", err.msg);
    if (rc == 0) {
        CHECK(got.n_params == m.n_params && strcmp(got.spec, "784-128-10") == 0);
        CHECKF(strcmp(got.name, "mlp-128") == 0, "name %s", got.name);
        CHECK(got.max_batch == 16);
        CHECKF(same_bits(got.params, st.params, m.n_params * sizeof(float)),
               "the weights differ");
        CHECK(info.step == 77);
        CHECK(strcmp(info.strategy, "single") == 0);
        CHECK(strcmp(info.dataset, LONG_DATASET) == 0);
        dp_model_free(&got);
    }
    dp_train_state_free(&st);

    /* a --save file: the weights alone (as report_and_save writes it) */
    float *w = malloc(m.n_params * sizeof(float));
    REQUIRE(w != NULL);
    fill(w, m.n_params, 14);
    dp_train_state weights = {.n_params = m.n_params, .params = w, .step = 500,
                              .best_accuracy = -1};
    write_ok(sp("saved.safetensors"), &m, &weights, &id);
    rc = dp_checkpoint_load_weights(sp("saved.safetensors"), &got, 8, NULL, &err);
    CHECKF(rc == 0, "load_weights of a --save file: %s", err.msg);
    if (rc == 0) {
        CHECKF(same_bits(got.params, w, m.n_params * sizeof(float)), "the saved weights differ");
        dp_model_free(&got);
    }
    rc = dp_checkpoint_load_weights(sp("saved.safetensors"), &got, 8, &info, &err);
    CHECK(rc == 0 && info.step == 500);
    if (rc == 0)
        dp_model_free(&got);
    /* only the layers.* tensors are needed: it is all a --save file has */
    dp_safetensors *f = NULL;
    REQUIRE(dp_safetensors_load(sp("saved.safetensors"), &f, &err) == 0);
    CHECKF(dp_safetensors_count(f) == 4, "a --save file holds %d tensors",
           dp_safetensors_count(f));
    dp_safetensors_free(f);
    free(w);

    /* refusals name the file */
    float one[2] = {1, 2};
    dp_st_tensor t = {.name = "w", .data = one, .ndim = 1, .shape = {2}};
    REQUIRE(dp_safetensors_save(sp("plain.st"), &t, 1, NULL, 0, &err) == 0);
    rc = dp_checkpoint_load_weights(sp("plain.st"), &got, 8, &info, &err);
    CHECKF(rc == -1 && strstr(err.msg, "plain.st") && strstr(err.msg, "'model' is missing"),
           "no model: %d %s", rc, err.msg);
    CHECK(got.params == NULL);
    dp_st_meta meta = {"model", "20-8-3"};
    REQUIRE(dp_safetensors_save(sp("nolayers.st"), &t, 1, &meta, 1, &err) == 0);
    rc = dp_checkpoint_load_weights(sp("nolayers.st"), &got, 8, &info, &err);
    CHECKF(rc == -1 && strstr(err.msg, "nolayers.st") && strstr(err.msg, "layers.0.weight"),
           "no layers: %d %s", rc, err.msg);
    meta.value = "20-x-3";
    REQUIRE(dp_safetensors_save(sp("badspec.st"), &t, 1, &meta, 1, &err) == 0);
    rc = dp_checkpoint_load_weights(sp("badspec.st"), &got, 8, &info, &err);
    CHECKF(rc == -1 && strstr(err.msg, "badspec.st"), "a bad spec: %d %s", rc, err.msg);
    rc = dp_checkpoint_load_weights(sp("none.st"), &got, 8, &info, &err);
    CHECKF(rc == -1 && strstr(err.msg, "none.st"), "no file: %d %s", rc, err.msg);
    dp_model_free(&m);
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_checkpoint");
    test_round_trip();
    test_truncated();
    test_flipped();
    test_by_hand();
    test_identity();
    test_find_newest();
    test_prune();
    test_load_weights();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
