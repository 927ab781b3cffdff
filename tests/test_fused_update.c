/* The optimiser update fused into backprop (dp_model_train_step, what the
 * single strategy runs) against its twin, dp_model_forward_backward then
 * dp_optim_apply: the same bits in parameters, gradients, optimiser state,
 * loss and hits, for every optimiser, on 1 and 2 threads, for dense and image
 * models (docs/architecture.md, "Fast paths").  Also: an update cut into
 * pieces anywhere gives the bits of the whole one, and a diverged loss
 * updates nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/rng.h"

static const dp_optim_kind kinds[] = {DP_OPTIM_SGD,     DP_OPTIM_MOMENTUM, DP_OPTIM_NESTEROV,
                                      DP_OPTIM_ADAGRAD, DP_OPTIM_ADAM,     DP_OPTIM_ADAMW};
#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

static dp_optim_config config(dp_optim_kind kind)
{
    dp_optim_config c = dp_optim_defaults(kind);
    c.lr *= 3.0f; /* big enough that the parameters move every step */
    if (kind == DP_OPTIM_MOMENTUM || kind == DP_OPTIM_ADAGRAD)
        c.weight_decay = 0.01f; /* L2 (adamw decays by its default) */
    return c;
}

/* Pieces at random cut points (odd lengths, unaligned starts) against one
 * dp_optim_apply, over several steps, each kind, fast and exact Adam. */
static void test_pieces(void)
{
    enum { LEN = 1003, STEPS = 4 };
    static float pa[LEN], pb[LEN], g[LEN];
    dp_rng r;
    dp_rng_seed(&r, 11);
    for (int k = 0; k <= N_KINDS; k++) {
        dp_optim_config c = config(kinds[k < N_KINDS ? k : N_KINDS - 1]);
        dp_optim a, b;
        dp_err err;
        REQUIRE(dp_optim_init(&a, &c, LEN, &err) == 0 && dp_optim_init(&b, &c, LEN, &err) == 0);
        a.exact = b.exact = k == N_KINDS; /* the last round: Adam's IEEE twin */
        for (int i = 0; i < LEN; i++)
            pa[i] = pb[i] = dp_rng_uniform(&r) - 0.5f;
        for (int s = 0; s < STEPS; s++) {
            for (int i = 0; i < LEN; i++)
                g[i] = (dp_rng_uniform(&r) - 0.5f) * (i % 7 == 0 ? 0.0f : 1.0f);
            dp_optim_apply(&a, pa, g, c.lr);
            dp_optim_step st = dp_optim_begin(&b, c.lr);
            size_t lo = 0;
            while (lo < LEN) {
                size_t hi = lo + 1 + dp_rng_below(&r, 40);
                dp_optim_apply_range(&b, &st, pb, g, lo, hi > LEN ? LEN : hi);
                lo = hi;
            }
        }
        size_t slots = (size_t)dp_optim_slots(c.kind) * LEN;
        CHECKF(a.t == b.t && memcmp(pa, pb, sizeof pa) == 0 &&
                   (!slots || memcmp(a.state, b.state, slots * sizeof(float)) == 0),
               "%s%s: pieces differ from the whole update", dp_optim_kind_name(c.kind),
               a.exact ? " (exact)" : "");
        dp_optim_free(&a);
        dp_optim_free(&b);
    }
}

typedef struct run {
    dp_model m;
    dp_optim o;
    float loss[8];
    int correct[8];
} run;

/* Trains `steps` steps on random batches, fused or not; the batches and
 * initial weights depend on the seed alone. */
static void train(run *t, const char *spec, const dp_optim_config *c, int batch, int steps,
                  int fused)
{
    dp_err err;
    memset(t, 0, sizeof *t);
    REQUIRE(steps <= 8);
    REQUIRE(dp_model_init(&t->m, spec, batch, 1, &err) == 0);
    REQUIRE(dp_optim_init(&t->o, c, t->m.n_params, &err) == 0);
    dp_model_init_params(&t->m, 5);
    int in = dp_model_inputs(&t->m), classes = dp_model_classes(&t->m);
    float *x = malloc(sizeof(float) * (size_t)batch * in);
    uint8_t *y = malloc((size_t)batch);
    REQUIRE(x && y);
    dp_rng r;
    dp_rng_seed(&r, 9);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < batch * in; i++)
            x[i] = dp_rng_uniform(&r);
        for (int i = 0; i < batch; i++)
            y[i] = (uint8_t)dp_rng_below(&r, (uint32_t)classes);
        t->correct[s] = 0;
        if (fused) {
            t->loss[s] = dp_model_train_step(&t->m, &t->o, x, y, batch, c->lr, &t->correct[s]);
        } else {
            t->loss[s] = dp_model_forward_backward(&t->m, x, y, batch, &t->correct[s]);
            dp_optim_apply(&t->o, t->m.params, t->m.grads, c->lr);
        }
    }
    free(x);
    free(y);
}

