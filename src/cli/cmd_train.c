/* downpour train: the training run of one process. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/train.h"

#define USAGE "downpour train [--dataset NAME|DIR] [--model SPEC] [--batch N] [--epochs N] [...]"

int cmd_train(int argc, char **argv)
{
    dp_train_config cfg = dp_train_defaults();
    const char *dataset = cfg.dataset, *model = cfg.model, *strategy = cfg.strategy;
    const char *optimizer = "adam", *metrics = NULL, *save = NULL;
    long batch = cfg.batch, epochs = cfg.epochs, seed = 1, threads = 0, log_every = cfg.log_every;
    long n_train = cfg.n_train, n_val = cfg.n_val;
    double lr = -1, momentum = -1;
    bool no_progress = false, quiet = false;
    const cli_opt opts[] = {
        {"dataset", CLI_STR, &dataset, "NAME|DIR", "mnist, fashion-mnist, kmnist, or a directory of IDX files", 0, 0},
        {"model", CLI_STR, &model, "SPEC", "mlp-300-100, mlp-128, or widths like 784-300-100-10", 0, 0},
        {"strategy", CLI_STR, &strategy, "NAME", "how gradients become parameters", 0, 0},
        {"batch", CLI_INT, &batch, "N", "records per step", 1, 65536},
        {"epochs", CLI_INT, &epochs, "N", "passes over the training split", 1, 100000},
        {"optimizer", CLI_STR, &optimizer, "NAME", "sgd, momentum, nesterov, adagrad or adam", 0, 0},
        {"lr", CLI_NUM, &lr, "X", "learning rate (-1: the optimizer's Keras default)", -1, 100},
        {"momentum", CLI_NUM, &momentum, "X", "momentum for momentum/nesterov (-1: 0.9)", -1, 1},
        {"seed", CLI_INT, &seed, "N", "seed of the weights and of the data order", 0, 0x7fffffffL},
        {"train-size", CLI_INT, &n_train, "N", "training records (the first N of the training file)", 1, 100000000},
        {"val-size", CLI_INT, &n_val, "N", "validation records (the next N)", 0, 100000000},
        {"threads", CLI_INT, &threads, "N", "BLAS threads (0: OPENBLAS_NUM_THREADS or all cores)", 0, 1024},
        {"log-every", CLI_INT, &log_every, "N", "steps between step lines (0: none)", 0, 100000000},
        {"metrics", CLI_STR, &metrics, "FILE", "write JSON Lines metrics to FILE", 0, 0},
        {"save", CLI_STR, &save, "FILE", "save the trained weights as safetensors", 0, 0},
        {"no-progress", CLI_FLAG, &no_progress, NULL, "no progress bar even on a terminal", 0, 0},
        {"quiet", CLI_FLAG, &quiet, NULL, "no step lines (same as --log-every 0)", 0, 0},
    };
    int rest;
    int r = cli_parse(USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest < argc) {
        fprintf(stderr, "downpour train: unexpected argument '%s' (see --help)\n", argv[rest]);
        return 2;
    }

    dp_err err;
    dp_optim_kind kind;
    if (dp_optim_parse_kind(optimizer, &kind, &err) < 0) {
        fprintf(stderr, "downpour train: --optimizer: %s\n", err.msg);
        return 2;
    }
    cfg.optim = dp_optim_defaults(kind);
    if (lr >= 0) {
        if (lr == 0) {
            fprintf(stderr, "downpour train: --lr must be positive\n");
            return 2;
        }
        cfg.optim.lr = (float)lr;
    }
    if (momentum >= 0)
        cfg.optim.momentum = (float)momentum;
    cfg.dataset = dataset;
    cfg.model = model;
    cfg.strategy = strategy;
    cfg.batch = (int)batch;
    cfg.epochs = (int)epochs;
    cfg.seed = (uint64_t)seed;
    cfg.n_train = (uint32_t)n_train;
    cfg.n_val = (uint32_t)n_val;
    cfg.threads = (int)threads;
    cfg.log_every = quiet ? 0 : (int)log_every;
    cfg.progress = !no_progress && isatty(STDERR_FILENO);
    cfg.metrics_path = metrics;
    cfg.save_path = save;

    dp_train_result res;
    if (dp_train_run(&cfg, &res, &err) < 0) {
        fprintf(stderr, "downpour train: %s\n", err.msg);
        return 1;
    }
    return 0;
}
