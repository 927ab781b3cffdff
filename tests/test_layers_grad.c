/* Layer kernels against double-precision references: forward values, and
 * analytic gradients against central finite differences of a double forward. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/layers.h"
#include "downpour/rng.h"

#define MAXN 64
#define H 1e-4
#define RTOL 1e-3
#define ATOL 1e-5

static float urand(dp_rng *r, float lo, float hi) { return lo + (hi - lo) * dp_rng_uniform(r); }

/* |analytic - numeric| small relative to the numeric value (with a floor). */
static void check_grad(const char *what, int i, double analytic, double numeric)
{
    CHECKF(fabs(analytic - numeric) <= ATOL + RTOL * fabs(numeric),
           "%s[%d]: analytic %.9g, finite differences %.9g", what, i, analytic, numeric);
}

/* ---- dense ---------------------------------------------------------------- */

/* L = sum_{r,o} c[r,o] * (inp W^T + b)[r,o], in double. */
static double dense_loss(const double *inp, const double *w, const double *b, const double *c,
                         int batch, int in, int out)
{
    double loss = 0.0;
    for (int r = 0; r < batch; r++)
        for (int o = 0; o < out; o++) {
            double z = b[o];
            for (int i = 0; i < in; i++)
                z += inp[r * in + i] * w[o * in + i];
            loss += c[r * out + o] * z;
        }
    return loss;
}

/* Central difference of dense_loss with respect to x[k] (x is one of the inputs). */
static double dense_fd(double *x, int k, const double *inp, const double *w, const double *b,
                       const double *c, int batch, int in, int out)
{
    double save = x[k];
    x[k] = save + H;
    double lp = dense_loss(inp, w, b, c, batch, in, out);
    x[k] = save - H;
    double lm = dense_loss(inp, w, b, c, batch, in, out);
    x[k] = save;
    return (lp - lm) / (2 * H);
}

static void test_dense(uint64_t seed)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    int batch = 1 + (int)dp_rng_below(&r, 4), in = 1 + (int)dp_rng_below(&r, 6),
        out = 1 + (int)dp_rng_below(&r, 5);
    float inp[MAXN], w[MAXN], b[MAXN], dout[MAXN], y[MAXN], y2[MAXN];
    double inp_d[MAXN], w_d[MAXN], b_d[MAXN], c_d[MAXN];
    for (int k = 0; k < batch * in; k++)
        inp_d[k] = inp[k] = urand(&r, -1, 1);
    for (int k = 0; k < out * in; k++)
        w_d[k] = w[k] = urand(&r, -1, 1);
    for (int k = 0; k < out; k++)
        b_d[k] = b[k] = urand(&r, -1, 1);
    for (int k = 0; k < batch * out; k++)
        c_d[k] = dout[k] = urand(&r, -1, 1);

    /* forward against the double reference, and the fused relu variant */
    dp_dense_forward(y, inp, w, b, batch, in, out);
    dp_dense_relu_forward(y2, inp, w, b, batch, in, out);
    for (int rr = 0; rr < batch; rr++)
        for (int o = 0; o < out; o++) {
            double z = b_d[o];
            for (int i = 0; i < in; i++)
                z += inp_d[rr * in + i] * w_d[o * in + i];
            CHECK_NEAR(y[rr * out + o], z, 1e-5);
            CHECK_NEAR(y2[rr * out + o], z > 0 ? z : 0.0, 1e-5);
        }

    /* backward: the gradients of L = sum(c * out) are dinp, dw, db for dout = c */
    float dinp[MAXN], dw[MAXN], db[MAXN];
    memset(dw, 0, sizeof dw);
    memset(db, 0, sizeof db);
    for (int k = 0; k < MAXN; k++)
        dinp[k] = NAN; /* must be overwritten */
    dp_dense_backward(dinp, dw, db, dout, inp, w, batch, in, out);
    for (int k = 0; k < batch * in; k++)
        check_grad("dense dinp", k, dinp[k],
                   dense_fd(inp_d, k, inp_d, w_d, b_d, c_d, batch, in, out));
    for (int k = 0; k < out * in; k++)
        check_grad("dense dw", k, dw[k], dense_fd(w_d, k, inp_d, w_d, b_d, c_d, batch, in, out));
    for (int k = 0; k < out; k++)
        check_grad("dense db", k, db[k], dense_fd(b_d, k, inp_d, w_d, b_d, c_d, batch, in, out));

    /* a second call accumulates into dw and db (and overwrites dinp); dinp NULL is allowed */
    float dw1[MAXN], db1[MAXN], dinp1[MAXN];
    memcpy(dw1, dw, sizeof dw);
    memcpy(db1, db, sizeof db);
    memcpy(dinp1, dinp, sizeof dinp);
    dp_dense_backward(dinp, dw, db, dout, inp, w, batch, in, out);
    for (int k = 0; k < out * in; k++)
        CHECK_NEAR(dw[k], 2 * dw1[k], 1e-6);
    for (int k = 0; k < out; k++)
        CHECK_NEAR(db[k], 2 * db1[k], 1e-6);
    for (int k = 0; k < batch * in; k++)
        CHECK(dinp[k] == dinp1[k]);
    dp_dense_backward(NULL, dw, db, dout, inp, w, batch, in, out);
    for (int k = 0; k < out * in; k++)
        CHECK_NEAR(dw[k], 3 * dw1[k], 1e-6);

    /* the overwrite variant ignores what dw and db held */
    for (int k = 0; k < MAXN; k++)
        dw[k] = db[k] = 1e6f;
    dp_dense_backward_overwrite(NULL, dw, db, dout, inp, w, batch, in, out);
    for (int k = 0; k < out * in; k++)
        CHECK_NEAR(dw[k], dw1[k], 1e-6);
    for (int k = 0; k < out; k++)
        CHECK_NEAR(db[k], db1[k], 1e-6);
}

