/* A whole model's gradient against finite differences, for the layer
 * tests: the backward's gradient of the mean loss on (x, y), against
 * central differences (step 1e-2) at about 60 parameters spread over the
 * flat buffer.  Returns the worst error relative to max(0.05, |fd|). */
#ifndef DOWNPOUR_TEST_MODEL_FD_H
#define DOWNPOUR_TEST_MODEL_FD_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/model.h"

static double model_fd_worst(dp_model *m, const float *x, const uint8_t *y, int batch)
{
    float *g = malloc(m->n_params * sizeof *g);
    REQUIRE(g);
    dp_model_forward_backward(m, x, y, batch, NULL);
    memcpy(g, m->grads, m->n_params * sizeof *g);
    const float hstep = 1e-2f;
    double worst = 0;
    for (size_t k = 0; k < m->n_params; k += 1 + m->n_params / 60) {
        float v = m->params[k];
        m->params[k] = v + hstep;
        double up = dp_model_forward_range_loss(m, 0, m->params, x, y, 0, batch, NULL);
        m->params[k] = v - hstep;
        double dn = dp_model_forward_range_loss(m, 0, m->params, x, y, 0, batch, NULL);
        m->params[k] = v;
        double fd = (up - dn) / (2.0 * hstep);
        worst = fmax(worst, fabs(fd - g[k]) / fmax(0.05, fabs(fd)));
    }
    free(g);
    return worst;
}

#endif
