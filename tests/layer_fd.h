/* One layer's CPU results against a naive double-precision forward, for
 * the layer tests: the forward's worst relative error, and the backward's
 * (input and parameter gradients) against central differences (step 1e-5)
 * of the objective sum(dout * y) over the batch.  Errors are relative to
 * max(1, |reference|). */
#ifndef DOWNPOUR_TEST_LAYER_FD_H
#define DOWNPOUR_TEST_LAYER_FD_H

#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "downpour/model.h"

/* y (d->out) of one record from x (d->in), the weight region w and the
 * bias region b, in double. */
typedef void (*layer_naive_fn)(const dp_layer *d, double *y, const double *x, const double *w,
                               const double *b);

typedef struct layer_fd {
    const dp_layer *d;
    layer_naive_fn naive;
    int batch;
    const float *x, *dout, *wb; /* the layer's input, output gradient, weights then bias */
    double *xd, *wbd;           /* their double copies (layer_fd_open) */
} layer_fd;

static double layer_fd_rel(double a, double b) { return fabs(a - b) / fmax(1.0, fabs(b)); }

static void layer_fd_open(layer_fd *f)
{
    size_t nin = (size_t)f->batch * f->d->in, np = f->d->w_len + f->d->b_len;
    f->xd = malloc((nin + 1) * sizeof *f->xd);
    f->wbd = malloc((np + 1) * sizeof *f->wbd);
    REQUIRE(f->xd && f->wbd);
    for (size_t i = 0; i < nin; i++)
        f->xd[i] = f->x[i];
    for (size_t i = 0; i < np; i++)
        f->wbd[i] = f->wb[i];
}

static void layer_fd_close(layer_fd *f) { free(f->xd), free(f->wbd); }

static double layer_fd_objective(const layer_fd *f)
{
    const dp_layer *d = f->d;
    double *y = malloc((size_t)d->out * sizeof *y), s = 0;
    REQUIRE(y);
    for (int r = 0; r < f->batch; r++) {
        f->naive(d, y, f->xd + (size_t)r * d->in, f->wbd, f->wbd + d->w_len);
        for (int i = 0; i < d->out; i++)
            s += (double)f->dout[(size_t)r * d->out + i] * y[i];
    }
    free(y);
    return s;
}

/* The forward's output y (batch, d->out) against the naive one. */
static double layer_fd_forward_worst(const layer_fd *f, const float *y)
{
    const dp_layer *d = f->d;
    double *yd = malloc((size_t)d->out * sizeof *yd), worst = 0;
    REQUIRE(yd);
    for (int r = 0; r < f->batch; r++) {
        f->naive(d, yd, f->xd + (size_t)r * d->in, f->wbd, f->wbd + d->w_len);
        for (int i = 0; i < d->out; i++)
            worst = fmax(worst, layer_fd_rel(y[(size_t)r * d->out + i], yd[i]));
    }
    free(yd);
    return worst;
}

/* The central difference of the objective in *v. */
static double layer_fd_diff(const layer_fd *f, double *v)
{
    const double h = 1e-5;
    double at = *v;
    *v = at + h;
    double up = layer_fd_objective(f);
    *v = at - h;
    double dn = layer_fd_objective(f);
    *v = at;
    return (up - dn) / (2 * h);
}

/* din (batch, d->in) and the gradients gwb (weights then bias) against
 * central differences, every x_step-th input and p_step-th parameter. */
static double layer_fd_grad_worst(const layer_fd *f, const float *din, const float *gwb,
                                  size_t x_step, size_t p_step)
{
    size_t nin = (size_t)f->batch * f->d->in, np = f->d->w_len + f->d->b_len;
    double worst = 0;
    for (size_t i = 0; i < nin; i += x_step)
        worst = fmax(worst, layer_fd_rel(din[i], layer_fd_diff(f, &f->xd[i])));
    for (size_t k = 0; k < np; k += p_step)
        worst = fmax(worst, layer_fd_rel(gwb[k], layer_fd_diff(f, &f->wbd[k])));
    return worst;
}

#endif