/* ---- relu ----------------------------------------------------------------- */

static double relu_loss(const double *x, const double *c, int n)
{
    double loss = 0.0;
    for (int i = 0; i < n; i++)
        loss += c[i] * (x[i] > 0 ? x[i] : 0.0);
    return loss;
}

static void test_relu(uint64_t seed)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    int n = 1 + (int)dp_rng_below(&r, 40);
    float x[MAXN], y[MAXN], dy[MAXN], dx[MAXN];
    double x_d[MAXN], c_d[MAXN];
    for (int i = 0; i < n; i++) {
        float v = urand(&r, -1, 1);
        if (fabsf(v) < 0.05f) /* keep finite differences away from the kink */
            v = v < 0 ? -0.5f : 0.5f;
        x_d[i] = x[i] = v;
        c_d[i] = dy[i] = urand(&r, -1, 1);
    }
    dp_relu_forward(y, x, n);
    for (int i = 0; i < n; i++)
        CHECK(y[i] == (x_d[i] > 0 ? (float)x_d[i] : 0.0f));
    dp_relu_backward(dx, dy, y, n);
    for (int i = 0; i < n; i++) {
        double save = x_d[i];
        x_d[i] = save + H;
        double lp = relu_loss(x_d, c_d, n);
        x_d[i] = save - H;
        double lm = relu_loss(x_d, c_d, n);
        x_d[i] = save;
        check_grad("relu dx", i, dx[i], (lp - lm) / (2 * H));
    }
    /* in place gives the same (the inputs are left alone out of place) */
    for (int i = 0; i < n; i++)
        CHECK(x[i] == (float)x_d[i] && dy[i] == (float)c_d[i]);
    dp_relu_forward(x, x, n);
    dp_relu_backward(dy, dy, x, n);
    CHECK(memcmp(x, y, (size_t)n * sizeof *x) == 0);
    CHECK(memcmp(dy, dx, (size_t)n * sizeof *dx) == 0);
}

/* ---- softmax + cross-entropy --------------------------------------------- */

/* Mean cross-entropy of softmax(z) in double, the plain textbook way. */
static double xent_loss(const double *z, const uint8_t *y, int batch, int classes)
{
    double loss = 0.0;
    for (int r = 0; r < batch; r++) {
        double sum = 0.0;
        for (int j = 0; j < classes; j++)
            sum += exp(z[r * classes + j]);
        loss += -log(exp(z[r * classes + y[r]]) / sum);
    }
    return loss / batch;
}

