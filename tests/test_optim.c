/* Optimisers against values worked out by hand (double precision, written out
 * below), Keras defaults, kind parsing, and config errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/optim.h"

#define N 3

static const float p0[N] = {1.0f, -2.0f, 0.5f};
static const float g0[N] = {0.1f, -0.2f, 0.3f};

/* Applies `steps` updates with the fixed gradient g0 from p0 and compares the
 * parameters after every step with want[step][i]. */
static void run(const char *what, const dp_optim_config *cfg, int steps,
                const double want[][N], double tol)
{
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, cfg, N, &err) == 0);
    float p[N];
    memcpy(p, p0, sizeof p);
    for (int s = 0; s < steps; s++) {
        dp_optim_apply(&o, p, g0, o.cfg.lr);
        CHECK(o.t == s + 1);
        for (int i = 0; i < N; i++)
            CHECKF(fabs(p[i] - want[s][i]) <= tol, "%s step %d p[%d] = %.9g, want %.9g", what,
                   s + 1, i, (double)p[i], want[s][i]);
    }
    dp_optim_free(&o);
    CHECK(o.state == NULL);
}

static void test_sgd(void)
{
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_SGD);
    c.lr = 0.1f;
    /* p -= 0.1 g: each step moves by (-0.01, +0.02, -0.03). */
    const double want[3][N] = {
        {0.99, -1.98, 0.47},
        {0.98, -1.96, 0.44},
        {0.97, -1.94, 0.41},
    };
    run("sgd", &c, 3, want, 1e-6);
}

static void test_momentum(void)
{
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    c.lr = 0.1f;
    /* For g = 0.1: v1 = -0.01, p1 = 0.99; v2 = 0.9(-0.01) - 0.01 = -0.019,
     * p2 = 0.971; v3 = 0.9(-0.019) - 0.01 = -0.0271, p3 = 0.9439.  The other
     * components move by the same multiples of their gradient (x -2, x 3). */
    const double want[3][N] = {
        {0.99, -1.98, 0.47},
        {0.971, -1.942, 0.413},
        {0.9439, -1.8878, 0.3317},
    };
    run("momentum", &c, 3, want, 1e-6);
}

static void test_nesterov(void)
{
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_NESTEROV);
    c.lr = 0.1f;
    /* p += mu v_new - lr g.  For g = 0.1: v1 = -0.01, p1 = 1 - 0.009 - 0.01 = 0.981;
     * v2 = -0.019, p2 = 0.981 - 0.0171 - 0.01 = 0.9539; v3 = -0.0271,
     * p3 = 0.9539 - 0.02439 - 0.01 = 0.91951. */
    const double want[3][N] = {
        {0.981, -1.962, 0.443},
        {0.9539, -1.9078, 0.3617},
        {0.91951, -1.83902, 0.25853},
    };
    run("nesterov", &c, 3, want, 1e-6);
}

static void test_adagrad(void)
{
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    c.lr = 0.1f;
    /* a starts at 0.1; a += g^2; p -= 0.1 g / (sqrt(a) + 1e-7).  Written out: */
    double want[3][N];
    for (int i = 0; i < N; i++) {
        double g = g0[i], gg = g * g;
        double a1 = 0.1 + gg, a2 = 0.1 + 2 * gg, a3 = 0.1 + 3 * gg;
        want[0][i] = p0[i] - 0.1 * g / (sqrt(a1) + 1e-7);
        want[1][i] = want[0][i] - 0.1 * g / (sqrt(a2) + 1e-7);
        want[2][i] = want[1][i] - 0.1 * g / (sqrt(a3) + 1e-7);
    }
    /* and by calculator, for component 0: a1 = 0.11, 0.01 / 0.331662 = 0.0301511 */
    CHECK_NEAR(want[0][0], 0.969848874633, 1e-7); /* g0 is float */
    CHECK_NEAR(want[2][2], 0.325160947308, 1e-7);
    run("adagrad", &c, 3, want, 1e-6);
}