static void done(run *t)
{
    dp_optim_free(&t->o);
    dp_model_free(&t->m);
}

static void test_fused_matches_unfused(void)
{
    /* Odd widths put tails everywhere; batch 48 splits the products over the
     * pool; the image model covers conv (chunked backward), pool and dense. */
    const struct {
        const char *spec;
        int batch;
    } models[] = {
        {"784-300-100-10", 48},
        {"61-37-13-10", 7},
        {"1x12x12-conv3x3x5-relu-maxpool2-17-10", 6},
    };
    enum { STEPS = 5 };
    for (int threads = 1; threads <= 2; threads++) {
        dp_blas_set_threads(threads);
        for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++)
            for (int k = 0; k < N_KINDS; k++) {
                dp_optim_config c = config(kinds[k]);
                run a, b;
                train(&a, models[mi].spec, &c, models[mi].batch, STEPS, 1);
                train(&b, models[mi].spec, &c, models[mi].batch, STEPS, 0);
                size_t n = a.m.n_params, slots = (size_t)dp_optim_slots(c.kind) * n;
                CHECKF(memcmp(a.loss, b.loss, sizeof a.loss) == 0 &&
                           memcmp(a.correct, b.correct, sizeof a.correct) == 0,
                       "%s, %s, %d threads: losses or hits differ", models[mi].spec,
                       dp_optim_kind_name(c.kind), threads);
                CHECKF(memcmp(a.m.params, b.m.params, n * sizeof(float)) == 0 &&
                           memcmp(a.m.grads, b.m.grads, n * sizeof(float)) == 0,
                       "%s, %s, %d threads: parameters or gradients differ", models[mi].spec,
                       dp_optim_kind_name(c.kind), threads);
                CHECKF(a.o.t == STEPS && b.o.t == STEPS &&
                           (!slots || memcmp(a.o.state, b.o.state, slots * sizeof(float)) == 0),
                       "%s, %s, %d threads: optimiser state differs", models[mi].spec,
                       dp_optim_kind_name(c.kind), threads);
                done(&a);
                done(&b);
            }
    }
}

/* A non-finite loss comes back before backprop: nothing moves, t stays. */
static void test_diverged_updates_nothing(void)
{
    dp_model m;
    dp_optim o;
    dp_err err;
    dp_optim_config c = config(DP_OPTIM_ADAM);
    REQUIRE(dp_model_init(&m, "20-8-10", 4, 1, &err) == 0);
    REQUIRE(dp_optim_init(&o, &c, m.n_params, &err) == 0);
    dp_model_init_params(&m, 3);
    float x[4 * 20], *before = malloc(m.n_params * sizeof(float));
    uint8_t y[4] = {1, 2, 3, 4};
    REQUIRE(before != NULL);
    for (int i = 0; i < 4 * 20; i++)
        x[i] = 0.5f;
    x[7] = INFINITY;
    memcpy(before, m.params, m.n_params * sizeof(float));
    float loss = dp_model_train_step(&m, &o, x, y, 4, c.lr, NULL);
    CHECK(!isfinite(loss));
    CHECK(o.t == 0);
    CHECK(memcmp(before, m.params, m.n_params * sizeof(float)) == 0);
    CHECK(isnan(dp_model_train_step(&m, &o, x, y, 5, c.lr, NULL))); /* batch > max_batch */
    free(before);
    dp_optim_free(&o);
    dp_model_free(&m);
}

int main(void)
{
    test_pieces();
    test_fused_matches_unfused();
    test_diverged_updates_nothing();
    return CHECK_DONE();
}
