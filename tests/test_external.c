/* External models (external.h) through the C API: dp_train_config.external
 * trains a caller's flat buffer with its own step (a quadratic whose
 * gradient is params - target) under strategy single, in place, with no
 * dataset; the spec "external:NAME" finds a registered one; evaluate gives
 * the validation and test figures; --save goes to the model's save
 * callback with its buffers; what needs downpour's own layers or
 * strategies is refused, naming the flag. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/external.h"
#include "downpour/train.h"

#define N 5
#define SPE 4

typedef struct ctx {
    float params[N], grads[N], target[N];
    int nexts, computes, evals;
} ctx;

static int next(void *c)
{
    ((ctx *)c)->nexts++;
    return 8; /* records of the batch */
}

/* loss 0.5 |p - t|^2: its gradient p - t */
static int compute(void *c, float *loss, int *correct)
{
    ctx *x = c;
    double l = 0;
    for (int i = 0; i < N; i++) {
        x->grads[i] = x->params[i] - x->target[i];
        l += 0.5 * x->grads[i] * x->grads[i];
    }
    x->computes++;
    *loss = (float)l;
    *correct = 8;
    return 0;
}

static double evaluate(void *c, const float *w, int test, double *loss)
{
    ctx *x = c;
    (void)test;
    x->evals++;
    *loss = fabs((double)w[0] - x->target[0]);
    return 0.5;
}

/* the save callback: what it was handed */
static float saved_w0, saved_b0;
static char saved_path[64];
static int save(void *c, const float *w, const float *b, const char *path)
{
    (void)c;
    saved_w0 = w[0];
    saved_b0 = b ? b[0] : -1.0f;
    snprintf(saved_path, sizeof saved_path, "%s", path);
    return 0;
}

static dp_train_config config(const dp_external_model *e)
{
    dp_train_config cfg = dp_train_defaults();
    cfg.external = e;
    cfg.epochs = 3;
    cfg.batch = 8;
    cfg.optim = dp_optim_defaults(DP_OPTIM_SGD);
    cfg.optim.lr = 0.25f;
    cfg.quiet = true;
    cfg.log_every = 0;
    return cfg;
}

int main(void)
{
    ctx x;
    memset(&x, 0, sizeof x);
    for (int i = 0; i < N; i++) {
        x.params[i] = 1.0f + (float)i;
        x.target[i] = -1.0f;
    }
    dp_external_model e = {.n_params = N, .params = x.params, .grads = x.grads,
                           .steps_per_epoch = SPE, .next = next, .compute = compute,
                           .evaluate = evaluate, .ctx = &x};
    dp_train_config cfg = config(&e);
    dp_train_result res;
    dp_err err;
    CHECKF(dp_train_run(&cfg, &res, &err) == 0, "%s", err.msg);
    CHECK(x.nexts == 3 * SPE && x.computes == 3 * SPE && res.steps == 3 * SPE);
    CHECK(x.evals == 3 + 1); /* each epoch's validation and the test */
    CHECK(fabs(res.test_accuracy - 0.5) < 1e-12);
    /* 12 SGD steps at lr 0.25: p - t shrinks by 0.75 each, in the caller's buffer */
    for (int i = 0; i < N; i++) {
        double want = -1.0 + (2.0 + i) * pow(0.75, 12);
        CHECKF(fabs(x.params[i] - want) < 1e-5, "param %d: %g, want %g", i, x.params[i], want);
    }

    /* the spec external:NAME of a registered model */
    CHECK(dp_external_register("quad", &e, &err) == 0);
    CHECK(dp_external_find("quad") == &e && !dp_external_find("other"));
    cfg = config(NULL);
    cfg.model = "external:quad";
    cfg.epochs = 1;
    x.nexts = 0;
    CHECKF(dp_train_run(&cfg, &res, &err) == 0, "%s", err.msg);
    CHECK(x.nexts == SPE);
    cfg.model = "external:other";
    CHECK(dp_train_run(&cfg, &res, &err) < 0 && strstr(err.msg, "no external model"));
    CHECK(dp_external_register("quad", NULL, &err) == 0 && !dp_external_find("quad"));

    /* refusals, naming the flag */
    cfg = config(&e);
    cfg.save_path = "never.safetensors";
    CHECK(dp_train_run(&cfg, &res, &err) < 0 && strstr(err.msg, "--save"));
    /* buffers need their array; with a save callback --save hands it the
     * final weights and the buffers */
    float bufs[2] = {7.0f, 8.0f};
    e.n_buffers = 2;
    cfg = config(&e);
    CHECK(dp_train_run(&cfg, &res, &err) < 0 && strstr(err.msg, "buffers"));
    e.buffers = bufs;
    e.save = save;
    cfg = config(&e);
    cfg.epochs = 1;
    cfg.save_path = "external-saved.pt";
    CHECKF(dp_train_run(&cfg, &res, &err) == 0, "%s", err.msg);
    CHECK(strcmp(saved_path, "external-saved.pt") == 0);
    CHECK(saved_w0 == x.params[0] && saved_b0 == 7.0f);
    e.n_buffers = 0, e.buffers = NULL, e.save = NULL;
    cfg = config(&e);
    cfg.augment.pad = 2;
    cfg.augment.flip = 1;
    CHECKF(dp_train_run(&cfg, &res, &err) < 0, "augment refused");
    e.steps_per_epoch = 0;
    cfg = config(&e);
    CHECK(dp_train_run(&cfg, &res, &err) < 0 && strstr(err.msg, "steps_per_epoch"));
    e.steps_per_epoch = SPE;
    e.compute = NULL; /* a trainer without a step */
    CHECK(dp_train_run(&cfg, &res, &err) < 0 && strstr(err.msg, "no step"));
    return CHECK_DONE();
}