static void test_adam(void)
{
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    c.lr = 0.1f;
    /* With a constant gradient m_t = (1-0.9^t) g and v_t = (1-0.999^t) g^2, so
     * lr_t m / (sqrt(v) + eps) = 0.1 g / (|g| + eps / sqrt(1-0.999^t)): each step
     * moves by almost exactly 0.1 against the sign of g, a little less because
     * of epsilon-hat (Keras 2).  Step 1, g = 0.1: lr_t = 0.1 sqrt(0.001)/0.1,
     * m = 0.01, v = 1e-5: update 0.0316228 * 0.01 / (0.00316228 + 1e-7)
     * = 0.0999968, p1 = 0.900003162. */
    const double want[3][N] = {
        {0.900003162178, -1.900001581114, 0.400001054081},
        {0.800005398755, -1.800002699415, 0.300001799618},
        {0.700007225377, -1.700003612734, 0.200002408500},
    };
    /* tol well below the epsilon-hat effect (3e-6 at step 1), so the paper's
     * form (eps added to sqrt(v_hat)) would fail. */
    run("adam", &c, 3, want, 5e-7);
}

static void test_adam_varying(void)
{
    /* Large eps and changing gradients so every term matters. lr 0.01, b1 0.8,
     * b2 0.99, eps 0.01, p0 (0.3, -0.7, 1.5), g1 (0.05, -0.5, 2), g2 (-0.1, 0.2, 1).
     * Step 1: lr_t = 0.01 sqrt(0.01) / 0.2 = 0.005; m = 0.2 g1 = (0.01, -0.1, 0.4),
     * v = 0.01 g1^2 = (2.5e-5, 2.5e-3, 0.04), sqrt(v) = (0.005, 0.05, 0.2):
     * p1 = 0.3 - 0.005*0.01/0.015 = 0.29666667, -0.7 + 0.005*0.1/0.06 = -0.69166667,
     * 1.5 - 0.005*0.4/0.21 = 1.49047619.
     * Step 2: lr_t = 0.01 sqrt(1-0.99^2)/(1-0.8^2) = 0.0039185378;
     * m = (-0.012, -0.04, 0.52), v = (1.2475e-4, 2.875e-3, 0.0496). */
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    c.lr = 0.01f;
    c.beta1 = 0.8f;
    c.beta2 = 0.99f;
    c.eps = 0.01f;
    const float g[2][N] = {{0.05f, -0.5f, 2.0f}, {-0.1f, 0.2f, 1.0f}};
    const double want[2][N] = {
        {0.296666666667, -0.691666666667, 1.490476190476},
        {0.298887938871, -0.689202914554, 1.481720079389},
    };
    float p[N] = {0.3f, -0.7f, 1.5f};
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &c, N, &err) == 0);
    for (int s = 0; s < 2; s++) {
        dp_optim_apply(&o, p, g[s], o.cfg.lr);
        for (int i = 0; i < N; i++)
            CHECKF(fabs(p[i] - want[s][i]) <= 1e-6, "adam step %d p[%d] = %.9g, want %.9g",
                   s + 1, i, (double)p[i], want[s][i]);
    }
    /* state layout: slot 0 (m) at state, slot 1 (v) at state + n */
    CHECK_NEAR(o.state[0], -0.012, 1e-7);
    CHECK_NEAR(o.state[2], 0.52, 1e-6);
    CHECK_NEAR(o.state[N + 1], 2.875e-3, 1e-8);
    dp_optim_free(&o);
}

