/* One process's training steps timed whole (bench_engine, bench_cnn): batch
 * gather, forward, backward and the optimiser, restarting the epoch when the
 * records run out, as the single strategy runs them (the update fused into
 * backprop). */
#ifndef DOWNPOUR_BENCH_TRAIN_H
#define DOWNPOUR_BENCH_TRAIN_H

#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/model.h"
#include "downpour/optim.h"

/* Seconds per step, over `steps` steps of `batch` records.  unfused: the
 * optimiser after backprop, the fused update's twin. */
static inline double bench_train_step_seconds(dp_model *m, dp_optim *o, dp_batcher *bt, float *x,
                                              uint8_t *y, int batch, int steps, int unfused)
{
    double t0 = dp_now();
    for (int s = 0; s < steps; s++) {
        int n = dp_batcher_next(bt, x, y, batch);
        if (n < batch) {
            dp_batcher_start_epoch(bt, bt->epoch); /* epoch counts those started */
            n = dp_batcher_next(bt, x, y, batch);
        }
        if (unfused) {
            dp_model_forward_backward(m, x, y, n, NULL);
            dp_optim_apply(o, m->params, m->grads, o->cfg.lr);
        } else {
            dp_model_train_step(m, o, x, y, n, o->cfg.lr, NULL); /* what single's step runs */
        }
    }
    return (dp_now() - t0) / steps;
}

#endif
