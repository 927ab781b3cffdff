/* One process's training steps timed whole (bench_engine, bench_cnn): batch
 * gather, forward, backward and the optimiser, restarting the epoch when the
 * records run out. */
#ifndef DOWNPOUR_BENCH_TRAIN_H
#define DOWNPOUR_BENCH_TRAIN_H

#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/model.h"
#include "downpour/optim.h"

/* Seconds per step, over `steps` steps of `batch` records. */
static inline double bench_train_step_seconds(dp_model *m, dp_optim *o, dp_batcher *bt, float *x,
                                              uint8_t *y, int batch, int steps)
{
    double t0 = dp_now();
    for (int s = 0; s < steps; s++) {
        int n = dp_batcher_next(bt, x, y, batch);
        if (n < batch) {
            dp_batcher_start_epoch(bt, bt->epoch); /* epoch counts those started */
            n = dp_batcher_next(bt, x, y, batch);
        }
        dp_model_forward_backward(m, x, y, n, NULL);
        dp_optim_apply(o, m->params, m->grads, o->cfg.lr);
    }
    return (dp_now() - t0) / steps;
}

#endif