static void test_defaults_and_parse(void)
{
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    CHECK(c.kind == DP_OPTIM_ADAM);
    CHECK(c.lr == 0.001f && c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-7f);
    c = dp_optim_defaults(DP_OPTIM_SGD);
    CHECK(c.lr == 0.01f && c.momentum == 0.0f);
    c = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    CHECK(c.lr == 0.01f && c.momentum == 0.9f);
    c = dp_optim_defaults(DP_OPTIM_NESTEROV);
    CHECK(c.lr == 0.01f && c.momentum == 0.9f);
    c = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    CHECK(c.lr == 0.001f && c.initial_accumulator == 0.1f && c.eps == 1e-7f);

    CHECK(dp_optim_slots(DP_OPTIM_SGD) == 0);
    CHECK(dp_optim_slots(DP_OPTIM_MOMENTUM) == 1);
    CHECK(dp_optim_slots(DP_OPTIM_NESTEROV) == 1);
    CHECK(dp_optim_slots(DP_OPTIM_ADAGRAD) == 1);
    CHECK(dp_optim_slots(DP_OPTIM_ADAM) == 2);
    CHECK(dp_optim_slots(DP_OPTIM_ADAMW) == 2);
    c = dp_optim_defaults(DP_OPTIM_ADAMW); /* PyTorch's AdamW default decay */
    CHECK(c.lr == 0.001f && c.weight_decay == 0.01f && c.beta1 == 0.9f);
    for (int k = 0; k < DP_OPTIM_ADAMW; k++)
        CHECK(dp_optim_defaults((dp_optim_kind)k).weight_decay == 0.0f);

    const char *names[] = {"sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"};
    for (int k = 0; k < DP_OPTIM_COUNT; k++) {
        dp_optim_kind kind = DP_OPTIM_COUNT;
        dp_err err;
        CHECK(dp_optim_parse_kind(names[k], &kind, &err) == 0);
        CHECK((int)kind == k);
        CHECK(strcmp(dp_optim_kind_name(kind), names[k]) == 0);
    }
    dp_err err = {{0}};
    dp_optim_kind kind = DP_OPTIM_SGD;
    CHECK(dp_optim_parse_kind("rmsprop", &kind, &err) == -1);
    CHECK(strstr(err.msg, "rmsprop") != NULL && strstr(err.msg, "adamw") != NULL);
    CHECK(strstr(err.msg, "sgd") && strstr(err.msg, "nesterov") && strstr(err.msg, "adam"));
    CHECK(kind == DP_OPTIM_SGD);
    CHECK(dp_optim_parse_kind("", &kind, &err) == -1);
    CHECK(dp_optim_parse_kind("Adam", &kind, &err) == -1);
}

static void test_init_errors(void)
{
    dp_optim o;
    dp_err err = {{0}};
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    c.beta1 = 1.0f;
    CHECK(dp_optim_init(&o, &c, 10, &err) == -1);
    CHECK(strstr(err.msg, "beta1") != NULL);
    c = dp_optim_defaults(DP_OPTIM_SGD);
    c.lr = NAN;
    CHECK(dp_optim_init(&o, &c, 10, &err) == -1);
    CHECK(strstr(err.msg, "learning rate") != NULL);
    c = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    c.weight_decay = -0.1f;
    CHECK(dp_optim_init(&o, &c, 10, &err) == -1);
    CHECK(strstr(err.msg, "weight decay") != NULL);
    c.weight_decay = INFINITY;
    CHECK(dp_optim_init(&o, &c, 10, &err) == -1);
    c = dp_optim_defaults(DP_OPTIM_ADAMW);
    c.lr = 0.5f, c.weight_decay = 2.0f; /* p *= 1 - 1 each step */
    CHECK(dp_optim_init(&o, &c, 10, &err) == -1);
    CHECK(strstr(err.msg, "adamw") != NULL && strstr(err.msg, "below 1") != NULL);

    /* adagrad state starts at the initial accumulator; sgd keeps no state */
    c = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    REQUIRE(dp_optim_init(&o, &c, 5, &err) == 0);
    for (int i = 0; i < 5; i++)
        CHECK(o.state[i] == 0.1f);
    dp_optim_free(&o);
    dp_optim_free(&o); /* twice is harmless */
    c = dp_optim_defaults(DP_OPTIM_SGD);
    REQUIRE(dp_optim_init(&o, &c, 5, &err) == 0);
    CHECK(o.state == NULL);
    dp_optim_free(&o);
    /* an empty range is fine */
    c = dp_optim_defaults(DP_OPTIM_ADAM);
    REQUIRE(dp_optim_init(&o, &c, 0, &err) == 0);
    dp_optim_apply(&o, NULL, NULL, o.cfg.lr);
    dp_optim_free(&o);
}