static void test_softmax_xent(uint64_t seed)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    int batch = 1 + (int)dp_rng_below(&r, 4), classes = 2 + (int)dp_rng_below(&r, 6);
    float z[MAXN], p[MAXN], dz[MAXN];
    double z_d[MAXN];
    uint8_t y[8];
    for (int k = 0; k < batch * classes; k++)
        z_d[k] = z[k] = urand(&r, -3, 3);
    for (int rr = 0; rr < batch; rr++)
        y[rr] = (uint8_t)dp_rng_below(&r, (uint32_t)classes);
    int correct = 0, want_correct = 0;
    float loss = dp_softmax_xent_forward(p, z, y, batch, classes, &correct);
    CHECK_NEAR(loss, xent_loss(z_d, y, batch, classes), 1e-5);
    for (int rr = 0; rr < batch; rr++) {
        int arg = 0;
        double sum = 0;
        for (int j = 0; j < classes; j++) {
            if (z[rr * classes + j] > z[rr * classes + arg])
                arg = j;
            sum += p[rr * classes + j];
        }
        want_correct += arg == y[rr];
        CHECK_NEAR(sum, 1.0, 1e-6);
    }
    CHECK(correct == want_correct);

    dp_softmax_xent_backward(dz, p, y, batch, classes);
    for (int k = 0; k < batch * classes; k++) {
        double save = z_d[k];
        z_d[k] = save + H;
        double lp = xent_loss(z_d, y, batch, classes);
        z_d[k] = save - H;
        double lm = xent_loss(z_d, y, batch, classes);
        z_d[k] = save;
        check_grad("softmax dlogits", k, dz[k], (lp - lm) / (2 * H));
    }
}

static void test_softmax_by_hand(void)
{
    /* logits (1, 2, 3): e = 2.718281828, 7.389056099, 20.08553692, sum 30.19287485;
     * p = 0.0900305732, 0.244728471, 0.665240956; label 2: loss = -ln p2 = 0.407605964.
     * Row 2, logits (1000, 1001), label 0: p = 1/(1+e) = 0.268941421, e/(1+e) =
     * 0.731058579, loss = ln(1+e) = 1.31326169 (exp(1000) overflows if computed naively). */
    const float z1[3] = {1, 2, 3};
    const uint8_t y1[1] = {2};
    float p1[3];
    int correct = 5;
    float loss = dp_softmax_xent_forward(p1, z1, y1, 1, 3, &correct);
    CHECK_NEAR(p1[0], 0.0900305732, 1e-7);
    CHECK_NEAR(p1[1], 0.244728471, 1e-7);
    CHECK_NEAR(p1[2], 0.665240956, 1e-7);
    CHECK_NEAR(loss, 0.407605964, 1e-6);
    CHECK(correct == 6); /* adds to the count */

    const float z2[4] = {1000, 1001, -1000, -1001};
    const uint8_t y2[2] = {0, 0};
    float p2[4];
    correct = 0;
    loss = dp_softmax_xent_forward(p2, z2, y2, 2, 2, &correct);
    CHECK(isfinite(loss));
    CHECK_NEAR(p2[0], 0.268941421, 1e-7);
    CHECK_NEAR(p2[1], 0.731058579, 1e-7);
    CHECK_NEAR(p2[2], 0.731058579, 1e-7);
    CHECK_NEAR(p2[3], 0.268941421, 1e-7);
    /* row 1 loss ln(1+e) = 1.31326169, row 2 loss ln(1+1/e) = 0.313261687 */
    CHECK_NEAR(loss, (1.31326169 + 0.313261687) / 2, 1e-6);
    CHECK(correct == 1);

    /* a hopeless prediction: the loss is large but finite */
    const float z3[2] = {0, 200};
    const uint8_t y3[1] = {0};
    loss = dp_softmax_xent_forward(p2, z3, y3, 1, 2, NULL);
    CHECK_NEAR(loss, 200.0, 1e-3);

    /* gradient by hand: (p - onehot) / batch */
    float dz[4];
    dp_softmax_xent_backward(dz, p2, y2, 1, 2);
    CHECK_NEAR(dz[0], p2[0] - 1.0, 1e-7);
    CHECK_NEAR(dz[1], p2[1], 1e-7);

    /* in place (probs over logits) gives the same numbers; labels NULL predicts only */
    float zz[3] = {1, 2, 3};
    dp_softmax_xent_forward(zz, zz, y1, 1, 3, NULL);
    for (int j = 0; j < 3; j++)
        CHECK(zz[j] == p1[j]);
    correct = 0;
    CHECK(dp_softmax_xent_forward(p1, z1, NULL, 1, 3, &correct) == 0.0f);
    CHECK(correct == 0);
}

int main(void)
{
    for (uint64_t seed = 1; seed <= 20; seed++) {
        test_dense(seed);
        test_relu(seed);
        test_softmax_xent(seed);
    }
    test_softmax_by_hand();
    return CHECK_DONE();
}
