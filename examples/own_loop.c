/* A training loop of one's own on downpour's parts: a dataset and its
 * batcher, a model (forward and backward), an optimiser (README.md, "Using
 * the library").  Usage: own_loop [DATASET] [STEPS]. */
#include <stdio.h>
#include <stdlib.h>

#include "downpour/downpour.h"

enum { BATCH = 64 };

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "mnist";
    long steps = argc > 2 ? atol(argv[2]) : 200;
    dp_err err;
    dp_dataset ds;
    if (dp_dataset_open(&ds, name, &err) != 0) {
        fprintf(stderr, "own_loop: %s\n", err.msg);
        return 77; /* no data: the tests count it as skipped */
    }
    dp_split train, val;
    dp_batcher b = {0};
    dp_model m = {0};
    dp_optim o = {0};
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    float *x = malloc(sizeof(float) * BATCH * ds.train_all.dim);
    uint8_t y[BATCH];
    int rc = 1;
    if (!x || dp_dataset_split(&ds, 10000, 1000, &train, &val, &err) != 0 ||
        dp_batcher_init(&b, &train, 1, 1, DP_SHARD_OFF, 0, 1, &err) != 0 ||
        dp_model_init(&m, "mlp-300-100", BATCH, 1, &err) != 0 ||
        dp_optim_init(&o, &oc, m.n_params, &err) != 0) {
        fprintf(stderr, "own_loop: %s\n", x ? err.msg : "out of memory");
        goto out;
    }
    dp_model_init_params(&m, 1);
    long epoch = 0, step = 0;
    dp_batcher_start_epoch(&b, epoch);
    while (step < steps) {
        int n = dp_batcher_next(&b, x, y, BATCH);
        if (n < 0) {
            fprintf(stderr, "own_loop: %s\n", b.err.msg);
            goto out;
        }
        if (n == 0) { /* the epoch is over: a new order */
            dp_batcher_start_epoch(&b, ++epoch);
            continue;
        }
        /* the gradient of the mean loss into m.grads, then one Adam update */
        float loss = dp_model_forward_backward(&m, x, y, n, NULL);
        dp_optim_apply(&o, m.params, m.grads, oc.lr);
        if (++step % 50 == 0)
            printf("step %ld: loss %.4f\n", step, loss);
    }
    /* validation accuracy, in batches, with the trained parameters */
    dp_batcher vb = {0};
    int correct = 0, seen = 0, n;
    if (dp_batcher_init(&vb, &val, 1, 0, DP_SHARD_OFF, 0, 1, &err) != 0) {
        fprintf(stderr, "own_loop: %s\n", err.msg);
        goto out;
    }
    dp_batcher_start_epoch(&vb, 0);
    while ((n = dp_batcher_next(&vb, x, y, BATCH)) > 0) {
        dp_model_forward(&m, m.params, x, y, n, &correct);
        seen += n;
    }
    dp_batcher_free(&vb);
    printf("validation accuracy %.4f after %ld steps\n", (double)correct / seen, steps);
    rc = (double)correct / seen > 0.5 ? 0 : 1;
out:
    dp_optim_free(&o);
    dp_model_free(&m);
    dp_batcher_free(&b);
    free(x);
    dp_dataset_close(&ds);
    return rc;
}