static void test_denormals_flushed(void)
{
    /* A zero gradient after one step makes Adam's m decay by 0.9 per step:
     * 1e-4 * 0.9^800 = 2.5e-41 would be a denormal; flushed, it is exactly 0. */
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &c, 1, &err) == 0);
    float p = 0.0f, g = 1e-3f, zero = 0.0f;
    dp_optim_apply(&o, &p, &g, o.cfg.lr);
    for (int s = 0; s < 800; s++)
        dp_optim_apply(&o, &p, &zero, o.cfg.lr);
#if defined(__SSE__)
    CHECK(o.state[0] == 0.0f);
#endif
    CHECK(isfinite(p));
    dp_optim_free(&o);
}

/* The fast Adam (hardware estimates + Newton steps) against IEEE sqrt and
 * division, over a vector long enough for every vector path and its tail,
 * with zero, tiny and large gradients. */
static void test_adam_fast_matches_exact(void)
{
    enum { LEN = 1003, STEPS = 6 };
    static float pa[LEN], pb[LEN], g[LEN];
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    dp_optim a, b;
    dp_err err;
    REQUIRE(dp_optim_init(&a, &c, LEN, &err) == 0 && dp_optim_init(&b, &c, LEN, &err) == 0);
    a.exact = 1;
    b.exact = 0;
    for (int i = 0; i < LEN; i++)
        pa[i] = pb[i] = (float)((i * 37) % 200 - 100) * 0.01f;
    double worst = 0;
    int moved = 0, zeros_kept;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < LEN; i++) {
            int k = (i * 7 + s * 13) % 10;
            g[i] = k == 0 ? 0.0f : (k == 1 ? 1e-12f : (float)((i % 19) - 9) * (k == 2 ? 30.0f : 0.01f));
        }
        g[5] = 0.0f; /* in the vector body: never a gradient */
        dp_optim_apply(&a, pa, g, a.cfg.lr);
        dp_optim_apply(&b, pb, g, b.cfg.lr);
        for (int i = 0; i < LEN; i++) {
            double tol = 1e-6 * (fabs(pa[i]) + c.lr);
            double d = fabs((double)pa[i] - (double)pb[i]);
            worst = d / tol > worst ? d / tol : worst;
            moved += pa[i] != pb[i];
        }
    }
    /* An element with no gradient ever (v = 0: the rsqrt guard) has not moved. */
    zeros_kept = pb[5] == (float)((5 * 37) % 200 - 100) * 0.01f && pa[5] == pb[5];
    CHECKF(worst <= 1.0, "fast Adam is %.2f tolerances from the IEEE one", worst);
    CHECK(zeros_kept);
    fprintf(stderr, "fast vs exact Adam: worst %.3f of the tolerance, %d of %d values differ\n",
            worst, moved, LEN * STEPS);
    dp_optim_free(&a);
    dp_optim_free(&b);
}

/* Element i's gradient at step s: zero, denormal, tiny, ordinary and huge
 * magnitudes of both signs. */
static float spread_grad(int i, int s)
{
    static const float mag[12] = {0.0f, 1e-40f, 1e-30f, 1e-12f, 1e-7f, 1e-4f,
                                  0.01f, 0.3f,   1.0f,   30.0f, 1e6f,  1e15f};
    return mag[(i * 7 + s * 13) % 12] * (float)((i % 19) - 9);
}

/* Every instruction-set path of the fast Adam the CPU runs (scalar, AVX2,
 * AVX-512) gives the same bits for the same element, over lengths that
 * exercise every vector body and tail, with gradients spanning zero, denormal,
 * tiny, ordinary and huge magnitudes; and each is within the fast/exact
 * tolerance of the IEEE twin. */
