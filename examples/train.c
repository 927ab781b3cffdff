/* The shortest program that trains: one dp_train_run, the loop `downpour
 * train` runs (README.md, "Using the library").  Usage: train [DATASET]. */
#include <stdio.h>

#include "downpour/downpour.h"

int main(int argc, char **argv)
{
    dp_train_config cfg = dp_train_defaults(); /* mlp-300-100, adam, batch 128 */
    cfg.dataset = argc > 1 ? argv[1] : "mnist"; /* found under $DOWNPOUR_DATA */
    cfg.epochs = 1;
    cfg.n_train = 6000, cfg.n_val = 1000, cfg.n_test = 1000; /* seconds, not minutes */
    dp_train_result res;
    dp_err err;
    if (dp_train_run(&cfg, &res, &err) != 0) {
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    printf("downpour %s: test accuracy %.4f after %ld steps\n", DOWNPOUR_VERSION,
           res.test_accuracy, res.steps);
    return res.test_accuracy > 0.5 ? 0 : 1;
}