static void test_adam_paths_agree(const dp_optim_config *cfg)
{
    enum { LEN = 1031, STEPS = 5 };
    static float p[DP_ISA_COUNT][LEN], st[DP_ISA_COUNT][2 * LEN], g[LEN], pe[LEN];
    dp_optim_config c = *cfg;
    int ran[DP_ISA_COUNT] = {0}, paths = 0;
    dp_isa top = dp_isa_max();
    for (int l = 0; l <= (int)top; l++) {
        dp_isa used = dp_optim_force_isa((dp_isa)l);
        if (used != (dp_isa)l)
            continue; /* the CPU lacks it (sse4.2 adds nothing to Adam) */
        dp_optim o;
        dp_err err;
        REQUIRE(dp_optim_init(&o, &c, LEN, &err) == 0);
        for (int i = 0; i < LEN; i++)
            p[l][i] = (float)((i * 37) % 200 - 100) * 0.01f;
        for (int s = 0; s < STEPS; s++) {
            for (int i = 0; i < LEN; i++)
                g[i] = spread_grad(i, s);
            /* in pieces of odd lengths, so bodies and tails fall everywhere */
            dp_optim_step step = dp_optim_begin(&o, o.cfg.lr);
            for (size_t lo = 0, w = 1; lo < LEN; lo += w, w = w * 3 % 41 + 1)
                dp_optim_apply_range(&o, &step, p[l], g, lo, lo + w);
        }
        memcpy(st[l], o.state, sizeof st[l]);
        dp_optim_free(&o);
        ran[l] = 1;
        paths++;
        for (int q = 0; q < l; q++)
            CHECKF(!ran[q] || (memcmp(p[q], p[l], sizeof p[l]) == 0 &&
                               memcmp(st[q], st[l], sizeof st[l]) == 0),
                   "fast %s (wd %g): the %s path differs from the %s path",
                   dp_optim_kind_name(c.kind), (double)c.weight_decay, dp_isa_name((dp_isa)l),
                   dp_isa_name((dp_isa)q));
    }
    /* the exact twin on the same gradients */
    dp_optim e;
    dp_err err;
    REQUIRE(dp_optim_init(&e, &c, LEN, &err) == 0);
    e.exact = 1;
    for (int i = 0; i < LEN; i++)
        pe[i] = (float)((i * 37) % 200 - 100) * 0.01f;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < LEN; i++)
            g[i] = spread_grad(i, s);
        dp_optim_apply(&e, pe, g, e.cfg.lr);
    }
    double worst = 0;
    for (int i = 0; i < LEN; i++) {
        double tol = 1e-6 * (fabs(pe[i]) + c.lr), d = fabs((double)pe[i] - (double)p[0][i]);
        worst = d / tol > worst ? d / tol : worst;
    }
    CHECKF(worst <= 1.0, "fast Adam is %.2f tolerances from the IEEE one", worst);
    fprintf(stderr, "fast %s (wd %g): %d instruction-set path(s) up to %s agree bit for bit; "
                    "%.3f of the tolerance from the exact twin\n",
            dp_optim_kind_name(c.kind), (double)c.weight_decay, paths, dp_isa_name(top), worst);
    CHECK(paths >= 1 && ran[0]);
    dp_optim_force_isa(top);
    dp_optim_free(&e);
}

/* Weight decay against a naive double-precision reference of PyTorch's
 * definitions over several steps with a changing learning rate: L2 (g += wd
 * p, torch.optim.SGD/Adagrad/Adam's weight_decay) on the Keras update of
 * every kind, and adamw's decoupled p *= 1 - lr wd before adam's update
 * (torch.optim.AdamW).  Both the IEEE twin and the fast Adam. */
static void test_weight_decay_reference(void)
{
    enum { STEPS = 7 };
    for (int pass = 0; pass < DP_OPTIM_COUNT + 2; pass++) {
        dp_optim_kind kind = pass < DP_OPTIM_COUNT ? (dp_optim_kind)pass
                             : pass == DP_OPTIM_COUNT ? DP_OPTIM_ADAM : DP_OPTIM_ADAMW;
        int fast = pass >= DP_OPTIM_COUNT;
        dp_optim_config c = dp_optim_defaults(kind);
        c.weight_decay = kind == DP_OPTIM_ADAMW ? 0.1f : 0.05f;
        c.lr = 0.05f;
        dp_optim o;
        dp_err err;
        REQUIRE(dp_optim_init(&o, &c, N, &err) == 0);
        o.exact = !fast;
        float p[N];
        double q[N], s0[N] = {0}, s1[N] = {0};
        for (int i = 0; i < N; i++) {
            p[i] = p0[i], q[i] = p0[i];
            s0[i] = kind == DP_OPTIM_ADAGRAD ? c.initial_accumulator : 0;
        }
        double worst = 0;
        for (int t = 1; t <= STEPS; t++) {
            float lr = c.lr * (1.0f - 0.1f * (float)t); /* a schedule's rate */
            float g[N];
            for (int i = 0; i < N; i++)
                g[i] = g0[i] * (float)(t % 3 - 1) + 0.01f * (float)i;
            dp_optim_apply(&o, p, g, lr);
            double wd = c.weight_decay, mu = c.momentum, b1 = c.beta1, b2 = c.beta2;
            for (int i = 0; i < N; i++) {
                double gi = g[i] + (kind == DP_OPTIM_ADAMW ? 0 : wd * q[i]);
                switch (kind) {
                case DP_OPTIM_SGD: q[i] -= lr * gi; break;
                case DP_OPTIM_MOMENTUM:
                    s0[i] = mu * s0[i] - lr * gi;
                    q[i] += s0[i];
                    break;
                case DP_OPTIM_NESTEROV:
                    s0[i] = mu * s0[i] - lr * gi;
                    q[i] += mu * s0[i] - lr * gi;
                    break;
                case DP_OPTIM_ADAGRAD:
                    s0[i] += gi * gi;
                    q[i] -= lr * gi / (sqrt(s0[i]) + c.eps);
                    break;
                default: { /* adam, adamw */
                    if (kind == DP_OPTIM_ADAMW)
                        q[i] *= 1.0 - lr * wd;
                    s0[i] = b1 * s0[i] + (1 - b1) * gi;
                    s1[i] = b2 * s1[i] + (1 - b2) * gi * gi;
                    double lr_t = lr * sqrt(1 - pow(b2, t)) / (1 - pow(b1, t));
                    q[i] -= lr_t * s0[i] / (sqrt(s1[i]) + c.eps);
                    break;
                }
                }
                double d = fabs(p[i] - q[i]);
                worst = d > worst ? d : worst;
            }
        }
        CHECKF(worst <= 2e-6, "%s%s with weight decay %g: %g from the reference after %d steps",
               dp_optim_kind_name(kind), fast ? " (fast)" : "", (double)c.weight_decay, worst,
               STEPS);
        dp_optim_free(&o);
    }
    /* the decay itself: a zero gradient leaves only it */
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAMW);
    c.weight_decay = 0.5f, c.lr = 0.1f;
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &c, 1, &err) == 0);
    float p = 2.0f, zero = 0.0f;
    dp_optim_apply(&o, &p, &zero, c.lr);
    CHECK(p == 2.0f * (1.0f - 0.1f * 0.5f));
    dp_optim_free(&o);
    c = dp_optim_defaults(DP_OPTIM_SGD);
    c.weight_decay = 0.5f, c.lr = 0.1f;
    REQUIRE(dp_optim_init(&o, &c, 1, &err) == 0);
    p = 2.0f;
    dp_optim_apply(&o, &p, &zero, c.lr);
    CHECK(p == 2.0f - 0.1f * (0.5f * 2.0f));
    dp_optim_free(&o);
}

int main(void)
{
    test_sgd();
    test_momentum();
    test_nesterov();
    test_adagrad();
    test_adam();
    test_adam_varying();
    test_defaults_and_parse();
    test_init_errors();
    test_denormals_flushed();
    test_adam_fast_matches_exact();
    dp_optim_config c = dp_optim_defaults(DP_OPTIM_ADAM);
    test_adam_paths_agree(&c);
    c.weight_decay = 0.03f; /* L2 */
    test_adam_paths_agree(&c);
    c = dp_optim_defaults(DP_OPTIM_ADAMW);
    c.weight_decay = 0.2f;
    test_adam_paths_agree(&c);
    test_weight_decay_reference();
    return CHECK_DONE();
}
